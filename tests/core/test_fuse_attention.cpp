// passes::fuse_attention: attention written out by hand becomes torch's fused
// scaled_dot_product_attention exactly where the semantics are the same, and nowhere else.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/ir/graph.h"
#include "core/ops/registry.h"
#include "core/lower/lower.h"
#include "core/passes/passes.h"
#include "graph_helpers.h"

using namespace kiln;
using ir::Attrs;
using ir::Graph;
using ir::Node;
using test::A;
using test::meta;

namespace {

std::vector<std::string> ops_of(const Graph& g) {
  std::vector<std::string> out;
  for (auto& n : g.nodes())
    if (n->op->kind != ops::OpKind::Source) out.push_back(n->op_name());
  return out;
}

struct Spec {
  DType dtype = DType::BFloat16;
  DeviceType device = DeviceType::CUDA;
  bool divide = true;        // scores / 8 (else * 0.125)
  bool mask = false;         // + an additive mask of the scores' dtype
  DType mask_dtype = DType::BFloat16;
  bool scores_escape = false;  // the scores are also an output
  int64_t softmax_dim = -1;
};

// q, k, v: (2, 4, 16, 8); returns the graph's output node.
Node* build(Graph& g, const Spec& s) {
  Node* q = g.placeholder("q", meta({2, 4, 16, 8}, s.dtype, s.device));
  Node* k = g.placeholder("k", meta({2, 4, 16, 8}, s.dtype, s.device));
  Node* v = g.placeholder("v", meta({2, 4, 16, 8}, s.dtype, s.device));
  Node* kt = g.must_add("transpose", {k}, A({{"dim0", int64_t(-2)}, {"dim1", int64_t(-1)}}));
  Node* scores = g.must_add("matmul", {q, kt});
  Node* scaled = s.divide ? g.must_add("div", {scores, g.scalar(8.0, DType::Float64)})
                          : g.must_add("mul", {scores, g.scalar(0.125, DType::Float64)});
  if (s.mask) {
    Node* m = g.placeholder("mask", meta({2, 1, 16, 16}, s.mask_dtype, s.device));
    scaled = g.must_add("add", {scaled, m});
  }
  Node* p = g.must_add("softmax", {scaled}, A({{"dim", s.softmax_dim}}));
  Node* out = g.must_add("matmul", {p, v});
  g.outputs().push_back(out);
  if (s.scores_escape) g.outputs().push_back(scores);
  return out;
}

std::vector<std::string> fused(const Spec& s) {
  Graph g;
  build(g, s);
  passes::fuse_attention(g);
  return ops_of(g);
}

// The graph's output keeps eager's row-major layout: torch's 16-bit CUDA kernels write the
// query's (row-major) layout, so the fused op is all; float32's write [B, L, H, E] transposed,
// so a contiguous copy follows.
const std::vector<std::string> kFused = {"scaled_dot_product_attention"};
const std::vector<std::string> kFusedCopied = {"scaled_dot_product_attention", "contiguous"};

}  // namespace

TEST(FuseAttention, ScaledScoresSoftmaxAndMatmulBecomeOneCall) {
  Graph g;
  build(g, Spec{});
  passes::fuse_attention(g);
  EXPECT_EQ(ops_of(g), kFused);
  const Node* r = g.outputs()[0];
  EXPECT_EQ(r->op_name(), "scaled_dot_product_attention");
  EXPECT_DOUBLE_EQ(r->attrs.get_float("scale"), 0.125);
  EXPECT_EQ(r->inputs[3], nullptr);  // no mask
  EXPECT_EQ(r->meta.str(), "bf16[2, 4, 16, 8]@cuda:0");
  EXPECT_EQ(g.outputs()[0]->meta.strides, ir::contiguous_strides(r->meta.sizes));
}

TEST(FuseAttention, MultipliedScaleAndAdditiveMask) {
  Spec s;
  s.divide = false;
  s.mask = true;
  Graph g;
  build(g, s);
  passes::fuse_attention(g);
  ASSERT_EQ(ops_of(g), kFused);
  const Node* r = g.outputs()[0];
  EXPECT_DOUBLE_EQ(r->attrs.get_float("scale"), 0.125);
  EXPECT_EQ(r->inputs[3]->name, "mask");
}

TEST(FuseAttention, FusesFloat32AndFloat16Too) {
  for (DType t : {DType::Float32, DType::Float16}) {
    Spec s;
    s.dtype = s.mask_dtype = t;
    EXPECT_EQ(fused(s), t == DType::Float32 ? kFusedCopied : kFused) << dtype_name(t);
  }
}

// On the CPU the fused op's result is laid out as torch's kernel gives it: as the query with
// torch 2.14 (no copy back to eager's row-major result), [B, L, H, E] transposed before.
TEST(FuseAttention, OnTheCpuTheResultLayoutFollowsTorchsVersion) {
  Spec cpu;
  cpu.device = DeviceType::CPU;
  bool& like_query = ops::torch_facts().cpu_attention_like_query;
  const bool saved = like_query;
  like_query = true;
  EXPECT_EQ(fused(cpu), kFused);
  like_query = false;
  EXPECT_EQ(fused(cpu), kFusedCopied);
  like_query = saved;
}

TEST(FuseAttention, LeavesWhatTheFusedOpWouldComputeDifferently) {
  Spec bool_mask;
  bool_mask.mask = true;
  bool_mask.mask_dtype = DType::Bool;  // a bool mask means "keep" to the fused op, not "add"
  EXPECT_NE(fused(bool_mask), kFused);
  Spec escape;
  escape.scores_escape = true;  // the scores are needed themselves
  EXPECT_NE(fused(escape), kFused);
  Spec other_dim;
  other_dim.softmax_dim = 2;  // softmax over the queries, not the keys
  EXPECT_NE(fused(other_dim), kFused);
  Spec f64;
  f64.dtype = f64.mask_dtype = DType::Float64;
  EXPECT_NE(fused(f64), kFused);
}

// The fused op's result layout is the one torch's kernels give (so the executor need not copy
// it): on CUDA in float16/bfloat16 the query's layout, otherwise [B, L, H, E] transposed.
TEST(FuseAttention, ResultLayoutFollowsTorchsKernels) {
  auto result_strides = [](DType t, DeviceType dev, bool query_blhe) {
    Graph g;
    ir::TensorMeta m = meta({2, 4, 16, 8}, t, dev);
    if (query_blhe) m.strides = {16 * 4 * 8, 8, 4 * 8, 1};  // [B, L, H, E] memory, seen as [B, H, L, E]
    Node* q = g.placeholder("q", m);
    Node* k = g.placeholder("k", meta({2, 4, 16, 8}, t, dev));
    Node* v = g.placeholder("v", meta({2, 4, 16, 8}, t, dev));
    return g.must_add("scaled_dot_product_attention", {q, k, v})->meta.strides;
  };
  const std::vector<sym::Expr> row_major = ir::contiguous_strides({2, 4, 16, 8}), blhe = {512, 8, 32, 1};
  bool& like_query = ops::torch_facts().cpu_attention_like_query;
  const bool saved = like_query;
  for (DType t : {DType::BFloat16, DType::Float16}) {
    EXPECT_EQ(result_strides(t, DeviceType::CUDA, false), row_major);
    EXPECT_EQ(result_strides(t, DeviceType::CUDA, true), blhe);
    like_query = false;  // torch 2.11's CPU kernel
    EXPECT_EQ(result_strides(t, DeviceType::CPU, false), blhe);
    like_query = true;  // torch 2.14's
    EXPECT_EQ(result_strides(t, DeviceType::CPU, false), row_major);
    EXPECT_EQ(result_strides(t, DeviceType::CPU, true), blhe);
  }
  like_query = saved;
  EXPECT_EQ(result_strides(DType::Float32, DeviceType::CUDA, false), blhe);
  EXPECT_EQ(result_strides(DType::Float32, DeviceType::CUDA, true), blhe);
  // A graph output of a fused bfloat16 attention over row-major inputs needs no copy back.
  Graph g;
  build(g, Spec{});
  passes::fuse_attention(g);
  EXPECT_EQ(g.outputs()[0]->meta.strides, row_major);
}

// torch's fused GPU attention takes an attn_mask only with a unit innermost stride (else its math
// path, several times slower): a mask kiln would pass as a broadcast view striding its last dim
// by 0 is given as a row-major copy; one that strides by 1 is passed as the view it is.
TEST(FuseAttention, AttentionMaskReachesTorchWithAUnitInnermostStride) {
  for (bool by_query : {true, false}) {
    Graph g;
    const auto f32 = [](std::vector<int64_t> s) { return meta(s, DType::Float32, DeviceType::CUDA); };
    Node* q = g.placeholder("q", f32({2, 4, 16, 8}));
    Node* k = g.placeholder("k", f32({2, 4, 16, 8}));
    Node* v = g.placeholder("v", f32({2, 4, 16, 8}));
    Node* row = g.placeholder("row", meta({16}, DType::Bool, DeviceType::CUDA));
    using Ints = std::vector<int64_t>;
    // by query: mask[b, 0, i, j] = row[i] (strides 0, 0, 1, 0); by key: row[j] (0, 0, 0, 1)
    Node* shaped = g.must_add("reshape", {row}, A({{"shape", by_query ? Ints{1, 1, 16, 1} : Ints{1, 1, 1, 16}}}));
    Node* mask = g.must_add("expand", {shaped}, A({{"size", Ints{2, 1, 16, 16}}}));
    Node* out = g.must_add("scaled_dot_product_attention", {q, k, v, mask});
    g.outputs().push_back(out);
    // Its gradient calls torch's kernel again (aten_vjp nodes): the same rule holds there.
    for (Node* d : out->op->derivative(g, out, g.placeholder("grad", f32({2, 4, 16, 8}))))
      if (d) g.outputs().push_back(d);
    loop::Program p;
    std::string err;
    ASSERT_TRUE(lower::lower_graph(g, p, err)) << err;
    ASSERT_EQ(p.externs.size(), 1u + 3u) << p.str();  // the attention, and q's, k's and v's gradients
    EXPECT_EQ(p.kernels.size(), by_query ? 1u : 0u) << p.str();  // one copy, for all four
    for (const loop::Extern& e : p.externs) {
      const loop::BufferView& m = e.inputs[3];
      EXPECT_TRUE(m.strides.back().is_const(1)) << p.str();
      EXPECT_EQ(m.buffer == p.inputs[3], !by_query) << p.str();  // a copy only where needed
    }
  }
}
