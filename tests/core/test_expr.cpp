// Unit tests of the symbolic integer expressions (core/sym/expr.h): interning, the
// simplifications the constructors apply, bounds, substitution, affine decomposition and printing.
//
// Interned expressions compare by pointer, so EXPECT_EQ(a, b) below asserts that two
// differently built expressions simplified to the very same canonical node.
#include <gtest/gtest.h>

#include <climits>
#include <map>
#include <string>

#include "core/sym/expr.h"

using kiln::sym::Expr;
using kiln::sym::ExprKind;
namespace sym = kiln::sym;

namespace {

// Python's // and % on plain integers: the reference the symbolic rules must agree with.
int64_t py_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t py_mod(int64_t a, int64_t b) { return a - py_floordiv(a, b) * b; }

// Evaluates `e` by substituting constants for its variables; every variable must be bound.
int64_t eval(const Expr& e, const std::map<Expr, int64_t>& env) {
  std::map<Expr, Expr> repl;
  for (const auto& [v, x] : env) repl[v] = Expr(x);
  Expr r = sym::substitute(e, repl);
  EXPECT_TRUE(r.as_const().has_value()) << e.str() << " did not evaluate to a constant: " << r.str();
  return r.as_const().value_or(INT64_MIN);
}

}  // namespace

// ---- interning and constant folding ----

TEST(Expr, InterningMakesStructurallyEqualExpressionsIdentical) {
  EXPECT_EQ(Expr::var("x"), Expr::var("x"));
  EXPECT_EQ(Expr::var("x").node(), Expr::var("x").node());
  EXPECT_NE(Expr::var("x"), Expr::var("y"));
  // The extent is part of a variable's identity.
  EXPECT_NE(Expr::var("i", 8), Expr::var("i", 4));
  EXPECT_NE(Expr::var("i", 8), Expr::var("i"));
  EXPECT_EQ(Expr::var("i", 8).extent(), std::optional<int64_t>(8));
  EXPECT_FALSE(Expr::var("s").extent().has_value());
  EXPECT_EQ(Expr(7), Expr(int64_t{7}));
  EXPECT_EQ(Expr(7).kind(), ExprKind::Const);
  EXPECT_EQ(Expr(7).value(), 7);
  EXPECT_EQ(Expr::var("x").name(), "x");
  EXPECT_FALSE(Expr().valid());
}

TEST(Expr, ConstantFolding) {
  EXPECT_TRUE((Expr(2) + Expr(3)).is_const(5));
  EXPECT_TRUE((Expr(6) * Expr(7)).is_const(42));
  EXPECT_TRUE((Expr(2) - Expr(9)).is_const(-7));
  EXPECT_TRUE((-Expr(4)).is_const(-4));
  EXPECT_TRUE(((Expr(2) + 3) * 4).is_const(20));
  EXPECT_TRUE(sym::floordiv(Expr(7), Expr(2)).is_const(3));
  EXPECT_TRUE(sym::mod(Expr(7), Expr(3)).is_const(1));
  EXPECT_TRUE(sym::min(Expr(3), Expr(5)).is_const(3));
  EXPECT_TRUE(sym::max(Expr(3), Expr(5)).is_const(5));
  EXPECT_TRUE(sym::product({}).is_const(1));
  EXPECT_TRUE(sym::product({Expr(2), Expr(3), Expr(4)}).is_const(24));
  // Folded constants are the interned constant node itself.
  EXPECT_EQ(Expr(2) + Expr(3), Expr(5));
}

TEST(Expr, FloorSemanticsForNegativeConstants) {
  EXPECT_TRUE(sym::floordiv(Expr(-7), Expr(2)).is_const(-4));
  EXPECT_TRUE(sym::mod(Expr(-7), Expr(2)).is_const(1));
  EXPECT_TRUE(sym::floordiv(Expr(7), Expr(-2)).is_const(-4));
  EXPECT_TRUE(sym::mod(Expr(7), Expr(-2)).is_const(-1));
  EXPECT_TRUE(sym::floordiv(Expr(-7), Expr(-2)).is_const(3));
  EXPECT_TRUE(sym::mod(Expr(-7), Expr(-2)).is_const(-1));
  EXPECT_TRUE(sym::floordiv(Expr(-8), Expr(2)).is_const(-4));
  EXPECT_TRUE(sym::mod(Expr(-8), Expr(2)).is_const(0));
  // The same semantics when the negative constant sits next to a symbolic term.
  Expr j = Expr::var("j", 8);
  for (int64_t v = 0; v < 8; ++v) {
    EXPECT_EQ(eval(sym::floordiv(j - 1, Expr(8)), {{j, v}}), py_floordiv(v - 1, 8)) << "j=" << v;
    EXPECT_EQ(eval(sym::mod(j - 1, Expr(8)), {{j, v}}), py_mod(v - 1, 8)) << "j=" << v;
  }
}

// ---- algebraic identities and canonical sums/products ----

TEST(Expr, IdentityElements) {
  Expr x = Expr::var("x");
  EXPECT_EQ(x + 0, x);
  EXPECT_EQ(Expr(0) + x, x);
  EXPECT_EQ(x * 1, x);
  EXPECT_EQ(Expr(1) * x, x);
  EXPECT_TRUE((x * 0).is_const(0));
  EXPECT_TRUE((Expr(0) * x).is_const(0));
  EXPECT_TRUE((x - x).is_const(0));
  EXPECT_EQ(sym::floordiv(x, Expr(1)), x);
  EXPECT_TRUE(sym::mod(x, Expr(1)).is_const(0));
  EXPECT_TRUE(sym::floordiv(Expr(0), x).is_const(0));
  EXPECT_EQ(-(-x), x);
}

TEST(Expr, SumsAndProductsAreCanonical) {
  Expr x = Expr::var("x"), y = Expr::var("y"), z = Expr::var("z");
  EXPECT_EQ(x + y, y + x);
  EXPECT_EQ((x + y) + z, x + (y + z));
  EXPECT_EQ(x + 1, Expr(1) + x);
  EXPECT_EQ(x * y, y * x);
  EXPECT_EQ((x * y) * z, x * (y * z));
  EXPECT_EQ((x + y).kind(), ExprKind::Add);
  EXPECT_EQ((x * y).kind(), ExprKind::Mul);
  // Flattened: a sum of three terms is one Add node with three operands.
  EXPECT_EQ(((x + y) + z).args().size(), 3u);
}

TEST(Expr, CollectsLikeTerms) {
  Expr x = Expr::var("x"), y = Expr::var("y");
  EXPECT_EQ(x * 2 + x * 3, x * 5);
  EXPECT_EQ(x * 2 + x * 3, Expr(5) * x);
  EXPECT_EQ(x + x, 2 * x);
  EXPECT_EQ((x + y) - x, y);
  EXPECT_TRUE((2 * x - x * 2).is_const(0));
  EXPECT_EQ(3 * (x * y) + (y * x), 4 * (x * y));
  EXPECT_EQ((x + 2) + (x + 3), 2 * x + 5);
}

TEST(Expr, DistributesConstants) {
  Expr x = Expr::var("x"), y = Expr::var("y");
  EXPECT_EQ(2 * (x + 3), 2 * x + 6);
  EXPECT_EQ((x + y) * 2, 2 * x + 2 * y);
  EXPECT_EQ((x + 1) * 3 - 3, 3 * x);
  EXPECT_EQ(4 * (2 * x), 8 * x);
  EXPECT_EQ(-(x - y), y - x);
  // Products of symbols are not expanded.
  EXPECT_EQ(((x + 1) * y).kind(), ExprKind::Mul);
}

// ---- floor division and modulo over bounded index variables ----

TEST(Expr, FloorDivAndModUndoAFlattenedIndex) {
  Expr i = Expr::var("i", 8), j = Expr::var("j", 8);
  EXPECT_EQ(sym::floordiv(i * 8 + j, Expr(8)), i);
  EXPECT_EQ(sym::mod(i * 8 + j, Expr(8)), j);
  EXPECT_TRUE(sym::floordiv(j, Expr(8)).is_const(0));
  EXPECT_EQ(sym::mod(j, Expr(8)), j);
  EXPECT_EQ(sym::floordiv(i * 8 + j + 16, Expr(8)), i + 2);
  EXPECT_EQ(sym::mod(i * 8 + j + 16, Expr(8)), j);
  EXPECT_EQ(sym::floordiv(i * 8 + j - 8, Expr(8)), i - 1);
  // Terms with a multiple of the divisor are pulled out even when the rest is unbounded.
  Expr x = Expr::var("x");
  EXPECT_EQ(sym::floordiv(x * 8 + 8, Expr(8)), x + 1);
  EXPECT_EQ(sym::mod(x * 8 + j, Expr(8)), j);
}

TEST(Expr, FloorDivAndModStaySymbolicWhenTheRemainderMayReachTheDivisor) {
  Expr i = Expr::var("i", 8), j9 = Expr::var("j", 9), x = Expr::var("x");
  // j in [0, 9) can reach 8: (8*i + j) // 8 is not i.
  EXPECT_NE(sym::floordiv(i * 8 + j9, Expr(8)), i);
  EXPECT_NE(sym::mod(i * 8 + j9, Expr(8)), j9);
  EXPECT_EQ(eval(sym::floordiv(i * 8 + j9, Expr(8)), {{i, 2}, {j9, 8}}), 3);
  EXPECT_EQ(eval(sym::mod(i * 8 + j9, Expr(8)), {{i, 2}, {j9, 8}}), 0);
  // Unbounded sizes keep their division.
  EXPECT_EQ(sym::floordiv(x, Expr(8)).kind(), ExprKind::FloorDiv);
  EXPECT_EQ(sym::mod(x, Expr(8)).kind(), ExprKind::Mod);
}

TEST(Expr, ReshapeRule) {
  // (x*a + y) // (a*b) == x // b when 0 <= y < a; here a = 4, b = 3.
  Expr x = Expr::var("x"), y = Expr::var("y", 4);
  EXPECT_EQ(sym::floordiv(x * 4 + y, Expr(12)), sym::floordiv(x, Expr(3)));
  EXPECT_EQ(sym::mod(x * 4 + y, Expr(12)), sym::mod(x, Expr(3)) * 4 + y);
  // y in [0, 5) may carry into the next multiple of 4: the rule must not fire.
  Expr y5 = Expr::var("y", 5);
  EXPECT_NE(sym::floordiv(x * 4 + y5, Expr(12)), sym::floordiv(x, Expr(3)));
  EXPECT_EQ(eval(sym::floordiv(x * 4 + y5, Expr(12)), {{x, 2}, {y5, 4}}), 1);

  // Viewing a [6, 4] iteration space as [2, 3, 4]: the index of each output dim.
  Expr r = Expr::var("r", 6), c = Expr::var("c", 4);
  Expr lin = r * 4 + c;
  EXPECT_EQ(sym::floordiv(lin, Expr(12)), sym::floordiv(r, Expr(3)));
  EXPECT_EQ(sym::mod(sym::floordiv(lin, Expr(4)), Expr(3)), sym::mod(r, Expr(3)));
  EXPECT_EQ(sym::mod(lin, Expr(4)), c);
}

TEST(Expr, DivisionRulesAgreeWithIntegerArithmetic) {
  // Every simplified form must still compute Python's // and % on the whole domain.
  Expr i = Expr::var("i", 6), j = Expr::var("j", 4), k = Expr::var("k", 5);
  struct Case {
    Expr num;
    int64_t div;
  };
  std::vector<Case> cases = {
      {i * 4 + j, 4}, {i * 4 + j, 12}, {i * 4 + j, 8}, {i * 6 + j * 2, 4}, {i * 12 + j * 3 + k, 6},
      {i * 4 + j - 5, 4}, {j - i, 3}, {i * 20 + j * 5 + k, 10}, {i * 6, 4},
  };
  for (const Case& cs : cases) {
    Expr q = sym::floordiv(cs.num, Expr(cs.div)), m = sym::mod(cs.num, Expr(cs.div));
    for (int64_t a = 0; a < 6; ++a)
      for (int64_t b = 0; b < 4; ++b)
        for (int64_t d = 0; d < 5; ++d) {
          std::map<Expr, int64_t> env{{i, a}, {j, b}, {k, d}};
          int64_t v = eval(cs.num, env);
          ASSERT_EQ(eval(q, env), py_floordiv(v, cs.div)) << "(" << cs.num.str() << ") // " << cs.div << " -> " << q.str();
          ASSERT_EQ(eval(m, env), py_mod(v, cs.div)) << "(" << cs.num.str() << ") % " << cs.div << " -> " << m.str();
        }
  }
}

// ---- min / max ----

TEST(Expr, MinMaxSimplifyByBounds) {
  Expr i = Expr::var("i", 8), j = Expr::var("j", 8), x = Expr::var("x");
  EXPECT_EQ(sym::min(i, Expr(8)), i);
  EXPECT_TRUE(sym::max(i, Expr(8)).is_const(8));
  EXPECT_EQ(sym::max(i, Expr(0)), i);
  EXPECT_EQ(sym::max(x, Expr(0)), x);  // sizes are non-negative
  EXPECT_EQ(sym::min(x, x), x);
  EXPECT_EQ(sym::min(i, j), sym::min(j, i));
  EXPECT_EQ(sym::min(i, j).kind(), ExprKind::Min);
  EXPECT_EQ(sym::max(i, j), sym::max(j, i));
  EXPECT_EQ(sym::max(i, j).kind(), ExprKind::Max);
}

TEST(Expr, BoundsOfMaxCoverTheLargerOperand) {
  Expr i = Expr::var("i", 4), j = Expr::var("j", 8);
  sym::Bounds b = sym::bounds(sym::max(i, j));
  ASSERT_TRUE(b.lo.has_value() && b.hi.has_value());
  EXPECT_EQ(*b.lo, 0);
  EXPECT_EQ(*b.hi, 7);  // max(i, j) reaches 7 when j = 7
  // The unsound bound lets min() drop a clamp that matters.
  Expr clamped = sym::min(sym::max(i, j), Expr(3));
  EXPECT_EQ(eval(clamped, {{i, 0}, {j, 7}}), 3) << clamped.str();
}

TEST(Expr, BoundsOfMinAreSound) {
  Expr i = Expr::var("i", 4), j = Expr::var("j", 8);
  sym::Bounds b = sym::bounds(sym::min(i, j));
  ASSERT_TRUE(b.lo.has_value() && b.hi.has_value());
  EXPECT_EQ(*b.lo, 0);
  EXPECT_GE(*b.hi, 3);  // min(i, j) reaches 3
  EXPECT_LE(*b.hi, 7);
}

// ---- bounds ----

TEST(Expr, Bounds) {
  Expr i = Expr::var("i", 8), j = Expr::var("j", 8), x = Expr::var("x");
  auto check = [](const Expr& e, std::optional<int64_t> lo, std::optional<int64_t> hi) {
    sym::Bounds b = sym::bounds(e);
    EXPECT_EQ(b.lo, lo) << e.str();
    EXPECT_EQ(b.hi, hi) << e.str();
  };
  check(Expr(5), 5, 5);
  check(Expr(-3), -3, -3);
  check(i, 0, 7);
  check(x, 0, std::nullopt);  // sizes are >= 0, unbounded above
  check(i * 8 + j, 0, 63);
  check(x + 1, 1, std::nullopt);
  check(j - 3 * i, -21, 7);
  check(-2 * i, -14, 0);
  check(sym::mod(x, Expr(5)), 0, 4);
  check(sym::mod(j, Expr(5)), 0, 4);
  check(sym::floordiv(i * 8 + j, Expr(4)), 0, 15);
  check(sym::floordiv(x, Expr(4)), 0, std::nullopt);
  check(i * j, 0, 49);
}

// ---- substitute / affine / depends_on ----

TEST(Expr, SubstituteResimplifies) {
  Expr i = Expr::var("i", 8), j = Expr::var("j", 8), x = Expr::var("x"), n = Expr::var("n"), y = Expr::var("y", 4);
  EXPECT_EQ(sym::substitute(i * 8 + j, {{i, x + 1}}), 8 * x + j + 8);
  EXPECT_EQ(sym::substitute(sym::floordiv(x, Expr(8)), {{x, 8 * n + y}}), n);
  EXPECT_EQ(sym::substitute(sym::mod(x, Expr(8)), {{x, 8 * n + y}}), y);
  EXPECT_TRUE(sym::substitute(i * j + 1, {{i, Expr(3)}, {j, Expr(5)}}).is_const(16));
  EXPECT_TRUE(sym::substitute(sym::min(x, n), {{x, Expr(2)}, {n, Expr(9)}}).is_const(2));
  EXPECT_TRUE(sym::substitute(sym::max(x, n), {{x, Expr(2)}, {n, Expr(9)}}).is_const(9));
  // Unmapped variables are left alone.
  EXPECT_EQ(sym::substitute(i * 8 + j, {{x, Expr(1)}}), i * 8 + j);
  EXPECT_EQ(sym::substitute(i * 8 + j, {}), i * 8 + j);
}

TEST(Expr, AffineCoefficients) {
  Expr i = Expr::var("i", 8), j = Expr::var("j", 8), n = Expr::var("n");
  auto a = sym::affine(i * 8 + j * 2 + n + 3, {i, j});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->coeffs, (std::vector<Expr>{8, 2}));
  EXPECT_EQ(a->offset, n + 3);

  auto b = sym::affine(2 * (i + 3 * j) - i, {j, i});
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->coeffs, (std::vector<Expr>{6, 1}));
  EXPECT_TRUE(b->offset.is_const(0));

  // An expression free of the variables: zero coefficients, itself as the offset.
  auto c = sym::affine(n * 4 + 1, {i});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->coeffs, (std::vector<Expr>{0}));
  EXPECT_EQ(c->offset, n * 4 + 1);
}

TEST(Expr, AffineCoefficientsMayBeSizeSymbols) {
  // A dynamic shape's strides: i walks rows of s1 elements.
  Expr i = Expr::var("i"), j = Expr::var("j"), s0 = Expr::size_symbol("s0"), s1 = Expr::size_symbol("s1");
  auto a = sym::affine(i * s1 + j + s0 * s1, {i, j});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->coeffs, (std::vector<Expr>{s1, 1}));
  EXPECT_EQ(a->offset, s0 * s1);
  // An index variable is never a coefficient.
  EXPECT_FALSE(sym::affine(i * j * s1, {i}).has_value());
}

TEST(Expr, SizeSymbolsEvaluateAndAreAtLeastTwo) {
  Expr s0 = Expr::size_symbol("s0"), s1 = Expr::size_symbol("s1"), i = Expr::var("s0");
  EXPECT_NE(s0, i);  // an index variable of the same name is another variable
  EXPECT_TRUE(s0.is_size_symbol());
  EXPECT_FALSE(i.is_size_symbol());
  EXPECT_EQ(sym::bounds(s0).lo, 2);
  auto val = [&](const Expr& v) -> int64_t { return v == s0 ? 7 : 3; };
  EXPECT_EQ(sym::evaluate(s0 * s1 + 1, val), 22);
  EXPECT_EQ(sym::evaluate(sym::floordiv(s0 - 10, s1), val), -1);  // floor, as Python
  EXPECT_EQ(sym::evaluate(sym::mod(s0 - 10, s1), val), 0);
  EXPECT_EQ(sym::evaluate(sym::min(s0, s1 * 4), val), 7);
  std::vector<Expr> syms;
  sym::collect_symbols(s1 * (s0 + i) + s1, syms);
  EXPECT_EQ(syms, (std::vector<Expr>{s1, s0}));
}

TEST(Expr, AffineRejectsNonAffine) {
  Expr i = Expr::var("i", 8), j = Expr::var("j", 8), n = Expr::var("n");
  EXPECT_FALSE(sym::affine(i * j, {i, j}).has_value());
  EXPECT_FALSE(sym::affine(i * j, {i}).has_value());  // coefficient of i is not a constant
  EXPECT_FALSE(sym::affine(i * n + j, {i, j}).has_value());
  EXPECT_FALSE(sym::affine(sym::floordiv(i, Expr(3)) + j, {i, j}).has_value());
  EXPECT_FALSE(sym::affine(sym::mod(i, Expr(3)), {i}).has_value());
  EXPECT_FALSE(sym::affine(sym::min(i, j), {i}).has_value());
}

TEST(Expr, DependsOn) {
  Expr i = Expr::var("i", 8), j = Expr::var("j", 8), n = Expr::var("n");
  EXPECT_TRUE(sym::depends_on(i * 8 + j, i));
  EXPECT_TRUE(sym::depends_on(sym::floordiv(n + i, Expr(3)), i));
  EXPECT_FALSE(sym::depends_on(n * 2 + 1, i));
  EXPECT_FALSE(sym::depends_on(Expr(3), i));
}

// ---- printing ----

// Operands of sums, products, min and max print in creation order, so the printing tests use
// variables that no other test creates.
TEST(Expr, StrIsReadable) {
  Expr row = Expr::var("row", 16), col = Expr::var("col", 16);
  Expr s0 = Expr::var("s0"), s1 = Expr::var("s1");
  EXPECT_EQ(Expr(42).str(), "42");
  EXPECT_EQ(Expr(-3).str(), "-3");
  EXPECT_EQ(s0.str(), "s0");
  EXPECT_EQ((row * 16 + col).str(), "16*row + col");
  EXPECT_EQ((s0 * 2 + s0 * 3).str(), "5*s0");
  EXPECT_EQ((s0 - 1).str(), "s0 - 1");
  EXPECT_EQ((s1 * s0).str(), "s0*s1");
  EXPECT_EQ(sym::floordiv(s0, Expr(8)).str(), "s0 // 8");
  EXPECT_EQ(sym::mod(s0, Expr(8)).str(), "s0 % 8");
  EXPECT_EQ(sym::floordiv(s0 + 1, Expr(8)).str(), "(s0 + 1) // 8");
  EXPECT_EQ(sym::min(s1, s0).str(), "min(s0, s1)");
  EXPECT_EQ(sym::max(s1, s0).str(), "max(s0, s1)");
  EXPECT_EQ(Expr().str(), "<null>");
  EXPECT_EQ(sym::str({Expr(2), Expr(3), s0}), "[2, 3, s0]");
  EXPECT_EQ(sym::str({}), "[]");
}

TEST(Expr, CStrIsCSource) {
  Expr t0 = Expr::var("t0"), t1 = Expr::var("t1", 4);
  EXPECT_EQ(sym::floordiv(t0, Expr(8)).c_str(), "(t0 / 8)");
  EXPECT_EQ(sym::mod(t0, Expr(8)).c_str(), "(t0 % 8)");
  EXPECT_EQ(sym::min(t1, t0).c_str(), "kiln_min((long long)t0, (long long)t1)");  // one type for the template
  EXPECT_EQ(sym::max(t1, t0).c_str(), "kiln_max((long long)t0, (long long)t1)");
  // Constants past the int range get a 64-bit suffix.
  EXPECT_EQ((Expr(int64_t{1} << 40) * t0).c_str(), "1099511627776LL*t0");
  EXPECT_EQ(Expr(7).c_str(), "7");
}

TEST(Expr, PrintedDivisionByAProductKeepsItsGrouping) {
  Expr x = Expr::var("x"), n = Expr::var("n"), m = Expr::var("m");
  std::string s = sym::floordiv(x, n * m).str();
  EXPECT_NE(s.find("// ("), std::string::npos) << s;
  std::string c = sym::floordiv(x, n * m).c_str();
  EXPECT_NE(c.find("/ ("), std::string::npos) << c;
  std::string ms = sym::mod(x, n * m).str();
  EXPECT_NE(ms.find("% ("), std::string::npos) << ms;
  std::string mc = sym::mod(x, n * m).c_str();
  EXPECT_NE(mc.find("% ("), std::string::npos) << mc;
}

TEST(Expr, DivisionBySizesOfIndexVariablesOverSizes) {
  // The index arithmetic of reshapes over dynamic sizes: loop variables over [0, s2) divided by
  // products of sizes fold away, as they do for constant sizes.
  Expr s1 = Expr::size_symbol("s1"), s2 = Expr::size_symbol("s2");
  Expr r0 = Expr::index_var("r0", s2), x1 = Expr::index_var("x1", s1), x2 = Expr::index_var("x2", s2);
  EXPECT_TRUE(sym::floordiv(r0 + s2 * x2, s2 * s2).is_const(0));
  EXPECT_EQ(sym::mod(r0 + s2 * x2 + s1 * s2 * s2 * x1, s2), r0);
  EXPECT_EQ(sym::mod(sym::floordiv(r0 + s2 * x2 + s2 * s2 * x1, s2), s2), x2);
  EXPECT_EQ(sym::floordiv(r0 + s2 * x2 + s2 * s2 * x1, s2 * s2), x1);
  // Not provably in range: kept.
  Expr y = Expr::index_var("y", s1);
  EXPECT_FALSE(sym::floordiv(y, s2).as_const().has_value());
}

TEST(Expr, AConstantMultipleOfASizeDividedByItIsTheConstant) {
  // x.view(x.shape[0], -1) of a [s0, 6] tensor: (6*s0) // s0 is 6, a constant shape rules can
  // compare with 6 (it was a term 6*1, and a backward's mm refused [s0, 6*1] @ [6, 5])
  const Expr s0 = Expr::size_symbol("s0");
  EXPECT_TRUE(sym::floordiv(Expr(6) * s0, s0).is_const(6));
  EXPECT_TRUE(sym::mod(Expr(6) * s0, s0).is_const(0));
}
