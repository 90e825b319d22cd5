#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"
#include "bind/capture/resume.h"
#include "bind/capture/torch_call.h"
#include "bind/runtime/compiled_function.h"
#include "bind/torch/tensor_bridge.h"
#include "core/support/log.h"
#include "core/sym/shape_env.h"

namespace kiln::bind::detail {

void Interpreter::run(const BoundArgs& args) {
  dynamic_ = args.dynamic;
  grad_mode_ = grad_enabled();
  out_.guards.add_grad_mode(grad_mode_);
  autocast_ = autocast_state();
  out_.guards.add_autocast(autocast_);
  // Python floats mixed with integer tensors, factories and modules built here take their dtype
  // from it, as torch.compile's global-state guard covers.
  out_.guards.add_default_dtype(default_dtype());
  for (size_t i = 0; i < args.locals.size(); ++i) {
    if (!args.locals[i]) continue;
    locals_[i] = wrap(args.locals[i], Source::local_(static_cast<int>(i), args.names[i]));
    // *args and **kwargs are made for this call: the frame's own, whatever the caller passed
    auto* co = reinterpret_cast<PyCodeObject*>(code_);
    const size_t star = static_cast<size_t>(co->co_argcount + co->co_kwonlyargcount);
    bool packed = (i == star && (co->co_flags & CO_VARARGS)) ||
                  (i == star + !!(co->co_flags & CO_VARARGS) && (co->co_flags & CO_VARKEYWORDS));
    bool priv = packed || (args.private_slots && i < args.private_slots->size() && (*args.private_slots)[i]);
    Var::Kind k = locals_[i]->kind();
    if (priv && (k == Var::Kind::List || k == Var::Kind::Dict || k == Var::Kind::Tuple))
      locals_[i]->source = nullptr;  // its items keep their sources: graph inputs are read through them
  }
  VarPtr r = run_frame();
  if (!r) return;  // the capture ended in a graph break
  write_back(input_mutations());
  output_checks();
  out_.replays = store_replays(attr_stores_.size(), false);
  out_.output = output_spec(r);
  locate_symbols();
}

VarPtr Interpreter::run_frame() {
  const CodeInfo& ci = decode(code_);
  size_t pc = resume_pc_;
  if (PyObject* exc = thrown_) {  // GeneratorContext::throw_in: raised at the yield it stopped at
    thrown_ = nullptr;
    ExceptionHandler h = exception_handler(code_, ci.instrs[pc - 1].offset);
    if (h.target < 0 || static_cast<size_t>(h.depth) > stack_.size()) raise(exc);
    stack_.resize(static_cast<size_t>(h.depth));
    if (h.lasti) push(Var::steal_constant(PyLong_FromLong(ci.instrs[pc - 1].offset)));
    push(Var::constant(exc));
    auto it = ci.by_offset.find(h.target);
    if (it == ci.by_offset.end()) unsupported("jump to an unknown offset");
    pc = it->second;
  }
  // The instructions on a loop. A break there is refused (graph_break), so no snapshot is
  // taken before them: snapshots copy the frame's trackers, and one per instruction of a long
  // unrolled loop made capture quadratic in the loop's length. (The breakable instructions all
  // fall through to the next one, which falls_into_loop needs.)
  const std::vector<char> on_loop = parent_ ? std::vector<char>() : falls_into_loop(ci);
  while (pc < ci.instrs.size()) {
    const Instr& in = ci.instrs[pc];
    current_line_ = in.line;
    g_->source_loc = filename_ + ":" + std::to_string(in.line);
    int next;
    // A Python exception the instruction raises goes to this frame's handler (try/except), as
    // the exception table says; without one it leaves the frame (to the caller's handler, or at
    // the function kiln compiles, to a graph break or eager, which raise it for real).
    auto handle = [&](const Raised& r) {
      ExceptionHandler h = exception_handler(code_, in.offset);
      if (h.target < 0 || static_cast<size_t>(h.depth) > stack_.size()) return false;
      stack_.resize(static_cast<size_t>(h.depth));
      if (h.lasti) push(Var::steal_constant(PyLong_FromLong(in.offset)));
      push(Var::constant(r.exc));
      next = h.target;
      return true;
    };
    if (!parent_ && breakable(in) && !on_loop[pc]) {
      // What the frame held before this instruction, in case it must run in Python instead.
      Snapshot before = snapshot();
      try {
        next = step(in, ci);
      } catch (const Raised& r) {
        if (!handle(r)) {
          if (!graph_break(in, ci, pc, before, r.what())) throw;
          return nullptr;
        }
      } catch (const Unsupported& e) {
        if (!graph_break(in, ci, pc, before, e.what())) throw;
        return nullptr;
      }
    } else {
      try {
        next = step(in, ci);
      } catch (const Raised& r) {
        if (!handle(r)) throw;
      }
    }
    if (next == kReturn) return return_value_;
    if (next == kYield) {  // a @contextmanager generator's frame: on from the next instruction later
      resume_pc_ = pc + 1;
      yielded_ = true;
      return return_value_;
    }
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

namespace {

// torch._dynamo's marks on a tensor: a set of dim indices in attribute `name`.
void marked_dims(PyObject* t, const char* name, std::set<int64_t>& out) {
  PyObject* s = PyObject_GetAttrString(t, name);
  if (!s) {
    clear_error();
    return;
  }
  PyObject* it = PyObject_GetIter(s);
  while (PyObject* x = it ? PyIter_Next(it) : nullptr) {
    if (PyLong_Check(x)) out.insert(PyLong_AsLongLong(x));
    Py_DECREF(x);
  }
  Py_XDECREF(it);
  Py_DECREF(s);
  if (PyErr_Occurred()) clear_error();
}

}  // namespace

void Interpreter::symbolic_sizes(PyObject* v, const Source& src, TensorInfo& info, ir::TensorMeta& m) {
  if (dynamic_ && dynamic_->none) return;
  const size_t n = info.sizes.size();
  std::set<int64_t> dyn;
  // dynamic=True: every tensor input's dims but a module's own tensors (parameters, buffers),
  // as torch.compile's; a cache object's tensors (past_key_values.layers[i].keys) are symbolic
  if (dynamic_ && dynamic_->all && !module_state_)
    for (size_t d = 0; d < n; ++d) dyn.insert(static_cast<int64_t>(d));
  // Automatic dynamic leaves parameters static, as torch.compile does (its
  // force_parameter_static_shapes): one code object serving modules of several widths (a stage's
  // blocks, a resume function) gets an entry per module, not channel counts as symbols.
  static PyObject* parameter_type = object_at("torch.nn.Parameter");
  const bool parameter = parameter_type && PyObject_IsInstance(v, parameter_type) == 1;
  if (dynamic_ && !parameter) {
    auto it = dynamic_->by_source.find(src.str());
    if (it != dynamic_->by_source.end()) dyn.insert(it->second.begin(), it->second.end());
  }
  marked_dims(v, "_dynamo_dynamic_indices", dyn);
  marked_dims(v, "_dynamo_weak_dynamic_indices", dyn);
  std::set<int64_t> fixed;
  marked_dims(v, "_dynamo_static_indices", fixed);
  bool any = false;
  for (int64_t d : dyn) any |= d >= 0 && d < static_cast<int64_t>(n) && !fixed.count(d) && info.sizes[d] >= 2;
  if (!any) return;
  // Dense layouts only: the dims that move (size >= 2, stride != 0), by stride, must each
  // step over exactly the ones inside them.
  std::vector<size_t> order;
  for (size_t d = 0; d < n; ++d)
    if (info.sizes[d] >= 2 && info.strides[d] != 0) order.push_back(d);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return info.strides[a] < info.strides[b]; });
  int64_t expect = 1;
  for (size_t d : order) {
    if (info.strides[d] != expect) return;
    expect *= info.sizes[d];
  }
  GuardSet& guards = out_.guards;
  info.size_symbols.assign(n, -1);
  for (size_t d = 0; d < n; ++d) {
    if (!dyn.count(static_cast<int64_t>(d)) || fixed.count(static_cast<int64_t>(d)) || info.sizes[d] < 2) continue;
    sym::Expr s;
    for (const auto& [value, symbol] : duck_)
      if (value == info.sizes[d]) s = symbol;
    if (!s.valid()) {
      s = guards.add_symbol(info.sizes[d]);
      duck_.emplace_back(info.sizes[d], s);
    }
    m.sizes[d] = s;
    for (size_t k = 0; k < guards.symbols().size(); ++k)
      if (guards.symbols()[k] == s) info.size_symbols[d] = static_cast<int>(k);
  }
  sym::Expr stride = 1;
  for (size_t d = 0; d < n; ++d) m.strides[d] = info.strides[d];  // size-1 and broadcast dims keep theirs
  for (size_t d : order) {
    m.strides[d] = stride;
    stride = stride * m.sizes[d];
  }
  info.stride_exprs = m.strides;
}

Interpreter* Interpreter::root() { return parent_ ? parent_->root() : this; }

void Interpreter::locate_symbols() {
  if (!symbolic_outputs_) return;
  const GuardSet& guards = out_.guards;
  const auto specialized = guards.specializations();
  for (const sym::Expr& s : guards.symbols()) {
    CaptureResult::SymbolSource where;
    if (auto it = specialized.find(s); it != specialized.end()) where.fixed = *it->second.as_const();
    for (size_t i = 0; where.fixed < 0 && where.input < 0 && i < g_->inputs().size(); ++i) {
      const auto& sizes = g_->inputs()[i]->meta.sizes;
      for (size_t d = 0; d < sizes.size(); ++d)
        if (sizes[d] == s) {
          where.input = static_cast<int>(i), where.dim = static_cast<int>(d);
          break;
        }
    }
    for (size_t k = 0; where.fixed < 0 && where.input < 0 && k < g_->scalar_symbols.size(); ++k)
      if (g_->scalar_symbols[k] == s) where.scalar = static_cast<int>(k);
    if (where.fixed < 0 && where.input < 0 && where.scalar < 0) where.fixed = guards.hint(s);  // unread: its hint (guarded)
    out_.symbol_sources.push_back(where);
  }
}

bool Interpreter::dynamic_scalar(const Source& src) const {
  // dynamic=True: the arguments; automatic dynamic: what changed between calls (dim -1)
  if (!dynamic_ || dynamic_->none) return false;
  if (dynamic_->all && src.kind == Source::Kind::Local) return true;
  auto it = dynamic_->by_source.find(src.str());
  return it != dynamic_->by_source.end() && it->second.count(-1);
}

VarPtr Interpreter::symbolic_int(PyObject* v, const SourcePtr& src) {
  // A Python int argument (not a bool) the policy makes dynamic: under dynamic=True, or under
  // automatic dynamic once it changed between calls. 0 and 1 stay static, as in torch.
  // An attribute (a cache's position counter) becomes one only once it changed.
  if (!PyLong_CheckExact(v) || !dynamic_scalar(*src)) return nullptr;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (overflow || x < 2) return nullptr;
  // A symbol of its own: an int equal to a size now (a position equal to the batch) is no reason
  // to expect it equal next call.
  GuardSet& guards = out_.guards;
  const sym::Expr s = guards.add_symbol(x);
  guards.add_int_symbol(src, s);
  out_.scalar_sources.push_back(src);
  g_->scalar_symbols.push_back(s);
  VarPtr r = Var::symint(s, x);
  r->source = src;
  return r;
}

VarPtr Interpreter::symbolic_float(PyObject* v, const SourcePtr& src) {
  // As torch.compile does (specialize_float=False): a float that changed between calls is read
  // at each call, a kernel argument, instead of recompiling for each value. nan stays a
  // constant: no equality guard ever held for it, so it never had a chance to change.
  if (!PyFloat_CheckExact(v) || !dynamic_scalar(*src)) return nullptr;
  out_.guards.add_type(src, reinterpret_cast<PyObject*>(&PyFloat_Type));
  out_.dynamic_floats = true;
  ir::Node* n = scalar_input(src, false);
  if (!symfloat_values_.count(n)) {
    keep_.push_back(Py_NewRef(v));
    symfloat_values_[n] = v;
  }
  VarPtr r = Var::symfloat(n, PyFloat_AS_DOUBLE(v));
  r->source = src;
  return r;
}

void Interpreter::specialize_floats(const ir::Node* n) {
  Interpreter* r = root();
  std::vector<const ir::Node*> todo{n};
  std::set<const ir::Node*> seen;
  while (!todo.empty()) {
    const ir::Node* m = todo.back();
    todo.pop_back();
    if (!m || !seen.insert(m).second) continue;
    if (auto it = r->symfloat_values_.find(m); it != r->symfloat_values_.end()) {
      const SourcePtr& src = r->out_.scalar_inputs[static_cast<size_t>(m->attrs.get_int("index"))].source;
      if (log_enabled("guards")) log("guards", "specialized the float " + src->str() + " (read as a Python value) at " + location());
      r->out_.guards.add_equals(src, it->second);
      continue;
    }
    for (const ir::Node* i : m->inputs) todo.push_back(i);
  }
}

std::string Interpreter::location() const { return g_ && !g_->source_loc.empty() ? g_->source_loc : filename_; }

VarPtr Interpreter::wrap(PyObject* v, SourcePtr src) {
  if (is_tensor(v)) {
    // Every read of one source is one tracker: an in-place update of the input reaches them all.
    Interpreter* r = root();
    for (size_t i = 0; i < out_.input_sources.size(); ++i)
      if (out_.input_sources[i]->str() == src->str()) return r->input_vars_[i];
    // The same tensor reached by another path (a cache layer through two bound methods): one
    // input, guarded to stay one object.
    for (size_t i = 0; i < r->input_objects_.size(); ++i)
      if (r->input_objects_[i] == v) {
        out_.guards.add_same(src, out_.input_sources[i]);
        return r->input_vars_[i];
      }
    TensorInfo info;
    std::string why;
    if (!tensor_info(v, info, why)) unsupported("input " + src->str() + ": " + why);
    if (info.meta) unsupported("input " + src->str() + ": tensor on device meta");
    const bool requires_grad = info.requires_grad;
    ir::TensorMeta m;
    m.dtype = info.dtype;
    m.device = info.device;
    for (int64_t s : info.sizes) m.sizes.push_back(s);
    for (int64_t s : info.strides) m.strides.push_back(s);
    root()->symbolic_sizes(v, *src, info, m);
    out_.guards.add_tensor(src, info);
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
    if (requires_grad) r->needs_grad_.insert(n);
    out_.input_sources.push_back(src);
    r->input_vars_.push_back(Var::tensor(n, src));
    r->input_objects_.push_back(Py_NewRef(v));
    r->keep_.push_back(v);
    return r->input_vars_.back();
  }
  if (VarPtr s = root()->symbolic_int(v, src)) return s;
  if (VarPtr f = root()->symbolic_float(v, src)) return f;
  if (VarPtr a = wrap_numpy(v, src)) return a;  // an ndarray or NumPy scalar (numpy.cpp)
  if (PyAnySet_CheckExact(v)) {
    // A set of values (numbers, strings) is guarded by its contents. One holding objects that
    // hash by identity (tensors) is not a value capture can compare: `x in s` would ask the
    // tracker, not the object.
    PyObject *it = PyObject_GetIter(v), *item;
    bool values = it != nullptr;
    while (values && (item = PyIter_Next(it))) {
      values = is_python_scalar(item) || item == Py_None || PyUnicode_CheckExact(item) || PyBytes_CheckExact(item);
      Py_DECREF(item);
    }
    Py_XDECREF(it);
    clear_error();
    if (!values) unsupported("a set holding objects other than numbers and strings (" + src->str() + ")");
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
  // A torch.device is a value: `param.device` (Hugging Face's `self.device`) is a new object at
  // every read, so an identity guard failed at every call and recompiled until the cache limit.
  static PyObject* device_type = resolve_torch("device");
  if (device_type && Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(device_type)) {
    out_.guards.add_equals(src, v);
    return Var::constant(v, src);
  }
  static PyObject* defaultdict_type = object_at("collections.defaultdict");
  static PyObject* ordered_type = object_at("collections.OrderedDict");
  const bool defaultdict = defaultdict_type && Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(defaultdict_type);
  // an OrderedDict argument (a backbone's features) is a dict of its class, guarded by its keys in order
  const bool ordered = ordered_type && Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(ordered_type);
  if (PyList_CheckExact(v) || PyDict_CheckExact(v) || defaultdict || ordered) {
    // A container that holds itself (`l.append(l)`): every walk over trackers would go round it
    // without end (capture hung); such a call runs in Python.
    if (root()->wrapping_.count(v)) unsupported("a list or dict of the caller's that holds itself");
    if (VarPtr c = known_container(v, src)) return c;
  }
  struct Wrapping {  // v's items are being wrapped
    std::unordered_set<PyObject*>* set = nullptr;
    PyObject* v = nullptr;
    ~Wrapping() {
      if (set) set->erase(v);
    }
  } wrapping;
  if (PyList_CheckExact(v) || PyDict_CheckExact(v) || defaultdict || ordered || PyTuple_CheckExact(v)) {
    wrapping.set = &root()->wrapping_;
    wrapping.v = v;
    root()->wrapping_.insert(v);
  }
  // A namedtuple's instance: a tuple of its class, items read through their sources as any
  // tuple's (unpacking read them from the object at capture, never again: values handed across
  // a graph break were the first call's).
  // A torch.Size argument (x.shape handed to a compiled helper) likewise: its ints guarded as
  // ints are, not the object by identity (a new Size at every call recompiled every call).
  static PyObject* size_type = resolve_torch("Size");
  if ((PyTuple_Check(v) && !PyTuple_CheckExact(v) && PyType_HasFeature(Py_TYPE(v), Py_TPFLAGS_HEAPTYPE) &&
       is_namedtuple_class(reinterpret_cast<PyObject*>(Py_TYPE(v)))) ||
      (size_type && Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(size_type))) {
    out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
    const Py_ssize_t n = PyTuple_GET_SIZE(v);
    if (Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(size_type)) out_.guards.add_length(src, n);
    std::vector<VarPtr> items;
    for (Py_ssize_t i = 0; i < n; ++i) items.push_back(wrap(PyTuple_GET_ITEM(v, i), Source::item(src, i)));
    VarPtr t = Var::tuple(std::move(items));
    t->as<TupleV>().structseq = Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(v)));
    t->source = src;
    return t;
  }
  if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
    out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
    Py_ssize_t n = PySequence_Size(v);
    out_.guards.add_length(src, n);
    VarPtr seq = Var::tuple({}, PyList_CheckExact(v));
    seq->source = src;  // the caller's object: changes to it are put back into it (note_mutation)
    if (PyList_CheckExact(v)) {  // known before its items: a list that holds itself is this tracker
      root()->containers_.emplace(Py_NewRef(v), seq);
      root()->keep_.push_back(v);
    }
    std::vector<VarPtr> items;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PySequence_GetItem(v, i);
      items.push_back(wrap(item, Source::item(src, i)));
      Py_DECREF(item);
    }
    seq->seq() = std::move(items);
    return seq;
  }
  if (PyDict_CheckExact(v) || defaultdict || ordered) {
    // A dict from the caller (keyword arguments, a batch of inputs): its keys and values are
    // guarded, not its identity, so a new dict with the same contents hits the cache. A
    // defaultdict (GradScaler's per-optimizer states) also has its factory, guarded by identity,
    // which a missing key calls (the insert is put back into the caller's object).
    // Its keys in order: the tracker iterates them as the dict does now (one popped and set
    // again moves to the end), so the order is guarded, which also fixes the length.
    out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
    out_.guards.add_key_order(src, v);
    VarPtr d = Var::dict();
    d->source = src;
    if (defaultdict) {
      PyObject* factory = PyObject_GetAttrString(v, "default_factory");
      if (!factory) real(nullptr);
      out_.guards.add_identity(Source::attr(src, "default_factory"), factory);
      d->as<DictV>().cls = Py_NewRef(defaultdict_type);
      d->as<DictV>().factory = factory;  // owned
    }
    if (ordered) d->as<DictV>().cls = Py_NewRef(ordered_type);
    root()->containers_.emplace(Py_NewRef(v), d);  // before its values: a dict that holds itself
    root()->keep_.push_back(v);
    PyObject *k, *item;
    Py_ssize_t pos = 0;
    if (ordered) {  // in its own order (move_to_end), not its table's
      PyObject* keys = PySequence_Tuple(v);
      if (!keys) real(nullptr);
      keep_.push_back(keys);
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); ++i) {
        k = PyTuple_GET_ITEM(keys, i);
        item = PyDict_GetItemWithError(v, k);
        if (!item) real(nullptr);
        d->entries().keys.push_back(Py_NewRef(k));
        d->entries().values.push_back(wrap(item, Source::key_of(src, k)));
      }
      return d;
    }
    while (PyDict_Next(v, &pos, &k, &item)) {
      d->entries().keys.push_back(Py_NewRef(k));
      d->entries().values.push_back(wrap(item, Source::key_of(src, k)));
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
    // Met again by another path (each layer's self.config), it is guarded to be that object,
    // and its attributes are read (and checked at each call) once, through the first path.
    Interpreter* r = root();
    if (auto it = r->structured_.find(v); it != r->structured_.end()) {
      const VarPtr& tracker = it->second;
      if (src->str() != tracker->source->str()) out_.guards.add_same(src, tracker->source);
      return tracker;
    }
    out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
    VarPtr c = Var::constant(v, src);
    c->as<ConstV>().by_type = true;
    r->structured_.emplace(Py_NewRef(v), c);
    r->keep_.push_back(v);
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

bool Interpreter::structural(const VarPtr& v) { return v->is_const() && v->source && v->as<ConstV>().by_type; }

PyObject* Interpreter::input_type(const ir::Node* placeholder) {
  Interpreter* r = root();
  const auto& ins = g_->inputs();
  for (size_t i = 0; i < ins.size() && i < r->input_objects_.size(); ++i)
    if (ins[i] == placeholder) return reinterpret_cast<PyObject*>(Py_TYPE(r->input_objects_[i]));
  return nullptr;
}

PyObject* Interpreter::input_object(const ir::Node* placeholder) {
  Interpreter* r = root();
  const auto& ins = g_->inputs();
  for (size_t i = 0; i < ins.size() && i < r->input_objects_.size(); ++i)
    if (ins[i] == placeholder) return r->input_objects_[i];
  return nullptr;
}

bool Interpreter::bound_to_structure(const VarPtr& v) {
  PyObject* o = v->is_const() && v->source ? v->known() : nullptr;
  if (!o) return false;
  if (PyMethod_Check(o)) return by_structure(PyMethod_GET_SELF(o));
  // A C method bound to an object other than a module: made afresh at each access and not
  // guarded by identity, so the object capture saw is this call's only by chance (a tensor's
  // `x.add` on a resume function's stack, when a break fell inside its arguments: handed on as
  // capture's object, it added to the first call's tensor at every call).
  return PyCFunction_Check(o) && PyCFunction_GET_SELF(o) && !PyModule_Check(PyCFunction_GET_SELF(o));
}

bool Interpreter::is_nn_module(PyObject* v) {
  static PyObject* module_type = object_at("torch.nn.Module");
  return module_type && PyObject_IsInstance(v, module_type) == 1;
}

VarPtr Interpreter::pop() {
  if (stack_.empty()) unsupported("stack underflow");
  VarPtr v = stack_.back();
  stack_.pop_back();
  if (v->dict_view()) refresh_dict_view(v);  // whoever reads it sees the dict now
  return v;
}

void Interpreter::push(VarPtr v) { stack_.push_back(std::move(v)); }

VarPtr& Interpreter::peek(size_t i) { return stack_[stack_.size() - i]; }

void Interpreter::autocast_inputs(const ops::OpDef* op, std::vector<ir::Node*>& inputs, ir::Attrs& attrs) {
  autocast_inputs(op->autocast_cuda, op->autocast_cpu,
                  op->kind == ops::OpKind::Extern && attrs.has("target") ? attrs.get_str("target") : op->name, inputs, attrs);
}

void Interpreter::autocast_inputs(ops::AutocastPolicy cuda, ops::AutocastPolicy cpu, const std::string& what,
                                  std::vector<ir::Node*>& inputs, ir::Attrs& attrs) {
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
  const ops::AutocastPolicy policy = device == DeviceType::CUDA ? cuda : cpu;
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
        unsupported("under torch.autocast, " + what + " on floating tensors is not captured yet (kiln does not know autocast's cast for it)");
      return;
  }
}

ir::Node* Interpreter::add_node(const ops::OpDef* op, std::vector<ir::Node*> inputs, ir::Attrs attrs, bool autocast) {
  std::string err;
  Interpreter* r = root();
  if (autocast && r->autocast_.any()) autocast_inputs(op, inputs, attrs);
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
  if (v->is_tensor()) return v->node();
  if (sym::Expr e = v->symint(); e.valid()) return g_->size_value(e, DType::Int64);  // x * x.shape[0]
  if (ir::Node* f = v->symfloat()) return f;  // x * scale, the float read at each call
  if (v->is_const() && !is_python_scalar(v->obj()) && (PyLong_Check(v->obj()) || PyFloat_Check(v->obj()))) {
    // an IntEnum or a float subclass: the number it is
    PyObject* plain = PyLong_Check(v->obj()) ? PyNumber_Index(v->obj()) : PyFloat_FromDouble(PyFloat_AsDouble(v->obj()));
    return as_node(real(plain), what);
  }
  if (v->is_const() && is_python_scalar(v->obj())) {
    if (PyBool_Check(v->obj())) return g_->scalar(v->known() == Py_True, DType::Bool);
    if (PyLong_Check(v->obj())) {
      int overflow = 0;
      long long x = PyLong_AsLongLongAndOverflow(v->obj(), &overflow);
      if (overflow) unsupported("integer too large for a tensor operand");
      return g_->int_scalar(x);
    }
    return g_->scalar(PyFloat_AsDouble(v->obj()), DType::Float64);
  }
  unsupported(std::string("expected a tensor for ") + what);
}

PyObject* Interpreter::const_obj(const VarPtr& v, const char* what) {
  if (structural(v)) {
    // the object itself goes into a Python operation: from here on its identity is what holds
    if (log_enabled("guards")) log("guards", "pinned " + v->source->str() + " by identity (" + what + ") at " + location());
    out_.guards.add_identity(v->source, v->obj());
    v->as<ConstV>().by_type = false;
  }
  if (v->is_const() || v->kind() == Var::Kind::Module) return v->obj();  // modules are guarded by identity
  if (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List) {
    // Materialize containers of constants (e.g. a shape tuple).
    const auto& items = v->seq();
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
    for (size_t i = 0; i < items.size(); ++i) {
      PyObject* o = const_obj(items[i], what);
      Py_INCREF(o);
      PyTuple_SET_ITEM(t, i, o);
    }
    keep_.push_back(t);
    if (v->kind() == Var::Kind::List) {
      PyObject* l = PySequence_List(t);
      keep_.push_back(l);
      return l;
    }
    return t;
  }
  if (v->kind() == Var::Kind::Dict) {
    PyObject* d = PyDict_New();
    keep_.push_back(d);
    const Entries& e = v->entries();
    for (size_t i = 0; i < e.keys.size(); ++i)
      if (PyDict_SetItem(d, e.keys[i], const_obj(e.values[i], what)) < 0) real(nullptr);
    return d;
  }
  if (PyObject* o = frozen_record_object(v, what)) return o;
  unsupported(std::string("expected a Python value for ") + what + ", got a " + Var::kind_name(v->kind()) +
              (v->kind() == Var::Kind::Record || v->kind() == Var::Kind::Function ? " made in the function" : ""));
}

OutSpec Interpreter::output_spec(const VarPtr& v) {
  OutSpec s;
  switch (v->kind()) {
    case Var::Kind::Tensor: {
      const PyForm form = v->as<TensorV>().form;
      // An input ndarray is read as torch.from_numpy of the caller's array: handed back (as it
      // is, or updated in place), it is the caller's array itself, as NumPy returns it.
      auto caller_object = [&](const SourcePtr& src) {
        if (src->kind != Source::Kind::Array) return source_spec(src);
        if (form == PyForm::Tensor) unsupported("a tensor over an input ndarray updated in place is handed out: not captured");
        return source_spec(src->base);
      };
      if (auto w = root()->written_back_.find(v->node()); w != root()->written_back_.end())
        return caller_object(root()->out_.input_sources[w->second]);  // the caller's tensor, updated
      if (form == PyForm::NdArray && v->node()->op_name() == "placeholder") {
        Interpreter* r = root();
        for (size_t i = 0; i < r->input_vars_.size(); ++i)
          if (r->input_vars_[i]->get_if<TensorV>() && r->input_vars_[i]->node() == v->node())
            return caller_object(r->out_.input_sources[i]);
      }
      // A view of an input updated in place is a view of the caller's tensor, taken after the
      // write-back (a view of the graph's copy would miss later writes through it).
      // A reshape that copies (flatten of a transposed tensor) ends the chain: its result is
      // the graph's own tensor (fuzz seed 505253).
      auto shares_memory = [](const ir::Node* n) {
        return (n->op->aliases() || n->attrs.get_bool("view")) && !n->inputs.empty() && !(n->op->copies && n->op->copies(*n));
      };
      for (const ir::Node* n = v->node(); shares_memory(n);) {
        n = n->inputs[0];
        if (auto w = root()->written_back_.find(n); w != root()->written_back_.end()) {
          // the view's layout is relative to the updated value's; the caller's tensor must have it
          const ir::TensorMeta& in = g_->inputs()[w->second]->meta;
          if (form != PyForm::Tensor || root()->out_.input_sources[w->second]->kind == Source::Kind::Array)
            unsupported("a view of an input ndarray updated in place is handed out: not captured yet");
          if (in.strides != n->meta.strides)  // offsets count from each tensor's first element
            unsupported("a view of an input updated in place is handed out, the input laid out otherwise: not captured yet");
          return input_view_spec(v, caller_object(root()->out_.input_sources[w->second]));
        }
      }
      // A result autograd tracks: the entry compiles a backward program too (training_graphs.h).
      if (root()->needs_grad_.count(v->node()) && v->node()->op_name() != "placeholder") root()->out_.needs_backward = true;
      auto& outs = g_->outputs();
      auto it = std::find(outs.begin(), outs.end(), v->node());
      s.kind = form == PyForm::NdArray ? OutSpec::Kind::Array : form == PyForm::NumpyScalar ? OutSpec::Kind::NumpyScalar : OutSpec::Kind::Graph;
      s.index = static_cast<int>(it - outs.begin());
      if (it == outs.end()) {
        outs.push_back(v->node());
        bool detach = false, data = false;
        const ir::Node* n = v->node();
        for (; n->op->aliases() && !n->inputs.empty(); n = n->inputs[0])
          detach |= n->attrs.get_bool("detach"), data |= n->attrs.get_bool("tensor_data");
        if (detach && root()->needs_grad_.count(n)) root()->out_.detached_outputs.push_back(s.index);
        if (data) root()->out_.data_outputs.push_back(s.index);
      }
      return s;
    }
    case Var::Kind::Tuple:
    case Var::Kind::List:
      if (v->source) return source_spec(v->source);  // the caller's own list or tuple, unchanged
      if (v->dict_view()) unsupported("returns a dict view (dict.keys(), values(), items())");
      if (auto* l = v->get_if<ListV>(); l && l->deque) unsupported("a deque made in the function is handed out: not captured yet");
      s.kind = v->kind() == Var::Kind::Tuple ? OutSpec::Kind::Tuple : OutSpec::Kind::List;
      if (auto* t = v->get_if<TupleV>(); t && t->structseq) s.value = tuple_maker(t->structseq);  // its type's maker
      for (auto& item : v->seq()) s.items.push_back(output_spec(item));
      return s;
    case Var::Kind::Const:
      if (sym::Expr e = v->symint(); e.valid()) {  // a symbolic int (a counter stored back): evaluated per call
        s.kind = OutSpec::Kind::Int;
        s.expr = e;
        root()->symbolic_outputs_ = true;
        return s;
      }
      // A float argument read at each call, handed out as it is: the caller's object again (a
      // resume function's value of x.item()), not a value to specialize on.
      if (ir::Node* f = v->symfloat(); f && v->source && f->op_name() == "scalar_input") return source_spec(v->source);
      if (is_private(v->known())) unsupported("hands out an object kiln copied during capture");
      if (structural(v) || bound_to_structure(v)) return source_spec(v->source);  // this call's object, not capture's
      if (holds_tensor_key(v->obj())) unsupported("a set or dict holding tensors as keys is handed out: not captured yet");
      s.kind = OutSpec::Kind::Const;
      Py_INCREF(v->obj());
      s.value = v->obj();
      return s;
    case Var::Kind::Dict:
      if (v->source) return source_spec(v->source);
      for (PyObject* k : v->entries().keys)
        if (holds_tensor_key(k)) unsupported("a dict with tensors as keys is handed out: not captured yet");
      return typed_dict_spec(v->as<DictV>(), false);
    case Var::Kind::Record: {
      if (!v->as<RecordV>().plain) return record_spec(v, false);
      // one object however often the program hands it out
      Interpreter* r = root();
      auto [it, fresh] = r->break_memo_.emplace(v.get(), static_cast<int>(r->break_memo_.size()));
      s = object_spec(v, false);
      s.memo = it->second;
      r->out_.output_memo_slots = static_cast<int>(r->break_memo_.size());
      return s;
    }
    case Var::Kind::Function: return function_spec(v, false);
    case Var::Kind::Module: return module_spec(v);
    default: unsupported("returns a value kiln cannot rebuild");
  }
}

int Interpreter::step(const Instr& in, const CodeInfo& ci) {
  if (Handler h = handlers()[in.op]) return (this->*h)(in, ci);
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
  GuardShapeEnv env(r.guards, false);
  sym::ShapeEnvScope env_scope(&env);
  Interpreter it(fn, r);
  // A symbolic int whose Python value capture reads is specialized (a fact of the entry).
  std::function<void(const sym::Expr&)> specialize = [&r, &it](const sym::Expr& e) {
    std::vector<sym::Expr> syms;
    sym::collect_symbols(e, syms);
    for (const sym::Expr& s : syms) {
      if (!r.guards.specialized(s) && log_enabled("guards"))
        log("guards", "specialized " + s.str() + " (read as a Python value) at " + it.location());
      r.guards.specialize(s);
    }
  };
  auto* saved_hook = Var::specialize_hook();
  Var::specialize_hook() = &specialize;
  std::function<void(const ir::Node*)> specialize_float = [&it](const ir::Node* n) { it.specialize_floats(n); };
  auto* saved_float_hook = Var::specialize_float_hook();
  Var::specialize_float_hook() = &specialize_float;
  struct RestoreFloatHook {
    std::function<void(const ir::Node*)>* saved;
    ~RestoreFloatHook() { Var::specialize_float_hook() = saved; }
  } restore_float{saved_float_hook};
  std::function<void(const VarPtr&)> note_view = [&it](const VarPtr& v) { it.note_tensor(v); };
  auto* saved_tensor_hook = Var::tensor_hook();
  Var::tensor_hook() = &note_view;
  struct RestoreTensorHook {
    std::function<void(const VarPtr&)>* saved;
    ~RestoreTensorHook() { Var::tensor_hook() = saved; }
  } restore_tensor{saved_tensor_hook};
  struct RestoreHook {
    std::function<void(const sym::Expr&)>* saved;
    ~RestoreHook() { Var::specialize_hook() = saved; }
  } restore{saved_hook};
  try {
    auto* co = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn));
    if (co->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE))
      throw Unsupported("generators and coroutines run eagerly");
    it.run(args);
    r.ok = true;
    r.captured_text = r.graph->str();
    r.tracked.insert(it.tracked().begin(), it.tracked().end());
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
