// Branches on a tensor whose other side only raises, captured as checks (CaptureResult::checks).
//
// `assert (x >= 0).all()`, or torch.distributions' argument validation
// (`if not torch._is_all_true(valid): raise ValueError(...)`), branch on a tensor's value. A
// graph break there would end the graph and read the value on the host; but the raising side
// is the error path, which a working program never takes. Capture follows the side the call
// takes, and keeps the condition as a bool graph output that must hold. At run time a check that
// does not hold sends the call to eager from its start (the graph changed nothing the caller
// sees by then: checks are read before write-backs and stores), which raises eager's own error
// with eager's message and traceback. TorchDynamo does the same for `assert` (torch._assert_async).
#include "bind/capture/interpreter.h"

namespace kiln::bind::detail {

namespace {

// Whether the code from instruction `i` on runs straight to a `raise` (of an exception it
// builds: an f-string message, a constructor call), with no branch, loop, return, store outside
// its locals or re-raise on the way. Any call it makes only runs when eager runs it, on the
// failing path, so a call with effects (logging the error first) is no obstacle.
bool raises_straight(const CodeInfo& ci, size_t i) {
  for (size_t n = 0; i < ci.instrs.size() && n < 512; ++i, ++n) {
    switch (ci.instrs[i].op) {
      case OP_RAISE_VARARGS: return ci.instrs[i].arg >= 1;
      case OP_NOP: case OP_RESUME: case OP_CACHE: case OP_EXTENDED_ARG: case OP_PRECALL: case OP_LOAD_FAST:
      case OP_LOAD_FAST_CHECK: case OP_STORE_FAST: case OP_LOAD_CONST: case OP_LOAD_GLOBAL: case OP_LOAD_ATTR:
      case OP_LOAD_METHOD: case OP_PUSH_NULL: case OP_KW_NAMES: case OP_CALL: case OP_BINARY_OP:
      case OP_BINARY_SUBSCR: case OP_BUILD_TUPLE: case OP_BUILD_LIST: case OP_LIST_EXTEND: case OP_LIST_APPEND:
      case OP_LIST_TO_TUPLE: case OP_POP_TOP: case OP_COPY: case OP_SWAP: case OP_COMPARE_OP: case OP_IS_OP:
      case OP_CONTAINS_OP: case OP_LOAD_DEREF: case OP_FORMAT_VALUE: case OP_BUILD_STRING: case OP_BUILD_MAP:
      case OP_BUILD_CONST_KEY_MAP: case OP_LOAD_ASSERTION_ERROR: case OP_CALL_FUNCTION_EX: case OP_DICT_MERGE:
      case OP_BUILD_SLICE: case OP_UNARY_NEGATIVE: case OP_UNARY_NOT:
        continue;
      default: return false;
    }
  }
  return false;
}

}  // namespace

int Interpreter::tensor_jump(const VarPtr& cond, const Instr& in, const CodeInfo& ci, bool jump_if_true) {
  const ir::TensorMeta& m = cond->node()->meta;
  bool one_element = true;
  for (const sym::Expr& d : m.sizes) one_element = one_element && d.is_const(1);
  const auto at = ci.by_offset.find(in.offset);
  const auto target = ci.by_offset.find(in.jump_target);
  if (!one_element || at == ci.by_offset.end() || target == ci.by_offset.end()) {
    truth(cond);  // refused there, with the reason
    return -1;
  }
  const bool fall_raises = raises_straight(ci, at->second + 1), jump_raises = raises_straight(ci, target->second);
  if (fall_raises == jump_raises) {
    truth(cond);
    return -1;
  }
  // The condition's truth on the side that does not raise: the jump's when the fall-through raises.
  const bool holds = fall_raises ? jump_if_true : !jump_if_true;
  VarPtr ok;
  if (m.dtype == DType::Bool) ok = holds ? cond : call_tensor_method(cond, "logical_not", {}, {});
  else ok = call_tensor_method(cond, holds ? "ne" : "eq", {Var::steal_constant(PyLong_FromLong(0))}, {});
  if (!ok->is_tensor()) truth(cond);
  root()->checks_.push_back(ok->node());
  return fall_raises ? in.jump_target : -1;
}

void Interpreter::output_checks() {
  auto& outs = g_->outputs();
  for (ir::Node* n : checks_) {
    auto it = std::find(outs.begin(), outs.end(), n);
    const int index = static_cast<int>(it - outs.begin());
    if (it == outs.end()) outs.push_back(n);
    out_.checks.push_back(index);
  }
}

}  // namespace kiln::bind::detail
