// passes::gemm_epilogues: a linear layer's activation moves into cuBLASLt's epilogue
// (_addmm_activation) on CUDA where torch's epilogue computes the same function; everywhere
// else the graph is left as it is. With max-autotune's timings the faster variant is kept and
// the decision is read back from the disk cache.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/ops/registry.h"
#include "core/passes/passes.h"
#include "graph_helpers.h"

using namespace kiln;
using test::A;
using test::meta;

namespace {

// The ops of `g` after decomposition and the pass, placeholders left out.
std::vector<std::string> after_pass(ir::Graph& g, passes::ExternTiming* timing = nullptr) {
  passes::decompose(g);
  passes::gemm_epilogues(g, timing);
  std::vector<std::string> out;
  for (auto& n : g.nodes())
    if (n->op->kind != ops::OpKind::Source) out.push_back(n->op_name());
  return out;
}

bool has(const std::vector<std::string>& ops, const std::string& op) {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

// linear(x, w, b) followed by `act` ("relu", "gelu" with `approximate`).
ir::Node* linear_act(ir::Graph& g, std::vector<int64_t> x_sizes, DType t, DeviceType dev, const std::string& act,
                     const std::string& approximate = "none") {
  ir::Node* x = g.placeholder("x", meta(x_sizes, t, dev));
  ir::Node* w = g.placeholder("w", meta({256, x_sizes.back()}, t, dev));
  ir::Node* b = g.placeholder("b", meta({256}, t, dev));
  ir::Node* y = g.must_add("linear", {x, w, b});
  if (act == "relu") return g.must_add("relu", {y});
  return g.must_add("gelu", {y}, A({{"approximate", approximate}}));
}

}  // namespace

TEST(GemmEpilogues, ReluAndTanhGeluMoveIntoTheEpilogue) {
  for (DType t : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (std::vector<int64_t> xs : {std::vector<int64_t>{64, 128}, {4, 16, 128}}) {
      ir::Graph g;
      ir::Node* r = linear_act(g, xs, t, DeviceType::CUDA, "relu");
      g.outputs().push_back(r);
      const std::vector<sym::Expr> sizes = r->meta.sizes;  // r itself is gone after the pass
      const auto ops = after_pass(g);
      EXPECT_TRUE(has(ops, "addmm_activation")) << g.str();
      EXPECT_FALSE(has(ops, "relu") || has(ops, "addmm")) << g.str();
      EXPECT_EQ(g.outputs()[0]->meta.sizes, sizes);
      EXPECT_EQ(g.outputs()[0]->meta.dtype, t);
    }
    ir::Graph g;
    g.outputs().push_back(linear_act(g, {64, 128}, t, DeviceType::CUDA, "gelu", "tanh"));
    const auto ops = after_pass(g);
    EXPECT_TRUE(has(ops, "addmm_activation") && !has(ops, "gelu")) << g.str();
    for (auto& n : g.nodes())
      if (n->op_name() == "addmm_activation") EXPECT_TRUE(n->attrs.get_bool("use_gelu"));
  }
}

TEST(GemmEpilogues, WhatTheEpilogueDoesNotComputeStaysAsItIs) {
  {  // the exact GELU is not cuBLASLt's
    ir::Graph g;
    g.outputs().push_back(linear_act(g, {64, 128}, DType::Float32, DeviceType::CUDA, "gelu"));
    EXPECT_FALSE(has(after_pass(g), "addmm_activation")) << g.str();
  }
  {  // the CPU: no cuBLASLt
    ir::Graph g;
    g.outputs().push_back(linear_act(g, {64, 128}, DType::Float32, DeviceType::CPU, "relu"));
    EXPECT_FALSE(has(after_pass(g), "addmm_activation")) << g.str();
  }
  {  // the GEMM's result is used besides the activation (also an output)
    ir::Graph g;
    ir::Node* r = linear_act(g, {64, 128}, DType::Float32, DeviceType::CUDA, "relu");
    g.outputs().push_back(r);
    g.outputs().push_back(r->inputs[0]);
    const auto ops = after_pass(g);
    EXPECT_TRUE(has(ops, "relu") && !has(ops, "addmm_activation")) << g.str();
  }
  {  // a 2-D bias is not the epilogue's vector
    ir::Graph g;
    ir::Node* c = g.placeholder("c", meta({64, 256}, DType::Float32));
    ir::Node* a = g.placeholder("a", meta({64, 128}, DType::Float32));
    ir::Node* b = g.placeholder("b", meta({128, 256}, DType::Float32));
    g.outputs().push_back(g.must_add("relu", {g.must_add("addmm", {c, a, b})}));
    EXPECT_FALSE(has(after_pass(g), "addmm_activation")) << g.str();
  }
  {  // integer GEMMs have no cuBLAS kernel at all; a promoted activation result is not addmm's dtype
    ir::Graph g;
    ir::Node* c = g.placeholder("c", meta({256}, DType::BFloat16));
    ir::Node* a = g.placeholder("a", meta({64, 128}, DType::BFloat16));
    ir::Node* b = g.placeholder("b", meta({128, 256}, DType::BFloat16));
    ir::Node* mm = g.must_add("addmm", {c, a, b}, A({{"beta", 2.0}}));
    g.outputs().push_back(g.must_add("relu", {mm}));
    EXPECT_FALSE(has(after_pass(g), "addmm_activation")) << "beta != 1: " << g.str();
  }
}

// Without timings: a float32 linear layer whose result only feeds pointwise ops runs as mm with
// the bias added by the next kernel; 16-bit ones, and results read otherwise, keep addmm.
TEST(GemmEpilogues, Float32LinearFeedingPointwiseOpsRunsAsMm) {
  {
    ir::Graph g;
    g.outputs().push_back(linear_act(g, {8, 128}, DType::Float32, DeviceType::CUDA, "gelu"));
    const auto ops = after_pass(g);
    EXPECT_TRUE(has(ops, "mm") && has(ops, "add") && !has(ops, "addmm")) << g.str();
    EXPECT_EQ(g.outputs()[0]->meta.dtype, DType::Float32);
  }
  for (DType t : {DType::BFloat16, DType::Float16}) {
    ir::Graph g;
    g.outputs().push_back(linear_act(g, {8, 128}, t, DeviceType::CUDA, "gelu"));
    const auto ops = after_pass(g);
    EXPECT_TRUE(has(ops, "addmm") && !has(ops, "mm")) << g.str();
  }
  {  // read by a non-pointwise op (a reduction): the bias stays in the GEMM
    ir::Graph g;
    ir::Node* x = g.placeholder("x", meta({8, 128}, DType::Float32, DeviceType::CUDA));
    ir::Node* w = g.placeholder("w", meta({256, 128}, DType::Float32, DeviceType::CUDA));
    ir::Node* b = g.placeholder("b", meta({256}, DType::Float32, DeviceType::CUDA));
    g.outputs().push_back(g.must_add("sum", {g.must_add("linear", {x, w, b})}, A({{"dim", std::vector<int64_t>{1}}})));
    const auto ops = after_pass(g);
    EXPECT_TRUE(has(ops, "addmm") && !has(ops, "mm")) << g.str();
  }
}

// With timings: the winner follows the measurements, and a second compile reads it from disk.
TEST(GemmEpilogues, TimedChoicesFollowTheMeasurementsAndAreCached) {
  const std::string dir = std::filesystem::temp_directory_path() / ("kiln-gemm-tune-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  setenv("KILN_CACHE_DIR", dir.c_str(), 1);
  auto timing_with = [](double act_ms, double addmm_ms, double mm_ms) {
    passes::ExternTiming t;
    t.device_key = "sm_test";
    t.time = [=](const ir::Node& n) {
      if (n.op_name() == "addmm_activation") return act_ms;
      return n.op_name() == "mm" ? mm_ms : addmm_ms;
    };
    return t;
  };
  {  // a slow epilogue kernel: relu stays a kernel of its own
    ir::Graph g;
    g.outputs().push_back(linear_act(g, {64, 128}, DType::Float32, DeviceType::CUDA, "relu"));
    passes::ExternTiming t = timing_with(2.0, 1.0, 1.0);
    const auto ops = after_pass(g, &t);
    EXPECT_TRUE(has(ops, "relu") && has(ops, "addmm") && !has(ops, "addmm_activation")) << g.str();
    EXPECT_EQ(t.timed, 1);
  }
  {  // the same decision again: from the disk cache, whatever the timer would say now
    ir::Graph g;
    g.outputs().push_back(linear_act(g, {64, 128}, DType::Float32, DeviceType::CUDA, "relu"));
    passes::ExternTiming t = timing_with(0.5, 1.0, 1.0);
    const auto ops = after_pass(g, &t);
    EXPECT_FALSE(has(ops, "addmm_activation")) << g.str();
    EXPECT_EQ(t.timed, 0);
    EXPECT_EQ(t.from_disk, 1);
  }
  {  // a faster plain GEMM: mm, the bias added with the pointwise op that follows
    ir::Graph g;
    g.outputs().push_back(linear_act(g, {64, 128}, DType::Float32, DeviceType::CUDA, "gelu"));
    passes::ExternTiming t = timing_with(1.0, 1.0, 0.5);
    const auto ops = after_pass(g, &t);
    EXPECT_TRUE(has(ops, "mm") && has(ops, "add") && !has(ops, "addmm")) << g.str();
    EXPECT_EQ(g.outputs()[0]->meta.sizes, (std::vector<sym::Expr>{64, 256}));
  }
  {  // and not when it is slower
    ir::Graph g;
    g.outputs().push_back(linear_act(g, {32, 128}, DType::Float32, DeviceType::CUDA, "gelu"));
    passes::ExternTiming t = timing_with(1.0, 1.0, 1.5);
    EXPECT_TRUE(has(after_pass(g, &t), "addmm")) << g.str();
  }
  std::filesystem::remove_all(dir);
  unsetenv("KILN_CACHE_DIR");
}

namespace {

// conv2d(x, W, b) on `dev`, its result read by relu (an output) and, with `also_output`, itself
// an output too.
void conv_bias_relu(ir::Graph& g, DeviceType dev, bool also_output = false) {
  ir::Node* x = g.placeholder("x", meta({2, 4, 8, 8}, DType::Float32, dev));
  ir::Node* w = g.placeholder("w", meta({6, 4, 3, 3}, DType::Float32, dev));
  ir::Node* b = g.placeholder("b", meta({6}, DType::Float32, dev));
  ir::Node* conv = g.must_add("conv2d", {x, w, b}, A({{"padding", std::vector<int64_t>{1, 1}}}));
  g.outputs().push_back(g.must_add("relu", {conv}));
  if (also_output) g.outputs().push_back(conv);
}

const ir::Node* the_conv(const ir::Graph& g) {
  for (auto& n : g.nodes())
    if (n->op_name() == "conv2d") return n.get();
  return nullptr;
}

}  // namespace

TEST(GemmEpilogues, ACudaConvolutionsBiasJoinsThePointwiseKernelAfterIt) {
  ir::Graph g;
  conv_bias_relu(g, DeviceType::CUDA);
  const auto ops = after_pass(g);
  const ir::Node* conv = the_conv(g);
  ASSERT_TRUE(conv) << g.str();
  ASSERT_EQ(conv->inputs.size(), 3u) << g.str();
  EXPECT_FALSE(conv->inputs[2]) << g.str();  // no bias: cuDNN's result, then one fused kernel
  EXPECT_TRUE(has(ops, "add") && has(ops, "relu")) << g.str();
  EXPECT_EQ(g.outputs()[0]->meta.sizes, conv->meta.sizes);
}

TEST(GemmEpilogues, AConvolutionKeepsItsBiasOnTheCpuOrWhereItsResultIsAnOutput) {
  for (bool cuda : {false, true}) {
    ir::Graph g;
    conv_bias_relu(g, cuda ? DeviceType::CUDA : DeviceType::CPU, /*also_output=*/cuda);
    after_pass(g);
    const ir::Node* conv = the_conv(g);
    ASSERT_TRUE(conv) << g.str();
    EXPECT_EQ(conv->inputs.size(), 3u) << g.str();
    EXPECT_TRUE(conv->inputs[2]) << g.str();
  }
}
