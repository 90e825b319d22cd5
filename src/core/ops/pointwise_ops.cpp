// Elementwise ops. Each entry: schema, type promotion, scalar body, torch callables.
#include <cmath>

#include "core/ops/derivatives.h"
#include "core/ops/registry.h"

namespace kiln::ops {
namespace {

using loop::ScalarCtx;
using loop::SOp;
using loop::SRef;


// The dtype the operands of a pointwise node are converted to (torch's common dtype).
DType common_dtype(const Node& n) {
  return n.op->promotion == Promotion::AlwaysBool ? pointwise_common_dtype(n.inputs) : n.meta.dtype;
}

// The dtype the arithmetic of a pointwise node runs in.
DType arith_dtype(const Node& n) { return compute_dtype(common_dtype(n)); }

// An operand as the arithmetic reads it. torch's CPU kernels convert every operand to the common
// dtype first: a Python number or a wider tensor in a 16-bit op is rounded to the 16-bit type
// (x_f16 + 0.1 adds 0.0999755859375), then computed in float; except where a kernel reads a
// scalar operand at full precision (`full_scalars`: mul and div). (Not taken on the GPU:
// torch's CUDA kernels' choices are unchecked here.)
SRef operand(ScalarCtx& s, SRef a, const Node& n, bool full_scalars = false) {
  const DType common = common_dtype(n);
  if (!full_scalars && is_16bit_float(common) && n.meta.device.type == DeviceType::CPU) a = s.cast(a, common);
  return s.cast(a, compute_dtype(common));
}

std::vector<SRef> operands(ScalarCtx& s, const std::vector<SRef>& args, const Node& n, bool full_scalars = false) {
  std::vector<SRef> out;
  for (SRef a : args) out.push_back(operand(s, a, n, full_scalars));
  return out;
}

OpDef unary(const std::string& name, SOp op, Promotion p, std::vector<std::string> py) {
  OpDef d;
  d.name = name;
  d.schema = Schema::parse(name + "(Tensor self)");
  d.kind = OpKind::Pointwise;
  d.promotion = p;
  d.scalar = [op](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
    return s.unary(op, operand(s, a[0], n));
  };
  d.python = std::move(py);
  return d;
}

OpDef binary(const std::string& name, SOp op, Promotion p, std::vector<std::string> py, const char* schema = nullptr) {
  OpDef d;
  d.name = name;
  d.schema = Schema::parse(schema ? schema : name + "(Tensor self, Tensor other)");
  d.kind = OpKind::Pointwise;
  d.promotion = p;
  d.scalar = [op](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
    auto x = operands(s, a, n);
    return s.binary(op, x[0], x[1]);
  };
  d.python = std::move(py);
  return d;
}

// alpha-scaled add/sub: self + alpha * other, as torch computes it.
OpDef add_like(const std::string& name, SOp op, std::vector<std::string> py) {
  OpDef d = binary(name, op, Promotion::Default, std::move(py),
                   (name + "(Tensor self, Tensor other, *, Scalar alpha=1)").c_str());
  d.infer = [name](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    if (!infer_pointwise(*find_op(name), in, a, out, err)) return false;
    if (name == "sub" && in[0]->meta.dtype == DType::Bool && in[1]->meta.dtype == DType::Bool) {
      err = "RuntimeError: Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead.";
      return false;
    }
    if (name == "sub" && (in[0]->meta.dtype == DType::Bool || in[1]->meta.dtype == DType::Bool)) {
      err = "RuntimeError: Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.";
      return false;
    }
    // torch checks alpha's Python type against the result's: a float alpha (even 1.0) for an
    // integer result, and a bool alpha for a non-bool one, are errors.
    if (const ir::AttrValue* alpha = a.find("alpha")) {
      if (std::holds_alternative<double>(*alpha) && !is_floating(out.dtype)) {
        err = "RuntimeError: For integral input tensors, argument alpha must not be a floating point number.";
        return false;
      }
      if (std::holds_alternative<bool>(*alpha) && out.dtype != DType::Bool) {
        err = "RuntimeError: Boolean alpha only supported for Boolean results.";
        return false;
      }
    }
    return true;
  };
  d.scalar = [op](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
    DType t = arith_dtype(n);
    auto x = operands(s, a, n);
    SRef other = x[1];
    if (n.attrs.has("alpha") && n.attrs.get_float("alpha", 1) != 1.0)
      other = s.binary(SOp::Mul, other, s.constant(n.attrs.get_float("alpha"), t));
    if (t == DType::Bool) return s.binary(SOp::Or, x[0], other);
    return s.binary(op, x[0], other);
  };
  return d;
}

// x ** c for a constant exponent takes torch's own shortcuts, so results match eager exactly.
// `roots`: whether torch's kernel takes c = +-0.5 as a square root; its CPU kernel does not for
// float16 (pow(-inf, 0.5) is then inf, and pow(-0.0, 0.5) +0.0).
SRef pow_scalar(ScalarCtx& s, SRef x, SRef e, DType t, bool roots) {
  const auto& en = s[e];
  if (en.op == SOp::Const && is_floating(t)) {
    double c = is_floating(en.dtype) ? en.fval : static_cast<double>(en.ival);
    if (c == 1.0) return x;
    if (c == 2.0) return s.binary(SOp::Mul, x, x);
    if (c == 3.0) return s.binary(SOp::Mul, s.binary(SOp::Mul, x, x), x);
    if (c == 0.5 || c == -0.5) {
      SRef root = s.unary(c > 0 ? SOp::Sqrt : SOp::Rsqrt, x);
      if (roots) return root;
      // pow's own values where they differ from the root's (the C compiler would turn a
      // pow(x, 0.5) it can see into sqrt(x) anyway): pow(-inf, 0.5) = inf, pow(-0.0, 0.5) = +0.0,
      // pow(-inf, -0.5) = +0.0, pow(-0.0, -0.5) = +inf.
      auto k = [&](double v) { return s.constant(v, t); };
      SRef at_neg_inf = s.binary(SOp::Eq, x, k(-INFINITY));
      if (c > 0) return s.where(at_neg_inf, k(INFINITY), s.binary(SOp::Add, root, k(0.0)));
      return s.where(at_neg_inf, k(0.0), s.where(s.binary(SOp::Eq, x, k(0.0)), k(INFINITY), root));
    }
    if (c == -1.0) return s.unary(SOp::Reciprocal, x);
    if (c == -2.0) return s.unary(SOp::Reciprocal, s.binary(SOp::Mul, x, x));
  }
  return s.binary(SOp::Pow, x, s.cast(e, t));
}

SRef gelu_body(ScalarCtx& s, SRef x, DType t, bool tanh_approx) {
  auto c = [&](double v) { return s.constant(v, t); };
  if (tanh_approx) {
    // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    SRef x3 = s.binary(SOp::Mul, s.binary(SOp::Mul, x, x), x);
    SRef inner = s.binary(SOp::Mul, c(0.7978845608028654), s.binary(SOp::Add, x, s.binary(SOp::Mul, c(0.044715), x3)));
    return s.binary(SOp::Mul, s.binary(SOp::Mul, c(0.5), x), s.binary(SOp::Add, c(1.0), s.unary(SOp::Tanh, inner)));
  }
  // 0.5 * x * (1 + erf(x / sqrt(2)))
  SRef e = s.unary(SOp::Erf, s.binary(SOp::Mul, x, c(0.70710678118654752440)));
  return s.binary(SOp::Mul, s.binary(SOp::Mul, x, c(0.5)), s.binary(SOp::Add, c(1.0), e));
}

// Whether torch runs its float32 gelu of `in` through a contiguous-tensor kernel of a form of its
// own (TorchNumerics::gelu_contiguous_f32): a CPU tensor of 2+ elements, row-major dense.
bool torch_gelu_kernel(const ScalarCtx& s, const ir::Node& in, DType t, bool tanh_approx) {
  if (tanh_approx || t != DType::Float32 || s.torch.gelu_contiguous_f32 == loop::TorchNumerics::GeluForm::Plain)
    return false;
  const ir::TensorMeta& m = in.meta;
  if (m.device.type != DeviceType::CPU || m.dtype != DType::Float32 || m.strides.size() != m.sizes.size()) return false;
  // Row-major dense, symbolic sizes included (a symbolic size is at least 2).
  Expr expect = 1;
  for (size_t i = m.sizes.size(); i-- > 0;) {
    if (!m.sizes[i].is_const(1) && m.strides[i] != expect) return false;
    expect = expect * m.sizes[i];
  }
  auto numel = expect.as_const();
  return !numel || *numel >= 2;
}

// That kernel's gelu. NanForInf: x * (1 + erf(x / sqrt(2))) halved afterwards (the same number,
// but overflowing to inf past 1.7e38 as torch's does) and NaN for +inf. SplitHalf: x/2 plus x/2
// times erf, whose sum turns gelu(-0.0) into +0.0, as torch's gives it.
SRef torch_gelu_kernel_body(ScalarCtx& s, SRef x, DType t) {
  auto c = [&](double v) { return s.constant(v, t); };
  SRef e = s.unary(SOp::Erf, s.binary(SOp::Mul, x, c(0.70710678118654752440)));
  if (s.torch.gelu_contiguous_f32 == loop::TorchNumerics::GeluForm::SplitHalf) {
    SRef half = s.binary(SOp::Mul, x, c(0.5));
    return s.binary(SOp::Add, half, s.binary(SOp::Mul, half, e));
  }
  SRef g = s.binary(SOp::Mul, s.binary(SOp::Mul, x, s.binary(SOp::Add, c(1.0), e)), c(0.5));
  return s.where(s.binary(SOp::Eq, x, c(INFINITY)), c(NAN), g);
}

}  // namespace

// NotImplementedError for a bool division kernel torch does not have ("div_floor_cpu").
static std::string no_bool_division(const std::string& kernel, const TensorMeta& out) {
  return "NotImplementedError: \"" + kernel + "_" + (out.device.type == DeviceType::CUDA ? "cuda" : "cpu") +
         "\" not implemented for 'Bool'";
}

// An integer division (or remainder) on the CPU raises torch's ZeroDivisionError for a zero
// divisor, whether or not its result is used: such a node runs even when dead.
static bool integer_division_on_cpu(const Node& n) {
  return !is_floating(n.meta.dtype) && n.meta.device.type == DeviceType::CPU;
}

std::vector<OpDef> pointwise_ops() {
  std::vector<OpDef> ops;
  auto U = [&](const char* n, SOp op, Promotion p, std::vector<std::string> py, DerivativeFn d = nullptr) {
    ops.push_back(unary(n, op, p, std::move(py)));
    ops.back().derivative = std::move(d);
  };
  const Promotion F = Promotion::IntToFloat, D = Promotion::Default;
  using namespace grad_ops;
  // A unary op's derivative from d(result)/d(input), given the input x and the result y.
  auto chain = [](ir::Node* (*local)(Graph& g, Node* x, Node* y)) -> DerivativeFn {
    return [local](Graph& g, Node* n, Node* grad) { return std::vector<Node*>{mul(g, grad, local(g, n->inputs[0], n))}; };
  };
  // Steps (floor, ceil, trunc): torch's zeros_like(grad), zero where grad is NaN too.
  auto zero = [](Graph& g, Node*, Node* grad) { return std::vector<Node*>{zeros_like(g, grad->meta)}; };
  // The op just added saves its result for backward in torch (derivatives.yaml's `result`).
  auto saves_result = [&] { ops.back().saves_result = true; };
  // The op just added keeps its input for its own gradient (derivatives.yaml's `self`).
  auto keeps_input = [&] { ops.back().keeps_inputs = {{0}}; };

  U("exp", SOp::Exp, F, {"torch.exp", "Tensor.exp"}, chain([](Graph&, Node*, Node* y) { return y; }));
  saves_result();
  U("exp2", SOp::Exp2, F, {"torch.exp2", "Tensor.exp2"},
    chain([](Graph& g, Node*, Node* y) { return scaled(g, y, 0.6931471805599453); }));
  saves_result();
  U("expm1", SOp::Expm1, F, {"torch.expm1", "Tensor.expm1"},
    chain([](Graph& g, Node*, Node* y) { return add(g, y, num(g, 1.0)); }));
  saves_result();
  U("log", SOp::Log, F, {"torch.log", "Tensor.log"},
    chain([](Graph& g, Node* x, Node*) { return unary(g, "reciprocal", x); }));
  keeps_input();
  U("log2", SOp::Log2, F, {"torch.log2", "Tensor.log2"},
    chain([](Graph& g, Node* x, Node*) { return unary(g, "reciprocal", scaled(g, x, 0.6931471805599453)); }));
  keeps_input();
  U("log1p", SOp::Log1p, F, {"torch.log1p", "Tensor.log1p"},
    chain([](Graph& g, Node* x, Node*) { return unary(g, "reciprocal", add(g, x, num(g, 1.0))); }));
  keeps_input();
  U("sin", SOp::Sin, F, {"torch.sin", "Tensor.sin"}, chain([](Graph& g, Node* x, Node*) { return unary(g, "cos", x); }));
  keeps_input();
  U("cos", SOp::Cos, F, {"torch.cos", "Tensor.cos"},
    chain([](Graph& g, Node* x, Node*) { return neg(g, unary(g, "sin", x)); }));
  keeps_input();
  U("tan", SOp::Tan, F, {"torch.tan", "Tensor.tan"},
    chain([](Graph& g, Node*, Node* y) { return add(g, mul(g, y, y), num(g, 1.0)); }));
  saves_result();
  U("tanh", SOp::Tanh, F, {"torch.tanh", "Tensor.tanh", "torch.nn.functional.tanh"},
    chain([](Graph& g, Node*, Node* y) { return sub(g, num(g, 1.0), mul(g, y, y)); }));
  saves_result();
  U("sigmoid", SOp::Sigmoid, F, {"torch.sigmoid", "Tensor.sigmoid", "torch.nn.functional.sigmoid"},
    chain([](Graph& g, Node*, Node* y) { return mul(g, y, sub(g, num(g, 1.0), y)); }));
  saves_result();
  U("sqrt", SOp::Sqrt, F, {"torch.sqrt", "Tensor.sqrt"},
    chain([](Graph& g, Node*, Node* y) { return unary(g, "reciprocal", scaled(g, y, 2.0)); }));
  saves_result();
  U("rsqrt", SOp::Rsqrt, F, {"torch.rsqrt", "Tensor.rsqrt"},
    chain([](Graph& g, Node*, Node* y) { return scaled(g, mul(g, y, mul(g, y, y)), -0.5); }));
  saves_result();
  U("erf", SOp::Erf, F, {"torch.erf", "Tensor.erf", "torch.special.erf"},
    chain([](Graph& g, Node* x, Node*) { return scaled(g, unary(g, "exp", neg(g, mul(g, x, x))), 1.1283791670955126); }));
  keeps_input();
  U("reciprocal", SOp::Reciprocal, F, {"torch.reciprocal", "Tensor.reciprocal"},
    chain([](Graph& g, Node*, Node* y) { return neg(g, mul(g, y, y)); }));
  saves_result();
  // torch's grad * sgn(x), sgn 0 at 0 and at nan: there the gradient is grad * 0, nan where the
  // incoming gradient is nan or infinite (grad_fuzz seed 491875).
  U("abs", SOp::Abs, D, {"torch.abs", "Tensor.abs", "Tensor.__abs__"}, [](Graph& g, Node* n, Node* grad) {
    Node* x = n->inputs[0];
    Node* pos = g.must_add("where", {g.must_add("gt", {x, num(g, 0.0)}), grad, scaled(g, grad, 0.0)});
    return std::vector<Node*>{g.must_add("where", {g.must_add("lt", {x, num(g, 0.0)}), neg(g, grad), pos})};
  });
  keeps_input();
  U("floor", SOp::Floor, D, {"torch.floor", "Tensor.floor"}, zero);
  U("ceil", SOp::Ceil, D, {"torch.ceil", "Tensor.ceil"}, zero);
  U("trunc", SOp::Trunc, D, {"torch.trunc", "Tensor.trunc"}, zero);
  U("logical_not", SOp::Not, Promotion::AlwaysBool, {"torch.logical_not", "Tensor.logical_not"});
  {
    OpDef neg = unary("neg", SOp::Neg, D, {"torch.neg", "Tensor.neg", "torch.negative", "Tensor.__neg__"});
    neg.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      if (in[0]->meta.dtype == DType::Bool) {
        err = "RuntimeError: Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.";
        return false;
      }
      return infer_pointwise(*find_op("neg"), in, a, out, err);
    };
    neg.derivative = [](Graph& g, Node*, Node* grad) { return std::vector<Node*>{grad_ops::neg(g, grad)}; };
    ops.push_back(neg);
  }
  {
    OpDef relu = unary("relu", SOp::Relu, D, {"torch.relu", "Tensor.relu", "torch.nn.functional.relu"});
    relu.schema = Schema::parse("relu(Tensor self, bool inplace=False)");
    // Except where the result is at most 0, as torch's threshold_backward (result <= 0 ? 0 : grad):
    // a NaN result passes the gradient on (grad fuzz seed 531148).
    relu.derivative = [](Graph& g, Node* n, Node* grad) {
      Node* blocked = g.must_add("le", {n, grad_ops::num(g, 0.0)});
      return std::vector<Node*>{g.must_add("where", {blocked, grad_ops::num(g, 0.0), grad})};
    };
    ops.push_back(relu);
    saves_result();
  }
  {
    OpDef g;
    g.name = "gelu";
    g.schema = Schema::parse("gelu(Tensor self, *, str approximate='none')");
    g.kind = OpKind::Pointwise;
    g.promotion = D;
    g.scalar = [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
      DType t = arith_dtype(n);
      const bool tanh_approx = n.attrs.get_str("approximate", "none") == "tanh";
      if (torch_gelu_kernel(s, *n.inputs[0], t, tanh_approx)) return torch_gelu_kernel_body(s, s.cast(a[0], t), t);
      return gelu_body(s, s.cast(a[0], t), t, tanh_approx);
    };
    g.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      std::string ap = a.get_str("approximate", "none");
      if (ap != "none" && ap != "tanh") {
        err = "RuntimeError: approximate argument must be either none or tanh.";
        return false;
      }
      return infer_pointwise(*find_op("gelu"), in, a, out, err);
    };
    g.python = {"torch.nn.functional.gelu", "Tensor.gelu"};
    g.derivative = [](Graph& gr, Node* n, Node* grad) {
      using namespace grad_ops;
      Node* x = n->inputs[0];
      if (n->attrs.get_str("approximate", "none") == "tanh") {
        // y = x/2 (1 + tanh(k (x + c x^3))): y' = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3c x^2)
        const double k = 0.7978845608028654, c = 0.044715;
        Node* x2 = mul(gr, x, x);
        Node* t = unary(gr, "tanh", scaled(gr, add(gr, x, scaled(gr, mul(gr, x2, x), c)), k));
        Node* inner = scaled(gr, add(gr, scaled(gr, x2, 3 * c), num(gr, 1.0)), k);
        Node* d = add(gr, scaled(gr, add(gr, t, num(gr, 1.0)), 0.5),
                      mul(gr, scaled(gr, x, 0.5), mul(gr, sub(gr, num(gr, 1.0), mul(gr, t, t)), inner)));
        return std::vector<Node*>{mul(gr, grad, d)};
      }
      // y = x Phi(x): y' = Phi(x) + x phi(x)
      Node* cdf = scaled(gr, add(gr, unary(gr, "erf", scaled(gr, x, 0.7071067811865476)), num(gr, 1.0)), 0.5);
      Node* pdf = scaled(gr, unary(gr, "exp", scaled(gr, mul(gr, x, x), -0.5)), 0.3989422804014327);
      return std::vector<Node*>{mul(gr, grad, add(gr, cdf, mul(gr, x, pdf)))};
    };
    g.keeps_inputs = {{0}};  // gelu_backward(grad, self)
    ops.push_back(g);
  }

  // Activations, as torch's kernels compute them. Each one's backward reads its input (torch's
  // *_backward(grad, self, ...) keeps self; the in-place forms keep the result, which is the
  // input after the op's own update: both are stale after a later in-place change).
  auto activation = [&](const char* name, const char* schema, std::vector<std::string> py, ScalarFn body,
                        DerivativeFn derivative) {
    OpDef d;
    d.derivative = std::move(derivative);
    d.keeps_inputs = {{0}};
    d.name = name;
    d.schema = Schema::parse(schema);
    d.kind = OpKind::Pointwise;
    d.promotion = Promotion::IntToFloat;
    d.scalar = [body](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
      return body(s, {operand(s, a[0], n)}, n);
    };
    d.python = std::move(py);
    ops.push_back(d);
  };
  activation("silu", "silu(Tensor self, bool inplace=False)", {"torch.nn.functional.silu"},
             [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
               return s.binary(SOp::Div, a[0], s.binary(SOp::Add, s.constant(1, s.dtype(a[0])), s.unary(SOp::Exp, s.unary(SOp::Neg, a[0]))));
             },
             [](Graph& g, Node* n, Node* grad) {  // s (1 + x (1 - s)), s = sigmoid(x)
               using namespace grad_ops;
               Node* x = n->inputs[0];
               Node* sg = unary(g, "sigmoid", x);
               return std::vector<Node*>{mul(g, grad, mul(g, sg, add(g, mul(g, x, sub(g, num(g, 1.0), sg)), num(g, 1.0))))};
             });
  activation("hardsigmoid", "hardsigmoid(Tensor self, bool inplace=False)", {"torch.nn.functional.hardsigmoid"},
             [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
               DType t = s.dtype(a[0]);
               SRef r = s.binary(SOp::Min, s.binary(SOp::Max, s.binary(SOp::Add, a[0], s.constant(3, t)), s.constant(0, t)), s.constant(6, t));
               return s.binary(SOp::Div, r, s.constant(6, t));
             },
             [](Graph& g, Node* n, Node* grad) {  // 1/6 strictly inside (-3, 3), as torch's
               using namespace grad_ops;
               Node* x = n->inputs[0];
               Node* inside = g.must_add("logical_and", {g.must_add("gt", {x, num(g, -3.0)}), g.must_add("lt", {x, num(g, 3.0)})});
               return std::vector<Node*>{only_where(g, inside, scaled(g, grad, 1.0 / 6.0))};
             });
  activation("hardswish", "hardswish(Tensor self, bool inplace=False)", {"torch.nn.functional.hardswish"},
             [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
               DType t = s.dtype(a[0]);
               SRef r = s.binary(SOp::Min, s.binary(SOp::Max, s.binary(SOp::Add, a[0], s.constant(3, t)), s.constant(0, t)), s.constant(6, t));
               return s.binary(SOp::Div, s.binary(SOp::Mul, a[0], r), s.constant(6, t));
             },
             [](Graph& g, Node* n, Node* grad) {  // 0 below -3, x/3 + 1/2 up to 3, then 1 (torch's)
               using namespace grad_ops;
               Node* x = n->inputs[0];
               Node* mid = mul(g, grad, add(g, scaled(g, x, 1.0 / 3.0), num(g, 0.5)));
               Node* upper = g.must_add("where", {g.must_add("le", {x, num(g, 3.0)}), mid, grad});
               return std::vector<Node*>{g.must_add("where", {g.must_add("lt", {x, num(g, -3.0)}), num(g, 0.0), upper})};
             });
  activation("leaky_relu", "leaky_relu(Tensor self, float negative_slope=0.01, bool inplace=False)", {"torch.nn.functional.leaky_relu"},
             [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
               DType t = s.dtype(a[0]);
               SRef neg = s.binary(SOp::Mul, a[0], s.constant(n.attrs.get_float("negative_slope", 0.01), t));
               return s.where(s.binary(SOp::Gt, a[0], s.constant(0, t)), a[0], neg);
             },
             [](Graph& g, Node* n, Node* grad) {
               using namespace grad_ops;
               Node* pos = g.must_add("gt", {n->inputs[0], num(g, 0.0)});
               return std::vector<Node*>{g.must_add("where", {pos, grad, scaled(g, grad, n->attrs.get_float("negative_slope", 0.01))})};
             });
  activation("elu", "elu(Tensor self, float alpha=1.0, bool inplace=False)", {"torch.nn.functional.elu"},
             [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
               DType t = s.dtype(a[0]);
               SRef neg = s.binary(SOp::Mul, s.unary(SOp::Expm1, a[0]), s.constant(n.attrs.get_float("alpha", 1.0), t));
               return s.where(s.binary(SOp::Gt, a[0], s.constant(0, t)), a[0], neg);
             },
             [](Graph& g, Node* n, Node* grad) {  // alpha e^x = y + alpha below 0
               using namespace grad_ops;
               Node* pos = g.must_add("gt", {n->inputs[0], num(g, 0.0)});
               Node* below = mul(g, grad, add(g, n, num(g, n->attrs.get_float("alpha", 1.0))));
               return std::vector<Node*>{g.must_add("where", {pos, grad, below})};
             });
  // hardtanh clamps into [min_val, max_val] (NaN stays NaN, as torch's clamp); relu6 is
  // hardtanh(x, 0, 6), what nn.ReLU6 (mobilenet_v2's activation) calls. Gradient: the incoming
  // one strictly inside the bounds, as torch's hardtanh_backward.
  auto clamp_between = [](double lo, double hi) {
    return [lo, hi](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
      DType t = s.dtype(a[0]);
      const double l = n.attrs.get_float("min_val", lo), h = n.attrs.get_float("max_val", hi);
      return s.binary(SOp::Min, s.binary(SOp::Max, a[0], s.constant(l, t)), s.constant(h, t));
    };
  };
  auto clamp_between_grad = [](double lo, double hi) {
    return [lo, hi](Graph& g, Node* n, Node* grad) {
      using namespace grad_ops;
      Node* x = n->inputs[0];
      Node* inside = g.must_add("logical_and", {g.must_add("gt", {x, num(g, n->attrs.get_float("min_val", lo))}),
                                                g.must_add("lt", {x, num(g, n->attrs.get_float("max_val", hi))})});
      return std::vector<Node*>{only_where(g, inside, grad)};
    };
  };
  activation("hardtanh", "hardtanh(Tensor self, float min_val=-1.0, float max_val=1.0, bool inplace=False)",
             {"torch.nn.functional.hardtanh"}, clamp_between(-1, 1), clamp_between_grad(-1, 1));
  activation("relu6", "relu6(Tensor self, bool inplace=False)", {"torch.nn.functional.relu6"}, clamp_between(0, 6),
             clamp_between_grad(0, 6));
  for (const char* name : {"hardtanh", "relu6"}) {
    // Integer tensors keep their dtype in torch's kernel: they run through it.
    auto it = std::find_if(ops.begin(), ops.end(), [&](const OpDef& d) { return d.name == name; });
    it->covers = [](const std::vector<Node*>& in, const Attrs&) { return in[0] && is_floating(in[0]->meta.dtype); };
  }
  activation("softplus", "softplus(Tensor self, float beta=1.0, float threshold=20.0)", {"torch.nn.functional.softplus"},
             [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
               DType t = s.dtype(a[0]);
               SRef beta = s.constant(n.attrs.get_float("beta", 1.0), t);
               SRef bx = s.binary(SOp::Mul, a[0], beta);
               SRef soft = s.binary(SOp::Div, s.unary(SOp::Log1p, s.unary(SOp::Exp, bx)), beta);
               return s.where(s.binary(SOp::Gt, bx, s.constant(n.attrs.get_float("threshold", 20.0), t)), a[0], soft);
             },
             [](Graph& g, Node* n, Node* grad) {  // sigmoid(beta x), 1 past the threshold
               using namespace grad_ops;
               Node* bx = scaled(g, n->inputs[0], n->attrs.get_float("beta", 1.0));
               Node* past = g.must_add("gt", {bx, num(g, n->attrs.get_float("threshold", 20.0))});
               return std::vector<Node*>{g.must_add("where", {past, grad, mul(g, grad, unary(g, "sigmoid", bx))})};
             });
  for (const char* name : {"add", "sub"}) {
    const bool plus = name[0] == 'a';
    OpDef d = add_like(name, plus ? SOp::Add : SOp::Sub,
                       plus ? std::vector<std::string>{"torch.add", "Tensor.add", "Tensor.__add__", "Tensor.__radd__"}
                            : std::vector<std::string>{"torch.sub", "torch.subtract", "Tensor.sub", "Tensor.__sub__"});
    d.derivative = [plus](Graph& g, Node* n, Node* grad) {
      const double alpha = n->attrs.get_float("alpha", 1.0);
      Node* other = alpha == 1.0 ? grad : scaled(g, grad, alpha);
      return std::vector<Node*>{grad, plus ? other : neg(g, other)};
    };
    ops.push_back(d);
  }
  {
    OpDef mul = binary("mul", SOp::Mul, D, {"torch.mul", "torch.multiply", "Tensor.mul", "Tensor.__mul__", "Tensor.__rmul__"});
    mul.derivative = [](Graph& g, Node* n, Node* grad) {
      return std::vector<Node*>{grad_ops::mul(g, grad, n->inputs[1]), grad_ops::mul(g, grad, n->inputs[0])};
    };
    mul.scalar = [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
      auto x = operands(s, a, n, /*full_scalars=*/true);
      return s.binary(n.meta.dtype == DType::Bool ? SOp::And : SOp::Mul, x[0], x[1]);
    };
    mul.keeps_inputs = {{1}, {0}};  // each for the other's gradient
    ops.push_back(mul);
  }
  {
    OpDef div = binary("div", SOp::Div, Promotion::None, {"torch.div", "torch.divide", "torch.true_divide", "Tensor.div", "Tensor.__truediv__"},
                       "div(Tensor self, Tensor other, *, str? rounding_mode=None)");
    div.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      if (!infer_pointwise(*find_op("div"), in, a, out, err)) return false;
      std::string mode = a.get_str("rounding_mode", "");
      if (mode.empty() && !is_floating(out.dtype)) out.dtype = default_float();
      if (!mode.empty() && mode != "trunc" && mode != "floor") {
        err = "ValueError: div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '" + mode + "'";
        return false;
      }
      // torch's rounding divisions have no bool kernel; found before a zero divisor is
      if (!mode.empty() && out.dtype == DType::Bool) return err = no_bool_division("div_" + mode, out), false;
      return true;
    };
    div.scalar = [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
      DType t = arith_dtype(n);
      auto x = operands(s, a, n, /*full_scalars=*/true);
      std::string mode = n.attrs.get_str("rounding_mode", "");
      if (mode.empty()) return s.binary(SOp::Div, x[0], x[1]);
      if (mode == "floor") return s.binary(SOp::FloorDiv, x[0], x[1]);  // torch's fmod-based rule for floats
      if (!is_floating(t)) return s.binary(SOp::TruncDiv, x[0], x[1]);
      return s.unary(SOp::Trunc, s.binary(SOp::Div, x[0], x[1]));
    };
    div.keep_unused = integer_division_on_cpu;
    // Rounding divisions are steps: no gradient flows (torch's grad.zero_(): zeros where the
    // incoming gradient is NaN too, grad_fuzz seed 523030).
    div.derivative = [](Graph& g, Node* n, Node* grad) {
      if (!n->attrs.get_str("rounding_mode", "").empty())
        return std::vector<Node*>{zeros_like(g, grad->meta), zeros_like(g, grad->meta)};
      Node* b = n->inputs[1];
      return std::vector<Node*>{grad_ops::div(g, grad, b), grad_ops::neg(g, grad_ops::div(g, grad_ops::mul(g, grad, n), b))};
    };
    div.keeps_inputs = {{1}, {0, 1}};  // other for both gradients, self for other's
    ops.push_back(div);
  }
  OpDef floor_divide = binary("floor_divide", SOp::FloorDiv, D, {"torch.floor_divide", "Tensor.floor_divide", "Tensor.__floordiv__"});
  floor_divide.scalar = [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
    auto x = operands(s, a, n, /*full_scalars=*/true);  // torch's CPU kernel reads a scalar divisor at full precision
    return s.binary(SOp::FloorDiv, x[0], x[1]);
  };
  for (OpDef d : {floor_divide, binary("remainder", SOp::Mod, D, {"torch.remainder", "Tensor.remainder", "Tensor.__mod__"})}) {
    // An integer division by a constant zero raises at capture, as eager raises whether or not
    // the result is used (a zero inside a tensor is found by the kernel).
    d.infer = [name = d.name](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      if (!infer_pointwise(*find_op(name), in, a, out, err)) {
        // floor_divide is torch's div with rounding_mode="floor": its error names that kernel
        if (name == "floor_divide" && err.rfind("NotImplementedError", 0) == 0) {
          Attrs floor;
          floor.set("rounding_mode", std::string("floor"));
          find_op("div")->infer(in, floor, out, err);
        }
        return false;
      }
      const Node* b = in[1];
      if (!is_floating(out.dtype) && b->op->name == "scalar" && b->attrs.get_float("value") == 0) {
        err = "RuntimeError: ZeroDivisionError";
        return false;
      }
      return true;
    };
    d.keep_unused = integer_division_on_cpu;
    // remainder(a, b) = a - floor(a / b) * b: grad for a, -grad * floor(a / b) for b, as torch's
    // (floor_divide has none in torch either: its backward raises there, so the call runs eagerly).
    if (d.name == "remainder")
      d.derivative = [](Graph& g, Node* n, Node* grad) {
        // A Python number by a tensor (2.0 % x) is torch's remainder.Scalar_Tensor, which has no
        // derivative: the call runs eagerly and eager's backward raises.
        if (n->inputs[0]->op->name == "scalar") throw std::runtime_error("no derivative for remainder of a number by a tensor");
        Attrs floor;
        floor.set("rounding_mode", std::string("floor"));
        Node* q = g.must_add("div", {n->inputs[0], n->inputs[1]}, floor);
        return std::vector<Node*>{grad, grad_ops::neg(g, grad_ops::mul(g, grad, q))};
      };
    if (d.name == "remainder") d.keeps_inputs = {{1}, {1}};  // both, for the divisor's gradient
    ops.push_back(d);
  }
  {
    OpDef pow = binary("pow", SOp::Pow, D, {"torch.pow", "Tensor.pow", "Tensor.__pow__"}, "pow(Tensor self, Tensor exponent)");
    pow.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      if (!infer_pointwise(*find_op("pow"), in, a, out, err)) return false;
      const Node* e = in[1];
      if (!is_floating(out.dtype) && e->op->name == "scalar" && e->attrs.get_float("value") < 0) {
        err = "RuntimeError: Integers to negative integer powers are not allowed.";
        return false;
      }
      // A Python number to a tensor's power is torch's pow.Scalar, whose result is row-major
      // whatever the exponent's layout (its meta function asks for no strides).
      if (in[0]->meta.wrapped_number && !in[1]->meta.wrapped_number) out.strides = ir::contiguous_strides(out.sizes);
      return true;
    };
    pow.scalar = [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
      DType t = arith_dtype(n);
      const bool roots = !(n.meta.dtype == DType::Float16 && n.meta.device.type == DeviceType::CPU);
      return pow_scalar(s, s.cast(a[0], t), a[1], t, roots);
    };
    // torch's pow_backward: e * x^(e-1), and 0 where e is 0 (not 0 * inf at x = 0); the
    // exponent's: result * log(x), and 0 where x is 0 and e >= 0.
    pow.derivative = [](Graph& g, Node* n, Node* grad) {
      using namespace grad_ops;
      // A Python number operand is a double in torch's backward (exponent - 1, log(base)); two
      // wrapped numbers would promote to the default dtype, float32: made a float64 tensor first.
      auto exact = [&](Node* v) {
        if (!v->meta.wrapped_number) return v;
        Attrs a;
        a.set("dtype", DType::Float64);
        return g.must_add("convert", {v}, a);
      };
      Node *x = n->inputs[0], *e = exact(n->inputs[1]);
      // An integer exponent's e - 1 is integer arithmetic in torch (INT64_MIN - 1 wraps), not a
      // float one that rounds 2^31 - 1 to an even power.
      const bool int_exponent = is_integral(e->meta.dtype, false);
      Node* one = int_exponent ? g.scalar(1.0, DType::Int64) : num(g, 1.0);
      Node* dx = mul(g, grad, mul(g, e, g.must_add("pow", {x, sub(g, e, one)})));
      dx = g.must_add("where", {g.must_add("eq", {e, num(g, 0.0)}), num(g, 0.0), dx});
      Node* de = mul(g, grad, mul(g, n, unary(g, "log", exact(x))));
      Node* x_zero = g.must_add("logical_and", {g.must_add("eq", {x, num(g, 0.0)}), g.must_add("ge", {e, num(g, 0.0)})});
      de = g.must_add("where", {x_zero, num(g, 0.0), de});
      return std::vector<Node*>{dx, de};
    };
    pow.keeps_inputs = {{0, 1}, {0}};  // self for both gradients, the exponent for self's
    pow.keeps_result_for = {1};         // the exponent's gradient: grad * result * log(self)
    ops.push_back(pow);
  }
  for (bool is_max : {true, false}) {
    OpDef d = is_max ? binary("maximum", SOp::Max, D, {"torch.maximum", "Tensor.maximum"})
                     : binary("minimum", SOp::Min, D, {"torch.minimum", "Tensor.minimum"});
    // To the larger (smaller) operand; split in half between equal ones, as torch does. Each
    // operand gets the gradient unless the other one wins (torch's masked_fill_ of the loser):
    // with a NaN, neither wins and both get it.
    d.derivative = [is_max](Graph& g, Node* n, Node* grad) {
      using namespace grad_ops;
      Node *a = n->inputs[0], *b = n->inputs[1];
      Node* half = scaled(g, grad, 0.5);
      Node* tie = g.must_add("eq", {a, b});
      Node* a_keeps = g.must_add("logical_not", {g.must_add(is_max ? "lt" : "gt", {a, b})});
      Node* b_keeps = g.must_add("logical_not", {g.must_add(is_max ? "gt" : "lt", {a, b})});
      return std::vector<Node*>{g.must_add("where", {tie, half, only_where(g, a_keeps, grad)}),
                                g.must_add("where", {tie, half, only_where(g, b_keeps, grad)})};
    };
    d.keeps_inputs = {{0, 1}, {0, 1}};  // both operands, for either gradient
    ops.push_back(d);
  }
  ops.push_back(binary("eq", SOp::Eq, Promotion::AlwaysBool, {"torch.eq", "Tensor.eq", "Tensor.__eq__"}));
  ops.push_back(binary("ne", SOp::Ne, Promotion::AlwaysBool, {"torch.ne", "Tensor.ne", "Tensor.__ne__"}));
  ops.push_back(binary("lt", SOp::Lt, Promotion::AlwaysBool, {"torch.lt", "torch.less", "Tensor.lt", "Tensor.__lt__"}));
  ops.push_back(binary("le", SOp::Le, Promotion::AlwaysBool, {"torch.le", "Tensor.le", "Tensor.__le__"}));
  ops.push_back(binary("gt", SOp::Gt, Promotion::AlwaysBool, {"torch.gt", "torch.greater", "Tensor.gt", "Tensor.__gt__"}));
  ops.push_back(binary("ge", SOp::Ge, Promotion::AlwaysBool, {"torch.ge", "Tensor.ge", "Tensor.__ge__"}));
  ops.push_back(binary("logical_and", SOp::And, Promotion::AlwaysBool, {"torch.logical_and", "Tensor.logical_and"}));
  ops.push_back(binary("logical_or", SOp::Or, Promotion::AlwaysBool, {"torch.logical_or", "Tensor.logical_or"}));
  {
    OpDef w;
    w.name = "where";
    w.schema = Schema::parse("where(Tensor condition, Tensor self, Tensor other)");
    w.kind = OpKind::Pointwise;
    w.promotion = Promotion::None;
    w.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      if (in[0]->meta.dtype != DType::Bool) {
        err = "RuntimeError: where expected condition to be a boolean tensor, but got a tensor with dtype " +
              std::string(dtype_name(in[0]->meta.dtype));
        return false;
      }
      if (!infer_pointwise(*find_op("where"), in, a, out, err)) return false;
      out.dtype = pointwise_common_dtype({in[1], in[2]});
      // torch converts self and other to the result's dtype (.to(), a dense copy of an expanded
      // one) before iterating; the condition stays as it is.
      out.strides = pointwise_strides(out.sizes, in, out.dtype, 1);
      return true;
    };
    w.scalar = [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) {
      DType t = compute_dtype(n.meta.dtype);
      return s.where(a[0], s.cast(a[1], t), s.cast(a[2], t));
    };
    w.python = {"torch.where"};  // Tensor.where(cond, other) puts self second: capture reorders it
    w.derivative = [](Graph& g, Node* n, Node* grad) {
      Node* c = n->inputs[0];
      return std::vector<Node*>{nullptr, grad_ops::only_where(g, c, grad),
                                g.must_add("where", {c, grad_ops::num(g, 0.0), grad})};
    };
    w.keeps_inputs = {{1, 2}, {}, {}};  // the condition, for either operand's gradient
    ops.push_back(w);
  }
  {
    // Dtype conversion (Tensor.to(dtype), .float(), ...): a cast, and a copy.
    OpDef c;
    c.name = "convert";
    c.schema = Schema::parse("convert(Tensor self, ScalarType dtype)");
    c.kind = OpKind::Pointwise;
    c.promotion = Promotion::None;
    c.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      if (!infer_pointwise(*find_op("convert"), in, a, out, err)) return false;
      out.dtype = *a.get_dtype("dtype");
      out.strides = preserved_strides(in[0]->meta);
      return true;
    };
    c.scalar = [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) { return s.cast(a[0], compute_dtype(n.meta.dtype)); };
    c.python = {"Tensor.to", "Tensor.type", "Tensor.float{dtype=float32}", "Tensor.double{dtype=float64}",
                "Tensor.half{dtype=float16}", "Tensor.bfloat16{dtype=bfloat16}", "Tensor.int{dtype=int32}",
                "Tensor.long{dtype=int64}", "Tensor.bool{dtype=bool}", "Tensor.short{dtype=int16}",
                "Tensor.char{dtype=int8}", "Tensor.byte{dtype=uint8}"};
    // Back to the input's dtype (build_joint converts every input's gradient to its dtype).
    c.derivative = [](Graph&, Node*, Node* grad) { return std::vector<Node*>{grad}; };
    ops.push_back(c);
  }
  {
    OpDef c;
    c.name = "clone";
    c.schema = Schema::parse("clone(Tensor self)");
    c.kind = OpKind::Pointwise;
    c.scalar = [](ScalarCtx& s, const std::vector<SRef>& a, const Node& n) { return a[0]; };
    c.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      if (!infer_pointwise(*find_op("clone"), in, a, out, err)) return false;
      out.strides = preserved_strides(in[0]->meta);
      return true;
    };
    c.python = {"torch.clone", "Tensor.clone"};
    c.derivative = [](Graph&, Node*, Node* grad) { return std::vector<Node*>{grad}; };  // copies
    OpDef contiguous = c;  // a copy laid out row-major, whatever the input's layout
    contiguous.name = "contiguous";
    contiguous.schema = Schema::parse("contiguous(Tensor self)");
    contiguous.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      if (!infer_pointwise(*find_op("contiguous"), in, a, out, err)) return false;
      out.strides = ir::contiguous_strides(out.sizes);
      return true;
    };
    contiguous.python = {"Tensor.contiguous"};
    // A copy laid out channels-last (4-d): what convolutions read and write on the GPU
    // (passes::channels_last_convolutions). Made by that pass, not captured.
    OpDef channels_last = c;
    channels_last.name = "channels_last";
    channels_last.schema = Schema::parse("channels_last(Tensor self)");
    channels_last.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      if (in[0]->meta.dim() != 4) return err = "kiln: channels_last takes a 4-d tensor", false;
      if (!infer_pointwise(*find_op("channels_last"), in, a, out, err)) return false;
      out.strides = channels_last_strides(out.sizes);
      return true;
    };
    channels_last.python = {};
    ops.push_back(c);
    ops.push_back(contiguous);
    ops.push_back(channels_last);
  }
  // What torch has kernels for: no bool for arithmetic that needs a sign or an order of
  // magnitude, floating point only for the activations.
  for (OpDef& d : ops) {
    static const char* no_bool[] = {"abs", "ceil", "floor", "trunc", "relu", "floor_divide", "remainder", "pow", "neg"};
    static const char* float_only[] = {"elu", "gelu", "hardsigmoid", "hardswish", "leaky_relu", "silu", "softplus"};
    static const char* tensors_only[] = {"logical_and", "logical_or", "maximum", "minimum"};
    for (const char* n : no_bool)
      if (d.name == n) d.operands = OpDef::Operands::NoBool;
    for (const char* n : float_only)
      if (d.name == n) d.operands = OpDef::Operands::FloatOnly;
    for (const char* n : tensors_only)
      if (d.name == n) d.tensors_only = true;
  }
  return ops;
}

}  // namespace kiln::ops
