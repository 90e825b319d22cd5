#include "bind/runtime/eager_backend.h"

#include <unordered_map>

#include "bind/capture/torch_call.h"
#include "bind/python_objects.h"
#include "bind/runtime/executor.h"
#include "bind/torch/tensor_bridge.h"
#include "core/ops/registry.h"

namespace kiln::bind {
namespace {

// How one op of the registry runs through torch, resolved once per process from its entry.
struct OpCallable {
  std::string spelling;           // the `python` spelling of `fn`
  PyObject* fn = nullptr;         // torch.sum, torch.Tensor.view, ... (owned for the process)
  PyObject* number_op = nullptr;  // operator.__truediv__ for a "Tensor.__truediv__" spelling
};

bool is_dunder(const std::string& name) {
  return name.size() > 4 && name.compare(0, 2, "__") == 0 && name.compare(name.size() - 2, 2, "__") == 0;
}

const OpCallable& op_callable(const ops::OpDef& op) {
  static std::unordered_map<const ops::OpDef*, OpCallable> cache;
  auto it = cache.find(&op);
  if (it != cache.end()) return it->second;
  OpCallable c;
  for (const std::string& spelling : op.python) {
    if (spelling.find('{') != std::string::npos) continue;  // implies attributes: not the op's own call
    bool method = spelling.rfind("Tensor.", 0) == 0;
    std::string name = method ? spelling.substr(7) : spelling;
    if (method && is_dunder(name)) {
      // The Python operator: Python's own reflection picks Tensor.__rtruediv__ for `2 / x`.
      if (!c.number_op) c.number_op = object_at("operator." + name);
      continue;
    }
    if (c.fn) continue;
    c.fn = object_at(method ? "torch.Tensor." + name : spelling);
    if (c.fn) c.spelling = spelling;
  }
  return cache.emplace(&op, c).first->second;
}

PyObject* attr_object(const ir::AttrValue& v) {
  struct V {
    PyObject* operator()(int64_t i) const { return PyLong_FromLongLong(i); }
    PyObject* operator()(double d) const { return PyFloat_FromDouble(d); }
    PyObject* operator()(bool b) const { return Py_NewRef(b ? Py_True : Py_False); }
    PyObject* operator()(const std::vector<int64_t>& l) const {
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(l.size()));
      for (size_t i = 0; i < l.size(); ++i) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(l[i]));
      return t;
    }
    PyObject* operator()(const std::string& s) const { return PyUnicode_FromString(s.c_str()); }
    PyObject* operator()(DType t) const { return Py_NewRef(torch_dtype_object(t)); }
    // Graphs the eager backend runs have constant sizes (shape-generic ones are compiled).
    PyObject* operator()(const sym::Expr& e) const { return PyLong_FromLongLong(e.as_const().value_or(0)); }
    PyObject* operator()(const std::vector<sym::Expr>& l) const {
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(l.size()));
      for (size_t i = 0; i < l.size(); ++i) PyTuple_SET_ITEM(t, i, operator()(l[i]));
      return t;
    }
  };
  return std::visit(V{}, v);
}

bool is_number(const ir::Node* n) { return n && n->op_name() == "scalar"; }

}  // namespace

// An argument of a call: the value of an earlier node, or a constant (owned).
struct TorchArg {
  int node = -1;
  PyObject* value = nullptr;
  std::vector<int> list;  // a Tensor[] parameter: these nodes' values, as a tuple
  bool is_list = false;
};

struct TorchStep {
  int node = -1;                 // whose value the step makes
  PyObject* fn = nullptr;        // Call: borrowed (the op's callable, kept for the process)
  std::vector<TorchArg> args;    // positional, then the values of `kwnames`
  PyObject* kwnames = nullptr;   // owned, or nullptr
  // A torch_call: its registered call, the nodes substituted into it, which result it takes.
  int torch_call = -1;
  std::vector<int> call_inputs;
  int output = -1;
  int share = -1;                // an earlier torch_call step that made the same call: its result
  int inplace_of = -1;           // the node an in-place op updates: the result is copied into it
  bool no_grad = false;          // captured outside grad mode: runs with grad mode off
  std::vector<int> release;      // nodes no later step or output reads
  std::vector<int> release_raw;  // steps whose whole torch_call result no later step shares
};

struct TorchProgram {
  size_t num_nodes = 0;
  std::vector<std::pair<int, int>> inputs;          // node, graph input index
  std::vector<std::pair<int, PyObject*>> numbers;   // scalar nodes: the Python number (owned)
  std::vector<TorchStep> steps;
  std::vector<int> outputs;                         // node per graph output
  std::vector<bool> keep_raw;                       // per step: later steps share its result
  ~TorchProgram() {
    if (!Py_IsInitialized()) return;
    for (auto& [n, o] : numbers) Py_XDECREF(o);
    for (TorchStep& s : steps) {
      for (TorchArg& a : s.args) Py_XDECREF(a.value);
      Py_XDECREF(s.kwnames);
    }
  }
};

std::string torch_spelling(const ops::OpDef& op) { return op_callable(op).spelling; }

namespace {

using NodeIndex = std::unordered_map<const ir::Node*, int>;

// The call of a registry op: callable and argument template from its entry (see the header).
bool plan_call(const ir::Node& n, const NodeIndex& index, TorchStep& step, std::string& error) {
  const ops::OpDef& op = *n.op;
  if (n.attrs.get_bool("detach") && !n.inputs.empty()) {
    // x.detach(): capture's alias that stops gradients, as torch's detach (no history, no
    // requires_grad: an update of a caller's tensor with it leaves that tensor as it was)
    static PyObject* detach = object_at("torch.Tensor.detach");
    step.fn = detach;  // borrowed, as the ops' callables
    TorchArg a;
    a.node = index.at(n.inputs[0]);
    step.args.push_back(a);
    return true;
  }
  const OpCallable& c = op_callable(op);
  auto arg_of = [&](const ir::Node* in) {
    TorchArg a;
    if (!in) a.value = Py_NewRef(Py_None);
    else if (is_number(in) && op.tensors_only) {
      PyObject* number = attr_object(*in->attrs.find("value"));
      a.value = wrapped_number_tensor(number);
      Py_DECREF(number);
    } else a.node = index.at(in);
    return a;
  };
  size_t tensor_params = 0;
  bool attrs_at_default = true;
  bool tensor_list = false;
  for (const ops::Param& p : op.schema.params) {
    if (p.is_tensor()) {
      ++tensor_params;
      continue;
    }
    if (p.is_tensor_list()) {
      tensor_list = true;
      continue;
    }
    const ir::AttrValue* v = n.attrs.find(p.name);
    auto d = p.default_value();
    if (v && !(d && *v == *d)) attrs_at_default = false;
  }
  if (!tensor_list && n.inputs.size() > tensor_params) {
    error = op.name + " has more tensor inputs than its schema";
    return false;
  }
  // `2 / x`: the Python operator, whose reflection is what eager ran (x.__rtruediv__(2)).
  if (c.number_op && tensor_params == 2 && n.inputs.size() == 2 && is_number(n.inputs[0]) && !is_number(n.inputs[1]) &&
      attrs_at_default) {
    step.fn = c.number_op;
    step.args = {arg_of(n.inputs[0]), arg_of(n.inputs[1])};
    return true;
  }
  if (!c.fn) {
    error = "op " + op.name + " has no Python spelling that runs it through torch";
    return false;
  }
  step.fn = c.fn;
  std::vector<TorchArg> positional, keyword;
  std::vector<bool> trailing_default;  // per positional: may be left out when nothing follows
  PyObject* kwnames = PyList_New(0);
  size_t ti = 0;
  for (const ops::Param& p : op.schema.params) {
    if (p.is_tensor_list()) {  // every input, in order (the op's only tensor parameter)
      TorchArg a;
      a.is_list = true;
      for (const ir::Node* in : n.inputs) a.list.push_back(index.at(in));
      positional.push_back(std::move(a));
      trailing_default.push_back(false);
      continue;
    }
    if (p.is_tensor()) {
      const ir::Node* in = ti < n.inputs.size() ? n.inputs[ti] : nullptr;
      ++ti;
      if (p.kwarg_only) {
        if (!in) continue;
        PyObject* name = PyUnicode_FromString(p.name.c_str());
        PyList_Append(kwnames, name);
        Py_DECREF(name);
        keyword.push_back(arg_of(in));
        continue;
      }
      positional.push_back(arg_of(in));
      trailing_default.push_back(!in && p.has_default);
      continue;
    }
    const ir::AttrValue* v = n.attrs.find(p.name);
    auto d = p.default_value();
    bool at_default = !v || (d && *v == *d);
    if (p.kwarg_only) {
      if (at_default) continue;
      PyObject* name = PyUnicode_FromString(p.name.c_str());
      PyList_Append(kwnames, name);
      Py_DECREF(name);
      keyword.push_back({-1, attr_object(*v)});
      continue;
    }
    TorchArg a;
    a.value = v ? attr_object(*v) : d ? attr_object(*d) : Py_NewRef(Py_None);
    positional.push_back(a);
    trailing_default.push_back(at_default && p.has_default);
  }
  while (!positional.empty() && trailing_default.back()) {
    Py_XDECREF(positional.back().value);
    positional.pop_back();
    trailing_default.pop_back();
  }
  step.args = std::move(positional);
  step.args.insert(step.args.end(), keyword.begin(), keyword.end());
  if (PyList_GET_SIZE(kwnames) > 0) step.kwnames = PyList_AsTuple(kwnames);
  Py_DECREF(kwnames);
  return true;
}

// An arange node over constant bounds: torch.arange(start, end, step, dtype=..., device=...).
bool plan_arange(const ir::Node& n, TorchStep& step, std::string& error) {
  auto start = n.attrs.get_expr("start").as_const(), end = n.attrs.get_expr("end").as_const();
  if (!start || !end) return error = "an arange over symbolic bounds", false;
  static PyObject* arange = object_at("torch.arange");
  step.fn = arange;
  for (int64_t v : {*start, *end, n.attrs.get_int("step", 1)}) step.args.push_back({-1, PyLong_FromLongLong(v)});
  step.args.push_back({-1, Py_NewRef(torch_dtype_object(*n.attrs.get_dtype("dtype")))});
  step.args.push_back({-1, PyUnicode_FromString(n.attrs.get_str("device").c_str())});
  step.kwnames = Py_BuildValue("(ss)", "dtype", "device");
  return true;
}

// full(size, value, dtype, device): torch.full over the entry's sizes (capture makes it for a
// fill of a view: x[:, 0].zero_())
bool plan_full(const ir::Node& n, TorchStep& step, std::string& error) {
  const std::vector<sym::Expr> sizes = n.attrs.get_exprs("size");
  PyObject* size = PyTuple_New(static_cast<Py_ssize_t>(sizes.size()));
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto c = sizes[i].as_const();
    if (!c) {
      Py_DECREF(size);
      return error = "a full over symbolic sizes", false;
    }
    PyTuple_SET_ITEM(size, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(*c));
  }
  static PyObject* full = object_at("torch.full");
  step.fn = full;
  step.args.push_back({-1, size});
  step.args.push_back({-1, PyFloat_FromDouble(n.attrs.get_float("value"))});
  step.args.push_back({-1, Py_NewRef(torch_dtype_object(*n.attrs.get_dtype("dtype")))});
  step.args.push_back({-1, PyUnicode_FromString(n.attrs.get_str("device").c_str())});
  step.kwnames = Py_BuildValue("(ss)", "dtype", "device");
  return true;
}

}  // namespace

std::shared_ptr<TorchProgram> prepare_torch_program(const ir::Graph& g, std::string& error,
                                                    const std::set<const ir::Node*>* tracked) {
  auto prog = std::make_shared<TorchProgram>();
  NodeIndex index;
  const auto& nodes = g.nodes();
  prog->num_nodes = nodes.size();
  std::unordered_map<int, int> by_id;
  for (size_t i = 0; i < nodes.size(); ++i) {
    index[nodes[i].get()] = static_cast<int>(i);
    by_id[nodes[i]->id] = static_cast<int>(i);
  }
  for (size_t i = 0; i < g.inputs().size(); ++i) prog->inputs.emplace_back(index.at(g.inputs()[i]), static_cast<int>(i));
  static const ops::OpDef* arange = ops::find_op("arange");
  static const ops::OpDef* full = ops::find_op("full");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = *nodes[i];
    const std::string& name = n.op_name();
    if (name == "placeholder") continue;
    if (name == "scalar") {
      prog->numbers.emplace_back(static_cast<int>(i), attr_object(*n.attrs.find("value")));
      continue;
    }
    TorchStep step;
    step.node = static_cast<int>(i);
    step.no_grad = tracked && !tracked->count(&n);
    if (name == "torch_call") {
      if (n.attrs.has("sym_args")) return error = "a torch call with symbolic int arguments", nullptr;
      step.torch_call = static_cast<int>(n.attrs.get_int("fn"));
      const TorchCall& call = torch_call(step.torch_call);
      step.output = call.output;
      for (const ir::Node* in : n.inputs) step.call_inputs.push_back(index.at(in));
      // The results of one call of a tuple-returning operator (x.max(1)) are one call.
      for (size_t j = 0; j < prog->steps.size() && step.output >= 0; ++j) {
        const TorchStep& o = prog->steps[j];
        if (o.torch_call < 0 || o.share >= 0) continue;
        const TorchCall& oc = torch_call(o.torch_call);
        if (oc.fn == call.fn && oc.args == call.args && oc.kwargs == call.kwargs && o.call_inputs == step.call_inputs) {
          step.share = static_cast<int>(j);
          break;
        }
      }
    } else if (n.op == arange ? !plan_arange(n, step, error)
               : n.op == full     ? !plan_full(n, step, error)
                                  : !plan_call(n, index, step, error)) {
      error = "node " + n.name + ": " + error;
      return nullptr;
    }
    if (const ir::AttrValue* t = n.attrs.find("inplace_of")) {
      auto it = by_id.find(static_cast<int>(std::get<int64_t>(*t)));
      if (it == by_id.end()) {
        error = "node " + n.name + " updates a node the graph does not have";
        return nullptr;
      }
      step.inplace_of = it->second;
    }
    prog->steps.push_back(std::move(step));
  }
  for (const ir::Node* o : g.outputs()) prog->outputs.push_back(index.at(o));

  // Lifetimes: each value dropped after the last step that reads it, as eager frees what it no
  // longer needs; outputs stay.
  std::vector<int> last(nodes.size(), -1);
  std::vector<bool> is_output(nodes.size(), false);
  for (int o : prog->outputs) is_output[o] = true;
  std::vector<int> last_share(prog->steps.size(), -1);
  for (size_t si = 0; si < prog->steps.size(); ++si) {
    const TorchStep& s = prog->steps[si];
    for (const TorchArg& a : s.args) {
      if (a.node >= 0) last[a.node] = static_cast<int>(si);
      for (int n : a.list) last[n] = static_cast<int>(si);
    }
    for (int n : s.call_inputs) last[n] = static_cast<int>(si);
    if (s.inplace_of >= 0) last[s.inplace_of] = static_cast<int>(si);
    if (s.share >= 0) last_share[s.share] = static_cast<int>(si);
  }
  prog->keep_raw.assign(prog->steps.size(), false);
  for (size_t si = 0; si < prog->steps.size(); ++si) {
    if (last_share[si] >= 0) {
      prog->keep_raw[si] = true;
      prog->steps[last_share[si]].release_raw.push_back(static_cast<int>(si));
    }
  }
  for (size_t si = 0; si < prog->steps.size(); ++si) {  // a result nothing reads: gone at once
    int n = prog->steps[si].node;
    if (last[n] < 0 && !is_output[n]) last[n] = static_cast<int>(si);
  }
  for (size_t n = 0; n < nodes.size(); ++n)
    if (last[n] >= 0 && !is_output[n]) prog->steps[last[n]].release.push_back(static_cast<int>(n));
  return prog;
}

bool run_torch_program(const TorchProgram& p, PyObject* const* inputs, std::vector<PyObject*>& outputs) {
  AutocastExcluded no_autocast;  // the graph holds autocast's casts already
  std::vector<PyObject*> vals(p.num_nodes, nullptr), raw(p.steps.size(), nullptr);
  for (auto [node, i] : p.inputs) vals[node] = Py_NewRef(inputs[i]);
  for (auto& [node, number] : p.numbers) vals[node] = Py_NewRef(number);
  std::vector<PyObject*> argv;
  bool ok = true;
  for (size_t si = 0; si < p.steps.size() && ok; ++si) {
    const TorchStep& s = p.steps[si];
    argv.clear();
    PyObject* r = nullptr;
    struct GradOff {  // for a step captured outside grad mode
      bool on, was;
      explicit GradOff(bool off) : on(off), was(off ? set_grad_enabled(false) : false) {}
      ~GradOff() {
        if (on) set_grad_enabled(was);
      }
    } grad_off(s.no_grad);
    if (s.torch_call < 0) {
      std::vector<PyObject*> lists;  // the tuples made for Tensor[] arguments
      for (const TorchArg& a : s.args) {
        if (a.is_list) {
          PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(a.list.size()));
          for (size_t k = 0; k < a.list.size(); ++k) PyTuple_SET_ITEM(t, k, Py_NewRef(vals[a.list[k]]));
          lists.push_back(t);
          argv.push_back(t);
        } else {
          argv.push_back(a.node >= 0 ? vals[a.node] : a.value);
        }
      }
      size_t nkw = s.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(s.kwnames)) : 0;
      r = PyObject_Vectorcall(s.fn, argv.data(), argv.size() - nkw, s.kwnames);
      for (PyObject* t : lists) Py_DECREF(t);
    } else {
      PyObject* whole;
      if (s.share >= 0) {
        whole = Py_NewRef(raw[s.share]);
      } else {
        const TorchCall& call = torch_call(s.torch_call);
        for (int n : s.call_inputs) argv.push_back(vals[n]);
        PyObject* args = substitute(call.args, argv.data());
        PyObject* kwargs = call.kwargs ? substitute(call.kwargs, argv.data()) : nullptr;
        whole = PyObject_Call(call.fn, args, kwargs);
        Py_DECREF(args);
        Py_XDECREF(kwargs);
      }
      if (whole) {
        PyObject* t = s.output < 0 ? whole : PyTuple_Check(whole) && s.output < PyTuple_GET_SIZE(whole) ? PyTuple_GET_ITEM(whole, s.output) : nullptr;
        if (t && is_tensor(t)) r = Py_NewRef(t);
        else PyErr_Format(PyExc_RuntimeError, "kiln: a torch call did not return the tensor capture saw");
        if (p.keep_raw[si]) raw[si] = whole;
        else Py_DECREF(whole);
      }
    }
    if (r && s.inplace_of >= 0 && r != vals[s.inplace_of]) {
      // x.masked_fill_(m, 1), x += y, x[i] = v on an intermediate: capture made the update out of
      // place; torch's in-place op keeps x's tensor (and layout), and nothing reads its old value
      // any more, so the result goes into it.
      static PyObject* copy_name = PyUnicode_InternFromString("copy_");
      PyObject* updated = PyObject_CallMethodOneArg(vals[s.inplace_of], copy_name, r);
      Py_DECREF(r);
      r = updated;
    }
    if (!r) {
      ok = false;
      break;
    }
    vals[s.node] = r;
    for (int n : s.release) Py_CLEAR(vals[n]);
    for (int j : s.release_raw) Py_CLEAR(raw[j]);
  }
  outputs.clear();
  if (ok)
    for (int o : p.outputs) outputs.push_back(Py_NewRef(vals[o]));
  for (PyObject* v : vals) Py_XDECREF(v);
  for (PyObject* v : raw) Py_XDECREF(v);
  return ok;
}

}  // namespace kiln::bind
