// Element types, devices and torch's type-promotion rules.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

// Ordered by promotion category: bool < integers < floating.
enum class DType : uint8_t { Bool, UInt8, Int8, Int16, Int32, Int64, Float16, BFloat16, Float32, Float64 };
constexpr int kNumDTypes = 10;

const char* dtype_name(DType t);          // "float32"
const char* dtype_ctype(DType t);         // "float", "long long", ...
std::optional<DType> dtype_from_name(const std::string& name);
int dtype_size(DType t);
inline bool is_floating(DType t) { return t >= DType::Float16; }
// float16 / bfloat16: types of memory; kernels compute them in float (compute_dtype).
inline bool is_16bit_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
inline bool is_integral(DType t, bool include_bool) { return t == DType::Bool ? include_bool : t < DType::Float16; }
// The type arithmetic is carried out in: float for the 16-bit floats, else the type itself.
DType compute_dtype(DType t);

// torch.promote_types.
DType promote_types(DType a, DType b);

// An operand of torch.result_type: a tensor of some rank, or a Python number ("wrapped").
struct PromotionOperand {
  DType dtype;
  int64_t dim;
  bool wrapped_number;
};
// torch's result_type: dimensioned tensors outrank zero-dim tensors, which outrank Python
// numbers, except where a lower-priority operand is of a higher category (int -> float).
DType result_type(const std::vector<PromotionOperand>& operands, DType default_float = DType::Float32);

enum class DeviceType : uint8_t { CPU, CUDA };
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = -1;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
  static Device parse(const std::string& s);  // "cpu", "cuda", "cuda:1" (str()'s form)
};

}  // namespace kiln
