// Unit tests of the graph IR (core/ir/graph.h), the shape/dtype rules of the op table
// (core/ops) and the graph passes (core/passes): decompose, DCE, CSE.
//
// Expected shapes, dtypes and error messages follow torch 2.x eager behaviour. Pass tests
// compare Graph::str() before and after, as the FX-like text is what KILN_DEBUG dumps.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/ir/graph.h"
#include "core/ops/registry.h"
#include "core/passes/passes.h"

using namespace kiln;
using ir::Attrs;
using ir::Graph;
using ir::Node;
using ir::TensorMeta;
using sym::Expr;

namespace {

TensorMeta meta(DType t, std::vector<int64_t> sizes) {
  TensorMeta m;
  m.dtype = t;
  for (int64_t s : sizes) m.sizes.push_back(s);
  m.strides = ir::contiguous_strides(m.sizes);
  return m;
}
TensorMeta f32(std::vector<int64_t> sizes) { return meta(DType::Float32, std::move(sizes)); }

std::vector<Expr> E(std::vector<int64_t> xs) { return {xs.begin(), xs.end()}; }

Attrs A(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  Attrs a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}
using Ints = std::vector<int64_t>;

// The ops of the graph in order, placeholders and scalars left out.
std::vector<std::string> ops_of(const Graph& g) {
  std::vector<std::string> out;
  for (auto& n : g.nodes())
    if (n->op->kind != ops::OpKind::Source) out.push_back(n->op_name());
  return out;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

void decompose_checked(Graph& g) { passes::decompose(g); }

}  // namespace

// ---- the op table ----

TEST(GraphPasses, FindOpAndSchemaParse) {
  const ops::OpDef* sin = ops::find_op("sin");
  ASSERT_NE(sin, nullptr);
  EXPECT_EQ(sin->kind, ops::OpKind::Pointwise);
  EXPECT_EQ(sin->promotion, ops::Promotion::IntToFloat);
  EXPECT_EQ(ops::find_op("sum")->kind, ops::OpKind::Reduction);
  EXPECT_EQ(ops::find_op("reshape")->kind, ops::OpKind::View);
  EXPECT_EQ(ops::find_op("mm")->kind, ops::OpKind::Extern);
  EXPECT_EQ(ops::find_op("softmax")->kind, ops::OpKind::Composite);
  EXPECT_EQ(ops::find_op("no_such_op"), nullptr);

  ops::Schema s = ops::Schema::parse("add(Tensor self, Tensor other, *, Scalar alpha=1)");
  EXPECT_EQ(s.name, "add");
  ASSERT_EQ(s.params.size(), 3u);
  EXPECT_EQ(s.params[0].name, "self");
  EXPECT_TRUE(s.params[0].is_tensor());
  EXPECT_FALSE(s.params[0].kwarg_only);
  EXPECT_EQ(s.params[2].name, "alpha");
  EXPECT_EQ(s.params[2].type, "Scalar");
  EXPECT_TRUE(s.params[2].has_default);
  EXPECT_EQ(s.params[2].dflt, "1");
  EXPECT_TRUE(s.params[2].kwarg_only);
  EXPECT_EQ(s.str(), "add(Tensor self, Tensor other, *, Scalar alpha=1)");

  ops::Schema r = ops::Schema::parse("amax(Tensor self, int[] dim=[], bool keepdim=False)");
  ASSERT_EQ(r.params.size(), 3u);
  EXPECT_EQ(r.params[1].type, "int[]");
  EXPECT_EQ(r.params[1].dflt, "[]");
  EXPECT_EQ(r.params[2].dflt, "False");
  EXPECT_EQ(ops::Schema::parse("placeholder()").params.size(), 0u);
}

TEST(GraphPasses, SchemaParseListDefaultWithCommas) {
  ops::Schema s = ops::Schema::parse("f(Tensor self, int[] dim=[0, 1], bool keepdim=False)");
  ASSERT_EQ(s.params.size(), 3u);
  EXPECT_EQ(s.params[1].name, "dim");
  EXPECT_EQ(s.params[1].type, "int[]");
  EXPECT_EQ(s.params[1].dflt, "[0, 1]");
  EXPECT_EQ(s.params[2].name, "keepdim");
}

// ---- graph construction and printing ----

TEST(GraphPasses, StrIsFxLike) {
  Graph g;
  Node* x = g.placeholder("x", f32({4, 1}));
  Node* y = g.placeholder("y", f32({3}));
  Node* a = g.must_add("add", {x, y});
  Node* m = g.must_add("mul", {a, g.scalar(2.5, DType::Float64)});
  g.outputs().push_back(m);
  EXPECT_EQ(g.str(),
            "graph():\n"
            "    %x : f32[4, 1] = placeholder[target=x]\n"
            "    %y : f32[3] = placeholder[target=y]\n"
            "    %add : f32[4, 3] = add(%x, %y)\n"
            "    %scalar : f64[] = scalar[value=2.5]\n"
            "    %mul : f32[4, 3] = mul(%add, %scalar)\n"
            "    return (%mul,)\n");
  EXPECT_EQ(g.op_count(), 2u);
  EXPECT_EQ(g.inputs().size(), 2u);
  EXPECT_EQ(x->users, std::vector<Node*>{a});
  EXPECT_EQ(x->attrs.get_int("index", -1), 0);
  EXPECT_EQ(y->attrs.get_int("index", -1), 1);
}

TEST(GraphPasses, NamesAreUniqueAndPlaceholdersStayInFront) {
  Graph g;
  Node* x = g.placeholder("x", f32({4}));
  Node* s1 = g.must_add("sin", {x});
  Node* s2 = g.must_add("sin", {x});
  Node* s3 = g.must_add("sin", {s2});
  EXPECT_EQ(s1->name, "sin");
  EXPECT_EQ(s2->name, "sin_1");
  EXPECT_EQ(s3->name, "sin_2");
  // A placeholder added late is still placed before every op.
  Node* y = g.placeholder("y", f32({4}));
  EXPECT_EQ(g.nodes()[1].get(), y);
  EXPECT_EQ(g.inputs().back(), y);
  Node* x2 = g.placeholder("x", f32({4}));
  EXPECT_EQ(x2->name, "x_1");
}

TEST(GraphPasses, UnknownOpIsAnError) {
  Graph g;
  Node* x = g.placeholder("x", f32({4}));
  std::string err;
  EXPECT_EQ(g.add("frobnicate", {x}, {}, err), nullptr);
  EXPECT_TRUE(contains(err, "unknown op frobnicate")) << err;
  EXPECT_THROW(g.must_add("frobnicate", {x}), std::runtime_error);
}

// ---- pointwise shape and dtype rules ----

TEST(GraphPasses, Broadcasting) {
  Graph g;
  Node* a = g.must_add("add", {g.placeholder("x", f32({4, 1})), g.placeholder("y", f32({3}))});
  EXPECT_EQ(a->meta.sizes, E({4, 3}));
  EXPECT_EQ(a->meta.strides, E({3, 1}));
  EXPECT_EQ(a->meta.dtype, DType::Float32);
  EXPECT_EQ(a->meta.str(), "f32[4, 3]");

  Node* b = g.must_add("mul", {g.placeholder("p", f32({2, 1, 5})), g.placeholder("q", f32({3, 1}))});
  EXPECT_EQ(b->meta.sizes, E({2, 3, 5}));

  // Zero-dim tensors and Python numbers broadcast to anything.
  Node* c = g.must_add("sub", {g.placeholder("r", f32({2, 3})), g.placeholder("z", f32({}))});
  EXPECT_EQ(c->meta.sizes, E({2, 3}));
  Node* d = g.must_add("add", {g.scalar(1.0, DType::Float64), g.placeholder("s", f32({7}))});
  EXPECT_EQ(d->meta.sizes, E({7}));
  EXPECT_FALSE(d->meta.wrapped_number);

  // A size-0 dim broadcasts against 1 and stays 0.
  Node* e = g.must_add("add", {g.placeholder("u", f32({0, 3})), g.placeholder("v", f32({1, 3}))});
  EXPECT_EQ(e->meta.sizes, E({0, 3}));
}

TEST(GraphPasses, IncompatibleBroadcastIsAnError) {
  Graph g;
  Node* x = g.placeholder("x", f32({4, 1}));
  Node* y = g.placeholder("y", f32({3, 4}));
  size_t before = g.nodes().size();
  std::string err;
  EXPECT_EQ(g.add("add", {x, y}, {}, err), nullptr);
  // torch: "The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 0"
  EXPECT_TRUE(contains(err, "must match the size")) << err;
  EXPECT_TRUE(contains(err, "The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 0"))
      << err;
  EXPECT_EQ(g.nodes().size(), before);
  EXPECT_TRUE(x->users.empty());

  std::string err2;
  EXPECT_EQ(g.add("mul", {g.placeholder("p", f32({5})), g.placeholder("q", f32({0}))}, {}, err2), nullptr);
  EXPECT_TRUE(contains(err2, "must match the size")) << err2;
}

TEST(GraphPasses, TypePromotion) {
  Graph g;
  Node* i64 = g.placeholder("i64", meta(DType::Int64, {4}));
  Node* i32 = g.placeholder("i32", meta(DType::Int32, {4}));
  Node* u8 = g.placeholder("u8", meta(DType::UInt8, {4}));
  Node* b = g.placeholder("b", meta(DType::Bool, {4}));
  Node* h = g.placeholder("h", meta(DType::Float16, {4}));
  Node* z_i64 = g.placeholder("z_i64", meta(DType::Int64, {}));
  Node* z_f64 = g.placeholder("z_f64", meta(DType::Float64, {}));

  // int64 tensor + Python float -> the default float, float32.
  EXPECT_EQ(g.must_add("add", {i64, g.scalar(2.5, DType::Float64)})->meta.dtype, DType::Float32);
  // int32 tensor + int64 zero-dim tensor -> int32; + float64 zero-dim -> float64.
  EXPECT_EQ(g.must_add("add", {i32, z_i64})->meta.dtype, DType::Int32);
  EXPECT_EQ(g.must_add("add", {i32, z_f64})->meta.dtype, DType::Float64);
  // float16 tensor + float64 zero-dim -> float16.
  EXPECT_EQ(g.must_add("mul", {h, z_f64})->meta.dtype, DType::Float16);
  // uint8 tensor + Python int -> uint8; bool tensor + Python int -> int64.
  EXPECT_EQ(g.must_add("add", {u8, g.scalar(5, DType::Int64)})->meta.dtype, DType::UInt8);
  EXPECT_EQ(g.must_add("add", {b, g.scalar(5, DType::Int64)})->meta.dtype, DType::Int64);
  EXPECT_EQ(g.must_add("add", {u8, i32})->meta.dtype, DType::Int32);

  // Op-specific promotion: sin/true division of ints give float32, comparisons give bool.
  EXPECT_EQ(g.must_add("sin", {i64})->meta.dtype, DType::Float32);
  EXPECT_EQ(g.must_add("sin", {h})->meta.dtype, DType::Float16);
  EXPECT_EQ(g.must_add("div", {i64, i32})->meta.dtype, DType::Float32);
  EXPECT_EQ(g.must_add("div", {i64, i32}, A({{"rounding_mode", std::string("floor")}}))->meta.dtype, DType::Int64);
  EXPECT_EQ(g.must_add("lt", {h, z_f64})->meta.dtype, DType::Bool);
  EXPECT_EQ(g.must_add("where", {b, i32, z_f64})->meta.dtype, DType::Float64);
  EXPECT_EQ(g.must_add("convert", {i32}, A({{"dtype", DType::Float16}}))->meta.dtype, DType::Float16);

  std::string err;
  EXPECT_EQ(g.add("neg", {b}, {}, err), nullptr);
  EXPECT_TRUE(contains(err, "Negation, the `-` operator, on a bool tensor is not supported")) << err;
  EXPECT_EQ(g.add("sub", {b, b}, {}, err), nullptr);
  EXPECT_TRUE(contains(err, "Subtraction, the `-` operator, with two bool tensors is not supported")) << err;
}

// ---- reductions ----

TEST(GraphPasses, ReductionShapes) {
  Graph g;
  Node* x = g.placeholder("x", f32({2, 3, 4}));
  EXPECT_EQ(g.must_add("sum", {x}, A({{"dim", Ints{1}}, {"keepdim", true}}))->meta.sizes, E({2, 1, 4}));
  EXPECT_EQ(g.must_add("sum", {x}, A({{"dim", Ints{1}}, {"keepdim", false}}))->meta.sizes, E({2, 4}));
  EXPECT_EQ(g.must_add("sum", {x}, A({{"dim", Ints{-1}}}))->meta.sizes, E({2, 3}));
  EXPECT_EQ(g.must_add("sum", {x}, A({{"dim", Ints{0, 2}}, {"keepdim", true}}))->meta.sizes, E({1, 3, 1}));
  Node* all = g.must_add("sum", {x});
  EXPECT_TRUE(all->meta.sizes.empty());
  EXPECT_EQ(all->meta.str(), "f32[]");
  EXPECT_EQ(g.must_add("amax", {x}, A({{"dim", Ints{0}}}))->meta.sizes, E({3, 4}));
  Node* kept = g.must_add("sum", {x}, A({{"dim", Ints{1}}, {"keepdim", true}}));
  EXPECT_EQ(kept->meta.strides, E({4, 4, 1}));

  // sum of bool / int32 -> int64; sum with an explicit dtype.
  Node* b = g.placeholder("b", meta(DType::Bool, {5}));
  Node* i = g.placeholder("i", meta(DType::Int32, {5}));
  EXPECT_EQ(g.must_add("sum", {b})->meta.dtype, DType::Int64);
  EXPECT_EQ(g.must_add("sum", {i})->meta.dtype, DType::Int64);
  EXPECT_EQ(g.must_add("sum", {i}, A({{"dtype", DType::Float64}}))->meta.dtype, DType::Float64);
  EXPECT_EQ(g.must_add("amax", {i})->meta.dtype, DType::Int32);

  std::string err;
  EXPECT_EQ(g.add("sum", {x}, A({{"dim", Ints{3}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "Dimension out of range (expected to be in range of [-3, 2], but got 3)")) << err;
  EXPECT_EQ(g.add("sum", {x}, A({{"dim", Ints{1, 1}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "dim 1 appears multiple times in the list of dims")) << err;
  Node* empty = g.placeholder("e", f32({0, 3}));
  EXPECT_EQ(g.add("amax", {empty}, A({{"dim", Ints{0}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "Expected reduction dim 0 to have non-zero size")) << err;
}

TEST(GraphPasses, ReductionRejectsADimNamedTwiceThroughANegativeIndex) {
  Graph g;
  Node* x = g.placeholder("x", f32({2, 3}));
  std::string err;
  EXPECT_EQ(g.add("sum", {x}, A({{"dim", Ints{1, -1}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "dim 1 appears multiple times in the list of dims")) << err;
}

// ---- views ----

TEST(GraphPasses, ReshapeAndView) {
  Graph g;
  Node* x = g.placeholder("x", f32({2, 3, 4}));
  Node* r = g.must_add("reshape", {x}, A({{"shape", Ints{-1, 4}}}));
  EXPECT_EQ(r->meta.sizes, E({6, 4}));
  EXPECT_EQ(r->meta.strides, E({4, 1}));
  EXPECT_EQ(g.must_add("view", {x}, A({{"shape", Ints{2, -1}}}))->meta.sizes, E({2, 12}));
  EXPECT_EQ(g.must_add("reshape", {x}, A({{"shape", Ints{24}}}))->meta.sizes, E({24}));

  std::string err;
  Node* y = g.placeholder("y", f32({2, 3}));
  EXPECT_EQ(g.add("reshape", {y}, A({{"shape", Ints{4, -1}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "shape '[4, -1]' is invalid for input of size 6")) << err;
  EXPECT_EQ(g.add("reshape", {y}, A({{"shape", Ints{-1, -1}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "only one dimension can be inferred")) << err;
  EXPECT_EQ(g.add("view", {y}, A({{"shape", Ints{5}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "is invalid for input of size 6")) << err;
}

TEST(GraphPasses, ViewOfATransposedInputNeedsReshape) {
  Graph g;
  Node* x = g.placeholder("x", f32({2, 3}));
  Node* t = g.must_add("transpose", {x}, A({{"dim0", int64_t{0}}, {"dim1", int64_t{1}}}));
  EXPECT_EQ(t->meta.sizes, E({3, 2}));
  EXPECT_EQ(t->meta.strides, E({1, 3}));

  std::string err;
  EXPECT_EQ(g.add("view", {t}, A({{"shape", Ints{6}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "view size is not compatible with input tensor's size and stride")) << err;
  EXPECT_TRUE(contains(err, "Use .reshape(...) instead")) << err;

  Node* r = g.must_add("reshape", {t}, A({{"shape", Ints{6}}}));
  EXPECT_EQ(r->meta.sizes, E({6}));
  EXPECT_EQ(r->meta.strides, E({1}));  // a copy: fresh contiguous strides

  // Splitting a dim of the transposed tensor is a view (no dim spans two chunks).
  Node* v = g.must_add("view", {t}, A({{"shape", Ints{3, 2, 1}}}));
  EXPECT_EQ(v->meta.sizes, E({3, 2, 1}));
  EXPECT_EQ(v->meta.strides[0], Expr(1));
  EXPECT_EQ(v->meta.strides[1], Expr(3));
}

TEST(GraphPasses, PermuteTransposeExpand) {
  Graph g;
  Node* x = g.placeholder("x", f32({2, 3, 4}));
  Node* p = g.must_add("permute", {x}, A({{"dims", Ints{2, 0, 1}}}));
  EXPECT_EQ(p->meta.sizes, E({4, 2, 3}));
  EXPECT_EQ(p->meta.strides, E({1, 12, 4}));
  Node* pn = g.must_add("permute", {x}, A({{"dims", Ints{-1, 0, 1}}}));
  EXPECT_EQ(pn->meta.sizes, E({4, 2, 3}));
  Node* t = g.must_add("transpose", {x}, A({{"dim0", int64_t{0}}, {"dim1", int64_t{-1}}}));
  EXPECT_EQ(t->meta.sizes, E({4, 3, 2}));
  EXPECT_EQ(t->meta.strides, E({1, 4, 12}));

  Node* y = g.placeholder("y", f32({3, 1}));
  Node* e = g.must_add("expand", {y}, A({{"size", Ints{2, 3, 4}}}));
  EXPECT_EQ(e->meta.sizes, E({2, 3, 4}));
  EXPECT_EQ(e->meta.strides, E({0, 1, 0}));
  EXPECT_EQ(g.must_add("expand", {y}, A({{"size", Ints{-1, 5}}}))->meta.sizes, E({3, 5}));

  std::string err;
  EXPECT_EQ(g.add("permute", {x}, A({{"dims", Ints{0, 0, 1}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "duplicate dims are not allowed")) << err;
  EXPECT_EQ(g.add("permute", {x}, A({{"dims", Ints{0, 1}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "number of dims don't match")) << err;
  EXPECT_EQ(g.add("expand", {y}, A({{"size", Ints{2, 4}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "The expanded size of the tensor (2) must match the existing size (3) at non-singleton dimension 0"))
      << err;
}

TEST(GraphPasses, UnsqueezeSqueeze) {
  Graph g;
  Node* x = g.placeholder("x", f32({2, 3}));
  Node* u = g.must_add("unsqueeze", {x}, A({{"dim", int64_t{-1}}}));
  EXPECT_EQ(u->meta.sizes, E({2, 3, 1}));
  EXPECT_EQ(u->meta.strides, E({3, 1, 1}));
  Node* u1 = g.must_add("unsqueeze", {x}, A({{"dim", int64_t{1}}}));
  EXPECT_EQ(u1->meta.sizes, E({2, 1, 3}));
  EXPECT_EQ(u1->meta.strides, E({3, 3, 1}));
  EXPECT_EQ(g.must_add("unsqueeze", {x}, A({{"dim", int64_t{0}}}))->meta.sizes, E({1, 2, 3}));
  std::string err;
  EXPECT_EQ(g.add("unsqueeze", {x}, A({{"dim", int64_t{3}}}), err), nullptr);

  Node* y = g.placeholder("y", f32({1, 3, 1}));
  Node* s = g.must_add("squeeze", {y});
  EXPECT_EQ(s->meta.sizes, E({3}));
  EXPECT_EQ(g.must_add("squeeze", {y}, A({{"dim", Ints{0}}}))->meta.sizes, E({3, 1}));
  EXPECT_EQ(g.must_add("squeeze", {y}, A({{"dim", Ints{-1}}}))->meta.sizes, E({1, 3}));
  // Squeezing a dim that is not 1 is a no-op, as in torch.
  EXPECT_EQ(g.must_add("squeeze", {y}, A({{"dim", Ints{1}}}))->meta.sizes, E({1, 3, 1}));
  EXPECT_EQ(g.add("squeeze", {y}, A({{"dim", Ints{3}}}), err), nullptr);
  EXPECT_TRUE(contains(err, "Dimension out of range")) << err;
}

// ---- extern and composite shape rules ----

TEST(GraphPasses, MatrixProductShapes) {
  Graph g;
  Node* a = g.placeholder("a", f32({8, 16}));
  Node* b = g.placeholder("b", f32({16, 32}));
  EXPECT_EQ(g.must_add("mm", {a, b})->meta.sizes, E({8, 32}));
  std::string err;
  EXPECT_EQ(g.add("mm", {a, a}, {}, err), nullptr);
  EXPECT_TRUE(contains(err, "mat1 and mat2 shapes cannot be multiplied (8x16 and 8x16)")) << err;
  // Composite ops infer through their decomposition.
  Node* a4 = g.placeholder("a4", f32({2, 3, 4, 5}));
  Node* b4 = g.placeholder("b4", f32({2, 3, 5, 6}));
  EXPECT_EQ(g.must_add("matmul", {a4, b4})->meta.sizes, E({2, 3, 4, 6}));
  Node* v = g.placeholder("v", f32({5}));
  EXPECT_EQ(g.must_add("matmul", {a4, v})->meta.sizes, E({2, 3, 4}));
  EXPECT_EQ(g.must_add("matmul", {v, b4})->meta.sizes, E({2, 3, 6}));
  EXPECT_EQ(g.must_add("softmax", {a4}, A({{"dim", int64_t{-1}}}))->meta.sizes, E({2, 3, 4, 5}));
  EXPECT_EQ(g.must_add("mean", {a4}, A({{"dim", Ints{1, 2}}}))->meta.sizes, E({2, 5}));
  EXPECT_EQ(g.must_add("flatten", {a4}, A({{"start_dim", int64_t{1}}}))->meta.sizes, E({2, 60}));
  Node* i = g.placeholder("i", meta(DType::Int64, {3}));
  EXPECT_EQ(g.add("mean", {i}, {}, err), nullptr);
  EXPECT_TRUE(contains(err, "mean(): could not infer output dtype")) << err;
  EXPECT_EQ(g.add("matmul", {a4, a4}, {}, err), nullptr);
}

// ---- dead code elimination ----

TEST(GraphPasses, DeadCodeEliminationKeepsPlaceholders) {
  Graph g;
  Node* x = g.placeholder("x", f32({4}));
  g.placeholder("unused", f32({4}));
  Node* s = g.must_add("sin", {x});
  g.must_add("exp", {s});  // dead, and keeps sin alive only through itself
  Node* c = g.must_add("cos", {x});
  g.outputs().push_back(c);
  std::string before = g.str();
  EXPECT_TRUE(contains(before, "%sin : f32[4] = sin(%x)"));
  EXPECT_TRUE(contains(before, "%exp : f32[4] = exp(%sin)"));

  passes::dead_code_elimination(g);
  std::string after = g.str();
  EXPECT_EQ(after,
            "graph():\n"
            "    %x : f32[4] = placeholder[target=x]\n"
            "    %unused : f32[4] = placeholder[target=unused]\n"
            "    %cos : f32[4] = cos(%x)\n"
            "    return (%cos,)\n");
  EXPECT_EQ(x->users, std::vector<Node*>{c});
  EXPECT_EQ(g.inputs().size(), 2u);

  // Idempotent.
  passes::dead_code_elimination(g);
  EXPECT_EQ(g.str(), after);
}

TEST(GraphPasses, DeadCodeEliminationKeepsEverythingAnOutputNeeds) {
  Graph g;
  Node* x = g.placeholder("x", f32({4}));
  Node* a = g.must_add("sin", {x});
  Node* b = g.must_add("mul", {a, g.scalar(2.0, DType::Float64)});
  Node* c = g.must_add("add", {b, x});
  g.outputs() = {c, a};
  std::string before = g.str();
  passes::dead_code_elimination(g);
  EXPECT_EQ(g.str(), before);
  EXPECT_EQ(ops_of(g), (std::vector<std::string>{"sin", "mul", "add"}));
}

// ---- common subexpression elimination ----

TEST(GraphPasses, CseMergesIdenticalNodes) {
  Graph g;
  Node* x = g.placeholder("x", f32({4}));
  Node* a = g.must_add("sin", {x});
  Node* b = g.must_add("sin", {x});
  Node* ca = g.must_add("cos", {a});
  Node* cb = g.must_add("cos", {b});
  Node* r = g.must_add("add", {ca, cb});
  g.outputs().push_back(r);
  std::string before = g.str();
  EXPECT_EQ(before,
            "graph():\n"
            "    %x : f32[4] = placeholder[target=x]\n"
            "    %sin : f32[4] = sin(%x)\n"
            "    %sin_1 : f32[4] = sin(%x)\n"
            "    %cos : f32[4] = cos(%sin)\n"
            "    %cos_1 : f32[4] = cos(%sin_1)\n"
            "    %add : f32[4] = add(%cos, %cos_1)\n"
            "    return (%add,)\n");

  passes::common_subexpression_elimination(g);
  // sin_1 merges into sin, after which cos_1 (now cos(%sin)) merges into cos.
  EXPECT_EQ(g.str(),
            "graph():\n"
            "    %x : f32[4] = placeholder[target=x]\n"
            "    %sin : f32[4] = sin(%x)\n"
            "    %cos : f32[4] = cos(%sin)\n"
            "    %add : f32[4] = add(%cos, %cos)\n"
            "    return (%add,)\n");
  EXPECT_EQ(ops_of(g), (std::vector<std::string>{"sin", "cos", "add"}));
  EXPECT_EQ(a->users, std::vector<Node*>{ca});
  EXPECT_EQ(ca->users, (std::vector<Node*>{r, r}));
}

TEST(GraphPasses, CseRespectsAttributesInputsAndOutputs) {
  Graph g;
  Node* x = g.placeholder("x", f32({2, 3}));
  Node* y = g.placeholder("y", f32({2, 3}));  // same meta as x: placeholders never merge
  Node* s0 = g.must_add("sum", {x}, A({{"dim", Ints{0}}}));
  Node* s0b = g.must_add("sum", {x}, A({{"dim", Ints{0}}}));
  Node* s1 = g.must_add("sum", {x}, A({{"dim", Ints{1}}}));
  Node* sy = g.must_add("sum", {y}, A({{"dim", Ints{0}}}));
  Node* two_a = g.scalar(2.0, DType::Float64);
  Node* two_b = g.scalar(2.0, DType::Float64);
  Node* two_i = g.scalar(2, DType::Int64);
  Node* m0 = g.must_add("mul", {s0, two_a});
  Node* m1 = g.must_add("mul", {s0b, two_b});
  Node* m2 = g.must_add("mul", {sy, two_i});
  g.outputs() = {m0, m1, s1, m2};
  passes::common_subexpression_elimination(g);

  std::string after = g.str();
  // Two outputs stay two tensors (an in-place change of one must not show in the other); what
  // they read is merged.
  EXPECT_TRUE(contains(after, "return (%mul, %mul_1, %sum_2, %mul_2)")) << after;
  EXPECT_TRUE(contains(after, "%mul_1 : f32[3] = mul(%sum, %scalar)")) << after;
  EXPECT_TRUE(contains(after, "%sum_2 : f32[2] = sum(%x, dim=[1])")) << after;
  EXPECT_TRUE(contains(after, "%sum_3 : f32[3] = sum(%y, dim=[0])")) << after;
  EXPECT_TRUE(contains(after, "%scalar_2 : i64[] = scalar[value=2]")) << after;
  EXPECT_FALSE(contains(after, "%sum_1 ")) << after;
  EXPECT_FALSE(contains(after, "%scalar_1 ")) << after;
  EXPECT_EQ(g.inputs().size(), 2u);
  EXPECT_EQ(g.outputs()[0], m0);
  EXPECT_EQ(g.outputs()[1], m1);
  EXPECT_EQ(ops_of(g), (std::vector<std::string>{"sum", "sum", "sum", "mul", "mul", "mul"}));
  (void)s1, (void)m2;
}

TEST(GraphPasses, CseWithNothingToMergeLeavesTheGraphAlone) {
  Graph g;
  Node* x = g.placeholder("x", f32({4}));
  Node* dead = g.must_add("exp", {x});  // CSE only cleans up after a merge
  g.outputs().push_back(g.must_add("sin", {x}));
  std::string before = g.str();
  passes::common_subexpression_elimination(g);
  EXPECT_EQ(g.str(), before);
  (void)dead;
}

// ---- decompose ----

TEST(GraphPasses, DecomposeLeavesPrimitiveGraphsAlone) {
  Graph g;
  Node* x = g.placeholder("x", f32({4, 8}));
  Node* s = g.must_add("sum", {g.must_add("exp", {x})}, A({{"dim", Ints{1}}}));
  g.outputs().push_back(s);
  std::string before = g.str();
  passes::decompose(g);
  EXPECT_EQ(g.str(), before);
}

TEST(GraphPasses, DecomposeSoftmax) {
  Graph g;
  Node* x = g.placeholder("x", f32({2, 3}));
  g.outputs().push_back(g.must_add("softmax", {x}, A({{"dim", int64_t{1}}})));
  EXPECT_TRUE(contains(g.str(), "%softmax : f32[2, 3] = softmax(%x, dim=1)"));

  decompose_checked(g);
  EXPECT_EQ(ops_of(g), (std::vector<std::string>{"amax", "sub", "exp", "sum", "div"}));
  std::string after = g.str();
  EXPECT_FALSE(contains(after, "softmax")) << after;
  EXPECT_TRUE(contains(after, "%amax : f32[2, 1] = amax(%x, dim=[1], keepdim=True)")) << after;
  EXPECT_TRUE(contains(after, "%sub : f32[2, 3] = sub(%x, %amax)")) << after;
  EXPECT_TRUE(contains(after, "%exp : f32[2, 3] = exp(%sub)")) << after;
  EXPECT_TRUE(contains(after, "%sum : f32[2, 1] = sum(%exp, dim=[1], keepdim=True)")) << after;
  EXPECT_TRUE(contains(after, "%div : f32[2, 3] = div(%exp, %sum)")) << after;
  EXPECT_TRUE(contains(after, "return (%div,)")) << after;
}

TEST(GraphPasses, DecomposeLinearWithBiasIntoAddmm) {
  Graph g;
  Node* x = g.placeholder("x", f32({8, 16}));
  Node* w = g.placeholder("w", f32({32, 16}));
  Node* b = g.placeholder("b", f32({32}));
  g.outputs().push_back(g.must_add("linear", {x, w, b}));
  EXPECT_TRUE(contains(g.str(), "%linear : f32[8, 32] = linear(%x, %w, %b)"));

  decompose_checked(g);
  EXPECT_EQ(ops_of(g), (std::vector<std::string>{"transpose", "addmm"}));
  std::string after = g.str();
  EXPECT_TRUE(contains(after, "%transpose : f32[16, 32] = transpose(%w, dim0=0, dim1=1)")) << after;
  EXPECT_TRUE(contains(after, "%addmm : f32[8, 32] = addmm(%b, %x, %transpose)")) << after;
  EXPECT_TRUE(contains(after, "return (%addmm,)")) << after;
}

TEST(GraphPasses, DecomposeLinearWithoutBiasReachesAFixpoint) {
  // linear -> matmul, itself composite -> mm: the pass sweeps until no composite is left.
  Graph g;
  Node* x = g.placeholder("x", f32({8, 16}));
  Node* w = g.placeholder("w", f32({32, 16}));
  g.outputs().push_back(g.must_add("linear", {x, w}));
  decompose_checked(g);
  EXPECT_EQ(ops_of(g), (std::vector<std::string>{"transpose", "mm"}));
  EXPECT_EQ(g.outputs()[0]->meta.sizes, E({8, 32}));
}

TEST(GraphPasses, DecomposeBatchedMatmulIntoBmm) {
  Graph g;
  Node* a = g.placeholder("a", f32({2, 3, 4, 5}));
  Node* b = g.placeholder("b", f32({2, 3, 5, 6}));
  g.outputs().push_back(g.must_add("matmul", {a, b}));
  decompose_checked(g);
  EXPECT_EQ(ops_of(g), (std::vector<std::string>{"reshape", "reshape", "bmm", "reshape"}));
  std::string after = g.str();
  EXPECT_TRUE(contains(after, "%reshape : f32[6, 4, 5] = reshape(%a, shape=[6, 4, 5])")) << after;
  EXPECT_TRUE(contains(after, "%reshape_1 : f32[6, 5, 6] = reshape(%b, shape=[6, 5, 6])")) << after;
  EXPECT_TRUE(contains(after, "%bmm : f32[6, 4, 6] = bmm(%reshape, %reshape_1)")) << after;
  EXPECT_TRUE(contains(after, "%reshape_2 : f32[2, 3, 4, 6] = reshape(%bmm, shape=[2, 3, 4, 6])")) << after;
  EXPECT_TRUE(contains(after, "return (%reshape_2,)")) << after;
}

TEST(GraphPasses, DecomposeMeanIntoSumAndDiv) {
  Graph g;
  Node* x = g.placeholder("x", f32({3, 4}));
  g.outputs().push_back(g.must_add("mean", {x}, A({{"dim", Ints{1}}})));
  decompose_checked(g);
  EXPECT_EQ(ops_of(g), (std::vector<std::string>{"sum", "div"}));
  std::string after = g.str();
  EXPECT_TRUE(contains(after, "%sum : f32[3] = sum(%x, dim=[1], keepdim=False)")) << after;
  EXPECT_TRUE(contains(after, "%scalar : i64[] = scalar[value=4]")) << after;
  EXPECT_TRUE(contains(after, "%div : f32[3] = div(%sum, %scalar)")) << after;
  EXPECT_EQ(g.outputs()[0]->meta.dtype, DType::Float32);
}

namespace {
// A torch_call updating `cache` out of place, as capture records x.index_copy_(...): its
// in-place form offered, the input it updates named.
Node* cache_update(Graph& g, Node* cache, Node* pos, Node* value) {
  Attrs a = A({{"fn", int64_t(0)}, {"target", std::string("Tensor.index_copy")}, {"out_sizes", cache->meta.sizes},
               {"out_strides", cache->meta.strides}, {"out_dtype", cache->meta.dtype}, {"inplace_fn", int64_t(1)},
               {"inplace_of", int64_t(cache->id)}});
  return g.must_add("torch_call", {cache, pos, value}, a);
}
}  // namespace

TEST(GraphPasses, ReinplaceAnInputUpdateNothingElseReads) {
  Graph g;
  Node* cache = g.placeholder("cache", f32({2, 8, 4}));
  Node* pos = g.placeholder("pos", meta(DType::Int64, {1}));
  Node* value = g.placeholder("value", f32({2, 1, 4}));
  Node* updated = cache_update(g, cache, pos, value);
  g.outputs() = {updated, g.must_add("sum", {updated}, A({{"dim", Ints{-1}}}))};
  passes::reinplace_input_updates(g);
  EXPECT_TRUE(updated->attrs.get_bool("in_place")) << g.str();
}

TEST(GraphPasses, ReinplaceLeavesAnUpdateWhoseInputIsReadElsewhere) {
  Graph g;
  Node* cache = g.placeholder("cache", f32({2, 8, 4}));
  Node* pos = g.placeholder("pos", meta(DType::Int64, {1}));
  Node* value = g.placeholder("value", f32({2, 1, 4}));
  Node* before = g.must_add("sum", {cache}, A({{"dim", Ints{-1}}}));  // may run after the update
  Node* updated = cache_update(g, cache, pos, value);
  g.outputs() = {updated, before};
  passes::reinplace_input_updates(g);
  EXPECT_FALSE(updated->attrs.get_bool("in_place")) << g.str();
  // An update of something other than a graph input is never made in place.
  Graph h;
  Node* x = h.placeholder("x", f32({2, 8, 4}));
  Node* doubled = h.must_add("mul", {x, h.scalar(2.0, DType::Float64)});
  Node* p = h.placeholder("pos", meta(DType::Int64, {1}));
  Node* v = h.placeholder("value", f32({2, 1, 4}));
  Node* upd = cache_update(h, doubled, p, v);
  h.outputs() = {upd};
  passes::reinplace_input_updates(h);
  EXPECT_FALSE(upd->attrs.get_bool("in_place")) << h.str();
}
