// Emits the scalar expressions of kernel bodies as C++ statements. Shared by the C++ and
// CUDA generators: both dialects name the same helper functions (kiln_exp, kiln_max, ...),
// defined for each in its prelude.
#pragma once
#include <functional>
#include <string>
#include <unordered_map>

#include "core/loop/program.h"

namespace kiln::codegen {

std::string ctype(DType t);  // the element type in memory (kiln_half / kiln_bf16 for 16-bit floats)
std::string register_ctype(DType t);  // the type values of `t` are computed in (float for those)
std::string literal(double fval, int64_t ival, DType t);
int64_t int_lowest(DType t);
// Replaces the identifier `from` (whole words only) by `to` in generated code.
void replace_identifier(std::string& text, const std::string& from, const std::string& to);
// The name a kernel gives the program's scalar argument `index` (a double).
std::string arg_name(int64_t index);
// `buffer[index] = value;` (a 16-bit float buffer: the value, a float, rounded into its bits).
std::string store_stmt(const loop::Buffer& buffer, const std::string& index, const std::string& value);
// `element = value;` for an element of `buffer`'s type held elsewhere (a vector register).
std::string store_to(const loop::Buffer& buffer, const std::string& element, const std::string& value);
int64_t int_highest(DType t);

class ScalarEmitter {
 public:
  ScalarEmitter(const loop::Program& p, std::string& out, std::function<std::string(int acc)> acc_name)
      : p_(p), out_(out), acc_name_(std::move(acc_name)) {}

  // Returns an expression for `r`, first emitting `const T tN = ...;` lines (at `indent`) for
  // every node it needs that is not already named in this scope or an enclosing one.
  std::string emit(loop::SRef r, const std::string& indent);

  // Where a load reads its element from: an element of a vector already loaded, in place of
  // `buffer[index]` ("" keeps the buffer). Set by the CUDA writer around vectorized bodies.
  std::function<std::string(const loop::SNode& load)> element_of;

  // Names `r` `text` in the current scope: a value held elsewhere (a register array's element)
  // that later emits read instead of computing it.
  void name(loop::SRef r, std::string text) { names_[r] = std::move(text); }

  // Scopes: names made inside a loop body are not visible after it.
  void push_scope() { scopes_.push_back(names_); }
  void pop_scope() {
    names_ = scopes_.back();
    scopes_.pop_back();
  }

 private:
  std::string expr(loop::SRef r, const std::string& indent);
  const loop::Program& p_;
  std::string& out_;
  std::function<std::string(int)> acc_name_;
  std::unordered_map<loop::SRef, std::string> names_;
  std::vector<std::unordered_map<loop::SRef, std::string>> scopes_;
  int counter_ = 0;
};

}  // namespace kiln::codegen
