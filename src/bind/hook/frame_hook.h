/* The PEP 523 frame hook: while a compiled function runs Python code (an eager fallback, the
 * instruction at a graph break), every new Python frame of that thread is offered to kiln.
 *
 * This is the one place that touches CPython's internal frame layout (3.11 and 3.12), written
 * in C because those headers are C. Policy lives in C++ (frame_policy.cpp): this file only
 * intercepts frames, asks the callback, and returns a computed result in place of running
 * the frame's code. */
#pragma once
#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Decides one new frame of `func` whose arguments are args[0..n). Either returns NULL with no
 * error set and *trampoline NULL: the frame runs normally; or sets *trampoline (borrowed; a
 * code object laid out like the frame's, see make_trampoline) and returns the frame's result
 * (new reference) or NULL with the exception the frame raises. */
/* `contain`: set to 1 to run the frame with nothing below it offered (torch's compiler stack). */
typedef PyObject* (*kiln_frame_callback)(PyObject* func, PyObject* const* args, PyObject** trampoline, int* contain);

void kiln_hook_set_callback(kiln_frame_callback cb);

/* Frames of this thread are offered until the matching exit; nests. The hook is installed in
 * the interpreter only while some thread is inside. */
int kiln_hook_enter(void);
void kiln_hook_exit(int token);

/* Stops offering this thread's frames while kiln itself runs Python (capture reads `dis`,
 * guards read module attributes); returns the token for kiln_hook_resume. */
int kiln_hook_pause(void);
void kiln_hook_resume(int token);

/* The next frame of `code` on this thread runs normally (kiln is already running it eagerly). */
void kiln_hook_skip_next(PyObject* code);

/* The constant a trampoline negates to fetch the pending result (borrowed). */
PyObject* kiln_hook_result_holder(void);

#ifdef __cplusplus
}
#endif
