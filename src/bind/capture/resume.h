// Resume functions: the code that continues a function after a graph break.
//
// A resume function is a new code object made from the original one: its parameters are the
// original's locals followed by the values that were on the stack at the break; a short
// prologue puts those values back on the stack and jumps to the instruction after the break.
// The original body is kept byte for byte (relative jumps stay valid); only the exception
// table, the line table and the indices of cell and free variables move.
#pragma once
#include <Python.h>

#include <string>
#include <vector>

namespace kiln::bind {

struct ResumeShape {
  int offset = 0;                    // byte offset of the first instruction to run
  std::vector<bool> stack_is_null;   // the stack at `offset`, bottom first: NULL slots are pushed, not passed
  std::vector<bool> local_unbound;   // one per co_varnames entry: passed as None, then deleted
  // Cell variables (their slots in the original code) bound at the break that code after it
  // uses: their values are passed after the stack's and stored into the new frame's cells
  std::vector<int> cells;
};

// A function running `fn`'s code from shape.offset (new reference), or nullptr with `error`
// saying why this code cannot resume there (no Python error left set).
PyObject* make_resume_function(PyObject* fn, const ResumeShape& shape, std::string& error);

// A code object laid out like `code` (same locals, cells, stack size) whose body returns
// -holder: the frame hook runs it in place of a frame whose result kiln already computed.
PyObject* make_trampoline(PyObject* code, PyObject* holder);

// Whether the instruction at byte `offset` lies inside a try/with block (an exception table
// entry covers it).
bool in_exception_block(PyObject* code, int offset);
// Whether a graph break at `offset` can hand its exception handlers to the resume function:
// outside every block, or inside `with` blocks only (their __exit__ is on the stack, rebuilt
// by the break) in code with no try/except/finally, whose handler an exception raised by the
// instruction run at the break (outside the function) would miss.
bool break_leaves_handlers_intact(PyObject* code, int offset);

// The handler an exception raised by the instruction at `offset` jumps to: its offset, the stack
// depth to unwind to, and whether the raising instruction's offset is pushed first (lasti).
struct ExceptionHandler {
  int target = -1;
  int depth = 0;
  bool lasti = false;
};
ExceptionHandler exception_handler(PyObject* code, int offset);

}  // namespace kiln::bind
