// Integer symbolic expressions: tensor sizes, strides and the index arithmetic of kernels.
//
// Expressions are immutable and interned: structurally equal expressions are the same node,
// so equality is a pointer compare and hashing is free. Constructors simplify as they build
// (constant folding, flattening and collecting sums and products, the floor-division and
// modulo rules that undo reshapes), so every Expr is already in canonical form.
//
// Variables have a known range [0, extent) when they index a loop; size symbols have no
// upper bound. Division and modulo are floor division and Python modulo; the printers assume
// the non-negative operands that index arithmetic produces.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kiln::sym {

enum class ExprKind : uint8_t { Const, Var, Add, Mul, FloorDiv, Mod, Min, Max };

struct ExprNode;

class Expr {
 public:
  Expr() : node_(nullptr) {}
  Expr(int64_t v);  // NOLINT: constants convert implicitly so shape code reads naturally
  Expr(int v) : Expr(static_cast<int64_t>(v)) {}  // NOLINT
  static Expr var(const std::string& name, std::optional<int64_t> extent = std::nullopt);
  // A dynamic size ("s0"): a Var that stands for a tensor dim of at least 2 (sizes 0 and 1
  // are never symbolic, as in torch), bound per call from the inputs. Distinct from an index
  // variable of the same name.
  static Expr size_symbol(const std::string& name);
  // An index variable over [0, extent): a constant extent, or a symbolic one (a loop over a
  // dynamic size), which lets floor division and modulo by sizes simplify.
  static Expr index_var(const std::string& name, const Expr& extent);
  std::optional<Expr> index_extent() const;  // Var only: its extent as an expression, if any
  bool is_size_symbol() const;

  const ExprNode* node() const { return node_; }
  bool valid() const { return node_ != nullptr; }
  ExprKind kind() const;
  std::optional<int64_t> as_const() const;
  bool is_const(int64_t v) const { auto c = as_const(); return c && *c == v; }
  const std::vector<Expr>& args() const;
  const std::string& name() const;         // Var only
  std::optional<int64_t> extent() const;   // Var only
  int64_t value() const;                   // Const only

  bool operator==(const Expr& o) const { return node_ == o.node_; }
  bool operator!=(const Expr& o) const { return node_ != o.node_; }
  bool operator<(const Expr& o) const;     // a stable total order (by creation id)
  uint64_t id() const;

  std::string str() const;                 // readable, e.g. "i0*64 + i1"
  std::string c_str() const;               // C/C++/CUDA source text (int64 arithmetic)

  explicit Expr(const ExprNode* n) : node_(n) {}

 private:
  const ExprNode* node_;
};

struct ExprNode {
  ExprKind kind;
  int64_t value = 0;              // Const: the value; Var: extent, -1 unbounded, -2 a size symbol,
                                  // -3 a symbolic extent (args[0])
  std::string name;               // Var
  std::vector<Expr> args;         // operands, canonical order for Add/Mul
  uint64_t id = 0;                // creation order
  size_t hash = 0;
};

Expr operator+(Expr a, Expr b);
Expr operator-(Expr a, Expr b);
Expr operator-(Expr a);
Expr operator*(Expr a, Expr b);
Expr floordiv(Expr a, Expr b);
Expr mod(Expr a, Expr b);
Expr min(Expr a, Expr b);
Expr max(Expr a, Expr b);

// Conservative bounds [lo, hi] (inclusive) when they can be derived.
struct Bounds { std::optional<int64_t> lo, hi; };
Bounds bounds(const Expr& e);

// Replace variables by expressions (re-simplifying).
Expr substitute(const Expr& e, const std::map<Expr, Expr>& repl);

// If `e` is affine in `vars`, returns the coefficients and the remaining offset. Coefficients
// and offset are free of `vars` but may hold size symbols (the strides of a dynamic shape).
struct Affine { std::vector<Expr> coeffs; Expr offset; };
std::optional<Affine> affine(const Expr& e, const std::vector<Expr>& vars);

bool depends_on(const Expr& e, const Expr& var);

// The value of `e` with every size symbol bound by `value_of` (called with each Var; it must
// know them all). Floor division and modulo as Python's; a zero divisor gives 0.
int64_t evaluate(const Expr& e, const std::function<int64_t(const Expr& var)>& value_of);
// The same, setting `overflow` when a sum or product leaves int64 (its result is then garbage).
int64_t evaluate(const Expr& e, const std::function<int64_t(const Expr& var)>& value_of, bool& overflow);

// Size symbols in `e`, each once, in order of first appearance (appended to `out`).
void collect_symbols(const Expr& e, std::vector<Expr>& out);

// Product of a list (1 for an empty list).
Expr product(const std::vector<Expr>& xs);

std::string str(const std::vector<Expr>& xs);  // "[2, 3, s0]"

}  // namespace kiln::sym

template <>
struct std::hash<kiln::sym::Expr> {
  size_t operator()(const kiln::sym::Expr& e) const noexcept { return std::hash<const void*>()(e.node()); }
};
