// Symbolic sizes of an operator kiln only runs (a torch operator with no registry entry), found
// from its concrete behaviour: the sizes it gives for a few values of the symbols.
//
// The sizes and strides of nearly every tensor operator are multilinear polynomials in its
// input sizes (cat: s0 + s1; a contiguous stride: 8 * s0 * s1; a flatten: s0 * s1). Probing
// the operator at the 2^n corners {h_i, h_i + 1} of the hints fixes the one multilinear
// polynomial through those points; further probes farther away (where floor division or a
// max would show) must agree with it, else there is no fit and the caller specializes.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/sym/expr.h"

namespace kiln::sym {

// The quantities probe(values) returns (a fixed count, nullopt when the operator rejects those
// values), as multilinear polynomials in `symbols`, or nullopt when no such polynomial
// reproduces every probe. `hints` are the symbols' values for this call; probes only go up
// from them. At most `max_symbols` symbols (2^n probes).
using Probe = std::function<std::optional<std::vector<int64_t>>(const std::vector<int64_t>& values)>;
std::optional<std::vector<Expr>> fit_multilinear(const std::vector<Expr>& symbols, const std::vector<int64_t>& hints,
                                                 const Probe& probe, size_t max_symbols = 4);

}  // namespace kiln::sym
