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

}  // namespace kiln::ops::grad_ops
