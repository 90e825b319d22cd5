// passes::fold_batch_norm and passes::split_prologue: what a graph computes from its stable
// inputs (parameters, buffers) alone moves into a prologue graph; the main graph reads its
// results as inputs of its own.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/ir/graph.h"
#include "core/ops/registry.h"
#include "core/passes/passes.h"
#include "core/pipeline/compile_graph.h"
#include "graph_helpers.h"

using namespace kiln;
using ir::Graph;
using ir::Node;
using test::A;
using test::meta;

namespace {

int count(const Graph& g, const std::string& op) {
  int n = 0;
  for (auto& node : g.nodes()) n += node->op_name() == op;
  return n;
}

// x -> conv2d(W) -> batch_norm(mean, var, w, b) -> relu; W and the norm's tensors are inputs
// 1..5, stable where `stable` says.
void conv_bn(Graph& g, bool stable, DType t = DType::Float32, DeviceType dev = DeviceType::CPU) {
  Node* x = g.placeholder("x", meta({2, 4, 8, 8}, t, dev));
  Node* W = g.placeholder("W", meta({6, 4, 3, 3}, t, dev));
  std::vector<Node*> bn = {g.placeholder("mean", meta({6}, t, dev)),
                           g.placeholder("var", meta({6}, t, dev)),
                           g.placeholder("w", meta({6}, t, dev)),
                           g.placeholder("b", meta({6}, t, dev))};
  Node* conv = g.must_add("conv2d", {x, W, nullptr}, A({{"padding", std::vector<int64_t>{1, 1}}}));
  Node* y = g.must_add("batch_norm", {conv, bn[0], bn[1], bn[2], bn[3]}, A({{"training", false}, {"eps", 1e-5}}));
  g.outputs().push_back(g.must_add("relu", {y}));
  g.stable_inputs = {false, stable, stable, stable, stable, stable};
}

}  // namespace

TEST(FoldBatchNorm, EvalBatchNormOverStableInputsFoldsIntoTheConvolution) {
  Graph g;
  conv_bn(g, true);
  passes::fold_batch_norm(g);
  EXPECT_EQ(count(g, "batch_norm"), 0) << g.str();
  ASSERT_EQ(count(g, "conv2d"), 1);
  for (auto& n : g.nodes())
    if (n->op_name() == "conv2d") {
      EXPECT_EQ(n->inputs[1]->op_name(), "mul") << g.str();  // the weight, scaled per output channel
      ASSERT_TRUE(n->inputs[2]) << g.str();                    // and a bias made of the norm's
    }
}

TEST(FoldBatchNorm, NothingFoldsOverTheCallsTensorsOrIn16Bits) {
  Graph g;
  conv_bn(g, false);
  const std::string before = g.str();
  passes::fold_batch_norm(g);
  EXPECT_EQ(g.str(), before);
  Graph h;
  conv_bn(h, true, DType::BFloat16);
  passes::fold_batch_norm(h);
  EXPECT_EQ(count(h, "batch_norm"), 1) << h.str();
}

TEST(SplitPrologue, TheFoldedWeightAndBiasComeFromThePrologue) {
  Graph g;
  conv_bn(g, true, DType::Float32, DeviceType::CUDA);
  pipeline::run_graph_passes(g);
  std::vector<int> inputs;
  auto pg = passes::split_prologue(g, inputs);
  ASSERT_TRUE(pg) << g.str();
  // It reads W and the four norm tensors (inputs 1-5), never x.
  EXPECT_EQ(inputs, (std::vector<int>{1, 2, 3, 4, 5})) << pg->str();
  // Its results, the weight (laid out channels-last for the convolution) and the bias, are
  // the main graph's last two inputs; the main graph computes no rsqrt.
  ASSERT_EQ(pg->outputs().size(), 2u) << pg->str();
  ASSERT_EQ(g.inputs().size(), 8u) << g.str();
  EXPECT_EQ(count(g, "rsqrt"), 0) << g.str();
  EXPECT_EQ(count(*pg, "rsqrt"), 1) << pg->str();
  ASSERT_EQ(count(g, "conv2d"), 1) << g.str();
  for (auto& n : g.nodes())
    if (n->op_name() == "conv2d") {
      EXPECT_TRUE(n->inputs[1] == g.inputs()[6] || n->inputs[1] == g.inputs()[7]) << g.str();
      EXPECT_TRUE(ops::suggests_channels_last(n->inputs[1]->meta)) << g.str();
    }
}

TEST(SplitPrologue, OutputsAndViewsStayInTheMainGraph) {
  Graph g;
  Node* x = g.placeholder("x", meta({4, 4}, DType::Float32, DeviceType::CPU));
  Node* w = g.placeholder("w", meta({4, 4}, DType::Float32, DeviceType::CPU));
  g.stable_inputs = {false, true};
  Node* two = g.scalar(2.0, DType::Float64);
  Node* doubled = g.must_add("mul", {w, two});             // read by the output below: crosses
  Node* handed = g.must_add("add", {doubled, two});        // an output: computed per call
  Node* t = g.must_add("permute", {w}, A({{"dims", std::vector<int64_t>{1, 0}}}));  // a view of w, read per call
  Node* y = g.must_add("add", {g.must_add("mul", {x, g.must_add("sum", {doubled}, A({{"dim", std::vector<int64_t>{0}}}))}), t});
  g.outputs() = {y, handed};
  std::vector<int> inputs;
  auto pg = passes::split_prologue(g, inputs);
  ASSERT_TRUE(pg);
  EXPECT_EQ(inputs, (std::vector<int>{1}));
  // sum(doubled) crosses (it is what the main graph reads of w's arithmetic), and doubled too
  // (the output reads it); the permute of w is not a prologue result.
  for (ir::Node* o : pg->outputs()) EXPECT_NE(o->op_name(), "permute") << pg->str();
  EXPECT_EQ(g.outputs()[1]->op_name(), "add") << g.str();
  EXPECT_NE(g.outputs()[1], g.inputs().back()) << g.str();
  EXPECT_EQ(count(g, "permute"), 1) << g.str();
}

TEST(SplitPrologue, NoStableInputsNoPrologue) {
  Graph g;
  conv_bn(g, false);
  g.stable_inputs.clear();
  pipeline::run_graph_passes(g);
  std::vector<int> inputs;
  EXPECT_FALSE(passes::split_prologue(g, inputs));
  EXPECT_EQ(g.inputs().size(), 6u);
}

TEST(PrepackConvolutions, CpuFloat32ConvolutionsOverStableWeightsArePrepacked) {
  Graph g;
  conv_bn(g, true);
  pipeline::run_graph_passes(g);
  EXPECT_EQ(count(g, "conv2d_prepacked"), 1) << g.str();
  EXPECT_EQ(count(g, "conv2d"), 0) << g.str();
  Graph h;  // the call's own weight: aten::conv2d
  conv_bn(h, false);
  pipeline::run_graph_passes(h);
  EXPECT_EQ(count(h, "conv2d_prepacked"), 0) << h.str();
}
