// nn.Module calls and container modules during capture.
//
// A module call goes through nn.Module.__call__'s protocol (hooks, then forward). torch.nn's
// common layers have a rule here that turns the call into one op with the module's parameters
// and settings; the rules are keyed by the layer's `forward` function object, so a class matches
// a rule exactly when calling it would run that forward: torch's class or a subclass that keeps
// its forward. A user class that merely shares a name (timm's own `GELU`) or overrides forward
// is inlined like any user module. Container modules are recognised by isinstance against
// torch's classes, never by name.
#include <functional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"

namespace kiln::bind::detail {

namespace {

PyObject* nn_class(const char* name) { return object_at(std::string("torch.nn.") + name); }

bool instance_of(PyObject* obj, const char* nn_name) {
  PyObject* cls = nn_class(nn_name);
  if (!cls) {
    clear_error();
    return false;
  }
  int r = PyObject_IsInstance(obj, cls);
  if (r < 0) clear_error();
  return r == 1;
}

// The function `type(obj).forward` resolves to (borrowed), or nullptr.
PyObject* forward_of(PyObject* obj) {
  static PyObject* name = PyUnicode_InternFromString("forward");
  PyObject* f = _PyType_Lookup(Py_TYPE(obj), name);
  if (PyErr_Occurred()) clear_error();
  return f;
}

}  // namespace

// The module rules: each turns a call of one torch.nn layer into registry ops.
struct ModuleRules {
  using Rule = VarPtr (*)(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs& kw);

  // forward function of the layer class -> its rule
  static const std::unordered_map<PyObject*, Rule>& table() {
    static const std::unordered_map<PyObject*, Rule> t = [] {
      std::unordered_map<PyObject*, Rule> m;
      auto add = [&](const char* cls, Rule r) {
        PyObject* c = nn_class(cls);
        PyObject* f = c ? PyObject_GetAttrString(c, "forward") : nullptr;  // kept for the process
        if (!f) {
          clear_error();
          return;
        }
        m.emplace(f, r);
      };
      add("Linear", linear);
      add("ReLU", relu);
      add("SiLU", activation<Silu>);
      add("Hardswish", activation<Hardswish>);
      add("Hardsigmoid", activation<Hardsigmoid>);
      add("LeakyReLU", activation<LeakyRelu>);
      add("ELU", activation<Elu>);
      add("Softplus", activation<Softplus>);
      add("LayerNorm", layer_norm);
      add("Embedding", embedding);
      add("Sigmoid", unary<Sigmoid>);
      add("Tanh", unary<Tanh>);
      add("Identity", identity);
      add("Dropout", dropout);
      add("GELU", gelu);
      add("Softmax", softmax<false>);
      add("LogSoftmax", softmax<true>);
      add("Conv2d", conv2d);
      add("BatchNorm1d", batch_norm);
      add("BatchNorm2d", batch_norm);
      add("MaxPool2d", max_pool2d);
      add("AdaptiveAvgPool2d", adaptive_avg_pool2d);
      add("Flatten", flatten);
      add("Sequential", sequential);
      return m;
    }();
    return t;
  }

  static VarPtr fn(Interpreter& I, const char* path, std::vector<VarPtr> args, const Interpreter::KwArgs& kw = {}) {
    return I.call_op(*function_binding(I.resolve_torch_path(path)), std::move(args), kw);
  }
  static std::string type_name(const VarPtr& mod) { return Py_TYPE(mod->obj())->tp_name; }
  static void plain_call(const VarPtr& mod, const std::vector<VarPtr>& args, const Interpreter::KwArgs& kw) {
    if (args.size() != 1 || !kw.empty()) unsupported(type_name(mod) + " called with extra arguments");
  }

  static VarPtr linear(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs& kw) {
    plain_call(mod, args, kw);
    return fn(I, "torch.nn.functional.linear", {args[0], I.module_attr(mod, "weight"), I.module_attr(mod, "bias")});
  }
  static VarPtr relu(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs& kw) {
    if (I.module_attr(mod, "inplace")->known() != Py_True) return fn(I, "torch.relu", args, kw);
    if (args.size() != 1 || !args[0]->is_tensor()) unsupported("ReLU(inplace=True) on a non-tensor");
    I.check_inplace_target(args[0], "relu");
    return I.mutate(args[0], I.add_node("relu", {args[0]->node()}));
  }

  // Activations with settings: the functional form, the settings as keywords, and `inplace`.
  struct Silu { static constexpr const char* f = "torch.nn.functional.silu"; static constexpr const char* p[] = {nullptr}; };
  struct Hardswish { static constexpr const char* f = "torch.nn.functional.hardswish"; static constexpr const char* p[] = {nullptr}; };
  struct Hardsigmoid { static constexpr const char* f = "torch.nn.functional.hardsigmoid"; static constexpr const char* p[] = {nullptr}; };
  struct LeakyRelu { static constexpr const char* f = "torch.nn.functional.leaky_relu"; static constexpr const char* p[] = {"negative_slope", nullptr}; };
  struct Elu { static constexpr const char* f = "torch.nn.functional.elu"; static constexpr const char* p[] = {"alpha", nullptr}; };
  struct Softplus { static constexpr const char* f = "torch.nn.functional.softplus"; static constexpr const char* p[] = {"beta", "threshold", nullptr}; };
  template <class A>
  static VarPtr activation(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs& kw) {
    plain_call(mod, args, kw);
    Interpreter::KwArgs settings;
    for (const char* const* p = A::p; *p; ++p) settings.emplace_back(*p, I.module_attr(mod, *p));
    VarPtr r = fn(I, A::f, args, settings);
    PyObject* inplace = PyObject_GetAttrString(mod->obj(), "inplace");
    if (!inplace) clear_error();
    bool in_place = inplace == Py_True;
    Py_XDECREF(inplace);
    if (!in_place) return r;
    if (!args[0]->is_tensor()) unsupported(type_name(mod) + "(inplace=True) on a non-tensor");
    I.out_.guards.add_equals(Source::attr(mod->source, "inplace"), Py_True);
    I.check_inplace_target(args[0], type_name(mod));
    return I.mutate(args[0], r->node());
  }

  static VarPtr layer_norm(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    return fn(I, "torch.nn.functional.layer_norm",
              {args.at(0), I.module_attr(mod, "normalized_shape"), I.module_attr(mod, "weight"), I.module_attr(mod, "bias"),
               I.module_attr(mod, "eps")});
  }
  static VarPtr embedding(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    if (I.module_attr(mod, "max_norm")->known() != Py_None) unsupported("Embedding with max_norm renormalizes its weight in place");
    return fn(I, "torch.nn.functional.embedding", {args.at(0), I.module_attr(mod, "weight"), I.module_attr(mod, "padding_idx")},
              {{"scale_grad_by_freq", I.module_attr(mod, "scale_grad_by_freq")}, {"sparse", I.module_attr(mod, "sparse")}});
  }
  struct Sigmoid { static constexpr const char* f = "torch.sigmoid"; };
  struct Tanh { static constexpr const char* f = "torch.tanh"; };
  template <class U>
  static VarPtr unary(Interpreter& I, const VarPtr&, std::vector<VarPtr>& args, const Interpreter::KwArgs& kw) {
    return fn(I, U::f, args, kw);
  }
  static VarPtr identity(Interpreter&, const VarPtr&, std::vector<VarPtr>& args, const Interpreter::KwArgs&) { return args.at(0); }
  static VarPtr dropout(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    if (I.module_attr(mod, "training")->known() != Py_True) return args.at(0);
    return I.call(Var::constant(I.resolve_torch_path("torch.nn.functional.dropout")),
                  {args.at(0), I.module_attr(mod, "p"), I.module_attr(mod, "training"), I.module_attr(mod, "inplace")}, {});
  }
  static VarPtr gelu(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    return fn(I, "torch.nn.functional.gelu", args, {{"approximate", I.module_attr(mod, "approximate")}});
  }
  template <bool Log>
  static VarPtr softmax(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    VarPtr dim = I.module_attr(mod, "dim");
    if (dim->known() == Py_None) unsupported(type_name(mod) + " with dim=None");
    return fn(I, Log ? "torch.log_softmax" : "torch.softmax", {args.at(0), dim});
  }
  static VarPtr conv2d(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs& kw) {
    plain_call(mod, args, kw);
    VarPtr mode = I.module_attr(mod, "padding_mode");
    if (!PyUnicode_Check(mode->obj()) || std::string(PyUnicode_AsUTF8(mode->obj())) != "zeros")
      unsupported("Conv2d with padding_mode other than 'zeros'");
    VarPtr padding = I.module_attr(mod, "padding");
    if (padding->is_const() && PyUnicode_Check(padding->obj())) {
      // 'valid' is no padding; 'same' (stride 1, torch checks) pads dilation * (k - 1) in all,
      // evenly where that is even; an odd total torch pads one more on the right, not taken
      const std::string how = PyUnicode_AsUTF8(padding->obj());
      PyObject* ks = I.const_obj(I.module_attr(mod, "kernel_size"), "kernel_size");
      PyObject* dil = I.const_obj(I.module_attr(mod, "dilation"), "dilation");
      std::vector<int64_t> k, d, pad;
      if (!I.to_int_list(ks, k) || !I.to_int_list(dil, d) || k.size() != d.size()) unsupported("Conv2d with string padding");
      for (size_t i = 0; i < k.size(); ++i) {
        const int64_t total = how == "same" ? d[i] * (k[i] - 1) : 0;
        if (total % 2) unsupported("Conv2d with padding='same' and an even kernel (uneven padding)");
        pad.push_back(total / 2);
      }
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(pad.size()));
      for (size_t i = 0; i < pad.size(); ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(pad[i]));
      padding = Var::steal_constant(t);
    }
    return fn(I, "torch.nn.functional.conv2d",
              {args[0], I.module_attr(mod, "weight"), I.module_attr(mod, "bias"), I.module_attr(mod, "stride"), padding,
               I.module_attr(mod, "dilation"), I.module_attr(mod, "groups")});
  }
  static VarPtr batch_norm(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    VarPtr mean = I.module_attr(mod, "running_mean"), var = I.module_attr(mod, "running_var");
    bool no_stats = mean->is_const() && mean->known() == Py_None;
    // Training mode (batch statistics, running ones updated, num_batches_tracked counted): the
    // module's own forward, inlined.
    if (I.module_attr(mod, "training")->known() == Py_True || no_stats) return nullptr;
    return fn(I, "torch.nn.functional.batch_norm",
              {args.at(0), mean, var, I.module_attr(mod, "weight"), I.module_attr(mod, "bias")}, {{"eps", I.module_attr(mod, "eps")}});
  }
  static VarPtr max_pool2d(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    if (I.module_attr(mod, "return_indices")->known() == Py_True) return nullptr;  // its forward: torch's operator
    VarPtr stride = I.module_attr(mod, "stride");
    if (stride->is_const() && stride->known() == Py_None) stride = Var::tuple({});
    return fn(I, "torch.nn.functional.max_pool2d",
              {args.at(0), I.module_attr(mod, "kernel_size"), stride, I.module_attr(mod, "padding"), I.module_attr(mod, "dilation"),
               I.module_attr(mod, "ceil_mode")});
  }
  static VarPtr adaptive_avg_pool2d(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    return fn(I, "torch.nn.functional.adaptive_avg_pool2d", {args.at(0), I.module_attr(mod, "output_size")});
  }
  static VarPtr flatten(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    return fn(I, "torch.flatten", {args.at(0), I.module_attr(mod, "start_dim"), I.module_attr(mod, "end_dim")});
  }
  // Sequential (and subclasses that keep its forward): each child called on the last result.
  static VarPtr sequential(Interpreter& I, const VarPtr& mod, std::vector<VarPtr>& args, const Interpreter::KwArgs&) {
    VarPtr x = args.at(0);
    for (const std::string& name : I.module_keys(mod)) x = I.call(I.module_attr(mod, name.c_str()), {x}, {});
    return x;
  }
};

bool Interpreter::is_keyed_container(PyObject* m) { return instance_of(m, "ModuleDict") || instance_of(m, "ParameterDict"); }

bool Interpreter::is_container_module(PyObject* m) {
  return instance_of(m, "ModuleList") || instance_of(m, "Sequential") || instance_of(m, "ParameterList") || is_keyed_container(m);
}

Py_ssize_t Interpreter::module_children(const VarPtr& mod) {
  if (!is_container_module(mod->obj())) unsupported(std::string("len() or indexing of module ") + Py_TYPE(mod->obj())->tp_name);
  const bool params = instance_of(mod->obj(), "ParameterList") || instance_of(mod->obj(), "ParameterDict");
  const char* store = params ? "_parameters" : "_modules";
  PyObject* children = PyObject_GetAttrString(mod->obj(), store);
  if (!children || !PyDict_Check(children)) {
    Py_XDECREF(children);
    clear_error();
    unsupported("container module without " + std::string(store));
  }
  Py_ssize_t n = PyDict_Size(children);
  Py_DECREF(children);
  out_.guards.add_length(Source::attr(mod->source, store), n);
  return n;
}

std::vector<std::string> Interpreter::module_keys(const VarPtr& mod, bool guard_children) {
  module_children(mod);
  const bool params = instance_of(mod->obj(), "ParameterList") || instance_of(mod->obj(), "ParameterDict");
  PyObject* children = PyObject_GetAttrString(mod->obj(), params ? "_parameters" : "_modules");
  std::vector<std::string> names;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(children, &pos, &key, &value)) names.push_back(PyUnicode_AsUTF8(key));
  Py_DECREF(children);
  if (guard_children)
    for (const std::string& n : names) module_attr(mod, n.c_str());  // guards each child
  return names;
}

VarPtr Interpreter::call_module_method(VarPtr mod, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs) {
  if (is_keyed_container(mod->obj()) && args.empty() && (name == "keys" || name == "values" || name == "items")) {
    std::vector<VarPtr> out;
    for (const std::string& n : module_keys(mod)) {
      VarPtr k = real(PyUnicode_FromString(n.c_str()));
      if (name == "keys") out.push_back(k);
      else if (name == "values") out.push_back(module_attr(mod, n.c_str()));
      else out.push_back(Var::tuple({k, module_attr(mod, n.c_str())}));
    }
    return Var::tuple(std::move(out), true);
  }
  PyObject* key = PyUnicode_FromString(name.c_str());
  PyObject* f = _PyType_Lookup(Py_TYPE(mod->obj()), key);  // borrowed
  Py_DECREF(key);
  if (PyErr_Occurred()) clear_error();
  if (!f || !PyFunction_Check(f)) unsupported("method " + name + " of module " + Py_TYPE(mod->obj())->tp_name);
  if (VarPtr r = module_members(mod, f, args, kwargs)) return r;
  if (VarPtr r = module_to_no_op(mod, f, args, kwargs)) return r;
  args.insert(args.begin(), mod);
  // type(self).<name>: the function itself, so its defaults and closure are guarded.
  SourcePtr src = mod->source ? Source::attr(Source::attr(mod->source, "__class__"), name) : nullptr;
  return inline_call(f, src, std::move(args), kwargs);
}

// module.to(dtype) / .to(device) where every parameter and buffer is there already (Switch
// Transformers' router: `self.classifier = self.classifier.to(self.dtype)` in its forward): the
// module itself, as Module.to returns it after converting nothing. The parameters and buffers
// are read as graph inputs, so their dtypes and devices are guarded. nullptr: `f` is not
// Module.to, or the call would convert something (then the call is inlined, and breaks).
VarPtr Interpreter::module_to_no_op(const VarPtr& mod, PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  static PyObject* module_to = [] {
    PyObject* module = object_at("torch.nn.Module");
    PyObject* to = module ? PyObject_GetAttrString(module, "to") : nullptr;
    clear_error();
    return to;
  }();
  if (!module_to || f != module_to || !mod->source || mod->source->made_in_frame()) return nullptr;
  for (const VarPtr& a : args)
    if (!a->is_const() || a->symint().valid()) return nullptr;
  for (const auto& [k, v] : kwargs)
    if (!v->is_const() || v->symint().valid()) return nullptr;
  static PyObject* parse_to = object_at("torch._C._nn._parse_to");
  if (!parse_to) return nullptr;
  PyObject* parsed = call_for_real(parse_to, args, kwargs, "Module.to argument");
  if (!parsed) {
    clear_error();
    return nullptr;  // eager raises it: the inlined call does too
  }
  keep_.push_back(parsed);
  if (!PyTuple_Check(parsed) || PyTuple_GET_SIZE(parsed) < 4 || PyTuple_GET_ITEM(parsed, 3) != Py_None) return nullptr;
  PyObject* device = PyTuple_GET_ITEM(parsed, 0);
  PyObject* dtype = PyTuple_GET_ITEM(parsed, 1);
  DType want_dtype;
  if (dtype != Py_None && !dtype_from_object(dtype, want_dtype)) return nullptr;
  std::string want_device;
  if (device != Py_None) {
    PyObject* str = PyObject_Str(device);
    if (!str) {
      clear_error();
      return nullptr;
    }
    want_device = PyUnicode_AsUTF8(str);
    Py_DECREF(str);
  }
  PyObject* module = object_at("torch.nn.Module");
  for (const char* members : {"parameters", "buffers"}) {
    PyObject* fn = module ? PyObject_GetAttrString(module, members) : nullptr;
    clear_error();
    VarPtr list = fn ? module_members(mod, fn, {}, {}) : nullptr;
    Py_XDECREF(fn);
    if (!list) return nullptr;
    for (const VarPtr& t : items_of(list)) {
      if (!t->is_tensor()) return nullptr;
      const ir::TensorMeta& m = t->node()->meta;
      if (!want_device.empty() && m.device.str() != want_device) return nullptr;
      if (dtype != Py_None && is_floating(m.dtype) && m.dtype != want_dtype) return nullptr;
    }
  }
  return mod;
}

// nn.Module's own generators over its tree: parameters(), named_parameters(), buffers(),
// named_buffers(), children(), named_children(), modules(), named_modules(), in torch's order
// (each module before its children, members deduplicated by identity), as a list of trackers
// read through the modules' attributes (so `clip_grad_norm_(model.parameters())` and an L2 term
// over them are in the graph). Each module's `_modules` and member dict are guarded by length.
// nullptr: `f` is not one of them (a class that overrides it), or arguments it does not take.
VarPtr Interpreter::module_members(const VarPtr& mod, PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  enum class What { Parameters, Buffers, Children, Modules };
  struct Rule {
    PyObject* fn;
    What what;
    bool named;
  };
  static const std::vector<Rule> rules = [] {
    std::vector<Rule> r;
    PyObject* module = object_at("torch.nn.Module");
    auto add = [&](const char* name, What w, bool named) {
      PyObject* fn = module ? PyObject_GetAttrString(module, name) : nullptr;  // kept for the process
      if (fn) r.push_back({fn, w, named});
      clear_error();
    };
    add("parameters", What::Parameters, false);
    add("named_parameters", What::Parameters, true);
    add("buffers", What::Buffers, false);
    add("named_buffers", What::Buffers, true);
    add("children", What::Children, false);
    add("named_children", What::Children, true);
    add("modules", What::Modules, false);
    add("named_modules", What::Modules, true);
    return r;
  }();
  const Rule* rule = nullptr;
  for (const Rule& r : rules)
    if (r.fn == f) rule = &r;
  if (!rule || !mod->source) return nullptr;
  // Arguments: recurse (members), prefix (named), remove_duplicate (default True): constants.
  bool recurse = true, remove_duplicate = true;
  std::string prefix;
  const bool members = rule->what == What::Parameters || rule->what == What::Buffers;
  // the positional parameters of each (self excluded)
  std::vector<std::string> names;
  if (members) names = rule->named ? std::vector<std::string>{"prefix", "recurse", "remove_duplicate"} : std::vector<std::string>{"recurse"};
  else if (rule->what == What::Modules && rule->named) names = {"memo", "prefix", "remove_duplicate"};
  if (args.size() > names.size()) return nullptr;
  auto set = [&](const std::string& key, const VarPtr& v) {
    PyObject* o = const_obj(v, "module method argument");
    if (key == "recurse") recurse = PyObject_IsTrue(o) == 1;
    else if (key == "remove_duplicate") remove_duplicate = PyObject_IsTrue(o) == 1;
    else if (key == "prefix" && PyUnicode_Check(o)) prefix = PyUnicode_AsUTF8(o);
    else if (key == "memo" && o == Py_None) {}
    else return false;
    return true;
  };
  for (size_t i = 0; i < args.size(); ++i)
    if (!set(names[i], args[i])) return nullptr;
  for (const auto& [k, v] : kwargs)
    if (!set(k, v)) return nullptr;
  // The modules in torch's order, each with its tracker and name prefix.
  std::vector<std::pair<std::string, VarPtr>> tree;
  std::set<PyObject*> seen_modules;
  std::function<void(const VarPtr&, const std::string&)> walk = [&](const VarPtr& m, const std::string& at) {
    if (remove_duplicate && !seen_modules.insert(m->obj()).second) return;
    tree.emplace_back(at, m);
    PyObject* children = PyObject_GetAttrString(m->obj(), "_modules");
    if (!children || !PyDict_Check(children)) {
      Py_XDECREF(children);
      clear_error();
      unsupported("module without _modules");
    }
    keep_.push_back(children);
    // the names in order: the walk follows it (a child moved to the end changes it)
    out_.guards.add_key_order(Source::attr(m->source, "_modules"), children);
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    std::vector<std::string> keys;
    while (PyDict_Next(children, &pos, &k, &v)) keys.push_back(PyUnicode_AsUTF8(k));
    const bool deeper = rule->what == What::Modules || (members && recurse);
    for (const std::string& n : keys) {
      VarPtr c = module_attr(m, n.c_str());
      if (c->kind() != Var::Kind::Module) continue;  // None
      if (rule->what == What::Children) {
        tree.emplace_back(n, c);
        continue;
      }
      if (deeper) walk(c, at + (at.empty() ? "" : ".") + n);
    }
  };
  if (rule->what == What::Children) {
    walk(mod, "");
    tree.erase(tree.begin());  // the children, not the module itself
  } else {
    walk(mod, prefix);
  }
  std::vector<VarPtr> out;
  auto emit = [&](const std::string& name, const VarPtr& v) {
    out.push_back(rule->named ? Var::tuple({real(PyUnicode_FromString(name.c_str())), v}) : v);
  };
  if (!members) {
    for (const auto& [name, m] : tree) emit(name, m);
    return Var::iterator(std::move(out));
  }
  std::set<PyObject*> seen;
  const char* store = rule->what == What::Parameters ? "_parameters" : "_buffers";
  for (const auto& [at, m] : tree) {
    PyObject* dict = PyObject_GetAttrString(m->obj(), store);
    if (!dict || !PyDict_Check(dict)) {
      Py_XDECREF(dict);
      clear_error();
      unsupported(std::string("module without ") + store);
    }
    keep_.push_back(dict);
    out_.guards.add_key_order(Source::attr(m->source, store), dict);  // the order they come in
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    std::vector<std::pair<std::string, PyObject*>> items;
    while (PyDict_Next(dict, &pos, &k, &v)) items.emplace_back(PyUnicode_AsUTF8(k), v);
    for (const auto& [n, obj] : items) {
      VarPtr t = module_attr(m, n.c_str());  // guarded: None stays None
      if (obj == Py_None || (remove_duplicate && !seen.insert(obj).second)) continue;
      emit(at + (at.empty() ? "" : ".") + n, t);
    }
  }
  return Var::iterator(std::move(out));
}

VarPtr Interpreter::make_torch_module(PyObject* cls, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  // The module classes torch.nn exports, by identity: their constructors only set attributes
  // and create parameters, and none is made here.
  static const std::unordered_set<PyObject*> classes = [] {
    std::unordered_set<PyObject*> out;
    PyObject* nn = PyImport_ImportModule("torch.nn");
    PyObject* module_type = nn ? PyObject_GetAttrString(nn, "Module") : nullptr;
    PyObject* d = nn ? PyModule_GetDict(nn) : nullptr;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (d && module_type && PyDict_Next(d, &pos, &k, &v))
      if (PyType_Check(v) && v != module_type && PyObject_IsSubclass(v, module_type) == 1) out.insert(Py_NewRef(v));
    Py_XDECREF(module_type);
    Py_XDECREF(nn);
    clear_error();
    return out;
  }();
  if (!classes.count(cls)) return nullptr;
  const std::string name = reinterpret_cast<PyTypeObject*>(cls)->tp_name;
  // The arguments as Python objects (new references): constants, modules made here, and lists
  // or tuples of them (nn.ModuleList([...])).
  bool constants_only = true;  // no module in the arguments: the call can be made again per call
  std::function<PyObject*(const VarPtr&)> value = [&](const VarPtr& a) -> PyObject* {
    if (a->kind() == Var::Kind::Module) {
      constants_only = false;
      // Only modules made here too: a caller's module read through the new one's Made source
      // would have its attributes unguarded.
      if (!a->source || !a->source->made_in_frame()) unsupported("nn." + name + " built in the function around a module of the caller's");
      return Py_NewRef(a->obj());
    }
    if (a->kind() == Var::Kind::Tuple || a->kind() == Var::Kind::List) {
      const auto& items = a->seq();
      PyObject* out = a->kind() == Var::Kind::List ? PyList_New(static_cast<Py_ssize_t>(items.size()))
                                                   : PyTuple_New(static_cast<Py_ssize_t>(items.size()));
      for (size_t i = 0; i < items.size(); ++i) {
        PyObject* item = value(items[i]);
        if (a->kind() == Var::Kind::List) PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), item);
        else PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), item);
      }
      keep_.push_back(out);
      return Py_NewRef(out);
    }
    if (!a->is_const() || a->symint().valid()) unsupported("nn." + name + " built in the function from a tensor or a traced value");
    return Py_NewRef(a->obj());
  };
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
  for (size_t i = 0; i < args.size(); ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), value(args[i]));
  PyObject* kw = PyDict_New();
  for (const auto& [k, v] : kwargs) {
    PyObject* o = value(v);
    PyDict_SetItemString(kw, k.c_str(), o);
    Py_DECREF(o);
  }
  // Built with torch's CPU generator put back as it was: a module that draws its parameters
  // (and is refused below) must leave the numbers eager draws after it unchanged. (A `device`
  // argument could draw on a GPU's generator: such calls are not built here.)
  for (const auto& [k, v] : kwargs)
    if (k == "device") unsupported("nn." + name + " built in the function on a device");
  static PyObject* torch_mod = PyImport_ImportModule("torch");
  PyObject* rng = torch_mod ? PyObject_CallMethod(torch_mod, "get_rng_state", nullptr) : nullptr;
  if (!rng) real(nullptr);
  PyObject* m = PyObject_Call(cls, t, kw);
  if (!m) clear_error();  // reported below; eager raises it again
  // The same call, kept to build the module again where the program hands it out.
  PyObject* maker = nullptr;
  if (m && constants_only) {
    static PyObject* partial = object_at("functools.partial");
    PyObject* head = PyTuple_Pack(1, cls);
    PyObject* call_args = head ? PySequence_Concat(head, t) : nullptr;
    maker = partial && call_args ? PyObject_Call(partial, call_args, kw) : nullptr;
    Py_XDECREF(head);
    Py_XDECREF(call_args);
    if (!maker) clear_error();  // then it is not handed out
  }
  PyObject* restored = PyObject_CallMethod(torch_mod, "set_rng_state", "O", rng);
  Py_DECREF(rng);
  Py_XDECREF(restored);
  Py_DECREF(t);
  Py_DECREF(kw);
  if (!restored) {
    Py_XDECREF(m);
    Py_XDECREF(maker);
    real(nullptr);
  }
  if (maker) keep_.push_back(maker);
  if (!m) {
    clear_error();
    unsupported("nn." + name + " raised when built");  // eager raises it again
  }
  keep_.push_back(m);
  if (const char* owned = fresh_state(m, false)) {
    // Its parameters and buffers are drawn or filled afresh at every call: the call builds it
    // again, as eager does, and the graph reads them as inputs (Source::built).
    if (!maker) unsupported("nn." + name + " built in the function around other modules owns " + owned);
    return Var::module(m, Source::built(m, maker));
  }
  if (maker) root()->module_makers_[m] = maker;
  return Var::module(m, Source::made(m));
}

OutSpec Interpreter::module_spec(const VarPtr& v) {
  if (v->source && !v->source->made_in_frame()) return source_spec(v->source);
  Interpreter* r = root();
  // (A module built at every call that owns parameters has no maker here: building it again
  // would draw other parameters than the graph used.)
  auto maker = r->module_makers_.find(v->obj());
  bool changed = false;
  for (const AttrStore& st : r->attr_stores_) changed |= st.obj == v->obj();
  if (maker == r->module_makers_.end() || changed)
    unsupported("hands out a module built in the function that kiln cannot build again (built around other modules, "
                "changed after construction, or owning parameters drawn at every call)");
  OutSpec kw;
  kw.kind = OutSpec::Kind::Dict;
  kw.value = PyTuple_New(0);
  OutSpec s;
  s.kind = OutSpec::Kind::Construct;
  s.value = Py_NewRef(maker->second);
  s.items.push_back(std::move(kw));
  auto [it, fresh] = r->break_memo_.emplace(v.get(), static_cast<int>(r->break_memo_.size()));
  s.memo = it->second;
  r->out_.output_memo_slots = static_cast<int>(r->break_memo_.size());
  return s;
}

const char* Interpreter::fresh_state(PyObject* m, bool tensor_attributes) {
  // Its parameters and buffers (a child's too) would be drawn or filled at every call.
  for (const char* owned : {"parameters", "buffers"}) {
    PyObject* it = PyObject_CallMethod(m, owned, nullptr);
    PyObject* first = it ? PyIter_Next(it) : nullptr;
    Py_XDECREF(it);
    const bool any = first || PyErr_Occurred();
    Py_XDECREF(first);
    clear_error();
    if (any) return owned;
  }
  if (!tensor_attributes) return nullptr;
  static PyObject* tensor_type = object_at("torch.Tensor");
  PyObject* mods = PyObject_CallMethod(m, "modules", nullptr);
  PyObject* it = mods ? PyObject_GetIter(mods) : nullptr;
  Py_XDECREF(mods);
  bool owns = !it;  // a module that cannot list its children is not taken
  while (it && !owns) {
    PyObject* sub = PyIter_Next(it);
    if (!sub) break;
    PyObject* d = PyObject_GenericGetDict(sub, nullptr);
    Py_DECREF(sub);
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (d && !owns && PyDict_Next(d, &pos, &k, &v)) owns = PyObject_IsInstance(v, tensor_type) == 1;
    Py_XDECREF(d);
  }
  Py_XDECREF(it);
  clear_error();
  return owns ? "tensors" : nullptr;
}

namespace {

// Whether `name` is a tensor of module `m` that torch.nn.utils.parametrize computes (its
// parametrizations ModuleDict has an entry of that name).
bool parametrized(PyObject* m, const char* name) {
  PyObject* children = PyObject_GenericGetDict(m, nullptr);
  PyObject* modules = children ? PyDict_GetItemString(children, "_modules") : nullptr;  // borrowed
  PyObject* p = modules && PyDict_Check(modules) ? PyDict_GetItemString(modules, "parametrizations") : nullptr;
  PyObject* entries = p ? PyObject_GetAttrString(p, "_modules") : nullptr;
  const bool found = entries && PyDict_Check(entries) && PyDict_GetItemString(entries, name);
  Py_XDECREF(entries);
  Py_XDECREF(children);
  PyErr_Clear();
  return found;
}

}  // namespace

VarPtr Interpreter::module_attr(const VarPtr& mod, const char* name) {
  // What the frame stored there earlier in this capture (module.eval() sets `training`).
  if (const AttrStore* st = logged_attr(mod->obj(), name)) {
    if (!st->value) unsupported(std::string("read of attribute ") + name + " deleted during capture: AttributeError");
    return st->value;
  }
  // A parametrized tensor (torch.nn.utils.parametrize makes `weight` a property of the module's
  // class, computed from `parametrizations.weight`) is its getter inlined, as any code: reading
  // it for real here would run the parametrization once more than eager does (spectral_norm's
  // power iteration, a counter kept in a parametrization).
  if (PyObject* key = parametrized(mod->obj(), name) ? PyUnicode_FromString(name) : nullptr) {
    PyObject* descr = _PyType_Lookup(Py_TYPE(mod->obj()), key);  // borrowed
    Py_DECREF(key);
    if (descr && PyObject_TypeCheck(descr, &PyProperty_Type)) {
      PyObject* fget = PyObject_GetAttrString(descr, "fget");
      if (!fget) clear_error();
      if (fget && PyFunction_Check(fget)) {
        keep_.push_back(fget);
        return call(Var::constant(fget), {mod}, {});
      }
      Py_XDECREF(fget);
    }
  }
  PyObject* v = PyObject_GetAttrString(mod->obj(), name);
  if (!v) {
    clear_error();
    unsupported(std::string("module has no attribute ") + name);
  }
  if (PyMethod_Check(v) && PyMethod_GET_SELF(v) == mod->obj()) {
    // Bound methods are made afresh at each access: track the method, not the object.
    Py_DECREF(v);
    return Var::method(mod, name);
  }
  // a module's own tensors (parameters, buffers, cached tables) stay static under dynamic=True
  Interpreter* root_it = root();
  const bool was = root_it->module_state_;
  root_it->module_state_ = true;
  VarPtr r;
  try {
    r = wrap(v, Source::attr(mod->source, name));
  } catch (...) {
    root_it->module_state_ = was;
    Py_DECREF(v);
    throw;
  }
  root_it->module_state_ = was;
  Py_DECREF(v);
  return r;
}

VarPtr Interpreter::call_module(VarPtr mod, std::vector<VarPtr> args, const KwArgs& kwargs) {
  PyObject* m = mod->obj();
  Interpreter* r = root();
  // A class that overrides nn.Module.__call__: its own __call__ is what m(x) runs.
  static PyObject* module_call = [] {
    PyObject* cls = object_at("torch.nn.Module");
    PyObject* c = cls ? PyObject_GetAttrString(cls, "__call__") : nullptr;  // kept for the process
    clear_error();
    return c;
  }();
  static PyObject* call_name = PyUnicode_InternFromString("__call__");
  if (PyObject* own = _PyType_Lookup(Py_TYPE(m), call_name); own && module_call && own != module_call) {
    if (!PyFunction_Check(own)) unsupported(std::string("module ") + Py_TYPE(m)->tp_name + " with a __call__ of its own in C");
    keep_.push_back(Py_NewRef(own));
    args.insert(args.begin(), mod);
    return inline_call(own, nullptr, std::move(args), kwargs);
  }
  if (!r->global_hooks_checked_) {
    r->global_hooks_checked_ = true;
    static PyObject* mm = [] {
      PyObject* mod = PyImport_ImportModule("torch.nn.modules.module");
      PyObject* d = mod ? PyModule_GetDict(mod) : nullptr;
      Py_XINCREF(d);
      Py_XDECREF(mod);
      clear_error();
      return d;
    }();
    for (const char* g : {"_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                          "_global_backward_pre_hooks"}) {
      PyObject* d = mm ? PyDict_GetItemString(mm, g) : nullptr;
      if (!d || !PyDict_Check(d)) continue;
      if (PyDict_Size(d) > 0) unsupported("global module hooks are not captured yet");
      out_.guards.add_length(Source::global(g, mm), 0);
    }
  }
  // Backward hooks (register_full_backward_hook, register_full_backward_pre_hook) run in
  // autograd's backward through torch's BackwardHook wrappers, which a compiled backward has
  // none of: such a module's call runs in Python, where they fire (a hook added later is a
  // guard failure).
  for (const char* h : {"_backward_hooks", "_backward_pre_hooks"}) {
    PyObject* d = PyObject_GetAttrString(m, h);
    if (!d) {
      clear_error();
      continue;
    }
    const Py_ssize_t n = PyDict_Check(d) ? PyDict_Size(d) : 0;
    Py_DECREF(d);
    if (n > 0) unsupported("a module with backward hooks runs in Python (its hooks fire in autograd's backward)");
    if (mod->source) out_.guards.add_length(Source::attr(mod->source, h), 0);
  }
  std::vector<VarPtr> pre_hooks, post_hooks;
  for (const char* h : {"_forward_pre_hooks", "_forward_hooks"}) {
    PyObject* d = PyObject_GetAttrString(m, h);
    if (!d) clear_error();
    if (d && PyDict_Check(d)) {
      keep_.push_back(d);
      if (!mod->source) {
        if (PyDict_Size(d)) unsupported("hooks on a module with no known source");
      } else {
        SourcePtr ds = Source::attr(mod->source, h);
        out_.guards.add_length(ds, PyDict_Size(d));
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(d, &pos, &k, &v))
          (h[9] == 'p' ? pre_hooks : post_hooks).push_back(wrap(v, Source::key_of(ds, k)));
      }
    } else {
      Py_XDECREF(d);
    }
  }
  if (!pre_hooks.empty() || !post_hooks.empty()) {
    for (const char* h : {"_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs"}) {
      PyObject* d = PyObject_GetAttrString(m, h);
      if (!d) clear_error();
      bool any = d && PyObject_Length(d) > 0;
      Py_XDECREF(d);
      clear_error();
      if (any) unsupported("forward hooks with keyword arguments are not captured yet");
    }
  }
  for (const VarPtr& hook : pre_hooks) {
    VarPtr res = call(hook, {mod, Var::tuple(args)}, {});
    if (res->is_const() && res->known() == Py_None) continue;
    args = res->kind() == Var::Kind::Tuple ? res->seq() : std::vector<VarPtr>{res};
  }
  VarPtr out = call_module_body(mod, args, kwargs);
  for (const VarPtr& hook : post_hooks) {
    VarPtr res = call(hook, {mod, Var::tuple(args), out}, {});
    if (!(res->is_const() && res->known() == Py_None)) out = res;
  }
  return out;
}

VarPtr Interpreter::call_module_body(VarPtr mod, std::vector<VarPtr> args, const KwArgs& kwargs) {
  // A forward set on the instance (`mod.forward = ...`, a patch) is what nn.Module.__call__ runs,
  // guarded where it is read.
  if (PyObject* d = PyObject_GenericGetDict(mod->obj(), nullptr)) {
    PyObject* own = PyDict_GetItemString(d, "forward");  // borrowed
    VarPtr f = own ? (mod->source ? wrap(own, Source::attr(mod->source, "forward")) : Var::constant(own)) : nullptr;
    Py_DECREF(d);
    if (f) return call(f, std::move(args), kwargs);
  } else {
    clear_error();
  }
  PyObject* forward = forward_of(mod->obj());
  const auto& rules = ModuleRules::table();
  if (auto it = rules.find(forward); forward && it != rules.end()) {
    // The class is torch's own, or keeps its forward: the rule reads what that forward reads.
    // Its guards: the module is held by identity (wrap), so its class cannot change under them.
    if (VarPtr out = it->second(*this, mod, args, kwargs)) return out;  // nullptr: the rule leaves this call to forward
  }
  if (!forward || !PyFunction_Check(forward))
    unsupported(std::string("module ") + Py_TYPE(mod->obj())->tp_name + " has no Python forward");
  keep_.push_back(Py_NewRef(forward));
  // Any other module (torch.nn's own without a rule included): its forward inlined with the
  // module as self; the torch functions it calls become ops or extern calls.
  args.insert(args.begin(), mod);
  // A forward with a closure (a decorator's wrapper: HF's experts dispatch through an interface
  // object it closed over) reads its cells through its source, so what it calls on them is
  // guarded and inlined; a plain forward needs none (the module is held by identity).
  SourcePtr source = PyFunction_GET_CLOSURE(forward) && mod->source
                         ? Source::attr(Source::attr(mod->source, "__class__"), "forward")
                         : nullptr;
  return inline_call(forward, std::move(source), std::move(args), kwargs);
}

}  // namespace kiln::bind::detail
