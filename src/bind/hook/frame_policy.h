// Which frames the hook hands to kiln, and the caches of those it does.
//
// Frames of torch, kiln and the standard library, generators and module bodies run as they
// are. Any other function's frame is captured like a compiled function: per-code entries under
// guards (kept on the code object), a graph, graph breaks and resume functions.
#pragma once
#include <Python.h>

#include "bind/runtime/compiled_function.h"

namespace kiln::bind {

// While alive, new frames of this thread are offered to kiln, compiled with `cfg`.
class HookScope {
 public:
  explicit HookScope(const CompileConfig& cfg);
  ~HookScope();
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;

 private:
  int token_;
  const CompileConfig* saved_;
};

// While alive, this thread's frames are not offered (kiln's own work between user code).
class HookPause {
 public:
  HookPause();
  ~HookPause();
  HookPause(const HookPause&) = delete;
  HookPause& operator=(const HookPause&) = delete;

 private:
  int token_;
};

// Forgets every frame's cache (kiln.reset()).
void reset_frame_caches();

}  // namespace kiln::bind
