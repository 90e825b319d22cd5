// The opcode handlers of the symbolic interpreter: one member function per opcode (or family of
// opcodes that share a meaning, such as the POP_JUMP_* spellings of 3.11 and 3.12), registered in
// a table indexed by the instruction's opcode. A handler returns -1 to go on with the next
// instruction, an instruction index to jump to, or kReturn; what it cannot follow it reports with
// unsupported(), which ends capture (or becomes a graph break) at that instruction.
//
// To support a new opcode: add its name to KILN_OPNAMES (bytecode.h), write `op_<name>` here
// next to its relatives, declare it in interpreter.h and add it to the table at the end.
#include <array>
#include <utility>
#include <vector>

#include "bind/capture/interpreter.h"
#include "bind/capture/resume.h"
#include "bind/capture/torch_call.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"
#include "bind/runtime/compiled_function.h"
#include "bind/torch/tensor_bridge.h"

namespace kiln::bind::detail {

int Interpreter::op_nop(const Instr& in, const CodeInfo& ci) {
  return -1;  // free variables are read lazily, or set by the caller
}

int Interpreter::op_make_cell(const Instr& in, const CodeInfo& ci) {
  locals_.at(in.arg) = Var::cell(locals_.at(in.arg));
  return -1;
}

int Interpreter::op_load_closure(const Instr& in, const CodeInfo& ci) {
  VarPtr& slot = locals_.at(in.arg);
  const bool free = !slot;
  if (!slot) slot = Var::cell(read_free_var(in));  // a free variable passed on to an inner function
  if (slot->kind() != Var::Kind::Cell) slot = Var::cell(slot);
  if (free) slot->as<CellV>().callers = true;
  push(slot);
  return -1;
}

int Interpreter::op_load_fast(const Instr& in, const CodeInfo& ci) {
  VarPtr v = locals_.at(in.arg);
  if (!v) {
    if (in.op == OP_LOAD_FAST_AND_CLEAR) v = Var::null();
    else unsupported("read of an unbound local");
  }
  if (in.op == OP_LOAD_FAST_AND_CLEAR) locals_[in.arg] = nullptr;
  push(v);
  return -1;
}

int Interpreter::op_store_fast(const Instr& in, const CodeInfo& ci) {
  locals_.at(in.arg) = pop();
  return -1;
}

int Interpreter::op_load_deref(const Instr& in, const CodeInfo& ci) {
  // Cells made in the frame hold their content; free variables of a real closure are
  // read (and guarded) on first use.
  VarPtr& slot = locals_.at(in.arg);
  if (!slot) slot = read_free_var(in);
  VarPtr v = slot->kind() == Var::Kind::Cell ? slot->as<CellV>().content : slot;
  if (!v) unsupported("read of an empty closure cell");
  push(v);
  return -1;
}

int Interpreter::op_store_deref(const Instr& in, const CodeInfo& ci) {
  VarPtr& slot = locals_.at(in.arg);
  if (slot && slot->kind() == Var::Kind::Cell) {
    if ((!is_own_cell(in.arg) && !parent_) || slot->as<CellV>().callers)
      unsupported("assignment to a closure variable of the caller (nonlocal)");
    slot->as<CellV>().content = pop();
    return -1;
  }
  if (!is_own_cell(in.arg)) {
    // `nonlocal x; x = v` on a real closure: a store into the cell, logged and replayed after
    // the graph (cell.cell_contents = v); reads later in the capture see the logged value.
    auto* co = reinterpret_cast<PyCodeObject*>(code_);
    const Py_ssize_t k = in.arg - (co->co_nlocalsplus - co->co_nfreevars);
    PyObject* closure = PyFunction_GET_CLOSURE(fn_);
    if (!closure || k >= PyTuple_GET_SIZE(closure)) unsupported("assignment to a closure variable (nonlocal)");
    PyObject* cell = PyTuple_GET_ITEM(closure, k);
    const std::string name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(co->co_localsplusnames, in.arg));
    SourcePtr src = !parent_   ? Source::closure_cell(k, name)
                    : fn_source_ ? Source::item(Source::attr(fn_source_, "__closure__"), k)
                                 : Source::pinned_object(cell, "cell '" + name + "' of " + PyUnicode_AsUTF8(co->co_qualname));
    VarPtr v = pop();
    if (v->kind() == Var::Kind::Module && is_private(v->obj())) unsupported("a module the function made stored in a closure cell");
    root()->keep_.push_back(Py_NewRef(cell));  // the log outlives an inlined frame
    root()->attr_stores_.push_back(AttrStore{cell, "cell_contents", v, std::move(src)});
    slot = v;
    return -1;
  }
  slot = pop();
  return -1;
}

int Interpreter::op_delete_deref(const Instr& in, const CodeInfo& ci) {
  unsupported("del of a closure variable");
}

int Interpreter::op_make_function(const Instr& in, const CodeInfo& ci) {
  VarPtr code = pop();
  VarPtr closure = (in.arg & 0x08) ? pop() : nullptr;
  if (in.arg & 0x04) pop();  // annotations
  VarPtr kwdefaults = (in.arg & 0x02) ? pop() : nullptr;
  VarPtr defaults = (in.arg & 0x01) ? pop() : nullptr;
  push(make_function(code, defaults, kwdefaults, closure));
  return -1;
}

int Interpreter::op_return_generator(const Instr& in, const CodeInfo& ci) {
  push(Var::constant(Py_None));
  return -1;
}

int Interpreter::op_yield_value(const Instr& in, const CodeInfo& ci) {
  if (stops_at_yield_) {  // GeneratorContext: stops here; None is sent in when it goes on
    return_value_ = pop();
    push(Var::constant(Py_None));
    return kYield;
  }
  yields_.push_back(pop());
  push(Var::constant(Py_None));  // what send() would pass in
  return -1;
}

// `yield from items` in a generator kiln runs to its end: GET_YIELD_FROM_ITER makes the items an
// iterator, then SEND hands out one item per round of SEND / YIELD_VALUE / JUMP_BACKWARD until
// none are left, when it jumps past the loop with the sub-iterator's return value (None).
int Interpreter::op_get_yield_from_iter(const Instr& in, const CodeInfo& ci) {
  VarPtr v = pop();
  push(v->kind() == Var::Kind::Iterator ? v : Var::iterator(items_of(v)));
  return -1;
}

int Interpreter::op_send(const Instr& in, const CodeInfo& ci) {
  pop();  // the value sent in: None (nothing sends into a generator kiln runs to its end)
  VarPtr& it = peek(1);
  if (it->kind() != Var::Kind::Iterator) unsupported("yield from an unknown iterator");
  auto& left = it->as<IteratorV>();
  if (left.empty()) {
    VarPtr returned = left.returned;
    if (PY_VERSION_HEX < 0x030C0000) pop();  // 3.11 drops the iterator here; 3.12 at END_SEND
    push(returned ? returned : Var::constant(Py_None));  // the sub-generator's return value
    return in.jump_target;
  }
  VarPtr next = left.front();
  left.pop_front();
  push(next);
  return -1;
}

int Interpreter::op_end_send(const Instr& in, const CodeInfo& ci) {
  VarPtr v = pop();
  pop();  // the iterator under the value
  push(v);
  return -1;
}

// `global name; name = v` (and `del name`): logged as a store into the module's dict, replayed
// after the graph (as TorchDynamo's side effects do); reads later in the capture see the value.
int Interpreter::op_store_global(const Instr& in, const CodeInfo& ci) {
  VarPtr value = in.op == OP_STORE_GLOBAL ? pop() : nullptr;
  const std::string name = PyUnicode_AsUTF8(in.argval);
  const AttrStore* before = logged_attr(globals_, name);
  if (!value) {
    // `del name` of a global: there at the call (guarded where capture did not set it), or NameError
    bool present;
    if (before) {
      present = before->value != nullptr;
    } else {
      present = PyDict_GetItemWithError(globals_, in.argval) != nullptr;
      if (PyErr_Occurred()) real(nullptr);
      out_.guards.add_haskey(Source::globals_dict(parent_ ? globals_ : nullptr), in.argval, present);
    }
    if (!present) raise_new(PyExc_NameError, "name '" + name + "' is not defined");
  }
  if (value && value->kind() == Var::Kind::Module && is_private(value->obj()))
    unsupported("a module the function made stored in a global");  // its state is this capture's
  keep_.push_back(Py_NewRef(globals_));
  root()->attr_stores_.push_back(AttrStore{globals_, name, std::move(value), Source::globals_dict(parent_ ? globals_ : nullptr)});
  return -1;
}

// `class C: ...` inside the function: builtins.__build_class__, which call_rules.cpp runs for real
// on a class body that closes over no value of the frame's.
int Interpreter::op_load_build_class(const Instr& in, const CodeInfo& ci) {
  push(Var::constant(builtin("__build_class__")));
  return -1;
}

// torch.autograd.profiler.record_function (torch.profiler's too): a named range for the
// profiler, which a compiled graph does not show (as under torch.compile); nothing else.
bool Interpreter::is_profiler_range(const VarPtr& ctx) {
  static PyObject* record_function = object_at("torch.autograd.profiler.record_function");
  if (!record_function) return false;
  if (auto* r = ctx->get_if<RecordV>()) return PyObject_IsSubclass(r->cls, record_function) == 1;  // made in the frame
  return ctx->is_const() && ctx->known() && PyObject_TypeCheck(ctx->known(), reinterpret_cast<PyTypeObject*>(record_function));
}

// A threading.Lock or RLock of the caller's (a library's guard around a one-time setup): the
// compiled graph runs as one step, so `with lock:` around captured code is nothing, as under
// torch.compile; `as` binds acquire()'s True.
bool Interpreter::is_thread_lock(PyObject* o) {
  static PyObject* lock = object_at("_thread.LockType");
  static PyObject* rlock = object_at("_thread.RLock");
  return (lock && Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(lock)) || (rlock && Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(rlock));
}

int Interpreter::op_before_with(const Instr& in, const CodeInfo& ci) {
  VarPtr ctx = pop();
  ModeChange m;
  static PyObject* nullcontext = object_at("contextlib.nullcontext");
  VarPtr entered = Var::constant(Py_None);  // what `as` binds
  if (ctx->kind() == Var::Kind::Context && !ctx->as<ContextV>().generator) m = *ctx->as<ContextV>().mode;
  else if (ctx->is_const() && nullcontext && PyObject_TypeCheck(ctx->known(), reinterpret_cast<PyTypeObject*>(nullcontext)) &&
           Py_TYPE(ctx->known()) == reinterpret_cast<PyTypeObject*>(nullcontext)) {
    // a nullcontext the caller made: no modes; `as` binds its enter_result
    entered = getattr(ctx, "enter_result");
  } else if (is_profiler_range(ctx)) entered = ctx;  // record_function: no modes
  else if (ctx->is_const() && is_thread_lock(ctx->known())) entered = Var::constant(Py_True);  // capture runs on one thread
  else if (enter_python_context(ctx)) return -1;  // pushed its exit and what `as` binds
  else if (ctx->is_const()) {
    // (checked by type before the object is pinned: an entry that then runs eagerly keeps no
    // identity guard on a manager made anew at every call)
    PyObject* cls = reinterpret_cast<PyObject*>(Py_TYPE(ctx->known()));
    static PyObject* no_grad = resolve_torch("no_grad");
    static PyObject* enable_grad = resolve_torch("enable_grad");
    if (cls != no_grad && cls != enable_grad && !is_autocast_object(ctx->known()))
      unsupported(std::string("with of a context manager other than torch.no_grad/enable_grad/inference_mode/autocast/nullcontext (") +
                  Py_TYPE(ctx->known())->tp_name + ")");
    m = modes_of_object(const_obj(ctx, "context manager"));
  }
  else unsupported("with of a context manager other than torch.no_grad/enable_grad/inference_mode/autocast/nullcontext");
  ModeChange before = enter_modes(m);
  if (auto* c = ctx->get_if<ContextV>(); c && c->restore) before = *c->restore;
  VarPtr exit = Var::context(std::move(before), Var::Kind::ContextExit);  // its __exit__ restores the modes before
  exit->as<ContextExitV>().entered = std::make_shared<const ModeChange>(m);
  push(exit);
  push(entered);
  return -1;
}

int Interpreter::op_format_value(const Instr& in, const CodeInfo& ci) {
  VarPtr spec = (in.arg & 0x04) ? pop() : nullptr;
  VarPtr v = pop();
  PyObject* o = const_obj(v, "formatted value");
  PyObject* conv = nullptr;
  switch (in.arg & 0x03) {
    case 1: conv = PyObject_Str(o); break;
    case 2: conv = PyObject_Repr(o); break;
    case 3: conv = PyObject_ASCII(o); break;
    default: conv = Py_NewRef(o);
  }
  if (!conv) real(nullptr);
  PyObject* r = PyObject_Format(conv, spec ? const_obj(spec, "format spec") : nullptr);
  Py_DECREF(conv);
  push(real(r));
  return -1;
}

int Interpreter::op_build_string(const Instr& in, const CodeInfo& ci) {
  std::vector<VarPtr> parts(in.arg);
  for (int i = in.arg - 1; i >= 0; --i) parts[i] = pop();
  PyObject* list = PyList_New(in.arg);
  for (int i = 0; i < in.arg; ++i) PyList_SET_ITEM(list, i, Py_NewRef(const_obj(parts[i], "string")));
  PyObject* empty = PyUnicode_FromString("");
  PyObject* r = PyUnicode_Join(empty, list);
  Py_DECREF(empty);
  Py_DECREF(list);
  push(real(r));
  return -1;
}

int Interpreter::op_jump_if_true_or_pop(const Instr& in, const CodeInfo& ci) {
  bool t = truth(peek(1));
  if (t == (in.op == OP_JUMP_IF_TRUE_OR_POP)) return in.jump_target;
  pop();
  return -1;
}

int Interpreter::op_unpack_ex(const Instr& in, const CodeInfo& ci) {
  int before = in.arg & 0xff, after = in.arg >> 8;
  VarPtr seq = pop();
  std::vector<VarPtr> items = seq->kind() == Var::Kind::Tuple || seq->kind() == Var::Kind::List ? seq->seq() : drain(seq);
  if (static_cast<int>(items.size()) < before + after)
    raise_new(PyExc_ValueError, "not enough values to unpack (expected at least " + std::to_string(before + after) + ", got " +
                                    std::to_string(items.size()) + ")");
  std::vector<VarPtr> out(items.begin(), items.begin() + before);
  out.push_back(Var::tuple(std::vector<VarPtr>(items.begin() + before, items.end() - after), true));
  out.insert(out.end(), items.end() - after, items.end());
  for (auto it = out.rbegin(); it != out.rend(); ++it) push(*it);
  return -1;
}

int Interpreter::op_store_subscr(const Instr& in, const CodeInfo& ci) {
  VarPtr key = pop(), container = pop(), value = pop();
  store_subscript(container, key, value);
  return -1;
}

int Interpreter::op_build_set(const Instr& in, const CodeInfo& ci) {
  std::vector<VarPtr> items(in.arg);
  for (int i = in.arg - 1; i >= 0; --i) items[i] = pop();
  PyObject* set = PySet_New(nullptr);
  for (auto& v : items)
    if (PySet_Add(set, key_obj(v, "set item")) < 0) {
      Py_DECREF(set);
      real(nullptr);
    }
  push(Var::steal_constant(set));
  return -1;
}

int Interpreter::op_set_add(const Instr& in, const CodeInfo& ci) {
  VarPtr v = pop();
  VarPtr& set = peek(in.arg);
  if (!set->is_const() || !PySet_Check(set->obj()) || set->source) unsupported("update of a set the caller can see");
  int rc;
  if (in.op == OP_SET_ADD) {
    rc = PySet_Add(set->obj(), key_obj(v, "set item"));
  } else {
    rc = 0;
    for (const VarPtr& x : items_of(v))
      if (PySet_Add(set->obj(), key_obj(x, "set item")) < 0) rc = -1;
  }
  if (rc < 0) real(nullptr);
  return -1;
}

int Interpreter::op_map_add(const Instr& in, const CodeInfo& ci) {
  VarPtr value = pop(), key = pop();
  VarPtr& d = peek(in.arg);
  if (d->kind() != Var::Kind::Dict) unsupported("dict comprehension into a non-dict");
  dict_set(d, key_obj(key, "dict key"), value);
  return -1;
}

int Interpreter::op_load_assertion_error(const Instr& in, const CodeInfo& ci) {
  unsupported("an assert fails (or depends on tensor data): eager raises");
}

void Interpreter::raise(PyObject* exc) {
  root()->keep_.push_back(Py_NewRef(exc));
  std::string msg = std::string("raise: eager raises ") + Py_TYPE(exc)->tp_name;
  if (PyObject* s = PyObject_Str(exc)) {
    if (PyUnicode_GET_LENGTH(s)) msg += ": " + std::string(PyUnicode_AsUTF8(s));
    Py_DECREF(s);
  }
  clear_error();
  throw Raised(exc, msg);
}

void Interpreter::raise_new(PyObject* type, PyObject* args) {
  if (!args) real(nullptr);
  PyObject* e = PyObject_Call(type, args, nullptr);
  Py_DECREF(args);
  if (!e) real(nullptr);
  root()->keep_.push_back(e);
  raise(e);
}

void Interpreter::raise_new(PyObject* type, const std::string& message) { raise_new(type, Py_BuildValue("(s)", message.c_str())); }

PyObject* Interpreter::handled_exception() {
  for (Interpreter* f = this; f; f = f->parent_)
    if (!f->handling_.empty()) return f->handling_.back()->is_const() ? f->handling_.back()->known() : nullptr;
  return nullptr;
}

int Interpreter::op_raise_varargs(const Instr& in, const CodeInfo& ci) {
  if (in.arg == 0) {  // a bare `raise`: the exception being handled
    if (handling_.empty() || !handling_.back()->is_const()) unsupported("raise: eager raises the exception");
    raise(handling_.back()->known());
  }
  VarPtr cause = in.arg == 2 ? pop() : nullptr;
  VarPtr e = pop();
  if (!e->is_const()) unsupported("raise: eager raises the exception");
  // An exception instance or class (raise TypeError: an instance made from it)
  auto instance = [&](PyObject* o) {
    if (!PyExceptionClass_Check(o)) return o;
    PyObject* inst = PyObject_CallNoArgs(o);
    if (!inst) real(nullptr);
    root()->keep_.push_back(inst);
    return inst;
  };
  PyObject* o = instance(e->known());
  if (!PyExceptionInstance_Check(o)) unsupported("raise of a non-exception: TypeError");
  if (cause) {  // raise X from Y: Y (an exception, or None) is X's __cause__, and hides its context
    if (!cause->is_const()) unsupported("raise ... from a value kiln does not know");
    PyObject* c = instance(cause->known());
    if (c != Py_None && !PyExceptionInstance_Check(c)) unsupported("exception causes must derive from BaseException: TypeError");
    PyException_SetCause(o, c == Py_None ? nullptr : Py_NewRef(c));  // (sets __suppress_context__)
  }
  // Raised while another is handled: that one is its __context__, as CPython chains them
  if (PyObject* ctx = handled_exception(); ctx && ctx != o) PyException_SetContext(o, Py_NewRef(ctx));
  raise(o);
}

// try/except (the handler code the exception table leads to): the exception is a constant
// tracker of the instance; `except T:` matches it by type.
int Interpreter::op_push_exc_info(const Instr& in, const CodeInfo& ci) {
  VarPtr exc = pop();
  push(handling_.empty() ? Var::constant(Py_None) : handling_.back());
  push(exc);
  handling_.push_back(exc);
  return -1;
}

int Interpreter::op_check_exc_match(const Instr& in, const CodeInfo& ci) {
  VarPtr type = pop();
  PyObject* t = const_obj(type, "exception type");
  int r = PyErr_GivenExceptionMatches(const_obj(peek(1), "exception"), t);
  push(Var::constant(r ? Py_True : Py_False));
  return -1;
}

int Interpreter::op_pop_except(const Instr& in, const CodeInfo& ci) {
  pop();  // the exception handled before this one (kept in handling_)
  if (!handling_.empty()) handling_.pop_back();
  return -1;
}

int Interpreter::op_reraise(const Instr& in, const CodeInfo& ci) {
  VarPtr exc = pop();  // (with an argument, the lasti under it stays: CPython only reads it)
  if (!exc->is_const() || !PyExceptionInstance_Check(exc->known())) unsupported("re-raise of a value kiln does not know");
  raise(exc->known());
}

// A with block left by an exception raised at capture: its __exit__(type, exc, traceback) under
// the exception (the stack holds exit, lasti, the exception handled before, the exception);
// what it returns says whether the exception is suppressed. A grad-mode or autocast block
// restores its modes and never suppresses.
int Interpreter::op_with_except_start(const Instr& in, const CodeInfo& ci) {
  VarPtr exit = peek(4), exc = peek(1);
  if (exit->kind() != Var::Kind::ContextExit) unsupported("a with block's exit kiln does not know");
  const ContextExitV& e = exit->as<ContextExitV>();
  if (!e.python_exit && !e.generator) {  // grad mode, autocast: restored, never suppressing
    restore_modes(*e.mode);
    push(Var::constant(Py_False));
    return -1;
  }
  push(Var::constant(exit_python_context_raising(e, exc) ? Py_True : Py_False));
  return -1;
}

int Interpreter::op_store_attr(const Instr& in, const CodeInfo& ci) {
  VarPtr obj = pop(), value = pop();
  store_attr(obj, PyUnicode_AsUTF8(in.argval), value);
  return -1;
}

int Interpreter::op_delete_attr(const Instr& in, const CodeInfo& ci) {
  store_attr(pop(), PyUnicode_AsUTF8(in.argval), nullptr);
  return -1;
}

int Interpreter::op_import_name(const Instr& in, const CodeInfo& ci) {
  // `import torch` inside a function: a module already imported is only looked up
  VarPtr fromlist = pop(), level = pop();
  PyObject* name = in.argval;
  PyObject* modules = PyImport_GetModuleDict();
  if (!PyDict_GetItemWithError(modules, name)) unsupported("import of a module not yet imported");
  push(real(PyImport_ImportModuleLevelObject(name, globals_, nullptr, const_obj(fromlist, "fromlist"),
                                             PyLong_AsLong(const_obj(level, "level")))));
  return -1;
}

int Interpreter::op_import_from(const Instr& in, const CodeInfo& ci) {
  PyObject* a = PyObject_GetAttr(const_obj(peek(1), "module"), in.argval);
  if (!a) unsupported("import of a name the module does not have");
  push(Var::steal_constant(a));
  return -1;
}

int Interpreter::op_store_slice(const Instr& in, const CodeInfo& ci) {
  VarPtr stop = pop(), start = pop(), container = pop(), value = pop();
  PyObject* sl = PySlice_New(const_obj(start, "slice"), const_obj(stop, "slice"), nullptr);
  store_subscript(container, real(sl), value);
  return -1;
}

int Interpreter::op_delete_subscr(const Instr& in, const CodeInfo& ci) {
  VarPtr key = pop(), container = pop();
  if (container->kind() == Var::Kind::Dict) {
    Py_ssize_t i = dict_find(container, key_obj(key, "dict key", container));
    if (i < 0) unsupported("KeyError in del");
    note_mutation(container, "del of an item");
    Entries& e = container->entries();
    Py_DECREF(e.keys[i]);
    e.keys.erase(e.keys.begin() + i);
    e.values.erase(e.values.begin() + i);
    return -1;
  }
  if (container->kind() == Var::Kind::List && key->is_const() && PySlice_Check(key->obj())) {
    note_mutation(container, "del of a slice");
    replace_slice(container->seq(), key->obj(), nullptr);
    return -1;
  }
  if (container->kind() == Var::Kind::List && key->is_const() && PyLong_Check(key->obj())) {
    auto& items = container->seq();
    Py_ssize_t n = static_cast<Py_ssize_t>(items.size()), i = PyLong_AsSsize_t(key->obj());
    if (i < 0) i += n;
    if (i < 0 || i >= n) unsupported("list index out of range in del");
    note_mutation(container, "del of an item");
    items.erase(items.begin() + i);
    return -1;
  }
  unsupported("del of an item of an object the caller can see");
}

int Interpreter::op_delete_fast(const Instr& in, const CodeInfo& ci) {
  locals_.at(in.arg) = nullptr;
  return -1;
}

int Interpreter::op_load_const(const Instr& in, const CodeInfo& ci) {
  push(Var::constant(in.argval));
  return -1;
}

int Interpreter::op_return_const(const Instr& in, const CodeInfo& ci) {
  return_value_ = Var::constant(in.argval);
  return kReturn;
}

int Interpreter::op_return_value(const Instr& in, const CodeInfo& ci) {
  return_value_ = pop();
  return kReturn;
}

int Interpreter::op_push_null(const Instr& in, const CodeInfo& ci) {
  push(Var::null());
  return -1;
}

int Interpreter::op_load_global(const Instr& in, const CodeInfo& ci) {
  if (in.arg & 1) push(Var::null());
  std::string name = PyUnicode_AsUTF8(in.argval);
  if (const AttrStore* st = logged_attr(globals_, name)) {  // `global name` stored earlier in this capture
    if (!st->value) unsupported("NameError: name '" + name + "' is not defined");
    push(st->value);
    return -1;
  }
  PyObject* v = PyDict_GetItemString(globals_, name.c_str());
  if (!v) v = PyDict_GetItemString(builtins_, name.c_str());
  if (!v) unsupported("NameError: name '" + name + "' is not defined");
  push(wrap(v, Source::global(name, parent_ ? globals_ : nullptr)));
  return -1;
}

int Interpreter::op_load_attr(const Instr& in, const CodeInfo& ci) {
  std::string name = PyUnicode_AsUTF8(in.argval);
  bool method = in.op == OP_LOAD_METHOD || (PY_VERSION_HEX >= 0x030C0000 && (in.arg & 1));
  VarPtr base = pop();
  VarPtr attr = getattr(base, name);
  if (method) {
    push(Var::null());  // kiln resolves methods to bound callables, so the slot is NULL
  }
  push(attr);
  return -1;
}

int Interpreter::op_kw_names(const Instr& in, const CodeInfo& ci) {
  // The names tuple is co_consts[arg] (dis leaves argval unresolved on 3.11).
  kwnames_.clear();
  PyObject* t = PyTuple_GetItem(reinterpret_cast<PyCodeObject*>(code_)->co_consts, in.arg);
  if (!t || !PyTuple_Check(t)) unsupported("malformed KW_NAMES");
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); ++i) kwnames_.push_back(PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, i)));
  return -1;
}

int Interpreter::op_call(const Instr& in, const CodeInfo& ci) {
  int argc = in.arg;
  std::vector<VarPtr> args(argc);
  for (int i = argc - 1; i >= 0; --i) args[i] = pop();
  VarPtr second = pop(), first = pop();
  VarPtr fn;
  if (first->kind() == Var::Kind::Null) fn = second;
  else {
    fn = first;
    args.insert(args.begin(), second);
  }
  KwArgs kwargs;
  size_t nkw = kwnames_.size();
  if (nkw > args.size()) unsupported("malformed call");
  for (size_t k = 0; k < nkw; ++k) kwargs.emplace_back(kwnames_[k], args[args.size() - nkw + k]);
  args.resize(args.size() - nkw);
  kwnames_.clear();
  push(call(fn, std::move(args), std::move(kwargs)));
  return -1;
}

int Interpreter::op_load_super_attr(const Instr& in, const CodeInfo& ci) {
  VarPtr self = pop(), cls = pop();
  pop();  // the global `super`
  VarPtr attr = super_attr(make_super({cls, self}), PyUnicode_AsUTF8(in.argval));
  if (in.arg & 1) push(Var::null());
  push(attr);
  return -1;
}

int Interpreter::op_build_map(const Instr& in, const CodeInfo& ci) {
  std::vector<VarPtr> kv(2 * in.arg);
  for (int i = 2 * in.arg - 1; i >= 0; --i) kv[i] = pop();
  VarPtr d = Var::dict();
  for (int i = 0; i < in.arg; ++i) dict_set(d, key_obj(kv[2 * i], "dict key"), kv[2 * i + 1]);
  push(d);
  return -1;
}

int Interpreter::op_build_const_key_map(const Instr& in, const CodeInfo& ci) {
  VarPtr keys = pop();
  std::vector<VarPtr> values(in.arg);
  for (int i = in.arg - 1; i >= 0; --i) values[i] = pop();
  PyObject* k = const_obj(keys, "dict keys");
  if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != in.arg) unsupported("malformed BUILD_CONST_KEY_MAP");
  VarPtr d = Var::dict();
  for (int i = 0; i < in.arg; ++i) dict_set(d, PyTuple_GET_ITEM(k, i), values[i]);
  push(d);
  return -1;
}

int Interpreter::op_dict_merge(const Instr& in, const CodeInfo& ci) {
  VarPtr update = pop();
  VarPtr& target = peek(in.arg);
  if (target->kind() != Var::Kind::Dict || !is_dict(update)) unsupported("dict merge of a non-dict");
  for (auto& [k, v] : dict_entries(update)) {
    if (in.op == OP_DICT_MERGE && dict_find(target, k) >= 0) unsupported("got multiple values for a keyword argument");
    dict_set(target, k, v);
  }
  return -1;
}

int Interpreter::op_call_function_ex(const Instr& in, const CodeInfo& ci) {
  // f(*args) and f(*args, **kwargs): the sequence and the dict must be known here.
  KwArgs kwargs;
  if (in.arg & 1) {
    VarPtr kw = pop();
    if (!is_dict(kw)) unsupported("** of a non-dict");
    for (auto& [k, v] : dict_entries(kw)) {
      if (!PyUnicode_Check(k)) unsupported("keywords must be strings");
      kwargs.emplace_back(PyUnicode_AsUTF8(k), v);
    }
  }
  VarPtr seq = pop();
  std::vector<VarPtr> args;
  if (seq->kind() == Var::Kind::Tuple || seq->kind() == Var::Kind::List) {
    args = seq->seq();
  } else if (auto* it = seq->get_if<IteratorV>()) {
    // f(*generator): Python makes a tuple of what is left, leaving the iterator exhausted
    // (torch's parametrize: `self.original(*(t for t in ...))`)
    args = it->left();
    while (!it->empty()) it->pop_front();
  } else if (seq->kind() == Var::Kind::Dict) {
    args = items_of(seq);  // its keys
  } else {
    PyObject* fast = PySequence_Fast(const_obj(seq, "*args"), "not a sequence");
    if (!fast) real(nullptr);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
      args.push_back(Var::constant(PySequence_Fast_GET_ITEM(fast, i)));
    Py_DECREF(fast);
  }
  VarPtr fn = pop();
  if (!stack_.empty() && stack_.back()->kind() == Var::Kind::Null) pop();
  push(call(fn, std::move(args), std::move(kwargs)));
  return -1;
}

int Interpreter::op_binary_op(const Instr& in, const CodeInfo& ci) {
  VarPtr b = pop(), a = pop();
  if (in.arg < 0 || static_cast<size_t>(in.arg) >= ci.nb_ops.size()) unsupported("unknown BINARY_OP");
  push(binary(ci.nb_ops[in.arg], a, b));
  return -1;
}

int Interpreter::op_compare_op(const Instr& in, const CodeInfo& ci) {
  VarPtr b = pop(), a = pop();
  push(compare(PyUnicode_AsUTF8(in.argval), a, b));
  return -1;
}

int Interpreter::op_is_op(const Instr& in, const CodeInfo& ci) {
  VarPtr b = pop(), a = pop();
  bool same;
  if (a->is_const() && b->is_const()) {
    // An object guarded by its structure is not None, nor any object of another type; is it
    // this other object of its own type? Only identity can say: both are pinned.
    if ((structural(a) || structural(b)) && Py_TYPE(a->obj()) == Py_TYPE(b->obj())) const_obj(a, "operand"), const_obj(b, "operand");
    same = a->known() == b->obj();
  } else if (a->in_graph() && b->in_graph()) {
    same = a->node() == b->node() && a->is_array() == b->is_array();
  } else if (a == b) {
    same = true;  // one tracker is one object: a list, dict, function or object aliased
  } else if (a->kind() == Var::Kind::Module || b->kind() == Var::Kind::Module) {
    // modules are guarded by identity (`layer is self.layers[-1]`); never a tensor or a list
    auto held = [](const VarPtr& v) { return v->kind() == Var::Kind::Module || v->is_const(); };
    same = held(a) && held(b) && a->obj() == b->obj();
  } else if (a->in_graph() || b->in_graph() || a->is_const() || b->is_const() || !a->source || !b->source) {
    same = false;  // a tensor is never None, a list never a constant; made in the frame: distinct
  } else if (a->source->str() == b->source->str()) {
    same = true;  // two reads of one place of the caller's
  } else {
    unsupported("`is` between values read from different places");
  }
  push(Var::constant((same != (in.arg == 1)) ? Py_True : Py_False));
  return -1;
}

int Interpreter::op_contains_op(const Instr& in, const CodeInfo& ci) {
  VarPtr b = pop(), a = pop();
  if (b->kind() == Var::Kind::Module) {
    std::vector<std::string> keys = module_keys(b);
    std::string k = PyUnicode_Check(const_obj(a, "key")) ? PyUnicode_AsUTF8(a->obj()) : "";
    bool found = std::find(keys.begin(), keys.end(), k) != keys.end();
    push(Var::constant((found != (in.arg == 1)) ? Py_True : Py_False));
    return -1;
  }
  if (b->kind() == Var::Kind::Dict || b->kind() == Var::Kind::Tuple || b->kind() == Var::Kind::List) {
    bool found = false;
    if (b->kind() == Var::Kind::Dict) {
      found = dict_find(b, key_obj(a, "key", b)) >= 0;
    } else {
      for (const VarPtr& x : b->seq()) {
        if (found) break;  // Python stops at the first item that is (or equals) the value
        if (x->in_graph() || a->in_graph()) {
          if (x->in_graph() && a->in_graph() && x->node() == a->node()) found = true;
          else if (x->in_graph() != a->in_graph()) continue;
          else unsupported("`in` comparing tensors by value");
        } else {
          int eq = PyObject_RichCompareBool(const_obj(x, "item"), const_obj(a, "item"), Py_EQ);
          if (eq < 0) real(nullptr);
          found = found || eq == 1;
        }
      }
    }
    push(Var::constant((found != (in.arg == 1)) ? Py_True : Py_False));
    return -1;
  }
  PyObject* container = const_obj(b, "container");
  // a tensor in a set or dict of keys: by identity, through its key object
  int r = PySequence_Contains(container, (PyAnySet_Check(container) || PyDict_Check(container)) ? key_obj(a, "item") : const_obj(a, "item"));
  if (r < 0) real(nullptr);
  push(Var::constant(((r == 1) != (in.arg == 1)) ? Py_True : Py_False));
  return -1;
}

int Interpreter::op_unary_negative(const Instr& in, const CodeInfo& ci) {
  VarPtr a = pop();
  if (a->is_array()) push(array_unary("neg", a));
  else if (a->is_tensor()) push(Var::tensor(add_node("neg", {a->node()})));
  else if (a->symfloat()) push(symfloat_negative(a));
  else if (VarPtr r = symint_binary("MULTIPLY", a, Var::steal_constant(PyLong_FromLong(-1)))) push(r);  // -T
  else push(real(PyNumber_Negative(const_obj(a, "operand"))));
  return -1;
}

int Interpreter::op_unary_positive(const Instr& in, const CodeInfo& ci) {
  push(positive(pop()));
  return -1;
}

int Interpreter::op_unary_not(const Instr& in, const CodeInfo& ci) {
  push(Var::constant(truth(pop()) ? Py_False : Py_True));
  return -1;
}

int Interpreter::op_unary_invert(const Instr& in, const CodeInfo& ci) {
  VarPtr a = pop();
  if (a->is_array()) {
    push(array_unary("invert", a));
  } else if (a->is_tensor()) {
    if (a->node()->meta.dtype != DType::Bool) unsupported("bitwise not of an integer tensor");
    push(Var::tensor(add_node("logical_not", {a->node()})));
  } else {
    push(real(PyNumber_Invert(const_obj(a, "operand"))));
  }
  return -1;
}

int Interpreter::op_call_intrinsic_1(const Instr& in, const CodeInfo& ci) {
  const std::string& n = in.argrepr;
  if (n == "INTRINSIC_UNARY_POSITIVE") {
    push(positive(pop()));
    return -1;
  }
  if (n == "INTRINSIC_LIST_TO_TUPLE") {
    VarPtr a = pop();
    push(Var::tuple(a->seq()));
    return -1;
  }
  unsupported("intrinsic " + n);
}

int Interpreter::op_build_tuple(const Instr& in, const CodeInfo& ci) {
  std::vector<VarPtr> items(in.arg);
  for (int i = in.arg - 1; i >= 0; --i) items[i] = pop();
  push(Var::tuple(std::move(items), in.op == OP_BUILD_LIST));
  return -1;
}

int Interpreter::op_list_extend(const Instr& in, const CodeInfo& ci) {
  VarPtr seq = pop();
  VarPtr& list = peek(in.arg);
  if (seq->kind() == Var::Kind::Tuple || seq->kind() == Var::Kind::List) {
    for (auto& x : seq->seq()) list->seq().push_back(x);
  } else {
    PyObject* o = const_obj(seq, "sequence");
    PyObject* fast = PySequence_Fast(o, "not a sequence");
    if (!fast) real(nullptr);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
      list->seq().push_back(Var::constant(PySequence_Fast_GET_ITEM(fast, i)));
    Py_DECREF(fast);
  }
  return -1;
}

int Interpreter::op_list_append(const Instr& in, const CodeInfo& ci) {
  VarPtr v = pop();
  peek(in.arg)->seq().push_back(v);
  return -1;
}

int Interpreter::op_list_to_tuple(const Instr& in, const CodeInfo& ci) {
  VarPtr a = pop();
  push(Var::tuple(a->seq()));
  return -1;
}

int Interpreter::op_unpack_sequence(const Instr& in, const CodeInfo& ci) {
  VarPtr seq = pop();
  std::vector<VarPtr> items;
  if (seq->kind() == Var::Kind::Tuple || seq->kind() == Var::Kind::List) {
    items = seq->seq();
  } else if (seq->is_const()) {
    PyObject* fast = PySequence_Fast(seq->obj(), "cannot unpack");
    if (!fast) real(nullptr);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
      items.push_back(Var::constant(PySequence_Fast_GET_ITEM(fast, i)));
    Py_DECREF(fast);
  } else if (seq->kind() == Var::Kind::Iterator || seq->kind() == Var::Kind::Dict) {
    items = drain(seq);
  } else {
    items = items_of(seq);  // a tensor: its rows (q, k, v = qkv), as iter(x) gives them
  }
  const int n = static_cast<int>(items.size());
  if (n > in.arg) raise_new(PyExc_ValueError, "too many values to unpack (expected " + std::to_string(in.arg) + ")");
  if (n < in.arg)
    raise_new(PyExc_ValueError, "not enough values to unpack (expected " + std::to_string(in.arg) + ", got " + std::to_string(n) + ")");
  for (auto it = items.rbegin(); it != items.rend(); ++it) push(*it);
  return -1;
}

int Interpreter::op_binary_subscr(const Instr& in, const CodeInfo& ci) {
  VarPtr idx = pop(), base = pop();
  push(subscript(base, idx));
  return -1;
}

// A slice of constants; with symbolic-int bounds, one that keeps their expressions.
VarPtr Interpreter::make_slice(const VarPtr& start, const VarPtr& stop, const VarPtr& step) {
  bool symbolic = false;
  for (const VarPtr& p : {start, stop, step}) symbolic |= p && p->symint().valid();
  if (!symbolic)
    return real(PySlice_New(const_obj(start, "slice"), const_obj(stop, "slice"), step ? const_obj(step, "slice") : nullptr));
  std::vector<sym::Expr> exprs;
  std::vector<PyObject*> hints;
  for (const VarPtr& p : {start, stop, step}) {
    if (!p) {
      exprs.emplace_back();
      hints.push_back(Py_None);
      continue;
    }
    PyObject* h = p->known();  // the hint: no specialization
    if (sym::Expr e = p->symint(); e.valid()) exprs.push_back(e);
    else if (h && PyLong_CheckExact(h)) exprs.push_back(sym::Expr(static_cast<int64_t>(PyLong_AsLongLong(h))));
    else exprs.push_back(sym::Expr());
    if (!h) h = const_obj(p, "slice");
    hints.push_back(h);
  }
  VarPtr v = real(PySlice_New(hints[0], hints[1], hints[2]));
  v->as<ConstV>().slice = exprs;
  return v;
}

int Interpreter::op_build_slice(const Instr& in, const CodeInfo& ci) {
  std::vector<VarPtr> parts(in.arg);
  for (int i = in.arg - 1; i >= 0; --i) parts[i] = pop();
  push(make_slice(parts[0], parts[1], in.arg == 3 ? parts[2] : nullptr));
  return -1;
}

int Interpreter::op_binary_slice(const Instr& in, const CodeInfo& ci) {
  VarPtr stop = pop(), start = pop(), base = pop();
  push(subscript(base, make_slice(start, stop, nullptr)));
  return -1;
}

int Interpreter::op_pop_top(const Instr& in, const CodeInfo& ci) {
  pop();
  return -1;
}

int Interpreter::op_copy(const Instr& in, const CodeInfo& ci) {
  push(peek(in.arg));
  return -1;
}

int Interpreter::op_swap(const Instr& in, const CodeInfo& ci) {
  std::swap(peek(1), peek(in.arg));
  return -1;
}

int Interpreter::op_pop_jump_if_false(const Instr& in, const CodeInfo& ci) {
  VarPtr v = pop();
  if (v->is_tensor()) return tensor_jump(v, in, ci, false);
  return truth(v) ? -1 : in.jump_target;
}

int Interpreter::op_pop_jump_if_true(const Instr& in, const CodeInfo& ci) {
  VarPtr v = pop();
  if (v->is_tensor()) return tensor_jump(v, in, ci, true);
  return truth(v) ? in.jump_target : -1;
}

int Interpreter::op_pop_jump_if_none(const Instr& in, const CodeInfo& ci) {
  VarPtr v = pop();
  return (v->is_const() && v->known() == Py_None) ? in.jump_target : -1;
}

int Interpreter::op_pop_jump_if_not_none(const Instr& in, const CodeInfo& ci) {
  VarPtr v = pop();
  return (v->is_const() && v->known() == Py_None) ? -1 : in.jump_target;
}

int Interpreter::op_get_iter(const Instr& in, const CodeInfo& ci) {
  // Loops over values known at capture time unroll: the iterator is a list of trackers.
  VarPtr seq = pop();
  // iter() of an iterator is the iterator itself: a loop that breaks leaves it where it stopped,
  // for the next loop over it (`for v in it: break`, then `for w in it`).
  push(seq->kind() == Var::Kind::Iterator ? seq : iterate(seq));
  return -1;
}

VarPtr Interpreter::iterate(const VarPtr& seq) {
  VarPtr it = Var::iterator(items_of(seq));
  if (is_plain_list(seq)) {
    it->as<IteratorV>().list = seq;
    it->as<IteratorV>().immutable = false;
  }
  return it;
}

void Interpreter::sync_list_iterator(IteratorV& it) {
  if (it.list) {
    const std::vector<VarPtr>& now = it.list->seq();
    if (now != *it.all) it.all = std::make_shared<const std::vector<VarPtr>>(now);
  } else if (std::vector<VarPtr> items; it.remake && it.remake(items)) {
    it.all = std::make_shared<const std::vector<VarPtr>>(std::move(items));
  }
}

int Interpreter::op_for_iter(const Instr& in, const CodeInfo& ci) {
  VarPtr& it = peek(1);
  if (it->kind() != Var::Kind::Iterator) unsupported("FOR_ITER over an unknown iterator");
  auto& left = it->as<IteratorV>();
  sync_list_iterator(left);
  if (left.empty()) {
    if (left.raises) raise(left.raises);  // the generator's exception, after the items before it
    pop();
    // 3.12 jumps to END_FOR and skips it; 3.11 jumps past the loop directly.
    return PY_VERSION_HEX >= 0x030C0000 ? in.jump_target + 2 : in.jump_target;
  }
  VarPtr next = left.front();
  left.pop_front();
  push(next);
  return -1;
}

int Interpreter::op_end_for(const Instr& in, const CodeInfo& ci) {
  pop(); pop();
  return -1;
}

int Interpreter::op_jump_forward(const Instr& in, const CodeInfo& ci) {
  return in.jump_target;
}

const std::array<Interpreter::Handler, OP_UNKNOWN + 1>& Interpreter::handlers() {
  static const std::array<Handler, OP_UNKNOWN + 1> table = [] {
    std::array<Handler, OP_UNKNOWN + 1> t{};
    const std::pair<std::vector<int>, Handler> entries[] = {
      {{OP_NOP, OP_RESUME, OP_CACHE, OP_EXTENDED_ARG, OP_PRECALL, OP_COPY_FREE_VARS}, &Interpreter::op_nop},
      {{OP_MAKE_CELL}, &Interpreter::op_make_cell},
      {{OP_LOAD_CLOSURE}, &Interpreter::op_load_closure},
      {{OP_LOAD_FAST, OP_LOAD_FAST_CHECK, OP_LOAD_FAST_AND_CLEAR}, &Interpreter::op_load_fast},
      {{OP_STORE_FAST}, &Interpreter::op_store_fast},
      {{OP_LOAD_DEREF}, &Interpreter::op_load_deref},
      {{OP_STORE_DEREF}, &Interpreter::op_store_deref},
      {{OP_DELETE_DEREF}, &Interpreter::op_delete_deref},
      {{OP_MAKE_FUNCTION}, &Interpreter::op_make_function},
      {{OP_RETURN_GENERATOR}, &Interpreter::op_return_generator},
      {{OP_YIELD_VALUE}, &Interpreter::op_yield_value},
      {{OP_GET_YIELD_FROM_ITER}, &Interpreter::op_get_yield_from_iter},
      {{OP_SEND}, &Interpreter::op_send},
      {{OP_END_SEND}, &Interpreter::op_end_send},
      {{OP_LOAD_BUILD_CLASS}, &Interpreter::op_load_build_class},
      {{OP_BEFORE_WITH}, &Interpreter::op_before_with},
      {{OP_FORMAT_VALUE}, &Interpreter::op_format_value},
      {{OP_BUILD_STRING}, &Interpreter::op_build_string},
      {{OP_JUMP_IF_TRUE_OR_POP, OP_JUMP_IF_FALSE_OR_POP}, &Interpreter::op_jump_if_true_or_pop},
      {{OP_UNPACK_EX}, &Interpreter::op_unpack_ex},
      {{OP_STORE_SUBSCR}, &Interpreter::op_store_subscr},
      {{OP_BUILD_SET}, &Interpreter::op_build_set},
      {{OP_SET_ADD, OP_SET_UPDATE}, &Interpreter::op_set_add},
      {{OP_MAP_ADD}, &Interpreter::op_map_add},
      {{OP_LOAD_ASSERTION_ERROR}, &Interpreter::op_load_assertion_error},
      {{OP_RAISE_VARARGS}, &Interpreter::op_raise_varargs},
      {{OP_STORE_ATTR}, &Interpreter::op_store_attr},
      {{OP_DELETE_ATTR}, &Interpreter::op_delete_attr},
      {{OP_IMPORT_NAME}, &Interpreter::op_import_name},
      {{OP_IMPORT_FROM}, &Interpreter::op_import_from},
      {{OP_STORE_SLICE}, &Interpreter::op_store_slice},
      {{OP_DELETE_SUBSCR}, &Interpreter::op_delete_subscr},
      {{OP_DELETE_FAST}, &Interpreter::op_delete_fast},
      {{OP_LOAD_CONST}, &Interpreter::op_load_const},
      {{OP_RETURN_CONST}, &Interpreter::op_return_const},
      {{OP_RETURN_VALUE}, &Interpreter::op_return_value},
      {{OP_PUSH_NULL}, &Interpreter::op_push_null},
      {{OP_LOAD_GLOBAL}, &Interpreter::op_load_global},
      {{OP_STORE_GLOBAL, OP_DELETE_GLOBAL}, &Interpreter::op_store_global},
      {{OP_LOAD_ATTR, OP_LOAD_METHOD}, &Interpreter::op_load_attr},
      {{OP_KW_NAMES}, &Interpreter::op_kw_names},
      {{OP_CALL}, &Interpreter::op_call},
      {{OP_LOAD_SUPER_ATTR}, &Interpreter::op_load_super_attr},
      {{OP_BUILD_MAP}, &Interpreter::op_build_map},
      {{OP_BUILD_CONST_KEY_MAP}, &Interpreter::op_build_const_key_map},
      {{OP_DICT_MERGE, OP_DICT_UPDATE}, &Interpreter::op_dict_merge},
      {{OP_CALL_FUNCTION_EX}, &Interpreter::op_call_function_ex},
      {{OP_BINARY_OP}, &Interpreter::op_binary_op},
      {{OP_COMPARE_OP}, &Interpreter::op_compare_op},
      {{OP_IS_OP}, &Interpreter::op_is_op},
      {{OP_PUSH_EXC_INFO}, &Interpreter::op_push_exc_info},
      {{OP_CHECK_EXC_MATCH}, &Interpreter::op_check_exc_match},
      {{OP_POP_EXCEPT}, &Interpreter::op_pop_except},
      {{OP_RERAISE}, &Interpreter::op_reraise},
      {{OP_WITH_EXCEPT_START}, &Interpreter::op_with_except_start},
      {{OP_CONTAINS_OP}, &Interpreter::op_contains_op},
      {{OP_UNARY_NEGATIVE}, &Interpreter::op_unary_negative},
      {{OP_UNARY_POSITIVE}, &Interpreter::op_unary_positive},
      {{OP_UNARY_NOT}, &Interpreter::op_unary_not},
      {{OP_UNARY_INVERT}, &Interpreter::op_unary_invert},
      {{OP_CALL_INTRINSIC_1}, &Interpreter::op_call_intrinsic_1},
      {{OP_BUILD_TUPLE, OP_BUILD_LIST}, &Interpreter::op_build_tuple},
      {{OP_LIST_EXTEND}, &Interpreter::op_list_extend},
      {{OP_LIST_APPEND}, &Interpreter::op_list_append},
      {{OP_LIST_TO_TUPLE}, &Interpreter::op_list_to_tuple},
      {{OP_UNPACK_SEQUENCE}, &Interpreter::op_unpack_sequence},
      {{OP_BINARY_SUBSCR}, &Interpreter::op_binary_subscr},
      {{OP_BUILD_SLICE}, &Interpreter::op_build_slice},
      {{OP_BINARY_SLICE}, &Interpreter::op_binary_slice},
      {{OP_POP_TOP}, &Interpreter::op_pop_top},
      {{OP_COPY}, &Interpreter::op_copy},
      {{OP_SWAP}, &Interpreter::op_swap},
      {{OP_POP_JUMP_IF_FALSE, OP_POP_JUMP_FORWARD_IF_FALSE, OP_POP_JUMP_BACKWARD_IF_FALSE}, &Interpreter::op_pop_jump_if_false},
      {{OP_POP_JUMP_IF_TRUE, OP_POP_JUMP_FORWARD_IF_TRUE, OP_POP_JUMP_BACKWARD_IF_TRUE}, &Interpreter::op_pop_jump_if_true},
      {{OP_POP_JUMP_IF_NONE, OP_POP_JUMP_FORWARD_IF_NONE, OP_POP_JUMP_BACKWARD_IF_NONE}, &Interpreter::op_pop_jump_if_none},
      {{OP_POP_JUMP_IF_NOT_NONE, OP_POP_JUMP_FORWARD_IF_NOT_NONE, OP_POP_JUMP_BACKWARD_IF_NOT_NONE}, &Interpreter::op_pop_jump_if_not_none},
      {{OP_GET_ITER}, &Interpreter::op_get_iter},
      {{OP_FOR_ITER}, &Interpreter::op_for_iter},
      {{OP_END_FOR}, &Interpreter::op_end_for},
      {{OP_JUMP_FORWARD, OP_JUMP_BACKWARD, OP_JUMP_BACKWARD_NO_INTERRUPT}, &Interpreter::op_jump_forward}
    };
    for (const auto& [ops, h] : entries)
      for (int op : ops) t[op] = h;
    return t;
  }();
  return table;
}

}  // namespace kiln::bind::detail
