// Calls of particular callables during capture, dispatched on the callee object itself: a table
// from each builtin, torch function or class kiln gives a meaning to, to the rule that captures
// its calls. call_const (calls.cpp) consults it after the op registry's bindings and before the
// rules by category (Python functions inlined, torch functions as externs, pure builtins run).
//
// A rule returns nullptr when the arguments are not the case it handles; the call then goes on
// by category. To give kiln a new builtin or torch function: write a rule here and add it to the
// table under the object (`builtin("name")`, `object_at("module.name")`), never under a name.
#include <unordered_map>

#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"

namespace kiln::bind::detail {

struct CallRules {
  using KwArgs = Interpreter::KwArgs;
  using Rule = VarPtr (*)(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs);

  static const std::unordered_map<PyObject*, Rule>& table(Interpreter& I) {
    static const std::unordered_map<PyObject*, Rule> t = [&I] {
      std::unordered_map<PyObject*, Rule> m;
      auto add = [&](PyObject* callee, Rule r) {
        if (callee) m.emplace(callee, r);
        clear_error();
      };
      add(I.builtin("super"), super_);
      add(I.builtin("getattr"), getattr_);
      add(I.builtin("setattr"), setattr_);
      add(PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), "__setattr__"), object_setattr);
      add(PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), "__delattr__"), object_delattr);
      add(I.builtin("__build_class__"), build_class);
      add(I.builtin("hasattr"), getattr_);
      add(I.builtin("id"), id_);
      add(I.builtin("isinstance"), isinstance_);
      add(I.builtin("type"), type_);
      add(I.builtin("len"), len_);
      add(I.builtin("callable"), callable_);
      add(I.builtin("locals"), locals_);
      add(I.builtin("vars"), locals_);
      add(PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyDict_Type), "__getitem__"), dict_getitem);
      add(I.builtin("abs"), abs_);
      add(I.builtin("zip"), iteration);
      add(I.builtin("enumerate"), iteration);
      add(I.builtin("reversed"), iteration);
      add(I.builtin("next"), next_);
      add(object_at("sys.exc_info"), exc_info);
      add(object_at("sys.exception"), exc_info);
      add(I.builtin("iter"), iter_);
      add(object_at("copy.deepcopy"), copy_);
      add(object_at("copy.copy"), copy_);
      add(object_at("functools.partial"), partial);
      add(object_at("contextlib.contextmanager"), contextmanager);
      add(object_at("contextlib._GeneratorContextManager"), generator_context_manager);
      add(object_at("collections.Counter"), counter);
      add(object_at("collections.deque"), deque_);
      add(object_at("collections.namedtuple"), namedtuple_class);
      add(PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyTuple_Type), "__new__"), tuple_new);
      add(I.resolve_torch("result_type"), torch_result_type);
      add(I.resolve_torch("can_cast"), on_python_values);
      add(I.resolve_torch("promote_types"), on_python_values);
      add(object_at("inspect.signature"), signature);
      add(I.resolve_torch("max"), torch_max_min);
      add(I.resolve_torch("min"), torch_max_min);
      add(I.resolve_torch("split"), torch_split);
      add(I.resolve_torch("arange"), torch_arange);
      add(I.resolve_torch("ones"), torch_full);
      add(I.resolve_torch("zeros"), torch_full);
      add(I.resolve_torch("full"), torch_full);
      add(I.resolve_torch("empty"), torch_empty);
      add(I.resolve_torch("chunk"), torch_split);
      add(object_at("torch.utils.checkpoint.checkpoint"), checkpoint);
      add(object_at("torch.nn.utils.clip_grad_norm_"), clip_grad_norm);
      for (const char* ctx : {"torch.no_grad", "torch.enable_grad", "torch.inference_mode", "torch.set_grad_enabled",
                              "contextlib.nullcontext", "torch.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast"})
        add(object_at(ctx), mode);
      add(object_at("torch._C._set_grad_enabled"), set_grad_enabled_now);
      return m;
    }();
    return t;
  }

  // dict.__getitem__(d, key) on a dict of the caller's (a dict subclass's own __getitem__
  // calling super().__getitem__): the dict's storage read, the item guarded through its source
  // (Source::dict_item); a missing key raises eager's KeyError, the key's absence guarded by
  // the dict's length. Dicts made in the frame are trackers: not this rule's.
  static VarPtr dict_getitem(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 2 || !kwargs.empty() || !args[0]->is_const() || !PyDict_Check(args[0]->obj())) return nullptr;
    if (!args[1]->is_const() || args[1]->symint().valid()) return nullptr;
    PyObject* d = args[0]->obj();
    PyObject* key = args[1]->obj();
    PyObject* v = PyDict_GetItemWithError(d, key);
    if (!v) {
      if (PyErr_Occurred()) return I.real(nullptr);
      if (!args[0]->source) return nullptr;
      I.out_.guards.add_length(args[0]->source, PyDict_Size(d));
      I.raise_new(PyExc_KeyError, Py_BuildValue("(O)", key));
    }
    if (!args[0]->source) return Var::constant(v);
    return I.wrap(v, Source::dict_item(args[0]->source, key));
  }

  // locals() and vars() without arguments: the frame's locals as a dict made here.
  static VarPtr locals_(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    return args.empty() && kwargs.empty() ? I.frame_locals() : nullptr;
  }

  static VarPtr super_(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    return kwargs.empty() ? I.make_super(args) : nullptr;
  }

  // id(obj) of an object of the caller's (GradScaler keys its per-optimizer state by
  // id(optimizer)): the object guarded by identity, its id a constant of the entry.
  static VarPtr id_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 1 || !kwargs.empty()) return nullptr;
    const VarPtr& v = args[0];
    if (!(v->is_const() || v->kind() == Var::Kind::Module) || !v->source || !v->obj()) return nullptr;
    if (v->source->made_in_frame() || I.is_private(v->obj())) return nullptr;
    I.out_.guards.add_identity(v->source, v->obj());
    return Var::steal_constant(PyLong_FromVoidPtr(v->obj()));
  }

  // getattr(obj, name[, default]) and hasattr(obj, name): read as obj.name would be, guarded.
  static VarPtr getattr_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    const bool has_only = fn->known() == I.builtin("hasattr");
    if (args.size() < 2) return nullptr;
    if (args[0]->kind() == Var::Kind::Record) {  // a dataclass instance made in the frame
      const VarPtr& rec = args[0];
      std::string attr = PyUnicode_AsUTF8(I.const_obj(args[1], "attribute name"));
      bool has = I.object_has_attr(rec, attr);
      if (has_only) return Var::constant(has ? Py_True : Py_False);
      if (!has && args.size() == 3) return args[2];
      return I.getattr(rec, attr);
    }
    if (kwargs.empty() && (args[0]->kind() == Var::Kind::Module || (args[0]->is_const() && args[0]->source)) &&
        args[1]->is_const() && PyUnicode_Check(args[1]->obj())) {
      // getattr(self, f"fc{i}"), getattr(cfg, "eps"): as self.fc0 / cfg.eps
      const char* attr = PyUnicode_AsUTF8(args[1]->obj());
      const Interpreter::AttrStore* logged = I.logged_attr(args[0]->obj(), attr);
      int has = logged ? logged->value != nullptr : PyObject_HasAttrString(args[0]->obj(), attr);
      // An attribute found absent is guarded (a new object of the same type may have it); a
      // present one is guarded by reading it, as obj.name is.
      if (!has && !logged && args[0]->source) I.guard_hasattr(args[0], args[1]->obj(), false);
      if (has_only) {
        if (has) I.getattr(args[0], attr);
        return Var::constant(has ? Py_True : Py_False);
      }
      if (!has && args.size() == 3) return args[2];
      return I.getattr(args[0], attr);
    }
    if (!has_only && kwargs.empty() && args.size() == 2 && args[0]->is_array() && args[1]->is_const() && PyUnicode_Check(args[1]->obj()))
      return I.getattr(args[0], PyUnicode_AsUTF8(args[1]->obj()));  // getattr(a, "round") on an ndarray: as a.round
    if (auto* t = args[0]->get_if<TupleV>();
        t && t->structseq && kwargs.empty() && args[1]->is_const() && PyUnicode_Check(args[1]->obj())) {
      // a namedtuple's field, method or class attribute; AttributeError answers hasattr
      const char* attr = PyUnicode_AsUTF8(args[1]->obj());
      VarPtr v;
      try {
        v = I.getattr(args[0], attr);
      } catch (const Raised& e) {
        if (!PyErr_GivenExceptionMatches(e.exc, PyExc_AttributeError) || (!has_only && args.size() != 3)) throw;
      }
      if (has_only) return Var::constant(v ? Py_True : Py_False);
      return v ? v : args[2];
    }
    if (kwargs.empty() && args[0]->is_tensor() && args[1]->is_const() && PyUnicode_Check(args[1]->obj())) {
      // getattr(x, "ndim") as x.ndim; an attribute the caller set on an input tensor is read
      // (guarded by value) or guarded absent, as x.name reads it: hasattr answers from that
      const char* attr = PyUnicode_AsUTF8(args[1]->obj());
      if (PyObject_HasAttr(I.resolve_torch("Tensor"), args[1]->obj())) return has_only ? Var::constant(Py_True) : I.getattr(args[0], attr);
      VarPtr v;
      try {
        v = I.getattr(args[0], attr);
      } catch (const Raised& e) {
        if (!PyErr_GivenExceptionMatches(e.exc, PyExc_AttributeError) || (!has_only && args.size() != 3)) throw;
      }
      if (has_only) return Var::constant(v ? Py_True : Py_False);
      return v ? v : args[2];
    }
    return nullptr;
  }

  // setattr(obj, name, value): as `obj.name = value` (an object made in the frame, a private
  // copy, or a store logged on an object the caller holds).
  static VarPtr setattr_(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 3 || !kwargs.empty() || !args[1]->is_const() || !PyUnicode_Check(args[1]->known())) return nullptr;
    I.store_attr(args[0], PyUnicode_AsUTF8(args[1]->known()), args[2]);
    return Var::constant(Py_None);
  }

  // object.__setattr__(obj, name, value): the generic store, past the class's own __setattr__
  // (a frozen dataclass's __init__, or super().__setattr__ in a class's own).
  static VarPtr object_setattr(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 3 || !kwargs.empty() || !args[1]->is_const() || !PyUnicode_Check(args[1]->known())) return nullptr;
    auto* rec = args[0]->get_if<RecordV>();
    if (!args[0]->is_const() && !(rec && rec->plain)) return nullptr;
    I.store_attr(args[0], PyUnicode_AsUTF8(args[1]->known()), args[2], true);
    return Var::constant(Py_None);
  }

  // object.__delattr__(obj, name) on an object made in the frame: the generic delete, past the
  // class's own __delattr__.
  static VarPtr object_delattr(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 2 || !kwargs.empty() || !args[1]->is_const() || !PyUnicode_Check(args[1]->known())) return nullptr;
    auto* rec = args[0]->get_if<RecordV>();
    if (!(rec && rec->plain)) return nullptr;
    I.store_attr(args[0], PyUnicode_AsUTF8(args[1]->known()), nullptr, true);
    return Var::constant(Py_None);
  }

  // A class statement in the function: its body run for real, now, as every call would run it,
  // when the body closes over nothing but constants (its methods then capture like any class's).
  // The class is one object for every call, where eager makes one per call.
  static VarPtr build_class(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() < 2) return nullptr;
    auto* body = args[0]->get_if<FunctionV>();
    if (!body || !body->rebuildable) unsupported("a class whose body closes over values of the function");
    std::vector<VarPtr> real_args = args;
    real_args[0] = Var::constant(body->fn);  // its cells hold the constants it closes over
    return I.real(I.call_for_real(fn->obj(), real_args, kwargs, "class statement argument"));
  }

  // collections.Counter(...) of Python values: made now, an object of the capture's own (its
  // methods run for real; handing it out ends the capture), as every call would make it.
  static VarPtr counter(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    // (const_obj takes lists and tuples of Python values made in the frame; one holding a tensor
    // stops capture with the reason)
    PyObject* c = I.call_for_real(fn->obj(), args, kwargs, "Counter argument");
    if (!c) I.real(nullptr);
    I.keep_.push_back(c);
    I.root()->private_.insert(c);
    return Var::constant(c);
  }

  // collections.deque(iterable, maxlen) made in the frame: a list tracker that knows it is a
  // deque (Interpreter::call_sequence_method has its methods).
  static VarPtr deque_(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    VarPtr iterable = args.size() > 0 ? args[0] : nullptr, maxlen = args.size() > 1 ? args[1] : nullptr;
    if (args.size() > 2) return nullptr;
    for (auto& [k, v] : kwargs) {
      if (k == "iterable" && !iterable) iterable = v;
      else if (k == "maxlen" && !maxlen) maxlen = v;
      else return nullptr;
    }
    Py_ssize_t m = -1;
    if (maxlen && !(maxlen->is_const() && maxlen->known() == Py_None)) {
      PyObject* o = I.const_obj(maxlen, "deque maxlen");
      if (!PyLong_Check(o) || PyLong_AsSsize_t(o) < 0) unsupported("maxlen must be a non-negative integer: ValueError");
      m = PyLong_AsSsize_t(o);
    }
    std::vector<VarPtr> items = iterable ? I.items_of(iterable) : std::vector<VarPtr>{};
    if (m >= 0 && static_cast<Py_ssize_t>(items.size()) > m) items.erase(items.begin(), items.end() - m);
    VarPtr r = Var::list(std::move(items));
    r->as<ListV>().deque = true;
    r->as<ListV>().maxlen = m;
    return r;
  }

  // tuple.__new__(cls, items) of a namedtuple class (its _make): the namedtuple of the items.
  static VarPtr tuple_new(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 2 || !kwargs.empty() || !args[0]->is_const() || !Interpreter::is_namedtuple_class(args[0]->known()))
      return nullptr;
    VarPtr r = Var::tuple(I.items_of(args[1]));
    r->as<TupleV>().structseq = Py_NewRef(args[0]->known());
    return r;
  }

  // torch.result_type(a, b): the dtype torch's promotion gives, from what capture knows of each
  // operand (a tensor's dtype and rank; a Python number's category).
  static VarPtr torch_result_type(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 2 || !kwargs.empty()) return nullptr;
    std::vector<PromotionOperand> ops;
    for (const VarPtr& a : args) {
      if (a->is_tensor()) {
        ops.push_back({a->node()->meta.dtype, a->node()->meta.dim(), false});
      } else if (a->is_const() && is_python_scalar(a->known())) {
        PyObject* o = a->known();
        ops.push_back({PyBool_Check(o) ? DType::Bool : PyLong_Check(o) ? DType::Int64 : DType::Float64, 0, true});
      } else {
        return nullptr;
      }
    }
    return Var::constant(torch_dtype_object(result_type(ops, ops::default_float())));  // (guarded)
  }

  // collections.namedtuple("Out", ["logits", "loss"], defaults=[None]) in the function: a class
  // made from constants, once (eager makes an equal one at every call); its instances are
  // tuple trackers (make_namedtuple).
  static VarPtr namedtuple_class(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    // The class's __module__ is its caller's, as namedtuple reads it off the calling frame.
    bool named = std::any_of(kwargs.begin(), kwargs.end(), [](const auto& kv) { return kv.first == "module"; });
    PyObject* module = I.globals_ ? PyDict_GetItemString(I.globals_, "__name__") : nullptr;
    if (!named && module) kwargs.emplace_back("module", Var::constant(module));
    return I.real(I.call_for_real(fn->obj(), args, kwargs, "namedtuple argument"));  // lists of names made here too
  }

  // torch functions that answer from Python values alone (torch.can_cast(torch.int32, dt)).
  static VarPtr on_python_values(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (!std::all_of(args.begin(), args.end(), [](const VarPtr& a) { return a->is_const(); }) || !kwargs.empty()) return nullptr;
    return I.real(I.call_for_real(fn->obj(), args, kwargs));
  }

  static VarPtr isinstance_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (!kwargs.empty()) {  // eager's TypeError, which the code may catch
      PyObject* name = PyObject_GetAttrString(fn->obj(), "__name__");
      PyObject* msg = name ? PyUnicode_FromFormat("%U() takes no keyword arguments", name) : nullptr;
      Py_XDECREF(name);
      PyObject* a = msg ? PyTuple_Pack(1, msg) : nullptr;
      Py_XDECREF(msg);
      if (!a) return I.real(nullptr);
      I.raise_new(PyExc_TypeError, a);
    }
    if (args.size() != 2) return nullptr;
    const VarPtr& a = args[0];
    if (a->kind() == Var::Kind::Record)
      return Var::constant(PyObject_IsSubclass(a->as<RecordV>().cls, I.const_obj(args[1], "class")) == 1 ? Py_True : Py_False);
    if (VarPtr r = I.builtin_over_trackers(fn->obj(), args, kwargs)) return r;
    PyObject* of = nullptr;  // the class that answers
    if (Interpreter::structural(a) && kwargs.empty()) of = reinterpret_cast<PyObject*>(Py_TYPE(a->obj()));
    else if (a->is_tensor()) {
      // an input: its own class (an nn.Parameter, a subclass), which its tensor guard checks
      PyObject* t = a->node()->op_name() == "placeholder" ? I.input_type(a->node()) : nullptr;
      of = t ? t : I.resolve_torch("Tensor");
    } else if (a->is_array()) of = I.array_type(a);
    else if (auto* l = a->get_if<ListV>(); l && l->deque) of = object_at("collections.deque");
    else if (a->symint().valid() || a->symslice() || a->symfloat()) of = reinterpret_cast<PyObject*>(Py_TYPE(a->known()));  // its type, not its value
    if (!of) return nullptr;
    // a metaclass's own __instancecheck__ (torch's storage classes) asks the object, not its class
    PyObject* cls = I.const_obj(args[1], "isinstance() class");
    static PyObject* abc_meta = object_at("abc.ABCMeta");
    static PyObject* instancecheck = PyUnicode_InternFromString("__instancecheck__");
    auto custom_check = [&](PyObject* c) {
      PyTypeObject* meta = Py_TYPE(c);
      return PyType_Check(c) && meta != &PyType_Type && reinterpret_cast<PyObject*>(meta) != abc_meta &&
             _PyType_Lookup(meta, instancecheck) != _PyType_Lookup(&PyType_Type, instancecheck);
    };
    bool custom = custom_check(cls);
    for (Py_ssize_t i = 0; PyTuple_Check(cls) && i < PyTuple_GET_SIZE(cls); ++i) custom |= custom_check(PyTuple_GET_ITEM(cls, i));
    if (custom) {
      if (Interpreter::structural(a)) return Var::constant(PyObject_IsInstance(a->obj(), cls) == 1 ? Py_True : Py_False);
      // isinstance(p, nn.Parameter): _ParameterMeta asks the tensor (its `_is_param`). An input
      // answers as the caller's tensor does (its class is guarded); a tensor the graph made is a
      // plain tensor, as eager's is.
      if (a->is_tensor()) {
        PyObject* t = a->node()->op_name() == "placeholder" ? I.input_object(a->node()) : nullptr;
        if (t) return Var::constant(PyObject_IsInstance(t, cls) == 1 ? Py_True : Py_False);
        // torch.FloatTensor, torch.cuda.LongTensor (torch.tensortype): a tensor of that dtype on
        // that kind of device, dense
        static PyObject* float_tensor = object_at("torch.FloatTensor");  // its metaclass: torch.tensortype
        static PyObject* tensortype = float_tensor ? reinterpret_cast<PyObject*>(Py_TYPE(float_tensor)) : nullptr;
        if (tensortype && Py_TYPE(cls) == reinterpret_cast<PyTypeObject*>(tensortype)) {
          const ir::TensorMeta& m = a->node()->meta;
          PyObject* dtype = PyObject_GetAttrString(cls, "dtype");
          PyObject* cuda = PyObject_GetAttrString(cls, "is_cuda");
          PyObject* sparse = PyObject_GetAttrString(cls, "is_sparse");
          const bool same = dtype == torch_dtype_object(m.dtype) && (cuda == Py_True) == (m.device.type == DeviceType::CUDA) &&
                            sparse == Py_False;
          Py_XDECREF(dtype), Py_XDECREF(cuda), Py_XDECREF(sparse);
          clear_error();
          return Var::constant(same ? Py_True : Py_False);
        }
        if (a->node()->op_name() != "placeholder") return Var::constant(PyObject_IsSubclass(I.resolve_torch("Tensor"), cls) == 1 ? Py_True : Py_False);
      }
      unsupported("isinstance() with a metaclass's own __instancecheck__");
    }
    int r = PyObject_IsSubclass(of, cls);
    if (r < 0) I.real(nullptr);
    return Var::constant(r == 1 ? Py_True : Py_False);
  }

  static VarPtr type_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 1) return nullptr;
    const VarPtr& a = args[0];
    if (auto* r = a->get_if<RecordV>()) return Var::constant(r->cls);
    if (auto* t = a->get_if<TupleV>(); t && t->structseq && kwargs.empty()) return Var::constant(t->structseq);  // a namedtuple's class
    if (kwargs.empty() && !a->dict_view()) {  // a tuple, list or dict tracker: its builtin class
      if (auto* t = a->get_if<TupleV>(); t && !t->structseq) return Var::constant(reinterpret_cast<PyObject*>(&PyTuple_Type));
      if (auto* l = a->get_if<ListV>(); l && !l->deque && !l->sliced_module) return Var::constant(reinterpret_cast<PyObject*>(&PyList_Type));
      if (auto* d = a->get_if<DictV>()) return Var::constant(d->cls ? d->cls : reinterpret_cast<PyObject*>(&PyDict_Type));
    }
    if (const DictView* v = a->dict_view(); v && kwargs.empty()) {  // dict_keys, dict_values, dict_items
      PyObject* empty = PyDict_New();
      PyObject* view = empty ? PyObject_CallMethod(empty, v->which.c_str(), nullptr) : nullptr;
      Py_XDECREF(empty);
      if (!view) return I.real(nullptr);
      VarPtr r = Var::constant(reinterpret_cast<PyObject*>(Py_TYPE(view)));
      Py_DECREF(view);
      return r;
    }
    if (a->is_array() && kwargs.empty()) return Var::constant(I.array_type(a));
    if (VarPtr r = I.builtin_over_trackers(fn->obj(), args, kwargs)) return r;
    // type(self) of a caller's object: the class, read through the object, so that what is read
    // off it (type(self).scale, a class attribute) is guarded where it is read
    if ((Interpreter::structural(a) || a->kind() == Var::Kind::Module) && a->source && kwargs.empty())
      return I.wrap(reinterpret_cast<PyObject*>(Py_TYPE(a->obj())), Source::attr(a->source, "__class__"));
    if (Interpreter::structural(a) && kwargs.empty()) return Var::constant(reinterpret_cast<PyObject*>(Py_TYPE(a->obj())));
    if ((a->symint().valid() || a->symslice() || a->symfloat()) && kwargs.empty())
      return Var::constant(reinterpret_cast<PyObject*>(Py_TYPE(a->known())));
    if (a->is_tensor() && a->node()->op_name() != "placeholder") return Var::constant(I.resolve_torch("Tensor"));
    if (a->is_tensor()) {  // an input: its class, which its tensor guard checks
      if (PyObject* t = I.input_type(a->node())) return Var::constant(t);
    }
    return nullptr;
  }

  static VarPtr len_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 1) return nullptr;
    const VarPtr& a = args[0];
    if (auto* r = a->get_if<RecordV>(); r && PyObject_IsSubclass(r->cls, reinterpret_cast<PyObject*>(&PyDict_Type)) == 1)
      return Var::steal_constant(PyLong_FromSize_t(r->view.size()));
    if (auto* r = a->get_if<RecordV>(); r && r->plain) {
      if (VarPtr n = I.object_dunder(a, "__len__", {})) return n;
      unsupported(std::string("object of type '") + reinterpret_cast<PyTypeObject*>(r->cls)->tp_name + "' has no len(): TypeError");
    }
    if (VarPtr r = I.builtin_over_trackers(fn->obj(), args, kwargs)) return r;
    if (a->kind() == Var::Kind::Module) return Var::steal_constant(PyLong_FromSsize_t(I.module_children(a)));
    // a caller's dict subclass that leaves len to dict (a ModelOutput): its keys, read in order
    // and guarded so, not the object pinned by identity
    if (Interpreter::structural(a) && a->source && PyDict_Check(a->known()) &&
        Interpreter::dict_storage_reads(Py_TYPE(a->known()), "__len__"))
      return Var::steal_constant(PyLong_FromSize_t(I.dict_entries(a).size()));
    if (a->is_array()) {
      if (a->node()->meta.dim() == 0) unsupported("len() of unsized object: TypeError");
      return I.size_const(a->node()->meta.sizes[0]);
    }
    if (a->is_tensor()) {
      const ir::TensorMeta& m = a->node()->meta;
      if (m.dim() == 0) unsupported("len() of a 0-d tensor");
      return I.size_const(m.sizes[0]);
    }
    return nullptr;
  }

  static VarPtr callable_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (VarPtr r = I.builtin_over_trackers(fn->obj(), args, kwargs)) return r;
    if (args.size() != 1) return nullptr;
    const VarPtr& a = args[0];
    if (Interpreter::structural(a)) return Var::constant(PyCallable_Check(a->obj()) ? Py_True : Py_False);
    if (a->is_const()) return nullptr;
    bool yes = a->kind() == Var::Kind::Module || a->kind() == Var::Kind::Function || a->kind() == Var::Kind::Method;
    return Var::constant(yes ? Py_True : Py_False);
  }

  static VarPtr abs_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (VarPtr r = I.builtin_over_trackers(fn->obj(), args, kwargs)) return r;
    if (args.size() == 1 && args[0]->is_tensor()) return Var::tensor(I.add_node("abs", {args[0]->node()}));
    if (args.size() == 1 && args[0]->is_array() && kwargs.empty()) return I.array_unary("abs", args[0]);
    return nullptr;
  }

  // zip / enumerate / reversed over values known at capture time: tuples of trackers.
  static VarPtr iteration(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (VarPtr r = I.builtin_over_trackers(fn->obj(), args, kwargs)) return r;
    if (kwargs.empty()) return I.iteration_builtin(fn->obj(), args);
    if (fn->known() == I.builtin("enumerate") && kwargs.size() == 1 && kwargs[0].first == "start" && args.size() == 1)
      return I.iteration_builtin(fn->obj(), {args[0], kwargs[0].second});
    if (fn->known() == I.builtin("zip") && kwargs.size() == 1 && kwargs[0].first == "strict" && kwargs[0].second->is_const()) {
      // zip(a, b, strict=True) (torch's RNN modules): Python's ValueError where lengths differ
      PyObject* strict = kwargs[0].second->known();
      if (!PyBool_Check(strict)) return nullptr;
      if (strict == Py_True && !args.empty()) {
        for (const VarPtr& a : args)
          if (a->kind() == Var::Kind::Record) return nullptr;  // its __iter__ runs once, in the zip
        const size_t n = I.items_of(args[0]).size();
        for (size_t i = 1; i < args.size(); ++i)
          if (I.items_of(args[i]).size() != n) unsupported("zip(strict=True) of iterables of different lengths: ValueError");
      }
      return I.iteration_builtin(fn->obj(), args);
    }
    return nullptr;
  }

  static VarPtr next_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (VarPtr r = I.builtin_over_trackers(fn->obj(), args, kwargs)) return r;
    if ((args.size() != 1 && args.size() != 2) || args[0]->kind() != Var::Kind::Iterator) return nullptr;
    auto& items = args[0]->as<IteratorV>();
    I.sync_list_iterator(items);
    if (items.empty()) {
      if (items.raises) I.raise(items.raises);  // the generator's exception
      if (args.size() == 2) return args[1];
      // (the generator's return value, if it returned one, is StopIteration's value)
      I.raise_new(PyExc_StopIteration, items.returned && items.returned->is_const() ? Py_BuildValue("(O)", items.returned->obj())
                                                                                     : PyTuple_New(0));
    }
    VarPtr v = items.front();
    items.pop_front();
    return v;
  }

  // sys.exc_info() / sys.exception(): the exception being handled, in this frame or a caller's
  // within the capture (the compiled function's caller handles none kiln could see: eager's
  // answer there is the caller's, which a graph cannot read, so that call stays eager)
  static VarPtr exc_info(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (!args.empty() || !kwargs.empty()) return nullptr;
    PyObject* e = I.handled_exception();
    if (!e) return nullptr;
    static PyObject* exception_fn = object_at("sys.exception");
    if (fn->obj() == exception_fn) return Var::constant(e);
    PyObject* tb = PyException_GetTraceback(e);
    return Var::steal_constant(Py_BuildValue("(OON)", reinterpret_cast<PyObject*>(Py_TYPE(e)), e, tb ? tb : Py_NewRef(Py_None)));
  }

  // copy.deepcopy(config) / copy.copy(obj) of a Python object (legacy encoder-decoder configs are
  // copied and edited to get the decoder's): copied for real now, a private object of the
  // capture (Interpreter::private_copy).
  static VarPtr copy_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 1 || !kwargs.empty() || !args[0]->is_const()) return nullptr;
    PyObject* x = args[0]->known();
    if (is_tensor(x) || Interpreter::is_nn_module(x) || is_python_scalar(x) || x == Py_None) return nullptr;
    return I.private_copy(fn->obj(), args[0]);
  }

  static VarPtr iter_(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (VarPtr r = I.builtin_over_trackers(fn->obj(), args, kwargs)) return r;
    if (args.size() != 1 || !kwargs.empty()) return nullptr;
    if (args[0]->is_const() && !Interpreter::structural(args[0])) {
      // iter(None), iter(3): the TypeError eager raises (code catches it to test iterability)
      PyObject* it = PyObject_GetIter(args[0]->known());
      if (!it) I.real(nullptr);
      Py_DECREF(it);
    }
    if (args[0]->kind() == Var::Kind::Iterator) return args[0];  // iter(it) is it
    return I.iterate(args[0]);
  }

  // @contextlib.contextmanager over a generator function made in the frame: that function,
  // marked so a call makes its context manager (python_contexts.cpp). Over a function of the
  // caller's, contextmanager runs as any Python function.
  static VarPtr contextmanager(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 1 || !kwargs.empty() || args[0]->kind() != Var::Kind::Function) return nullptr;
    const FunctionV& f = args[0]->as<FunctionV>();
    FunctionV d;
    d.fn = Py_NewRef(f.fn);
    d.cells = f.cells;
    d.makes_context = true;
    return std::make_shared<Var>(std::move(d));  // not rebuildable: a break or return cannot hand it out
  }

  // contextlib._GeneratorContextManager(func, args, kwds), as ContextDecorator's _recreate_cm
  // makes a fresh one: the generator kiln runs to its yield and on (python_contexts.cpp), not an
  // object whose __init__ would run the generator to its end at once.
  static VarPtr generator_context_manager(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 3 || !kwargs.empty() || !args[0]->is_const()) return nullptr;
    if (args[1]->kind() != Var::Kind::Tuple && !(args[1]->is_const() && PyTuple_Check(args[1]->obj()))) return nullptr;
    if (!I.is_dict(args[2])) return nullptr;
    KwArgs kw;
    for (auto& [k, v] : I.dict_entries(args[2])) {  // as f(**kwds) reads them
      if (!PyUnicode_Check(k)) return nullptr;
      kw.emplace_back(PyUnicode_AsUTF8(k), v);
    }
    return I.make_generator_context(args[0]->obj(), nullptr, I.items_of(args[1]), kw);
  }

  // functools.partial(g, ...) of values known here: a real partial, built now. Others (over
  // tensors, modules, bound methods, closures) are the closure kiln/_polyfills.py models.
  static VarPtr partial(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.empty() || !std::all_of(args.begin(), args.end(), [](auto& a) { return a->is_const(); }) ||
        !std::all_of(kwargs.begin(), kwargs.end(), [](auto& kv) { return kv.second->is_const(); }))
      return nullptr;
    return I.real(I.call_for_real(fn->obj(), args, kwargs));
  }

  // inspect.signature(fn): a property of the code, never of tensors; asked of the real callable.
  static VarPtr signature(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 1 || !kwargs.empty()) return nullptr;
    const VarPtr& a = args[0];
    PyObject* target = nullptr;
    if (auto* m = a->get_if<MethodV>(); m && m->self->kind() == Var::Kind::Module && !m->fn)
      target = PyObject_GetAttrString(m->self->obj(), m->name.c_str());
    else if (auto* f = a->get_if<FunctionV>())
      target = Py_NewRef(f->fn);
    else if (a->is_const() || a->kind() == Var::Kind::Module)
      target = Py_NewRef(a->obj());
    if (!target) {
      if (PyErr_Occurred()) I.real(nullptr);
      return nullptr;
    }
    PyObject* r = PyObject_CallOneArg(fn->obj(), target);
    Py_DECREF(target);
    return I.real(r);
  }

  // torch.max(x) / torch.max(a, b): amax / maximum. With a dim, torch's own kernel (an extern
  // returning torch.return_types.max).
  static VarPtr torch_max_min(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    const bool max = fn->known() == I.resolve_torch("max");
    if (args.size() == 1 && kwargs.empty())
      return I.call_op(*function_binding(I.resolve_torch(max ? "amax" : "amin")), args, {});
    if (args.size() == 2 && args[1]->is_tensor() && kwargs.empty())
      return I.call_op(*function_binding(I.resolve_torch(max ? "maximum" : "minimum")), args, {});
    return nullptr;
  }

  // torch.split(x, ...) / torch.chunk(x, ...): the Tensor methods (views of x by slices).
  static VarPtr torch_split(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.empty() || !args[0]->is_tensor()) return nullptr;
    std::vector<VarPtr> rest(args.begin() + 1, args.end());
    return I.split_tensor(args[0], fn->known() == I.resolve_torch("chunk"), rest, kwargs);
  }

  // torch.arange over integers (arange(x.shape[1]), arange(past, past + 1)): an arange node, its
  // values index expressions that fuse into the kernels reading them, its length symbolic where
  // a bound is. Floats, other dtypes and other keywords are torch's factory.
  static VarPtr torch_arange(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.empty() || args.size() > 3) return nullptr;
    std::vector<sym::Expr> bounds;
    for (const VarPtr& a : args) {
      if (sym::Expr e = a->symint(); e.valid()) {
        bounds.push_back(e);
        continue;
      }
      PyObject* o = a->known();
      if (!o || !PyLong_CheckExact(o)) return nullptr;
      bounds.push_back(sym::Expr(static_cast<int64_t>(PyLong_AsLongLong(o))));
    }
    sym::Expr start = bounds.size() >= 2 ? bounds[0] : sym::Expr(0), end = bounds.size() >= 2 ? bounds[1] : bounds[0];
    int64_t step = 1;
    if (bounds.size() == 3) {
      auto c = bounds[2].as_const();
      if (!c || *c <= 0) return nullptr;
      step = *c;
    }
    // Made on torch's default device unless the call names one.
    static PyObject* default_device = I.resolve_torch("get_default_device");
    std::string device;
    {
      PyObject* d = PyObject_CallNoArgs(default_device);
      PyObject* s = d ? PyObject_Str(d) : nullptr;
      Py_XDECREF(d);
      if (!s) return I.real(nullptr);
      device = PyUnicode_AsUTF8(s);
      Py_DECREF(s);
      if (device != "cpu" && device.rfind("cuda", 0) != 0) return nullptr;
    }
    for (const auto& [k, v] : kwargs) {
      if (k == "device") {
        PyObject* d = I.const_obj(v, "device");
        PyObject* s = PyObject_Str(d);
        if (!s) return I.real(nullptr);
        device = PyUnicode_AsUTF8(s);
        Py_DECREF(s);
        if (device != "cpu" && device.rfind("cuda", 0) != 0) return nullptr;
      } else if (k == "dtype") {
        PyObject* d = I.const_obj(v, "dtype");
        if (d != Py_None && d != I.resolve_torch("int64")) return nullptr;
      } else {
        return nullptr;
      }
    }
    ir::Attrs a;
    a.set("start", start);
    a.set("end", end);
    a.set("step", step);
    a.set("dtype", DType::Int64);
    a.set("device", device);
    return Var::tensor(I.add_node("arange", {}, a));
  }

  // torch.ones(B, T) / zeros / full((B, T), v) with a symbolic size: a `full` node (constant
  // sizes stay torch's factory as a torch_call).
  static VarPtr torch_full(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    const bool full = fn->known() == I.resolve_torch("full");
    std::vector<VarPtr> size_args = args;
    VarPtr fill;
    if (full) {
      if (args.size() != 2) return nullptr;
      size_args = {args[0]};
      fill = args[1];
    }
    PyObject* dtype = nullptr;
    PyObject* device = nullptr;
    for (auto& [k, v] : kwargs) {
      if (k == "dtype") dtype = I.const_obj(v, "dtype");
      else if (k == "device") device = I.const_obj(v, "device");
      else if (k == "fill_value" && full && !fill) fill = v;
      else if (!(k == "requires_grad" && v->is_const() && v->known() == Py_False)) return nullptr;
    }
    if (full && args.size() == 1 && fill) size_args = {args[0]};
    return I.full_node(size_args, full ? fill : Var::steal_constant(PyLong_FromLong(fn->known() == I.resolve_torch("ones"))),
                       full, dtype, device);
  }

  // torch.empty(...): torch.zeros(...), zeros being one of the values uninitialized memory may
  // hold (a memory_format or other layout argument: torch's operator)
  static VarPtr torch_empty(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    for (const auto& [k, v] : kwargs)
      if (k != "dtype" && k != "device" && k != "requires_grad") return nullptr;
    return I.call(Var::constant(I.resolve_torch("zeros")), args, kwargs);
  }

  // torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, ...): fn's call, its
  // values recomputed in the backward. The reentrant form (no gradients for parameters when no
  // input requires grad) and a context_fn of one's own go by category.
  static VarPtr clip_grad_norm(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    return I.clip_grad_norm(args, kwargs);
  }

  static VarPtr checkpoint(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, KwArgs& kwargs) {
    static PyObject* noop_context = object_at("torch.utils.checkpoint.noop_context_fn");
    clear_error();
    if (args.empty()) return nullptr;
    bool reentrant = true;
    KwArgs passed;
    for (auto& [k, v] : kwargs) {
      if (k == "use_reentrant") {
        if (!v->is_const()) return nullptr;
        reentrant = v->known() != Py_False;
      } else if (k == "context_fn") {
        if (!v->is_const() || v->known() != noop_context) return nullptr;
      } else if (k != "preserve_rng_state" && k != "determinism_check" && k != "debug") {
        passed.emplace_back(k, v);
      }
    }
    // The reentrant form differs where no tensor argument requires grad: its result then
    // requires none (parameters inside get no gradient), as torch's own function gives.
    // Otherwise its gradients are the non-reentrant form's: the region recomputed in the
    // backward (torch's reentrant backward, run from kiln's, would call .grad() and raise).
    if (reentrant) {
      if (!passed.empty()) return nullptr;  // the reentrant form takes no keyword arguments: torch's error
      bool tracked = false;
      auto check = [&](const VarPtr& v) { tracked = tracked || (v->is_tensor() && I.tracked().count(v->node())); };
      for (size_t i = 1; i < args.size(); ++i) check(args[i]);
      for (auto& [k, v] : passed) check(v);
      if (!tracked) return nullptr;
    }
    return I.checkpointed_call(args[0], std::vector<VarPtr>(args.begin() + 1, args.end()), std::move(passed));
  }

  static VarPtr mode(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    // torch.no_grad(f) / torch.enable_grad(f): the decorator without parentheses, f called in
    // the context's modes (torch's _NoParamDecoratorContextManager.__new__)
    static PyObject* no_grad = I.resolve_torch("no_grad");
    static PyObject* enable_grad = I.resolve_torch("enable_grad");
    if ((fn->obj() == no_grad || fn->obj() == enable_grad) && args.size() == 1 && kwargs.empty() &&
        (args[0]->kind() == Var::Kind::Function || (args[0]->is_const() && PyFunction_Check(args[0]->obj())))) {
      VarPtr ctx = I.mode_context(fn->obj(), {}, {});
      return ctx ? I.call(ctx, std::move(args), {}) : nullptr;
    }
    return I.mode_context(fn->obj(), args, kwargs);
  }

  // torch._C._set_grad_enabled(b): what torch.set_grad_enabled(b) does when called (a context
  // manager written in Python sets grad mode with it), returning None
  static VarPtr set_grad_enabled_now(Interpreter& I, const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
    static PyObject* set_grad_enabled = I.resolve_torch("set_grad_enabled");
    if (args.size() != 1 || !kwargs.empty()) return nullptr;
    return I.mode_context(set_grad_enabled, args, kwargs) ? Var::constant(Py_None) : nullptr;
  }
};

namespace {

// torch._dynamo.graph_break, once torch._dynamo is loaded (code that calls it has loaded it;
// kiln does not load it for this: an import of a second or more on a first capture).
PyObject* dynamo_graph_break() {
  static PyObject* found = nullptr;
  if (found) return found;
  static PyObject* name = PyUnicode_InternFromString("torch._dynamo.decorators");
  PyObject* decorators = PyImport_GetModule(name);
  clear_error();
  if (!decorators) return nullptr;
  found = PyObject_GetAttrString(decorators, "graph_break");  // kept
  Py_DECREF(decorators);
  clear_error();
  return found;
}

}  // namespace

VarPtr Interpreter::call_rule(const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
  // A break the code asks for, as TorchDynamo makes one: the call runs in Python.
  // torch.optim's step wrapper (_use_grad) asks TorchDynamo for breaks around its
  // torch.set_grad_enabled calls, which kiln captures: there it is nothing.
  if (PyObject* brk = fn->known(); brk && PyFunction_Check(brk) && brk == dynamo_graph_break()) {
    if (filename_.find("/torch/optim/") != std::string::npos) return Var::constant(Py_None);
    unsupported("torch._dynamo.graph_break()");
  }
  const auto& rules = CallRules::table(*this);
  auto it = rules.find(fn->known());
  return it == rules.end() ? nullptr : it->second(*this, fn, args, kwargs);
}

}  // namespace kiln::bind::detail
