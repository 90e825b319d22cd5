#include "bind/interrupts.h"

#include <csignal>

namespace kiln::bind {

namespace {
thread_local InterruptWatch* t_watch = nullptr;
}  // namespace

InterruptWatch::InterruptWatch() : outer_(t_watch) { t_watch = this; }

InterruptWatch::~InterruptWatch() {
  t_watch = outer_;
  if (!type_) return;
  if (outer_ && !outer_->type_) {
    outer_->type_ = type_;
    outer_->value_ = value_;
    outer_->tb_ = tb_;
    return;
  }
  Py_XDECREF(type_);
  Py_XDECREF(value_);
  Py_XDECREF(tb_);
}

void InterruptWatch::keep_current_error() {
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  if (type_) {  // the first one is the one to raise
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
    return;
  }
  type_ = t;
  value_ = v;
  tb_ = tb;
}

bool InterruptWatch::raised() {
  if (type_) {
    PyErr_Restore(type_, value_, tb_);
    type_ = value_ = tb_ = nullptr;
    return true;
  }
  return PyErr_CheckSignals() < 0;
}

bool keep_interrupt() {
  PyObject* type = PyErr_Occurred();  // borrowed
  if (!type || !t_watch || PyErr_GivenExceptionMatches(type, PyExc_Exception)) return false;
  t_watch->keep_current_error();
  return true;
}

void clear_error() {
  if (!keep_interrupt()) PyErr_Clear();
}

bool check_interrupt() { return t_watch ? t_watch->raised() : PyErr_CheckSignals() < 0; }

bool interrupt_pending() { return t_watch && t_watch->type_; }

bool interrupt_requested() {
  PyGILState_STATE g = PyGILState_Ensure();
  // PyOS_InterruptOccurred consumes SIGINT's flag (main thread only); setting it again leaves
  // the signal to Python's handler, which runs when kiln next checks signals with the compile
  // lock released: a handler may itself call compiled functions.
  bool hit = PyOS_InterruptOccurred() != 0;
  if (hit) PyErr_SetInterruptEx(SIGINT);
  PyGILState_Release(g);
  return hit;
}

}  // namespace kiln::bind
