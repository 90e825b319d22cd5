// Attention written out by hand, rewritten into torch's fused scaled_dot_product_attention.
//
//   matmul(softmax(matmul(q, k.transpose(-2, -1)) {/ c | * c} [+ mask], dim=-1), v)
//
// becomes one extern call that never stores the (L x S) score matrix: on the GPU torch runs it
// as a flash or memory-efficient kernel, on the CPU as its flash kernel (blocks of keys, an
// online softmax, torch's threads over batch and heads), as inductor's attention patterns do on
// both. The rewrite keeps eager's semantics only where they are the fused op's, so it takes just
// this shape: 4-D q, k, v of one floating dtype (not float64) on one device
// with equal batch and head dims (no broadcasting), a constant scale, an additive mask of q's
// dtype that does not widen the scores, softmax over the last dim in the scores' dtype, and
// intermediates nothing else reads. Anything else is left to the decompositions.
#include <cmath>

#include "core/ops/registry.h"
#include "core/passes/passes.h"
#include "core/sym/shape_env.h"

namespace kiln::passes {
namespace {

using ir::Node;

bool only_used_by(const Node* n, const Node* user) { return n->users.size() == 1 && n->users[0] == user; }

std::optional<double> scalar_value(const Node* n) {
  if (!n || n->op_name() != "scalar" || (!is_floating(n->meta.dtype) && n->meta.dtype != DType::Int64)) return std::nullopt;
  return n->attrs.get_float("value");
}

bool last_two_swapped(const Node* t) {
  if (t->op_name() != "transpose") return false;
  const int64_t r = t->meta.dim();
  int64_t a = t->attrs.get_int("dim0"), b = t->attrs.get_int("dim1");
  a = a < 0 ? a + r : a;
  b = b < 0 ? b + r : b;
  return std::min(a, b) == r - 2 && std::max(a, b) == r - 1;
}

struct Attention {
  Node *q = nullptr, *k = nullptr, *v = nullptr, *mask = nullptr;
  double scale = 1.0;
};

// Whether `out` is the second matmul of the pattern above; fills `m`.
bool match(const Node* out, Attention& m) {
  if (out->op_name() != "matmul" || out->inputs.size() != 2) return false;
  const Node* p = out->inputs[0];
  m.v = out->inputs[1];
  if (p->op_name() != "softmax" || !only_used_by(p, out) || p->attrs.get_dtype("dtype")) return false;
  int64_t dim = p->attrs.get_int("dim");
  if (dim != -1 && dim != p->meta.dim() - 1) return false;
  const Node* s = p->inputs[0];
  if (s->op_name() == "add" && only_used_by(s, p) && s->attrs.get_float("alpha", 1.0) == 1.0) {
    for (int side = 0; side < 2 && !m.mask; ++side) {
      const Node *scores = s->inputs[side], *mask = s->inputs[1 - side];
      if (mask->op_name() == "scalar" || mask->meta.dtype != scores->meta.dtype || !only_used_by(scores, s)) continue;
      if (s->meta.sizes.size() != scores->meta.sizes.size()) continue;
      bool same = true;
      for (size_t i = 0; i < s->meta.sizes.size(); ++i) same = same && s->meta.sizes[i] == scores->meta.sizes[i];
      if (!same) continue;  // the mask would widen the scores
      m.mask = const_cast<Node*>(mask);
      s = scores;
    }
    if (!m.mask) return false;
  }
  if ((s->op_name() == "div" || s->op_name() == "mul") && (!m.mask ? only_used_by(s, p) : true)) {
    if (s->attrs.has("rounding_mode") && !s->attrs.get_str("rounding_mode").empty()) return false;
    auto c = scalar_value(s->inputs[1]);
    if (!c || *c == 0) return false;
    m.scale = s->op_name() == "div" ? 1.0 / *c : *c;
    if (s->meta.dtype != s->inputs[0]->meta.dtype) return false;  // an int scale that promotes
    s = s->inputs[0];
  }
  if (s->op_name() != "matmul" || s->users.size() != 1 || s->inputs.size() != 2 || !last_two_swapped(s->inputs[1]) ||
      s->inputs[1]->users.size() != 1)
    return false;
  m.q = s->inputs[0];
  m.k = s->inputs[1]->inputs[0];
  const ir::TensorMeta &q = m.q->meta, &k = m.k->meta, &v = m.v->meta;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || !is_floating(q.dtype) || q.dtype == DType::Float64) return false;
  if (k.dtype != q.dtype || v.dtype != q.dtype || p->meta.dtype != q.dtype) return false;
  if (k.device != q.device || v.device != q.device) return false;
  for (int d = 0; d < 2; ++d)
    if (!(q.sizes[d] == k.sizes[d]) || !(q.sizes[d] == v.sizes[d])) return false;
  return q.sizes[3] == k.sizes[3] && k.sizes[2] == v.sizes[2];
}

}  // namespace

void fuse_attention(ir::Graph& g) {
  bool changed = false;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    Node* out = g.nodes()[i].get();
    Attention m;
    if (!match(out, m)) continue;
    const size_t tail = g.nodes().size();
    ir::Attrs a;
    a.set("scale", m.scale);
    std::string error;
    Node* r = g.add("scaled_dot_product_attention", {m.q, m.k, m.v, m.mask}, a, error);
    if (!r) continue;
    // The fused kernels may write [B, L, H, E] transposed (the op's shape rule says where); a
    // result the caller gets has eager's row-major strides (inside the graph, consumers read
    // the fused layout as it is). Where the rule gives row-major already, nothing is copied.
    bool is_output = false;
    for (const Node* o : g.outputs()) is_output = is_output || o == out;
    if (is_output && !ir::is_contiguous(r->meta.sizes, r->meta.strides)) r = g.must_add("contiguous", {r});
    g.move_tail_before(tail, out);
    g.replace_all_uses(out, r);
    ++i;
    changed = true;
  }
  if (changed) dead_code_elimination(g);
}

void additive_attention_masks(ir::Graph& g) {
  bool changed = false;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    Node* n = g.nodes()[i].get();
    if (n->op_name() != "scaled_dot_product_attention" || n->inputs.size() < 4 || !n->inputs[3] ||
        n->inputs[3]->meta.dtype != DType::Bool)
      continue;
    Node* mask = n->inputs[3];
    const DType t = n->inputs[0]->meta.dtype;
    if (!is_floating(t)) continue;
    // torch's own first step (convert_boolean_attn_mask): true keeps a score, false adds -inf.
    const size_t tail = g.nodes().size();
    std::string error;
    Node* w = g.add("where", {mask, g.scalar(0.0, DType::Float64), g.scalar(-INFINITY, DType::Float64)}, {}, error);
    if (!w) continue;
    ir::Attrs to;
    to.set("dtype", t);
    Node* additive = w->meta.dtype == t ? w : g.add("convert", {w}, to, error);
    if (!additive) continue;
    g.move_tail_before(tail, n);
    i += g.nodes().size() - tail;
    n->inputs[3] = additive;
    changed = true;
  }
  if (!changed) return;
  g.recompute_users();
  common_subexpression_elimination(g);  // one mask for every layer that shares it
  dead_code_elimination(g);
}

}  // namespace kiln::passes
