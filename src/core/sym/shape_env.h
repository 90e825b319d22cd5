// Facts about size symbols that shape rules may rely on while capture runs.
//
// A shape rule that needs two sizes equal (broadcasting, a matrix product's inner dims, a
// convolution's channels) asks `same_size(a, b)`. Equal expressions are equal. Otherwise, while
// a capture with symbolic sizes runs, its environment decides from the sizes at hand (the
// symbols' hints): when they are equal there, it records the fact (the entry's guards check it
// on every call) and the rule goes on as if they were equal; when they differ the rule fails,
// as eager would. With no environment, sizes compare as expressions.
#pragma once
#include "core/sym/expr.h"

namespace kiln::sym {

class ShapeEnv {
 public:
  virtual ~ShapeEnv() = default;
  // Whether a == b for the inputs at hand; true records it as a fact of the entry.
  virtual bool assume_equal(const Expr& a, const Expr& b) = 0;
  // Whether e >= 0 for the inputs at hand; true records it as a fact of the entry.
  virtual bool assume_nonnegative(const Expr& e) = 0;
  // The value of e for the inputs at hand (nullopt: a symbol it does not know).
  virtual std::optional<int64_t> hint(const Expr& e) = 0;
};

// The environment of the capture running on this thread, if any.
ShapeEnv*& current_shape_env();

bool same_size(const Expr& a, const Expr& b);
// e's value: its constant, else the current environment's hint. For layout choices (the
// order of dims by stride), which hold for every size the entry's guards admit.
std::optional<int64_t> size_hint(const Expr& e);
// a < b: decided by the expressions' bounds where they can, else by the environment (a fact).
bool known_less(const Expr& a, const Expr& b);

// Makes `env` current for its lifetime (and restores the previous one).
class ShapeEnvScope {
 public:
  explicit ShapeEnvScope(ShapeEnv* env) : saved_(current_shape_env()) { current_shape_env() = env; }
  ~ShapeEnvScope() { current_shape_env() = saved_; }
  ShapeEnvScope(const ShapeEnvScope&) = delete;
  ShapeEnvScope& operator=(const ShapeEnvScope&) = delete;

 private:
  ShapeEnv* saved_;
};

}  // namespace kiln::sym
