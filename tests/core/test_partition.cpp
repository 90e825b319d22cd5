// The min-cut partitioner on joint graphs: what it saves for the backward and what it
// recomputes there.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/autodiff/joint_graph.h"
#include "core/autodiff/partition.h"
#include "graph_helpers.h"

using namespace kiln;

namespace {

// On the CPU as torch's CPU tensors are (no device index).
ir::TensorMeta f32(std::vector<int64_t> sizes) {
  ir::TensorMeta m = test::meta(std::move(sizes), DType::Float32, DeviceType::CPU);
  m.device = Device{};
  return m;
}

std::vector<std::string> names(const std::vector<const ir::Node*>& ns) {
  std::vector<std::string> out;
  for (const ir::Node* n : ns) out.push_back(n->name);
  return out;
}

autodiff::Partition partition(ir::Graph& g, const std::vector<ir::Node*>& wrt) {
  autodiff::JointGraph jg;
  std::string why;
  EXPECT_TRUE(autodiff::build_joint(g, wrt, jg, why)) << why;
  return autodiff::partition_joint(g, jg);
}

}  // namespace

// A chain of pointwise ops: its input is the one value saved; the backward recomputes the
// chain (fused into its kernels) instead of keeping each intermediate.
TEST(Partition, PointwiseChainsAreRecomputedFromTheirInput) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", f32({1024}));
  ir::Node* a = g.must_add("tanh", {x});
  ir::Node* b = g.must_add("sigmoid", {a});
  ir::Node* c = g.must_add("exp", {b});
  g.outputs().push_back(c);
  autodiff::Partition p = partition(g, {x});
  EXPECT_EQ(names(p.saved), std::vector<std::string>{"x"});
  EXPECT_TRUE(p.recomputed.count(a) && p.recomputed.count(b));
  EXPECT_EQ(p.saved_bytes, 1024 * 4);
}

// A matrix product is never recomputed: its inputs are saved for its own gradients, and the
// pointwise op after it is recomputed from its saved result or saved itself, whichever costs
// less (the same here).
TEST(Partition, MatrixProductsAreSavedNotRecomputed) {
  ir::Graph g;
  ir::Node* a = g.placeholder("a", f32({64, 32}));
  ir::Node* w = g.placeholder("w", f32({32, 16}));
  ir::Node* mm = g.must_add("mm", {a, w});
  ir::Node* y = g.must_add("tanh", {mm});
  g.outputs().push_back(y);
  autodiff::Partition p = partition(g, {a, w});
  std::vector<std::string> saved = names(p.saved);
  EXPECT_TRUE(std::count(saved.begin(), saved.end(), "a") && std::count(saved.begin(), saved.end(), "w"));
  EXPECT_EQ(p.recomputed.count(mm), 0u);
  EXPECT_EQ(saved.size(), 3u);  // a, w and one of mm / tanh
  EXPECT_EQ(p.saved_bytes, (64 * 32 + 32 * 16 + 64 * 16) * 4);
}

// A small value computed from a large one is saved instead of the large one: exp of a row sum
// keeps the sums (64 floats), not the 64 x 4096 input.
TEST(Partition, SmallResultsAreSavedInsteadOfLargeInputs) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", f32({64, 4096}));
  ir::Attrs rows;
  rows.set("dim", std::vector<int64_t>{1});
  ir::Node* s = g.must_add("sum", {x}, rows);
  ir::Node* e = g.must_add("exp", {s});
  g.outputs().push_back(e);
  autodiff::Partition p = partition(g, {x});
  ASSERT_EQ(p.saved.size(), 1u);
  EXPECT_NE(p.saved[0], x);
  EXPECT_EQ(p.saved_bytes, 64 * 4);
}

// A reduction to a small result (a norm's row statistics) is saved, not recomputed: the
// backward would read its whole input again, and chained norms (each layer's reads the last
// one's output) would rebuild every layer's statistics in one serial backward kernel.
TEST(Partition, RowStatisticsAreSavedNotRecomputed) {
  ir::Graph g;
  ir::Node* x = g.placeholder("x", f32({64, 4096}));
  ir::Attrs rows;
  rows.set("dim", std::vector<int64_t>{1});
  rows.set("keepdim", true);
  ir::Node* s = g.must_add("sum", {x}, rows);
  ir::Node* y = g.must_add("mul", {x, s});
  ir::Node* z = g.must_add("tanh", {y});
  g.outputs().push_back(z);
  autodiff::Partition p = partition(g, {x});
  EXPECT_EQ(p.recomputed.count(s), 0u);
  std::vector<std::string> saved = names(p.saved);
  EXPECT_TRUE(std::count(saved.begin(), saved.end(), s->name)) << saved.size();
}

// Between cuts of equal bytes, the one nearer the backward: a value the backward reads is
// saved itself, not rebuilt through a chain of ops from a product far back in the forward.
TEST(Partition, EqualCutsPreferTheValueNearTheBackward) {
  ir::Graph g;
  ir::Node* a = g.placeholder("a", f32({64, 32}));
  ir::Node* w = g.placeholder("w", f32({32, 64}));
  ir::Node* v = g.must_add("mm", {a, w});
  for (int i = 0; i < 6; ++i) v = g.must_add("neg", {v});
  ir::Node* e = g.must_add("exp", {v});
  g.outputs().push_back(e);
  autodiff::Partition p = partition(g, {a, w});
  std::vector<std::string> saved = names(p.saved);
  EXPECT_TRUE(std::count(saved.begin(), saved.end(), e->name)) << saved.size();
  EXPECT_EQ(saved.size(), 3u);  // a, w, and exp's result
}
