// Scalar expressions: the bodies of kernels in the loop-level IR.
//
// A kernel computes, for each point of its iteration space, values built from loads of
// buffers at index expressions (sym::Expr over the loop variables), constants, arithmetic and
// references to reduction results. Nodes are hash-consed inside one ScalarCtx, so fusing
// producers into consumers shares common subexpressions for free, and code generators emit
// each distinct node once.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/ir/dtype.h"
#include "core/sym/expr.h"

namespace kiln::loop {

#define KILN_SCALAR_UNARY(X) \
  X(Neg, "neg") X(Exp, "exp") X(Log, "log") X(Sin, "sin") X(Cos, "cos") X(Tan, "tan") \
  X(Tanh, "tanh") X(Sigmoid, "sigmoid") X(Relu, "relu") X(Abs, "abs") X(Sqrt, "sqrt") \
  X(Rsqrt, "rsqrt") X(Erf, "erf") X(Not, "logical_not") X(Floor, "floor") X(Ceil, "ceil") \
  X(Trunc, "trunc") X(Reciprocal, "reciprocal") X(Exp2, "exp2") X(Log2, "log2") \
  X(Expm1, "expm1") X(Log1p, "log1p") X(RoundF16, "round_f16") X(RoundBF16, "round_bf16")

#define KILN_SCALAR_BINARY(X) \
  X(Add, "add") X(Sub, "sub") X(Mul, "mul") X(Div, "div") X(FloorDiv, "floordiv") \
  X(TruncDiv, "truncdiv") X(Mod, "mod") X(Pow, "pow") X(Max, "maximum") X(Min, "minimum") \
  X(Eq, "eq") X(Ne, "ne") X(Lt, "lt") X(Le, "le") X(Gt, "gt") X(Ge, "ge") X(And, "logical_and") \
  X(Or, "logical_or") X(Rand, "rand")

enum class SOp : uint8_t {
  Const,  // literal of `dtype`
  Load,   // buffer[index]
  Acc,    // the result of reduction `acc` of the enclosing kernel
  Cast,   // a -> dtype
  Where,  // a ? b : c
  Index,  // the value of `index`, an expression of sizes (a symbolic size as a number), as dtype
  Arg,    // the program's scalar argument `ival` (a Python float read at each call), as dtype
#define KILN_X(name, str) name,
  KILN_SCALAR_UNARY(KILN_X) KILN_SCALAR_BINARY(KILN_X)
#undef KILN_X
};

const char* sop_name(SOp op);
bool sop_is_unary(SOp op);
bool sop_is_binary(SOp op);
bool sop_is_comparison(SOp op);

using SRef = int32_t;

struct SNode {
  SOp op;
  DType dtype;
  SRef a = -1, b = -1, c = -1;
  double fval = 0;      // Const (floating)
  int64_t ival = 0;     // Const (integral, bool)
  int buffer = -1;      // Load
  sym::Expr index;      // Load
  int acc = -1;         // Acc
};

// Where kiln reproduces how torch's own CPU kernels round (found by running them: see
// kiln/_torch_kernels.py), for the ops that lower through a ScalarCtx and for code generation.
struct TorchNumerics {
  // Vector width of torch's CPU reduction kernels: floating products over contiguous blocks
  // follow their order (Stage::torch_vector_block). 0: plain order.
  int prod_vector_bytes = 32;
  // How torch's float32 gelu (erf form) of a contiguous tensor of 2+ elements computes, which
  // differs by CPU (kiln/_torch_kernels.py): plain x*0.5*(1+erf) as its elementwise loop;
  // x*(1+erf)*0.5 with NaN for +inf (overflowing past 1.7e38); or x*0.5 + x*0.5*erf, which
  // makes gelu(-0.0) +0.0.
  enum class GeluForm : int { Plain = 0, NanForInf = 1, SplitHalf = 2 };
  GeluForm gelu_contiguous_f32 = GeluForm::Plain;
};

class ScalarCtx {
 public:
  TorchNumerics torch;  // set before lowering (pipeline::compile_graph)

  SRef constant(double v, DType t);
  SRef int_constant(int64_t v, DType t);  // an integer exactly (2**63 - 1 has no double)
  SRef load(int buffer, sym::Expr index, DType t);
  SRef acc(int id, DType t);
  SRef cast(SRef a, DType t);
  SRef unary(SOp op, SRef a);
  SRef binary(SOp op, SRef a, SRef b);  // operands must share a dtype; comparisons give bool
  SRef where(SRef cond, SRef a, SRef b);
  SRef size_value(sym::Expr e, DType t);  // constant when e is
  SRef arg(int index, DType t);           // scalar argument `index` of the program (Program::scalar_args)

  const SNode& operator[](SRef r) const { return nodes_[r]; }
  DType dtype(SRef r) const { return nodes_[r].dtype; }
  size_t size() const { return nodes_.size(); }
  // Number of distinct nodes reachable from r (a cost estimate for inlining decisions).
  size_t count(SRef r) const;
  // What evaluating the roots once costs, each distinct node counted once, in units of a load
  // or an add: a division or square root 2, a transcendental function (exp, erf, tanh, pow...)
  // 8, a constant nothing. `seen` spans calls (a kernel's stages share nodes).
  double cost(SRef r, std::unordered_set<SRef>& seen) const;
  // Rewrites reachable nodes through f (called on each node with its new operands); used to
  // replace loads of a fused-away buffer by the value computed in the same kernel.
  SRef rewrite(SRef root, const std::function<SRef(ScalarCtx&, const SNode&, SRef self)>& f,
               std::unordered_map<SRef, SRef>& memo);
  std::string str(SRef r) const;

 private:
  SRef intern(const SNode& n);
  // Calls f on each node reachable from r not in `seen` yet (and adds it there), once.
  void walk(SRef r, std::unordered_set<SRef>& seen, const std::function<void(const SNode&)>& f) const;
  std::vector<SNode> nodes_;
  std::unordered_map<std::string, SRef> table_;
};

// Calls f on every Load reachable from r, each node once (`seen` spans calls: a kernel's stages).
void visit_loads(const ScalarCtx& s, SRef r, std::set<SRef>& seen, const std::function<void(const SNode&)>& f);

}  // namespace kiln::loop
