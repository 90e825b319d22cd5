// Random numbers inside kiln's kernels: a counter-based generator (Philox-4x32-10, as torch's CUDA
// generator uses), so each element's draw is a pure function of (seed, element counter) and a
// backward recomputes a dropout mask instead of saving it. The seed is a graph input the runtime
// draws from torch's default generator per call: torch.manual_seed makes runs reproducible; the
// values are not the ones torch's own kernels draw (same distribution, other stream).
#include "core/ops/registry.h"

namespace kiln::ops {

using loop::ScalarCtx;
using loop::SOp;
using loop::SRef;

namespace {

Attrs A(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  Attrs a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}

// Uniform [0, 1) floats of `like`'s sizes on its device: counters 0, 1, ... in row-major order
// plus `offset` (each draw of a graph has its own stretch of the stream).
Node* uniform_like(Graph& g, Node* like, Node* seed, int64_t offset) {
  Expr numel(1);
  for (const Expr& s : like->meta.sizes) numel = numel * s;
  Node* counter = g.must_add("arange", {}, A({{"start", Expr(offset)}, {"end", numel + Expr(offset)}, {"step", int64_t{1}},
                                              {"dtype", DType::Int64}, {"device", like->meta.device.str()}}));
  counter = g.must_add("reshape", {counter}, A({{"shape", ir::sizes_attr(like->meta.sizes)}}));
  return g.must_add("philox_uniform", {seed, counter});
}

// F.dropout(x, p, training=True): zero with probability p, else scaled by 1 / (1 - p).
Node* decompose_dropout(Graph& g, Node* n) {
  Node *x = n->inputs[0], *seed = n->inputs[1];
  const double p = n->attrs.get_float("p", 0.5);
  if (p >= 1) return g.must_add("mul", {x, g.scalar(0.0, DType::Float64)});
  Node* keep = g.must_add("ge", {uniform_like(g, x, seed, n->attrs.get_int("offset")), g.scalar(p, DType::Float64)});
  Node* scaled = g.must_add("mul", {x, g.scalar(1.0 / (1.0 - p), DType::Float64)});
  return g.must_add("where", {keep, scaled, g.scalar(0.0, DType::Float64)});
}

}  // namespace

std::vector<OpDef> random_ops() {
  std::vector<OpDef> ops;
  // philox_uniform(seed, counter): per element a float in [0, 1) from Philox-4x32-10 keyed by the
  // int64 seed, at the int64 counter.
  OpDef u;
  u.name = "philox_uniform";
  u.schema = Schema::parse("philox_uniform(Tensor seed, Tensor counter)");
  u.kind = OpKind::Pointwise;
  u.promotion = Promotion::None;
  u.doc = "uniform [0, 1) floats from a counter-based generator (dropout's masks, torch.rand)";
  u.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    if (in[0]->meta.dtype != DType::Int64 || in[1]->meta.dtype != DType::Int64)
      return err = "kiln: philox_uniform takes an int64 seed and int64 counters", false;
    if (!infer_pointwise(*find_op("philox_uniform"), in, a, out, err)) return false;
    out.dtype = DType::Float32;
    return true;
  };
  u.scalar = [](ScalarCtx& s, const std::vector<SRef>& a, const Node&) { return s.binary(SOp::Rand, a[0], a[1]); };
  ops.push_back(std::move(u));
  // kiln._eager_ops.dropout: how kiln.compile(backend="eager") runs the node (torch's F.dropout).
  ops.push_back(composite_op("dropout", "dropout(Tensor input, Tensor seed, float p=0.5, int offset=0)", decompose_dropout,
                             {"kiln._eager_ops.dropout"}));
  ops.back().doc = "F.dropout in training mode: masks from philox_uniform, keyed by a per-call seed";
  return ops;
}

}  // namespace kiln::ops
