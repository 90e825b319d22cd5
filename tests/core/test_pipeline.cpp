// End-to-end through the core: build a graph by hand, compile it, run the CPU kernels on raw
// buffers, compare with a reference computed here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/pipeline/compile_graph.h"

using namespace kiln;

namespace {
ir::TensorMeta f32(std::vector<int64_t> sizes) {
  ir::TensorMeta m;
  m.dtype = DType::Float32;
  for (auto s : sizes) m.sizes.push_back(s);
  m.strides = ir::contiguous_strides(m.sizes);
  return m;
}

// Runs a compiled CPU program whose buffers are inputs, outputs and temps (no externs).
void run(const pipeline::CompiledGraph& cg, std::vector<std::vector<float>>& bufs) {
  const loop::Program& p = cg.program;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    std::vector<void*> args;
    for (int b : p.kernels[i].buffers) args.push_back(bufs[b].data());
    cg.kernels[i].cpu_fn(args.data());
  }
}
}  // namespace

TEST(Pipeline, GeluIsOneKernel) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", f32({1000}));
  auto c = [&](double v) { return g.scalar(v, DType::Float64); };
  ir::Node* x3 = g.must_add("pow", {x, c(3.0)});
  ir::Node* inner = g.must_add("mul", {c(0.7978845608028654), g.must_add("add", {x, g.must_add("mul", {c(0.044715), x3})})});
  ir::Node* y = g.must_add("mul", {g.must_add("mul", {x, c(0.5)}), g.must_add("add", {c(1.0), g.must_add("tanh", {inner})})});
  g.outputs().push_back(y);
  pipeline::CompiledGraph cg;
  std::string err;
  ASSERT_TRUE(pipeline::compile_graph(g, {}, cg, err)) << err;
  ASSERT_EQ(cg.kernels.size(), 1u) << cg.source;
  std::vector<std::vector<float>> bufs(cg.program.buffers.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& b : bufs) b.resize(1000);
  for (auto& v : bufs[0]) v = nd(rng);
  run(cg, bufs);
  int out = cg.program.outputs[0].view.buffer;
  for (int i = 0; i < 1000; ++i) {
    float xv = bufs[0][i];
    float ref = xv * 0.5f * (1.0f + std::tanh(0.7978845608028654f * (xv + 0.044715f * xv * xv * xv)));
    ASSERT_NEAR(bufs[out][i], ref, 1e-5f);
  }
}

TEST(Pipeline, SoftmaxIsOneKernel) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", f32({8, 33}));
  ir::Attrs a;
  a.set("dim", int64_t(-1));
  g.outputs().push_back(g.must_add("softmax", {x}, a));
  pipeline::CompiledGraph cg;
  std::string err;
  ASSERT_TRUE(pipeline::compile_graph(g, {}, cg, err)) << err;
  ASSERT_EQ(cg.kernels.size(), 1u) << cg.loop_text << cg.source;
  std::vector<std::vector<float>> bufs(cg.program.buffers.size(), std::vector<float>(8 * 33));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto& v : bufs[0]) v = nd(rng);
  run(cg, bufs);
  int out = cg.program.outputs[0].view.buffer;
  for (int r = 0; r < 8; ++r) {
    double m = -1e30, s = 0;
    for (int c = 0; c < 33; ++c) m = std::max(m, (double)bufs[0][r * 33 + c]);
    for (int c = 0; c < 33; ++c) s += std::exp(bufs[0][r * 33 + c] - m);
    for (int c = 0; c < 33; ++c) ASSERT_NEAR(bufs[out][r * 33 + c], std::exp(bufs[0][r * 33 + c] - m) / s, 1e-6);
  }
}

TEST(Pipeline, TransposedInputAddsWithoutCopies) {
  ir::Graph g;
  ir::TensorMeta m = f32({4, 6});
  ir::Node* a = g.placeholder("a", m);
  ir::Node* b = g.placeholder("b", f32({6, 4}));
  ir::Attrs t;
  t.set("dim0", int64_t(0));
  t.set("dim1", int64_t(1));
  g.outputs().push_back(g.must_add("add", {a, g.must_add("transpose", {b}, t)}));
  pipeline::CompiledGraph cg;
  std::string err;
  ASSERT_TRUE(pipeline::compile_graph(g, {}, cg, err)) << err;
  ASSERT_EQ(cg.kernels.size(), 1u);
  std::vector<std::vector<float>> bufs(cg.program.buffers.size(), std::vector<float>(24));
  for (int i = 0; i < 24; ++i) bufs[0][i] = i, bufs[1][i] = 100 * i;
  run(cg, bufs);
  int out = cg.program.outputs[0].view.buffer;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) ASSERT_EQ(bufs[out][i * 6 + j], bufs[0][i * 6 + j] + bufs[1][j * 4 + i]);
}

// A batch-4 activation has only 4 points in its first dim: the threads must split the leading
// dims together (collapse), and the per-channel affine + relu must still be exact.
TEST(Pipeline, SmallBatchPointwiseSplitsLeadingDimsAcrossThreads) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", f32({4, 16, 40, 40}));
  ir::Node* w = g.placeholder("w", f32({16, 1, 1}));
  g.outputs().push_back(g.must_add("relu", {g.must_add("mul", {x, w})}));
  pipeline::CompiledGraph cg;
  std::string err;
  ASSERT_TRUE(pipeline::compile_graph(g, {}, cg, err)) << err;
  ASSERT_EQ(cg.kernels.size(), 1u) << cg.source;
  EXPECT_NE(cg.source.find("#pragma omp parallel for schedule(static) collapse(2)"), std::string::npos) << cg.source;
  std::vector<std::vector<float>> bufs(cg.program.buffers.size());
  const size_t n = 4 * 16 * 40 * 40;
  const int xb = cg.program.inputs[0], wb = cg.program.inputs[1], out = cg.program.outputs[0].view.buffer;
  bufs[xb].resize(n);
  bufs[wb].resize(16);
  bufs[out].resize(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& v : bufs[xb]) v = nd(rng);
  for (auto& v : bufs[wb]) v = nd(rng);
  run(cg, bufs);
  for (size_t i = 0; i < n; ++i) {
    float ref = std::max(0.0f, bufs[xb][i] * bufs[wb][(i / 1600) % 16]);
    ASSERT_EQ(bufs[out][i], ref) << i;
  }
}

// A CPU program compiled as several translation units (one per core on big graphs): each
// kernel is found in the linked library, the vector libm entry points the first unit defines
// serve the kernels of the others, and an integer division by zero in any unit reaches the one
// error flag the executor reads.
TEST(Pipeline, KernelsSplitOverTranslationUnitsLinkIntoOneLibrary) {
  setenv("KILN_CPU_UNITS", "3", 1);
  ir::Graph g;
  ir::Node* x = g.placeholder("x", f32({8, 33}));
  ir::Node* y = g.placeholder("y", f32({100}));
  ir::TensorMeta im = f32({50});
  im.dtype = DType::Int64;
  ir::Node* a = g.placeholder("a", im);
  ir::Node* b = g.placeholder("b", im);
  ir::Attrs rows;
  rows.set("dim", std::vector<int64_t>{1});
  g.outputs().push_back(g.must_add("sum", {g.must_add("exp", {x})}, rows));
  g.outputs().push_back(g.must_add("tanh", {g.must_add("exp", {y})}));
  g.outputs().push_back(g.must_add("floor_divide", {a, b}));
  pipeline::CompiledGraph cg;
  std::string err;
  const bool ok = pipeline::compile_graph(g, {}, cg, err);
  unsetenv("KILN_CPU_UNITS");
  ASSERT_TRUE(ok) << err;
  ASSERT_EQ(cg.kernels.size(), 3u) << cg.source;
  size_t units = 0;
  for (size_t at = cg.source.find("// Generated by kiln"); at != std::string::npos; at = cg.source.find("// Generated by kiln", at + 1)) ++units;
  EXPECT_EQ(units, 3u) << "one kernel a unit";
  const loop::Program& p = cg.program;
  std::vector<std::vector<char>> mem(p.buffers.size());
  for (const loop::Buffer& buf : p.buffers) mem[buf.id].resize(static_cast<size_t>(*buf.bytes().as_const()) + 16);
  auto f = [&](int id) { return reinterpret_cast<float*>(mem[id].data()); };
  auto i64 = [&](int id) { return reinterpret_cast<int64_t*>(mem[id].data()); };
  for (int i = 0; i < 8 * 33; ++i) f(p.inputs[0])[i] = std::sin(i * 0.1f);
  for (int i = 0; i < 100; ++i) f(p.inputs[1])[i] = std::cos(i * 0.2f);
  for (int i = 0; i < 50; ++i) i64(p.inputs[2])[i] = 7 * i - 100, i64(p.inputs[3])[i] = i % 5 - 2;  // zeros at i % 5 == 2
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    std::vector<void*> args;
    for (int bid : p.kernels[k].buffers) args.push_back(mem[bid].data());
    cg.kernels[k].cpu_fn(args.data());
  }
  for (int r = 0; r < 8; ++r) {
    double ref = 0;
    for (int c = 0; c < 33; ++c) ref += std::exp(std::sin((r * 33 + c) * 0.1f));
    EXPECT_NEAR(f(p.outputs[0].view.buffer)[r], ref, 1e-4 * ref);
  }
  for (int i = 0; i < 100; ++i) EXPECT_NEAR(f(p.outputs[1].view.buffer)[i], std::tanh(std::exp(std::cos(i * 0.2f))), 1e-5);
  for (int i = 0; i < 50; ++i) {
    const int64_t d = i % 5 - 2, n = 7 * i - 100;
    if (d == 0) continue;
    const int64_t q = n / d - ((n % d != 0) && ((n < 0) != (d < 0)));
    EXPECT_EQ(i64(p.outputs[2].view.buffer)[i], q) << i;
  }
  ASSERT_NE(cg.take_error, nullptr);
  EXPECT_EQ(cg.take_error(), 1) << "the division by zero in a secondary unit";
  EXPECT_EQ(cg.take_error(), 0) << "taken once";
}

// Two layers (row sums scaling their input) with a matrix product between them, as a model's
// layers have: the second layer's kernel is the same code over other buffers, defined once as
// the first's alias (kernel_identity.h), and each computes over its own buffers.
TEST(Pipeline, KernelsOfRepeatedLayersAreDefinedOnce) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", f32({8, 33}));
  ir::Node* w = g.placeholder("w", f32({33, 33}));
  ir::Attrs rows;
  rows.set("dim", std::vector<int64_t>{1});
  rows.set("keepdim", true);
  auto layer = [&](ir::Node* in) { return g.must_add("mul", {g.must_add("sum", {g.must_add("exp", {in})}, rows), in}); };
  g.outputs().push_back(layer(g.must_add("mm", {layer(x), w})));
  pipeline::CompiledGraph cg;
  std::string err;
  ASSERT_TRUE(pipeline::compile_graph(g, {}, cg, err)) << err;
  const loop::Program& p = cg.program;
  ASSERT_EQ(cg.kernels.size(), 2u) << cg.source;
  ASSERT_EQ(p.externs.size(), 1u) << cg.source;
  EXPECT_NE(cg.source.find("__attribute__((alias(\"" + p.kernels[0].name + "\")))"), std::string::npos) << cg.source;
  // explain's code of the alias: its declaration, then the code it shares
  EXPECT_EQ(cg.kernels[1].source.find("// " + p.kernels[1].name + ": the same code as " + p.kernels[0].name), 0u) << cg.kernels[1].source;
  EXPECT_NE(cg.kernels[1].source.find(cg.kernels[0].source), std::string::npos) << cg.kernels[1].source;
  std::vector<std::vector<float>> mem(p.buffers.size());
  for (const loop::Buffer& buf : p.buffers) mem[buf.id].resize(static_cast<size_t>(*buf.bytes().as_const()) / 4 + 4);
  for (int i = 0; i < 8 * 33; ++i) mem[p.inputs[0]][i] = std::sin(i * 0.1f) * 0.2f;
  for (int i = 0; i < 33 * 33; ++i) mem[p.inputs[1]][i] = std::cos(i * 0.3f) * 0.01f;
  auto ref_layer = [](const std::vector<double>& in) {
    std::vector<double> out(in.size());
    for (int r = 0; r < 8; ++r) {
      double s = 0;
      for (int k = 0; k < 33; ++k) s += std::exp(in[r * 33 + k]);
      for (int c = 0; c < 33; ++c) out[r * 33 + c] = s * in[r * 33 + c];
    }
    return out;
  };
  for (const loop::Step& st : p.steps) {
    if (st.kind == loop::Step::Kind::Kernel) {
      std::vector<void*> args;
      for (int b : p.kernels[st.index].buffers) args.push_back(mem[b].data());
      cg.kernels[st.index].cpu_fn(args.data());
      continue;
    }
    const loop::Extern& e = p.externs[st.index];  // the matrix product, by hand
    const float* a = mem[e.inputs[0].buffer].data();
    const float* b = mem[e.inputs[1].buffer].data();
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 33; ++c) {
        float acc = 0;
        for (int k = 0; k < 33; ++k) acc += a[r * 33 + k] * b[k * 33 + c];
        mem[e.output][r * 33 + c] = acc;
      }
  }
  std::vector<double> h(mem[p.inputs[0]].begin(), mem[p.inputs[0]].begin() + 8 * 33);
  h = ref_layer(h);
  std::vector<double> m(8 * 33, 0.0);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 33; ++c)
      for (int k = 0; k < 33; ++k) m[r * 33 + c] += h[r * 33 + k] * mem[p.inputs[1]][k * 33 + c];
  const std::vector<double> want = ref_layer(m);
  for (int i = 0; i < 8 * 33; ++i) EXPECT_NEAR(mem[p.outputs[0].view.buffer][i], want[i], 1e-4 * (1 + std::abs(want[i]))) << i;
}

// cat as a gather: rotate_half(x) * 2 (cat(-x[.., 4:], x[.., :4]) over the last dim) is one
// kernel reading x, with each output element taken from the input that holds it.
TEST(Pipeline, CatFusesWithItsProducersAndConsumers) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", f32({3, 8}));
  auto slice = [&](int64_t start, int64_t end) {
    ir::Attrs a;
    a.set("dim", int64_t(1));
    a.set("start", start);
    a.set("end", end);
    a.set("step", int64_t(1));
    return g.must_add("slice", {x}, a);
  };
  ir::Attrs at;
  at.set("dim", int64_t(-1));
  ir::Node* cat = g.must_add("cat", {g.must_add("neg", {slice(4, 8)}), slice(0, 4)}, at);
  EXPECT_EQ(sym::str(cat->meta.sizes), "[3, 8]");
  g.outputs().push_back(g.must_add("mul", {cat, g.scalar(2.0, DType::Float64)}));
  pipeline::CompiledGraph cg;
  std::string err;
  ASSERT_TRUE(pipeline::compile_graph(g, {}, cg, err)) << err;
  ASSERT_EQ(cg.kernels.size(), 1u) << cg.loop_text;
  std::vector<std::vector<float>> bufs(cg.program.buffers.size(), std::vector<float>(24));
  for (int i = 0; i < 24; ++i) bufs[0][i] = static_cast<float>(i) * 0.5f - 3.0f;
  run(cg, bufs);
  int out = cg.program.outputs[0].view.buffer;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 8; ++c) {
      float ref = c < 4 ? -bufs[0][r * 8 + c + 4] * 2 : bufs[0][r * 8 + c - 4] * 2;
      ASSERT_EQ(bufs[out][r * 8 + c], ref) << r << "," << c;
    }
}

// Whether a kernel forks its thread team follows the cost of its body, not its point count
// alone: an erf over 24,576 floats (BERT 1x8's gelu) is split across threads, an add of the
// same size is not.
TEST(Pipeline, CostlyBodiesSplitAcrossThreadsAtFewerPoints) {
  auto source_of = [](const char* op) {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", f32({8, 3072}));
    ir::Node* y = std::string(op) == "add" ? g.must_add("add", {x, x}) : g.must_add(op, {x});
    g.outputs().push_back(y);
    pipeline::CompiledGraph cg;
    std::string err;
    EXPECT_TRUE(pipeline::compile_graph(g, {}, cg, err)) << err;
    return cg.source;
  };
  EXPECT_NE(source_of("erf").find("#pragma omp parallel"), std::string::npos);
  EXPECT_NE(source_of("exp").find("#pragma omp parallel"), std::string::npos);
  EXPECT_EQ(source_of("add").find("#pragma omp parallel"), std::string::npos);
}
