#include "core/sym/fit.h"

#include <algorithm>

namespace kiln::sym {

std::optional<std::vector<Expr>> fit_multilinear(const std::vector<Expr>& symbols, const std::vector<int64_t>& hints,
                                                 const Probe& probe, size_t max_symbols) {
  const size_t n = symbols.size();
  if (n == 0 || n > max_symbols || hints.size() != n) return std::nullopt;
  const size_t corners = size_t{1} << n;
  // v[mask]: the quantities with t_i = s_i - h_i = 1 for the bits of mask, 0 for the others
  std::vector<std::vector<int64_t>> v(corners);
  for (size_t mask = 0; mask < corners; ++mask) {
    std::vector<int64_t> at(hints);
    for (size_t i = 0; i < n; ++i) at[i] += (mask >> i) & 1;
    auto r = probe(at);
    if (!r || (mask && r->size() != v[0].size())) return std::nullopt;
    v[mask] = std::move(*r);
  }
  const size_t m = v[0].size();
  // Möbius inversion: q(t) = sum over subsets S of a[S] * prod_{i in S} t_i
  std::vector<std::vector<int64_t>> a = v;
  for (size_t i = 0; i < n; ++i)
    for (size_t mask = 0; mask < corners; ++mask)
      if (mask >> i & 1)
        for (size_t k = 0; k < m; ++k) a[mask][k] -= a[mask ^ (size_t{1} << i)][k];
  auto predict = [&](const std::vector<int64_t>& t, size_t k) {
    int64_t q = 0;
    for (size_t mask = 0; mask < corners; ++mask) {
      int64_t term = a[mask][k];
      for (size_t i = 0; i < n && term; ++i)
        if (mask >> i & 1) term *= t[i];
      q += term;
    }
    return q;
  };
  // Farther points, each symbol moved by its own amount: a floor division, a clamp or a
  // product of a symbol with itself leaves them off the polynomial.
  // And each symbol alone moved past all the others: a min or max of two sizes (torch.diag's
  // length, lu's pivots) follows one of them only while it stays the smaller.
  const std::vector<std::vector<int64_t>> checks = [&] {
    std::vector<std::vector<int64_t>> c(3, std::vector<int64_t>(n));
    for (size_t i = 0; i < n; ++i) c[0][i] = 2, c[1][i] = 3 + 2 * static_cast<int64_t>(i), c[2][i] = 17 + 6 * static_cast<int64_t>(i);
    const int64_t top = *std::max_element(hints.begin(), hints.end());
    for (size_t i = 0; i < n; ++i) {
      std::vector<int64_t> alone(n, 0);
      alone[i] = 2 * top + 9 - hints[i];
      c.push_back(std::move(alone));
    }
    return c;
  }();
  for (const auto& t : checks) {
    std::vector<int64_t> at(hints);
    for (size_t i = 0; i < n; ++i) at[i] += t[i];
    auto r = probe(at);
    if (!r || r->size() != m) return std::nullopt;
    for (size_t k = 0; k < m; ++k)
      if ((*r)[k] != predict(t, k)) return std::nullopt;
  }
  // Expanded in the symbols: the coefficient of prod_{i in U} s_i is
  // sum over S containing U of a[S] * prod_{i in S \ U} (-h_i).
  std::vector<Expr> out;
  for (size_t k = 0; k < m; ++k) {
    Expr q(0);
    for (size_t u = 0; u < corners; ++u) {
      int64_t c = 0;
      for (size_t s = 0; s < corners; ++s) {
        if ((s & u) != u) continue;
        int64_t term = a[s][k];
        for (size_t i = 0; i < n && term; ++i)
          if ((s & ~u) >> i & 1) term *= -hints[i];
        c += term;
      }
      if (!c) continue;
      Expr mono(c);
      for (size_t i = 0; i < n; ++i)
        if (u >> i & 1) mono = mono * symbols[i];
      q = q + mono;
    }
    out.push_back(q);
  }
  return out;
}

}  // namespace kiln::sym
