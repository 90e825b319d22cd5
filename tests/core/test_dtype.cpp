// Unit tests of the dtype helpers and of torch's type promotion (core/ir/dtype.h).
//
// Every expected dtype here was checked against torch 2.x (torch.promote_types and
// torch.result_type; a Python number is a "wrapped number", a 0-dim tensor has dim 0).
#include <gtest/gtest.h>

#include "core/ir/dtype.h"

using kiln::DType;
using kiln::PromotionOperand;

namespace {

constexpr DType kAll[] = {DType::Bool,    DType::UInt8,    DType::Int8,    DType::Int16,  DType::Int32,
                          DType::Int64,   DType::Float16,  DType::BFloat16, DType::Float32, DType::Float64};

PromotionOperand tensor(DType t) { return {t, 1, false}; }      // a dimensioned tensor
PromotionOperand zero_dim(DType t) { return {t, 0, false}; }    // torch.tensor(v, dtype=t)
PromotionOperand py_int() { return {DType::Int64, 0, true}; }   // a Python int
PromotionOperand py_float() { return {DType::Float64, 0, true}; }  // a Python float
PromotionOperand py_bool() { return {DType::Bool, 0, true}; }   // a Python bool

std::string name(DType t) { return kiln::dtype_name(t); }

}  // namespace

TEST(DType, NamesSizesAndCategories) {
  EXPECT_STREQ(kiln::dtype_name(DType::Float32), "float32");
  EXPECT_STREQ(kiln::dtype_name(DType::BFloat16), "bfloat16");
  EXPECT_STREQ(kiln::dtype_ctype(DType::Int64), "long long");
  EXPECT_STREQ(kiln::dtype_ctype(DType::Float64), "double");
  for (DType t : kAll) EXPECT_EQ(kiln::dtype_from_name(kiln::dtype_name(t)), t);
  EXPECT_FALSE(kiln::dtype_from_name("float").has_value());
  EXPECT_FALSE(kiln::dtype_from_name("complex64").has_value());

  const int sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
  for (int i = 0; i < kiln::kNumDTypes; ++i) EXPECT_EQ(kiln::dtype_size(kAll[i]), sizes[i]) << name(kAll[i]);

  EXPECT_FALSE(kiln::is_floating(DType::Int64));
  EXPECT_FALSE(kiln::is_floating(DType::Bool));
  EXPECT_TRUE(kiln::is_floating(DType::Float16));
  EXPECT_TRUE(kiln::is_floating(DType::BFloat16));
  EXPECT_TRUE(kiln::is_integral(DType::UInt8, false));
  EXPECT_FALSE(kiln::is_integral(DType::Bool, false));
  EXPECT_TRUE(kiln::is_integral(DType::Bool, true));
  EXPECT_FALSE(kiln::is_integral(DType::Float32, true));

  EXPECT_EQ(kiln::compute_dtype(DType::Float16), DType::Float32);
  EXPECT_EQ(kiln::compute_dtype(DType::BFloat16), DType::Float32);
  EXPECT_EQ(kiln::compute_dtype(DType::Float64), DType::Float64);
  EXPECT_EQ(kiln::compute_dtype(DType::Int8), DType::Int8);
}

TEST(DType, PromoteTypesSpotChecks) {
  EXPECT_EQ(kiln::promote_types(DType::Bool, DType::Int8), DType::Int8);
  EXPECT_EQ(kiln::promote_types(DType::UInt8, DType::Int8), DType::Int16);
  EXPECT_EQ(kiln::promote_types(DType::UInt8, DType::Int16), DType::Int16);
  EXPECT_EQ(kiln::promote_types(DType::Int32, DType::Float16), DType::Float16);
  EXPECT_EQ(kiln::promote_types(DType::Int64, DType::BFloat16), DType::BFloat16);
  EXPECT_EQ(kiln::promote_types(DType::Float16, DType::BFloat16), DType::Float32);
  EXPECT_EQ(kiln::promote_types(DType::BFloat16, DType::Float32), DType::Float32);
  EXPECT_EQ(kiln::promote_types(DType::Int64, DType::Float32), DType::Float32);
  EXPECT_EQ(kiln::promote_types(DType::Bool, DType::Bool), DType::Bool);
}

// The whole table, as printed by torch.promote_types over these ten dtypes (row = a, column = b).
TEST(DType, PromoteTypesMatchesTorchTable) {
  using D = DType;
  const DType table[10][10] = {
      {D::Bool, D::UInt8, D::Int8, D::Int16, D::Int32, D::Int64, D::Float16, D::BFloat16, D::Float32, D::Float64},
      {D::UInt8, D::UInt8, D::Int16, D::Int16, D::Int32, D::Int64, D::Float16, D::BFloat16, D::Float32, D::Float64},
      {D::Int8, D::Int16, D::Int8, D::Int16, D::Int32, D::Int64, D::Float16, D::BFloat16, D::Float32, D::Float64},
      {D::Int16, D::Int16, D::Int16, D::Int16, D::Int32, D::Int64, D::Float16, D::BFloat16, D::Float32, D::Float64},
      {D::Int32, D::Int32, D::Int32, D::Int32, D::Int32, D::Int64, D::Float16, D::BFloat16, D::Float32, D::Float64},
      {D::Int64, D::Int64, D::Int64, D::Int64, D::Int64, D::Int64, D::Float16, D::BFloat16, D::Float32, D::Float64},
      {D::Float16, D::Float16, D::Float16, D::Float16, D::Float16, D::Float16, D::Float16, D::Float32, D::Float32, D::Float64},
      {D::BFloat16, D::BFloat16, D::BFloat16, D::BFloat16, D::BFloat16, D::BFloat16, D::Float32, D::BFloat16, D::Float32, D::Float64},
      {D::Float32, D::Float32, D::Float32, D::Float32, D::Float32, D::Float32, D::Float32, D::Float32, D::Float32, D::Float64},
      {D::Float64, D::Float64, D::Float64, D::Float64, D::Float64, D::Float64, D::Float64, D::Float64, D::Float64, D::Float64},
  };
  for (int a = 0; a < 10; ++a)
    for (int b = 0; b < 10; ++b)
      EXPECT_EQ(name(kiln::promote_types(kAll[a], kAll[b])), name(table[a][b]))
          << "promote_types(" << name(kAll[a]) << ", " << name(kAll[b]) << ")";
}

TEST(DType, ResultTypeSameRankPromotesFully) {
  EXPECT_EQ(kiln::result_type({tensor(DType::Float16), tensor(DType::Float32)}), DType::Float32);
  EXPECT_EQ(kiln::result_type({tensor(DType::UInt8), tensor(DType::Int8)}), DType::Int16);
  EXPECT_EQ(kiln::result_type({zero_dim(DType::Int32), zero_dim(DType::Int64)}), DType::Int64);
  EXPECT_EQ(kiln::result_type({tensor(DType::Int32)}), DType::Int32);
}

TEST(DType, ResultTypeWrappedNumbers) {
  // int64 tensor + 2.5 -> float32 (the default float), not float64.
  EXPECT_EQ(kiln::result_type({tensor(DType::Int64), py_float()}), DType::Float32);
  // A Python int never widens an integer tensor.
  EXPECT_EQ(kiln::result_type({tensor(DType::UInt8), py_int()}), DType::UInt8);
  EXPECT_EQ(kiln::result_type({tensor(DType::Int8), py_int()}), DType::Int8);
  // ... but it does lift bool to int64.
  EXPECT_EQ(kiln::result_type({tensor(DType::Bool), py_int()}), DType::Int64);
  EXPECT_EQ(kiln::result_type({tensor(DType::Bool), py_bool()}), DType::Bool);
  EXPECT_EQ(kiln::result_type({tensor(DType::Bool), py_float()}), DType::Float32);
  // A Python float does not widen a floating tensor.
  EXPECT_EQ(kiln::result_type({tensor(DType::Float16), py_float()}), DType::Float16);
  EXPECT_EQ(kiln::result_type({zero_dim(DType::Float16), py_float()}), DType::Float16);
  EXPECT_EQ(kiln::result_type({zero_dim(DType::Int8), py_float()}), DType::Float32);
  EXPECT_EQ(kiln::result_type({zero_dim(DType::Int16), py_float()}), DType::Float32);
  EXPECT_EQ(kiln::result_type({zero_dim(DType::Bool), py_int()}), DType::Int64);
  // With torch.set_default_dtype(torch.float64).
  EXPECT_EQ(kiln::result_type({tensor(DType::Int32), py_float()}, DType::Float64), DType::Float64);
}

TEST(DType, ResultTypeZeroDimTensors) {
  // Same category: the dimensioned tensor wins.
  EXPECT_EQ(kiln::result_type({tensor(DType::Int32), zero_dim(DType::Int64)}), DType::Int32);
  EXPECT_EQ(kiln::result_type({tensor(DType::Int8), zero_dim(DType::Int64)}), DType::Int8);
  EXPECT_EQ(kiln::result_type({tensor(DType::UInt8), zero_dim(DType::Int8)}), DType::UInt8);
  EXPECT_EQ(kiln::result_type({tensor(DType::Float16), zero_dim(DType::Float64)}), DType::Float16);
  // Higher category: the zero-dim tensor's own dtype (float64, not the default float).
  EXPECT_EQ(kiln::result_type({tensor(DType::Int32), zero_dim(DType::Float64)}), DType::Float64);
  EXPECT_EQ(kiln::result_type({tensor(DType::Int64), zero_dim(DType::Float16)}), DType::Float16);
  EXPECT_EQ(kiln::result_type({tensor(DType::Bool), zero_dim(DType::Float64)}), DType::Float64);
  EXPECT_EQ(kiln::result_type({tensor(DType::Bool), zero_dim(DType::Int32)}), DType::Int32);
  // Operand order does not matter.
  EXPECT_EQ(kiln::result_type({zero_dim(DType::UInt8), tensor(DType::Int8)}), DType::Int8);
  EXPECT_EQ(kiln::result_type({zero_dim(DType::Float64), tensor(DType::Int32)}), DType::Float64);
}

TEST(DType, ResultTypeThreeTiers) {
  // dim tensor int32, zero-dim int64, Python float: the float category comes from the number.
  EXPECT_EQ(kiln::result_type({tensor(DType::Int32), zero_dim(DType::Int64), py_float()}), DType::Float32);
  // dim tensor float16, zero-dim float64, Python float: float16 stays.
  EXPECT_EQ(kiln::result_type({tensor(DType::Float16), zero_dim(DType::Float64), py_float()}), DType::Float16);
  // dim tensor bool, zero-dim int16, Python int: the zero-dim tensor decides the integer type.
  EXPECT_EQ(kiln::result_type({tensor(DType::Bool), zero_dim(DType::Int16), py_int()}), DType::Int16);
}

TEST(DType, DeviceStr) {
  kiln::Device cpu, cuda{kiln::DeviceType::CUDA, 1}, cuda_any{kiln::DeviceType::CUDA, -1};
  EXPECT_EQ(cpu.str(), "cpu");
  EXPECT_EQ(cuda.str(), "cuda:1");
  EXPECT_EQ(cuda_any.str(), "cuda");
  EXPECT_NE(cpu, cuda);
  EXPECT_EQ(cuda, (kiln::Device{kiln::DeviceType::CUDA, 1}));
}
