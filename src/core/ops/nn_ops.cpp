// Neural-network ops: convolution and pooling run as extern calls of torch's kernels (oneDNN,
// cuDNN); batch norm in inference decomposes into a per-channel scale and shift that fuses
// with what surrounds it.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/sym/shape_env.h"
#include "core/ops/registry.h"

namespace kiln::ops {
namespace {

// Dense strides for `sizes` with the dims in the order of x's strides (largest outermost,
// ties in dim order): the layout a kernel gives a result it allocates like x. Row-major when
// x's strides are not known as numbers.
std::vector<Expr> dense_strides_like(const TensorMeta& x, const std::vector<Expr>& sizes) {
  std::vector<int64_t> st;
  for (const Expr& e : x.strides) {
    auto c = e.as_const();
    if (!c) return ir::contiguous_strides(sizes);
    st.push_back(*c);
  }
  std::vector<size_t> order(sizes.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = d;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return st[a] > st[b]; });
  std::vector<Expr> out(sizes.size());
  Expr step = 1;
  for (size_t i = order.size(); i-- > 0;) {
    out[order[i]] = step;
    step = step * sizes[order[i]];
  }
  return out;
}

using Ints = std::vector<int64_t>;
using loop::SOp;
using loop::SRef;

// A size a rule needs as a number (a convolution's kernel size, its weight's channels): its
// constant, or under a capture with symbolic sizes its value at hand, kept as a fact the entry
// guards (a weight passed as an argument under dynamic=True has symbolic sizes too).
std::optional<int64_t> size_as_number(const Expr& e) {
  if (auto c = e.as_const()) return c;
  auto h = sym::size_hint(e);
  if (h && sym::same_size(e, Expr(*h))) return h;
  return std::nullopt;
}

// Output size of a sliding window: (in + 2p - d(k-1) - 1) / s + 1, rounded down (or up).
bool window_out(const Expr& in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode, Expr& out, std::string& err) {
  auto n = in.as_const();
  if (!n) {
    // A symbolic size: the floor form as an expression (torch's kernel checks the size at run
    // time); ceil mode's last-window rule is left to static shapes.
    if (ceil_mode || s <= 0) return err = "kiln: symbolic spatial size with ceil_mode", false;
    out = sym::floordiv(in + Expr(2 * p - d * (k - 1) - 1), Expr(s)) + Expr(1);
    return true;
  }
  int64_t span = *n + 2 * p - d * (k - 1) - 1;
  if (span < 0 || s <= 0) {
    err = "RuntimeError: Calculated output size is too small";
    return false;
  }
  int64_t o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  // With ceil_mode the last window must start inside the input or its left padding.
  if (ceil_mode && (o - 1) * s >= *n + p) --o;
  out = Expr(o);
  return true;
}

bool spatial_arg(const Attrs& a, const char* key, size_t i, int64_t dflt, int64_t& out) {
  Ints v = a.get_ints(key);
  if (v.empty()) return out = dflt, true;
  out = v.size() == 1 ? v[0] : v.at(i);
  return true;
}


Attrs A(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  Attrs a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}

// The batch statistics of a training-mode batch norm: mean and biased variance over every dim
// but the channels (dim 1), kept as [1, C, 1, ...], computed in float for 16-bit inputs.
struct BatchStats {
  Node *x, *mean, *var;
  Expr count;  // values per channel
};
BatchStats batch_statistics(Graph& g, Node* x) {
  const int64_t r = x->meta.dim();
  Ints dims = {0};
  Expr count = x->meta.sizes[0];
  for (int64_t d = 2; d < r; ++d) {
    dims.push_back(d);
    count = count * x->meta.sizes[static_cast<size_t>(d)];
  }
  if (count.is_const(1))  // F.batch_norm's own check (_verify_batch_size)
    throw std::runtime_error("ValueError: Expected more than 1 value per channel when training, got input size " + sym::str(x->meta.sizes));
  const DType ct = compute_dtype(x->meta.dtype);
  if (ct != x->meta.dtype) x = g.must_add("convert", {x}, A({{"dtype", ct}}));
  Node* mean = g.must_add("mean", {x}, A({{"dim", dims}, {"keepdim", true}}));
  Node* centered = g.must_add("sub", {x, mean});
  Node* var = g.must_add("mean", {g.must_add("mul", {centered, centered})}, A({{"dim", dims}, {"keepdim", true}}));
  return {x, mean, var, count};
}

// Eval-mode batch norm as torch's CPU kernel computes it: alpha = w / sqrt(var + eps),
// beta = b - mean * alpha, y = x * alpha + beta, per channel (dim 1). Training mode normalizes
// with the batch's statistics instead (batch_norm_running_update keeps the running ones).
Node* decompose_batch_norm(Graph& g, Node* n) {
  Node *x = n->inputs[0], *mean = n->inputs[1], *var = n->inputs[2];
  Node *w = n->inputs.size() > 3 ? n->inputs[3] : nullptr, *b = n->inputs.size() > 4 ? n->inputs[4] : nullptr;
  if (x->meta.dim() < 2) throw std::runtime_error("RuntimeError: batch_norm expects an input of at least 2 dims");
  Ints shape(x->meta.dim(), 1);
  shape[1] = -1;
  auto per_channel = [&](Node* v) { return g.must_add("reshape", {v}, A({{"shape", shape}})); };
  if (n->attrs.get_bool("training") || !mean || !var) {
    const BatchStats st = batch_statistics(g, x);
    Node* y = g.must_add("mul", {g.must_add("sub", {st.x, st.mean}),
                                 g.must_add("rsqrt", {g.must_add("add", {st.var, g.scalar(n->attrs.get_float("eps", 1e-5), DType::Float64)})})});
    if (w) y = g.must_add("mul", {y, per_channel(w)});
    if (b) y = g.must_add("add", {y, per_channel(b)});
    return y->meta.dtype == x->meta.dtype ? y : g.must_add("convert", {y}, A({{"dtype", x->meta.dtype}}));
  }
  // The scale and shift, and the normalized value, in float for 16-bit tensors, as torch's
  // kernels compute them (in bfloat16 the scale alone was off by a rounding, and results twice
  // as far from float64's as eager's).
  auto wide = [&](Node* v) {
    const DType ct = compute_dtype(v->meta.dtype);
    return ct == v->meta.dtype ? v : g.must_add("convert", {v}, A({{"dtype", ct}}));
  };
  mean = wide(mean), var = wide(var);
  if (w) w = wide(w);
  if (b) b = wide(b);
  Node* invstd = g.must_add("rsqrt", {g.must_add("add", {var, g.scalar(n->attrs.get_float("eps", 1e-5), DType::Float64)})});
  Node* alpha = w ? g.must_add("mul", {w, invstd}) : invstd;
  Node* shift = g.must_add("mul", {mean, alpha});
  Node* beta = b ? g.must_add("sub", {b, shift}) : g.must_add("neg", {shift});
  Node* y = g.must_add("add", {g.must_add("mul", {wide(x), per_channel(alpha)}), per_channel(beta)});
  if (y->meta.dtype != x->meta.dtype) y = g.must_add("convert", {y}, A({{"dtype", x->meta.dtype}}));
  return y;
}

}  // namespace

std::pair<Node*, Node*> batch_norm_running_update(Graph& g, Node* x, Node* running_mean, Node* running_var, double momentum) {
  const BatchStats st = batch_statistics(g, x);
  // an empty batch updates nothing (torch's kernels return before; its statistics are nan)
  if (st.count.is_const(0)) return {running_mean, running_var};
  const Ints channels = {-1};
  auto flat = [&](Node* v) { return g.must_add("reshape", {v}, A({{"shape", channels}})); };
  // torch's kernels: running = momentum * batch + (1 - momentum) * running, with the variance
  // unbiased: the sum of squared deviations over count - 1, in the statistics' dtype (a ratio
  // count / (count - 1) of two Python numbers would be float32, short for float64 statistics).
  Node* unbiased = g.must_add("div", {g.must_add("mul", {flat(st.var), g.size_value(st.count, DType::Float64)}),
                                      g.size_value(st.count - Expr(1), DType::Float64)});
  auto blend = [&](Node* running, Node* batch) {
    Node* r = g.must_add("add", {g.must_add("mul", {batch, g.scalar(momentum, DType::Float64)}),
                                 g.must_add("mul", {running, g.scalar(1 - momentum, DType::Float64)})});
    return r->meta.dtype == running->meta.dtype ? r : g.must_add("convert", {r}, A({{"dtype", running->meta.dtype}}));
  };
  return {blend(running_mean, flat(st.mean)), blend(running_var, unbiased)};
}

namespace {

// The normalized dims of layer_norm / rms_norm: the trailing ones, matching normalized_shape.
Ints trailing_norm_dims(const char* op, Node* x, const Ints& shape) {
  int64_t k = static_cast<int64_t>(shape.size()), r = x->meta.dim();
  bool ok = k > 0 && k <= r;
  for (int64_t i = 0; ok && i < k; ++i) ok = sym::same_size(x->meta.sizes[r - k + i], Expr(shape[i]));
  if (!ok)
    throw std::runtime_error("RuntimeError: Given normalized_shape=" + ir::attr_str(shape) + ", expected input with shape [*" +
                             (std::string(op) == "layer_norm" ? ", " : "") + ir::attr_str(shape).substr(1) +
                             ", but got input of size" + sym::str(x->meta.sizes));
  if (!is_floating(x->meta.dtype)) throw std::runtime_error(std::string("kiln: ") + op + " of an integer tensor");
  Ints dims;
  for (int64_t i = r - k; i < r; ++i) dims.push_back(i);
  return dims;
}

// layer_norm over the trailing dims named by normalized_shape: (x - mean) / sqrt(var + eps).
Node* decompose_layer_norm(Graph& g, Node* n) {
  Node *x = n->inputs[0], *w = n->inputs.size() > 1 ? n->inputs[1] : nullptr, *b = n->inputs.size() > 2 ? n->inputs[2] : nullptr;
  Ints dims = trailing_norm_dims("layer_norm", x, n->attrs.get_ints("normalized_shape"));
  // torch's kernels normalize a 16-bit input in float, weight and bias included, and round once.
  const DType t = x->meta.dtype, ct = compute_dtype(t);
  if (ct != t) x = g.must_add("convert", {x}, A({{"dtype", ct}}));
  Node* mean = g.must_add("mean", {x}, A({{"dim", dims}, {"keepdim", true}}));
  Node* centered = g.must_add("sub", {x, mean});
  Node* var = g.must_add("mean", {g.must_add("mul", {centered, centered})}, A({{"dim", dims}, {"keepdim", true}}));
  Node* y = g.must_add("mul", {centered, g.must_add("rsqrt", {g.must_add("add", {var, g.scalar(n->attrs.get_float("eps", 1e-5), DType::Float64)})})});
  if (w) y = g.must_add("mul", {y, w});
  if (b) y = g.must_add("add", {y, b});
  return y->meta.dtype == t ? y : g.must_add("convert", {y}, A({{"dtype", t}}));
}

// rms_norm as torch's composite computes it: in float for 16-bit inputs, x * rsqrt(mean(x^2) +
// eps) times the weight, cast back to the input's type (a bfloat16 input with a float32 weight,
// as under autocast, gives bfloat16). eps defaults to the machine epsilon of the type the
// arithmetic is done in.
Node* decompose_rms_norm(Graph& g, Node* n) {
  Node *x = n->inputs[0], *w = n->inputs.size() > 1 ? n->inputs[1] : nullptr;
  Ints dims = trailing_norm_dims("rms_norm", x, n->attrs.get_ints("normalized_shape"));
  DType t = x->meta.dtype, ct = compute_dtype(t);
  double eps = n->attrs.has("eps") ? n->attrs.get_float("eps") : ct == DType::Float64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
  Node* xc = ct == t ? x : g.must_add("convert", {x}, A({{"dtype", ct}}));
  Node* ms = g.must_add("mean", {g.must_add("mul", {xc, xc})}, A({{"dim", dims}, {"keepdim", true}}));
  Node* y = g.must_add("mul", {xc, g.must_add("rsqrt", {g.must_add("add", {ms, g.scalar(eps, DType::Float64)})})});
  if (w) y = g.must_add("mul", {y, w});
  return y->meta.dtype == t ? y : g.must_add("convert", {y}, A({{"dtype", t}}));
}

// group_norm: channels split into groups, each (sample, group) normalized over its channels
// and all spatial positions, then a per-channel affine.
Node* decompose_group_norm(Graph& g, Node* n) {
  Node *x = n->inputs[0], *w = n->inputs.size() > 1 ? n->inputs[1] : nullptr, *b = n->inputs.size() > 2 ? n->inputs[2] : nullptr;
  int64_t r = x->meta.dim(), groups = n->attrs.get_int("num_groups");
  if (r < 2) throw std::runtime_error("RuntimeError: Expected at least 2 dimensions for input tensor but received " + std::to_string(r));
  Ints sizes;
  for (const Expr& e : x->meta.sizes) {
    auto c = e.as_const();
    if (!c) throw std::runtime_error("kiln: group_norm over symbolic sizes is not compiled yet");
    sizes.push_back(*c);
  }
  int64_t c = sizes[1];
  if (groups == 0) throw std::runtime_error("ZeroDivisionError: integer division or modulo by zero");
  if (groups < 0) throw std::runtime_error("RuntimeError: Expected num groups to be greater than 0, got " + std::to_string(groups));
  if (c % groups != 0)
    throw std::runtime_error("RuntimeError: Expected number of channels in input to be divisible by num_groups, but got input of shape " +
                             ir::attr_str(sizes) + " and num_groups=" + std::to_string(groups));
  // F.group_norm's own check (_verify_batch_size): one value per group statistic is refused.
  Ints stat_shape = {sizes[0] * c / groups, groups};
  stat_shape.insert(stat_shape.end(), sizes.begin() + 2, sizes.end());
  int64_t per_stat = stat_shape[0];
  for (int64_t i = 2; i < r; ++i) per_stat *= sizes[i];
  if (per_stat == 1)
    throw std::runtime_error("ValueError: Expected more than 1 value per channel when training, got input size " + ir::attr_str(stat_shape));
  if (!is_floating(x->meta.dtype)) throw std::runtime_error("kiln: group_norm of an integer tensor");
  for (Node* p : {w, b})
    if (p && !(p->meta.dim() == 1 && sym::same_size(p->meta.sizes[0], Expr(c))))
      throw std::runtime_error("RuntimeError: Expected weight to be a vector of size equal to the number of channels in input, but got weight of shape " +
                               sym::str(p->meta.sizes) + " and input of shape " + ir::attr_str(sizes));
  // torch's kernels compute a 16-bit input's statistics and result in float (its weight and
  // bias too, float32 ones included) and hand back the input's dtype
  const DType t = x->meta.dtype;
  const bool half = is_16bit_float(t);
  auto in_float = [&](Node* v) { return v && half && v->meta.dtype != DType::Float32 ? g.must_add("convert", {v}, A({{"dtype", DType::Float32}})) : v; };
  x = in_float(x), w = in_float(w), b = in_float(b);
  Ints split = {sizes[0], groups, c / groups}, dims;
  split.insert(split.end(), sizes.begin() + 2, sizes.end());
  for (int64_t i = 2; i < static_cast<int64_t>(split.size()); ++i) dims.push_back(i);
  Node* xg = g.must_add("reshape", {x}, A({{"shape", split}}));
  Node* mean = g.must_add("mean", {xg}, A({{"dim", dims}, {"keepdim", true}}));
  Node* centered = g.must_add("sub", {xg, mean});
  Node* var = g.must_add("mean", {g.must_add("mul", {centered, centered})}, A({{"dim", dims}, {"keepdim", true}}));
  Node* yg = g.must_add("mul", {centered, g.must_add("rsqrt", {g.must_add("add", {var, g.scalar(n->attrs.get_float("eps", 1e-5), DType::Float64)})})});
  Node* y = g.must_add("reshape", {yg}, A({{"shape", sizes}}));
  Ints per_channel(r, 1);
  per_channel[1] = c;
  if (w) y = g.must_add("mul", {y, g.must_add("reshape", {w}, A({{"shape", per_channel}}))});
  if (b) y = g.must_add("add", {y, g.must_add("reshape", {b}, A({{"shape", per_channel}}))});
  return half && y->meta.dtype != t ? g.must_add("convert", {y}, A({{"dtype", t}})) : y;
}

}  // namespace

std::vector<OpDef> nn_ops() {
  std::vector<OpDef> ops;
  ops.push_back(extern_op(
      "conv2d", "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, int[2] dilation=1, int groups=1)",
      "aten::conv2d",
      [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
        const TensorMeta &x = in[0]->meta, &w = in[1]->meta;
        if (x.dim() != 4 || w.dim() != 4) return err = "kiln: conv2d on unbatched or non-4D input", false;
        int64_t groups = a.get_int("groups", 1);
        auto wc = size_as_number(w.sizes[1]);
        if (!wc || !sym::same_size(x.sizes[1], Expr(*wc * groups))) {
          err = "RuntimeError: Given groups=" + std::to_string(groups) + ", weight of size " + sym::str(w.sizes) +
                ", expected input" + sym::str(x.sizes) + " to have " + (wc ? std::to_string(*wc * groups) : "?") +
                " channels, but got " + x.sizes[1].str() + " channels instead";
          return false;
        }
        if (x.dtype != w.dtype || x.device != w.device) return err = "RuntimeError: conv2d input and weight differ in dtype or device", false;
        out = TensorMeta{x.dtype, x.device, {x.sizes[0], w.sizes[0], 0, 0}, {}, 0, false};
        for (size_t i = 0; i < 2; ++i) {
          int64_t s, p, d;
          spatial_arg(a, "stride", i, 1, s);
          spatial_arg(a, "padding", i, 0, p);
          spatial_arg(a, "dilation", i, 1, d);
          auto k = size_as_number(w.sizes[2 + i]);
          if (!k) return err = "kiln: conv2d with a kernel size not known as a number", false;
          if (!window_out(x.sizes[2 + i], *k, s, p, d, false, out.sizes[2 + i], err)) return false;
        }
        // torch's cuDNN, oneDNN and slow backends all compute in channels-last when the input
        // or the weight suggests it, and return that layout (a backend that does not, CUDA's
        // depthwise kernel, costs the executor a copy into these strides, never a misread).
        out.strides = suggests_channels_last(x) || suggests_channels_last(w) ? channels_last_strides(out.sizes)
                                                                              : ir::contiguous_strides(out.sizes);
        return true;
      },
      {"torch.nn.functional.conv2d", "torch.conv2d"}));
  // An unbatched input (C, H, W) runs through torch's operator.
  ops.back().covers = [](const std::vector<Node*>& in, const Attrs&) { return in[0] && in[1] && in[0]->meta.dim() == 4 && in[1]->meta.dim() == 4; };
  // conv2d's gradients as eager computes them: the input's and the weight's each from torch's
  // convolution_backward (output_mask asks for that one alone: cuDNN runs data and weight
  // gradients as separate kernels anyway, and the forward is not run again), the bias's a sum
  // over batch and space that fuses into kiln's kernels.
  ops.back().derivative = [](Graph& g, Node* n, Node* grad) {
    std::vector<Node*> out(n->inputs.size(), nullptr);
    for (int64_t k = 0; k < 2; ++k) {
      Attrs a = n->attrs;
      a.set("output_mask", Ints{k == 0, k == 1, 0});
      a.set("result", k);
      out[static_cast<size_t>(k)] = g.must_add("conv2d_backward", {grad, n->inputs[0], n->inputs[1]}, a);
    }
    if (n->inputs.size() > 2 && n->inputs[2])
      out[2] = g.must_add("sum", {grad}, A({{"dim", Ints{0, 2, 3}}, {"keepdim", false}}));
    return out;
  };
  {
    // max_pool2d: each output the largest element of its window (NaN if any is), positions in
    // the padding left out. A gather: fused with the op that makes its input (batch norm and
    // ReLU before a ResNet's pooling), the window read wherever it lands.
    OpDef mp;
    mp.name = "max_pool2d";
    mp.schema = Schema::parse(
        "max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False, bool return_indices=False)");
    mp.kind = OpKind::Gather;
    mp.promotion = Promotion::None;
    mp.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
      const TensorMeta& x = in[0]->meta;
      if (x.dim() != 4 && x.dim() != 3) return err = "RuntimeError: max_pool2d expects a 3D or 4D input", false;
      // F.max_pool2d(..., return_indices=True) returns (values, indices): torch's operator (covers)
      if (a.get_bool("return_indices")) return err = "kiln: max_pool2d with return_indices=True is torch's", false;
      out = x;
      size_t h = x.dim() - 2;
      for (size_t i = 0; i < 2; ++i) {
        int64_t k, s, p, d;
        spatial_arg(a, "kernel_size", i, 1, k);
        spatial_arg(a, "stride", i, k, s);
        spatial_arg(a, "padding", i, 0, p);
        spatial_arg(a, "dilation", i, 1, d);
        if (p * 2 > k) return err = "RuntimeError: pad should be at most half of effective kernel size", false;
        if (!window_out(x.sizes[h + i], k, s, p, d, a.get_bool("ceil_mode"), out.sizes[h + i], err)) return false;
      }
      // Pooling keeps the input's suggested memory format.
      out.strides = suggests_channels_last(x) ? channels_last_strides(out.sizes) : ir::contiguous_strides(out.sizes);
      out.offset = 0;
      out.wrapped_number = false;
      return true;
    };
    // Floating inputs and windows of up to 64 elements (each is a read in the kernel); others
    // (integer pooling, huge windows) run through torch's operator.
    mp.covers = [](const std::vector<Node*>& in, const Attrs& a) {
      if (!in[0] || !is_floating(in[0]->meta.dtype) || a.get_bool("return_indices")) return false;
      int64_t k0 = 1, k1 = 1;
      spatial_arg(a, "kernel_size", 0, 1, k0);
      spatial_arg(a, "kernel_size", 1, 1, k1);
      return k0 > 0 && k1 > 0 && k0 * k1 <= 64;
    };
    mp.gather = [](loop::ScalarCtx& s, const std::vector<Expr>& out, const std::vector<GatherInput>& in, const Node& n) {
      const GatherInput& x = in[0];
      const size_t h = x.sizes.size() - 2;
      const DType t = compute_dtype(n.meta.dtype);
      int64_t k[2], st[2], pad[2], dil[2];
      for (size_t i = 0; i < 2; ++i) {
        spatial_arg(n.attrs, "kernel_size", i, 1, k[i]);
        spatial_arg(n.attrs, "stride", i, k[i], st[i]);
        spatial_arg(n.attrs, "padding", i, 0, pad[i]);
        spatial_arg(n.attrs, "dilation", i, 1, dil[i]);
      }
      // The input position of window element w along spatial dim i, clamped into the input
      // (the read is then discarded) where it may fall outside, with the test that it does not.
      auto position = [&](size_t i, int64_t w, Expr& at, SRef& inside) {
        const Expr size = x.sizes[h + i];
        Expr pos = out[h + i] * Expr(st[i]) + Expr(w * dil[i] - pad[i]);
        const sym::Bounds b = sym::bounds(pos);
        auto last = size.as_const();
        const bool below = !b.lo || *b.lo < 0, above = !b.hi || !last || *b.hi >= *last;
        inside = -1;
        auto test = [&](SRef c) { inside = inside < 0 ? c : s.binary(SOp::And, inside, c); };
        if (below) test(s.binary(SOp::Ge, s.size_value(pos, DType::Int64), s.constant(0, DType::Int64)));
        if (above) test(s.binary(SOp::Lt, s.size_value(pos, DType::Int64), s.size_value(size, DType::Int64)));
        if (below) pos = sym::max(pos, Expr(0));
        if (above) pos = sym::min(pos, size - Expr(1));
        at = pos;
      };
      SRef best = -1;
      for (int64_t wi = 0; wi < k[0]; ++wi) {
        Expr hi;
        SRef in_h;
        position(0, wi, hi, in_h);
        for (int64_t wj = 0; wj < k[1]; ++wj) {
          Expr wpos;
          SRef in_w;
          position(1, wj, wpos, in_w);
          std::vector<Expr> at = out;
          at[h] = hi;
          at[h + 1] = wpos;
          SRef v = s.cast(x.read(at), t);
          SRef inside = in_h < 0 ? in_w : in_w < 0 ? in_h : s.binary(SOp::And, in_h, in_w);
          if (inside >= 0) v = s.where(inside, v, s.constant(-INFINITY, t));
          best = best < 0 ? v : s.binary(SOp::Max, best, v);
        }
      }
      return best;
    };
    mp.python = {"torch.nn.functional.max_pool2d", "torch.max_pool2d"};
    mp.derivative = aten_vjp_derivative("aten::max_pool2d");
    ops.push_back(mp);
  }
  ops.push_back(extern_op(
      "adaptive_avg_pool2d", "adaptive_avg_pool2d(Tensor self, int[2] output_size)", "aten::adaptive_avg_pool2d",
      [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
        const TensorMeta& x = in[0]->meta;
        if (x.dim() != 4 && x.dim() != 3) return err = "RuntimeError: adaptive_avg_pool2d expects a 3D or 4D input", false;
        Ints o = a.get_ints("output_size");
        if (o.size() == 1) o.push_back(o[0]);
        if (o.size() != 2) return err = "RuntimeError: adaptive_avg_pool2d: output_size must be 2", false;
        out = x;
        out.sizes[x.dim() - 2] = o[0];
        out.sizes[x.dim() - 1] = o[1];
        out.strides = suggests_channels_last(x) ? channels_last_strides(out.sizes) : ir::contiguous_strides(out.sizes);
        out.offset = 0;
        return true;
      },
      {"torch.nn.functional.adaptive_avg_pool2d", "torch.adaptive_avg_pool2d"}));
  ops.push_back(composite_op(
      "batch_norm",
      "batch_norm(Tensor input, Tensor? running_mean, Tensor? running_var, Tensor? weight=None, Tensor? bias=None, bool training=False, float momentum=0.1, float eps=1e-05)",
      decompose_batch_norm, {"torch.nn.functional.batch_norm"}));
  ops.push_back(composite_op(
      "layer_norm", "layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05)",
      decompose_layer_norm, {"torch.nn.functional.layer_norm", "torch.layer_norm"}));
  ops.push_back(composite_op("rms_norm", "rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None)",
                             decompose_rms_norm, {"torch.nn.functional.rms_norm", "torch.rms_norm"}));
  ops.push_back(composite_op(
      "group_norm", "group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05)",
      decompose_group_norm, {"torch.nn.functional.group_norm", "torch.group_norm"}));

  // torch's embedding takes (weight, indices); F.embedding takes (input, weight): the composite
  // binds the Python order and calls the extern in torch's.
  ops.push_back(extern_op(
      "embedding_lookup", "embedding_lookup(Tensor weight, Tensor indices, int padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False)",
      "aten::embedding",
      [](const std::vector<Node*>& in, const Attrs&, TensorMeta& out, std::string& err) {
        const TensorMeta &w = in[0]->meta, &idx = in[1]->meta;
        if (w.dim() != 2) return err = "RuntimeError: 'weight' must be 2-D", false;
        if (idx.dtype != DType::Int64 && idx.dtype != DType::Int32)
          return err = "RuntimeError: Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int", false;
        if (w.device != idx.device) return err = "RuntimeError: embedding weight and indices differ in device", false;
        out = TensorMeta{w.dtype, w.device, idx.sizes, {}, 0, false};
        out.sizes.push_back(w.sizes[1]);
        out.strides = ir::contiguous_strides(out.sizes);
        return true;
      },
      {"torch.ops.aten.embedding.default"}));
  // The weight's gradient is torch's (aten_vjp, with scale_grad_by_freq); a sparse one is a
  // layout kiln's backward programs do not hand out: such a training call runs eagerly.
  ops.back().derivative = [vjp = aten_vjp_derivative("aten::embedding")](Graph& g, Node* n, Node* grad) {
    if (n->attrs.get_bool("sparse"))
      throw std::runtime_error("kiln: the sparse gradient of an embedding (sparse=True) is not built yet");
    return vjp(g, n, grad);
  };
  OpDef emb;
  emb.name = "embedding";
  emb.schema = Schema::parse("embedding(Tensor input, Tensor weight, int? padding_idx=None, float? max_norm=None, float norm_type=2.0, bool scale_grad_by_freq=False, bool sparse=False)");
  emb.kind = OpKind::Composite;
  emb.promotion = Promotion::None;
  emb.decompose = [](Graph& g, Node* n) -> Node* {
    if (n->attrs.has("max_norm")) throw std::runtime_error("kiln: embedding with max_norm renormalizes the weight in place: not compiled");
    // the flags only the gradient reads (torch's, through aten_vjp) go with the lookup
    return g.must_add("embedding_lookup", {n->inputs[1], n->inputs[0]},
                      A({{"padding_idx", n->attrs.get_int("padding_idx", -1)},
                         {"scale_grad_by_freq", n->attrs.get_bool("scale_grad_by_freq")},
                         {"sparse", n->attrs.get_bool("sparse")}}));
  };
  emb.python = {"torch.nn.functional.embedding"};
  infer_by_decomposition(emb);
  ops.push_back(emb);
  // torch's fused attention, as one extern call of its operator: capture keeps it (and its
  // sizes symbolic) instead of a torch_call whose layout is found for fixed sizes. The result
  // is laid out as torch's fused CPU/CUDA kernels give it, [B, L, H, E] transposed to
  // [B, H, L, E] (the executor copies where torch's math path chose another layout).
  ops.push_back(extern_op(
      "scaled_dot_product_attention",
      "scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False)",
      "aten::scaled_dot_product_attention",
      [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
        const TensorMeta &q = in[0]->meta, &v = in[2]->meta;
        const int64_t r = q.dim();
        out = TensorMeta{q.dtype, q.device, q.sizes, {}, 0, false};
        out.sizes[r - 1] = v.sizes[r - 1];
        out.strides = ir::contiguous_strides(out.sizes);
        if (r == 4) {
          const Expr &H = out.sizes[1], &L = out.sizes[2], &E = out.sizes[3];
          // torch 2.11's CUDA kernels for float16 and bfloat16 write the result in the query's
          // layout (a row-major query gives a row-major result), and so do torch 2.14's CPU
          // kernels (TorchFacts); the others write [B, L, H, E] transposed to [B, H, L, E]. A
          // result laid out otherwise is copied by the executor. Grouped heads in float32 on
          // CUDA take torch's math path (its fused float32 kernel has no groups): row-major.
          const bool cpu = q.device.type != DeviceType::CUDA;
          const bool grouped = a.get_bool("enable_gqa") && !sym::same_size(H, in[1]->meta.sizes[1]);
          const bool like_query = cpu ? torch_facts().cpu_attention_like_query
                                      : q.dtype == DType::Float16 || q.dtype == DType::BFloat16 || grouped;
          out.strides = like_query ? dense_strides_like(q, out.sizes) : std::vector<Expr>{L * H * E, E, H * E, Expr(1)};
        }
        return true;
      },
      {"torch.nn.functional.scaled_dot_product_attention"}));
  ops.back().unit_stride_inputs = {3};  // attn_mask
  // Random dropout, broadcast or mismatched sizes, mixed dtypes: torch's operator (and its
  // errors) as a torch_call. Grouped query heads (enable_gqa: Hugging Face's Llama, Mistral,
  // Qwen2 pass it) are the operator's own, given heads of query a whole multiple of key's.
  ops.back().covers = [](const std::vector<Node*>& in, const Attrs& a) {
    if (a.get_float("dropout_p", 0.0) != 0.0 || !in[0] || !in[1] || !in[2]) return false;
    const TensorMeta &q = in[0]->meta, &k = in[1]->meta, &v = in[2]->meta;
    const int64_t r = q.dim();
    if (r < 2 || k.dim() != r || v.dim() != r) return false;
    if (q.dtype != k.dtype || q.dtype != v.dtype || !is_floating(q.dtype)) return false;
    if (q.device != k.device || q.device != v.device) return false;
    const bool gqa = a.get_bool("enable_gqa");
    if (gqa && r < 3) return false;
    for (int64_t d = 0; d + 2 < r; ++d) {
      if (gqa && d == r - 3) {  // query's heads in groups, one per key/value head
        auto hq = q.sizes[d].as_const(), hk = k.sizes[d].as_const(), hv = v.sizes[d].as_const();
        if (!hq || !hk || !hv || *hk != *hv || *hk <= 0 || *hq % *hk != 0) return false;
        continue;
      }
      if (!sym::same_size(q.sizes[d], k.sizes[d]) || !sym::same_size(q.sizes[d], v.sizes[d])) return false;
    }
    return sym::same_size(q.sizes[r - 1], k.sizes[r - 1]) && sym::same_size(k.sizes[r - 2], v.sizes[r - 2]);
  };
  // Convolution, pooling, embedding and attention: their gradients from torch's kernels.
  for (OpDef& d : ops)
    if (d.kind == OpKind::Extern && !d.derivative && !d.aten.empty()) d.derivative = aten_vjp_derivative(d.aten);
  {
    // conv2d with its weight prepacked for oneDNN (made by passes::prepack_convolutions on the
    // CPU, float32, where stable inputs alone make the weight): the same schema, shape rule and
    // result as conv2d. The executor reorders the weight into oneDNN's blocked format once
    // (mkldnn::_reorder_convolution_weight, kept while the weight is the same tensor at the same
    // version) and calls mkldnn::_convolution_pointwise; where torch has no oneDNN, aten::conv2d.
    // Inference only: no derivative.
    OpDef packed = *std::find_if(ops.begin(), ops.end(), [](const OpDef& d) { return d.name == "conv2d"; });
    packed.name = "conv2d_prepacked";
    packed.python = {};
    packed.derivative = nullptr;
    ops.push_back(packed);
  }
  // Made by conv2d's derivative only (no derivative of its own: no double backward).
  ops.push_back(extern_op(
      "conv2d_backward",
      "conv2d_backward(Tensor grad_output, Tensor input, Tensor weight, int[]? bias_sizes=None, int[2] stride=1, "
      "int[2] padding=0, int[2] dilation=1, bool transposed=False, int[2] output_padding=0, int groups=1, "
      "bool[3] output_mask, int result=0)",
      "aten::convolution_backward",
      [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
        const int64_t k = a.get_int("result", 0);
        if (k < 0 || k > 1) return err = "kiln: conv2d_backward gives the input's or the weight's gradient", false;
        const TensorMeta &x = in[1]->meta, &w = in[2]->meta;
        out = in[static_cast<size_t>(1 + k)]->meta;
        out.offset = 0;
        // cuDNN and oneDNN answer in channels-last when the input or the weight suggests it.
        out.strides = suggests_channels_last(x) || suggests_channels_last(w) ? channels_last_strides(out.sizes)
                                                                              : ir::contiguous_strides(out.sizes);
        return true;
      },
      {}));
  return ops;
}

}  // namespace kiln::ops
