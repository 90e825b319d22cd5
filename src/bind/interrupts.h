// Ctrl-C while kiln captures or compiles. Python's SIGINT handler raises KeyboardInterrupt in
// whatever Python code runs next: one of the many calls capture and guards make on their own
// behalf, whose errors they clear ("not that kind of object"), or none at all while C++ runs
// with the GIL released (a compile). So that such an interrupt reaches the user and is never
// taken for a failure to compile (which would leave the function running eagerly for good):
//   - kiln clears errors with clear_error(), which keeps an interrupt for the innermost
//     InterruptWatch instead of dropping it (and ends capture at its next instruction);
//   - InterruptWatch::raised() re-raises a kept interrupt, or runs pending signal handlers;
//   - interrupt_requested() lets a compile that waits on a subprocess notice Ctrl-C (and stop
//     it); the handler itself runs afterwards, in raised(), once the compile lock is released.
#pragma once
#include <Python.h>

namespace kiln::bind {

// PyErr_Clear(), except that an interrupt (an exception that is not an Exception:
// KeyboardInterrupt, SystemExit) is kept for the innermost InterruptWatch of this thread.
void clear_error();

// If the current error is an interrupt, keeps it (as clear_error() does) and returns true.
bool keep_interrupt();

// True, with the exception set, if the innermost watch of this thread kept an interrupt or a
// signal handler raises now (PyErr_CheckSignals).
bool check_interrupt();

// Whether the innermost watch of this thread holds an interrupt (cheap: no signal check).
bool interrupt_pending();

// Called with the GIL released (from a compile's wait loop): takes the GIL for a moment to see
// whether SIGINT arrived. The signal stays pending: its handler runs at the next check (raised()).
bool interrupt_requested();

// One per select_entry: the scope whose interrupts are kept and re-raised.
class InterruptWatch {
 public:
  InterruptWatch();
  ~InterruptWatch();  // an interrupt never re-raised goes to the enclosing watch
  InterruptWatch(const InterruptWatch&) = delete;
  InterruptWatch& operator=(const InterruptWatch&) = delete;

  // True, with the exception set, if an interrupt was kept or a signal handler raises now.
  bool raised();

 private:
  friend void clear_error();
  friend bool interrupt_pending();
  friend bool keep_interrupt();
  void keep_current_error();
  InterruptWatch* outer_;
  PyObject* type_ = nullptr;
  PyObject* value_ = nullptr;
  PyObject* tb_ = nullptr;
};

}  // namespace kiln::bind
