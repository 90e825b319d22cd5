#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"
#include "bind/capture/resume.h"
#include "bind/capture/torch_call.h"
#include "bind/runtime/compiled_function.h"
#include "bind/torch/tensor_bridge.h"

namespace kiln::bind::detail {

void Interpreter::run(const BoundArgs& args) {
  grad_mode_ = grad_enabled();
  out_.guards.add_grad_mode(grad_mode_);
  autocast_ = autocast_state();
  out_.guards.add_autocast(autocast_);
  for (size_t i = 0; i < args.locals.size(); ++i) {
    if (!args.locals[i]) continue;
    locals_[i] = wrap(args.locals[i], Source::local_(static_cast<int>(i), args.names[i]));
    // *args and **kwargs are made for this call: the frame's own, whatever the caller passed
    auto* co = reinterpret_cast<PyCodeObject*>(code_);
    const size_t star = static_cast<size_t>(co->co_argcount + co->co_kwonlyargcount);
    bool packed = (i == star && (co->co_flags & CO_VARARGS)) ||
                  (i == star + !!(co->co_flags & CO_VARARGS) && (co->co_flags & CO_VARKEYWORDS));
    bool priv = packed || (args.private_slots && i < args.private_slots->size() && (*args.private_slots)[i]);
    Var::Kind k = locals_[i]->kind;
    if (priv && (k == Var::Kind::List || k == Var::Kind::Dict || k == Var::Kind::Tuple))
      locals_[i]->source = nullptr;  // its items keep their sources: graph inputs are read through them
  }
  VarPtr r = run_frame();
  if (!r) return;  // the capture ended in a graph break
  out_.replays = store_replays(attr_stores_.size(), false);
  out_.output = output_spec(r);
}

VarPtr Interpreter::run_frame() {
  const CodeInfo& ci = decode(code_);
  size_t pc = 0;
  while (pc < ci.instrs.size()) {
    const Instr& in = ci.instrs[pc];
    current_line_ = in.line;
    g_->source_loc = filename_ + ":" + std::to_string(in.line);
    int next;
    if (!parent_ && breakable(in)) {
      // What the frame held before this instruction, in case it must run in Python instead.
      Snapshot before = snapshot();
      try {
        next = step(in, ci);
      } catch (const Unsupported& e) {
        if (!graph_break(in, ci, pc, before, e.what())) throw;
        return nullptr;
      }
    } else {
      next = step(in, ci);
    }
    if (next == kReturn) return return_value_;
    if (next >= 0) {
      auto it = ci.by_offset.find(next);
      if (it == ci.by_offset.end()) unsupported("jump to an unknown offset");
      pc = it->second;
    } else {
      ++pc;
    }
    if (++root()->steps_ > 100000) unsupported("capture exceeded 100000 instructions");
    if (interrupt_pending()) throw Interrupted("interrupted");
  }
  unsupported("fell off the end of the bytecode");
}

Interpreter* Interpreter::root() { return parent_ ? parent_->root() : this; }

std::string Interpreter::location() const { return g_ && !g_->source_loc.empty() ? g_->source_loc : filename_; }

VarPtr Interpreter::wrap(PyObject* v, SourcePtr src) {
  if (is_tensor(v)) {
    for (size_t i = 0; i < out_.input_sources.size(); ++i)
      if (out_.input_sources[i]->str() == src->str()) return Var::tensor(g_->inputs()[i], src);
    TensorInfo info;
    std::string why;
    if (!tensor_info(v, info, why)) unsupported("input " + src->str() + ": " + why);
    if (info.meta) unsupported("input " + src->str() + ": tensor on device meta");
    out_.guards.add_tensor(src, info);
    const bool requires_grad = info.requires_grad;
    ir::TensorMeta m;
    m.dtype = info.dtype;
    m.device = info.device;
    for (int64_t s : info.sizes) m.sizes.push_back(s);
    for (int64_t s : info.strides) m.strides.push_back(s);
    // A readable placeholder name from the source: L['self'].fc1.weight -> self_fc1_weight.
    std::string name;
    for (char c : src->str().substr(src->kind == Source::Kind::Global ? 1 : 0)) {
      if (isalnum(static_cast<unsigned char>(c))) name += c;
      else if (!name.empty() && name.back() != '_') name += '_';
    }
    while (!name.empty() && name.back() == '_') name.pop_back();
    if (name.size() > 1 && (name[0] == 'L' || name[0] == 'G' || name[0] == 'C') && name[1] == '_') name = name.substr(2);
    if (name.empty() || isdigit(static_cast<unsigned char>(name[0]))) name = "arg" + name;
    ir::Node* n = g_->placeholder(name, m);
    if (requires_grad) root()->needs_grad_.insert(n);
    out_.input_sources.push_back(src);
    return Var::tensor(n, src);
  }
  if (is_python_scalar(v) || v == Py_None || PyUnicode_CheckExact(v) || PyAnySet_CheckExact(v)) {
    out_.guards.add_equals(src, v);
    return Var::constant(v, src);
  }
  DType dt;
  if (dtype_from_object(v, dt)) {
    out_.guards.add_identity(src, v);
    return Var::constant(v, src);
  }
  if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
    out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
    Py_ssize_t n = PySequence_Size(v);
    out_.guards.add_length(src, n);
    std::vector<VarPtr> items;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PySequence_GetItem(v, i);
      items.push_back(wrap(item, Source::item(src, i)));
      Py_DECREF(item);
    }
    VarPtr seq = Var::tuple(std::move(items), PyList_CheckExact(v));
    seq->source = src;  // the caller's object: changing it runs in Python
    return seq;
  }
  if (PyDict_CheckExact(v)) {
    // A dict from the caller (keyword arguments, a batch of inputs): its keys and values are
    // guarded, not its identity, so a new dict with the same contents hits the cache.
    out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
    out_.guards.add_length(src, PyDict_Size(v));
    VarPtr d = Var::dict();
    d->source = src;
    PyObject *k, *item;
    Py_ssize_t pos = 0;
    while (PyDict_Next(v, &pos, &k, &item)) {
      d->keys.push_back(Py_NewRef(k));
      d->items.push_back(wrap(item, Source::key_of(src, k)));
    }
    return d;
  }
  if (is_nn_module(v)) {
    out_.guards.add_identity(src, v);
    return Var::module(v, src);
  }
  if (PyMethod_Check(v)) {
    // Bound methods are made afresh at each attribute access: guard what they bind.
    out_.guards.add_identity(Source::attr(src, "__func__"), PyMethod_GET_FUNCTION(v));
    PyObject* self = PyMethod_GET_SELF(v);
    if (by_structure(self)) {
      out_.guards.add_type(Source::attr(src, "__self__"), reinterpret_cast<PyObject*>(Py_TYPE(self)));
    } else {
      out_.guards.add_identity(Source::attr(src, "__self__"), self);
    }
    return Var::constant(v, src);
  }
  if (PyCFunction_Check(v) && PyCFunction_GET_SELF(v) && !PyModule_Check(PyCFunction_GET_SELF(v)))
    return Var::constant(v, src);  // "abc".startswith: made afresh at each access; its receiver is guarded
  if (by_structure(v)) {
    // An instance of a user class (a config, a KV cache): its type, and then each attribute
    // capture reads, as its own guarded value; a new object of the same structure hits the cache.
    // Used as a value itself (compared, hashed, passed to Python), it is pinned by identity.
    out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
    VarPtr c = Var::constant(v, src);
    c->by_type = true;
    return c;
  }
  // Modules, functions, classes and other objects: their identity.
  out_.guards.add_identity(src, v);
  return Var::constant(v, src);
}

bool Interpreter::by_structure(PyObject* v) {
  static PyObject* enum_type = object_at("enum.Enum");  // members are their identity
  return (!enum_type || PyObject_IsInstance(v, enum_type) != 1) && PyType_HasFeature(Py_TYPE(v), Py_TPFLAGS_HEAPTYPE) && !PyType_Check(v) && !PyFunction_Check(v) &&
         !PyMethod_Check(v) && !PyModule_Check(v) && !is_tensor(v) && !is_nn_module(v) && !PyCode_Check(v);
}

bool Interpreter::structural(const VarPtr& v) { return v->is_const() && v->source && v->by_type; }

bool Interpreter::is_nn_module(PyObject* v) {
  static PyObject* module_type = object_at("torch.nn.Module");
  return module_type && PyObject_IsInstance(v, module_type) == 1;
}

VarPtr Interpreter::pop() {
  if (stack_.empty()) unsupported("stack underflow");
  VarPtr v = stack_.back();
  stack_.pop_back();
  if (v->kind == Var::Kind::List && v->self) refresh_dict_view(v);  // whoever reads it sees the dict now
  return v;
}

void Interpreter::push(VarPtr v) { stack_.push_back(std::move(v)); }

VarPtr& Interpreter::peek(size_t i) { return stack_[stack_.size() - i]; }

void Interpreter::autocast_inputs(const ops::OpDef* op, std::vector<ir::Node*>& inputs, ir::Attrs& attrs) {
  const ir::Node* first = nullptr;
  for (ir::Node* n : inputs)
    if (n && !n->meta.wrapped_number) {
      first = n;
      break;
    }
  if (!first) return;
  const DeviceType device = first->meta.device.type;
  const AutocastState& ac = root()->autocast_;
  if (!ac.on(device)) return;
  // torch casts the tensors autocast calls eligible: floating point, not float64, on its device
  auto eligible = [&](const ir::Node* n) {
    return n && !n->meta.wrapped_number && is_floating(n->meta.dtype) && n->meta.dtype != DType::Float64 &&
           n->meta.device.type == device;
  };
  const ops::AutocastPolicy policy = device == DeviceType::CUDA ? op->autocast_cuda : op->autocast_cpu;
  auto cast_all = [&](DType to) {
    for (ir::Node*& n : inputs)
      if (eligible(n) && n->meta.dtype != to) {
        ir::Attrs a;
        a.set("dtype", to);
        n = add_node("convert", {n}, a);
      }
  };
  switch (policy) {
    case ops::AutocastPolicy::None: return;
    case ops::AutocastPolicy::LowerPrecision: cast_all(ac.dtype(device)); return;
    case ops::AutocastPolicy::Float32: cast_all(DType::Float32); return;
    case ops::AutocastPolicy::Float32DtypeArg:
      if (!attrs.get_dtype("dtype") && std::any_of(inputs.begin(), inputs.end(), eligible)) attrs.set("dtype", DType::Float32);
      return;
    case ops::AutocastPolicy::Unknown:
      if (std::any_of(inputs.begin(), inputs.end(), eligible))
        unsupported("under torch.autocast, " + (op->kind == ops::OpKind::Extern && attrs.has("target") ? attrs.get_str("target") : op->name) +
                    " on floating tensors is not captured yet (kiln does not know autocast's cast for it)");
      return;
  }
}

ir::Node* Interpreter::add_node(const ops::OpDef* op, std::vector<ir::Node*> inputs, ir::Attrs attrs) {
  std::string err;
  Interpreter* r = root();
  if (r->autocast_.any()) autocast_inputs(op, inputs, attrs);
  bool grad = r->grad_mode_ && std::any_of(inputs.begin(), inputs.end(), [&](ir::Node* i) { return r->needs_grad_.count(i); });
  ir::Node* n = g_->add(op, std::move(inputs), std::move(attrs), err);
  if (!n) unsupported("shape/dtype check of " + op->name + " failed: " + err);
  if (grad) r->needs_grad_.insert(n);
  return n;
}

ir::Node* Interpreter::add_node(const std::string& op, std::vector<ir::Node*> inputs, ir::Attrs attrs) {
  return add_node(ops::find_op(op), std::move(inputs), std::move(attrs));
}

ir::Node* Interpreter::as_node(const VarPtr& v, const char* what) {
  if (v->is_tensor()) return v->node;
  if (v->is_const() && !is_python_scalar(v->obj) && (PyLong_Check(v->obj) || PyFloat_Check(v->obj))) {
    // an IntEnum or a float subclass: the number it is
    PyObject* plain = PyLong_Check(v->obj) ? PyNumber_Index(v->obj) : PyFloat_FromDouble(PyFloat_AsDouble(v->obj));
    return as_node(real(plain), what);
  }
  if (v->is_const() && is_python_scalar(v->obj)) {
    if (PyBool_Check(v->obj)) return g_->scalar(v->obj == Py_True, DType::Bool);
    if (PyLong_Check(v->obj)) {
      int overflow = 0;
      long long x = PyLong_AsLongLongAndOverflow(v->obj, &overflow);
      if (overflow) unsupported("integer too large for a tensor operand");
      return g_->scalar(static_cast<double>(x), DType::Int64);
    }
    return g_->scalar(PyFloat_AsDouble(v->obj), DType::Float64);
  }
  unsupported(std::string("expected a tensor for ") + what);
}

PyObject* Interpreter::const_obj(const VarPtr& v, const char* what) {
  if (structural(v)) {
    // the object itself goes into a Python operation: from here on its identity is what holds
    out_.guards.add_identity(v->source, v->obj);
    v->by_type = false;
  }
  if (v->is_const() || v->kind == Var::Kind::Module) return v->obj;  // modules are guarded by identity
  if (v->kind == Var::Kind::Tuple || v->kind == Var::Kind::List) {
    // Materialize containers of constants (e.g. a shape tuple).
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(v->items.size()));
    for (size_t i = 0; i < v->items.size(); ++i) {
      PyObject* o = const_obj(v->items[i], what);
      Py_INCREF(o);
      PyTuple_SET_ITEM(t, i, o);
    }
    keep_.push_back(t);
    if (v->kind == Var::Kind::List) {
      PyObject* l = PySequence_List(t);
      keep_.push_back(l);
      return l;
    }
    return t;
  }
  if (v->kind == Var::Kind::Dict) {
    PyObject* d = PyDict_New();
    keep_.push_back(d);
    for (size_t i = 0; i < v->keys.size(); ++i)
      if (PyDict_SetItem(d, v->keys[i], const_obj(v->items[i], what)) < 0) real(nullptr);
    return d;
  }
  unsupported(std::string("expected a Python value for ") + what + ", got a tensor");
}

OutSpec Interpreter::output_spec(const VarPtr& v) {
  OutSpec s;
  switch (v->kind) {
    case Var::Kind::Tensor: {
      if (root()->needs_grad_.count(v->node) && v->node->op_name() != "placeholder")
        unsupported("a result requires grad (its inputs do, and grad mode is on): kiln does not build backward graphs yet (AOTAutograd is a later stage); run under torch.no_grad() or torch.inference_mode()");
      auto& outs = g_->outputs();
      auto it = std::find(outs.begin(), outs.end(), v->node);
      s.kind = OutSpec::Kind::Graph;
      s.index = static_cast<int>(it - outs.begin());
      if (it == outs.end()) outs.push_back(v->node);
      return s;
    }
    case Var::Kind::Tuple:
    case Var::Kind::List:
      if (v->source) return OutSpec::from_source(v->source);  // the caller's own list or tuple, unchanged
      if (v->self) unsupported("returns a dict view (dict.keys(), values(), items())");
      s.kind = v->kind == Var::Kind::Tuple ? OutSpec::Kind::Tuple : OutSpec::Kind::List;
      s.value = Py_XNewRef(v->obj);  // a structseq's type
      for (auto& item : v->items) s.items.push_back(output_spec(item));
      return s;
    case Var::Kind::Const:
      if (structural(v)) return OutSpec::from_source(v->source);  // this call's object, not capture's
      s.kind = OutSpec::Kind::Const;
      Py_INCREF(v->obj);
      s.value = v->obj;
      return s;
    case Var::Kind::Dict:
      if (v->source) return OutSpec::from_source(v->source);
      return dict_spec(v, false);
    case Var::Kind::Record: return record_spec(v, false);
    case Var::Kind::Function:
      if (!v->rebuildable) unsupported("returns a function closing over tensors");
      s.kind = OutSpec::Kind::Const;
      s.value = Py_NewRef(v->obj);
      return s;
    default: unsupported("returns a value kiln cannot rebuild");
  }
}

int Interpreter::step(const Instr& in, const CodeInfo& ci) {
  switch (in.op) {
    case OP_NOP:
    case OP_RESUME:
    case OP_CACHE:
    case OP_EXTENDED_ARG:
    case OP_PRECALL:
    case OP_COPY_FREE_VARS: return -1;  // free variables are read lazily, or set by the caller
    case OP_MAKE_CELL: locals_.at(in.arg) = Var::cell(locals_.at(in.arg)); return -1;
    case OP_LOAD_CLOSURE: {
      VarPtr& slot = locals_.at(in.arg);
      if (!slot) slot = Var::cell(read_free_var(in));  // a free variable passed on to an inner function
      if (slot->kind != Var::Kind::Cell) slot = Var::cell(slot);
      push(slot);
      return -1;
    }
    case OP_LOAD_FAST:
    case OP_LOAD_FAST_CHECK:
    case OP_LOAD_FAST_AND_CLEAR: {
      VarPtr v = locals_.at(in.arg);
      if (!v) {
        if (in.op == OP_LOAD_FAST_AND_CLEAR) v = Var::null();
        else unsupported("read of an unbound local");
      }
      if (in.op == OP_LOAD_FAST_AND_CLEAR) locals_[in.arg] = nullptr;
      push(v);
      return -1;
    }
    case OP_STORE_FAST: locals_.at(in.arg) = pop(); return -1;
    case OP_LOAD_DEREF: {
      // Cells made in the frame hold their content; free variables of a real closure are
      // read (and guarded) on first use.
      VarPtr& slot = locals_.at(in.arg);
      if (!slot) slot = read_free_var(in);
      VarPtr v = slot->kind == Var::Kind::Cell ? slot->items[0] : slot;
      if (!v) unsupported("read of an empty closure cell");
      push(v);
      return -1;
    }
    case OP_STORE_DEREF: {
      VarPtr& slot = locals_.at(in.arg);
      if (slot && slot->kind == Var::Kind::Cell) {
        if (!is_own_cell(in.arg) && !parent_) unsupported("assignment to a closure variable (nonlocal)");
        slot->items[0] = pop();
        return -1;
      }
      if (!is_own_cell(in.arg)) unsupported("assignment to a closure variable (nonlocal)");
      slot = pop();
      return -1;
    }
    case OP_DELETE_DEREF: unsupported("del of a closure variable");
    case OP_MAKE_FUNCTION: {
      VarPtr code = pop();
      VarPtr closure = (in.arg & 0x08) ? pop() : nullptr;
      if (in.arg & 0x04) pop();  // annotations
      VarPtr kwdefaults = (in.arg & 0x02) ? pop() : nullptr;
      VarPtr defaults = (in.arg & 0x01) ? pop() : nullptr;
      push(make_function(code, defaults, kwdefaults, closure));
      return -1;
    }
    case OP_RETURN_GENERATOR: push(Var::constant(Py_None)); return -1;
    case OP_YIELD_VALUE:
      yields_.push_back(pop());
      push(Var::constant(Py_None));  // what send() would pass in
      return -1;
    case OP_BEFORE_WITH: {
      VarPtr ctx = pop();
      ModeChange m;
      if (ctx->kind == Var::Kind::Context) m = *ctx->mode;
      else if (ctx->is_const()) m = modes_of_object(const_obj(ctx, "context manager"));
      else unsupported("with of a context manager other than torch.no_grad/enable_grad/inference_mode/autocast/nullcontext");
      push(Var::context(enter_modes(m), Var::Kind::ContextExit));  // its __exit__ restores the modes before
      push(Var::constant(Py_None));
      return -1;
    }
    case OP_FORMAT_VALUE: {
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
    case OP_BUILD_STRING: {
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
    case OP_JUMP_IF_TRUE_OR_POP:
    case OP_JUMP_IF_FALSE_OR_POP: {
      bool t = truth(peek(1));
      if (t == (in.op == OP_JUMP_IF_TRUE_OR_POP)) return in.jump_target;
      pop();
      return -1;
    }
    case OP_UNPACK_EX: {
      int before = in.arg & 0xff, after = in.arg >> 8;
      VarPtr seq = pop();
      std::vector<VarPtr> items = seq->kind == Var::Kind::Tuple || seq->kind == Var::Kind::List ? seq->items : items_of(seq);
      if (static_cast<int>(items.size()) < before + after) unsupported("not enough values to unpack");
      std::vector<VarPtr> out(items.begin(), items.begin() + before);
      out.push_back(Var::tuple(std::vector<VarPtr>(items.begin() + before, items.end() - after), true));
      out.insert(out.end(), items.end() - after, items.end());
      for (auto it = out.rbegin(); it != out.rend(); ++it) push(*it);
      return -1;
    }
    case OP_STORE_SUBSCR: {
      VarPtr key = pop(), container = pop(), value = pop();
      store_subscript(container, key, value);
      return -1;
    }
    case OP_BUILD_SET: {
      std::vector<VarPtr> items(in.arg);
      for (int i = in.arg - 1; i >= 0; --i) items[i] = pop();
      PyObject* set = PySet_New(nullptr);
      for (auto& v : items)
        if (PySet_Add(set, const_obj(v, "set item")) < 0) {
          Py_DECREF(set);
          real(nullptr);
        }
      push(Var::steal_constant(set));
      return -1;
    }
    case OP_SET_ADD:
    case OP_SET_UPDATE: {
      VarPtr v = pop();
      VarPtr& set = peek(in.arg);
      if (!set->is_const() || !PySet_Check(set->obj) || set->source) unsupported("update of a set the caller can see");
      int rc;
      if (in.op == OP_SET_ADD) {
        rc = PySet_Add(set->obj, const_obj(v, "set item"));
      } else {
        rc = 0;
        for (const VarPtr& x : items_of(v))
          if (PySet_Add(set->obj, const_obj(x, "set item")) < 0) rc = -1;
      }
      if (rc < 0) real(nullptr);
      return -1;
    }
    case OP_MAP_ADD: {
      VarPtr value = pop(), key = pop();
      VarPtr& d = peek(in.arg);
      if (d->kind != Var::Kind::Dict) unsupported("dict comprehension into a non-dict");
      dict_set(d, const_obj(key, "dict key"), value);
      return -1;
    }
    case OP_LOAD_ASSERTION_ERROR: unsupported("an assert fails (or depends on tensor data): eager raises");
    case OP_RAISE_VARARGS: unsupported("raise: eager raises the exception");
    case OP_STORE_ATTR: {
      VarPtr obj = pop(), value = pop();
      store_attr(obj, PyUnicode_AsUTF8(in.argval), value);
      return -1;
    }
    case OP_DELETE_ATTR: store_attr(pop(), PyUnicode_AsUTF8(in.argval), nullptr); return -1;
    case OP_IMPORT_NAME: {
      // `import torch` inside a function: a module already imported is only looked up
      VarPtr fromlist = pop(), level = pop();
      PyObject* name = in.argval;
      PyObject* modules = PyImport_GetModuleDict();
      if (!PyDict_GetItemWithError(modules, name)) unsupported("import of a module not yet imported");
      push(real(PyImport_ImportModuleLevelObject(name, globals_, nullptr, const_obj(fromlist, "fromlist"),
                                                 PyLong_AsLong(const_obj(level, "level")))));
      return -1;
    }
    case OP_IMPORT_FROM: {
      PyObject* a = PyObject_GetAttr(const_obj(peek(1), "module"), in.argval);
      if (!a) unsupported("import of a name the module does not have");
      push(Var::steal_constant(a));
      return -1;
    }
    case OP_STORE_SLICE: {
      VarPtr stop = pop(), start = pop(), container = pop(), value = pop();
      PyObject* sl = PySlice_New(const_obj(start, "slice"), const_obj(stop, "slice"), nullptr);
      store_subscript(container, real(sl), value);
      return -1;
    }
    case OP_DELETE_SUBSCR: {
      VarPtr key = pop(), container = pop();
      if (container->kind == Var::Kind::Dict && !container->source) {
        Py_ssize_t i = dict_find(container, const_obj(key, "dict key"));
        if (i < 0) unsupported("KeyError in del");
        Py_DECREF(container->keys[i]);
        container->keys.erase(container->keys.begin() + i);
        container->items.erase(container->items.begin() + i);
        return -1;
      }
      if (container->kind == Var::Kind::List && !container->source && key->is_const() && PyLong_Check(key->obj)) {
        Py_ssize_t n = static_cast<Py_ssize_t>(container->items.size()), i = PyLong_AsSsize_t(key->obj);
        if (i < 0) i += n;
        if (i < 0 || i >= n) unsupported("list index out of range in del");
        container->items.erase(container->items.begin() + i);
        return -1;
      }
      unsupported("del of an item of an object the caller can see");
    }
    case OP_DELETE_FAST: locals_.at(in.arg) = nullptr; return -1;
    case OP_LOAD_CONST: push(Var::constant(in.argval)); return -1;
    case OP_RETURN_CONST: return_value_ = Var::constant(in.argval); return kReturn;
    case OP_RETURN_VALUE: return_value_ = pop(); return kReturn;
    case OP_PUSH_NULL: push(Var::null()); return -1;
    case OP_LOAD_GLOBAL: {
      if (in.arg & 1) push(Var::null());
      std::string name = PyUnicode_AsUTF8(in.argval);
      PyObject* v = PyDict_GetItemString(globals_, name.c_str());
      if (!v) v = PyDict_GetItemString(builtins_, name.c_str());
      if (!v) unsupported("NameError: name '" + name + "' is not defined");
      push(wrap(v, Source::global(name, parent_ ? globals_ : nullptr)));
      return -1;
    }
    case OP_LOAD_ATTR:
    case OP_LOAD_METHOD: {
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
    case OP_KW_NAMES: {
      // The names tuple is co_consts[arg] (dis leaves argval unresolved on 3.11).
      kwnames_.clear();
      PyObject* t = PyTuple_GetItem(reinterpret_cast<PyCodeObject*>(code_)->co_consts, in.arg);
      if (!t || !PyTuple_Check(t)) unsupported("malformed KW_NAMES");
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); ++i) kwnames_.push_back(PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, i)));
      return -1;
    }
    case OP_CALL: {
      int argc = in.arg;
      std::vector<VarPtr> args(argc);
      for (int i = argc - 1; i >= 0; --i) args[i] = pop();
      VarPtr second = pop(), first = pop();
      VarPtr fn;
      if (first->kind == Var::Kind::Null) fn = second;
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
    case OP_LOAD_SUPER_ATTR: {
      VarPtr self = pop(), cls = pop();
      pop();  // the global `super`
      VarPtr attr = super_attr(make_super({cls, self}), PyUnicode_AsUTF8(in.argval));
      if (in.arg & 1) push(Var::null());
      push(attr);
      return -1;
    }
    case OP_BUILD_MAP: {
      std::vector<VarPtr> kv(2 * in.arg);
      for (int i = 2 * in.arg - 1; i >= 0; --i) kv[i] = pop();
      VarPtr d = Var::dict();
      for (int i = 0; i < in.arg; ++i) dict_set(d, const_obj(kv[2 * i], "dict key"), kv[2 * i + 1]);
      push(d);
      return -1;
    }
    case OP_BUILD_CONST_KEY_MAP: {
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
    case OP_DICT_MERGE:
    case OP_DICT_UPDATE: {
      VarPtr update = pop();
      VarPtr& target = peek(in.arg);
      if (target->kind != Var::Kind::Dict || !is_dict(update)) unsupported("dict merge of a non-dict");
      for (auto& [k, v] : dict_entries(update)) {
        if (in.op == OP_DICT_MERGE && dict_find(target, k) >= 0) unsupported("got multiple values for a keyword argument");
        dict_set(target, k, v);
      }
      return -1;
    }
    case OP_CALL_FUNCTION_EX: {
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
      if (seq->kind == Var::Kind::Tuple || seq->kind == Var::Kind::List) {
        args = seq->items;
      } else {
        PyObject* fast = PySequence_Fast(const_obj(seq, "*args"), "not a sequence");
        if (!fast) real(nullptr);
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
          args.push_back(Var::constant(PySequence_Fast_GET_ITEM(fast, i)));
        Py_DECREF(fast);
      }
      VarPtr fn = pop();
      if (!stack_.empty() && stack_.back()->kind == Var::Kind::Null) pop();
      push(call(fn, std::move(args), std::move(kwargs)));
      return -1;
    }
    case OP_BINARY_OP: {
      VarPtr b = pop(), a = pop();
      if (in.arg < 0 || static_cast<size_t>(in.arg) >= ci.nb_ops.size()) unsupported("unknown BINARY_OP");
      push(binary(ci.nb_ops[in.arg], a, b));
      return -1;
    }
    case OP_COMPARE_OP: {
      VarPtr b = pop(), a = pop();
      push(compare(PyUnicode_AsUTF8(in.argval), a, b));
      return -1;
    }
    case OP_IS_OP: {
      VarPtr b = pop(), a = pop();
      bool same;
      if (a->is_const() && b->is_const()) {
        // An object guarded by its structure is not None, nor any object of another type; is it
        // this other object of its own type? Only identity can say: both are pinned.
        if ((structural(a) || structural(b)) && Py_TYPE(a->obj) == Py_TYPE(b->obj)) const_obj(a, "operand"), const_obj(b, "operand");
        same = a->obj == b->obj;
      } else if (a->is_tensor() && b->is_tensor()) same = a->node == b->node;
      else same = false;  // a tensor is never None, a module never a number
      push(Var::constant((same != (in.arg == 1)) ? Py_True : Py_False));
      return -1;
    }
    case OP_CONTAINS_OP: {
      VarPtr b = pop(), a = pop();
      if (b->kind == Var::Kind::Module) {
        std::vector<std::string> keys = module_keys(b);
        std::string k = PyUnicode_Check(const_obj(a, "key")) ? PyUnicode_AsUTF8(a->obj) : "";
        bool found = std::find(keys.begin(), keys.end(), k) != keys.end();
        push(Var::constant((found != (in.arg == 1)) ? Py_True : Py_False));
        return -1;
      }
      if (b->kind == Var::Kind::Dict || b->kind == Var::Kind::Tuple || b->kind == Var::Kind::List) {
        bool found = false;
        if (b->kind == Var::Kind::Dict) {
          found = dict_find(b, const_obj(a, "key")) >= 0;
        } else {
          for (const VarPtr& x : b->items) {
            if (x->is_tensor() || a->is_tensor()) {
              if (x->is_tensor() && a->is_tensor() && x->node == a->node) found = true;
              else if (x->is_tensor() != a->is_tensor()) continue;
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
      int r = PySequence_Contains(const_obj(b, "container"), const_obj(a, "item"));
      if (r < 0) real(nullptr);
      push(Var::constant(((r == 1) != (in.arg == 1)) ? Py_True : Py_False));
      return -1;
    }
    case OP_UNARY_NEGATIVE: {
      VarPtr a = pop();
      if (a->is_tensor()) push(Var::tensor(add_node("neg", {a->node})));
      else push(real(PyNumber_Negative(const_obj(a, "operand"))));
      return -1;
    }
    case OP_UNARY_POSITIVE: push(positive(pop())); return -1;
    case OP_UNARY_NOT: push(Var::constant(truth(pop()) ? Py_False : Py_True)); return -1;
    case OP_UNARY_INVERT: {
      VarPtr a = pop();
      if (a->is_tensor()) {
        if (a->node->meta.dtype != DType::Bool) unsupported("bitwise not of an integer tensor");
        push(Var::tensor(add_node("logical_not", {a->node})));
      } else {
        push(real(PyNumber_Invert(const_obj(a, "operand"))));
      }
      return -1;
    }
    case OP_CALL_INTRINSIC_1: {
      const std::string& n = in.argrepr;
      if (n == "INTRINSIC_UNARY_POSITIVE") {
        push(positive(pop()));
        return -1;
      }
      if (n == "INTRINSIC_LIST_TO_TUPLE") {
        VarPtr a = pop();
        push(Var::tuple(a->items));
        return -1;
      }
      unsupported("intrinsic " + n);
    }
    case OP_BUILD_TUPLE:
    case OP_BUILD_LIST: {
      std::vector<VarPtr> items(in.arg);
      for (int i = in.arg - 1; i >= 0; --i) items[i] = pop();
      push(Var::tuple(std::move(items), in.op == OP_BUILD_LIST));
      return -1;
    }
    case OP_LIST_EXTEND: {
      VarPtr seq = pop();
      VarPtr& list = peek(in.arg);
      if (seq->kind == Var::Kind::Tuple || seq->kind == Var::Kind::List) {
        for (auto& x : seq->items) list->items.push_back(x);
      } else {
        PyObject* o = const_obj(seq, "sequence");
        PyObject* fast = PySequence_Fast(o, "not a sequence");
        if (!fast) real(nullptr);
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
          list->items.push_back(Var::constant(PySequence_Fast_GET_ITEM(fast, i)));
        Py_DECREF(fast);
      }
      return -1;
    }
    case OP_LIST_APPEND: {
      VarPtr v = pop();
      peek(in.arg)->items.push_back(v);
      return -1;
    }
    case OP_LIST_TO_TUPLE: {
      VarPtr a = pop();
      push(Var::tuple(a->items));
      return -1;
    }
    case OP_UNPACK_SEQUENCE: {
      VarPtr seq = pop();
      std::vector<VarPtr> items;
      if (seq->kind == Var::Kind::Tuple || seq->kind == Var::Kind::List) {
        items = seq->items;
      } else if (seq->is_const()) {
        PyObject* fast = PySequence_Fast(seq->obj, "cannot unpack");
        if (!fast) real(nullptr);
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
          items.push_back(Var::constant(PySequence_Fast_GET_ITEM(fast, i)));
        Py_DECREF(fast);
      } else if (seq->kind == Var::Kind::Iterator || seq->kind == Var::Kind::Dict) {
        items = items_of(seq);
      } else {
        unsupported("unpacking a tensor is not captured yet");
      }
      if (static_cast<int>(items.size()) != in.arg) unsupported("unpack length mismatch");
      for (auto it = items.rbegin(); it != items.rend(); ++it) push(*it);
      return -1;
    }
    case OP_BINARY_SUBSCR: {
      VarPtr idx = pop(), base = pop();
      push(subscript(base, idx));
      return -1;
    }
    case OP_BUILD_SLICE: {
      std::vector<VarPtr> parts(in.arg);
      for (int i = in.arg - 1; i >= 0; --i) parts[i] = pop();
      PyObject* s = PySlice_New(const_obj(parts[0], "slice"), const_obj(parts[1], "slice"),
                                in.arg == 3 ? const_obj(parts[2], "slice") : nullptr);
      push(real(s));
      return -1;
    }
    case OP_BINARY_SLICE: {
      VarPtr stop = pop(), start = pop(), base = pop();
      PyObject* s = PySlice_New(const_obj(start, "slice"), const_obj(stop, "slice"), nullptr);
      push(subscript(base, real(s)));
      return -1;
    }
    case OP_POP_TOP: pop(); return -1;
    case OP_COPY: push(peek(in.arg)); return -1;
    case OP_SWAP: std::swap(peek(1), peek(in.arg)); return -1;
    case OP_POP_JUMP_IF_FALSE:
    case OP_POP_JUMP_FORWARD_IF_FALSE:
    case OP_POP_JUMP_BACKWARD_IF_FALSE: return truth(pop()) ? -1 : in.jump_target;
    case OP_POP_JUMP_IF_TRUE:
    case OP_POP_JUMP_FORWARD_IF_TRUE:
    case OP_POP_JUMP_BACKWARD_IF_TRUE: return truth(pop()) ? in.jump_target : -1;
    case OP_POP_JUMP_IF_NONE:
    case OP_POP_JUMP_FORWARD_IF_NONE:
    case OP_POP_JUMP_BACKWARD_IF_NONE: {
      VarPtr v = pop();
      return (v->is_const() && v->obj == Py_None) ? in.jump_target : -1;
    }
    case OP_POP_JUMP_IF_NOT_NONE:
    case OP_POP_JUMP_FORWARD_IF_NOT_NONE:
    case OP_POP_JUMP_BACKWARD_IF_NOT_NONE: {
      VarPtr v = pop();
      return (v->is_const() && v->obj == Py_None) ? -1 : in.jump_target;
    }
    case OP_GET_ITER: {
      // Loops over values known at capture time unroll: the iterator is a list of trackers.
      VarPtr seq = pop();
      VarPtr it = Var::tuple(items_of(seq));
      it->kind = Var::Kind::Iterator;
      push(it);
      return -1;
    }
    case OP_FOR_ITER: {
      VarPtr& it = peek(1);
      if (it->kind != Var::Kind::Iterator) unsupported("FOR_ITER over an unknown iterator");
      if (it->items.empty()) {
        pop();
        // 3.12 jumps to END_FOR and skips it; 3.11 jumps past the loop directly.
        return PY_VERSION_HEX >= 0x030C0000 ? in.jump_target + 2 : in.jump_target;
      }
      VarPtr next = it->items.front();
      it->items.erase(it->items.begin());
      push(next);
      return -1;
    }
    case OP_END_FOR: pop(); pop(); return -1;
    case OP_JUMP_FORWARD:
    case OP_JUMP_BACKWARD:
    case OP_JUMP_BACKWARD_NO_INTERRUPT: return in.jump_target;
    default: break;
  }
  size_t idx = &in - ci.instrs.data();
  unsupported("bytecode " + ci.opnames[idx] + " is not supported yet");
}

}  // namespace kiln::bind::detail

namespace kiln::bind {

using detail::Interpreter;
using detail::Interrupted;
using detail::Unsupported;

CaptureResult capture(PyObject* fn, const BoundArgs& args) {
  CaptureResult r;
  Interpreter it(fn, r);
  try {
    auto* co = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn));
    if (co->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE))
      throw Unsupported("generators and coroutines run eagerly");
    it.run(args);
    r.ok = true;
    r.captured_text = r.graph->str();
  } catch (const Unsupported& e) {
    r.ok = false;
    r.reason = e.what();
    r.location = it.location();
  } catch (const Interrupted& e) {  // the caller raises the kept KeyboardInterrupt
    r.ok = false;
    r.reason = e.what();
    r.location = it.location();
  } catch (const std::exception& e) {
    r.ok = false;
    r.reason = std::string("internal error during capture: ") + e.what();
    r.location = it.location();
  }
  if (PyErr_Occurred()) clear_error();
  return r;
}

}  // namespace kiln::bind
