#include "core/sym/shape_env.h"

namespace kiln::sym {

ShapeEnv*& current_shape_env() {
  thread_local ShapeEnv* env = nullptr;
  return env;
}

bool same_size(const Expr& a, const Expr& b) {
  if (a == b) return true;
  if (a.as_const() && b.as_const()) return false;
  ShapeEnv* env = current_shape_env();
  return env && env->assume_equal(a, b);
}

std::optional<int64_t> size_hint(const Expr& e) {
  if (auto c = e.as_const()) return c;
  ShapeEnv* env = current_shape_env();
  return env ? env->hint(e) : std::nullopt;
}

bool known_less(const Expr& a, const Expr& b) {
  Expr e = b - a - Expr(1);
  if (auto c = e.as_const()) return *c >= 0;
  Bounds bd = bounds(e);
  if (bd.lo && *bd.lo >= 0) return true;
  ShapeEnv* env = current_shape_env();
  return env && env->assume_nonnegative(e);
}

}  // namespace kiln::sym
