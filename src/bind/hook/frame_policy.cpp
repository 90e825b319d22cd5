#include "bind/hook/frame_policy.h"

#include <string>
#include <unordered_set>
#include <vector>

#include "bind/capture/resume.h"
#include "bind/hook/frame_hook.h"

namespace kiln::bind {
namespace {

thread_local const CompileConfig* t_cfg = nullptr;

// What a code object's extra slot holds: nothing yet, "run as is", or a cache.
char kSkip;

struct FrameCache : CodeCache {
  PyObject* trampoline = nullptr;
  using CodeCache::CodeCache;
  ~FrameCache() {
    if (Py_IsInitialized()) Py_XDECREF(trampoline);
  }
};

std::unordered_set<FrameCache*>& live_caches() {
  static std::unordered_set<FrameCache*> s;
  return s;
}

void free_extra(void* p) {
  if (!p || p == &kSkip) return;
  auto* c = static_cast<FrameCache*>(p);
  live_caches().erase(c);
  delete c;
}

Py_ssize_t extra_index() {
  static Py_ssize_t index = _PyEval_RequestCodeExtraIndex(free_extra);
  return index;
}

// Path prefixes of code kiln never takes: torch, kiln itself, the standard library.
const std::vector<std::string>& skipped_dirs() {
  static std::vector<std::string> dirs = [] {
    std::vector<std::string> d;
    auto add_module_dir = [&](const char* mod) {
      PyObject* m = PyImport_ImportModule(mod);
      PyObject* f = m ? PyObject_GetAttrString(m, "__file__") : nullptr;
      if (f && PyUnicode_Check(f)) {
        std::string path = PyUnicode_AsUTF8(f);
        d.push_back(path.substr(0, path.rfind('/') + 1));
      }
      Py_XDECREF(f);
      Py_XDECREF(m);
      PyErr_Clear();
    };
    add_module_dir("torch");
    add_module_dir("kiln");
    PyObject* sc = PyImport_ImportModule("sysconfig");
    PyObject* paths = sc ? PyObject_CallMethod(sc, "get_paths", nullptr) : nullptr;
    for (const char* key : {"stdlib", "platstdlib"}) {
      PyObject* p = paths ? PyDict_GetItemString(paths, key) : nullptr;
      if (p && PyUnicode_Check(p)) d.push_back(std::string(PyUnicode_AsUTF8(p)) + "/");
    }
    Py_XDECREF(paths);
    Py_XDECREF(sc);
    PyErr_Clear();
    d.push_back("<frozen ");
    return d;
  }();
  return dirs;
}

bool takes(PyCodeObject* co) {
  if (co->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE)) return false;
  if (!(co->co_flags & CO_OPTIMIZED)) return false;  // module and class bodies
  std::string file = PyUnicode_AsUTF8(co->co_filename);
  for (const std::string& dir : skipped_dirs())
    if (file.rfind(dir, 0) == 0) return false;
  return true;
}

FrameCache* cache_for(PyObject* code) {
  void* extra = nullptr;
  Py_ssize_t idx = extra_index();
  if (idx < 0 || _PyCode_GetExtra(code, idx, &extra) < 0) {
    PyErr_Clear();
    return nullptr;
  }
  if (extra == &kSkip) return nullptr;
  if (extra) return static_cast<FrameCache*>(extra);
  if (!takes(reinterpret_cast<PyCodeObject*>(code))) {
    _PyCode_SetExtra(code, idx, &kSkip);
    return nullptr;
  }
  auto* c = new FrameCache(code, *t_cfg);
  c->trampoline = make_trampoline(code, kiln_hook_result_holder());
  if (!c->trampoline || _PyCode_SetExtra(code, idx, c) < 0) {
    PyErr_Clear();
    delete c;
    _PyCode_SetExtra(code, idx, &kSkip);
    return nullptr;
  }
  live_caches().insert(c);
  return c;
}

PyObject* on_frame(PyObject* func, PyObject* const* args, PyObject** trampoline) {
  if (!t_cfg) return nullptr;
  FrameCache* c = cache_for(PyFunction_GET_CODE(func));
  if (!c) return nullptr;
  SourceMemo memo;
  BoundArgs bound;
  bound.memo = &memo;
  bound.locals.assign(args, args + c->nargs);
  bool failed;
  Entry* e = select_entry(*c, func, bound, failed);
  if (failed) {
    *trampoline = c->trampoline;  // the frame raises what kiln raised (fullgraph=True)
    return nullptr;
  }
  // Frames that run eagerly, and frames with nothing to compute, run as they are.
  if (!e || e->eager || (e->passthrough && !e->capture.graph_break)) return nullptr;
  *trampoline = c->trampoline;
  return run_entry(*e, func, bound);
}

}  // namespace

HookScope::HookScope(const CompileConfig& cfg) : saved_(t_cfg) {
  static bool registered = (kiln_hook_set_callback(on_frame), true);
  (void)registered;
  t_cfg = &cfg;
  token_ = kiln_hook_enter();
}

HookScope::~HookScope() {
  kiln_hook_exit(token_);
  t_cfg = saved_;
}

HookPause::HookPause() : token_(kiln_hook_pause()) {}
HookPause::~HookPause() { kiln_hook_resume(token_); }

void reset_frame_caches() {
  for (FrameCache* c : live_caches()) {
    c->entries.clear();
    c->eager_forever = false;
  }
}

}  // namespace kiln::bind
