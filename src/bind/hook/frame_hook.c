#include "bind/hook/frame_hook.h"

#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

/* Per thread: whether frames are offered now, a code to let run once, and the result a
 * trampoline returns. */
static _Thread_local int tls_offering = 0;
static _Thread_local PyObject* tls_skip = NULL;
typedef struct {
  PyObject* result;
  PyObject *type, *value, *tb;
} Pending;
static _Thread_local Pending tls_pending = {NULL, NULL, NULL, NULL};

static int g_installs = 0; /* threads inside kiln_hook_enter (under the GIL) */
static kiln_frame_callback g_callback = NULL;

/* A trampoline runs `LOAD_CONST holder; UNARY_NEGATIVE; RETURN_VALUE` in the intercepted
 * frame: negating the holder hands over the pending result, and the interpreter then clears
 * the frame as for any return (3.12 leaves that to the evaluator of the frame). */
static PyObject* holder_negative(PyObject* self) {
  (void)self;
  Pending p = tls_pending;
  tls_pending.result = tls_pending.type = tls_pending.value = tls_pending.tb = NULL;
  if (p.result) return p.result;
  if (p.type) {
    PyErr_Restore(p.type, p.value, p.tb);
    return NULL;
  }
  PyErr_SetString(PyExc_RuntimeError, "kiln: a trampoline ran without a pending result");
  return NULL;
}

static PyNumberMethods holder_number = {.nb_negative = holder_negative};
static PyTypeObject HolderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.FrameResult",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_number = &holder_number,
    .tp_doc = "Hands a result computed by kiln to the frame it replaces.",
};
static PyObject* g_holder = NULL;

PyObject* kiln_hook_result_holder(void) {
  if (!g_holder) {
    if (PyType_Ready(&HolderType) < 0) return NULL;
    g_holder = PyType_GenericAlloc(&HolderType, 0);
  }
  return g_holder;
}

static PyObject* frame_func(_PyInterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030C0000
  return f->f_funcobj;
#else
  return (PyObject*)f->f_func;
#endif
}

static PyObject* eval_frame(PyThreadState* ts, _PyInterpreterFrame* f, int throwflag) {
  if (throwflag || !tls_offering || !g_callback) return _PyEval_EvalFrameDefault(ts, f, throwflag);
  PyObject* code = (PyObject*)f->f_code;
  if (code == tls_skip) {
    tls_skip = NULL;
    return _PyEval_EvalFrameDefault(ts, f, throwflag);
  }
  PyObject* func = frame_func(f);
  if (!func || !PyFunction_Check(func)) return _PyEval_EvalFrameDefault(ts, f, throwflag);

  PyObject* trampoline = NULL;
  int contain = 0;
  tls_offering = 0; /* kiln's own Python calls (dis, guards on modules) are not offered */
  PyObject* result = g_callback(func, (PyObject* const*)f->localsplus, &trampoline, &contain);
  if (contain && !trampoline) { /* torch's compiler stack: neither it nor what it calls */
    PyObject* out = _PyEval_EvalFrameDefault(ts, f, throwflag);
    tls_offering = 1;
    return out;
  }
  tls_offering = 1;
  if (!trampoline) {
    if (result || PyErr_Occurred()) { /* a callback breaking its contract: run the frame */
      Py_XDECREF(result);
      PyErr_Clear();
    }
    return _PyEval_EvalFrameDefault(ts, f, throwflag);
  }
  Pending saved = tls_pending; /* a signal handler may run a hooked frame of its own */
  tls_pending.result = result;
  tls_pending.type = tls_pending.value = tls_pending.tb = NULL;
  if (!result) PyErr_Fetch(&tls_pending.type, &tls_pending.value, &tls_pending.tb);
  Py_INCREF(trampoline);
  Py_SETREF(f->f_code, (PyCodeObject*)trampoline);
  f->prev_instr = _PyCode_CODE(f->f_code) - 1;
  PyObject* out = _PyEval_EvalFrameDefault(ts, f, 0);
  /* Normally consumed; left over only if the frame stopped before the trampoline's negation. */
  Py_XDECREF(tls_pending.result);
  Py_XDECREF(tls_pending.type);
  Py_XDECREF(tls_pending.value);
  Py_XDECREF(tls_pending.tb);
  tls_pending = saved;
  return out;
}

void kiln_hook_set_callback(kiln_frame_callback cb) { g_callback = cb; }

int kiln_hook_enter(void) {
  if (g_installs++ == 0) _PyInterpreterState_SetEvalFrameFunc(PyInterpreterState_Get(), eval_frame);
  int token = tls_offering;
  tls_offering = 1;
  return token;
}

void kiln_hook_exit(int token) {
  tls_offering = token;
  if (--g_installs == 0) _PyInterpreterState_SetEvalFrameFunc(PyInterpreterState_Get(), _PyEval_EvalFrameDefault);
}

void kiln_hook_skip_next(PyObject* code) { tls_skip = code; }

int kiln_hook_pause(void) {
  int token = tls_offering;
  tls_offering = 0;
  return token;
}

void kiln_hook_resume(int token) { tls_offering = token; }
