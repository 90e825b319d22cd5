// Composite ops: each is rewritten into simpler ops by its decomposition (the PrimTorch step).
// Their shape rule is the decomposition itself, run on a scratch graph, so the two never
// disagree.
#include <stdexcept>

#include "core/sym/shape_env.h"
#include "core/ops/derivatives.h"
#include "core/ops/registry.h"

namespace kiln::ops {
namespace {

using Ints = std::vector<int64_t>;

Attrs A(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  Attrs a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}

Node* reshape(Graph& g, Node* x, const std::vector<Expr>& sizes) {
  return g.must_add("reshape", {x}, A({{"shape", ir::sizes_attr(sizes)}}));
}

Node* expand(Graph& g, Node* x, const std::vector<Expr>& sizes) {
  if (x->meta.sizes == sizes) return x;
  return g.must_add("expand", {x}, A({{"size", ir::sizes_attr(sizes)}}));
}

Node* decompose_matmul(Graph& g, Node* n) {
  Node *a = n->inputs[0], *b = n->inputs[1];
  int64_t da = a->meta.dim(), db = b->meta.dim();
  if (da == 0 || db == 0) throw std::runtime_error("RuntimeError: both arguments to matmul need to be at least 1D, but they are " +
                                                   std::to_string(da) + "D and " + std::to_string(db) + "D");
  if (da == 1 && db == 1) {
    if (!sym::same_size(a->meta.sizes[0], b->meta.sizes[0]))
      throw std::runtime_error("RuntimeError: inconsistent tensor size, expected tensor [" + a->meta.sizes[0].str() +
                               "] and src [" + b->meta.sizes[0].str() + "] to have the same number of elements, but got " +
                               a->meta.sizes[0].str() + " and " + b->meta.sizes[0].str() + " elements respectively");
    // torch.dot: one dtype, with a kernel, and the result in it (a sum would widen int32)
    if (a->meta.dtype != b->meta.dtype)
      throw std::runtime_error(std::string("RuntimeError: dot : expected both vectors to have same dtype, but found ") +
                               torch_dtype_name(a->meta.dtype) + " and " + torch_dtype_name(b->meta.dtype));
    std::string err;
    if (!has_matmul_kernel(a->meta, "dot", err)) throw std::runtime_error(err);
    return g.must_add("sum", {g.must_add("mul", {a, b})}, A({{"dtype", a->meta.dtype}}));
  }
  if (da == 2 && db == 2) return g.must_add("mm", {a, b});
  if (da == 1 && db == 2) {
    Node* r = g.must_add("mm", {g.must_add("unsqueeze", {a}, A({{"dim", int64_t(0)}})), b});
    return g.must_add("squeeze", {r}, A({{"dim", Ints{0}}}));
  }
  if (db == 1 && da == 2) {
    Node* r = g.must_add("mm", {a, g.must_add("unsqueeze", {b}, A({{"dim", int64_t(1)}}))});
    return g.must_add("squeeze", {r}, A({{"dim", Ints{1}}}));
  }
  if (da >= 3 && db <= 2) {
    // Fold the batch dims of `a` into its rows: one mm instead of a batched product.
    Node* bb = db == 1 ? g.must_add("unsqueeze", {b}, A({{"dim", int64_t(1)}})) : b;
    std::vector<Expr> sa = a->meta.sizes;
    Expr k = sa.back();
    Node* a2 = reshape(g, a, {sym::product({sa.begin(), sa.end() - 1}), k});
    Node* r = g.must_add("mm", {a2, bb});
    std::vector<Expr> out(sa.begin(), sa.end() - 1);
    if (db == 2) out.push_back(b->meta.sizes[1]);
    return reshape(g, r, out);
  }
  // General batched case: broadcast batch dims, flatten them, bmm, unflatten.
  Node* a3 = da == 1 ? g.must_add("unsqueeze", {a}, A({{"dim", int64_t(0)}})) : a;
  Node* b3 = db == 1 ? g.must_add("unsqueeze", {b}, A({{"dim", int64_t(1)}})) : b;
  const auto &sa = a3->meta.sizes, &sb = b3->meta.sizes;
  std::vector<Expr> ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2), batch;
  std::string err;
  if (!broadcast_shapes({ba, bb}, batch, err)) throw std::runtime_error(err);
  Expr n_ = sa[sa.size() - 2], k = sa.back(), k2 = sb[sb.size() - 2], m = sb.back();
  if (k != k2)
    throw std::runtime_error("RuntimeError: Expected size for first two dimensions of batch2 tensor to be: [" +
                             sym::product(batch).str() + ", " + k.str() + "] but got: [" + sym::product(batch).str() +
                             ", " + k2.str() + "].");
  std::vector<Expr> ea = batch, eb = batch;
  ea.insert(ea.end(), {n_, k});
  eb.insert(eb.end(), {k, m});
  Expr B = sym::product(batch);
  Node* x = reshape(g, expand(g, a3, ea), {B, n_, k});
  Node* y = reshape(g, expand(g, b3, eb), {B, k, m});
  Node* r = g.must_add("bmm", {x, y});
  std::vector<Expr> out = batch;
  if (da > 1) out.push_back(n_);
  if (db > 1) out.push_back(m);
  return reshape(g, r, out);
}

// baddbmm: beta * input + alpha * bmm(batch1, batch2), the input broadcast over the product (a
// model's ALiBi bias over its attention scores). beta = 0 leaves the input out (nan in it does not
// reach the result), as torch's kernel. The product's sizes and the input's meet as any
// broadcast's do, in size symbols: a growing cache length equal to the mask's is one fact.
Node* decompose_baddbmm(Graph& g, Node* n) {
  Node *in = n->inputs[0], *b1 = n->inputs[1], *b2 = n->inputs[2];
  if (in->meta.dtype != b1->meta.dtype || b1->meta.dtype != b2->meta.dtype)
    throw std::runtime_error(std::string("RuntimeError: Input dtypes must be the same, got: input ") + dtype_name(in->meta.dtype) +
                             ", batch1: " + dtype_name(b1->meta.dtype) + ", batch2: " + dtype_name(b2->meta.dtype));
  if (b1->meta.dim() != 3 || b2->meta.dim() != 3) throw std::runtime_error("RuntimeError: batch1 and batch2 must be 3D tensors");
  const double beta = n->attrs.get_float("beta", 1), alpha = n->attrs.get_float("alpha", 1);
  // an integer product scaled by integers stays integer, as torch's
  const DType scalar_type = is_floating(b1->meta.dtype) ? DType::Float64 : DType::Int64;
  Node* product = g.must_add("bmm", {b1, b2});
  if (alpha != 1) product = g.must_add("mul", {product, g.scalar(alpha, scalar_type)});
  if (beta == 0) return product;
  Node* base = beta == 1 ? in : g.must_add("mul", {in, g.scalar(beta, scalar_type)});
  return g.must_add("add", {base, product});
}

Node* decompose_linear(Graph& g, Node* n) {
  Node *x = n->inputs[0], *w = n->inputs[1], *b = n->inputs.size() > 2 ? n->inputs[2] : nullptr;
  Node* wt = g.must_add("transpose", {w}, A({{"dim0", int64_t(0)}, {"dim1", int64_t(1)}}));
  if (w->meta.dim() != 2) throw std::runtime_error("kiln: linear with a non-matrix weight");
  if (b && x->meta.dim() >= 2) {
    std::vector<Expr> sx = x->meta.sizes;
    Node* x2 = x->meta.dim() == 2 ? x : reshape(g, x, {sym::product({sx.begin(), sx.end() - 1}), sx.back()});
    Node* r = g.must_add("addmm", {b, x2, wt});
    if (x->meta.dim() == 2) return r;
    std::vector<Expr> out(sx.begin(), sx.end() - 1);
    out.push_back(w->meta.sizes[0]);
    return reshape(g, r, out);
  }
  Node* r = g.must_add("matmul", {x, wt});  // decomposed in turn by the pass
  return b ? g.must_add("add", {r, b}) : r;
}

Node* maybe_convert(Graph& g, Node* x, const Node* n) {
  if (auto t = n->attrs.get_dtype("dtype")) return g.must_add("convert", {x}, A({{"dtype", *t}}));
  return x;
}

// A 16-bit float tensor converted to float32 (the dtype its kernels compute in); others as they are.
Node* to_compute_dtype(Graph& g, Node* x) {
  const DType ct = compute_dtype(x->meta.dtype);
  return ct == x->meta.dtype ? x : g.must_add("convert", {x}, A({{"dtype", ct}}));
}

void require_float(const Node* x, const std::string& op) {
  if (!is_floating(x->meta.dtype))
    throw std::runtime_error("RuntimeError: \"" + op + "_lastdim_kernel_impl\" not implemented for '" +
                             std::string(dtype_name(x->meta.dtype)) + "'");
}

Node* decompose_softmax(Graph& g, Node* n, bool log) {
  Node* x = maybe_convert(g, n->inputs[0], n);
  require_float(x, log ? "log_softmax" : "softmax");
  int64_t d = n->attrs.get_int("dim");
  std::string err;
  if (!wrap_dim(d, x->meta.dim(), err)) throw std::runtime_error(err);
  Ints dim{d};
  if (x->meta.dim() == 0) dim = {};
  // torch's kernels compute a 16-bit softmax in float and round the result once.
  const DType t = x->meta.dtype;
  x = to_compute_dtype(g, x);
  Node* m = g.must_add("amax", {x}, A({{"dim", dim}, {"keepdim", true}}));
  Node* shifted = g.must_add("sub", {x, m});
  Node* e = g.must_add("exp", {shifted});
  Node* s = g.must_add("sum", {e}, A({{"dim", dim}, {"keepdim", true}}));
  Node* r = log ? g.must_add("sub", {shifted, g.must_add("log", {s})}) : g.must_add("div", {e, s});
  if (r->meta.dtype != t) r = g.must_add("convert", {r}, A({{"dtype", t}}));
  // torch's softmax kernels write a row-major result, whatever the input's layout
  if (r->meta.strides != ir::contiguous_strides(r->meta.sizes)) r = g.must_add("contiguous", {r});
  return r;
}

Node* decompose_mean(Graph& g, Node* n) {
  Node* x = maybe_convert(g, n->inputs[0], n);
  if (!is_floating(x->meta.dtype))
    throw std::runtime_error(std::string("RuntimeError: mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: ") +
                             dtype_name(x->meta.dtype));
  Attrs a;
  if (n->attrs.has("dim")) a.set("dim", n->attrs.get_ints("dim"));
  a.set("keepdim", n->attrs.get_bool("keepdim"));
  const DType t = x->meta.dtype;
  x = to_compute_dtype(g, x);  // a 16-bit mean divides in float and rounds once, as torch's
  Node* s = g.must_add("sum", {x}, a);
  Expr count = sym::floordiv(x->meta.numel(), sym::max(s->meta.numel(), Expr(1)));
  Node* r = g.must_add("div", {s, g.size_value(count, DType::Int64)});
  return r->meta.dtype == t ? r : g.must_add("convert", {r}, A({{"dtype", t}}));
}

}  // namespace

OpDef composite_op(const std::string& name, const std::string& schema, DecomposeFn fn, std::vector<std::string> py) {
  OpDef d;
  d.name = name;
  d.schema = Schema::parse(schema);
  d.kind = OpKind::Composite;
  d.promotion = Promotion::None;
  d.decompose = std::move(fn);
  d.python = std::move(py);
  infer_by_decomposition(d);
  return d;
}

void infer_by_decomposition(OpDef& d) {
  DecomposeFn fn = d.decompose;
  std::string name = d.name;
  d.infer = [fn, name](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    Graph scratch;
    Node fake;
    fake.op = find_op(name);
    fake.attrs = a;
    for (Node* x : in) fake.inputs.push_back(x ? scratch.placeholder("x", x->meta) : nullptr);
    try {
      Node* r = fn(scratch, &fake);
      out = r->meta;
      out.wrapped_number = false;
      return true;
    } catch (const std::exception& e) {
      err = e.what();
      return false;
    }
  };
}

std::vector<OpDef> composite_ops() {
  std::vector<OpDef> ops;
  ops.push_back(composite_op("matmul", "matmul(Tensor self, Tensor other)", decompose_matmul,
                          {"torch.matmul", "Tensor.matmul", "Tensor.__matmul__"}));
  ops.back().keeps_inputs = {{1}, {0}};  // as the mm, bmm or dot it becomes, through views
  ops.push_back(composite_op("baddbmm", "baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1)",
                             decompose_baddbmm, {"torch.baddbmm", "Tensor.baddbmm"}));
  ops.push_back(composite_op("linear", "linear(Tensor input, Tensor weight, Tensor? bias=None)", decompose_linear,
                          {"torch.nn.functional.linear"}));
  ops.back().keeps_inputs = {{1}, {0}, {}};
  ops.push_back(composite_op("softmax", "softmax(Tensor self, int dim, *, ScalarType? dtype=None)",
                          [](Graph& g, Node* n) { return decompose_softmax(g, n, false); },
                          {"torch.softmax", "torch.nn.functional.softmax", "Tensor.softmax", "torch.special.softmax"}));
  ops.back().saves_result = true;
  ops.push_back(composite_op("log_softmax", "log_softmax(Tensor self, int dim, *, ScalarType? dtype=None)",
                          [](Graph& g, Node* n) { return decompose_softmax(g, n, true); },
                          {"torch.log_softmax", "torch.nn.functional.log_softmax", "Tensor.log_softmax"}));
  ops.back().saves_result = true;
  ops.push_back(composite_op("mean", "mean(Tensor self, int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)",
                          decompose_mean, {"torch.mean", "Tensor.mean"}));
  ops.push_back(composite_op(
      "t", "t(Tensor self)",
      [](Graph& g, Node* n) -> Node* {
        Node* x = n->inputs[0];
        if (x->meta.dim() > 2)
          throw std::runtime_error("RuntimeError: t() expects a tensor with <= 2 dimensions, but self is " +
                                   std::to_string(x->meta.dim()) + "D");
        if (x->meta.dim() < 2) return x;
        return g.must_add("transpose", {x}, A({{"dim0", int64_t(0)}, {"dim1", int64_t(1)}}));
      },
      {"torch.t", "Tensor.t"}));
  ops.back().may_alias = true;
  ops.push_back(composite_op(
      "flatten", "flatten(Tensor self, int start_dim=0, int end_dim=-1)",
      [](Graph& g, Node* n) -> Node* {
        Node* x = n->inputs[0];
        int64_t s = n->attrs.get_int("start_dim", 0), e = n->attrs.get_int("end_dim", -1);
        std::string err;
        if (!wrap_dim(s, x->meta.dim(), err) || !wrap_dim(e, x->meta.dim(), err)) throw std::runtime_error(err);
        if (s > e) throw std::runtime_error("RuntimeError: flatten() has invalid args: start_dim cannot come after end_dim");
        if (x->meta.dim() == 0) return reshape(g, x, {Expr(1)});
        if (s == e) return x;
        std::vector<Expr> out(x->meta.sizes.begin(), x->meta.sizes.begin() + s);
        out.push_back(sym::product({x->meta.sizes.begin() + s, x->meta.sizes.begin() + e + 1}));
        out.insert(out.end(), x->meta.sizes.begin() + e + 1, x->meta.sizes.end());
        return reshape(g, x, out);
      },
      {"torch.flatten", "Tensor.flatten"}));
  ops.back().may_alias = true;
  ops.back().copies = reshape_copies;  // a flatten of a transposed tensor copies (fuzz seed 505253)
  ops.push_back(composite_op(
      "clamp", "clamp(Tensor self, Scalar? min=None, Scalar? max=None)",
      [](Graph& g, Node* n) -> Node* {
        // maximum/minimum with Python-number bounds: torch's promotion and NaN propagation.
        Node* x = n->inputs[0];
        auto bound = [&](const char* key) -> Node* {
          const ir::AttrValue* v = n->attrs.find(key);
          if (!v) return nullptr;
          if (auto* i = std::get_if<int64_t>(v)) return g.scalar(static_cast<double>(*i), DType::Int64);
          if (auto* b = std::get_if<bool>(v)) return g.scalar(*b, DType::Bool);
          return g.scalar(n->attrs.get_float(key), DType::Float64);
        };
        Node *lo = bound("min"), *hi = bound("max");
        if (!lo && !hi) throw std::runtime_error("RuntimeError: torch.clamp: At least one of 'min' or 'max' must not be None");
        const Node* self = x;
        if (lo) x = g.must_add("maximum", {x, lo});
        if (hi) x = g.must_add("minimum", {x, hi});
        // torch's scalar-bound kernels have no bool instance (a number bound promotes out of
        // bool; a tensor bound goes through maximum/minimum, which have one), empty or not
        if (x->meta.dtype == DType::Bool)
          throw std::runtime_error(std::string("NotImplementedError: \"clamp") + (lo && hi ? "" : lo ? "_min" : "_max") +
                                   "_scalar_" + (self->meta.device.type == DeviceType::CUDA ? "cuda" : "cpu") +
                                   "\" not implemented for 'Bool'");
        return x;
      },
      {"torch.clamp", "torch.clip", "Tensor.clamp", "Tensor.clip"}));
  // torch's clamp backward with Python-number bounds: the gradient where min < x < max, zero
  // outside and at NaN; at the bounds themselves torch 2.11 passes it and 2.14 does not
  // (torch_facts()). maximum and minimum would halve it there.
  ops.back().keeps_inputs = {{0}};  // clamp_backward(grad, self, min, max)
  ops.back().derivative = [](Graph& g, Node* n, Node* grad) {
    Node* x = n->inputs[0];
    Node* inside = nullptr;
    const bool at_bounds = torch_facts().clamp_gradient_at_bounds;
    for (const auto& [key, cmp] : {std::pair<const char*, const char*>{"min", at_bounds ? "ge" : "gt"},
                                   {"max", at_bounds ? "le" : "lt"}}) {
      if (!n->attrs.find(key)) continue;
      Node* ok = g.must_add(cmp, {x, g.scalar(n->attrs.get_float(key), DType::Float64)});
      inside = inside ? g.must_add("logical_and", {inside, ok}) : ok;
    }
    return std::vector<Node*>{grad_ops::only_where(g, inside, grad)};
  };
  ops.push_back(composite_op(
      "masked_fill", "masked_fill(Tensor self, Tensor mask, Tensor value)",
      [](Graph& g, Node* n) -> Node* {
        Node *x = n->inputs[0], *mask = n->inputs[1], *value = n->inputs[2];
        if (mask->meta.dtype != DType::Bool) throw std::runtime_error("RuntimeError: masked_fill_ only supports boolean masks, but got mask with dtype " + std::string(dtype_name(mask->meta.dtype)));
        Node* r = g.must_add("where", {mask, value, x});
        if (r->meta.sizes != x->meta.sizes) throw std::runtime_error("kiln: masked_fill mask broadcasts beyond self");
        if (r->meta.dtype != x->meta.dtype) r = g.must_add("convert", {r}, A({{"dtype", x->meta.dtype}}));
        return r;
      },
      {"torch.masked_fill", "Tensor.masked_fill"}));
  return ops;
}

}  // namespace kiln::ops
