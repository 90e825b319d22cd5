// Random numbers inside kiln's kernels: a counter-based generator (Philox-4x32-10, as torch's CUDA
// generator uses), so each element's draw is a pure function of (seed, element counter) and a
// backward recomputes a dropout mask instead of saving it. The seed is a graph input the runtime
// draws from torch's default generator per call: torch.manual_seed makes runs reproducible; the
// values are not the ones torch's own kernels draw (same distribution, other stream).
#include <cmath>

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

// Uniform [0, 1) float32s of `sizes` on `device`, as uniform_like.
Node* uniform_of(Graph& g, const std::vector<Expr>& sizes, const std::string& device, Node* seed, int64_t offset) {
  Expr numel(1);
  for (const Expr& s : sizes) numel = numel * s;
  Node* counter = g.must_add("arange", {}, A({{"start", Expr(offset)}, {"end", numel + Expr(offset)}, {"step", int64_t{1}},
                                              {"dtype", DType::Int64}, {"device", device}}));
  counter = g.must_add("reshape", {counter}, A({{"shape", ir::sizes_attr(sizes)}}));
  return g.must_add("philox_uniform", {seed, counter});
}

// A second stretch of counters for a draw that needs two uniforms per element (randn).
constexpr int64_t kSecondStream = int64_t{1} << 39;

// torch.rand / rand_like: uniform [0, 1) (the float32 draw itself: below one in float64 too).
Node* decompose_random_uniform(Graph& g, Node* n) {
  Node* u = uniform_of(g, n->attrs.get_exprs("size"), n->attrs.get_str("device"), n->inputs[0], n->attrs.get_int("offset"));
  const DType t = *n->attrs.get_dtype("dtype");
  return t == DType::Float32 ? u : g.must_add("convert", {u}, A({{"dtype", t}}));
}

// torch.randn / randn_like: standard normal by Box-Muller, sqrt(-2 ln(1 - u1)) cos(2 pi u2),
// in float32 (float64 for a float64 result); 1 - u1 lies in (0, 1], so the log is finite.
Node* decompose_random_normal(Graph& g, Node* n) {
  const auto sizes = n->attrs.get_exprs("size");
  const std::string device = n->attrs.get_str("device");
  const int64_t offset = n->attrs.get_int("offset");
  const DType t = *n->attrs.get_dtype("dtype");
  const DType ct = t == DType::Float64 ? DType::Float64 : DType::Float32;
  auto uniform = [&](int64_t at) {
    Node* u = uniform_of(g, sizes, device, n->inputs[0], at);
    return ct == DType::Float32 ? u : g.must_add("convert", {u}, A({{"dtype", ct}}));
  };
  Node* u1 = uniform(offset);
  Node* u2 = uniform(offset + kSecondStream);
  Node* radius = g.must_add("sqrt", {g.must_add("mul", {g.must_add("log", {g.must_add("sub", {g.scalar(1.0, DType::Float64), u1})}),
                                                        g.scalar(-2.0, DType::Float64)})});
  Node* z = g.must_add("mul", {radius, g.must_add("cos", {g.must_add("mul", {u2, g.scalar(2 * M_PI, DType::Float64)})})});
  return ct == t ? z : g.must_add("convert", {z}, A({{"dtype", t}}));
}

// torch.randint / randint_like: low + floor(u * (high - low)), in float64 (u < 1, so below
// high); capture takes ranges up to 2**24, which the float32 draw covers evenly enough.
Node* decompose_random_int(Graph& g, Node* n) {
  Node* u = uniform_of(g, n->attrs.get_exprs("size"), n->attrs.get_str("device"), n->inputs[0], n->attrs.get_int("offset"));
  u = g.must_add("convert", {u}, A({{"dtype", DType::Float64}}));
  const int64_t low = n->attrs.get_int("low"), high = n->attrs.get_int("high");
  Node* v = g.must_add("floor", {g.must_add("mul", {u, g.scalar(static_cast<double>(high - low), DType::Float64)})});
  v = g.must_add("add", {v, g.scalar(static_cast<double>(low), DType::Float64)});
  return g.must_add("convert", {v}, A({{"dtype", *n->attrs.get_dtype("dtype")}}));
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
  // torch.rand, randn and randint (and their _like forms) inside a graph, keyed by the same seed
  // (each draw its own stretch of counters): reproducible under torch.manual_seed, the same
  // distributions as torch's, other values. kiln._eager_ops runs torch's own for backend="eager".
  ops.push_back(composite_op("random_uniform",
                             "random_uniform(Tensor seed, SymInt[] size, ScalarType dtype, str device, int offset=0)",
                             decompose_random_uniform, {"kiln._eager_ops.random_uniform"}));
  ops.back().doc = "torch.rand: uniform [0, 1) from philox_uniform";
  ops.push_back(composite_op("random_normal",
                             "random_normal(Tensor seed, SymInt[] size, ScalarType dtype, str device, int offset=0)",
                             decompose_random_normal, {"kiln._eager_ops.random_normal"}));
  ops.back().doc = "torch.randn: standard normal from two philox_uniform draws (Box-Muller)";
  ops.push_back(composite_op("random_int",
                             "random_int(Tensor seed, SymInt[] size, int low, int high, ScalarType dtype, str device, int offset=0)",
                             decompose_random_int, {"kiln._eager_ops.random_int"}));
  ops.back().doc = "torch.randint: integers in [low, high) from philox_uniform";
  return ops;
}

}  // namespace kiln::ops
