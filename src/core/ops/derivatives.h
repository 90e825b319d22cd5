// Building blocks for the registry's derivatives: graph nodes of the usual arithmetic, so that
// each op's entry states its derivative as a formula (mul.derivative: {grad * b, grad * a}).
#pragma once
#include <vector>

#include "core/ir/graph.h"

namespace kiln::ops::grad_ops {

inline ir::Node* mul(ir::Graph& g, ir::Node* a, ir::Node* b) { return g.must_add("mul", {a, b}); }
inline ir::Node* div(ir::Graph& g, ir::Node* a, ir::Node* b) { return g.must_add("div", {a, b}); }
inline ir::Node* add(ir::Graph& g, ir::Node* a, ir::Node* b) { return g.must_add("add", {a, b}); }
inline ir::Node* sub(ir::Graph& g, ir::Node* a, ir::Node* b) { return g.must_add("sub", {a, b}); }
inline ir::Node* neg(ir::Graph& g, ir::Node* a) { return g.must_add("neg", {a}); }
// A Python number in the dtype of `like`'s arithmetic (scalars do not promote tensors).
inline ir::Node* num(ir::Graph& g, double v) { return g.scalar(v, DType::Float64); }
inline ir::Node* scaled(ir::Graph& g, ir::Node* a, double v) { return mul(g, a, num(g, v)); }
// where(cond, a, 0): the gradient that flows only where cond holds.
inline ir::Node* only_where(ir::Graph& g, ir::Node* cond, ir::Node* a) { return g.must_add("where", {cond, a, num(g, 0.0)}); }
inline ir::Node* unary(ir::Graph& g, const char* op, ir::Node* a) { return g.must_add(op, {a}); }
inline ir::Node* transpose(ir::Graph& g, ir::Node* a, int64_t d0, int64_t d1) {
  ir::Attrs at;
  at.set("dim0", d0);
  at.set("dim1", d1);
  return g.must_add("transpose", {a}, at);
}
inline ir::Node* reshape(ir::Graph& g, ir::Node* a, const std::vector<sym::Expr>& sizes) {
  ir::Attrs at;
  at.set("shape", ir::sizes_attr(sizes));
  return g.must_add("reshape", {a}, at);
}
inline ir::Node* expand(ir::Graph& g, ir::Node* a, const std::vector<sym::Expr>& sizes) {
  ir::Attrs at;
  at.set("size", ir::sizes_attr(sizes));
  return g.must_add("expand", {a}, at);
}

// Zeros of `like`'s sizes, dtype and device (torch's zeros_like(grad): no NaN of grad passes).
inline ir::Node* zeros_like(ir::Graph& g, const ir::TensorMeta& like) {
  ir::Attrs at;
  at.set("size", ir::sizes_attr(like.sizes));
  at.set("value", 0.0);
  at.set("dtype", like.dtype);
  at.set("device", like.device.str());
  return g.must_add("full", {}, at);
}

// Zeros of `like`'s sizes, dtype and device, with dim `d` of length `len`: what a slice's or a
// select's gradient is padded with.
inline ir::Node* zeros_along(ir::Graph& g, const ir::TensorMeta& like, int64_t d, const sym::Expr& len) {
  std::vector<sym::Expr> sizes = like.sizes;
  sizes[static_cast<size_t>(d)] = len;
  ir::Attrs at;
  at.set("size", ir::sizes_attr(sizes));
  at.set("value", 0.0);
  at.set("dtype", like.dtype);
  at.set("device", like.device.str());
  return g.must_add("full", {}, at);
}
// `part` placed at [start, start + its length) along dim d of a tensor of `like`'s sizes,
// zeros elsewhere: the gradient of a slice (or select) of `like`.
inline ir::Node* pad_along(ir::Graph& g, ir::Node* part, const ir::TensorMeta& like, int64_t d, const sym::Expr& start) {
  const sym::Expr after = like.sizes[static_cast<size_t>(d)] - start - part->meta.sizes[static_cast<size_t>(d)];
  std::vector<ir::Node*> parts;
  if (!start.is_const(0)) parts.push_back(zeros_along(g, part->meta, d, start));
  parts.push_back(part);
  if (!after.is_const(0)) parts.push_back(zeros_along(g, part->meta, d, after));
  if (parts.size() == 1) return part;
  ir::Attrs at;
  at.set("dim", d);
  return g.must_add("cat", parts, at);
}

}  // namespace kiln::ops::grad_ops
