// Small builders the core tests share: tensor metadata and attribute lists.
#pragma once
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/ir/graph.h"

namespace kiln::test {

// A dense row-major tensor of `sizes`.
inline ir::TensorMeta meta(std::vector<int64_t> sizes, DType t = DType::BFloat16, DeviceType dev = DeviceType::CUDA) {
  ir::TensorMeta m;
  m.dtype = t;
  m.device = Device{dev, 0};
  for (int64_t s : sizes) m.sizes.push_back(s);
  m.strides = ir::contiguous_strides(m.sizes);
  return m;
}

inline ir::Attrs A(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  ir::Attrs a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}

}  // namespace kiln::test
