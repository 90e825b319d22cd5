// Eval-mode batch norm folded into the convolution before it.
//
// batch_norm(conv2d(x, W, b), mean, var, w, beta) in eval mode is a per-output-channel scale
// and shift of the convolution's result, so it is the convolution of the same input with
// scaled weights:
//
//   alpha = w / sqrt(var + eps)
//   conv2d(x, W * alpha[:, None, None, None], b * alpha + beta - mean * alpha)
//
// The new weight and bias read parameters and buffers alone: split_prologue (prologue.cpp)
// moves them into the prologue, which computes them once and again only when one of those
// tensors changes (its version counter or its memory). What is left per call is the
// convolution, with no batch-norm pass over its result. inductor folds the same way, under
// freezing only, where parameters are taken never to change.
//
// Folded only where every tensor the fold reads is a stable input (else it would scale the
// weight at every call), the convolution's result feeds the batch norm alone, and the dtype is
// float32 or float64: in 16-bit the folded weight would be rounded to 16 bits, where eager
// rounds the convolution's result instead.
#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

namespace {

ir::Attrs attrs(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  ir::Attrs a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}

bool folds(const ir::Graph& g, const ir::Node* bn) {
  if (bn->op_name() != "batch_norm" || bn->attrs.get_bool("training")) return false;
  const ir::Node* conv = bn->inputs[0];
  if (conv->op_name() != "conv2d" || conv->users.size() != 1) return false;
  for (const ir::Node* o : g.outputs())
    if (o == conv) return false;
  const DType t = conv->meta.dtype;
  if (t != DType::Float32 && t != DType::Float64) return false;
  if (bn->inputs.size() < 3 || !bn->inputs[1] || !bn->inputs[2]) return false;
  auto usable = [&](const ir::Node* n) { return !n || (is_stable_input(g, n) && n->meta.dtype == t); };
  for (size_t i = 1; i < bn->inputs.size(); ++i)
    if (!usable(bn->inputs[i])) return false;
  for (size_t i = 1; i < conv->inputs.size(); ++i)
    if (!usable(conv->inputs[i])) return false;
  return true;
}

}  // namespace

void fold_batch_norm(ir::Graph& g) {
  if (g.stable_inputs.empty()) return;
  g.recompute_users();
  std::vector<ir::Node*> norms;
  for (auto& n : g.nodes())
    if (folds(g, n.get())) norms.push_back(n.get());
  for (ir::Node* bn : norms) {
    ir::Node* conv = bn->inputs[0];
    ir::Node *W = conv->inputs[1], *b = conv->inputs.size() > 2 ? conv->inputs[2] : nullptr;
    ir::Node *mean = bn->inputs[1], *var = bn->inputs[2];
    ir::Node* w = bn->inputs.size() > 3 ? bn->inputs[3] : nullptr;
    ir::Node* beta = bn->inputs.size() > 4 ? bn->inputs[4] : nullptr;
    const size_t tail = g.nodes().size();
    ir::Node* eps = g.scalar(bn->attrs.get_float("eps", 1e-5), DType::Float64);
    ir::Node* invstd = g.must_add("rsqrt", {g.must_add("add", {var, eps})});
    ir::Node* alpha = w ? g.must_add("mul", {w, invstd}) : invstd;
    std::vector<int64_t> shape(W->meta.sizes.size(), 1);
    shape[0] = -1;
    ir::Node* scaled = g.must_add("mul", {W, g.must_add("reshape", {alpha}, attrs({{"shape", shape}}))});
    ir::Node* shift = g.must_add("mul", {mean, alpha});
    ir::Node* bias = beta ? g.must_add("sub", {beta, shift}) : g.must_add("neg", {shift});
    if (b) bias = g.must_add("add", {g.must_add("mul", {b, alpha}), bias});
    std::vector<ir::Node*> inputs = {conv->inputs[0], scaled, bias};
    std::string error;
    ir::Node* folded = g.add(conv->op, inputs, conv->attrs, error);
    if (!folded || folded->meta.sizes != bn->meta.sizes || folded->meta.dtype != bn->meta.dtype ||
        folded->meta.strides != bn->meta.strides)
      continue;  // dead code
    g.move_tail_before(tail, bn);
    g.replace_all_uses(bn, folded);
  }
  if (!norms.empty()) dead_code_elimination(g);
}

}  // namespace kiln::passes
