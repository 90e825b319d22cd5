// passes::channels_last_convolutions: convolutions on CUDA read and write channels-last copies
// that fuse into the kernels around them; everything else keeps its layout.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/ir/graph.h"
#include "core/lower/lower.h"
#include "core/ops/registry.h"
#include "core/passes/passes.h"
#include "core/pipeline/compile_graph.h"
#include "core/schedule/schedule.h"
#include "graph_helpers.h"

using namespace kiln;
using ir::Attrs;
using ir::Graph;
using ir::Node;
using test::A;
using test::meta;

namespace {

// conv -> relu -> conv -> (+ residual) -> output, over NCHW activations and weights.
Node* build(Graph& g, DType t, DeviceType dev, int64_t groups = 1) {
  Node* x = g.placeholder("x", meta({2, 8, 10, 10}, t, dev));
  Node* w1 = g.placeholder("w1", meta({8, 8 / groups, 3, 3}, t, dev));
  Node* w2 = g.placeholder("w2", meta({8, 8 / groups, 3, 3}, t, dev));
  Attrs conv = A({{"padding", std::vector<int64_t>{1, 1}}, {"groups", groups}});
  Node* c1 = g.must_add("conv2d", {x, w1, nullptr}, conv);
  Node* r = g.must_add("relu", {c1});
  Node* c2 = g.must_add("conv2d", {r, w2, nullptr}, conv);
  Node* out = g.must_add("add", {c2, r});
  g.outputs().push_back(out);
  return out;
}

int convs_reading_channels_last(const Graph& g) {
  int n = 0;
  for (auto& node : g.nodes())
    if (node->op_name() == "conv2d" && ops::suggests_channels_last(node->inputs[0]->meta) &&
        ops::suggests_channels_last(node->meta))
      ++n;
  return n;
}

}  // namespace

TEST(ChannelsLast, ConvolutionsOnCudaReadAndWriteChannelsLast) {
  for (DType t : {DType::Float32, DType::BFloat16, DType::Float16}) {
    Graph g;
    const Node* out = build(g, t, DeviceType::CUDA);
    const std::vector<sym::Expr> strides = out->meta.strides;
    passes::channels_last_convolutions(g);
    EXPECT_EQ(convs_reading_channels_last(g), 2) << g.str();
    // The result keeps eager's (row-major) layout.
    EXPECT_EQ(g.outputs()[0]->meta.strides, strides) << g.str();
    // The copies fuse: the kernel after the first convolution writes the second one's input
    // channels-last, and the last kernel reads the second one's result.
    pipeline::run_graph_passes(g);
    loop::Program p;
    std::string err;
    ASSERT_TRUE(lower::lower_graph(g, p, err)) << err;
    schedule::schedule(p);
    EXPECT_EQ(p.kernels.size(), 3u) << p.str();  // x's copy, relu (+ its copy), the residual add
  }
}

TEST(ChannelsLast, LeavesGroupedAndChannelsLastConvolutionsAlone) {
  {  // the CPU's convolutions go channels-last too (oneDNN prefers NHWC)
    Graph g;
    build(g, DType::Float32, DeviceType::CPU);
    passes::channels_last_convolutions(g);
    EXPECT_EQ(convs_reading_channels_last(g), 2) << g.str();
  }
  {
    Graph g;
    build(g, DType::Float32, DeviceType::CUDA, /*groups=*/8);
    passes::channels_last_convolutions(g);
    EXPECT_EQ(convs_reading_channels_last(g), 0) << g.str();
  }
  {
    Graph g;
    Node* x = g.placeholder("x", meta({2, 8, 10, 10}, DType::Float64, DeviceType::CUDA));
    Node* w = g.placeholder("w", meta({8, 8, 3, 3}, DType::Float64, DeviceType::CUDA));
    g.outputs().push_back(g.must_add("conv2d", {x, w, nullptr}, A({})));
    passes::channels_last_convolutions(g);
    EXPECT_EQ(convs_reading_channels_last(g), 0) << g.str();
  }
}

// A dynamic batch: the batch's size is a symbol; the pass still applies, once.
TEST(ChannelsLast, DynamicBatch) {
  Graph g;
  ir::TensorMeta xm = meta({2, 8, 10, 10}, DType::Float32, DeviceType::CUDA);
  xm.sizes[0] = sym::Expr::var("s0");
  xm.strides = ir::contiguous_strides(xm.sizes);
  Node* x = g.placeholder("x", xm);
  Node* w = g.placeholder("w", meta({8, 8, 3, 3}, DType::Float32, DeviceType::CUDA));
  g.outputs().push_back(g.must_add("relu", {g.must_add("conv2d", {x, w, nullptr}, A({}))}));
  passes::channels_last_convolutions(g);
  EXPECT_EQ(convs_reading_channels_last(g), 1) << g.str();
  int convs = 0;
  for (auto& n : g.nodes()) convs += n->op_name() == "conv2d";
  EXPECT_EQ(convs, 1) << g.str();
}

// A ResNet stem and block: conv -> batch norm -> relu -> max-pool -> conv -> + the pooled
// value -> relu. After the passes the batch norm, ReLU and max-pool compute in channels-last
// (the max-pool reads the convolution's channels-last result in its own order), the second
// convolution reads the pooled twin as it is, and only the result is made row-major again.
TEST(ChannelsLast, ActivationsBetweenConvolutionsStayChannelsLast) {
  Graph g;
  const DType t = DType::Float32;
  const DeviceType dev = DeviceType::CUDA;
  Node* x = g.placeholder("x", meta({2, 3, 16, 16}, t, dev));
  Node* w1 = g.placeholder("w1", meta({8, 3, 3, 3}, t, dev));
  Node* w2 = g.placeholder("w2", meta({8, 8, 3, 3}, t, dev));
  Node* mean = g.placeholder("mean", meta({8}, t, dev));
  Node* var = g.placeholder("var", meta({8}, t, dev));
  Attrs pad = A({{"padding", std::vector<int64_t>{1, 1}}});
  Node* c1 = g.must_add("conv2d", {x, w1, nullptr}, pad);
  Node* bn = g.must_add("batch_norm", {c1, mean, var, nullptr, nullptr}, A({}));
  Node* pooled = g.must_add("max_pool2d", {g.must_add("relu", {bn})},
                            A({{"kernel_size", std::vector<int64_t>{3, 3}}, {"stride", std::vector<int64_t>{2, 2}},
                               {"padding", std::vector<int64_t>{1, 1}}}));
  Node* c2 = g.must_add("conv2d", {pooled, w2, nullptr}, pad);
  Node* out = g.must_add("relu", {g.must_add("add", {c2, pooled})});
  g.outputs().push_back(out);
  const std::vector<sym::Expr> strides = out->meta.strides;
  pipeline::run_graph_passes(g);
  EXPECT_EQ(g.outputs()[0]->meta.strides, strides) << g.str();
  int pools = 0, copies_to_channels_last = 0;
  for (auto& n : g.nodes()) {
    if (n->op_name() == "max_pool2d") {
      ++pools;
      EXPECT_TRUE(ops::suggests_channels_last(n->meta)) << g.str();
    }
    copies_to_channels_last += n->op_name() == "channels_last";
  }
  EXPECT_EQ(pools, 1) << g.str();
  EXPECT_EQ(copies_to_channels_last, 1) << g.str();  // the graph input's, before the first convolution
  EXPECT_EQ(convs_reading_channels_last(g), 2) << g.str();
  loop::Program p;
  std::string err;
  ASSERT_TRUE(lower::lower_graph(g, p, err)) << err;
  schedule::schedule(p);
  EXPECT_EQ(p.kernels.size(), 3u) << p.str();  // x's copy, bn+relu+pool, add+relu
}
