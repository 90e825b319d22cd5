// Generated CUDA must compile: NVRTC runs here (no GPU needed) over the kernels of the graphs
// the GPU tests run, so a codegen error shows up in CI, not first on the GPU machine.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <iostream>
#include <filesystem>

#include "core/codegen/cuda_codegen.h"
#include "core/compile/nvrtc.h"
#include "core/lower/lower.h"
#include "core/pipeline/compile_graph.h"
#include "core/pipeline/cuda_units.h"
#include "core/schedule/schedule.h"

using namespace kiln;

namespace {

void use_wheel_nvrtc() {
  const char* dir = "/root/.kiln-dev/venv/lib/python3.11/site-packages/nvidia/cu13/lib";
  if (!std::getenv("KILN_NVRTC_DIRS") && std::filesystem::exists(dir)) setenv("KILN_NVRTC_DIRS", dir, 0);
}

ir::TensorMeta cuda_meta(DType t, std::vector<int64_t> sizes) {
  ir::TensorMeta m;
  m.dtype = t;
  m.device = Device{DeviceType::CUDA, 0};
  for (auto s : sizes) m.sizes.push_back(s);
  m.strides = ir::contiguous_strides(m.sizes);
  return m;
}

// Lowers, schedules and generates CUDA for `g`; compiles it with NVRTC for sm_90.
void expect_compiles(ir::Graph& g, size_t expected_kernels) {
  use_wheel_nvrtc();
  std::string why;
  if (!compile::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  pipeline::run_graph_passes(g);
  loop::Program p;
  std::string err;
  ASSERT_TRUE(lower::lower_graph(g, p, err)) << err;
  schedule::schedule(p);
  ASSERT_EQ(p.kernels.size(), expected_kernels) << p.str();
  codegen::CudaSource src = codegen::generate_cuda(p);
  compile::NvrtcResult r = compile::nvrtc_compile(src.source, "sm_90", "test");
  ASSERT_TRUE(r.ok) << r.log << "\n" << src.source;
}

ir::Attrs attrs(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  ir::Attrs a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}

}  // namespace

TEST(CudaCodegen, GeluCompiles) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {1 << 20}));
  auto c = [&](double v) { return g.scalar(v, DType::Float64); };
  ir::Node* inner = g.must_add("mul", {c(0.7978845608028654), g.must_add("add", {x, g.must_add("mul", {c(0.044715), g.must_add("pow", {x, c(3.0)})})})});
  g.outputs().push_back(g.must_add("mul", {g.must_add("mul", {x, c(0.5)}), g.must_add("add", {c(1.0), g.must_add("tanh", {inner})})}));
  expect_compiles(g, 1);
}

TEST(CudaCodegen, SoftmaxAndLogSoftmaxCompile) {
  for (const char* op : {"softmax", "log_softmax"}) {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {64, 1000}));
    g.outputs().push_back(g.must_add(op, {x}, attrs({{"dim", int64_t(-1)}})));
    expect_compiles(g, 1);
  }
}

TEST(CudaCodegen, ReductionsOfEveryKindCompile) {
  for (DType t : {DType::Float32, DType::Float64, DType::Int64, DType::Int32}) {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(t, {8, 33, 5}));
    g.outputs().push_back(g.must_add("sum", {x}, attrs({{"dim", std::vector<int64_t>{1}}})));
    g.outputs().push_back(g.must_add("amax", {x}, attrs({{"dim", std::vector<int64_t>{0, 2}}, {"keepdim", true}})));
    g.outputs().push_back(g.must_add("amin", {x}, attrs({})));
    expect_compiles(g, 3);
  }
}

TEST(CudaCodegen, PointwiseOverEveryDtypeCompiles) {
  for (DType t : {DType::Bool, DType::UInt8, DType::Int8, DType::Int16, DType::Int32, DType::Int64, DType::Float32,
                  DType::Float64}) {
    ir::Graph g;
    ir::Node* a = g.placeholder("a", cuda_meta(t, {4, 6}));
    ir::Node* b = g.placeholder("b", cuda_meta(t, {6}));
    ir::Node* s = g.must_add("add", {a, b});
    ir::Node* m = g.must_add("maximum", {s, a});
    ir::Node* w = g.must_add("where", {g.must_add("gt", {m, b}), m, a});
    g.outputs().push_back(g.must_add("div", {w, g.scalar(3.0, DType::Float64)}));
    g.outputs().push_back(g.must_add("eq", {a, b}));
    expect_compiles(g, 1);
  }
}

TEST(CudaCodegen, BoolAndNarrowReductionsAndSizeOneReductionsCompile) {
  for (DType t : {DType::Bool, DType::Int8, DType::UInt8, DType::Int16}) {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(t, {8, 300}));
    g.outputs().push_back(g.must_add("amax", {x}, attrs({{"dim", std::vector<int64_t>{1}}})));
    expect_compiles(g, 1);
  }
  ir::Graph g;
  ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {4, 1}));
  g.outputs().push_back(g.must_add("sum", {x}, attrs({{"dim", std::vector<int64_t>{1}}})));
  expect_compiles(g, 1);
}

TEST(CudaCodegen, FusedCastsToSixteenBitFloatsRoundAndCompile) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {1000}));
  ir::Node* h = g.must_add("convert", {x}, attrs({{"dtype", DType::Float16}}));
  ir::Node* b = g.must_add("convert", {x}, attrs({{"dtype", DType::BFloat16}}));
  ir::Node* hf = g.must_add("convert", {h}, attrs({{"dtype", DType::Float32}}));
  ir::Node* bf = g.must_add("convert", {b}, attrs({{"dtype", DType::Float32}}));
  g.outputs().push_back(g.must_add("add", {hf, bf}));
  pipeline::run_graph_passes(g);
  loop::Program p;
  std::string err;
  ASSERT_TRUE(lower::lower_graph(g, p, err)) << err;
  schedule::schedule(p);
  std::string src = codegen::generate_cuda(p).source;
  EXPECT_NE(src.find("kiln_round_f16(t"), std::string::npos) << src;
  EXPECT_NE(src.find("kiln_round_bf16(t"), std::string::npos) << src;
  ir::Graph g2;
  ir::Node* y = g2.placeholder("x", cuda_meta(DType::Float32, {1000}));
  ir::Node* yh = g2.must_add("convert", {y}, attrs({{"dtype", DType::Float16}}));
  g2.outputs().push_back(g2.must_add("convert", {g2.must_add("mul", {yh, yh})}, attrs({{"dtype", DType::Float32}})));
  expect_compiles(g2, 1);
}

namespace {
// `g` through the graph passes, lowering and scheduling.
loop::Program scheduled(ir::Graph& g) {
  pipeline::run_graph_passes(g);
  loop::Program p;
  std::string err;
  EXPECT_TRUE(lower::lower_graph(g, p, err)) << err;
  schedule::schedule(p);
  return p;
}

std::string cuda_source_of(ir::Graph& g) { return codegen::generate_cuda(scheduled(g)).source; }
}  // namespace

// Pointwise kernels move 16 bytes a thread where their accesses step by one along the innermost
// loop: 8 bfloat16 or 4 float32 elements, with a broadcast bias read element by element.
TEST(CudaCodegen, PointwiseKernelsLoadAndStoreVectors) {
  {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::BFloat16, {64, 3072}));
    ir::Node* b = g.placeholder("b", cuda_meta(DType::BFloat16, {3072}));
    g.outputs().push_back(g.must_add("gelu", {g.must_add("add", {x, b})}));
    const std::string src = cuda_source_of(g);
    EXPECT_NE(src.find("kiln_vec<kiln_bf16, 8>"), std::string::npos) << src;
    if (getenv("SHOW_SRC")) std::cout << src.substr(src.find("kiln_idx;"));
    ir::Graph g2;
    ir::Node* x2 = g2.placeholder("x", cuda_meta(DType::BFloat16, {64, 3072}));
    ir::Node* b2 = g2.placeholder("b", cuda_meta(DType::BFloat16, {3072}));
    g2.outputs().push_back(g2.must_add("gelu", {g2.must_add("add", {x2, b2})}));
    expect_compiles(g2, 1);
  }
  {  // bfloat16 in, float32 out: 4 of each (8 and 16 bytes)
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::BFloat16, {1 << 16}));
    g.outputs().push_back(g.must_add("convert", {g.must_add("exp", {x})}, attrs({{"dtype", DType::Float32}})));
    const std::string src = cuda_source_of(g);
    EXPECT_NE(src.find("kiln_vec<kiln_bf16, 4>"), std::string::npos) << src;
    EXPECT_NE(src.find("kiln_vec<float, 4>"), std::string::npos) << src;
  }
  {  // an innermost extent that is not a multiple of the width stays scalar
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {4099, 3}));
    g.outputs().push_back(g.must_add("exp", {g.must_add("transpose", {x}, attrs({{"dim0", int64_t(0)}, {"dim1", int64_t(1)}}))}));
    const std::string src = cuda_source_of(g);
    EXPECT_EQ(src.find("kiln_vec<float"), std::string::npos) << src;
  }
  for (DType t : {DType::Bool, DType::UInt8, DType::Int16, DType::Int64, DType::Float64, DType::Float16}) {
    ir::Graph g;
    ir::Node* a = g.placeholder("a", cuda_meta(t, {64, 256}));
    ir::Node* b = g.placeholder("b", cuda_meta(t, {256}));
    g.outputs().push_back(g.must_add("maximum", {a, b}));
    g.outputs().push_back(g.must_add("eq", {a, b}));
    expect_compiles(g, 1);
  }
}

// Rows of a known length: a warp per row when rows are short and many (layer_norm over 768),
// the block otherwise (softmax over 4096); the elements several stages read are held in
// registers; groups of 16 bytes where the accesses step by one. Odd lengths stay correct
// with scalar groups.
TEST(CudaCodegen, RowReductionsReadTheirRowOnce) {
  {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::BFloat16, {1024, 768}));
    ir::Node* r = g.placeholder("r", cuda_meta(DType::BFloat16, {1024, 768}));
    ir::Node* w = g.placeholder("w", cuda_meta(DType::BFloat16, {768}));
    ir::Node* b = g.placeholder("b", cuda_meta(DType::BFloat16, {768}));
    g.outputs().push_back(g.must_add("layer_norm", {g.must_add("add", {x, r}), w, b},
                                     attrs({{"normalized_shape", std::vector<int64_t>{768}}})));
    const std::string src = cuda_source_of(g);
    if (getenv("SHOW_SRC")) std::cout << src.substr(src.find("kiln_idx;"));
    EXPECT_NE(src.find("kiln_warp_reduce"), std::string::npos) << src;
    // x + r is computed once, held in registers for the variance and the output (and x - mean
    // after it): each input row is loaded once.
    EXPECT_NE(src.find("kiln_rv0["), std::string::npos) << src;
    for (const char* load : {"(in0 + ", "(in1 + "}) {
      const size_t first = src.find(load);
      EXPECT_NE(first, std::string::npos) << src;
      EXPECT_EQ(src.find(load, first + 1), std::string::npos) << load << " loaded twice\n" << src;
    }
    EXPECT_NE(src.find("kiln_vec<kiln_bf16, 8>"), std::string::npos) << src;
    // The weight and bias, read only once mean and variance are known, are loaded with the
    // row, before the first reduction: their latency hides behind the row's.
    for (const char* load : {"(in2 + ", "(in3 + "}) {
      const size_t first = src.find(load);
      EXPECT_LT(first, src.find("= kiln_warp_reduce(")) << load << " loaded after a reduction\n" << src;
      EXPECT_EQ(src.find(load, first + 1), std::string::npos) << load << " loaded twice\n" << src;
    }
  }
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 4096}, {300, 999}, {2, 1 << 14}, {4096, 96}}) {
    for (DType t : {DType::Float32, DType::BFloat16, DType::Float16}) {
      ir::Graph g;
      ir::Node* x = g.placeholder("x", cuda_meta(t, {rows, cols}));
      g.outputs().push_back(g.must_add("softmax", {x}, attrs({{"dim", int64_t(-1)}})));
      ir::Node* y = g.placeholder("y", cuda_meta(t, {rows, cols}));
      g.outputs().push_back(g.must_add("sum", {y}, attrs({{"dim", std::vector<int64_t>{1}}})));
      expect_compiles(g, 1);  // the same rows: one kernel
    }
  }
}

// max-autotune's launch candidates: every one a kernel offers compiles (the block sizes, a row
// per warp or per block, vectors on and off), launches within the GPU's limits, and a choice
// read back from the disk cache is the one written.
TEST(CudaCodegen, EveryLaunchCandidateCompiles) {
  use_wheel_nvrtc();
  std::string why;
  if (!compile::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  auto check = [](ir::Graph& g, size_t at_least) {
    pipeline::run_graph_passes(g);
    loop::Program p;
    std::string err;
    ASSERT_TRUE(lower::lower_graph(g, p, err)) << err;
    schedule::schedule(p);
    ASSERT_EQ(p.kernels.size(), 1u) << p.str();
    std::vector<codegen::LaunchChoice> cands = codegen::launch_candidates(p, p.kernels[0]);
    ASSERT_GE(cands.size(), at_least);
    EXPECT_EQ(cands[0], codegen::LaunchChoice{});  // the heuristics' launch comes first
    const std::string header = codegen::generate_cuda(p).header;
    for (const codegen::LaunchChoice& c : cands) {
      codegen::CudaLaunch l;
      const std::string text = codegen::generate_cuda_kernel(p, p.kernels[0], c, l);
      EXPECT_TRUE(l.block >= 32 && l.block <= 1024 && l.block % 32 == 0) << c.str();
      EXPECT_GE(l.grid, 1u);
      compile::NvrtcResult r = compile::nvrtc_compile(header + text, "sm_90", "test");
      ASSERT_TRUE(r.ok) << c.str() << "\n" << r.log << "\n" << text;
      codegen::LaunchChoice back;
      ASSERT_TRUE(codegen::LaunchChoice::parse(c.str(), back)) << c.str();
      EXPECT_EQ(back, c);
    }
  };
  for (DType t : {DType::Float32, DType::BFloat16}) {
    ir::Graph g;  // softmax rows
    g.outputs().push_back(g.must_add("softmax", {g.placeholder("x", cuda_meta(t, {512, 1000}))}, attrs({{"dim", int64_t(-1)}})));
    check(g, 6);
    ir::Graph ln;  // layer_norm: short rows, many
    ir::Node* x = ln.placeholder("x", cuda_meta(t, {1024, 768}));
    ir::Node* w = ln.placeholder("w", cuda_meta(t, {768}));
    ln.outputs().push_back(ln.must_add("layer_norm", {x, w, w}, attrs({{"normalized_shape", std::vector<int64_t>{768}}})));
    check(ln, 6);
    ir::Graph pw;  // pointwise: block sizes, vectors on and off
    ir::Node* a = pw.placeholder("a", cuda_meta(t, {256, 1024}));
    pw.outputs().push_back(pw.must_add("gelu", {pw.must_add("add", {a, pw.placeholder("b", cuda_meta(t, {1024}))})}));
    check(pw, 8);
  }
  ir::Graph small;  // launch-bound: nothing to choose
  small.outputs().push_back(small.must_add("exp", {small.placeholder("x", cuda_meta(DType::Float32, {100}))}));
  check(small, 1);
  codegen::LaunchChoice junk;
  for (const char* bad : {"", "block=48 warp_rows=0 vectorize=1", "block=2048 warp_rows=0 vectorize=1",
                          "block=256 warp_rows=3 vectorize=1", "blocks=256"})
    EXPECT_FALSE(codegen::LaunchChoice::parse(bad, junk)) << bad;
}

namespace {
size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

// Softmax's exponentials stay in registers between the sum and the division, and the division
// overwrites them in place: the row goes through memory once each way (one vector store). In
// bfloat16 the float32 exponentials are recomputed by the division instead, with the same one
// store. The kernels' results are checked against eager by the GPU tests.
TEST(CudaCodegen, RowStagesHoldWhatLaterStagesReadBack) {
  for (DType t : {DType::Float32, DType::BFloat16}) {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(t, {64, 4096}));
    g.outputs().push_back(g.must_add("softmax", {x}, attrs({{"dim", int64_t(-1)}})));
    const std::string src = cuda_source_of(g);
    if (t == DType::Float32) EXPECT_NE(src.find("kiln_rs0["), std::string::npos) << src;
    EXPECT_EQ(count_of(src, "kiln_vstore<"), 1u) << src;
  }
}

// Compile time follows code size: a kernel whose grid covers its points runs the body once per
// thread with no loop, and the scalar loop behind a vector loop (misaligned views) is not
// unrolled.
TEST(CudaCodegen, PointwiseBodiesAreEmittedOnceWhereTheyCan) {
  {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {1}));
    g.outputs().push_back(g.must_add("add", {g.must_add("sin", {x}), g.must_add("cos", {x})}));
    const std::string src = cuda_source_of(g);
    const std::string body = src.substr(src.find("__global__"));
    EXPECT_EQ(body.find("for ("), std::string::npos) << body;
    EXPECT_EQ(body.find("#pragma unroll"), std::string::npos) << body;
    expect_compiles(g, 1);
  }
  {  // buffers known aligned (schedule/alignment.cpp): the vector loop alone, no pointer test
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {1 << 24}));
    g.outputs().push_back(g.must_add("tanh", {x}));
    const std::string src = cuda_source_of(g);
    const std::string body = src.substr(src.find("__global__"));
    EXPECT_NE(body.find("kiln_vec<float, 4>"), std::string::npos) << body;
    EXPECT_EQ(body.find("% sizeof"), std::string::npos) << body;
    EXPECT_EQ(body.find("kiln_lin "), std::string::npos) << body;
    EXPECT_EQ(body.find("#pragma unroll 4"), std::string::npos) << body;
  }
  {  // an input at an offset may be misaligned: tested, with a scalar loop behind, not unrolled
    ir::Graph g;
    ir::TensorMeta m = cuda_meta(DType::Float32, {1 << 24});
    m.offset = 4;
    ir::Node* x = g.placeholder("x", m);
    g.outputs().push_back(g.must_add("tanh", {x}));
    const std::string src = cuda_source_of(g);
    const std::string body = src.substr(src.find("__global__"));
    EXPECT_NE(body.find("% sizeof"), std::string::npos) << body;
    EXPECT_NE(body.find("#pragma unroll 1\n"), std::string::npos) << body;
    EXPECT_EQ(body.find("#pragma unroll 4"), std::string::npos) << body;
    expect_compiles(g, 1);
  }
}

// Reductions over outer dims of a contiguous kept dim (a bias's gradient, a channels-last batch
// norm's statistics, its variance after its mean) give a warp's lanes neighbouring outputs, so
// each load is coalesced; reductions along the contiguous dim keep a row per warp or block.
TEST(CudaCodegen, ColumnReductionsGiveLanesNeighbouringOutputs) {
  for (DType t : {DType::Float32, DType::BFloat16}) {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(t, {1024, 768}));
    g.outputs().push_back(g.must_add("sum", {x}, attrs({{"dim", std::vector<int64_t>{0}}})));
    const std::string src = cuda_source_of(g);
    EXPECT_NE(src.find("kiln_col"), std::string::npos) << src;
    expect_compiles(g, 1);
  }
  {
    ir::Graph g;
    ir::TensorMeta m = cuda_meta(DType::Float32, {16, 64, 28, 28});
    m.strides = {64 * 28 * 28, 1, 28 * 64, 64};  // channels-last
    ir::Node* x = g.placeholder("x", m);
    const std::vector<int64_t> dims{0, 2, 3};
    ir::Node* mean = g.must_add("mean", {x}, attrs({{"dim", dims}, {"keepdim", true}}));
    ir::Node* c = g.must_add("sub", {x, mean});
    g.outputs().push_back(g.must_add("mean", {g.must_add("mul", {c, c})}, attrs({{"dim", dims}})));
    const std::string src = cuda_source_of(g);
    EXPECT_NE(src.find("kiln_col"), std::string::npos) << src;
    expect_compiles(g, 1);  // both reductions, one after the other, in one kernel
  }
  {  // a layer norm's weight gradient: sum over rows of grad * (x - mean[row]) * rstd[row]
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {1024, 768}));
    ir::Node* grad = g.placeholder("grad", cuda_meta(DType::Float32, {1024, 768}));
    ir::Node* mean = g.placeholder("mean", cuda_meta(DType::Float32, {1024, 1}));
    ir::Node* rstd = g.placeholder("rstd", cuda_meta(DType::Float32, {1024, 1}));
    ir::Node* xhat = g.must_add("mul", {g.must_add("sub", {x, mean}), rstd});
    g.outputs().push_back(g.must_add("sum", {g.must_add("mul", {grad, xhat})}, attrs({{"dim", std::vector<int64_t>{0}}})));
    g.outputs().push_back(g.must_add("sum", {grad}, attrs({{"dim", std::vector<int64_t>{0}}})));
    const std::string src = cuda_source_of(g);
    EXPECT_NE(src.find("kiln_col"), std::string::npos) << src;
    expect_compiles(g, 1);
  }
  ir::Graph g;
  ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {1024, 768}));
  g.outputs().push_back(g.must_add("sum", {x}, attrs({{"dim", std::vector<int64_t>{1}}})));
  EXPECT_EQ(cuda_source_of(g).find("kiln_col"), std::string::npos);
}

// A reduction of many points into few outputs (a training batch norm's statistics over N·H·W
// of a large activation) would run on a few blocks: it is split into partial results over many
// blocks and a kernel combining them, for each of a variance's two reductions (the variance's
// partials read the mean's total), with the statistics stored by the last kernel.
TEST(CudaCodegen, LargeReductionsIntoFewOutputsAreSplitOverManyBlocks) {
  for (bool channels_last : {true, false}) {
    ir::Graph g;
    ir::TensorMeta m = cuda_meta(DType::Float32, {16, 64, 112, 112});
    if (channels_last) m.strides = {64 * 112 * 112, 1, 112 * 64, 64};
    ir::Node* x = g.placeholder("x", m);
    const std::vector<int64_t> dims{0, 2, 3};
    ir::Node* mean = g.must_add("mean", {x}, attrs({{"dim", dims}, {"keepdim", true}}));
    ir::Node* c = g.must_add("sub", {x, mean});
    g.outputs().push_back(mean);
    g.outputs().push_back(g.must_add("mean", {g.must_add("mul", {c, c})}, attrs({{"dim", dims}})));
    loop::Program p = scheduled(g);
    ASSERT_EQ(p.kernels.size(), 4u) << p.str();  // mean's partials, its total, the variance's partials, both totals
    codegen::CudaSource src = codegen::generate_cuda(p);
    for (size_t i : {0, 2}) EXPECT_GE(src.launches[i].grid, 256u) << src.kernels[i];
    if (channels_last) EXPECT_NE(src.kernels[0].find("kiln_col"), std::string::npos) << src.kernels[0];
    if (getenv("SHOW_SRC")) std::cout << src.source.substr(src.source.find("kiln_idx;"));
    ir::Graph g2;
    ir::Node* x2 = g2.placeholder("x", m);
    ir::Node* mean2 = g2.must_add("mean", {x2}, attrs({{"dim", dims}, {"keepdim", true}}));
    ir::Node* c2 = g2.must_add("sub", {x2, mean2});
    g2.outputs().push_back(mean2);
    g2.outputs().push_back(g2.must_add("mean", {g2.must_add("mul", {c2, c2})}, attrs({{"dim", dims}})));
    expect_compiles(g2, 4);
  }
  {  // a whole tensor's sum: one output, many partials
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::BFloat16, {4096, 4096}));
    g.outputs().push_back(g.must_add("sum", {x}));
    loop::Program p = scheduled(g);
    ASSERT_EQ(p.kernels.size(), 2u) << p.str();
    EXPECT_GE(codegen::generate_cuda(p).launches[0].grid, 256u);
  }
  {  // enough outputs to fill the GPU already: not split
    ir::Graph g;
    ir::Node* x = g.placeholder("x", cuda_meta(DType::Float32, {4096, 4096}));
    g.outputs().push_back(g.must_add("sum", {x}, attrs({{"dim", std::vector<int64_t>{1}}})));
    EXPECT_EQ(scheduled(g).kernels.size(), 1u);
  }
}

// An optimizer-style update of parameters of several sizes, with a learning rate read per call
// (a scalar input): each update is stored into its parameter (write_updates_in_place), and the
// kernels become one foreach launch over a table, which must compile. The two parameters of 77
// elements are fused into one kernel: a second variant of the group's body.
TEST(CudaCodegen, ForeachUpdatesOfParametersCompileAsOneGroup) {
  use_wheel_nvrtc();
  std::string why;
  if (!compile::nvrtc_available(&why)) GTEST_SKIP() << "no NVRTC: " << why;
  ir::Graph g;
  ir::Attrs lr_attrs;
  lr_attrs.set("index", int64_t(0));
  lr_attrs.set("dtype", DType::Float64);
  ir::Node* lr = g.must_add("scalar_input", {}, lr_attrs);
  g.scalar_inputs = 1;
  std::vector<ir::Node*> params, grads;
  for (int64_t n : {300, 77, 77, 4096}) {
    params.push_back(g.placeholder("p" + std::to_string(params.size()), cuda_meta(DType::Float32, {n})));
    grads.push_back(g.placeholder("g" + std::to_string(grads.size()), cuda_meta(DType::Float32, {n})));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    ir::Node* step = g.must_add("mul", {grads[i], g.must_add("neg", {lr})});
    g.outputs().push_back(g.must_add("add", {params[i], step}));
    g.input_updates.emplace_back(static_cast<int>(2 * i), static_cast<int>(i));  // p_i is input 2i
  }
  pipeline::run_graph_passes(g);
  loop::Program p;
  std::string err;
  ASSERT_TRUE(lower::lower_graph(g, p, err)) << err;
  schedule::schedule(p);
  ASSERT_EQ(p.kernels.size(), 3u) << p.str();
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(p.outputs[i].view.buffer, p.inputs[2 * i]) << p.str();
  ASSERT_EQ(p.foreach_groups.size(), 1u) << p.str();
  const loop::ForeachGroup& fg = p.foreach_groups[0];
  EXPECT_EQ(fg.kernels.size(), 3u);
  EXPECT_EQ(fg.points, (std::vector<int64_t>{300, 77, 4096}));
  EXPECT_EQ(fg.variant, (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(fg.buffers[1].size(), 4u);  // two parameters and their gradients
  codegen::CudaSource src = codegen::generate_cuda(p);
  ASSERT_EQ(src.foreach_kernels.size(), 1u);
  EXPECT_EQ(src.foreach_launches[0].grid, 2u + 1u + 16u);
  compile::NvrtcResult r = compile::nvrtc_compile(src.header + src.foreach_kernels[0], "sm_90", "test");
  ASSERT_TRUE(r.ok) << r.log << "\n" << src.foreach_kernels[0];
}

// A model's repeated layers compile once: the layer norms of a model's second and third layers
// read other buffers (with vector loads, whose alignment flags codegen names after the buffers)
// and are one NVRTC unit.
TEST(CudaCodegen, RepeatedLayersShareOneUnit) {
  ir::Graph g;
  ir::Node* h = g.placeholder("x", cuda_meta(DType::Float32, {1024, 768}));
  std::vector<std::array<ir::Node*, 3>> layers;
  for (int i = 0; i < 3; ++i)
    layers.push_back({g.placeholder("m" + std::to_string(i), cuda_meta(DType::Float32, {768, 768})),
                      g.placeholder("w" + std::to_string(i), cuda_meta(DType::Float32, {768})),
                      g.placeholder("b" + std::to_string(i), cuda_meta(DType::Float32, {768}))});
  for (auto [m, w, b] : layers)
    h = g.must_add("layer_norm", {g.must_add("add", {g.must_add("mm", {h, m}), h}), w, b},
                   attrs({{"normalized_shape", std::vector<int64_t>{768}}}));
  g.outputs().push_back(h);
  const loop::Program p = scheduled(g);
  const codegen::CudaSource cs = codegen::generate_cuda(p);
  ASSERT_EQ(p.kernels.size(), 3u) << p.str();
  EXPECT_NE(cs.kernels[1].find("kiln_vec<float, 4>"), std::string::npos) << cs.kernels[1];
  if (getenv("SHOW_SRC")) std::cout << cs.kernels[1];
  EXPECT_EQ(pipeline::canonical_unit(cs.header, cs.kernels[1], p, p.kernels[1]),
            pipeline::canonical_unit(cs.header, cs.kernels[2], p, p.kernels[2]));
}
