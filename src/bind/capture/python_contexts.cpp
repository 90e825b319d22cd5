// Context managers written in Python, captured as TorchDynamo captures them: a class whose
// __enter__ and __exit__ are Python functions (made in the frame or the caller's), and a
// @contextlib.contextmanager generator. `with` inlines the entering code where the block starts
// and the exit code where it ends (the normal exit: __exit__(None, None, None), or the generator
// run on from its yield), so a timer, a flag-setting helper or a stack push around model code
// costs no graph break. What they do to Python state is captured like any other code (stores on
// objects replayed after the graph); what kiln cannot capture in them makes the call run eagerly.
// An exception raised in the block at capture reaches __exit__(type, exc, tb), or is thrown into
// the generator at its yield (exit_python_context_raising); a @contextmanager object used as a
// decorator runs each call in a fresh manager made as it was (call_in_fresh_context).
//
// Left to eager, as under TorchDynamo: a graph break inside such a block (the resume function
// would have to own a half-run __exit__ or generator), a @contextmanager object made outside
// capture (its generator already runs), and torch's own context managers other than modes.cpp's
// (they change torch's global state, which a graph does not replay).
#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"

namespace kiln::bind::detail {

namespace {

// The code of the `helper` that contextlib.contextmanager wraps around a generator function
// (which is the helper's one closure cell).
PyObject* contextmanager_helper_code() {
  static PyObject* code = []() -> PyObject* {
    PyObject* contextmanager = object_at("contextlib.contextmanager");
    PyObject* helper = contextmanager ? PyObject_CallOneArg(contextmanager, contextmanager) : nullptr;
    PyObject* c = helper && PyFunction_Check(helper) ? Py_NewRef(PyFunction_GET_CODE(helper)) : nullptr;
    Py_XDECREF(helper);
    clear_error();
    return c;
  }();
  return code;
}

// The class's attribute `name` (as `with` looks it up: on the type) where it is a Python function.
PyObject* python_method(PyTypeObject* cls, const char* name) {
  PyObject* key = PyUnicode_InternFromString(name);
  PyObject* f = key ? _PyType_Lookup(cls, key) : nullptr;
  Py_XDECREF(key);
  return f && PyFunction_Check(f) ? f : nullptr;
}

std::string qualname_of(PyObject* f) {
  return PyUnicode_AsUTF8(reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(f))->co_qualname);
}

}  // namespace

VarPtr Interpreter::generator_context(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs,
                                      const std::vector<VarPtr>* cells) {
  PyObject* helper = contextmanager_helper_code();
  if (!helper || PyFunction_GET_CODE(f) != helper) return nullptr;
  // The generator function is the helper's one closure cell: a real one, or (a helper made in
  // the frame) a tracker holding a constant or a function made in the frame.
  if (cells) {
    const VarPtr content = cells->size() == 1 ? (*cells)[0]->as<CellV>().content : nullptr;
    if (auto* made = content ? content->get_if<FunctionV>() : nullptr) return make_generator_context(made->fn, &made->cells, args, kwargs);
    if (!content || !content->is_const()) unsupported("a @contextmanager around something other than a generator function");
    return make_generator_context(content->known(), nullptr, args, kwargs);
  }
  PyObject* closure = PyFunction_GET_CLOSURE(f);
  PyObject* gen = closure && PyTuple_GET_SIZE(closure) == 1 ? PyCell_GET(PyTuple_GET_ITEM(closure, 0)) : nullptr;
  return make_generator_context(gen, nullptr, args, kwargs);
}

VarPtr Interpreter::make_generator_context(PyObject* gen, const std::vector<VarPtr>* cells, const std::vector<VarPtr>& args,
                                           const KwArgs& kwargs) {
  if (!gen || !PyFunction_Check(gen) || !(reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(gen))->co_flags & CO_GENERATOR))
    unsupported("a @contextmanager around something other than a generator function");
  if (is_torch_internal(gen))
    unsupported("with of torch's context manager " + qualname_of(gen) + " (it changes torch's global state)");
  auto g = std::make_shared<GeneratorContext>();
  // The generator function is fixed for the helper object (guarded where the helper was read):
  // its defaults are read as constants.
  g->frame = bound_frame(gen, nullptr, args, kwargs, cells);
  g->frame->stops_at_yield_ = true;
  g->gen = gen;
  root()->keep_.push_back(Py_NewRef(gen));  // the manager may outlive this frame (a helper returned it)
  g->has_cells = cells != nullptr;
  if (cells) g->cells = *cells;
  g->args = args;
  g->kwargs = kwargs;
  VarPtr c = Var::context(ModeChange{});
  c->as<ContextV>().generator = std::move(g);
  return c;
}

std::pair<VarPtr, VarPtr> Interpreter::enter_python_context_values(const VarPtr& ctx) {
  VarPtr exit = Var::context(ModeChange{}, Var::Kind::ContextExit);
  ContextExitV& e = exit->as<ContextExitV>();
  VarPtr entered;  // what `as` binds
  if (auto* c = ctx->get_if<ContextV>(); c && c->generator) {
    GeneratorContext& g = *c->generator;
    if (g.entered) unsupported("a @contextmanager object entered twice: AttributeError");
    g.entered = true;
    entered = g.step(this);
    if (!g.yielded()) unsupported("generator didn't yield: RuntimeError");
    e.generator = c->generator;
  } else {
    PyTypeObject* cls = nullptr;
    if (auto* r = ctx->get_if<RecordV>()) cls = reinterpret_cast<PyTypeObject*>(r->cls);
    else if (ctx->is_const() && ctx->known()) cls = Py_TYPE(ctx->known());
    if (!cls) return {nullptr, nullptr};
    // A @contextmanager object made outside capture (the caller's, or at a graph break: torch's
    // cudnn.flags(...)) holds a running generator, which its __enter__ would read as an object
    // new at every call: not captured
    static PyObject* generator_cm = object_at("contextlib._GeneratorContextManager");
    if (generator_cm && PyType_IsSubtype(cls, reinterpret_cast<PyTypeObject*>(generator_cm))) return {nullptr, nullptr};
    PyObject* enter_fn = python_method(cls, "__enter__");
    PyObject* exit_fn = python_method(cls, "__exit__");
    if (!enter_fn || !exit_fn || is_torch_internal(enter_fn) || is_torch_internal(exit_fn)) return {nullptr, nullptr};
    // `with` reads __exit__ before it calls __enter__
    e.python_exit = getattr(ctx, "__exit__");
    entered = call(getattr(ctx, "__enter__"), {}, {});
  }
  return {exit, entered};
}

bool Interpreter::enter_python_context(const VarPtr& ctx) {
  auto [exit, entered] = enter_python_context_values(ctx);
  if (!exit) return false;
  push(exit);
  push(entered);
  return true;
}

VarPtr Interpreter::exit_python_context(const ContextExitV& e, std::vector<VarPtr> args, const KwArgs& kwargs) {
  // Only the normal exit reaches here: an exception in the block goes to exit_python_context_raising.
  if (e.python_exit) return call(e.python_exit, std::move(args), kwargs);
  GeneratorContext& g = *e.generator;
  g.step(this);  // the None sent in is on its stack (op_yield_value)
  if (g.yielded()) unsupported("generator didn't stop: RuntimeError");
  return Var::constant(Py_False);
}

bool Interpreter::exit_python_context_raising(const ContextExitV& e, const VarPtr& exc) {
  PyObject* x = const_obj(exc, "exception");
  if (e.python_exit) {
    PyObject* tb = PyException_GetTraceback(x);  // new reference, or nullptr for none
    VarPtr traceback = tb ? Var::steal_constant(tb) : Var::constant(Py_None);
    return truth(call(e.python_exit, {Var::constant(reinterpret_cast<PyObject*>(Py_TYPE(x))), exc, traceback}, {}));
  }
  // contextmanager's __exit__: gen.throw(exc); the generator ending suppresses the exception,
  // re-raising it does not, another exception replaces it (raised from here)
  try {
    e.generator->throw_in(this, x);
  } catch (const Raised& r) {
    if (r.exc == x) return false;
    // A StopIteration thrown in and wrapped into a RuntimeError by the generator (PEP 479):
    // not suppressed, the StopIteration goes on (contextlib's rule)
    if (PyErr_GivenExceptionMatches(x, PyExc_StopIteration) && PyErr_GivenExceptionMatches(r.exc, PyExc_RuntimeError)) {
      PyObject* cause = PyException_GetCause(r.exc);
      Py_XDECREF(cause);
      if (cause == x) return false;
    }
    throw;
  }
  if (e.generator->yielded()) unsupported("generator didn't stop after throw(): RuntimeError");
  return true;
}

VarPtr Interpreter::call_in_fresh_context(const FunctionV& f, std::vector<VarPtr> args, const KwArgs& kwargs) {
  const GeneratorContext& made = *f.decorator->as<ContextV>().generator;
  VarPtr cm = make_generator_context(made.gen, made.has_cells ? &made.cells : nullptr, made.args, made.kwargs);
  auto [exit, entered] = enter_python_context_values(cm);
  VarPtr r;
  try {
    r = inline_call(f.fn, nullptr, std::move(args), kwargs, &f.cells);
  } catch (const Raised& e) {
    if (!exit_python_context_raising(exit->as<ContextExitV>(), Var::constant(e.exc))) throw;
    return Var::constant(Py_None);
  }
  exit_python_context(exit->as<ContextExitV>(), {Var::constant(Py_None), Var::constant(Py_None), Var::constant(Py_None)}, {});
  return r;
}

}  // namespace kiln::bind::detail
