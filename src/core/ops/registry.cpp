#include "core/sym/shape_env.h"
#include "core/ops/registry.h"

#include <utility>

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <stdexcept>

namespace kiln::ops {

Schema Schema::parse(const std::string& text) {
  Schema s;
  auto open = text.find('(');
  auto close = text.rfind(')');
  s.name = text.substr(0, open);
  std::string body = text.substr(open + 1, close - open - 1);
  bool kwonly = false;
  size_t pos = 0;
  while (pos < body.size()) {
    // The next comma outside brackets: defaults like [0, 1] contain commas.
    size_t comma = pos;
    for (int depth = 0; comma < body.size(); ++comma) {
      if (body[comma] == '[') ++depth;
      else if (body[comma] == ']') --depth;
      else if (body[comma] == ',' && depth == 0) break;
    }
    if (comma >= body.size()) comma = std::string::npos;
    std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? body.size() : comma + 1;
    auto trim = [](std::string x) {
      while (!x.empty() && std::isspace(static_cast<unsigned char>(x.front()))) x.erase(0, 1);
      while (!x.empty() && std::isspace(static_cast<unsigned char>(x.back()))) x.pop_back();
      return x;
    };
    item = trim(item);
    if (item.empty()) continue;
    if (item == "*") {
      kwonly = true;
      continue;
    }
    Param p;
    auto eq = item.find('=');
    if (eq != std::string::npos) {
      p.dflt = trim(item.substr(eq + 1));
      p.has_default = true;
      item = trim(item.substr(0, eq));
    }
    auto sp = item.rfind(' ');
    p.type = trim(item.substr(0, sp));
    p.name = trim(item.substr(sp + 1));
    p.kwarg_only = kwonly;
    s.params.push_back(p);
  }
  return s;
}

size_t Param::list_size() const {
  if (!is_int_list()) return 0;
  size_t open = type.find('['), close = type.find(']');
  return close > open + 1 ? std::stoul(type.substr(open + 1, close - open - 1)) : 0;
}

std::optional<ir::AttrValue> Param::default_value() const {
  if (!has_default || dflt == "None") return std::nullopt;
  if (dflt == "True" || dflt == "False") return ir::AttrValue(dflt == "True");
  if (dflt.front() == '\'') return ir::AttrValue(dflt.substr(1, dflt.size() - 2));
  if (is_int_list()) {
    std::vector<int64_t> v;
    if (dflt.front() == '[') {
      std::string body = dflt.substr(1, dflt.size() - 2);
      for (size_t pos = 0; pos < body.size();) {
        size_t comma = body.find(',', pos);
        std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        if (item.find_first_not_of(' ') != std::string::npos) v.push_back(std::stoll(item));
        pos = comma == std::string::npos ? body.size() : comma + 1;
      }
    } else {
      v.assign(std::max<size_t>(list_size(), 1), std::stoll(dflt));
    }
    return ir::AttrValue(v);
  }
  if (dflt.find_first_of(".e") != std::string::npos) return ir::AttrValue(std::stod(dflt));
  return ir::AttrValue(static_cast<int64_t>(std::stoll(dflt)));
}

std::string Schema::str() const {
  std::string out = name + "(";
  bool kw = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (i) out += ", ";
    if (p.kwarg_only && !kw) {
      out += "*, ";
      kw = true;
    }
    out += p.type + " " + p.name;
    if (p.has_default) out += "=" + p.dflt;
  }
  return out + ")";
}

TorchFacts& torch_facts() {
  static TorchFacts facts;
  return facts;
}

namespace {
struct Registry {
  std::map<std::string, OpDef> ops;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    for (auto table : {pointwise_ops, reduction_ops, view_ops, linalg_ops, composite_ops, nn_ops, join_ops,
                       random_ops, source_ops, torch_call_ops, custom_function_ops}) {
      for (OpDef& d : table()) {
        std::string name = d.name;
        if (reg->ops.count(name)) throw std::logic_error("kiln: op registered twice: " + name);
        reg->ops.emplace(name, std::move(d));
      }
    }
    set_autocast_policies(reg->ops);
    return reg;
  }();
  return *r;
}
}  // namespace

const OpDef* find_op(const std::string& name) {
  auto& ops = registry().ops;
  auto it = ops.find(name);
  return it == ops.end() ? nullptr : &it->second;
}

std::vector<const OpDef*> all_ops() {
  std::vector<const OpDef*> out;
  for (auto& [_, d] : registry().ops) out.push_back(&d);
  return out;
}

namespace {
thread_local DType t_default_float = DType::Float32;
}
DType default_float() { return t_default_float; }
DefaultFloatScope::DefaultFloatScope(DType t) : before_(std::exchange(t_default_float, t)) {}
DefaultFloatScope::~DefaultFloatScope() { t_default_float = before_; }

OpDef extern_op(const std::string& name, const std::string& schema, const std::string& aten, InferFn infer,
                std::vector<std::string> python) {
  OpDef d;
  d.name = name;
  d.schema = Schema::parse(schema);
  d.kind = OpKind::Extern;
  d.promotion = Promotion::None;
  d.infer = std::move(infer);
  d.aten = aten;
  d.python = std::move(python);
  return d;
}

const char* torch_dtype_name(DType t) {
  static const char* names[] = {"Bool", "Byte", "Char", "Short", "Int", "Long", "Half", "BFloat16", "Float", "Double"};
  return names[static_cast<int>(t)];
}

bool wrap_dim(int64_t& dim, int64_t rank, std::string& error) {
  int64_t r = std::max<int64_t>(rank, 1);  // scalars accept dims -1 and 0
  if (dim < -r || dim >= r) {
    error = "IndexError: Dimension out of range (expected to be in range of [" + std::to_string(-r) + ", " +
            std::to_string(r - 1) + "], but got " + std::to_string(dim) + ")";
    return false;
  }
  if (dim < 0) dim += r;
  return true;
}

bool broadcast_shapes(const std::vector<std::vector<Expr>>& shapes, std::vector<Expr>& out, std::string& error) {
  size_t rank = 0;
  for (auto& s : shapes) rank = std::max(rank, s.size());
  out.assign(rank, Expr(1));
  for (auto& s : shapes) {
    size_t off = rank - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      Expr& o = out[off + i];
      const Expr& d = s[i];
      if (d.is_const(1) || d == o) continue;
      if (o.is_const(1)) {
        o = d;
        continue;
      }
      if (sym::same_size(o, d)) {  // a symbolic size the inputs give the same value: a fact
        if (d.as_const()) o = d;     // keep the constant
        continue;
      }
      error = "RuntimeError: The size of tensor a (" + o.str() + ") must match the size of tensor b (" + d.str() +
              ") at non-singleton dimension " + std::to_string(i + off);
      return false;
    }
  }
  return true;
}

DType pointwise_common_dtype(const std::vector<Node*>& in) {
  std::vector<PromotionOperand> ops;
  for (Node* n : in)
    if (n) ops.push_back({n->meta.dtype, n->meta.dim(), n->meta.wrapped_number});
  return result_type(ops, default_float());
}

namespace {
std::vector<Expr> iterator_strides(const std::vector<Expr>& sizes, const std::vector<const TensorMeta*>& in);
}

std::vector<Expr> pointwise_strides(const std::vector<Expr>& sizes, const std::vector<Node*>& in,
                                    std::optional<DType> compute, size_t uncast) {
  std::vector<const TensorMeta*> metas;
  std::vector<std::unique_ptr<TensorMeta>> cast;  // the copies TensorIterator casts inputs into
  for (size_t i = 0; i < in.size(); ++i) {
    const Node* n = in[i];
    if (!n || n->meta.wrapped_number) continue;
    // An input of another dtype than the computation's is first copied into that dtype
    // (tensor.to(dtype), which keeps a dense layout and makes an expanded one dense): the
    // copy's strides, not the input's, order the result's dims.
    if (compute && i >= uncast && n->meta.dtype != *compute && n->meta.dim() > 0) {
      cast.push_back(std::make_unique<TensorMeta>(n->meta));
      cast.back()->strides = preserved_strides(n->meta);
      metas.push_back(cast.back().get());
      continue;
    }
    metas.push_back(&n->meta);
  }
  return iterator_strides(sizes, metas);
}

namespace {
std::vector<Expr> iterator_strides(const std::vector<Expr>& sizes, const std::vector<const TensorMeta*>& in) {
  // TensorIterator's rule: order the dims by the operands' strides (the first operand with a
  // strict order decides; broadcast dims do not count; equal strides put the smaller dim
  // inside), then lay the result out densely in that order. A transposed input's result is
  // transposed too, as in eager.
  const size_t rank = sizes.size();
  // Symbolic sizes order by their values for this capture's inputs (sym::size_hint): dense
  // layouts keep their dim order for every size the guards admit.
  std::vector<int64_t> shape(rank);
  for (size_t i = 0; i < rank; ++i) {
    auto c = sym::size_hint(sizes[i]);
    if (!c) return ir::contiguous_strides(sizes);
    shape[i] = *c;
  }
  std::vector<std::vector<int64_t>> strides;  // per tensor operand, broadcast to the result
  for (const TensorMeta* mp : in) {
    const TensorMeta& m = *mp;
    std::vector<int64_t> st(rank, 0);
    const size_t off = rank - m.sizes.size();
    for (size_t i = 0; i < m.sizes.size(); ++i) {
      auto sz = sym::size_hint(m.sizes[i]);
      auto s = m.strides.size() == m.sizes.size() ? sym::size_hint(m.strides[i]) : std::nullopt;
      if (!sz || !s) return ir::contiguous_strides(sizes);
      st[off + i] = (*sz == 1 && shape[off + i] != 1) ? 0 : *s;
    }
    strides.push_back(std::move(st));
  }
  auto should_swap = [&](size_t d0, size_t d1) {
    for (const auto& st : strides) {
      if (st[d0] == 0 || st[d1] == 0) continue;
      if (st[d0] < st[d1]) return -1;
      if (st[d0] > st[d1]) return 1;
      if (shape[d0] > shape[d1]) return 1;
    }
    return 0;
  };
  std::vector<size_t> perm(rank);  // perm[0]: the innermost dim
  for (size_t i = 0; i < rank; ++i) perm[i] = rank - 1 - i;
  for (size_t i = 1; i < rank; ++i) {
    size_t d1 = i;
    for (size_t d0 = i; d0-- > 0;) {
      int c = should_swap(perm[d0], perm[d1]);
      if (c > 0) {
        std::swap(perm[d0], perm[d1]);
        d1 = d0;
      } else if (c < 0) {
        break;
      }
    }
  }
  bool identity = true;
  for (size_t i = 0; i < rank; ++i) identity = identity && perm[i] == rank - 1 - i;
  if (identity) return ir::contiguous_strides(sizes);
  std::vector<Expr> out(rank);
  Expr next = 1;
  for (size_t i = 0; i < rank; ++i) {
    out[perm[i]] = next;
    next = next * sizes[perm[i]];
  }
  return out;
}

}  // namespace

std::vector<Expr> preserved_strides(const TensorMeta& x) {
  // memory_format=torch.preserve_format (clone, .to()): a dense input's strides exactly, else
  // dense strides in the input's dim order (empty_like's rule, TensorIterator's with one operand).
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims of size > 1
  for (size_t i = 0; i < x.sizes.size(); ++i) {
    auto sz = sym::size_hint(x.sizes[i]);
    auto s = i < x.strides.size() ? sym::size_hint(x.strides[i]) : std::nullopt;
    if (!sz || !s) return ir::contiguous_strides(x.sizes);
    if (*sz != 1) dims.emplace_back(*s, *sz);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expect = 1;
  bool dense = true;
  for (auto [s, sz] : dims) {
    if (sz == 0) return ir::contiguous_strides(x.sizes);
    if (s != expect) dense = false;
    expect *= sz;
  }
  return dense ? x.strides : iterator_strides(x.sizes, {&x});
}

namespace {
// torch's is_channels_last_strides_{2d_s4,3d_s5}: walking the dims in `order` (C, the spatial
// dims innermost first, N), each stride is at least the extent of the dims before it. An N11..
// tensor (all strides tied with C's) stays row-major.
bool channels_last_walk(const TensorMeta& x, std::initializer_list<size_t> order) {
  if (x.sizes.size() != order.size() || x.strides.size() != order.size()) return false;
  int64_t min = 0;
  for (size_t d : order) {
    // The batch may be a symbol (a dynamic batch): only its stride takes part.
    auto size = d == 0 && !x.sizes[0].as_const() ? std::optional<int64_t>(2) : x.sizes[d].as_const();
    auto stride = x.strides[d].as_const();
    if (!size || !stride || *size == 0) return false;
    if (d == 1 && *stride == 0) return false;
    if (*stride < min) return false;
    if (d == 0 && min == *x.strides[1].as_const()) return false;
    min = *stride * (*size > 1 ? *size : 1);
  }
  return true;
}
}  // namespace

bool suggests_channels_last(const TensorMeta& x) { return channels_last_walk(x, {1, 3, 2, 0}); }

std::vector<Expr> channels_last_strides(const std::vector<Expr>& sizes) {
  const Expr &C = sizes[1], &H = sizes[2], &W = sizes[3];
  return {C * H * W, Expr(1), W * C, C};
}

bool suggests_channels_last_3d(const TensorMeta& x) { return channels_last_walk(x, {1, 4, 3, 2, 0}); }

std::vector<Expr> channels_last_3d_strides(const std::vector<Expr>& sizes) {
  const Expr &C = sizes[1], &D = sizes[2], &H = sizes[3], &W = sizes[4];
  return {C * D * H * W, Expr(1), H * W * C, W * C, C};
}

bool infer_pointwise(const OpDef& op, const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& error) {
  std::vector<std::vector<Expr>> shapes;
  const Node* first_tensor = nullptr;
  for (Node* n : in) {
    if (!n) continue;
    shapes.push_back(n->meta.sizes);
    if (!n->meta.wrapped_number) {
      if (first_tensor && first_tensor->meta.device != n->meta.device && n->meta.dim() > 0 && first_tensor->meta.dim() > 0) {
        error = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, " +
                first_tensor->meta.device.str() + " and " + n->meta.device.str() + "!";
        return false;
      }
      if (!first_tensor || (first_tensor->meta.dim() == 0 && n->meta.dim() > 0)) first_tensor = n;
    }
  }
  if (!broadcast_shapes(shapes, out.sizes, error)) return false;
  DType common = pointwise_common_dtype(in);
  bool bad = (op.operands == OpDef::Operands::NoBool && common == DType::Bool) ||
             (op.operands == OpDef::Operands::FloatOnly && !is_floating(common));
  if (bad) {
    std::string device = first_tensor && first_tensor->meta.device.type == DeviceType::CUDA ? "cuda" : "cpu";
    error = "NotImplementedError: \"" + op.name + "_" + device + "\" not implemented for '" + torch_dtype_name(common) + "'";
    return false;
  }
  switch (op.promotion) {
    case Promotion::Default: out.dtype = common; break;
    case Promotion::IntToFloat: out.dtype = is_floating(common) ? common : default_float(); break;
    case Promotion::AlwaysBool: out.dtype = DType::Bool; break;
    case Promotion::BoolToLong: out.dtype = common == DType::Bool ? DType::Int64 : common; break;
    case Promotion::None: out.dtype = common; break;
  }
  out.device = first_tensor ? first_tensor->meta.device : Device{};
  out.strides = pointwise_strides(out.sizes, in, op.promotion == Promotion::IntToFloat ? out.dtype : common);
  out.wrapped_number = false;
  if (!first_tensor && !in.empty() && out.sizes.empty()) {
    // Arithmetic on Python numbers alone (an optimizer's -lr, a float read per call times 2):
    // Python's own, in double precision, and still a Python number to the ops that read it.
    // (As a tensor it would take the default dtype: float32, 1e-8 off a float64 update.)
    bool floating = false;
    for (const Node* n : in) floating = floating || (n && is_floating(n->meta.dtype));
    if (is_floating(out.dtype) || (floating && out.dtype != DType::Bool)) out.dtype = DType::Float64;
    out.wrapped_number = true;
  }
  return true;
}

bool infer_reduction(const OpDef& op, const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& error) {
  const TensorMeta& x = in[0]->meta;
  std::vector<int64_t> dims = a.get_ints("dim");
  bool keepdim = a.get_bool("keepdim");
  std::vector<bool> reduced(x.dim(), dims.empty());
  for (int64_t d : dims) {
    if (!wrap_dim(d, x.dim(), error)) return false;
    if (x.dim() > 0) {
      if (reduced[d] && !dims.empty()) {
        error = "RuntimeError: dim " + std::to_string(d) + " appears multiple times in the list of dims";
        return false;
      }
      reduced[d] = true;
    }
  }
  out.sizes.clear();
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (!reduced[i]) out.sizes.push_back(x.sizes[i]);
    else if (keepdim) out.sizes.push_back(Expr(1));
  }
  out.device = x.device;
  out.strides = ir::contiguous_strides(out.sizes);
  DType t = x.dtype;
  if (auto forced = a.get_dtype("dtype")) t = *forced;
  else if (op.promotion == Promotion::BoolToLong && !is_floating(t)) t = DType::Int64;
  else if (op.promotion == Promotion::IntToFloat && !is_floating(t)) {
    error = "RuntimeError: " + op.name + "(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: " +
            std::string(dtype_name(t));
    error[0] = 'R';
    return false;
  }
  if ((op.reduce == ReduceOp::Max || op.reduce == ReduceOp::Min)) {
    for (int64_t i = 0; i < x.dim(); ++i) {
      if (reduced[i] && x.sizes[i].is_const(0)) {
        error = "IndexError: " + op.name + "(): Expected reduction dim " + std::to_string(i) +
                " to have non-zero size.";
        return false;
      }
    }
  }
  out.dtype = t;
  return true;
}

}  // namespace kiln::ops
