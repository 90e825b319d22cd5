#include "core/sym/expr.h"

#include <algorithm>
#include <mutex>
#include <numeric>
#include <unordered_map>

namespace kiln::sym {
namespace {

// The interner owns every node for the life of the process: expressions are small and
// shared by every graph, and pointer equality depends on nodes never moving.
struct Interner {
  std::mutex mu;
  std::unordered_map<std::string, const ExprNode*> table;
  uint64_t next_id = 0;
};
Interner& interner() {
  static auto* in = new Interner();
  return *in;
}

const ExprNode* intern(ExprKind kind, int64_t value, const std::string& name, std::vector<Expr> args) {
  std::string key;
  key.reserve(16 + name.size() + args.size() * 9);
  key.push_back(static_cast<char>(kind));
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
  key.append(name);
  key.push_back('\0');
  for (const Expr& a : args) {
    uint64_t id = a.id();
    key.append(reinterpret_cast<const char*>(&id), sizeof id);
  }
  Interner& in = interner();
  std::lock_guard<std::mutex> lock(in.mu);
  auto it = in.table.find(key);
  if (it != in.table.end()) return it->second;
  auto* n = new ExprNode{kind, value, name, std::move(args), in.next_id++, std::hash<std::string>()(key)};
  in.table.emplace(std::move(key), n);
  return n;
}

Expr make(ExprKind k, std::vector<Expr> args) { return Expr(intern(k, 0, "", std::move(args))); }

// Floor division and Python modulo on plain integers.
int64_t fdiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t fmod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// A sum as coefficient * term pairs plus a constant.
struct Linear {
  std::map<Expr, int64_t> terms;  // ordered by creation id: canonical
  int64_t constant = 0;
};

void split_term(const Expr& e, int64_t scale, Linear& out) {
  if (auto c = e.as_const()) {
    out.constant += scale * *c;
    return;
  }
  if (e.kind() == ExprKind::Add) {
    for (const Expr& a : e.args()) split_term(a, scale, out);
    return;
  }
  if (e.kind() == ExprKind::Mul && e.args()[0].as_const()) {
    int64_t k = *e.args()[0].as_const();
    std::vector<Expr> rest(e.args().begin() + 1, e.args().end());
    Expr t = rest.size() == 1 ? rest[0] : make(ExprKind::Mul, rest);
    out.terms[t] += scale * k;
    return;
  }
  out.terms[e] += scale;
}

Linear linearize(const Expr& e) {
  Linear l;
  split_term(e, 1, l);
  return l;
}

Expr scaled(const Expr& t, int64_t k) {
  if (k == 1) return t;
  std::vector<Expr> args{Expr(k)};
  if (t.kind() == ExprKind::Mul) {
    args.insert(args.end(), t.args().begin(), t.args().end());
  } else {
    args.push_back(t);
  }
  return make(ExprKind::Mul, args);
}

Expr build(const Linear& l) {
  std::vector<Expr> args;
  for (auto& [t, k] : l.terms)
    if (k != 0) args.push_back(scaled(t, k));
  if (args.empty()) return Expr(l.constant);
  if (l.constant != 0) args.push_back(Expr(l.constant));
  if (args.size() == 1) return args[0];
  return make(ExprKind::Add, args);
}

// (x // a)*a*k + (x % a)*k == x*k: re-joins a split index (a reshape read back whole).
void fold_divmod(Linear& l) {
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& [t, k] : l.terms) {
      if (k == 0 || t.kind() != ExprKind::Mod || !t.args()[1].as_const()) continue;
      const Expr x = t.args()[0], a = t.args()[1];
      auto it = l.terms.find(make(ExprKind::FloorDiv, {x, a}));
      if (it == l.terms.end() || it->second != k * *a.as_const()) continue;
      int64_t coef = k;
      it->second = 0;
      k = 0;
      split_term(x, coef, l);
      changed = true;
      break;
    }
  }
}

// Factors of a product of sizes: a positive constant and size symbols (with repeats).
bool size_factors(const Expr& e, int64_t& k, std::vector<Expr>& syms) {
  if (auto c = e.as_const()) {
    k *= *c;
    return *c > 0;
  }
  if (e.is_size_symbol()) {
    syms.push_back(e);
    return true;
  }
  if (e.kind() != ExprKind::Mul) return false;
  for (const Expr& f : e.args())
    if (!size_factors(f, k, syms)) return false;
  return true;
}

// An exclusive upper bound of a sum of index variables times non-negative coefficients plus
// a non-negative constant, as an expression (nullopt when not of that form).
std::optional<Expr> sum_upper(const Linear& l) {
  if (l.constant < 0) return std::nullopt;
  Expr u = Expr(l.constant + 1);
  for (auto& [t, k] : l.terms) {
    if (k < 0) return std::nullopt;
    // t = v * (sizes): an index variable with an extent, scaled
    Expr v, scale = Expr(1);
    if (t.kind() == ExprKind::Var) {
      v = t;
    } else if (t.kind() == ExprKind::Mul) {
      for (const Expr& f : t.args()) {
        if (f.kind() == ExprKind::Var && !f.is_size_symbol() && !v.valid()) v = f;
        else scale = scale * f;
      }
      int64_t kk = 1;
      std::vector<Expr> ss;
      if (!v.valid() || !size_factors(scale, kk, ss)) return std::nullopt;
    } else {
      return std::nullopt;
    }
    auto ext = v.index_extent();
    if (!ext) return std::nullopt;
    u = u + Expr(k) * scale * *ext - Expr(k) * scale;  // expanded: sums of products compare structurally
  }
  return u;
}

struct SizeSplit {
  Expr quotient, rest;
  bool rest_in_range = false;  // 0 <= rest < divisor
};

// a = quotient * b + rest, taking out of `a` the terms a symbolic divisor b divides.
std::optional<SizeSplit> split_by_size(const Expr& a, const Expr& b) {
  if (b.as_const()) return std::nullopt;
  int64_t bk = 1;
  std::vector<Expr> bsyms;
  if (!size_factors(b, bk, bsyms) || bsyms.empty()) return std::nullopt;
  Linear l = linearize(a), quot, rest;
  rest.constant = l.constant;
  for (auto& [t, k] : l.terms) {
    std::vector<Expr> f = t.kind() == ExprKind::Mul ? t.args() : std::vector<Expr>{t};
    int64_t tk = k;
    for (auto it = f.begin(); it != f.end();)
      if (auto c = it->as_const()) tk *= *c, it = f.erase(it);
      else ++it;
    bool divides = tk % bk == 0;
    for (const Expr& s : bsyms) {
      if (!divides) break;
      auto it = std::find(f.begin(), f.end(), s);
      if (it == f.end()) divides = false;
      else f.erase(it);
    }
    if (divides && f.empty()) {
      quot.constant += tk / bk;  // (6*s0) // s0 is the number 6, not a term 6*1
    } else if (divides) {
      quot.terms[product(f)] += tk / bk;
    } else {
      rest.terms[t] += k;
    }
  }
  SizeSplit out{build(quot), build(rest)};
  if (auto u = sum_upper(rest)) {
    Bounds gap = bounds(b - *u);
    out.rest_in_range = *u == b || (gap.lo && *gap.lo >= 0);
  }
  return out;
}

}  // namespace

Expr::Expr(int64_t v) : node_(intern(ExprKind::Const, v, "", {})) {}

Expr Expr::var(const std::string& name, std::optional<int64_t> extent) {
  return Expr(intern(ExprKind::Var, extent ? *extent : -1, name, {}));
}

Expr Expr::size_symbol(const std::string& name) { return Expr(intern(ExprKind::Var, -2, name, {})); }

Expr Expr::index_var(const std::string& name, const Expr& extent) {
  if (auto c = extent.as_const()) return var(name, *c);
  return Expr(intern(ExprKind::Var, -3, name, {extent}));
}

std::optional<Expr> Expr::index_extent() const {
  if (node_->kind != ExprKind::Var) return std::nullopt;
  if (node_->value >= 0) return Expr(node_->value);
  if (node_->value == -3) return node_->args[0];
  return std::nullopt;
}
bool Expr::is_size_symbol() const { return node_ && node_->kind == ExprKind::Var && node_->value == -2; }

ExprKind Expr::kind() const { return node_->kind; }
std::optional<int64_t> Expr::as_const() const {
  if (node_ && node_->kind == ExprKind::Const) return node_->value;
  return std::nullopt;
}
const std::vector<Expr>& Expr::args() const { return node_->args; }
const std::string& Expr::name() const { return node_->name; }
std::optional<int64_t> Expr::extent() const {
  if (node_->kind == ExprKind::Var && node_->value >= 0) return node_->value;
  return std::nullopt;
}
int64_t Expr::value() const { return node_->value; }
bool Expr::operator<(const Expr& o) const { return node_->id < o.node_->id; }
uint64_t Expr::id() const { return node_ ? node_->id : ~0ull; }

Expr operator+(Expr a, Expr b) {
  auto ca = a.as_const(), cb = b.as_const();
  if (ca && cb) return Expr(*ca + *cb);
  if (ca == 0) return b;
  if (cb == 0) return a;
  Linear l;
  split_term(a, 1, l);
  split_term(b, 1, l);
  fold_divmod(l);
  return build(l);
}

Expr operator-(Expr a) { return Expr(-1) * a; }
Expr operator-(Expr a, Expr b) { return a + (-b); }

Expr operator*(Expr a, Expr b) {
  auto ca = a.as_const(), cb = b.as_const();
  if (ca && cb) return Expr(*ca * *cb);
  if (cb) std::swap(a, b), std::swap(ca, cb);
  if (ca) {
    if (*ca == 0) return Expr(0);
    if (*ca == 1) return b;
    // Distribute constants over sums so that index expressions stay affine and collectable.
    Linear l;
    split_term(b, *ca, l);
    return build(l);
  }
  std::vector<Expr> factors;
  int64_t k = 1;
  for (const Expr& x : {a, b}) {
    if (x.kind() == ExprKind::Mul) {
      for (const Expr& f : x.args()) {
        if (auto c = f.as_const()) k *= *c;
        else factors.push_back(f);
      }
    } else {
      factors.push_back(x);
    }
  }
  std::sort(factors.begin(), factors.end());
  Expr prod = factors.size() == 1 ? factors[0] : make(ExprKind::Mul, factors);
  return k == 1 ? prod : Expr(k) * prod;
}

Expr floordiv(Expr a, Expr b) {
  auto ca = a.as_const(), cb = b.as_const();
  if (cb && *cb == 1) return a;
  if (ca && cb && *cb != 0) return Expr(fdiv(*ca, *cb));
  if (ca == 0) return Expr(0);
  if (cb && *cb > 0) {
    const int64_t c = *cb;
    Linear l = linearize(a);
    // (c*x + y) // c == x + y // c for integer x: pull out terms that c divides.
    Linear pulled, rest;
    for (auto& [t, k] : l.terms) {
      if (k % c == 0) pulled.terms[t] = k / c;
      else rest.terms[t] = k;
    }
    pulled.constant = fdiv(l.constant, c);
    rest.constant = fmod(l.constant, c);
    Expr r = build(rest);
    Bounds br = bounds(r);
    if (br.lo && br.hi && *br.lo >= 0 && *br.hi < c) return build(pulled);
    // (g*x + y) // (g*m) == x // m when 0 <= y < g: the rule that undoes a reshape split.
    if (!rest.terms.empty()) {
      for (auto& [t, k] : rest.terms) {
        int64_t g = std::gcd(k, c);
        if (g <= 1) continue;
        Linear div, small;
        for (auto& [t2, k2] : rest.terms) (k2 % g == 0 ? div.terms[t2] = k2 / g : small.terms[t2] = k2);
        div.constant = fdiv(rest.constant, g);
        small.constant = fmod(rest.constant, g);
        Bounds bs = bounds(build(small));
        if (bs.lo && bs.hi && *bs.lo >= 0 && *bs.hi < g) {
          return build(pulled) + floordiv(build(div), Expr(c / g));
        }
      }
    }
    Expr q = make(ExprKind::FloorDiv, {r, b});
    return build(pulled) + q;
  }
  // A divisor made of sizes (s2, s1*s2, 4*s2): pull out the terms it divides; the rest, when
  // provably in [0, b), vanishes (the index arithmetic of reshapes over dynamic sizes).
  if (auto split = split_by_size(a, b)) {
    if (split->rest_in_range) return split->quotient;
    if (!split->quotient.is_const(0)) return split->quotient + floordiv(split->rest, b);
  }
  // (b*x) // b == x for a symbolic b (sizes are positive): a mean's count, a view's -1.
  if (a == b) return Expr(1);
  if (a.kind() == ExprKind::Mul) {
    std::vector<Expr> rest = a.args();
    auto it = std::find(rest.begin(), rest.end(), b);
    if (it != rest.end() && b.is_size_symbol()) {
      rest.erase(it);
      return product(rest);
    }
  }
  return make(ExprKind::FloorDiv, {a, b});
}

Expr mod(Expr a, Expr b) {
  auto ca = a.as_const(), cb = b.as_const();
  if (cb && *cb == 1) return Expr(0);
  if (ca && cb && *cb != 0) return Expr(fmod(*ca, *cb));
  if (cb && *cb > 0) {
    const int64_t c = *cb;
    Linear l = linearize(a), rest;
    for (auto& [t, k] : l.terms)
      if (k % c != 0) rest.terms[t] = k;
    rest.constant = fmod(l.constant, c);
    Expr r = build(rest);
    Bounds br = bounds(r);
    if (br.lo && br.hi && *br.lo >= 0 && *br.hi < c) return r;
    for (auto& [t, k] : rest.terms) {
      int64_t g = std::gcd(k, c);
      if (g <= 1) continue;
      Linear div, small;
      for (auto& [t2, k2] : rest.terms) (k2 % g == 0 ? div.terms[t2] = k2 / g : small.terms[t2] = k2);
      div.constant = fdiv(rest.constant, g);
      small.constant = fmod(rest.constant, g);
      Expr s = build(small);
      Bounds bs = bounds(s);
      if (bs.lo && bs.hi && *bs.lo >= 0 && *bs.hi < g) {
        return mod(build(div), Expr(c / g)) * Expr(g) + s;
      }
    }
    return make(ExprKind::Mod, {r, b});
  }
  if (auto split = split_by_size(a, b)) {
    if (split->rest_in_range) return split->rest;
    if (!split->quotient.is_const(0)) return mod(split->rest, b);
  }
  return make(ExprKind::Mod, {a, b});
}

Expr min(Expr a, Expr b) {
  auto ca = a.as_const(), cb = b.as_const();
  if (ca && cb) return Expr(std::min(*ca, *cb));
  if (a == b) return a;
  if (auto d = (a - b).as_const()) return *d <= 0 ? a : b;  // min(s1, s1 - 1)
  Bounds ba = bounds(a), bb = bounds(b);
  if (ba.hi && bb.lo && *ba.hi <= *bb.lo) return a;
  if (bb.hi && ba.lo && *bb.hi <= *ba.lo) return b;
  if (b < a) std::swap(a, b);
  return make(ExprKind::Min, {a, b});
}

Expr max(Expr a, Expr b) {
  auto ca = a.as_const(), cb = b.as_const();
  if (ca && cb) return Expr(std::max(*ca, *cb));
  if (a == b) return a;
  if (auto d = (a - b).as_const()) return *d >= 0 ? a : b;
  Bounds ba = bounds(a), bb = bounds(b);
  if (ba.hi && bb.lo && *ba.hi <= *bb.lo) return b;
  if (bb.hi && ba.lo && *bb.hi <= *ba.lo) return a;
  if (b < a) std::swap(a, b);
  return make(ExprKind::Max, {a, b});
}

Bounds bounds(const Expr& e) {
  using O = std::optional<int64_t>;
  switch (e.kind()) {
    case ExprKind::Const: return {e.value(), e.value()};
    case ExprKind::Var: {
      // Size symbols are at least 0 (sizes) and index variables lie in [0, extent).
      if (auto x = e.extent()) return {0, *x - 1};
      if (e.is_size_symbol()) return {2, std::nullopt};
      if (auto x = e.index_extent()) {
        Bounds b = bounds(*x);
        return {0, b.hi ? std::optional<int64_t>(*b.hi - 1) : std::nullopt};
      }
      return {0, std::nullopt};
    }
    case ExprKind::Add: {
      O lo = 0, hi = 0;
      for (const Expr& a : e.args()) {
        Bounds b = bounds(a);
        lo = (lo && b.lo) ? O(*lo + *b.lo) : std::nullopt;
        hi = (hi && b.hi) ? O(*hi + *b.hi) : std::nullopt;
      }
      return {lo, hi};
    }
    case ExprKind::Mul: {
      // Products of non-negative factors with a constant scale.
      int64_t k = 1;
      O lo = 1, hi = 1;
      for (const Expr& a : e.args()) {
        if (auto c = a.as_const()) { k *= *c; continue; }
        Bounds b = bounds(a);
        if (!b.lo || *b.lo < 0) return {};
        lo = *lo * *b.lo;
        hi = (hi && b.hi) ? O(*hi * *b.hi) : std::nullopt;
      }
      if (k >= 0) return {*lo * k, hi ? O(*hi * k) : std::nullopt};
      return {hi ? O(*hi * k) : std::nullopt, *lo * k};
    }
    case ExprKind::FloorDiv: {
      Bounds a = bounds(e.args()[0]);
      auto c = e.args()[1].as_const();
      if (!c || *c <= 0) return {};
      return {a.lo ? O(fdiv(*a.lo, *c)) : std::nullopt, a.hi ? O(fdiv(*a.hi, *c)) : std::nullopt};
    }
    case ExprKind::Mod: {
      auto c = e.args()[1].as_const();
      if (!c || *c <= 0) return {};
      Bounds a = bounds(e.args()[0]);
      if (a.lo && *a.lo >= 0 && a.hi && *a.hi < *c) return a;
      return {0, *c - 1};
    }
    case ExprKind::Min:
    case ExprKind::Max: {
      Bounds a = bounds(e.args()[0]), b = bounds(e.args()[1]);
      // min(a, b) lies in [min(lo), min(hi)]; max(a, b) in [max(lo), max(hi)].
      auto both = [](O x, O y, bool take_min) -> O {
        if (!x || !y) return std::nullopt;
        return take_min ? std::min(*x, *y) : std::max(*x, *y);
      };
      bool is_min = e.kind() == ExprKind::Min;
      return {both(a.lo, b.lo, is_min), both(a.hi, b.hi, is_min)};
    }
  }
  return {};
}

Expr substitute(const Expr& e, const std::map<Expr, Expr>& repl) {
  switch (e.kind()) {
    case ExprKind::Const: return e;
    case ExprKind::Var: {
      auto it = repl.find(e);
      return it == repl.end() ? e : it->second;
    }
    default: break;
  }
  std::vector<Expr> a;
  for (const Expr& x : e.args()) a.push_back(substitute(x, repl));
  switch (e.kind()) {
    case ExprKind::Add: { Expr s = 0; for (auto& x : a) s = s + x; return s; }
    case ExprKind::Mul: { Expr s = 1; for (auto& x : a) s = s * x; return s; }
    case ExprKind::FloorDiv: return floordiv(a[0], a[1]);
    case ExprKind::Mod: return mod(a[0], a[1]);
    case ExprKind::Min: return min(a[0], a[1]);
    case ExprKind::Max: return max(a[0], a[1]);
    default: return e;
  }
}

bool depends_on(const Expr& e, const Expr& var) {
  if (e == var) return true;
  if (e.kind() == ExprKind::Const || e.kind() == ExprKind::Var) return false;
  for (const Expr& a : e.args())
    if (depends_on(a, var)) return true;
  return false;
}

namespace {
// Constants and size symbols only: a stride of a dynamic shape, never an index.
bool only_size_symbols(const Expr& e) {
  if (e.kind() == ExprKind::Const) return true;
  if (e.kind() == ExprKind::Var) return e.is_size_symbol();
  for (const Expr& a : e.args())
    if (!only_size_symbols(a)) return false;
  return true;
}
}  // namespace

std::optional<Affine> affine(const Expr& e, const std::vector<Expr>& vars) {
  Linear l = linearize(e);
  Affine out;
  out.coeffs.assign(vars.size(), Expr(0));
  Linear rest;
  rest.constant = l.constant;
  for (auto& [t, k] : l.terms) {
    auto it = std::find(vars.begin(), vars.end(), t);
    if (it != vars.end()) {
      out.coeffs[it - vars.begin()] = out.coeffs[it - vars.begin()] + Expr(k);
      continue;
    }
    // var * (a product of size symbols): a symbolic stride.
    if (t.kind() == ExprKind::Mul) {
      int found = -1;
      std::vector<Expr> others;
      bool ok = true;
      for (const Expr& f : t.args()) {
        auto vi = std::find(vars.begin(), vars.end(), f);
        if (vi != vars.end() && found < 0) {
          found = static_cast<int>(vi - vars.begin());
          continue;
        }
        if (!only_size_symbols(f)) ok = false;
        others.push_back(f);
      }
      if (!ok) return std::nullopt;
      if (found >= 0) {
        out.coeffs[found] = out.coeffs[found] + Expr(k) * product(others);
        continue;
      }
    }
    for (const Expr& v : vars)
      if (depends_on(t, v)) return std::nullopt;
    rest.terms[t] = k;
  }
  out.offset = build(rest);
  return out;
}

int64_t evaluate(const Expr& e, const std::function<int64_t(const Expr& var)>& value_of) {
  switch (e.kind()) {
    case ExprKind::Const: return e.value();
    case ExprKind::Var: return value_of(e);
    case ExprKind::Add: {
      int64_t s = 0;
      for (const Expr& a : e.args()) s += evaluate(a, value_of);
      return s;
    }
    case ExprKind::Mul: {
      int64_t s = 1;
      for (const Expr& a : e.args()) s *= evaluate(a, value_of);
      return s;
    }
    case ExprKind::FloorDiv: {
      int64_t a = evaluate(e.args()[0], value_of), b = evaluate(e.args()[1], value_of);
      return b == 0 ? 0 : fdiv(a, b);
    }
    case ExprKind::Mod: {
      int64_t a = evaluate(e.args()[0], value_of), b = evaluate(e.args()[1], value_of);
      return b == 0 ? 0 : fmod(a, b);
    }
    case ExprKind::Min: return std::min(evaluate(e.args()[0], value_of), evaluate(e.args()[1], value_of));
    case ExprKind::Max: return std::max(evaluate(e.args()[0], value_of), evaluate(e.args()[1], value_of));
  }
  return 0;
}

int64_t evaluate(const Expr& e, const std::function<int64_t(const Expr& var)>& value_of, bool& overflow) {
  auto ev = [&](const Expr& x) { return evaluate(x, value_of, overflow); };
  switch (e.kind()) {
    case ExprKind::Const: return e.value();
    case ExprKind::Var: return value_of(e);
    case ExprKind::Add: {
      int64_t s = 0;
      for (const Expr& a : e.args()) overflow |= __builtin_add_overflow(s, ev(a), &s);
      return s;
    }
    case ExprKind::Mul: {
      int64_t s = 1;
      for (const Expr& a : e.args()) overflow |= __builtin_mul_overflow(s, ev(a), &s);
      return s;
    }
    case ExprKind::FloorDiv: {
      int64_t a = ev(e.args()[0]), b = ev(e.args()[1]);
      return b == 0 ? 0 : fdiv(a, b);
    }
    case ExprKind::Mod: {
      int64_t a = ev(e.args()[0]), b = ev(e.args()[1]);
      return b == 0 ? 0 : fmod(a, b);
    }
    case ExprKind::Min: return std::min(ev(e.args()[0]), ev(e.args()[1]));
    case ExprKind::Max: return std::max(ev(e.args()[0]), ev(e.args()[1]));
  }
  return 0;
}

void collect_symbols(const Expr& e, std::vector<Expr>& out) {
  if (!e.valid() || e.kind() == ExprKind::Const) return;
  if (e.kind() == ExprKind::Var) {
    if (e.is_size_symbol() && std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
    return;
  }
  for (const Expr& a : e.args()) collect_symbols(a, out);
}

Expr product(const std::vector<Expr>& xs) {
  Expr p = 1;
  for (const Expr& x : xs) p = p * x;
  return p;
}

namespace {
std::string print(const Expr& e, bool c);
// A divisor that is a product must keep its grouping: x // (n*m), not (x // n)*m.
std::string operand(const Expr& e, bool c) {
  std::string s = print(e, c);
  return e.kind() == ExprKind::Mul ? "(" + s + ")" : s;
}
std::string print(const Expr& e, bool c) {
  switch (e.kind()) {
    case ExprKind::Const: {
      std::string s = std::to_string(e.value());
      return (c && (e.value() > 2147483647LL || e.value() < -2147483647LL)) ? s + "LL" : s;
    }
    case ExprKind::Var: return e.name();
    case ExprKind::Add: {
      std::string s;
      for (size_t i = 0; i < e.args().size(); ++i) {
        std::string t = print(e.args()[i], c);
        if (i && !t.empty() && t[0] == '-') s += " - " + t.substr(1);
        else s += (i ? " + " : "") + t;
      }
      return "(" + s + ")";
    }
    case ExprKind::Mul: {
      std::string s;
      for (size_t i = 0; i < e.args().size(); ++i) s += (i ? "*" : "") + print(e.args()[i], c);
      return s;
    }
    // C's / and % truncate: exact for the non-negative operands of index arithmetic; a
    // numerator that may be negative (a slice length over a dynamic size) takes the preludes'
    // floor forms, as Python and sym::evaluate compute it.
    case ExprKind::FloorDiv:
    case ExprKind::Mod: {
      const bool div = e.kind() == ExprKind::FloorDiv;
      Bounds b = bounds(e.args()[0]);
      if (c && !(b.lo && *b.lo >= 0))
        return std::string(div ? "kiln_ifloordiv(" : "kiln_imod(") + print(e.args()[0], c) + ", " + print(e.args()[1], c) + ")";
      return "(" + print(e.args()[0], c) + (div ? (c ? " / " : " // ") : " % ") + operand(e.args()[1], c) + ")";
    }
    // Both operands as long long in C: the helpers are templates over one type.
    case ExprKind::Min:
      return c ? "kiln_min((long long)" + operand(e.args()[0], c) + ", (long long)" + operand(e.args()[1], c) + ")"
               : "min(" + print(e.args()[0], c) + ", " + print(e.args()[1], c) + ")";
    case ExprKind::Max:
      return c ? "kiln_max((long long)" + operand(e.args()[0], c) + ", (long long)" + operand(e.args()[1], c) + ")"
               : "max(" + print(e.args()[0], c) + ", " + print(e.args()[1], c) + ")";
  }
  return "?";
}
std::string strip(std::string s) {
  if (s.size() > 1 && s.front() == '(' && s.back() == ')') {
    int depth = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      depth += s[i] == '(' ? 1 : s[i] == ')' ? -1 : 0;
      if (depth == 0 && i + 1 < s.size()) return s;
    }
    return s.substr(1, s.size() - 2);
  }
  return s;
}
}  // namespace

std::string Expr::str() const { return node_ ? strip(print(*this, false)) : "<null>"; }
std::string Expr::c_str() const { return print(*this, true); }

std::string str(const std::vector<Expr>& xs) {
  std::string s = "[";
  for (size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + xs[i].str();
  return s + "]";
}

}  // namespace kiln::sym
