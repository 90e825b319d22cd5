#include <gtest/gtest.h>

#include <algorithm>

#include "core/sym/fit.h"

using kiln::sym::Expr;
using kiln::sym::fit_multilinear;

namespace {

int64_t eval(const Expr& e, const std::vector<Expr>& syms, const std::vector<int64_t>& vals) {
  return kiln::sym::evaluate(e, [&](const Expr& v) {
    for (size_t i = 0; i < syms.size(); ++i)
      if (syms[i] == v) return vals[i];
    return int64_t{-1};
  });
}

}  // namespace

TEST(FitMultilinear, CatAndContiguousStridesOfTwoSymbols) {
  Expr b = Expr::size_symbol("fb"), s = Expr::size_symbol("fs");
  // cat([x[b, 4, s, 8], y[b, 4, 1, 8]], dim=2): sizes [b, 4, s + 1, 8], contiguous strides
  auto probe = [](const std::vector<int64_t>& v) -> std::optional<std::vector<int64_t>> {
    int64_t B = v[0], S = v[1];
    return std::vector<int64_t>{B, 4, S + 1, 8, 4 * (S + 1) * 8, (S + 1) * 8, 8, 1};
  };
  auto fit = fit_multilinear({b, s}, {2, 16}, probe);
  ASSERT_TRUE(fit);
  EXPECT_EQ((*fit)[0], b);
  EXPECT_EQ((*fit)[2], s + 1);
  EXPECT_EQ((*fit)[4], Expr(32) * s + 32);
  for (int64_t B : {3, 7}) for (int64_t S : {2, 100})
    EXPECT_EQ(eval((*fit)[4], {b, s}, {B, S}), 32 * (S + 1));
}

TEST(FitMultilinear, ProductOfTwoSymbols) {
  Expr b = Expr::size_symbol("pb"), s = Expr::size_symbol("ps");
  auto probe = [](const std::vector<int64_t>& v) -> std::optional<std::vector<int64_t>> {
    return std::vector<int64_t>{v[0] * v[1] * 3 - 2};
  };
  auto fit = fit_multilinear({b, s}, {5, 9}, probe);
  ASSERT_TRUE(fit);
  EXPECT_EQ((*fit)[0], Expr(3) * (b * s) - 2);
}

TEST(FitMultilinear, FloorDivisionAndSquaresAndRejectionsHaveNoFit) {
  Expr s = Expr::size_symbol("qs");
  auto pool = [](const std::vector<int64_t>& v) -> std::optional<std::vector<int64_t>> {
    return std::vector<int64_t>{(v[0] - 3) / 2 + 1};
  };
  EXPECT_FALSE(fit_multilinear({s}, {16}, pool));
  auto square = [](const std::vector<int64_t>& v) -> std::optional<std::vector<int64_t>> {
    return std::vector<int64_t>{v[0] * v[0]};
  };
  EXPECT_FALSE(fit_multilinear({s}, {16}, square));
  auto clamp = [](const std::vector<int64_t>& v) -> std::optional<std::vector<int64_t>> {
    return std::vector<int64_t>{std::min<int64_t>(v[0], 20)};
  };
  EXPECT_FALSE(fit_multilinear({s}, {16}, clamp));
  auto rejects = [](const std::vector<int64_t>& v) -> std::optional<std::vector<int64_t>> {
    if (v[0] > 17) return std::nullopt;
    return std::vector<int64_t>{v[0]};
  };
  EXPECT_FALSE(fit_multilinear({s}, {16}, rejects));
}

TEST(FitMultilinear, AMinOfTwoSizesIsNoFitWhereTheOtherIsSmallerFarAway) {
  // torch.diag's length min(s0, s1) at (3, 5) follows s0 near the hints; moving s0 alone past
  // s1 shows the min (the fit said s0, and a (5, 3) input then broke the compiled graph)
  Expr a = Expr::size_symbol("dga"), b = Expr::size_symbol("dgb");
  auto diag = [](const std::vector<int64_t>& v) -> std::optional<std::vector<int64_t>> {
    return std::vector<int64_t>{std::min(v[0], v[1])};
  };
  EXPECT_FALSE(fit_multilinear({a, b}, {3, 5}, diag));
  EXPECT_FALSE(fit_multilinear({a, b}, {9, 2}, diag));
}

TEST(EvaluateChecked, SumsAndProductsPastInt64AreReported) {
  Expr s = Expr::size_symbol("ovs");
  auto value = [](int64_t v) { return [v](const Expr&) { return v; }; };
  bool overflow = false;
  EXPECT_EQ(kiln::sym::evaluate(s * s * s, value(1000), overflow), 1000000000);
  EXPECT_FALSE(overflow);
  kiln::sym::evaluate(s * s * s * s, value(int64_t{1} << 20), overflow);
  EXPECT_TRUE(overflow);
  overflow = false;
  kiln::sym::evaluate(s + INT64_MAX, value(5), overflow);
  EXPECT_TRUE(overflow);
}
