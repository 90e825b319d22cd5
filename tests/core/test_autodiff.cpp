// Reverse mode from the registry's derivatives (autodiff::build_joint): each op's gradient,
// compiled and run by the CPU pipeline like any graph, against central finite differences of
// the forward in float64, for a random tangent. Broadcast inputs, dtype conversions, views,
// reductions and a small network; an op with no derivative is named.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "core/autodiff/backward_stages.h"
#include "core/autodiff/joint_graph.h"
#include "core/autodiff/partition.h"
#include "core/ops/registry.h"
#include "core/passes/passes.h"
#include "core/pipeline/compile_graph.h"
#include "graph_helpers.h"

using namespace kiln;

namespace {

// On the CPU as torch's CPU tensors are (no device index).
ir::TensorMeta f64(std::vector<int64_t> sizes) {
  ir::TensorMeta m = test::meta(std::move(sizes), DType::Float64, DeviceType::CPU);
  m.device = Device{};
  return m;
}

int64_t numel(const std::vector<sym::Expr>& sizes) {
  int64_t n = 1;
  for (const auto& s : sizes) n *= *s.as_const();
  return n;
}

// Builds a forward graph over the given inputs; returns its outputs.
using Builder = std::function<std::vector<ir::Node*>(ir::Graph& g, const std::vector<ir::Node*>& x)>;

// Compiles `g` for the CPU and runs it on `inputs`, one vector per graph input; returns each
// output's elements in row-major order.
std::vector<std::vector<double>> run(ir::Graph& g, const std::vector<std::vector<double>>& inputs) {
  pipeline::CompiledGraph cg;
  std::string err;
  EXPECT_TRUE(pipeline::compile_graph(g, {}, cg, err)) << err;
  const loop::Program& p = cg.program;
  EXPECT_TRUE(p.externs.empty());
  std::vector<std::vector<double>> bufs(p.buffers.size());
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    auto bytes = p.buffers[b].bytes().as_const();
    bufs[b].assign(static_cast<size_t>(std::max<int64_t>(*bytes / 8, 1)) + 8, 0.0);
  }
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    const loop::Buffer& in = p.buffers[p.inputs[i]];
    EXPECT_TRUE(ir::is_contiguous(in.sizes, in.strides));
    std::copy(inputs[i].begin(), inputs[i].end(), bufs[p.inputs[i]].begin() + *in.offset.as_const());
  }
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    std::vector<void*> args;
    for (int b : p.kernels[k].buffers) args.push_back(bufs[b].data());
    cg.kernels[k].cpu_fn(args.data());
  }
  std::vector<std::vector<double>> outs;
  for (const loop::Output& o : p.outputs) {
    loop::BufferView view = o.view;
    if (o.input_alias >= 0) {  // a graph input returned as it is (an identity gradient)
      const loop::Buffer& b = p.buffers[p.inputs[o.input_alias]];
      view = loop::BufferView{b.id, b.sizes, b.strides, b.offset};
    }
    const int src = view.buffer;
    const auto& sizes = view.sizes;
    std::vector<double> vals(static_cast<size_t>(numel(sizes)));
    for (int64_t flat = 0; flat < static_cast<int64_t>(vals.size()); ++flat) {
      int64_t rest = flat, at = *view.offset.as_const();
      for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
        const int64_t n = *sizes[d].as_const();
        at += (rest % n) * *view.strides[d].as_const();
        rest /= n;
      }
      vals[static_cast<size_t>(flat)] = bufs[src][static_cast<size_t>(at)];
    }
    outs.push_back(std::move(vals));
  }
  return outs;
}

// The gradients build_joint gives for inputs of `shapes` under a random tangent, against
// central differences of sum(output * tangent).
void check_gradients(const std::vector<std::vector<int64_t>>& shapes, const Builder& build, double tol = 1e-6,
                     bool positive = false) {
  std::mt19937 rng(7);
  std::normal_distribution<double> nd;
  std::vector<std::vector<double>> x;
  for (const auto& s : shapes) {
    std::vector<double> v(static_cast<size_t>(numel(f64(s).sizes)));
    for (double& e : v) e = positive ? 0.5 + std::abs(nd(rng)) : nd(rng);
    x.push_back(v);
  }
  // The joint graph: forward outputs, then the gradients.
  ir::Graph joint;
  std::vector<ir::Node*> in;
  for (size_t i = 0; i < shapes.size(); ++i) in.push_back(joint.placeholder("x" + std::to_string(i), f64(shapes[i])));
  for (ir::Node* o : build(joint, in)) joint.outputs().push_back(o);
  passes::decompose(joint);  // composite ops: differentiated through what they decompose into
  const size_t n_out = joint.outputs().size();
  autodiff::JointGraph jg;
  std::string why;
  ASSERT_TRUE(autodiff::build_joint(joint, in, jg, why)) << why;
  std::vector<std::vector<double>> tangents;
  std::vector<std::vector<double>> joint_inputs = x;
  for (ir::Node* t : jg.tangents) {
    ASSERT_NE(t, nullptr);
    std::vector<double> v(static_cast<size_t>(numel(t->meta.sizes)));
    for (double& e : v) e = nd(rng);
    tangents.push_back(v);
    joint_inputs.push_back(v);
  }
  const auto results = run(joint, joint_inputs);
  // sum(forward(x) * tangent), by the forward alone.
  auto loss = [&](const std::vector<std::vector<double>>& at) {
    ir::Graph fwd;
    std::vector<ir::Node*> fin;
    for (size_t i = 0; i < shapes.size(); ++i) fin.push_back(fwd.placeholder("x" + std::to_string(i), f64(shapes[i])));
    for (ir::Node* o : build(fwd, fin)) fwd.outputs().push_back(o);
    passes::decompose(fwd);
    const auto outs = run(fwd, at);
    double l = 0;
    for (size_t o = 0; o < outs.size(); ++o)
      for (size_t e = 0; e < outs[o].size(); ++e) l += outs[o][e] * tangents[o][e];
    return l;
  };
  size_t next = n_out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ASSERT_NE(jg.grads[i], nullptr) << "input " << i << " got no gradient";
    const std::vector<double>& got = results[next++];
    ASSERT_EQ(got.size(), x[i].size());
    for (size_t e = 0; e < x[i].size(); ++e) {
      const double h = 1e-6 * std::max(1.0, std::abs(x[i][e]));
      auto plus = x, minus = x;
      plus[i][e] += h;
      minus[i][e] -= h;
      const double want = (loss(plus) - loss(minus)) / (2 * h);
      ASSERT_NEAR(got[e], want, tol * std::max(1.0, std::abs(want))) << "input " << i << " element " << e;
    }
  }
}

ir::Node* add(ir::Graph& g, const char* op, std::vector<ir::Node*> in, ir::Attrs a = {}) { return g.must_add(op, std::move(in), a); }

// The joint graph of `g` over `wrt`, partitioned and split into forward and backward programs.
void split_training(ir::Graph& g, const std::vector<ir::Node*>& wrt, autodiff::Partition& part,
                    autodiff::SplitGraphs& split) {
  autodiff::JointGraph jg;
  std::string why;
  ASSERT_TRUE(autodiff::build_joint(g, wrt, jg, why)) << why;
  part = autodiff::partition_joint(g, jg);
  ASSERT_TRUE(autodiff::split_joint(g, jg, part, split, why)) << why;
}

}  // namespace

TEST(Autodiff, UnaryOpsMatchFiniteDifferences) {
  for (const char* op : {"exp", "sin", "cos", "tanh", "sigmoid", "expm1", "exp2", "erf", "neg", "relu", "abs", "tan",
                         "gelu", "silu", "hardsigmoid", "hardswish", "leaky_relu", "elu", "softplus"}) {
    SCOPED_TRACE(op);
    check_gradients({{3, 5}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
      return std::vector<ir::Node*>{add(g, op, {x[0]})};
    });
  }
  for (const char* op : {"log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal"}) {
    SCOPED_TRACE(op);
    check_gradients({{4, 3}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
      return std::vector<ir::Node*>{add(g, op, {x[0]})};
    }, 1e-6, /*positive=*/true);
  }
}

// Binary ops over broadcast operands: each gradient is summed back to its input's sizes.
TEST(Autodiff, BinaryOpsOverBroadcastOperands) {
  for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum"}) {
    SCOPED_TRACE(op);
    check_gradients({{2, 3, 4}, {3, 1}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
      return std::vector<ir::Node*>{add(g, op, {x[0], x[1]})};
    });
  }
  check_gradients({{3, 4}, {4}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
    ir::Attrs alpha;
    alpha.set("alpha", 2.5);
    return std::vector<ir::Node*>{add(g, "sub", {x[0], x[1]}, alpha)};
  });
  check_gradients({{3, 4}, {3, 4}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {  // both pow operands
    return std::vector<ir::Node*>{add(g, "pow", {x[0], x[1]})};
  }, 1e-5, /*positive=*/true);
  check_gradients({{5}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {  // a Python-number exponent
    return std::vector<ir::Node*>{add(g, "pow", {x[0], g.scalar(3.0, DType::Float64)})};
  });
  check_gradients({{2, 5}, {5}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
    ir::Node* cond = add(g, "gt", {x[0], g.scalar(0.0, DType::Float64)});
    return std::vector<ir::Node*>{add(g, "where", {cond, x[0], x[1]})};
  });
}

TEST(Autodiff, ReductionsAndViews) {
  ir::Attrs rows;
  rows.set("dim", std::vector<int64_t>{1});
  check_gradients({{3, 4, 2}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
    ir::Attrs keep = rows;
    keep.set("keepdim", true);
    return std::vector<ir::Node*>{add(g, "sum", {x[0]}, rows), add(g, "sum", {x[0]}, keep), add(g, "sum", {x[0]}),
                                  add(g, "amax", {x[0]}, rows)};
  });
  check_gradients({{2, 3, 4}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
    ir::Attrs perm, shape, tr, unsq, size;
    perm.set("dims", std::vector<int64_t>{2, 0, 1});
    shape.set("shape", std::vector<int64_t>{6, 4});
    tr.set("dim0", int64_t(0));
    tr.set("dim1", int64_t(1));
    unsq.set("dim", int64_t(1));
    size.set("size", std::vector<int64_t>{2, 5, 3, 4});
    ir::Node* p = add(g, "permute", {x[0]}, perm);
    ir::Node* r = add(g, "transpose", {add(g, "reshape", {x[0]}, shape)}, tr);
    ir::Node* e = add(g, "expand", {add(g, "unsqueeze", {x[0]}, unsq)}, size);
    return std::vector<ir::Node*>{add(g, "mul", {p, p}), add(g, "sin", {r}), add(g, "mul", {e, e})};
  });
}

// Slices, selects and cats (split heads, rotate_half, chunk): the gradient goes back to the
// window each took, a strided slice's to every step-th element of it.
TEST(Autodiff, SlicesSelectsAndCats) {
  check_gradients({{4, 6}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
    ir::Attrs lo, hi, sel, cat;
    lo.set("dim", int64_t(1));
    lo.set("start", int64_t(0));
    lo.set("end", int64_t(3));
    hi.set("dim", int64_t(1));
    hi.set("start", int64_t(3));
    sel.set("dim", int64_t(0));
    sel.set("index", int64_t(-2));
    cat.set("dim", int64_t(-1));
    ir::Node* a = add(g, "slice", {x[0]}, lo);
    ir::Node* b = add(g, "slice", {x[0]}, hi);
    ir::Node* rotated = add(g, "cat", {add(g, "neg", {b}), a}, cat);  // rotate_half
    return std::vector<ir::Node*>{add(g, "mul", {rotated, x[0]}), add(g, "sin", {add(g, "select", {x[0]}, sel)})};
  });
  check_gradients({{7, 5}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
    ir::Attrs every3, odd;
    every3.set("dim", int64_t(0));
    every3.set("step", int64_t(3));
    odd.set("dim", int64_t(1));
    odd.set("start", int64_t(1));
    odd.set("step", int64_t(2));
    return std::vector<ir::Node*>{add(g, "sin", {add(g, "slice", {x[0]}, every3)}), add(g, "exp", {add(g, "slice", {x[0]}, odd)})};
  });
}

// A value used twice accumulates; a float32 input of a float64 computation gets a float32
// gradient (checked by dtype: finite differences run in float64).
TEST(Autodiff, AccumulationAndDtypes) {
  check_gradients({{4, 4}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
    ir::Node* t = add(g, "tanh", {x[0]});
    return std::vector<ir::Node*>{add(g, "mul", {add(g, "add", {t, x[0]}), add(g, "exp", {t})})};
  });
  ir::Graph g;
  ir::TensorMeta m = f64({3});
  m.dtype = DType::Float32;
  ir::Node* x = g.placeholder("x", m);
  ir::Attrs to64;
  to64.set("dtype", DType::Float64);
  g.outputs().push_back(g.must_add("sin", {g.must_add("convert", {x}, to64)}));
  autodiff::JointGraph jg;
  std::string why;
  ASSERT_TRUE(autodiff::build_joint(g, {x}, jg, why)) << why;
  ASSERT_NE(jg.grads[0], nullptr);
  EXPECT_EQ(jg.grads[0]->meta.dtype, DType::Float32);
  EXPECT_EQ(jg.tangents[0]->meta.dtype, DType::Float64);
}

// Composite ops are differentiated through their decompositions (layer_norm, softmax,
// log_softmax, mean, gelu, silu, clamp): a transformer block's pointwise and row parts.
TEST(Autodiff, CompositeOpsThroughTheirDecompositions) {
  auto ints = [](std::vector<int64_t> v) { return ir::AttrValue(v); };
  check_gradients({{3, 8}, {8}, {8}}, [&](ir::Graph& g, const std::vector<ir::Node*>& x) {
    ir::Attrs ln, last, gelu_tanh, mean_rows, clamp;
    ln.set("normalized_shape", ints({8}));
    last.set("dim", int64_t(-1));
    gelu_tanh.set("approximate", std::string("tanh"));
    mean_rows.set("dim", ints({1}));
    clamp.set("min", -0.5);
    clamp.set("max", 0.7);
    ir::Node* h = add(g, "layer_norm", {x[0], x[1], x[2]}, ln);
    std::vector<ir::Node*> outs = {add(g, "softmax", {h}, last), add(g, "log_softmax", {h}, last),
                                   add(g, "gelu", {h}), add(g, "gelu", {h}, gelu_tanh), add(g, "silu", {h}),
                                   add(g, "mean", {h}, mean_rows), add(g, "clamp", {h}, clamp)};
    return outs;
  }, 1e-5);
}

// Matrix products' gradients are matrix products (extern ops: run by torch, so checked here by
// structure; the GPU and Python tests run them).
TEST(Autodiff, MatrixProductGradientsAreProducts) {
  ir::Graph g;
  ir::TensorMeta a = f64({3, 5}), b = f64({5, 2});
  ir::Node* x = g.placeholder("a", a);
  ir::Node* w = g.placeholder("b", b);
  g.outputs().push_back(g.must_add("tanh", {g.must_add("mm", {x, w})}));
  autodiff::JointGraph jg;
  std::string why;
  ASSERT_TRUE(autodiff::build_joint(g, {x, w}, jg, why)) << why;
  ASSERT_EQ(jg.grads.size(), 2u);
  EXPECT_EQ(jg.grads[0]->op_name(), "mm");
  EXPECT_EQ(jg.grads[1]->op_name(), "mm");
  EXPECT_EQ(jg.grads[0]->meta.str(), x->meta.str());
  EXPECT_EQ(jg.grads[1]->meta.str(), w->meta.str());
}

// Inputs no output depends on get no gradient; an op on the path with no derivative makes
// build_joint fail naming it (the call then runs eagerly, with that reason).
TEST(Autodiff, UnusedInputsAndOpsWithoutDerivative) {
  {
    ir::Graph g;
    ir::Node* x = g.placeholder("x", f64({3}));
    ir::Node* y = g.placeholder("y", f64({3}));
    g.outputs().push_back(g.must_add("exp", {x}));
    autodiff::JointGraph jg;
    std::string why;
    ASSERT_TRUE(autodiff::build_joint(g, {x, y}, jg, why)) << why;
    EXPECT_NE(jg.grads[0], nullptr);
    EXPECT_EQ(jg.grads[1], nullptr);
  }
  {  // floor_divide has no derivative (torch's raises for it too)
    ir::Graph g;
    ir::Node* x = g.placeholder("x", f64({3, 4}));
    g.outputs().push_back(g.must_add("floor_divide", {x, x}));
    autodiff::JointGraph jg;
    std::string why;
    EXPECT_FALSE(autodiff::build_joint(g, {x}, jg, why));
    EXPECT_NE(why.find("floor_divide"), std::string::npos) << why;
  }
}

// The forward and backward programs cut from the joint graph compute what the joint graph
// does: the forward's outputs, and from the saved values and the tangents, the gradients.
TEST(Autodiff, SplitProgramsComputeWhatTheJointGraphDoes) {
  auto build = [](ir::Graph& g, std::vector<ir::Node*>& in) {
    in = {g.placeholder("x", f64({6, 8})), g.placeholder("w", f64({8})), g.placeholder("b", f64({8}))};
    ir::Attrs ln, last;
    ln.set("normalized_shape", std::vector<int64_t>{8});
    last.set("dim", int64_t(-1));
    ir::Node* h = g.must_add("tanh", {g.must_add("add", {g.must_add("mul", {in[0], in[1]}), in[2]})});
    ir::Node* n = g.must_add("layer_norm", {h, in[1], in[2]}, ln);
    g.outputs().push_back(g.must_add("softmax", {g.must_add("gelu", {n})}, last));
    g.outputs().push_back(g.must_add("sum", {h}));
    passes::decompose(g);
  };
  std::mt19937 rng(3);
  std::normal_distribution<double> nd;
  auto randv = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& e : v) e = nd(rng);
    return v;
  };
  const std::vector<std::vector<double>> x = {randv(48), randv(8), randv(8)};
  const std::vector<std::vector<double>> t = {randv(48), randv(1)};
  ir::Graph joint;
  std::vector<ir::Node*> in;
  build(joint, in);
  autodiff::Partition part;
  autodiff::SplitGraphs split;
  split_training(joint, in, part, split);
  EXPECT_FALSE(part.recomputed.empty());  // the pointwise work is redone in the backward
  std::vector<std::vector<double>> joint_in = x;
  joint_in.insert(joint_in.end(), t.begin(), t.end());
  const auto want = run(joint, joint_in);  // 2 forward outputs, 3 gradients
  const auto fwd = run(*split.forward, x);
  ASSERT_EQ(fwd.size(), 2 + part.saved.size());
  std::vector<std::vector<double>> bwd_in(fwd.begin() + 2, fwd.end());
  bwd_in.insert(bwd_in.end(), t.begin(), t.end());
  const auto bwd = run(*split.backward, bwd_in);
  ASSERT_EQ(bwd.size(), 3u);
  for (size_t o = 0; o < 2; ++o)
    for (size_t e = 0; e < want[o].size(); ++e) ASSERT_NEAR(fwd[o][e], want[o][e], 1e-12) << "output " << o;
  for (size_t i = 0; i < 3; ++i)
    for (size_t e = 0; e < want[2 + i].size(); ++e) ASSERT_NEAR(bwd[i][e], want[2 + i][e], 1e-9) << "grad " << i;
}

// The backward cut into stages at gradient-bucket boundaries (data-parallel training) computes
// what the whole backward does: each stage run on its saved values and what earlier stages hand
// it. The last layer's gradients come first.
TEST(Autodiff, BackwardStagesComputeWhatTheWholeBackwardDoes) {
  ir::Graph joint;
  std::vector<ir::Node*> in = {joint.placeholder("x", f64({4, 8}))};
  ir::Node* h = in[0];
  for (int layer = 0; layer < 3; ++layer) {
    ir::Node* w = joint.placeholder("w" + std::to_string(layer), f64({4, 8}));
    ir::Node* b = joint.placeholder("b" + std::to_string(layer), f64({8}));
    in.push_back(w);
    in.push_back(b);
    h = joint.must_add("tanh", {joint.must_add("add", {joint.must_add("mul", {h, w}), b})});
  }
  joint.outputs().push_back(joint.must_add("sum", {h}));
  passes::decompose(joint);
  autodiff::Partition part;
  autodiff::SplitGraphs split;
  split_training(joint, in, part, split);
  std::string why;
  std::mt19937 rng(5);
  std::normal_distribution<double> nd;
  std::vector<std::vector<double>> x;
  for (const ir::Node* i : in) {
    std::vector<double> v(static_cast<size_t>(numel(i->meta.sizes)));
    for (double& e : v) e = nd(rng);
    x.push_back(v);
  }
  const auto fwd = run(*split.forward, x);
  std::vector<std::vector<double>> saved(fwd.begin() + 1, fwd.end());
  std::vector<std::vector<double>> bwd_in = saved;
  bwd_in.push_back({0.75});  // the tangent of the sum
  const auto want = run(*split.backward, bwd_in);
  ASSERT_EQ(want.size(), in.size());

  // A cap of one weight (4*8 doubles) per stage: a stage per layer or finer.
  std::vector<autodiff::BackwardStage> stages;
  ASSERT_TRUE(autodiff::split_backward_stages(*split.backward, saved.size(), 4 * 8 * 8, 4 * 8 * 8, stages, why)) << why;
  std::vector<size_t> stage_of(in.size(), 0);
  ASSERT_GE(stages.size(), 3u);
  std::vector<std::vector<std::vector<double>>> results;
  std::vector<bool> seen(in.size(), false);
  for (size_t s = 0; s < stages.size(); ++s) {
    const autodiff::BackwardStage& st = stages[s];
    std::vector<std::vector<double>> ins;
    for (int j : st.saved) ins.push_back(saved[static_cast<size_t>(j)]);
    if (s == 0) ins.push_back({0.75});
    else EXPECT_TRUE(st.saved.empty() || !st.received.empty()) << "stage " << s << " reads nothing earlier stages made";
    for (const auto& r : st.received) {
      ASSERT_LT(static_cast<size_t>(r.stage), s);
      ins.push_back(results[static_cast<size_t>(r.stage)][static_cast<size_t>(r.output)]);
    }
    results.push_back(run(*st.graph, ins));
    for (size_t k = 0; k < st.grads.size(); ++k) {
      const auto grad = static_cast<size_t>(st.grads[k]);
      ASSERT_FALSE(seen[grad]) << "gradient " << grad << " in two stages";
      seen[grad] = true;
      stage_of[grad] = s;
      ASSERT_EQ(results.back()[k].size(), want[grad].size());
      for (size_t e = 0; e < want[grad].size(); ++e) ASSERT_NEAR(results.back()[k][e], want[grad][e], 1e-12);
    }
  }
  for (size_t g = 0; g < in.size(); ++g) EXPECT_TRUE(seen[g]) << "gradient " << g << " in no stage";
  // The last layer's weight (input 5) first, then the middle one's (3), then the first's (1) and x's.
  EXPECT_EQ(stage_of[5], 0u);
  EXPECT_LT(stage_of[5], stage_of[3]);
  EXPECT_LT(stage_of[3], stage_of[1]);
  EXPECT_LT(stage_of[3], stage_of[0]);

  // Caps larger than all gradients together: no cut.
  ASSERT_TRUE(autodiff::split_backward_stages(*split.backward, saved.size(), 1 << 30, 1 << 30, stages, why));
  EXPECT_TRUE(stages.empty());
}
