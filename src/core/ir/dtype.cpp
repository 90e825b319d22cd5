#include "core/ir/dtype.h"

namespace kiln {

const char* dtype_name(DType t) {
  static const char* names[] = {"bool", "uint8", "int8", "int16", "int32", "int64",
                                "float16", "bfloat16", "float32", "float64"};
  return names[static_cast<int>(t)];
}

const char* dtype_ctype(DType t) {
  static const char* names[] = {"bool", "unsigned char", "signed char", "short", "int", "long long",
                                "kiln_half", "kiln_bf16", "float", "double"};
  return names[static_cast<int>(t)];
}

std::optional<DType> dtype_from_name(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (name == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
  return std::nullopt;
}

int dtype_size(DType t) {
  static const int sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
  return sizes[static_cast<int>(t)];
}

DType compute_dtype(DType t) {
  return is_16bit_float(t) ? DType::Float32 : t;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a > b) std::swap(a, b);  // a is the lower category
  if (a == DType::Bool) return b;
  // uint8 with a signed type: the smallest signed type that holds both.
  if (a == DType::UInt8 && !is_floating(b)) return b == DType::Int8 ? DType::Int16 : b;
  if (is_floating(b) && !is_floating(a)) return b;
  if (a == DType::Float16 && b == DType::BFloat16) return DType::Float32;
  return b;
}

namespace {
enum Category { kNone = 0, kBool = 1, kInt = 2, kFloat = 3 };
Category category(DType t) { return t == DType::Bool ? kBool : is_floating(t) ? kFloat : kInt; }

struct Slot {
  bool set = false;
  DType t = DType::Bool;
  void add(DType x) { t = set ? promote_types(t, x) : x; set = true; }
};

// Combines a higher-priority result with a lower-priority one: the lower one only matters
// when it is of a higher category than the higher one.
Slot combine(Slot higher, Slot lower) {
  if (!higher.set) return lower;
  if (!lower.set) return higher;
  if (category(higher.t) >= category(lower.t)) return higher;
  Slot s;
  s.set = true;
  s.t = promote_types(higher.t, lower.t);
  return s;
}
}  // namespace

DType result_type(const std::vector<PromotionOperand>& ops, DType default_float) {
  Slot dim, zero, wrapped;
  for (const auto& o : ops) {
    if (o.wrapped_number) {
      // Python numbers contribute their category only: float -> the default float type.
      DType t = o.dtype;
      if (is_floating(t)) t = default_float;
      else if (t != DType::Bool) t = DType::Int64;
      wrapped.add(t);
    } else if (o.dim == 0) {
      zero.add(o.dtype);
    } else {
      dim.add(o.dtype);
    }
  }
  Slot r = combine(dim, combine(zero, wrapped));
  return r.set ? r.t : default_float;
}

Device Device::parse(const std::string& s) {
  Device d;
  if (s.rfind("cuda", 0) == 0) {
    d.type = DeviceType::CUDA;
    d.index = s.size() > 5 ? std::stoi(s.substr(5)) : 0;
  }
  return d;
}

std::string Device::str() const {
  if (type == DeviceType::CPU) return "cpu";
  return index >= 0 ? "cuda:" + std::to_string(index) : "cuda";
}

}  // namespace kiln
