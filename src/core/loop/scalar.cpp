#include "core/loop/scalar.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

namespace kiln::loop {

const char* sop_name(SOp op) {
  switch (op) {
    case SOp::Const: return "const";
    case SOp::Load: return "load";
    case SOp::Acc: return "acc";
    case SOp::Cast: return "cast";
    case SOp::Where: return "where";
    case SOp::Index: return "index";
    case SOp::Arg: return "arg";
#define KILN_X(name, str) \
  case SOp::name: return str;
      KILN_SCALAR_UNARY(KILN_X) KILN_SCALAR_BINARY(KILN_X)
#undef KILN_X
  }
  return "?";
}

bool sop_is_unary(SOp op) {
  switch (op) {
#define KILN_X(name, str) case SOp::name:
    KILN_SCALAR_UNARY(KILN_X)
#undef KILN_X
    return true;
    default: return false;
  }
}

bool sop_is_binary(SOp op) {
  switch (op) {
#define KILN_X(name, str) case SOp::name:
    KILN_SCALAR_BINARY(KILN_X)
#undef KILN_X
    return true;
    default: return false;
  }
}

bool sop_is_comparison(SOp op) {
  return op == SOp::Eq || op == SOp::Ne || op == SOp::Lt || op == SOp::Le || op == SOp::Gt || op == SOp::Ge;
}

SRef ScalarCtx::intern(const SNode& n) {
  std::string key(reinterpret_cast<const char*>(&n.op), 1);
  key.push_back(static_cast<char>(n.dtype));
  key.append(reinterpret_cast<const char*>(&n.a), sizeof(SRef) * 3);
  key.append(reinterpret_cast<const char*>(&n.fval), sizeof n.fval);
  key.append(reinterpret_cast<const char*>(&n.ival), sizeof n.ival);
  key.append(reinterpret_cast<const char*>(&n.buffer), sizeof n.buffer);
  uint64_t idx = n.index.id();
  key.append(reinterpret_cast<const char*>(&idx), sizeof idx);
  key.append(reinterpret_cast<const char*>(&n.acc), sizeof n.acc);
  auto it = table_.find(key);
  if (it != table_.end()) return it->second;
  SRef r = static_cast<SRef>(nodes_.size());
  nodes_.push_back(n);
  table_.emplace(std::move(key), r);
  return r;
}

SRef ScalarCtx::constant(double v, DType t) {
  SNode n{SOp::Const, t};
  if (is_floating(t)) n.fval = v;
  else if (t == DType::Bool) n.ival = v != 0;
  else n.ival = v >= 0x1p63 ? INT64_MAX : v < -0x1p63 ? INT64_MIN : static_cast<int64_t>(v);  // no UB out of range
  return intern(n);
}

SRef ScalarCtx::int_constant(int64_t v, DType t) {
  if (is_floating(t) || t == DType::Bool) return constant(static_cast<double>(v), t);
  SNode n{SOp::Const, t};
  n.ival = v;
  return intern(n);
}

SRef ScalarCtx::load(int buffer, sym::Expr index, DType t) {
  SNode n{SOp::Load, t};
  n.buffer = buffer;
  n.index = index;
  return intern(n);
}

SRef ScalarCtx::size_value(sym::Expr e, DType t) {
  if (auto c = e.as_const()) return constant(static_cast<double>(*c), t);
  SNode n{SOp::Index, t};
  n.index = e;
  return intern(n);
}

SRef ScalarCtx::arg(int index, DType t) {
  SNode n{SOp::Arg, t};
  n.ival = index;
  return intern(n);
}

SRef ScalarCtx::acc(int id, DType t) {
  SNode n{SOp::Acc, t};
  n.acc = id;
  return intern(n);
}

namespace {
// v rounded to float16 / bfloat16 (through float, as torch converts a double), nearest even,
// overflow to inf, float16's subnormals; as the preludes' kiln_round_f16 / kiln_round_bf16.
double round_16bit(double v, DType t) {
  const float f = static_cast<float>(v);
  if (std::isnan(f) || std::isinf(f)) return f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = u & 0x80000000u, a = u ^ sign;
  uint32_t r;
  if (t == DType::BFloat16) {
    r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  } else if (a >= 0x477ff000u) {
    r = sign | 0x7f800000u;
  } else if (a >= 0x38800000u) {
    r = sign | ((a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu);
  } else {
    float m;
    std::memcpy(&m, &a, 4);
    const float sub = (m + 0.5f) - 0.5f;  // subnormal: 2^-24 is the ulp of 0.5
    std::memcpy(&r, &sub, 4);
    r |= sign;
  }
  float out;
  std::memcpy(&out, &r, 4);
  return out;
}
}  // namespace

SRef ScalarCtx::cast(SRef a, DType t) {
  const SNode& src = nodes_[a];
  if (src.dtype == t) return a;
  if (src.op == SOp::Const) {
    double v = is_floating(src.dtype) ? src.fval : static_cast<double>(src.ival);
    if (!is_floating(t) && is_floating(src.dtype)) v = static_cast<double>(static_cast<int64_t>(v));
    if (t == DType::Float32) v = static_cast<double>(static_cast<float>(v));
    if (is_16bit_float(t)) v = round_16bit(v, t);
    return constant(v, t);
  }
  SNode n{SOp::Cast, t};
  n.a = a;
  return intern(n);
}

SRef ScalarCtx::unary(SOp op, SRef a) {
  SNode n{op, op == SOp::Not ? DType::Bool : nodes_[a].dtype};
  n.a = a;
  return intern(n);
}

SRef ScalarCtx::binary(SOp op, SRef a, SRef b) {
  if (nodes_[a].dtype != nodes_[b].dtype) throw std::logic_error("kiln: scalar binary op on mixed dtypes");
  // x / 2^k == x * 2^-k exactly (both round the same real number): a multiply is far cheaper.
  if (op == SOp::Div && nodes_[b].op == SOp::Const && is_floating(nodes_[b].dtype)) {
    int exp = 0;
    double m = std::frexp(nodes_[b].fval, &exp);
    if ((m == 0.5 || m == -0.5) && exp > -120 && exp < 120) return binary(SOp::Mul, a, constant(1.0 / nodes_[b].fval, nodes_[b].dtype));
  }
  bool to_bool = sop_is_comparison(op) || op == SOp::And || op == SOp::Or;
  // Rand(seed, counter): int64 operands, a float32 draw in [0, 1).
  SNode n{op, to_bool ? DType::Bool : op == SOp::Rand ? DType::Float32 : nodes_[a].dtype};
  n.a = a;
  n.b = b;
  return intern(n);
}

SRef ScalarCtx::where(SRef cond, SRef a, SRef b) {
  SNode n{SOp::Where, nodes_[a].dtype};
  n.a = cond;
  n.b = a;
  n.c = b;
  return intern(n);
}

void ScalarCtx::walk(SRef r, std::unordered_set<SRef>& seen, const std::function<void(const SNode&)>& f) const {
  std::vector<SRef> stack{r};
  while (!stack.empty()) {
    SRef x = stack.back();
    stack.pop_back();
    if (x < 0 || !seen.insert(x).second) continue;
    const SNode& n = nodes_[x];
    f(n);
    stack.push_back(n.a);
    stack.push_back(n.b);
    stack.push_back(n.c);
  }
}

size_t ScalarCtx::count(SRef r) const {
  std::unordered_set<SRef> seen;
  walk(r, seen, [](const SNode&) {});
  return seen.size();
}

double ScalarCtx::cost(SRef r, std::unordered_set<SRef>& seen) const {
  double total = 0;
  walk(r, seen, [&](const SNode& n) {
    switch (n.op) {
      case SOp::Const: case SOp::Acc: case SOp::Index: case SOp::Arg: break;
      case SOp::Exp: case SOp::Log: case SOp::Sin: case SOp::Cos: case SOp::Tan: case SOp::Tanh:
      case SOp::Sigmoid: case SOp::Erf: case SOp::Exp2: case SOp::Log2: case SOp::Expm1: case SOp::Log1p:
      case SOp::Pow:
        total += 8;
        break;
      case SOp::Div: case SOp::Sqrt: case SOp::Rsqrt: case SOp::Reciprocal: case SOp::FloorDiv:
      case SOp::TruncDiv: case SOp::Mod:
        total += 2;
        break;
      default:
        total += 1;
    }
  });
  return total;
}

SRef ScalarCtx::rewrite(SRef root, const std::function<SRef(ScalarCtx&, const SNode&, SRef)>& f,
                        std::unordered_map<SRef, SRef>& memo) {
  if (root < 0) return root;
  auto it = memo.find(root);
  if (it != memo.end()) return it->second;
  SNode n = nodes_[root];
  n.a = rewrite(n.a, f, memo);
  n.b = rewrite(n.b, f, memo);
  n.c = rewrite(n.c, f, memo);
  SRef self = intern(n);
  SRef out = f(*this, nodes_[self], self);
  memo[root] = out;
  return out;
}

std::string ScalarCtx::str(SRef r) const {
  const SNode& n = nodes_[r];
  switch (n.op) {
    case SOp::Const: return is_floating(n.dtype) ? std::to_string(n.fval) : std::to_string(n.ival);
    case SOp::Load: return "buf" + std::to_string(n.buffer) + "[" + n.index.str() + "]";
    case SOp::Acc: return "acc" + std::to_string(n.acc);
    case SOp::Index: return std::string(dtype_name(n.dtype)) + "(" + n.index.str() + ")";
    case SOp::Arg: return "arg" + std::to_string(n.ival);
    case SOp::Cast: return std::string(dtype_name(n.dtype)) + "(" + str(n.a) + ")";
    case SOp::Where: return "where(" + str(n.a) + ", " + str(n.b) + ", " + str(n.c) + ")";
    default: break;
  }
  if (sop_is_unary(n.op)) return std::string(sop_name(n.op)) + "(" + str(n.a) + ")";
  return std::string(sop_name(n.op)) + "(" + str(n.a) + ", " + str(n.b) + ")";
}

void visit_loads(const ScalarCtx& s, SRef r, std::set<SRef>& seen, const std::function<void(const SNode&)>& f) {
  if (r < 0 || !seen.insert(r).second) return;
  const SNode& n = s[r];
  if (n.op == SOp::Load) f(n);
  visit_loads(s, n.a, seen, f);
  visit_loads(s, n.b, seen, f);
  visit_loads(s, n.c, seen, f);
}

}  // namespace kiln::loop
