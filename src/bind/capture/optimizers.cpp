// torch.optim's SGD, Adam and AdamW steps and Optimizer.zero_grad, captured as their update
// math rather than by inlining torch's Python (hooks, grouping by device, foreach calls, state
// bookkeeping): each parameter's update is a chain of pointwise graph nodes that fuses into one
// kernel, written back into the parameter and its state in place, and the scheduler's foreach
// grouping launches those kernels together, as torch's multi-tensor kernels do.
//
// What the update reads is guarded as any other capture reads it: the optimizer's type, its
// hooks (none), each group's flags and the parameters, gradients and state tensors. The
// hyperparameters that are floats (lr, betas, eps, weight decay, momentum, dampening) are not
// guarded by value: they are scalar inputs, read at each call, so an LR scheduler that changes
// the rate every step never recompiles. A value that is zero at capture (weight decay,
// momentum) stays guarded equal to zero, since eager then leaves its terms out altogether.
// The step count of Adam's state, a 0-d CPU tensor unless capturable, is read at each call as
// a scalar input and incremented on the host after the graph (CaptureResult::ScalarInput).
#include <cmath>

#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"
#include "bind/torch/tensor_bridge.h"

namespace kiln::bind::detail {

namespace {

// The function under decorators (functools.wraps' __wrapped__ chain): torch wraps a class's
// step once per class (profile_hook_step) and an LR scheduler wraps an instance's.
PyObject* unwrapped(PyObject* f) {
  for (int depth = 0; f && depth < 8; ++depth) {
    PyObject* inner = PyObject_GetAttrString(f, "__wrapped__");
    if (!inner) {
      clear_error();
      return f;
    }
    Py_DECREF(inner);  // kept alive by the wrapper's __dict__
    f = inner;
  }
  return f;
}

struct OptimizerKinds {
  PyObject* sgd = nullptr;
  PyObject* adam = nullptr;
  PyObject* adamw = nullptr;
  PyObject* sgd_step = nullptr;
  PyObject* adam_step = nullptr;
  PyObject* zero_grad = nullptr;
  PyObject* global_hooks = nullptr;  // torch.optim.optimizer's module dict
};

const OptimizerKinds& kinds() {
  static const OptimizerKinds k = [] {
    OptimizerKinds o;
    o.sgd = object_at("torch.optim.SGD");
    o.adam = object_at("torch.optim.Adam");
    o.adamw = object_at("torch.optim.AdamW");
    PyObject* opt = object_at("torch.optim.Optimizer");
    auto method = [](PyObject* cls, const char* name) -> PyObject* {
      if (!cls) return nullptr;
      PyObject* f = PyObject_GetAttrString(cls, name);
      if (!f) return clear_error(), nullptr;
      PyObject* u = unwrapped(f);
      Py_INCREF(u);
      Py_DECREF(f);
      return u;  // kept for the process
    };
    o.sgd_step = method(o.sgd, "step");
    o.adam_step = method(o.adam, "step");
    o.zero_grad = method(opt, "zero_grad");
    PyObject* mod = PyImport_ImportModule("torch.optim.optimizer");
    if (mod) o.global_hooks = PyModule_GetDict(mod);  // the module stays imported
    clear_error();
    return o;
  }();
  return k;
}

// A borrowed item of a dict, or nullptr.
PyObject* item(PyObject* dict, const char* key) {
  PyObject* v = PyDict_Check(dict) ? PyDict_GetItemString(dict, key) : nullptr;
  return v;
}

}  // namespace

VarPtr Interpreter::optimizer_method(const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
  PyObject* f = fn->obj();
  const OptimizerKinds& k = kinds();
  if (!k.sgd || !k.adam) return nullptr;
  // The receiver: a bound method's __self__, or the object an LR scheduler's wrapper of
  // `opt.step` was read from (an instance attribute: a plain function).
  PyObject* self = nullptr;
  SourcePtr self_src;
  PyObject* func = nullptr;
  bool scheduler_wrapper = false, self_in_args = false;
  if (PyMethod_Check(f)) {
    self = PyMethod_GET_SELF(f);
    func = unwrapped(PyMethod_GET_FUNCTION(f));
    if (fn->source) self_src = Source::attr(fn->source, "__self__");
  } else if (PyFunction_Check(f) && fn->source && fn->source->kind == Source::Kind::Attr && fn->source->name == "step") {
    PyObject* marker = PyObject_GetAttrString(f, "_wrapped_by_lr_sched");
    if (!marker) return clear_error(), nullptr;
    Py_DECREF(marker);
    self_src = fn->source->base;
    func = unwrapped(f);
    scheduler_wrapper = true;
  } else if (PyFunction_Check(f) && !args.empty() && args[0]->is_const() && args[0]->source) {
    // Optimizer.step(opt) called as a function with the optimizer first: torch's own wrapper
    // (profile_hook_step) calls it so, under `kiln.compile(opt.step)`
    func = unwrapped(f);
    if (func != k.zero_grad && func != k.sgd_step && func != k.adam_step) return nullptr;
    self = args[0]->obj();
    self_src = args[0]->source;
    self_in_args = true;
  } else {
    return nullptr;
  }
  const bool zero_grad = func == k.zero_grad;
  const bool sgd_step = func == k.sgd_step, adam_step = func == k.adam_step;
  if (!zero_grad && !sgd_step && !adam_step) return nullptr;
  if (!self_src) unsupported("optimizer method of an object kiln has no source for");
  if (scheduler_wrapper) {
    // The wrapper's receiver: the optimizer its closure holds a weakref to, the object it was
    // read from (an instance attribute, so reading it guarded the wrapper's identity).
    PyObject* cells = PyFunction_GET_CLOSURE(f);
    for (Py_ssize_t i = 0; cells && !self && i < PyTuple_GET_SIZE(cells); ++i) {
      PyObject* c = PyCell_GET(PyTuple_GET_ITEM(cells, i));
      if (c && PyWeakref_CheckRef(c)) {
        PyObject* o = PyObject_CallNoArgs(c);
        if (o && o != Py_None) keep_.push_back(o), self = o;
        else Py_XDECREF(o);
      }
    }
    clear_error();
  }
  if (!self) unsupported("optimizer object not found");
  PyObject* cls = reinterpret_cast<PyObject*>(Py_TYPE(self));
  const bool is_sgd = cls == k.sgd, is_adam = cls == k.adam || (k.adamw && cls == k.adamw);
  if (!is_sgd && !is_adam) return nullptr;  // a subclass of its own: inlined as any code
  if ((sgd_step && !is_sgd) || (adam_step && !is_adam)) return nullptr;
  out_.guards.add_type(self_src, cls);
  if (self_in_args) args.erase(args.begin());
  if (zero_grad) return optimizer_zero_grad(self, self_src, args, kwargs);
  if (!args.empty() || !kwargs.empty()) unsupported("optimizer step with a closure or arguments");
  optimizer_step(self, self_src, is_sgd, cls == k.adamw);
  if (scheduler_wrapper) {  // the wrapper marks the step taken, for the scheduler's warning
    keep_.push_back(Py_NewRef(self));
    root()->attr_stores_.push_back(AttrStore{self, "_opt_called", Var::constant(Py_True), self_src});
  }
  return Var::constant(Py_None);
}

void Interpreter::without_grad(const std::function<void()>& body, bool autocast_off) {
  ModeChange change{false, std::nullopt};
  if (autocast_off) change.autocast = AutocastState{};
  ModeChange saved = enter_modes(change);
  try {
    body();
  } catch (...) {
    enter_modes(saved);
    throw;
  }
  enter_modes(saved);
}

void Interpreter::each_optimizer_param(PyObject* self, const SourcePtr& self_src,
                                       const std::function<void(PyObject*, const SourcePtr&)>& on_group,
                                       const std::function<void(PyObject*, const SourcePtr&, PyObject*, const SourcePtr&)>& on_param) {
  PyObject* groups = PyObject_GetAttrString(self, "param_groups");
  if (!groups) real(nullptr);
  keep_.push_back(groups);
  if (!PyList_CheckExact(groups)) unsupported("optimizer param_groups is not a list");
  const SourcePtr groups_src = Source::attr(self_src, "param_groups");
  out_.guards.add_type(groups_src, reinterpret_cast<PyObject*>(&PyList_Type));
  out_.guards.add_length(groups_src, PyList_GET_SIZE(groups));
  PyObject* key = PyUnicode_InternFromString("params");
  keep_.push_back(key);
  for (Py_ssize_t gi = 0; gi < PyList_GET_SIZE(groups); ++gi) {
    PyObject* group = PyList_GET_ITEM(groups, gi);
    const SourcePtr group_src = Source::item(groups_src, gi);
    PyObject* params = item(group, "params");
    if (!PyDict_CheckExact(group) || !params || !PyList_CheckExact(params)) unsupported("optimizer param group layout");
    out_.guards.add_type(group_src, reinterpret_cast<PyObject*>(&PyDict_Type));
    const SourcePtr params_src = Source::key_of(group_src, key);
    out_.guards.add_type(params_src, reinterpret_cast<PyObject*>(&PyList_Type));
    out_.guards.add_length(params_src, PyList_GET_SIZE(params));
    if (on_group) on_group(group, group_src);
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(params); ++j) {
      PyObject* p = PyList_GET_ITEM(params, j);
      const SourcePtr p_src = Source::item(params_src, j);
      PyObject* grad = PyObject_GetAttrString(p, "grad");
      if (!grad) real(nullptr);
      keep_.push_back(grad);
      const SourcePtr grad_src = Source::attr(p_src, "grad");
      if (grad == Py_None) {  // skipped, as eager skips it
        out_.guards.add_equals(grad_src, Py_None);
        continue;
      }
      on_param(p, p_src, grad, grad_src);
    }
  }
}

VarPtr Interpreter::optimizer_zero_grad(PyObject* self, const SourcePtr& self_src, std::vector<VarPtr>& args, KwArgs& kwargs) {
  bool set_to_none = true;
  if (args.size() > 1) unsupported("zero_grad with extra arguments");
  VarPtr flag = !args.empty() ? args[0] : nullptr;
  for (auto& [name, v] : kwargs) {
    if (name != "set_to_none") unsupported("zero_grad keyword " + name);
    flag = v;
  }
  if (flag) {
    PyObject* o = const_obj(flag, "set_to_none");
    set_to_none = PyObject_IsTrue(o) == 1;
  }
  without_grad([&] {
    each_optimizer_param(self, self_src, nullptr, [&](PyObject* p, const SourcePtr& p_src, PyObject* grad, const SourcePtr& grad_src) {
      if (set_to_none) {
        // p.grad = None, replayed on the caller's tensor after the graph (attr_stores.cpp)
        wrap(grad, grad_src);  // guarded as a tensor, so an entry never meets a grad of None here
        keep_.push_back(Py_NewRef(p));
        root()->attr_stores_.push_back(AttrStore{p, "grad", Var::constant(Py_None), p_src});
      } else {
        // p.grad.zero_(): zeros written into the gradient (foreach_zero_ in eager)
        VarPtr g = wrap(grad, grad_src);
        if (!g->is_tensor()) unsupported("a gradient that is not a tensor");
        check_inplace_target(g, "zero_");
        const ir::TensorMeta& m = g->node()->meta;
        ir::Attrs a;
        a.set("size", m.sizes);
        a.set("value", 0.0);
        a.set("dtype", m.dtype);
        a.set("device", m.device.str());
        mutate(g, add_node("full", {}, a));
      }
    });
  });
  return Var::constant(Py_None);
}


ir::Node* Interpreter::scalar_input(const SourcePtr& src, bool counter) {
  ir::Node*& known = root()->scalar_input_nodes_[(counter ? "count " : "") + src->str()];
  if (known) return known;
  ir::Attrs a;
  a.set("index", static_cast<int64_t>(g_->scalar_inputs));
  a.set("dtype", DType::Float64);
  ir::Node* n = add_node("scalar_input", {}, a);
  ++g_->scalar_inputs;
  out_.scalar_inputs.push_back({src, 0});
  return known = n;
}

// The counter at `src` after one more step of this call: its value read at the call, plus the
// steps taken so far in the graph (two opt.step() in one call count 1 and 2). The runtime adds
// them all to the counter after the graph.
ir::Node* Interpreter::counter_step(const SourcePtr& src) {
  ir::Node* base = scalar_input(src, true);
  for (CaptureResult::ScalarInput& in : root()->out_.scalar_inputs)
    if (in.source->str() == src->str()) {
      ++in.counter;
      return add_node("add", {base, g_->scalar(static_cast<double>(in.counter), DType::Float64)});
    }
  unsupported("a step counter without its input");
}

namespace {

// One parameter group's settings, as its dict holds them.
struct GroupSettings {
  ir::Node* lr = nullptr;
  ir::Node* weight_decay = nullptr;  // nullptr: zero (guarded), eager leaves the term out
  ir::Node* momentum = nullptr;      // SGD; nullptr: zero
  ir::Node* dampening = nullptr;
  ir::Node* beta1 = nullptr;         // Adam
  ir::Node* beta2 = nullptr;
  ir::Node* eps = nullptr;
  bool maximize = false, nesterov = false, amsgrad = false, decoupled = false, capturable = false;
};

}  // namespace

void Interpreter::optimizer_step(PyObject* self, const SourcePtr& self_src, bool sgd, bool adamw) {
  const OptimizerKinds& k = kinds();
  // torch's step wrapper runs global and per-optimizer hooks: none, guarded.
  for (const char* h : {"_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"}) {
    PyObject* d = PyObject_GetAttrString(self, h);
    if (!d) real(nullptr);
    keep_.push_back(d);
    if (!PyDict_Check(d) || PyDict_GET_SIZE(d) != 0) unsupported(std::string("optimizer with step hooks (") + h + ")");
    out_.guards.add_length(Source::attr(self_src, h), 0);
  }
  for (const char* h : {"_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"}) {
    PyObject* d = k.global_hooks ? PyDict_GetItemString(k.global_hooks, h) : nullptr;
    if (!d) continue;
    if (!PyDict_Check(d) || PyDict_GET_SIZE(d) != 0) unsupported(std::string("global optimizer step hooks (") + h + ")");
    out_.guards.add_length(Source::global(h, k.global_hooks), 0);
  }
  PyObject* state = PyObject_GetAttrString(self, "state");
  if (!state) real(nullptr);
  keep_.push_back(state);
  if (!PyDict_Check(state)) unsupported("optimizer state of an unexpected type");
  const SourcePtr state_src = Source::attr(self_src, "state");
  GroupSettings gs;  // the settings of the group whose parameters are being updated
  auto on_group = [&](PyObject* group, const SourcePtr& group_src) {
    gs = GroupSettings{};
    auto key_src = [&](const char* name) {
      PyObject* key = PyUnicode_InternFromString(name);
      keep_.push_back(key);
      return Source::key_of(group_src, key);
    };
    // A flag: guarded by value.
    auto flag = [&](const char* name, bool fallback) {
      PyObject* v = item(group, name);
      if (!v) return fallback;
      if (v != Py_None && !PyBool_Check(v)) unsupported(std::string("optimizer setting ") + name + " that is not a bool");
      out_.guards.add_equals(key_src(name), v);
      return v == Py_True;
    };
    // A number: a float is a scalar input read per call (a scheduler changes it); an int or a
    // zero where `zero_drops` is guarded by value; a tensor (capturable lr) is an input.
    auto number = [&](PyObject* v, const SourcePtr& src, const char* name, bool zero_drops) -> ir::Node* {
      if (!v) unsupported(std::string("optimizer group without ") + name);
      if (is_tensor(v)) {
        VarPtr t = wrap(v, src);
        if (!t->is_tensor() || !t->node()->meta.sizes.empty()) unsupported(std::string("optimizer ") + name + " as a tensor that is not 0-d");
        return t->node();
      }
      if (!PyFloat_Check(v) && !PyLong_Check(v)) unsupported(std::string("optimizer setting ") + name + " that is not a number");
      const double x = PyFloat_Check(v) ? PyFloat_AsDouble(v) : PyLong_AsDouble(v);
      if ((zero_drops && x == 0) || !PyFloat_CheckExact(v)) {
        out_.guards.add_equals(src, v);
        return zero_drops && x == 0 ? nullptr : g_->scalar(x, DType::Float64);
      }
      out_.guards.add_type(src, reinterpret_cast<PyObject*>(&PyFloat_Type));
      return scalar_input(src, false);
    };
    if (flag("differentiable", false)) unsupported("optimizer with differentiable=True");
    gs.maximize = flag("maximize", false);
    gs.capturable = flag("capturable", false);
    flag("foreach", false);
    flag("fused", false);
    gs.lr = number(item(group, "lr"), key_src("lr"), "lr", false);
    gs.weight_decay = number(item(group, "weight_decay"), key_src("weight_decay"), "weight_decay", true);
    if (sgd) {
      gs.momentum = number(item(group, "momentum"), key_src("momentum"), "momentum", true);
      gs.dampening = number(item(group, "dampening"), key_src("dampening"), "dampening", true);
      gs.nesterov = flag("nesterov", false);
    } else {
      PyObject* betas = item(group, "betas");
      if (!betas || !PyTuple_Check(betas) || PyTuple_GET_SIZE(betas) != 2) unsupported("Adam betas that are not a pair");
      const SourcePtr betas_src = key_src("betas");
      out_.guards.add_type(betas_src, reinterpret_cast<PyObject*>(Py_TYPE(betas)));
      out_.guards.add_length(betas_src, 2);
      gs.beta1 = number(PyTuple_GET_ITEM(betas, 0), Source::item(betas_src, 0), "beta1", false);
      gs.beta2 = number(PyTuple_GET_ITEM(betas, 1), Source::item(betas_src, 1), "beta2", false);
      gs.eps = number(item(group, "eps"), key_src("eps"), "eps", false);
      gs.amsgrad = flag("amsgrad", false);
      gs.decoupled = flag("decoupled_weight_decay", adamw);
    }
    if (!sgd) {
      // The first step makes Adam's state (step counts, moments): made now by the optimizer's
      // own _init_group, as eager's step would at this point and as Dynamo does.
      PyObject* lists[6];
      for (PyObject*& l : lists) l = PyList_New(0), keep_.push_back(l);
      PyObject* r = PyObject_CallMethod(self, "_init_group", "OOOOOOO", group, lists[0], lists[1], lists[2], lists[3], lists[4], lists[5]);
      if (!r) real(nullptr);
      Py_DECREF(r);
    }
  };
  auto on_param = [&](PyObject* p, const SourcePtr& p_src, PyObject* grad, const SourcePtr& grad_src) {
    VarPtr pv = wrap(p, p_src), gv = wrap(grad, grad_src);
    if (!pv->is_tensor() || !gv->is_tensor()) unsupported("optimizer parameter or gradient that is not a tensor");
    const ir::TensorMeta& pm = pv->node()->meta;
    if (!is_floating(pm.dtype) || gv->node()->meta.dtype != pm.dtype) unsupported("optimizer parameter of a non-floating dtype, or a gradient of another");
    // SGD without momentum never looks at a parameter's state (its state_dict stays empty);
    // the others read it, a defaultdict made empty where missing, as eager's lookup does.
    PyObject* pstate = nullptr;
    SourcePtr pstate_src;
    if (!sgd || gs.momentum) {
      pstate = PyObject_GetItem(state, p);
      if (!pstate) real(nullptr);
      keep_.push_back(pstate);
      if (!PyDict_Check(pstate)) unsupported("optimizer state of a parameter is not a dict");
      pstate_src = Source::key_of(state_src, p);
      out_.guards.add_type(pstate_src, reinterpret_cast<PyObject*>(Py_TYPE(pstate)));
    }
    auto state_tensor = [&](const char* name) -> VarPtr {
      PyObject* key = PyUnicode_InternFromString(name);
      keep_.push_back(key);
      PyObject* t = PyDict_GetItem(pstate, key);
      if (!t || !is_tensor(t)) return nullptr;
      VarPtr v = wrap(t, Source::key_of(pstate_src, key));
      if (!v->is_tensor()) unsupported(std::string("optimizer state ") + name);
      return v;
    };
    auto node = [&](const char* op, ir::Node* a, ir::Node* b) { return add_node(op, {a, b}); };
    auto num = [&](double x) { return g_->scalar(x, DType::Float64); };
    ir::Node* g = gv->node();
    ir::Node* pn = pv->node();
    if (gs.maximize) g = add_node("neg", {g});
    check_inplace_target(pv, "optimizer step");
    if (sgd) {
      if (gs.weight_decay) g = node("add", g, node("mul", pn, gs.weight_decay));
      if (gs.momentum) {
        VarPtr buf = state_tensor("momentum_buffer");
        if (!buf) {
          // The first step clones the gradient into a new buffer. With no dampening that is
          // what the update makes of a zero buffer, so the buffer is made now, zeroed.
          if (gs.dampening) {
            out_.guards.add_length(state_src, PyObject_Length(state));
            unsupported("SGD's first step with dampening makes its momentum buffers: it runs eagerly");
          }
          PyObject* zeros = PyObject_CallOneArg(resolve_torch("zeros_like"), p);
          if (!zeros || PyDict_SetItemString(pstate, "momentum_buffer", zeros) < 0) {
            Py_XDECREF(zeros);
            real(nullptr);
          }
          Py_DECREF(zeros);
          buf = state_tensor("momentum_buffer");
        }
        check_inplace_target(buf, "optimizer step");
        ir::Node* damped = gs.dampening ? node("mul", g, node("sub", num(1.0), gs.dampening)) : g;
        ir::Node* b = node("add", node("mul", buf->node(), gs.momentum), damped);
        mutate(buf, b);
        g = gs.nesterov ? node("add", g, node("mul", b, gs.momentum)) : b;
      }
      mutate(pv, node("add", pn, node("mul", g, add_node("neg", {gs.lr}))));
      return;
    }
    VarPtr m = state_tensor("exp_avg"), v = state_tensor("exp_avg_sq");
    VarPtr vmax = gs.amsgrad ? state_tensor("max_exp_avg_sq") : nullptr;
    PyObject* step = PyDict_GetItemString(pstate, "step");
    if (!m || !v || (gs.amsgrad && !vmax) || !step || !is_tensor(step)) unsupported("Adam state without its moments or step");
    const SourcePtr step_src = Source::key_of(pstate_src, PyUnicode_InternFromString("step"));
    // The step count: a 0-d CPU tensor (read per call, incremented on the host), or, when
    // capturable, a tensor on the parameters' device updated in the graph.
    TensorInfo info;
    std::string why;
    if (!tensor_info(step, info, why)) unsupported("Adam step count: " + why);
    ir::Node* count;
    if (info.device.type == DeviceType::CPU && info.sizes.empty() && is_floating(info.dtype) && !gs.capturable) {
      out_.guards.add_tensor(step_src, info);
      count = counter_step(step_src);
    } else {
      VarPtr sv = wrap(step, step_src);
      check_inplace_target(sv, "optimizer step");
      mutate(sv, node("add", sv->node(), num(1.0)));
      count = sv->node();
    }
    if (gs.weight_decay) {
      if (gs.decoupled) mutate(pv, node("mul", pn, node("sub", num(1.0), node("mul", gs.lr, gs.weight_decay))));
      else g = node("add", g, node("mul", pn, gs.weight_decay));
      pn = pv->node();
    }
    check_inplace_target(m, "optimizer step");
    check_inplace_target(v, "optimizer step");
    // exp_avg.lerp_(g, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    ir::Node* m1 = node("add", m->node(), node("mul", node("sub", g, m->node()), node("sub", num(1.0), gs.beta1)));
    mutate(m, m1);
    ir::Node* v1 = node("add", node("mul", v->node(), gs.beta2), node("mul", node("mul", g, g), node("sub", num(1.0), gs.beta2)));
    mutate(v, v1);
    ir::Node* second = v1;
    if (vmax) {
      check_inplace_target(vmax, "optimizer step");
      second = add_node("maximum", {vmax->node(), v1});
      mutate(vmax, second);
    }
    // step_size = -lr / (1 - beta1^t); denom = sqrt(v) / sqrt(1 - beta2^t) + eps
    ir::Node* bc1 = node("sub", num(1.0), node("pow", gs.beta1, count));
    ir::Node* bc2 = node("sub", num(1.0), node("pow", gs.beta2, count));
    ir::Node* step_size = add_node("neg", {node("div", gs.lr, bc1)});
    ir::Node* denom = node("add", node("div", add_node("sqrt", {second}), add_node("sqrt", {bc2})), gs.eps);
    mutate(pv, node("add", pn, node("mul", node("div", m1, denom), step_size)));
  };
  without_grad([&] { each_optimizer_param(self, self_src, on_group, on_param); });  // step runs under no_grad
}


// torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
// foreach=None): the total norm of the gradients and their in-place scaling by
// min(max_norm / (total + 1e-6), 1), as graph nodes under no_grad (torch's own body groups
// tensors by device through a C helper capture cannot follow). The norm is taken over all
// elements at once, where torch takes the norm of the per-tensor norms: equal up to rounding.
VarPtr Interpreter::clip_grad_norm(std::vector<VarPtr>& args, KwArgs& kwargs) {
  const char* names[] = {"parameters", "max_norm", "norm_type", "error_if_nonfinite", "foreach"};
  VarPtr bound[5];
  if (args.size() > 5) return nullptr;
  for (size_t i = 0; i < args.size(); ++i) bound[i] = args[i];
  for (auto& [k, v] : kwargs) {
    size_t i = 0;
    while (i < 5 && k != names[i]) ++i;
    if (i == 5 || bound[i]) return nullptr;
    bound[i] = v;
  }
  if (!bound[0] || !bound[1]) return nullptr;
  double p = 2.0;
  if (bound[2]) {
    PyObject* o = const_obj(bound[2], "norm_type");
    p = PyFloat_AsDouble(o);
    if (PyErr_Occurred()) return clear_error(), nullptr;
  }
  if (bound[3] && PyObject_IsTrue(const_obj(bound[3], "error_if_nonfinite")) == 1)
    unsupported("clip_grad_norm_ with error_if_nonfinite=True (a check of the gradients' values)");
  std::vector<VarPtr> params = bound[0]->is_tensor() ? std::vector<VarPtr>{bound[0]} : items_of(bound[0]);
  VarPtr total;
  without_grad([&] {  // clip_grad_norm_ is @_no_grad
    std::vector<VarPtr> grads;
    for (const VarPtr& param : params) {
      if (!param->is_tensor()) unsupported("clip_grad_norm_ over a value that is not a tensor");
      VarPtr g = getattr(param, "grad");
      if (g->is_const() && g->obj() == Py_None) continue;
      if (!g->is_tensor()) unsupported("clip_grad_norm_ of a gradient kiln cannot read");
      if (!grads.empty() && g->node()->meta.device != grads[0]->node()->meta.device)
        unsupported("clip_grad_norm_ over gradients on several devices");
      grads.push_back(g);
    }
    if (grads.empty()) unsupported("clip_grad_norm_ with no gradients");
    auto torch_fn = [&](const char* name, std::vector<VarPtr> a, KwArgs kw = {}) {
      return call(Var::constant(resolve_torch(name)), std::move(a), std::move(kw));
    };
    auto num = [&](double v) { return Var::steal_constant(PyFloat_FromDouble(v)); };
    const bool inf = std::isinf(p) && p > 0;
    for (const VarPtr& g : grads) {
      VarPtr part = inf ? torch_fn("amax", {torch_fn("abs", {g})})
                        : p == 2.0 ? torch_fn("sum", {binary("NB_MULTIPLY", g, g)})
                                   : torch_fn("sum", {binary("NB_POWER", torch_fn("abs", {g}), num(p))});
      total = !total ? part : inf ? torch_fn("maximum", {total, part}) : binary("NB_ADD", total, part);
    }
    if (!inf) total = p == 2.0 ? torch_fn("sqrt", {total}) : binary("NB_POWER", total, num(1.0 / p));
    VarPtr coef = binary("NB_TRUE_DIVIDE", bound[1], binary("NB_ADD", total, num(1e-6)));
    KwArgs at_most_one;
    at_most_one.emplace_back("max", num(1.0));
    VarPtr clamped = torch_fn("clamp", {coef}, std::move(at_most_one));
    for (const VarPtr& g : grads) {
      check_inplace_target(g, "clip_grad_norm_");
      VarPtr c = clamped;
      if (clamped->node()->meta.dtype != g->node()->meta.dtype) {
        ir::Attrs a;
        a.set("dtype", g->node()->meta.dtype);
        c = Var::tensor(add_node("convert", {clamped->node()}, a));
      }
      mutate(g, add_node("mul", {g->node(), c->node()}));
    }
  }, /*autocast_off=*/false);
  return total;
}

}  // namespace kiln::bind::detail
