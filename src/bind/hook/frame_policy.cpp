#include "bind/hook/frame_policy.h"

#include <string>
#include <unordered_set>
#include <vector>

#include "bind/capture/resume.h"
#include "bind/hook/frame_hook.h"

namespace kiln::bind {
namespace {

thread_local const CompileConfig* t_cfg = nullptr;

// What a code object's extra slot holds: nothing yet, "run as is", "run as is and offer nothing
// it calls", or a cache.
char kSkip;
char kContain;

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
  if (!p || p == &kSkip || p == &kContain) return;
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

// Third-party packages live under the standard library's directory when Python is not a venv.
bool in_site_packages(const std::string& file, size_t prefix) {
  return file.compare(prefix, 14, "site-packages/") == 0 || file.compare(prefix, 14, "dist-packages/") == 0;
}

// torch's compiler stack (torch.compile'd callees, torch.cond and the other higher-order ops,
// FX, export): these trace Python themselves, so nothing they call is offered to kiln either.
bool contained(PyObject* func) {
  PyObject* module = PyDict_GetItemString(PyFunction_GET_GLOBALS(func), "__name__");  // borrowed
  if (!module || !PyUnicode_Check(module)) return false;
  std::string m = PyUnicode_AsUTF8(module);
  for (const char* prefix : {"torch._dynamo", "torch._higher_order_ops", "torch._inductor", "torch._functorch",
                             "torch.fx", "torch._subclasses", "torch.export", "torch._export", "torch._prims",
                             "torch._refs", "torch._decomp", "torch.compiler"}) {
    size_t n = std::char_traits<char>::length(prefix);
    if (m.compare(0, n, prefix) == 0 && (m.size() == n || m[n] == '.')) return true;
  }
  return false;
}

// Whether kiln takes frames of this function: not torch (by file, or by module for code torch
// generates), not kiln, not the standard library (nor typing_extensions), not code that dataclasses and namedtuple
// generate with exec/eval ("<string>"), not generators or module bodies.
bool takes(PyObject* func) {
  auto* co = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(func));
  if (co->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE)) return false;
  if (!(co->co_flags & CO_OPTIMIZED)) return false;  // module and class bodies
  std::string file = PyUnicode_AsUTF8(co->co_filename);
  if (file == "<string>") return false;
  // A comprehension's own frame (3.11: <listcomp>, <dictcomp>, <setcomp>) takes a new iterator
  // each time (`.0`), which an entry would be guarded on: it would recompile at every call.
  // Inside a captured function it is inlined; under an eager caller it runs as it is.
  const std::string name = PyUnicode_AsUTF8(co->co_name);
  if (name == "<listcomp>" || name == "<dictcomp>" || name == "<setcomp>") return false;
  for (const std::string& dir : skipped_dirs())
    if (file.rfind(dir, 0) == 0 && !in_site_packages(file, dir.size())) return false;
  PyObject* module = PyDict_GetItemString(PyFunction_GET_GLOBALS(func), "__name__");  // borrowed
  if (module && PyUnicode_Check(module)) {
    std::string m = PyUnicode_AsUTF8(module);
    if (m == "torch" || m.rfind("torch.", 0) == 0 || m == "kiln" || m.rfind("kiln.", 0) == 0) return false;
    // typing's backport, installed beside the packages rather than in the standard library: its
    // helpers run when a module is imported (torch imports some on first use, inside a step
    // that runs eagerly), never on tensors
    if (m == "typing_extensions") return false;
  }
  return true;
}

FrameCache* cache_for(PyObject* func, int* contain) {
  PyObject* code = PyFunction_GET_CODE(func);
  void* extra = nullptr;
  Py_ssize_t idx = extra_index();
  if (idx < 0 || _PyCode_GetExtra(code, idx, &extra) < 0) {
    PyErr_Clear();
    return nullptr;
  }
  if (extra == &kSkip) return nullptr;
  if (extra == &kContain) {
    *contain = 1;
    return nullptr;
  }
  if (extra) return static_cast<FrameCache*>(extra);
  if (contained(func)) {
    _PyCode_SetExtra(code, idx, &kContain);
    *contain = 1;
    return nullptr;
  }
  if (!takes(func)) {
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

PyObject* on_frame(PyObject* func, PyObject* const* args, PyObject** trampoline, int* contain) {
  if (!t_cfg) return nullptr;
  FrameCache* c = cache_for(func, contain);
  if (!c) return nullptr;
  SourceMemo memo;
  FetchedValues fetched;
  BoundArgs bound;
  bound.memo = &memo;
  bound.fetched = &fetched;
  bound.locals.assign(args, args + c->nargs);
  bool failed;
  Entry* e = select_entry(*c, func, bound, failed);
  if (failed) {
    *trampoline = c->trampoline;  // the frame raises what kiln raised (fullgraph=True)
    return nullptr;
  }
  // Frames that run eagerly, and frames with nothing to compute, run as they are. A frame kiln
  // was not asked to compile is counted, not warned about (the log has the reason).
  if (!e || e->eager) {
    record_eager_call(*c, e, false);
    return nullptr;
  }
  if (e->passthrough && !e->capture.graph_break) return nullptr;
  bool rerun = false;
  PyObject* result = run_entry(*e, func, bound, &rerun);
  if (!rerun) *trampoline = c->trampoline;  // else the frame runs as it is, raising eager's error
  return result;
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
    c->warned = false;
  }
}

}  // namespace kiln::bind
