// Decoding of CPython bytecode for the capture interpreter, through the running interpreter's
// `dis` module: opcode numbers, inline caches and jump targets of Python 3.11 and 3.12 are
// never hard-coded. Opnames map to the handlers the interpreter knows.
#pragma once
#include <Python.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace kiln::bind {

// One decoded instruction. Decoding goes through the running interpreter's `dis`, so opcode
// numbers, cache entries and jump targets are never hard-coded.
struct Instr {
  int op;            // index into the handler table (by opname)
  int arg;           // raw argument
  PyObject* argval;  // dis's resolved argument (borrowed from the cached instruction list)
  int offset;
  int jump_target;   // absolute offset, for jumps
  int line;
  std::string argrepr;  // dis's rendering of the argument (names of intrinsics, ...)
};

#define KILN_OPNAMES(X)                                                                                         \
  X(NOP) X(RESUME) X(CACHE) X(EXTENDED_ARG) X(PRECALL) X(LOAD_FAST) X(LOAD_FAST_CHECK) X(LOAD_FAST_AND_CLEAR)   \
  X(STORE_FAST) X(DELETE_FAST) X(LOAD_CONST) X(RETURN_VALUE) X(RETURN_CONST) X(LOAD_GLOBAL) X(LOAD_ATTR)        \
  X(LOAD_METHOD) X(PUSH_NULL) X(KW_NAMES) X(CALL) X(BINARY_OP) X(BINARY_SUBSCR) X(BINARY_SLICE)                \
  X(BUILD_SLICE) X(UNARY_NEGATIVE) X(UNARY_NOT) X(UNARY_INVERT) X(UNARY_POSITIVE) X(BUILD_TUPLE) X(BUILD_LIST) \
  X(LIST_EXTEND) X(LIST_APPEND) X(LIST_TO_TUPLE) X(UNPACK_SEQUENCE) X(POP_TOP) X(COPY) X(SWAP) X(COMPARE_OP)  \
  X(IS_OP) X(CONTAINS_OP) X(POP_JUMP_IF_FALSE) X(POP_JUMP_IF_TRUE) X(POP_JUMP_IF_NONE)                         \
  X(POP_JUMP_IF_NOT_NONE) X(POP_JUMP_FORWARD_IF_FALSE) X(POP_JUMP_FORWARD_IF_TRUE)                             \
  X(POP_JUMP_BACKWARD_IF_FALSE) X(POP_JUMP_BACKWARD_IF_TRUE) X(POP_JUMP_FORWARD_IF_NONE)                       \
  X(POP_JUMP_FORWARD_IF_NOT_NONE) X(POP_JUMP_BACKWARD_IF_NONE) X(POP_JUMP_BACKWARD_IF_NOT_NONE)                \
  X(JUMP_FORWARD) X(JUMP_BACKWARD) X(JUMP_BACKWARD_NO_INTERRUPT) X(COPY_FREE_VARS) X(MAKE_CELL)                \
  X(CALL_INTRINSIC_1) X(CALL_FUNCTION_EX) X(BUILD_MAP) X(BUILD_CONST_KEY_MAP) X(LOAD_DEREF) X(STORE_DEREF) X(GET_ITER) X(FOR_ITER) X(END_FOR) X(DICT_MERGE) X(DICT_UPDATE) X(LOAD_SUPER_ATTR) \
  X(MAKE_FUNCTION) X(LOAD_CLOSURE) X(RETURN_GENERATOR) X(YIELD_VALUE) X(BEFORE_WITH) X(FORMAT_VALUE) X(BUILD_STRING) \
  X(JUMP_IF_TRUE_OR_POP) X(JUMP_IF_FALSE_OR_POP) X(UNPACK_EX) X(STORE_SUBSCR) X(BUILD_SET) X(SET_ADD) X(SET_UPDATE) \
  X(MAP_ADD) X(LOAD_ASSERTION_ERROR) X(RAISE_VARARGS) X(DELETE_DEREF) X(STORE_ATTR) \
  X(STORE_SLICE) X(DELETE_SUBSCR) X(DELETE_ATTR) X(IMPORT_NAME) X(IMPORT_FROM) X(PUSH_EXC_INFO) X(CHECK_EXC_MATCH) \
  X(POP_EXCEPT) X(RERAISE) X(GET_YIELD_FROM_ITER) X(SEND) X(END_SEND) X(LOAD_BUILD_CLASS) \
  X(STORE_GLOBAL) X(DELETE_GLOBAL) X(WITH_EXCEPT_START)

enum OpName {
#define KILN_X(n) OP_##n,
  KILN_OPNAMES(KILN_X)
#undef KILN_X
  OP_UNKNOWN
};

struct CodeInfo {
  std::vector<Instr> instrs;
  std::unordered_map<int, size_t> by_offset;
  PyObject* dis_list = nullptr;  // keeps argvals alive
  std::vector<std::string> nb_ops;  // BINARY_OP argument names, from dis._nb_ops
  std::vector<std::string> cmp_ops;
  std::vector<std::string> opnames;  // OP_UNKNOWN instructions keep their name for messages
  CodeInfo() = default;
  CodeInfo(const CodeInfo&) = delete;
  CodeInfo& operator=(const CodeInfo&) = delete;
  ~CodeInfo();
};


// The decoded instructions of a code object, cached on the code object for its life.
const CodeInfo& decode(PyObject* code);

}  // namespace kiln::bind
