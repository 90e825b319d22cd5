// Ops that join tensors into one: cat (and stack, as unsqueezes and a cat).
//
// cat is a gather: an output element reads the one input whose stretch of the joined dim holds
// it. Every input is read at an index clamped into it and all but one read are discarded by a
// chain of selects, so the producers of the inputs fuse into the cat and the cat into its
// consumers: Llama's rotate_half (cat(-x2, x1)) is part of the rotary kernel, not a kernel of
// its own.
#include <stdexcept>

#include "core/ops/registry.h"

namespace kiln::ops {

namespace {

using loop::SOp;
using loop::SRef;

// Inputs a gather reads per output element: beyond this the selects cost more than a copy.
constexpr size_t kMaxCatInputs = 16;

// Which cats the entry computes: tensors of one rank (at least 1) on one device whose sizes
// agree, as expressions, outside the joined dim. torch's legacy rule that skips 1-d empty
// tensors, 0-d tensors (an error in eager), sizes only equal at run time and long lists stay
// torch's operator.
bool covered_cat(const std::vector<Node*>& in, const Attrs& a) {
  if (in.empty() || in.size() > kMaxCatInputs) return false;
  const TensorMeta& first = in[0]->meta;
  int64_t dim = a.get_int("dim", 0);
  std::string err;
  if (first.dim() == 0 || !wrap_dim(dim, static_cast<int64_t>(first.dim()), err)) return false;
  for (const Node* n : in) {
    const TensorMeta& m = n->meta;
    if (n->meta.wrapped_number || m.dim() != first.dim() || !(m.device == first.device)) return false;
    for (int64_t d = 0; d < static_cast<int64_t>(m.dim()); ++d)
      if (d != dim && !(m.sizes[static_cast<size_t>(d)] == first.sizes[static_cast<size_t>(d)])) return false;
    // A 1-d empty tensor is skipped by torch whatever its rank: left to torch.
    if (m.dim() == 1 && m.sizes[0].is_const(0)) return false;
  }
  return true;
}

bool infer_cat(const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
  if (in.empty()) return err = "RuntimeError: torch.cat(): expected a non-empty list of Tensors", false;
  const TensorMeta& first = in[0]->meta;
  int64_t dim = a.get_int("dim", 0);
  if (!wrap_dim(dim, static_cast<int64_t>(first.dim()), err)) return false;
  out = first;
  out.wrapped_number = false;
  out.offset = Expr(0);
  out.dtype = pointwise_common_dtype(in);
  Expr joined(0);
  bool channels_last = true, channels_last_3d = true;
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorMeta& m = in[i]->meta;
    if (m.dim() == 0)
      return err = "RuntimeError: zero-dimensional tensor (at position " + std::to_string(i) + ") cannot be concatenated", false;
    if (m.dim() != first.dim())
      return err = "RuntimeError: Tensors must have same number of dimensions: got " + std::to_string(first.dim()) +
                   " and " + std::to_string(m.dim()), false;
    joined = joined + m.sizes[static_cast<size_t>(dim)];
    channels_last = channels_last && suggests_channels_last(m);
    channels_last_3d = channels_last_3d && suggests_channels_last_3d(m);
  }
  out.sizes[static_cast<size_t>(dim)] = joined;
  // torch lays the result out in the inputs' memory format when they all suggest the same one.
  out.strides = channels_last      ? channels_last_strides(out.sizes)
                : channels_last_3d ? channels_last_3d_strides(out.sizes)
                                   : ir::contiguous_strides(out.sizes);
  return true;
}

// The element at `out`: input k's, for the k whose stretch [offset_k, offset_k + size_k) of the
// joined dim holds out[dim]; the other inputs are read at indices clamped into them.
SRef gather_cat(loop::ScalarCtx& s, const std::vector<Expr>& out, const std::vector<GatherInput>& in, const Node& n) {
  int64_t dim = n.attrs.get_int("dim", 0);
  std::string err;
  wrap_dim(dim, static_cast<int64_t>(out.size()), err);
  const size_t d = static_cast<size_t>(dim);
  const DType t = compute_dtype(n.meta.dtype);
  const Expr at = out[d];
  std::vector<Expr> offsets;
  Expr offset(0);
  for (const GatherInput& x : in) {
    offsets.push_back(offset);
    offset = offset + x.sizes[d];
  }
  auto read = [&](size_t k) {
    Expr i = at - offsets[k];
    // Clamped only where the index can leave the input (bounds of the loop variable).
    const sym::Bounds b = sym::bounds(i);
    if (!b.lo || *b.lo < 0) i = sym::max(i, Expr(0));
    auto last = in[k].sizes[d].as_const();
    if (!b.hi || !last || *b.hi >= *last) i = sym::min(i, in[k].sizes[d] - Expr(1));
    std::vector<Expr> idx = out;
    idx[d] = i;
    return s.cast(in[k].read(idx), t);
  };
  // An empty input holds no element and has no memory to read, even clamped (a null pointer):
  // it is skipped, as torch's cat skips it. Symbolic sizes are never 0 (guards keep 0 static).
  std::vector<size_t> parts;
  for (size_t k = 0; k < in.size(); ++k) {
    bool empty = false;
    for (const Expr& e : in[k].sizes) empty = empty || e.is_const(0);
    if (!empty) parts.push_back(k);
  }
  if (parts.empty()) parts.push_back(in.size() - 1);  // an empty result: nothing is read
  SRef value = read(parts.back());
  for (size_t j = parts.size() - 1; j-- > 0;) {
    const size_t k = parts[j];
    SRef before_next = s.binary(SOp::Lt, s.size_value(at, DType::Int64), s.size_value(offsets[k] + in[k].sizes[d], DType::Int64));
    value = s.where(before_next, read(k), value);
  }
  return value;
}

// stack: each tensor unsqueezed at dim, then one cat, as torch's own decomposition.
Node* decompose_stack(Graph& g, Node* n) {
  const TensorMeta& first = n->inputs.at(0)->meta;
  for (size_t i = 1; i < n->inputs.size(); ++i)
    if (!(n->inputs[i]->meta.sizes == first.sizes))
      throw std::runtime_error("RuntimeError: stack expects each tensor to be equal size, but got " + sym::str(first.sizes) +
                               " at entry 0 and " + sym::str(n->inputs[i]->meta.sizes) + " at entry " + std::to_string(i));
  int64_t dim = n->attrs.get_int("dim", 0);
  std::string err;
  if (!wrap_dim(dim, static_cast<int64_t>(first.dim()) + 1, err)) throw std::runtime_error(err);
  Attrs at;
  at.set("dim", dim);
  if (dim < first.dim()) {
    // As torch does: the inputs joined along `dim` (cat's layout, channels-last where they all
    // are), then that dim split in two by a view.
    std::vector<Expr> sizes = first.sizes;
    sizes.insert(sizes.begin() + dim, Expr(static_cast<int64_t>(n->inputs.size())));
    Node* joined = g.must_add("cat", n->inputs, at);
    Attrs shape;
    shape.set("shape", ir::sizes_attr(sizes));
    return g.must_add("view", {joined}, shape);
  }
  // A new last dim: torch joins the inputs unsqueezed, into a row-major result (cat would follow
  // inputs that all look channels-last, as a transposed 3-d tensor unsqueezed does).
  std::vector<Node*> parts;
  for (Node* x : n->inputs) parts.push_back(g.must_add("unsqueeze", {x}, at));
  Node* joined = g.must_add("cat", parts, at);
  if (ir::is_contiguous(joined->meta.sizes, joined->meta.strides)) return joined;
  return g.must_add("contiguous", {joined});
}

}  // namespace

std::vector<OpDef> join_ops() {
  OpDef cat;
  cat.name = "cat";
  cat.schema = Schema::parse("cat(Tensor[] tensors, int dim=0)");
  cat.kind = OpKind::Gather;
  cat.promotion = Promotion::None;
  cat.infer = infer_cat;
  cat.covers = covered_cat;
  cat.gather = gather_cat;
  cat.python = {"torch.cat", "torch.concat"};
  cat.skips_empty_1d = true;
  cat.doc = "tensors joined along a dim; an element read from the one input holding it";
  // Each input's stretch of the gradient.
  cat.derivative = [](Graph& g, Node* n, Node* grad) {
    int64_t d = n->attrs.get_int("dim", 0);
    std::string err;
    if (!wrap_dim(d, n->meta.dim(), err)) throw std::runtime_error(err);
    std::vector<Node*> grads;
    Expr at(0);
    for (Node* x : n->inputs) {
      const Expr end = at + x->meta.sizes[static_cast<size_t>(d)];
      Attrs a;
      a.set("dim", d);
      a.set("start", at);
      a.set("end", end);
      grads.push_back(g.must_add("slice", {grad}, a));
      at = end;
    }
    return grads;
  };
  OpDef stack = composite_op("stack", "stack(Tensor[] tensors, int dim=0)", decompose_stack, {"torch.stack"});
  // Tensors of one shape (as expressions) on one device, as many as cat takes.
  stack.covers = [](const std::vector<Node*>& in, const Attrs&) {
    if (in.empty() || in.size() > kMaxCatInputs) return false;
    for (const Node* n : in)
      if (n->meta.wrapped_number || !(n->meta.sizes == in[0]->meta.sizes) || !(n->meta.device == in[0]->meta.device))
        return false;
    return true;
  };
  stack.doc = "tensors of one shape joined along a new dim (unsqueezes and a cat)";
  return {cat, stack};
}

}  // namespace kiln::ops
