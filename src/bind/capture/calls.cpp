#include "bind/capture/interpreter.h"
#include "bind/capture/mode_setter.h"

#include <cctype>
#include <cstring>
#include <map>
#include <set>

#include "bind/capture/polyfills.h"
#include "core/support/log.h"
#include "core/sym/fit.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"
#include "bind/capture/resume.h"
#include "bind/capture/torch_call.h"
#include "bind/runtime/compiled_function.h"
#include "bind/torch/tensor_bridge.h"

namespace kiln::bind::detail {

bool Interpreter::to_int_list(PyObject* o, std::vector<int64_t>& out) {
  if (PyLong_Check(o) && !PyBool_Check(o)) {
    out.push_back(PyLong_AsLongLong(o));
    return true;
  }
  if (!PySequence_Check(o) || PyUnicode_Check(o)) return false;
  Py_ssize_t n = PySequence_Size(o);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* it = PySequence_GetItem(o, i);
    bool ok = PyLong_Check(it) && !PyBool_Check(it);
    if (ok) out.push_back(PyLong_AsLongLong(it));
    Py_DECREF(it);
    if (!ok) return false;
  }
  return true;
}

// torch.cat's legacy rule: 1-d empty tensors beside tensors of another rank are skipped. They
// are left out here where that changes nothing else: they are on the others' device and
// autograd does not track them (else the call stays torch's). They still take part in the
// result's dtype (Hugging Face's cache starts float32 before bfloat16 values): where they
// promote it, the kept tensors are converted to it first.
std::vector<ir::Node*> Interpreter::without_skipped_empties(const std::vector<ir::Node*>& items) {
  auto empty_1d = [](const ir::Node* n) { return n->meta.dim() == 1 && n->meta.sizes[0].is_const(0); };
  const ir::Node* kept = nullptr;
  for (const ir::Node* n : items)
    if (!empty_1d(n)) kept = n;
  if (!kept || kept->meta.dim() == 1) return items;  // all empty, or 1-d tensors: cat's own rule applies
  DType all = items[0]->meta.dtype, rest = kept->meta.dtype;
  for (const ir::Node* n : items) {
    all = promote_types(all, n->meta.dtype);
    if (!empty_1d(n)) rest = promote_types(rest, n->meta.dtype);
  }
  for (const ir::Node* n : items)
    if (empty_1d(n) && (!(n->meta.device == kept->meta.device) || root()->needs_grad_.count(n))) return items;
  std::vector<ir::Node*> out;
  for (ir::Node* n : items) {
    if (empty_1d(n)) continue;
    if (all != rest && n->meta.dtype != all) {
      ir::Attrs a;
      a.set("dtype", all);
      n = add_node("convert", {n}, a);
    }
    out.push_back(n);
  }
  return out;
}

VarPtr Interpreter::call_op(const OpBinding& b, std::vector<VarPtr> args, const std::vector<std::pair<std::string, VarPtr>>& kwargs) {
  bool inplace = false;
  const ops::Schema& s = b.op->schema;
  std::vector<ir::Node*> inputs;
  std::vector<VarPtr> input_vars;  // the tracker of each tensor input (nullptr for None)
  ir::Attrs attrs = b.fixed;
  size_t pos = 0;
  std::vector<bool> used_kw(kwargs.size(), false);
  for (size_t pi = 0; pi < s.params.size(); ++pi) {
    const ops::Param& p = s.params[pi];
    if (attrs.has(p.name)) continue;
    VarPtr v;
    if (!p.kwarg_only && pos < args.size()) {
      // int[] takes the rest of the positionals when given as varargs: x.view(2, 3).
      if (p.is_int_list() && p.list_size() == 0 && args[pos]->is_const() && PyLong_Check(args[pos]->known()) &&
          pos + 1 < args.size() && pi + 1 == s.params.size()) {
        std::vector<VarPtr> rest(args.begin() + pos, args.end());
        v = Var::tuple(rest);
        pos = args.size();
      } else {
        v = args[pos++];
      }
    } else {
      for (size_t k = 0; k < kwargs.size(); ++k) {
        // torch's argument parser takes NumPy's names too: axis= for dim=, keepdims= for
        // keepdim=, x=/a=/x1= for the input, x2= for other (x.mean(axis=2), cat(..., axis=1)).
        const std::string& kw = kwargs[k].first;
        const bool input = p.name == "self" || p.name == "input";
        const bool alias = (input && (kw == "input" || kw == "x" || kw == "a" || kw == "x1")) ||
                           (p.name == "dim" && kw == "axis") || (p.name == "keepdim" && kw == "keepdims") ||
                           (p.name == "other" && kw == "x2");
        if (kw == p.name || alias) {
          v = kwargs[k].second;
          used_kw[k] = true;
        }
      }
    }
    if (!v) {
      if (!p.has_default) unsupported(b.op->name + "() missing argument '" + p.name + "'");
      if (p.is_tensor()) {
        if (p.type == "Tensor?") inputs.push_back(nullptr);
        else unsupported("tensor default for " + p.name);
      } else if (auto d = p.default_value()) {
        attrs.set(p.name, *d);  // explicit, as FX prints defaults: shape rules see every argument
      }
      continue;
    }
    if (p.is_tensor_list()) {
      // torch.cat((a, b)): each tensor an input. Anything else (numbers in the list, a tensor
      // in place of the list) is torch's operator's to take or refuse.
      if (v->kind() != Var::Kind::Tuple && v->kind() != Var::Kind::List) return nullptr;
      std::vector<ir::Node*> items;
      for (const VarPtr& item : v->seq()) {
        if (!item->is_tensor()) return nullptr;
        items.push_back(item->node());
      }
      if (b.op->skips_empty_1d) items = without_skipped_empties(items);
      inputs.insert(inputs.end(), items.begin(), items.end());
      continue;
    }
    if (p.is_tensor()) {
      input_vars.resize(inputs.size());
      if (p.type == "Tensor?" && v->is_const() && v->known() == Py_None) {
        inputs.push_back(nullptr);
        continue;
      }
      input_vars.push_back(v);
      if (b.op->tensors_only && !v->is_tensor())
        unsupported("shape/dtype check of " + b.op->name + " failed: TypeError: " + b.op->name + "(): argument '" +
                    p.name + "' must be Tensor, not " + (v->is_const() ? Py_TYPE(v->obj())->tp_name : "a value"));
      inputs.push_back(as_node(v, p.name.c_str()));
      continue;
    }
    if (p.is_int_list() || p.type.rfind("SymInt", 0) == 0 || p.type.rfind("int", 0) == 0) {
      // a size given as a 0-d tensor capture knows the value of (view(B, torch.div(T, w), w))
      if (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List) {
        std::vector<VarPtr> items = v->seq();
        bool changed = false;
        for (VarPtr& x : items) {
          VarPtr k = known_int(x);
          changed |= k != x;
          x = k;
        }
        if (changed) v = Var::tuple(std::move(items));
      } else {
        v = known_int(v);
      }
    }
    if (p.is_sym_int_list()) {  // sizes that may be symbolic: view(B, T, -1)
      std::vector<VarPtr> items;
      if (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List) items = v->seq();
      else if (v->symint().valid()) items = {v};
      bool symbolic = false;
      for (const VarPtr& x : items) symbolic |= x->symint().valid();
      if (symbolic) {
        std::vector<sym::Expr> sizes;
        for (const VarPtr& x : items) {
          if (sym::Expr e = x->symint(); e.valid()) {
            sizes.push_back(e);
            continue;
          }
          PyObject* o = const_obj(x, p.name.c_str());
          if (!PyLong_Check(o) || PyBool_Check(o)) unsupported(p.name + " must be a list of ints");
          sizes.push_back(sym::Expr(static_cast<int64_t>(PyLong_AsLongLong(o))));
        }
        attrs.set(p.name, ir::sizes_attr(sizes));
        continue;
      }
    }
    if (p.type.rfind("SymInt", 0) == 0 && !p.is_sym_int_list()) {  // a size that may be symbolic
      if (sym::Expr e = v->symint(); e.valid()) {
        attrs.set(p.name, e);
        continue;
      }
    }
    // A tensor where the entry takes a number (clamp(x, min=t), torch's clamp.Tensor): another
    // overload of torch's, which its operator runs.
    if (v->is_tensor() && (p.type == "Scalar" || p.type == "Scalar?")) return nullptr;
    PyObject* o = const_obj(v, p.name.c_str());
    // A str where the entry takes ints: another overload of torch's (conv's padding="same"),
    // which its operator runs.
    if (p.is_int_list() && PyUnicode_Check(o)) return nullptr;
    if (o == Py_None) {
      if (p.type.back() != '?' && !(p.has_default && p.dflt == "None")) unsupported(p.name + " must not be None");
      continue;
    }
    if (p.type == "bool") {
      if (!PyBool_Check(o)) unsupported(p.name + " must be a bool");
      if (p.name == "inplace" && o == Py_True) {
        inplace = true;  // F.relu(x, inplace=True): the op, then x takes the result
        attrs.set(p.name, false);
        continue;
      }
      attrs.set(p.name, o == Py_True);
    } else if (p.is_int_list()) {
      std::vector<int64_t> l;
      if (!to_int_list(o, l)) unsupported(p.name + " must be a list of ints");
      if (p.list_size() > 1 && l.size() == 1) l.assign(p.list_size(), l[0]);  // stride=2 -> [2, 2]
      attrs.set(p.name, l);
    } else if (p.type.rfind("int", 0) == 0 || p.type.rfind("SymInt", 0) == 0) {
      if (!PyLong_Check(o) || PyBool_Check(o)) unsupported(p.name + " must be an int");
      attrs.set(p.name, static_cast<int64_t>(PyLong_AsLongLong(o)));
    } else if (p.type.rfind("float", 0) == 0 || p.type == "Scalar" || p.type == "Scalar?") {
      if (PyBool_Check(o)) attrs.set(p.name, o == Py_True);
      else if (PyLong_Check(o)) attrs.set(p.name, static_cast<int64_t>(PyLong_AsLongLong(o)));
      else if (PyFloat_Check(o)) attrs.set(p.name, PyFloat_AsDouble(o));
      else unsupported(p.name + " must be a number");
    } else if (p.type.rfind("ScalarType", 0) == 0) {
      DType t;
      // torch's argument parser takes Python's number types as dtypes: int, float, bool
      if (o == reinterpret_cast<PyObject*>(&PyLong_Type)) t = DType::Int64;
      else if (o == reinterpret_cast<PyObject*>(&PyFloat_Type)) t = DType::Float64;
      else if (o == reinterpret_cast<PyObject*>(&PyBool_Type)) t = DType::Bool;
      else if (!dtype_from_object(o, t)) unsupported(p.name + " must be a supported torch.dtype");
      attrs.set(p.name, t);
    } else if (p.type.rfind("str", 0) == 0) {
      if (!PyUnicode_Check(o)) unsupported(p.name + " must be a str");
      attrs.set(p.name, std::string(PyUnicode_AsUTF8(o)));
    } else {
      unsupported("argument type " + p.type);
    }
  }
  if (pos < args.size()) unsupported(b.op->name + "() got too many positional arguments");
  for (size_t k = 0; k < kwargs.size(); ++k)
    // (F.softmax's `_stacklevel`, which nn.Softmax2d passes, only says where a warning points)
    if (!used_kw[k] && kwargs[k].first != "_stacklevel")
      unsupported(b.op->name + "() got an unexpected keyword argument '" + kwargs[k].first + "'");
  // Python numbers only as operands of ops with other tensor operands (torch.sin(2.0) is eager's).
  bool any_tensor = false;
  for (ir::Node* n : inputs) any_tensor |= n && !n->meta.wrapped_number;
  if (!any_tensor) unsupported(b.op->name + "() called without tensor arguments");
  if (b.op->covers && !b.op->covers(inputs, attrs)) return nullptr;  // torch's operator runs it
  static const ops::OpDef* batch_norm = ops::find_op("batch_norm");
  if (b.op == batch_norm && attrs.get_bool("training")) return batch_norm_training(inputs, input_vars, attrs);
  if (inplace) {
    const VarPtr& target = args.empty() ? kwargs.front().second : args.front();
    if (!target->is_tensor()) unsupported("in-place " + b.op->name + " on a non-tensor");
    check_inplace_target(target, b.op->name);
    return mutate(target, add_node(b.op, inputs, attrs));
  }
  return Var::tensor(add_node(b.op, inputs, attrs));
}

VarPtr Interpreter::dropout(const std::vector<VarPtr>& args, const KwArgs& kwargs, bool functional) {
  // F.dropout(input, p=0.5, training=True, inplace=False); torch.dropout(input, p, train).
  const std::vector<std::string> names = functional ? std::vector<std::string>{"input", "p", "training", "inplace"}
                                                    : std::vector<std::string>{"input", "p", "train"};
  std::vector<VarPtr> a(names.size());
  if (args.size() > names.size()) unsupported("dropout() takes at most " + std::to_string(names.size()) + " arguments");
  for (size_t i = 0; i < args.size(); ++i) a[i] = args[i];
  for (const auto& [k, v] : kwargs) {
    auto it = std::find(names.begin(), names.end(), k);
    if (it == names.end() || a[static_cast<size_t>(it - names.begin())]) unsupported("dropout() got an unexpected keyword argument '" + k + "'");
    a[static_cast<size_t>(it - names.begin())] = v;
  }
  if (!a[0] || !a[0]->is_tensor()) unsupported("dropout of a non-tensor");
  if (!functional && (!a[1] || !a[2])) unsupported("torch.dropout() missing arguments");
  auto number = [&](const VarPtr& v, double dflt) {
    if (!v) return dflt;
    PyObject* o = const_obj(v, "p");
    if (!PyFloat_Check(o) && !PyLong_Check(o)) unsupported("dropout probability must be a number");
    return PyFloat_AsDouble(o);
  };
  auto flag = [&](const VarPtr& v, bool dflt) {
    if (!v) return dflt;
    PyObject* o = const_obj(v, "training");
    if (!PyBool_Check(o)) unsupported("dropout's training flag must be a bool");
    return o == Py_True;
  };
  const double p = number(a[1], 0.5);
  const bool training = flag(a[2], true);
  if (p < 0 || p > 1) unsupported("shape/dtype check of dropout failed: ValueError: dropout probability has to be between 0 and 1, but got " + std::to_string(p));
  if (functional && flag(a[3], false)) unsupported("in-place dropout (inplace=True) is not captured yet");
  ir::Node* x = a[0]->node();
  if (!training || p == 0) return a[0];  // eager hands the input back
  if (!is_floating(x->meta.dtype))  // eager's error: its mask is float
    unsupported("shape/dtype check of dropout failed: RuntimeError: result type Float can't be cast to the desired output type");
  Interpreter* r = root();
  ir::Attrs at;
  at.set("p", p);
  at.set("offset", next_draw_offset());
  ir::Node* seed = rng_seed()->node();
  return Var::tensor(add_node("dropout", {x, seed}, at));
}

namespace {

ir::Attrs draw_attrs(const std::vector<sym::Expr>& sizes, const std::string& device, DType dtype, int64_t offset) {
  ir::Attrs a;
  a.set("size", sizes);
  a.set("dtype", dtype);
  a.set("device", device);
  a.set("offset", offset);
  return a;
}

}  // namespace

ir::Node* Interpreter::uniform_draw(const std::vector<sym::Expr>& sizes, const std::string& device) {
  return add_node("random_uniform", {rng_seed()->node()}, draw_attrs(sizes, device, DType::Float32, next_draw_offset()));
}

ir::Node* Interpreter::normal_draw(const std::vector<sym::Expr>& sizes, const std::string& device, DType dtype) {
  return add_node("random_normal", {rng_seed()->node()}, draw_attrs(sizes, device, dtype, next_draw_offset()));
}

// x.addcdiv(t1, t2, value=v) and addcmul: x + v * (t1 / t2), x + v * (t1 * t2), in-place
// too, with v a Python number or a 0-d tensor (a torch.optim update's step size, a tensor while
// compiling). nullptr: other arguments (torch's call reports them).
VarPtr Interpreter::add_product(const VarPtr& self, const std::string& name, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  if (args.size() < 2 || args.size() > 3 || !args[0]->is_tensor() || !args[1]->is_tensor()) return nullptr;
  VarPtr value = args.size() == 3 ? args[2] : nullptr;
  for (const auto& [k, v] : kwargs) {
    if (k != "value" || value) return nullptr;
    value = v;
  }
  if (value && !value->is_tensor() && !(value->is_const() && (PyFloat_Check(value->known()) || PyLong_Check(value->known()))))
    return nullptr;
  const bool divide = name.rfind("addcdiv", 0) == 0;
  for (const VarPtr& t : {args[0], args[1]})
    if (!is_floating(t->node()->meta.dtype)) return nullptr;  // integer addcdiv is torch's error
  VarPtr term = binary(divide ? "NB_TRUE_DIVIDE" : "NB_MULTIPLY", args[0], args[1]);
  if (value) term = binary("NB_MULTIPLY", value, term);
  VarPtr r = binary("NB_ADD", self, term);
  if (name.back() != '_') return r;
  check_inplace_target(self, name);
  return mutate(self, r->node());
}

// x.normal_(mean, std) and x.uniform_(from, to) with Python numbers: every element drawn anew
// from kiln's draws (torch.distributions' rsample fills torch.empty(shape) so), in x's dtype.
// nullptr: arguments kiln leaves to torch (a generator, tensors).
VarPtr Interpreter::random_fill(const VarPtr& self, bool normal, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  const ir::TensorMeta& m = self->node()->meta;
  const char* names[2] = {normal ? "mean" : "from", normal ? "std" : "to"};
  double p[2] = {0, 1};
  if (args.size() > 2) return nullptr;
  auto number = [&](const VarPtr& v, double& out) {
    PyObject* o = v->is_const() ? v->known() : nullptr;
    if (!o || PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) return false;
    out = PyFloat_AsDouble(o);
    return !PyErr_Occurred();
  };
  for (size_t i = 0; i < args.size(); ++i)
    if (!number(args[i], p[i])) return nullptr;
  for (const auto& [k, v] : kwargs) {
    if (k == "generator" && v->is_const() && v->known() == Py_None) continue;
    const int i = k == names[0] ? 0 : k == names[1] ? 1 : -1;
    if (i < 0 || !number(v, p[i])) return nullptr;
  }
  clear_error();
  if (normal && !(p[1] >= 0)) unsupported("normal_ expects std >= 0.0: RuntimeError");
  if (!normal && !(p[0] <= p[1])) unsupported("uniform_ expects to return a [from, to) range: RuntimeError");
  if (root()->grad_mode_ && root()->needs_grad_.count(self->node())) return nullptr;
  check_inplace_target(self, normal ? "normal_" : "uniform_");
  ir::Node* draw = normal ? normal_draw(m.sizes, m.device.str(), m.dtype == DType::Float64 ? DType::Float64 : DType::Float32)
                          : uniform_draw(m.sizes, m.device.str());
  const double scale = normal ? p[1] : p[1] - p[0], shift = p[0];
  auto number_node = [&](double d, const char* what) { return as_node(Var::steal_constant(PyFloat_FromDouble(d)), what); };
  ir::Node* r = draw;
  if (scale != 1) r = add_node("mul", {r, number_node(scale, names[1])});
  if (shift != 0) r = add_node("add", {r, number_node(shift, names[0])});
  if (r->meta.dtype != m.dtype) {
    ir::Attrs c;
    c.set("dtype", m.dtype);
    r = add_node("convert", {r}, c);
  }
  return mutate(self, r);
}

int64_t Interpreter::next_draw_offset() { return root()->rng_draws_++ * (int64_t{1} << 40); }  // each draw its own stretch of counters

std::optional<std::string> Interpreter::device_name(PyObject* device) {
  // torch.device(device), or torch's default device; its str() ("cpu", "cuda:0")
  static PyObject* device_type = resolve_torch("device");
  static PyObject* default_device = resolve_torch("get_default_device");
  PyObject* dev = device && device != Py_None ? PyObject_CallOneArg(device_type, device) : PyObject_CallNoArgs(default_device);
  PyObject* str = dev ? PyObject_Str(dev) : nullptr;
  Py_XDECREF(dev);
  if (!str) return clear_error(), std::nullopt;
  std::string where = PyUnicode_AsUTF8(str);
  Py_DECREF(str);
  return where;
}

VarPtr Interpreter::random_draw(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  static PyObject* bernoulli = resolve_torch("bernoulli");
  if (f == bernoulli) {
    // torch.bernoulli(probabilities): 1 where a uniform draw falls below the element's
    // probability, in its dtype and layout (a row-major one here)
    if (args.size() != 1 || !args[0]->is_tensor()) return nullptr;
    for (const auto& [k, v] : kwargs)
      if (!(k == "generator" && v->is_const() && v->known() == Py_None)) return nullptr;
    const ir::TensorMeta& m = args[0]->node()->meta;
    if (!is_floating(m.dtype) || !ir::is_contiguous(m.sizes, m.strides)) return nullptr;
    if (root()->grad_mode_ && root()->needs_grad_.count(args[0]->node())) return nullptr;
    ir::Attrs c;
    c.set("dtype", m.dtype);
    return Var::tensor(add_node("convert", {add_node("lt", {uniform_draw(m.sizes, m.device.str()), args[0]->node()})}, c));
  }
  enum class Draw { Uniform, Normal, Int };
  static const std::pair<PyObject*, std::pair<Draw, bool>> kinds[] = {
      {resolve_torch("rand"), {Draw::Uniform, false}},     {resolve_torch("randn"), {Draw::Normal, false}},
      {resolve_torch("randint"), {Draw::Int, false}},      {resolve_torch("rand_like"), {Draw::Uniform, true}},
      {resolve_torch("randn_like"), {Draw::Normal, true}}, {resolve_torch("randint_like"), {Draw::Int, true}}};
  const std::pair<Draw, bool>* kind = nullptr;
  for (const auto& [fn, k] : kinds)
    if (fn == f) kind = &k;
  if (!kind) return nullptr;
  const auto [draw, like] = *kind;
  PyObject *dtype = nullptr, *device = nullptr;
  for (const auto& [k, v] : kwargs) {
    PyObject* o = v->is_const() ? v->known() : nullptr;
    if (k == "dtype" && o) dtype = o;
    else if (k == "device" && o) device = o;
    else if ((k == "generator" || k == "out" || k == "layout") && o == Py_None) continue;
    else if ((k == "requires_grad" || k == "pin_memory") && o == Py_False) continue;
    else if (k == "memory_format" && o == object_at("torch.preserve_format") && like) continue;
    else return nullptr;  // a generator of one's own, another layout, a result requiring grad
  }
  std::vector<VarPtr> rest = args;
  ir::TensorMeta like_meta;
  if (like) {
    if (rest.empty() || !rest[0]->is_tensor()) return nullptr;
    like_meta = rest[0]->node()->meta;
    // a _like draw keeps a dense input's layout: only a row-major one here
    if (!ir::is_contiguous(like_meta.sizes, like_meta.strides)) return nullptr;
    rest.erase(rest.begin());
  }
  int64_t low = 0, high = 0;
  if (draw == Draw::Int) {  // randint(high, size) / randint(low, high, size); _like: (high) / (low, high)
    const size_t bounds = rest.size() - (like ? 0 : 1);
    if (bounds < 1 || bounds > 2) return nullptr;
    std::vector<int64_t> b;
    for (size_t i = 0; i < bounds; ++i) {
      PyObject* o = rest[i]->is_const() ? rest[i]->known() : nullptr;
      if (!o || !PyLong_CheckExact(o)) return nullptr;
      b.push_back(PyLong_AsLongLong(o));
    }
    low = bounds == 2 ? b[0] : 0, high = b.back();
    // eager's errors (an empty range) and ranges a float32 draw does not cover evenly: torch's
    if (high <= low || high - low > (int64_t{1} << 24)) return nullptr;
    rest.erase(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(bounds));
  }
  std::vector<sym::Expr> sizes;
  if (like) {
    if (!rest.empty()) return nullptr;
    sizes = like_meta.sizes;
  } else {
    std::vector<VarPtr> items = rest;
    bool listed = items.size() == 1 && (items[0]->kind() == Var::Kind::Tuple || items[0]->kind() == Var::Kind::List);
    if (listed) items = items[0]->seq();
    if (!listed && items.size() == 1 && items[0]->is_const() && PySequence_Check(items[0]->known()) &&
        !PyUnicode_Check(items[0]->known())) {  // a constant tuple, list or torch.Size
      PyObject* seq = items[0]->known();
      items.clear();
      for (Py_ssize_t i = 0; i < PySequence_Size(seq); ++i) items.push_back(Var::steal_constant(PySequence_GetItem(seq, i)));
      listed = true;
    }
    if (items.empty() && !listed) return nullptr;  // torch.rand() with no size: torch's error
    for (const VarPtr& v : items) {
      if (sym::Expr e = v->symint(); e.valid()) {
        sizes.push_back(e);
        continue;
      }
      PyObject* o = v->is_const() ? v->known() : nullptr;
      if (!o || !PyLong_CheckExact(o) || PyLong_AsLongLong(o) < 0) return nullptr;
      sizes.push_back(sym::Expr(static_cast<int64_t>(PyLong_AsLongLong(o))));
    }
  }
  DType t;
  if (dtype && dtype != Py_None) {
    if (!dtype_from_object(dtype, t)) return nullptr;
  } else if (like) {
    t = like_meta.dtype;
  } else {
    t = draw == Draw::Int ? DType::Int64 : default_dtype();
  }
  // rand's [0, 1) rounds up to 1 in a 16-bit type; rand and randn take floating types only,
  // randint not bool (torch's kernels, with their errors)
  if (draw == Draw::Uniform && t != DType::Float32 && t != DType::Float64) return nullptr;
  if (draw == Draw::Normal && !is_floating(t)) return nullptr;
  if (draw == Draw::Int && t == DType::Bool) return nullptr;
  std::string where;
  if (like && (!device || device == Py_None)) {
    where = like_meta.device.str();
  } else if (std::optional<std::string> d = device_name(device)) {
    where = *d;
  } else {
    return nullptr;
  }
  if (where != "cpu" && where.rfind("cuda", 0) != 0) return nullptr;
  ir::Attrs a;
  a.set("size", sizes);
  a.set("dtype", t);
  a.set("device", where);
  a.set("offset", next_draw_offset());
  if (draw == Draw::Int) {
    a.set("low", low);
    a.set("high", high);
  }
  const char* op = draw == Draw::Uniform ? "random_uniform" : draw == Draw::Normal ? "random_normal" : "random_int";
  return Var::tensor(add_node(op, {rng_seed()->node()}, a));
}

VarPtr Interpreter::checkpointed_call(const VarPtr& fn, std::vector<VarPtr> args, KwArgs kwargs) {
  const size_t first = g_->nodes().size();
  VarPtr out = call(fn, std::move(args), std::move(kwargs));
  for (size_t i = first; i < g_->nodes().size(); ++i) {
    ir::Node* n = g_->nodes()[i].get();
    if (n->op->kind != ops::OpKind::Source) n->attrs.set("checkpoint", true);
  }
  return out;
}

VarPtr Interpreter::rng_seed() {
  Interpreter* r = root();
  if (r->rng_seed_) return r->rng_seed_;
  SourcePtr src = Source::seed();
  // A stand-in for the seed at capture: drawing one here would move torch's generator on the
  // first call only, so torch.manual_seed(s) before a call would not repeat it.
  PyObject* zero = PyLong_FromLong(0);
  PyObject* t = zero ? wrapped_number_tensor(zero) : nullptr;
  Py_XDECREF(zero);
  if (!t) real(nullptr);
  r->keep_.push_back(t);
  ir::TensorMeta m;
  m.dtype = DType::Int64;
  ir::Node* n = g_->placeholder("rng_seed", m);
  r->out_.input_sources.push_back(src);
  r->input_vars_.push_back(Var::tensor(n, src));
  r->input_objects_.push_back(t);
  r->rng_seed_ = r->input_vars_.back();
  return r->rng_seed_;
}

VarPtr Interpreter::batch_norm_training(const std::vector<ir::Node*>& inputs, std::vector<VarPtr> vars, const ir::Attrs& attrs) {
  static const ops::OpDef* batch_norm = ops::find_op("batch_norm");
  vars.resize(inputs.size());
  // The normalization reads the batch's statistics alone: its node takes no running ones (run
  // through torch, as the eager backend does, batch_norm would update them itself, again, and
  // autograd would save them)
  std::vector<ir::Node*> batch_only = inputs;
  if (batch_only.size() > 2) batch_only[1] = batch_only[2] = nullptr;
  ir::Node* y = add_node(batch_norm, batch_only, attrs);
  // The running statistics, updated in place as torch's kernel does (outside autograd): the
  // new values are graph outputs written back into the buffers after the call.
  ir::Node *rm = inputs.size() > 2 ? inputs[1] : nullptr, *rv = inputs.size() > 2 ? inputs[2] : nullptr;
  if (rm && rv) {
    if (!vars[1] || !vars[2]) unsupported("batch_norm's running statistics must be tensors");
    check_inplace_target(vars[1], "batch_norm running_mean update");
    check_inplace_target(vars[2], "batch_norm running_var update");
    std::pair<ir::Node*, ir::Node*> fresh;
    try {
      fresh = ops::batch_norm_running_update(*g_, inputs[0], rm, rv, attrs.get_float("momentum", 0.1));
    } catch (const std::exception& e) {
      unsupported(std::string("shape/dtype check of batch_norm failed: ") + e.what());
    }
    mutate(vars[1], fresh.first);
    mutate(vars[2], fresh.second);
  }
  return Var::tensor(y);
}

VarPtr Interpreter::call(VarPtr fn, std::vector<VarPtr> args, KwArgs kwargs) {
  switch (fn->kind()) {
    case Var::Kind::Method:
    {
      const MethodV& m = fn->as<MethodV>();
      if (auto* r = m.self->get_if<RecordV>(); r && !(r->plain && m.fn)) return call_record_method(m.self, m.name, args, kwargs);
      if (m.fn && PyFunction_Check(m.fn)) {  // a method of an object made in the frame, or reached through super()
        // super().__init__() of a module made here (make_user_module): torch's own, run for real.
        // Module.__init__ is looked up each time: Dynamo, once it has run, wraps it in its own.
        static PyObject* module_type = object_at("torch.nn.Module");
        static PyObject* init_name = PyUnicode_InternFromString("__init__");
        if (m.self->kind() == Var::Kind::Module && is_private(m.self->obj()) && module_type &&
            m.fn == _PyType_Lookup(reinterpret_cast<PyTypeObject*>(module_type), init_name)) {
          args.insert(args.begin(), Var::constant(m.self->obj()));
          return real(call_for_real(m.fn, args, kwargs, "nn.Module.__init__ argument"));
        }
        args.insert(args.begin(), m.self);
        return inline_call(m.fn, nullptr, std::move(args), kwargs);
      }
      if (m.fn) {
        static PyObject* object_init = PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), "__init__");
        if (m.fn == object_init && args.empty() && kwargs.empty()) return Var::constant(Py_None);  // super().__init__()
        if (VarPtr r = generic_getattr(m.fn, m.self, args, kwargs)) return r;  // super().__getattribute__(key)
        static PyObject* object_setattr = PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), "__setattr__");
        static PyObject* object_delattr = PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), "__delattr__");
        if (m.self->kind() == Var::Kind::Record && m.fn != object_setattr && m.fn != object_delattr)
          unsupported("call of " + m.name + " of an object made during capture (not a Python function)");
        args.insert(args.begin(), m.self);  // a C method through super(): called with the receiver
        return call(Var::constant(m.fn), std::move(args), std::move(kwargs));
      }
      if (m.name == "__get__" && m.self->is_const() && PyFunction_Check(m.self->obj())) {
        // f.__get__(obj, cls): f bound to obj (f itself for obj None), as the descriptor protocol
        if (args.empty() || args.size() > 2 || !kwargs.empty()) unsupported("function.__get__ with these arguments: TypeError");
        if (args[0]->is_const() && args[0]->known() == Py_None) return m.self;
        return Var::method(args[0], callable_name(m.self->obj()), m.self->obj());
      }
      if (m.self->kind() == Var::Kind::Tuple || m.self->kind() == Var::Kind::List)
        return call_sequence_method(m.self, m.name, std::move(args), kwargs);
      if (is_dict(m.self)) return call_dict_method(m.self, m.name, std::move(args), kwargs);
      if (m.self->kind() == Var::Kind::Module) return call_module_method(m.self, m.name, std::move(args), kwargs);
      if (m.self->is_array()) return call_array_method(m.self, m.name, std::move(args), kwargs);
      if (m.self->is_tensor() && m.name == "numpy" && args.empty()) return tensor_to_array(m.self, kwargs);
      return call_tensor_method(m.self, m.name, std::move(args), kwargs);
    }
    case Var::Kind::Module: return call_module(fn, std::move(args), kwargs);
    case Var::Kind::Record:
      if (fn->as<RecordV>().plain && object_has_attr(fn, "__call__"))  // obj(x): type(obj).__call__
        return call(getattr(fn, "__call__"), std::move(args), std::move(kwargs));
      unsupported("call of a non-callable object: TypeError");
    case Var::Kind::Function: {
      FunctionV& f = fn->as<FunctionV>();
      if (f.makes_context) return make_generator_context(f.fn, &f.cells, args, kwargs);
      if (f.decorator) return call_in_fresh_context(f, std::move(args), kwargs);
      if (!f.mode) return inline_call(f.fn, nullptr, std::move(args), kwargs, &f.cells);
      // a function decorated with @torch.no_grad(), @torch.autocast(...): its body runs in those modes
      ModeChange saved = enter_modes(*f.mode);
      VarPtr r;
      try {
        r = inline_call(f.fn, nullptr, std::move(args), kwargs, &f.cells);
      } catch (...) {
        enter_modes(saved);
        throw;
      }
      enter_modes(saved);
      return r;
    }
    case Var::Kind::ContextExit:  // with's __exit__(None, None, None): the modes before the block
      if (fn->as<ContextExitV>().python_exit || fn->as<ContextExitV>().generator)
        return exit_python_context(fn->as<ContextExitV>(), std::move(args), kwargs);
      restore_modes(*fn->as<ContextExitV>().mode);
      return Var::constant(Py_False);
    case Var::Kind::Context:
      if (args.size() == 1 && kwargs.empty() &&
          (args[0]->kind() == Var::Kind::Function || (args[0]->is_const() && PyFunction_Check(args[0]->obj())))) {
        // torch.no_grad()(f), as a decorator: f, called in the context's modes
        FunctionV d;
        if (auto* f = args[0]->get_if<FunctionV>()) {
          if (f->mode || f->decorator || f->makes_context) unsupported("a function under two context-manager decorators");
          d.fn = Py_NewRef(f->fn), d.cells = f->cells;
        } else {
          d.fn = Py_NewRef(args[0]->obj());
        }
        const ContextV& c = fn->as<ContextV>();
        if (c.generator) {
          d.decorator = fn;  // a @contextmanager object: a fresh one around each call
        } else {
          d.mode = c.mode;
          if (c.restore) restore_modes(*c.restore);  // set_grad_enabled(b)(f): its __call__ puts back the mode before it
        }
        return std::make_shared<Var>(std::move(d));  // not rebuildable: a graph break or return cannot hand it to Python
      }
      unsupported("call of a context manager object");
    case Var::Kind::Const:
      return call_const(fn, std::move(args), kwargs);
    case Var::Kind::List:
      if (VarPtr base = fn->as<ListV>().sliced_module) {
        // modules[a:b](x) of an nn.Sequential: Sequential.forward of the new container, each
        // child called on the last one's result (the new container has no hooks of its own).
        static PyObject* sequential = object_at("torch.nn.Sequential");
        static PyObject* forward = PyUnicode_InternFromString("forward");
        PyTypeObject* type = Py_TYPE(base->obj());
        if (!sequential || args.size() != 1 || !kwargs.empty() ||
            _PyType_Lookup(type, forward) != _PyType_Lookup(reinterpret_cast<PyTypeObject*>(sequential), forward))
          unsupported("call of a slice of a module other than nn.Sequential(x)");
        VarPtr v = args[0];
        for (const VarPtr& child : fn->seq()) v = call(child, {v}, {});
        return v;
      }
      unsupported("call of a non-callable value");
    default: unsupported("call of a non-callable value");
  }
}

VarPtr Interpreter::inline_call(PyObject* f, SourcePtr f_source, std::vector<VarPtr> args, const KwArgs& kwargs,
                   const std::vector<VarPtr>* cells) {
  if (VarPtr cm = generator_context(f, args, kwargs, cells)) return cm;
  std::unique_ptr<Interpreter> frame = bound_frame(f, std::move(f_source), std::move(args), kwargs, cells);
  if (!(reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(f))->co_flags & CO_GENERATOR)) return frame->run_frame();
  // A generator runs to its end at once: the caller iterates over what it yielded, and meets
  // the exception it raised (if it did) where its iteration reaches the end.
  VarPtr r;
  PyObject* raised = nullptr;
  try {
    r = frame->run_frame();
  } catch (const Raised& e) {
    if (PyErr_GivenExceptionMatches(e.exc, PyExc_StopIteration)) unsupported("StopIteration raised inside a generator (PEP 479: RuntimeError)");
    raised = e.exc;  // kept by the root (raise)
  }
  VarPtr it = Var::iterator(std::move(frame->yields_));
  it->as<IteratorV>().returned = r;
  it->as<IteratorV>().raises = raised;
  return it;
}

std::unique_ptr<Interpreter> Interpreter::bound_frame(PyObject* f, SourcePtr f_source, std::vector<VarPtr> args,
                                                      const KwArgs& kwargs, const std::vector<VarPtr>* cells) {
  auto* co = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(f));
  std::string name = PyUnicode_AsUTF8(co->co_qualname);
  if (depth_ >= 32) unsupported("inlining deeper than 32 calls (recursion?) at " + name);
  if (co->co_flags & (CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE))
    unsupported(name + " is a coroutine");
  auto frame = std::make_unique<Interpreter>(f, out_, this, std::move(f_source));
  Interpreter& child = *frame;
  if (cells) {
    int first_free = co->co_nlocalsplus - co->co_nfreevars;
    for (size_t k = 0; k < cells->size(); ++k) child.locals_[first_free + k] = (*cells)[k];
  }
  const int npos = co->co_argcount, nkwonly = co->co_kwonlyargcount;
  const bool varargs = co->co_flags & CO_VARARGS, varkw = co->co_flags & CO_VARKEYWORDS;
  PyObject* varnames = PyCode_GetVarnames(co);
  keep_.push_back(varnames);
  auto slot_name = [&](int i) { return std::string(PyUnicode_AsUTF8(PyTuple_GET_ITEM(varnames, i))); };
  std::vector<VarPtr>& L = child.locals_;
  for (size_t i = 0; i < args.size() && i < static_cast<size_t>(npos); ++i) L[i] = args[i];
  if (args.size() > static_cast<size_t>(npos)) {
    if (!varargs) unsupported(name + "() takes " + std::to_string(npos) + " positional arguments");
    L[npos + nkwonly] = Var::tuple(std::vector<VarPtr>(args.begin() + npos, args.end()));
  } else if (varargs) {
    L[npos + nkwonly] = Var::tuple({});
  }
  VarPtr extra = Var::dict();  // keywords no parameter takes: **kwargs
  for (const auto& [k, v] : kwargs) {
    int slot = -1;
    for (int i = co->co_posonlyargcount; i < npos + nkwonly; ++i)
      if (slot_name(i) == k) slot = i;
    if (slot < 0) {
      if (!varkw) unsupported(name + "() got an unexpected keyword argument '" + k + "'");
      PyObject* key = PyUnicode_FromString(k.c_str());
      dict_set(extra, key, v);
      Py_DECREF(key);
      continue;
    }
    if (L[slot]) unsupported(name + "() got multiple values for argument '" + k + "'");
    L[slot] = v;
  }
  if (varkw) L[npos + nkwonly + varargs] = extra;
  PyObject* defaults = PyFunction_GET_DEFAULTS(f);
  Py_ssize_t ndef = defaults ? PyTuple_GET_SIZE(defaults) : 0;
  for (int i = 0; i < npos; ++i) {
    if (L[i]) continue;
    Py_ssize_t d = i - (npos - ndef);
    if (d < 0) unsupported(name + "() missing argument '" + slot_name(i) + "'");
    PyObject* dv = PyTuple_GET_ITEM(defaults, d);
    // Defaults can be reassigned (f.__defaults__ = ...): guarded like any other value read.
    L[i] = child.fn_source_ ? wrap(dv, Source::item(Source::attr(child.fn_source_, "__defaults__"), d)) : Var::constant(dv);
  }
  PyObject* kwdefaults = PyFunction_GET_KW_DEFAULTS(f);
  for (int i = npos; i < npos + nkwonly; ++i) {
    if (L[i]) continue;
    PyObject* v = kwdefaults ? PyDict_GetItemString(kwdefaults, slot_name(i).c_str()) : nullptr;
    if (!v) unsupported(name + "() missing keyword argument '" + slot_name(i) + "'");
    // Keyword-only defaults: the dict is guarded by identity (reassigning it recompiles).
    if (child.fn_source_) out_.guards.add_identity(Source::attr(child.fn_source_, "__kwdefaults__"), kwdefaults);
    L[i] = Var::constant(v);
  }
  return frame;
}

namespace {

// Real tensors standing in for a call's inputs, to run it on: ones where floating (in
// `floating_as` where given), zeros of their own type otherwise (a valid index anywhere), each
// dim at most `cap` points of its size at the hints, on the input's device. False (no error
// set, `out` empty) where torch cannot make one.
bool stand_in_tensors(const GuardSet& guards, const std::vector<ir::Node*>& inputs, int64_t cap,
                      std::optional<DType> floating_as, std::vector<PyObject*>& out) {
  static PyObject* ones = object_at("torch.ones");
  static PyObject* zeros = object_at("torch.zeros");
  for (const ir::Node* n : inputs) {
    PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(n->meta.dim()));
    for (size_t d = 0; d < n->meta.dim(); ++d)
      PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(std::min(cap, guards.value_at_hints(n->meta.sizes[d]))));
    const bool floating = is_floating(n->meta.dtype);
    PyObject* kw = Py_BuildValue("{s:O,s:s}", "dtype", torch_dtype_object(floating && floating_as ? *floating_as : n->meta.dtype),
                                 "device", n->meta.device.str().c_str());
    PyObject* x = nullptr;
    if (cap == INT64_MAX) {
      // whole: laid out as the input is (a channels-last input, an expanded one), since some
      // kernels give their result the input's layout
      static PyObject* empty_strided = object_at("torch.empty_strided");
      PyObject* stride = PyTuple_New(static_cast<Py_ssize_t>(n->meta.dim()));
      for (size_t d = 0; d < n->meta.dim(); ++d) PyTuple_SET_ITEM(stride, d, PyLong_FromLongLong(guards.value_at_hints(n->meta.strides[d])));
      PyObject* a = PyTuple_Pack(2, shape, stride);
      PyObject* e = kw && a ? PyObject_Call(empty_strided, a, kw) : nullptr;
      x = e ? PyObject_CallMethod(e, "fill_", "i", floating ? 1 : 0) : nullptr;
      Py_XDECREF(e);
      Py_XDECREF(a);
      Py_DECREF(stride);
    } else {
      PyObject* a = PyTuple_Pack(1, shape);
      x = kw && a ? PyObject_Call(floating ? ones : zeros, a, kw) : nullptr;
      Py_XDECREF(a);
    }
    Py_XDECREF(kw);
    Py_DECREF(shape);
    if (!x) {
      for (PyObject* t : out) Py_DECREF(t);
      out.clear();
      clear_error();
      return false;
    }
    out.push_back(x);
  }
  return true;
}

}  // namespace

std::optional<ops::AutocastPolicy> Interpreter::probe_autocast(PyObject* f, PyObject* targs, PyObject* tkw,
                                                             const std::vector<ir::Node*>& inputs,
                                                             const std::vector<sym::Expr>& sym_args) {
  // The floating inputs (not float64) are what autocast casts; integer ones (index_copy's
  // index, embedding_bag's indices) pass as zeros of their own type, a valid index anywhere.
  const AutocastState& ac = root()->autocast_;
  const ir::Node* first = nullptr;
  for (const ir::Node* n : inputs)
    if (n && is_floating(n->meta.dtype)) first = first ? first : n;
  if (!first || !ac.on(first->meta.device.type)) return std::nullopt;
  for (const ir::Node* n : inputs)
    if (!n || n->meta.wrapped_number || n->meta.dtype == DType::Float64 || !(n->meta.device == first->meta.device))
      return std::nullopt;
  const DType low = ac.dtype(first->meta.device.type);
  std::vector<int64_t> sym_values;
  for (const sym::Expr& e : sym_args) sym_values.push_back(root()->out_.guards.value_at_hints(e));
  // Each dim at most `cap` points. A composite's inner calls can depend on the sizes (einsum
  // over dims of one point multiplies where it would call bmm, which autocast casts), so the
  // probe runs at the call's own sizes where the inputs are small, else at two points a dim,
  // then, for an operator that needs more (conv1d's kernel is wider than two points), at the
  // call's sizes again where they are not large.
  int64_t cap = 0;
  auto run = [&](DType t) -> PyObject* {  // the first tensor result's dtype object, new reference
    std::vector<PyObject*> tensors;
    auto drop = [&] {
      for (PyObject* x : tensors) Py_DECREF(x);
    };
    if (!stand_in_tensors(root()->out_.guards, inputs, cap, t, tensors)) return nullptr;
    PyObject* args = substitute(targs, tensors.data(), sym_values.data());
    PyObject* kwargs = tkw ? substitute(tkw, tensors.data(), sym_values.data()) : nullptr;
    PyObject* r = args && (!tkw || kwargs) ? PyObject_Call(f, args, kwargs) : nullptr;
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    drop();
    if (!r) return nullptr;
    PyObject* t0 = PyTuple_Check(r) && PyTuple_GET_SIZE(r) > 0 ? PyTuple_GET_ITEM(r, 0) : r;
    PyObject* dt = is_tensor(t0) ? PyObject_GetAttrString(t0, "dtype") : nullptr;
    Py_DECREF(r);
    return dt;
  };
  int64_t elements = 0;  // all inputs together, at the call's sizes
  for (const ir::Node* n : inputs) {
    int64_t count = 1;
    for (const sym::Expr& e : n->meta.sizes) count *= root()->out_.guards.value_at_hints(e);
    elements += count;
  }
  constexpr int64_t kSmall = int64_t{1} << 16, kLarge = int64_t{1} << 24, kWhole = INT64_MAX;
  std::vector<int64_t> caps = elements <= kSmall ? std::vector<int64_t>{kWhole} : std::vector<int64_t>{2};
  if (elements > kSmall && elements <= kLarge) caps.push_back(kWhole);
  const AutocastState saved = autocast_state();
  set_autocast_state(ac);
  PyObject *from_float = nullptr, *from_low = nullptr;
  for (int64_t c : caps) {
    if (from_float && from_low) break;
    Py_XDECREF(from_float);
    clear_error();
    cap = c;
    from_float = run(DType::Float32);
    from_low = from_float ? run(low) : nullptr;
  }
  set_autocast_state(saved);
  std::optional<ops::AutocastPolicy> policy;
  if (from_float && from_low) {
    if (from_float == torch_dtype_object(low)) policy = ops::AutocastPolicy::LowerPrecision;
    else if (from_low == torch_dtype_object(DType::Float32)) policy = ops::AutocastPolicy::Float32;
    else policy = ops::AutocastPolicy::None;
  }
  Py_XDECREF(from_float);
  Py_XDECREF(from_low);
  clear_error();
  return policy;
}

namespace {

// Whether torch's dispatcher says autocast passes an ATen function by on one device type, over
// the overloads capture could call (those over named dims take dim names, never int dims): no
// overload has an autocast kernel there and none is CompositeImplicitAutograd (whose inner
// calls autocast would see: einsum's bmm) - unbind, gather, index_select, topk, roll, repeat,
// cumsum on the CPU. Other operators' casts are found at the call (probe_autocast). Cached per
// function.
bool autocast_passes_by(PyObject* f, bool cuda) {
  static std::map<std::pair<PyObject*, bool>, bool> known;
  if (auto it = known.find({f, cuda}); it != known.end()) return it->second;
  // Indexing (views, aten::index with tensor indices) is on no list and casts nothing, and
  // type_as is a cast itself (its implicit decomposition calls `to`, which autocast leaves).
  static PyObject* getitem = object_at("torch.Tensor.__getitem__");
  static PyObject* type_as = object_at("torch.Tensor.type_as");
  if (f == getitem || f == type_as) return true;
  static PyObject* aten = object_at("torch.ops.aten");
  static PyObject* has_kernel = object_at("torch._C._dispatch_has_kernel_for_dispatch_key");
  const bool builtin = PyCFunction_Check(f) || Py_IS_TYPE(f, &PyMethodDescr_Type);
  PyObject* fname = builtin ? PyObject_GetAttrString(f, "__name__") : nullptr;
  PyObject* packet = fname && aten && has_kernel && PyUnicode_Check(fname) && PyUnicode_READ_CHAR(fname, 0) != '_'
                         ? PyObject_GetAttr(aten, fname)
                         : nullptr;
  PyObject* overloads = packet ? PyObject_CallMethod(packet, "overloads", nullptr) : nullptr;
  bool passes_by = false;
  if (overloads && PyList_Check(overloads) && PyList_GET_SIZE(overloads) > 0) {
    bool none = true, counted = false;
    const std::string base = std::string("aten::") + PyUnicode_AsUTF8(fname);
    for (Py_ssize_t i = 0; none && i < PyList_GET_SIZE(overloads); ++i) {
      const char* ov = PyUnicode_AsUTF8(PyList_GET_ITEM(overloads, i));
      std::string lower(ov);
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (lower.find("dimname") != std::string::npos || lower.find("out") != std::string::npos) continue;
      const std::string full = base + (std::strcmp(ov, "default") == 0 ? "" : std::string(".") + ov);
      auto has = [&](const char* key) -> int {
        PyObject* r = PyObject_CallFunction(has_kernel, "ss", full.c_str(), key);
        if (!r) return clear_error(), -1;  // an overload torch has in Python only
        const int yes = r == Py_True;
        Py_DECREF(r);
        return yes;
      };
      const int own = has(cuda ? "AutocastCUDA" : "AutocastCPU"), implicit = has("CompositeImplicitAutograd");
      if (own < 0 || implicit < 0) {
        none = false;
        break;
      }
      counted = true;
      none = !own && !implicit;
    }
    passes_by = counted && none;
  }
  Py_XDECREF(overloads);
  Py_XDECREF(packet);
  Py_XDECREF(fname);
  clear_error();
  Py_INCREF(f);  // kept: the cache is keyed by its address
  known.emplace(std::make_pair(f, cuda), passes_by);
  return passes_by;
}

// Whether an ATen function (torch.native_batch_norm) has an overload whose schema writes into a
// positional argument (`Tensor(a!) running_mean`; out= arguments are keyword-only). Cached per
// function object.
bool writes_arguments(PyObject* f) {
  static std::unordered_map<PyObject*, bool> known;
  if (auto it = known.find(f); it != known.end()) return it->second;
  // native_batch_norm's schema leaves out that it writes its running statistics in training.
  static PyObject* native_batch_norm = object_at("torch.native_batch_norm");
  bool writes = f == native_batch_norm;
  static PyObject* aten = object_at("torch.ops.aten");
  PyObject* fname = PyCFunction_Check(f) ? PyObject_GetAttrString(f, "__name__") : nullptr;
  PyObject* packet = fname && aten ? PyObject_GetAttr(aten, fname) : nullptr;
  PyObject* overloads = packet ? PyObject_CallMethod(packet, "overloads", nullptr) : nullptr;
  for (Py_ssize_t i = 0; overloads && PyList_Check(overloads) && i < PyList_GET_SIZE(overloads) && !writes; ++i) {
    PyObject* op = PyObject_GetAttr(packet, PyList_GET_ITEM(overloads, i));
    PyObject* schema = op ? PyObject_GetAttrString(op, "_schema") : nullptr;
    PyObject* args = schema ? PyObject_GetAttrString(schema, "arguments") : nullptr;
    for (Py_ssize_t k = 0; args && PyList_Check(args) && k < PyList_GET_SIZE(args) && !writes; ++k) {
      PyObject* arg = PyList_GET_ITEM(args, k);
      PyObject* kwarg_only = PyObject_GetAttrString(arg, "kwarg_only");  // out= arguments are
      PyObject* alias = PyObject_GetAttrString(arg, "alias_info");
      PyObject* w = alias && alias != Py_None ? PyObject_GetAttrString(alias, "is_write") : nullptr;
      PyObject* type = PyObject_GetAttrString(arg, "type");
      PyObject* type_name = type ? PyObject_Str(type) : nullptr;
      const char* tn = type_name ? PyUnicode_AsUTF8(type_name) : nullptr;
      // a tensor, not a list (sort(Tensor[](a!) self) sorts a Python list)
      writes = w == Py_True && kwarg_only == Py_False && tn &&
               (std::strcmp(tn, "Tensor") == 0 || std::strcmp(tn, "Optional[Tensor]") == 0);
      Py_XDECREF(type_name);
      Py_XDECREF(type);
      Py_XDECREF(w);
      Py_XDECREF(alias);
      Py_XDECREF(kwarg_only);
    }
    Py_XDECREF(args);
    Py_XDECREF(schema);
    Py_XDECREF(op);
  }
  Py_XDECREF(overloads);
  Py_XDECREF(packet);
  Py_XDECREF(fname);
  clear_error();
  Py_INCREF(f);  // kept: the cache is keyed by its address
  known.emplace(f, writes);
  return writes;
}

}  // namespace

std::vector<VarPtr> Interpreter::drain(const VarPtr& v) {
  std::vector<VarPtr> items = items_of(v);
  if (auto* it = v->get_if<IteratorV>())
    while (!it->empty()) it->pop_front();
  return items;
}

std::vector<VarPtr> Interpreter::items_of(const VarPtr& v) {
  if (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List) return v->seq();
  if (auto* it = v->get_if<IteratorV>()) {
    if (it->raises) raise(it->raises);  // a generator that raises: what takes all its items raises
    sync_list_iterator(*it);
    return it->left();
  }
  if (is_dict(v)) {
    std::vector<VarPtr> keys;
    for (auto& [k, unused] : dict_entries(v)) keys.push_back(key_var(k));
    return keys;
  }
  if (v->is_const() && (PyAnySet_Check(v->obj()) || PyUnicode_Check(v->obj()) || PyDictViewSet_Check(v->obj()) ||
                        PyDictValues_Check(v->obj()))) {
    // (a str is a value, guarded as one: its characters are what it is)
    if (v->source && !PyUnicode_Check(v->obj())) unsupported("iteration over a set or view the caller can see");
    PyObject* fast = PySequence_List(v->obj());
    if (!fast) real(nullptr);
    keep_.push_back(fast);
    std::vector<VarPtr> out;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fast); ++i) out.push_back(key_var(PyList_GET_ITEM(fast, i)));
    return out;
  }
  if (auto* r = v->get_if<RecordV>(); r && r->plain) {
    if (VarPtr it = object_dunder(v, "__iter__", {})) {
      // An object that is its own iterator (or hands out another user object) yields through
      // __next__, one item at a time and possibly without end: not drained at capture.
      if (it->get_if<RecordV>()) unsupported("iteration over a user-defined iterator object (__next__)");
      return items_of(it);
    }
    unsupported(std::string("'") + reinterpret_cast<PyTypeObject*>(r->cls)->tp_name + "' object is not iterable: TypeError");
  }
  if (structural(v) && v->source) {
    // A sequence object of the caller's (a config's per-layer view): its items read through
    // their sources like a list's, its length guarded.
    static PyObject* sequence = object_at("collections.abc.Sequence");
    if (sequence && PyObject_IsInstance(v->obj(), sequence) == 1) {
      Py_ssize_t n = PySequence_Size(v->obj());
      if (n < 0) real(nullptr);
      if (n > 10000) unsupported("loop of more than 10000 iterations");
      out_.guards.add_length(v->source, n);
      std::vector<VarPtr> out;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = PySequence_GetItem(v->obj(), i);
        if (!item) real(nullptr);
        out.push_back(wrap(item, Source::item(v->source, i)));
        Py_DECREF(item);
      }
      return out;
    }
  }
  if (v->kind() == Var::Kind::Module) {
    // Children in order, by name (Sequential may name them: OrderedDict construction); a
    // ModuleDict or ParameterDict yields its keys, like a dict.
    bool keys = is_keyed_container(v->obj());
    std::vector<VarPtr> out;
    for (const std::string& n : module_keys(v))
      out.push_back(keys ? real(PyUnicode_FromString(n.c_str())) : module_attr(v, n.c_str()));
    return out;
  }
  if (v->is_const() && is_enum_class(v->obj())) {  // for r in Reduction: its members, in order
    PyObject* members = PySequence_List(v->obj());
    if (!members) real(nullptr);
    std::vector<VarPtr> out;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(members); ++i) out.push_back(Var::constant(PyList_GET_ITEM(members, i)));
    Py_DECREF(members);
    return out;
  }
  if (v->is_const()) {
    PyObject* o = v->obj();
    if (!(PyRange_Check(o) || PyTuple_Check(o) || PyList_Check(o))) {
      // An object whose class iterates in Python (collections.abc.Sequence's __iter__ over its
      // __getitem__ until IndexError: a config's per-layer view): that __iter__ inlined, a
      // generator run to its end.
      if (VarPtr it = python_dunder(v, Py_TYPE(o), "__iter__", {})) {
        // An iterator of the caller's (`__iter__` returns itself, or another object iterating by
        // its Python __next__): yields one item at a time, possibly without end; not drained
        // (items_of of it again recursed without end: numpy's ndindex in apply_along_axis).
        if (it.get() == v.get() || (it->is_const() && it->known() == o) || it->get_if<RecordV>() ||
            (it->is_const() && it->known() && python_function(Py_TYPE(it->known()), "__next__")))
          unsupported("iteration over a user-defined iterator object (__next__)");
        return items_of(it);
      }
      unsupported("iteration over a " + std::string(Py_TYPE(o)->tp_name));
    }
    Py_ssize_t n = PySequence_Size(o);
    if (n > 10000) unsupported("loop of more than 10000 iterations");
    std::vector<VarPtr> out;
    for (Py_ssize_t i = 0; i < n; ++i) out.push_back(Var::steal_constant(PySequence_GetItem(o, i)));
    return out;
  }
  if (v->is_tensor() && !v->is_array()) {
    // for row in x: Tensor.__iter__ is iter(x.unbind(0)), unrolled over a first dim of fixed size
    const ir::TensorMeta& m = v->node()->meta;
    if (m.dim() == 0) unsupported("iteration over a 0-d tensor: TypeError");
    auto n = m.sizes[0].as_const();
    if (!n) unsupported("iteration over a tensor whose first dim is symbolic");
    if (*n > 10000) unsupported("loop of more than 10000 iterations");
    return items_of(call_tensor_method(v, "unbind", {}, {}));
  }
  unsupported("iteration over a value kiln does not know how to iterate");
}

VarPtr Interpreter::iteration_builtin(PyObject* f, const std::vector<VarPtr>& args) {
  std::vector<VarPtr> out;
  if (f == builtin("reversed")) {
    if (args.size() != 1) unsupported("reversed() takes one argument");
    out = items_of(args[0]);
    std::reverse(out.begin(), out.end());
    if (is_plain_list(args[0])) {
      // Python's reverse list iterator walks indices from the length at the call down to 0,
      // reading the list at each step (and stops at an index past its end)
      VarPtr it = Var::iterator(std::move(out));
      it->as<IteratorV>().immutable = false;
      const VarPtr list = args[0];
      const size_t start = list->seq().size();
      it->as<IteratorV>().remake = [list, start, seen = list->seq()](std::vector<VarPtr>& items) mutable {
        if (list->seq() == seen) return false;
        seen = list->seq();
        items.clear();
        for (size_t i = start; i-- > 0 && i < seen.size();) items.push_back(seen[i]);
        return true;
      };
      return it;
    }
  } else {
    // enumerate(a, start) or zip(*args): the items from each argument's items, by index
    const bool enumerate = f == builtin("enumerate");
    if (enumerate && (args.empty() || args.size() > 2)) unsupported("enumerate() with unusual arguments");
    const long start = enumerate && args.size() == 2 ? PyLong_AsLong(const_obj(args[1], "start")) : 0;
    const std::vector<VarPtr> parts = enumerate ? std::vector<VarPtr>{args[0]} : args;
    auto make = [enumerate, start](const std::vector<std::vector<VarPtr>>& seqs) {
      std::vector<VarPtr> items;
      size_t n = seqs.empty() ? 0 : SIZE_MAX;
      for (auto& sq : seqs) n = std::min(n, sq.size());
      for (size_t i = 0; i < n; ++i) {
        std::vector<VarPtr> t;
        if (enumerate) t.push_back(Var::steal_constant(PyLong_FromLong(start + static_cast<long>(i))));
        for (auto& sq : seqs) t.push_back(sq[i]);
        items.push_back(Var::tuple(std::move(t)));
      }
      return items;
    };
    std::vector<std::vector<VarPtr>> seqs;
    for (const VarPtr& a : parts) seqs.push_back(items_of(a));
    out = make(seqs);
    // Over lists (and tuples), Python's enumerate and zip read each list as they step: a loop
    // body that appends to or deletes from one changes what comes next. Iterators among the
    // arguments are consumed as they are (a zip over a generator takes its items once).
    auto fixed = [](const VarPtr& a) {  // a tuple, range or string: the same items at every step
      return a->kind() == Var::Kind::Tuple ||
             (a->is_const() && (PyTuple_Check(a->obj()) || PyRange_Check(a->obj()) || PyUnicode_Check(a->obj())));
    };
    const bool by_index = std::all_of(parts.begin(), parts.end(), [&](const VarPtr& a) { return is_plain_list(a) || fixed(a); });
    if (by_index && std::any_of(parts.begin(), parts.end(), is_plain_list)) {
      VarPtr it = Var::iterator(std::move(out));
      it->as<IteratorV>().immutable = false;
      it->as<IteratorV>().remake = [parts, seqs, make](std::vector<VarPtr>& items) mutable {
        bool changed = false;
        for (size_t i = 0; i < parts.size(); ++i)
          if (parts[i]->kind() == Var::Kind::List && parts[i]->seq() != seqs[i]) seqs[i] = parts[i]->seq(), changed = true;
        if (changed) items = make(seqs);
        return changed;
      };
      return it;
    }
  }
  VarPtr it = Var::iterator(std::move(out));
  return it;
}

// MyFunction.apply(x, ...) of a torch.autograd.Function where no input needs a gradient (grad
// mode off, or no tracked tensor among the arguments): its forward alone, inlined with a ctx made
// in the frame (kiln/_polyfills.py: function_apply), as eager computes it then. Where a gradient
// is wanted, the custom backward is not captured: nullptr, and the call goes on by category.
VarPtr Interpreter::autograd_function_apply(const VarPtr& fn, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  PyObject* f = fn->known();
  if (!f) return nullptr;
  // apply is a classmethod: bound to the class, in Python (a method) or in C (torch's
  // _FunctionBase), by torch version
  static PyObject* function_type = object_at("torch.autograd.Function");
  static PyObject* base_apply = object_at("torch.autograd.Function.apply");
  static PyObject* model = object_at("kiln._polyfills.function_apply");
  if (!function_type || !base_apply || !model) return nullptr;
  PyObject* cls = nullptr;
  if (PyMethod_Check(f) && PyMethod_Check(base_apply) && PyMethod_GET_FUNCTION(f) == PyMethod_GET_FUNCTION(base_apply))
    cls = PyMethod_GET_SELF(f);
  else if (PyCFunction_Check(f) && PyCFunction_Check(base_apply) &&
           PyCFunction_GET_FUNCTION(f) == PyCFunction_GET_FUNCTION(base_apply))
    cls = PyCFunction_GET_SELF(f);
  if (!cls || !PyType_Check(cls) || PyObject_IsSubclass(cls, function_type) != 1) return nullptr;
  const VarPtr cls_var = fn->source ? wrap(cls, Source::attr(fn->source, "__self__")) : Var::constant(cls);
  if (root()->grad_mode_) {
    std::function<bool(const VarPtr&)> tracked = [&](const VarPtr& v) {
      if (v->is_tensor()) return root()->needs_grad_.count(v->node()) > 0;
      if (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List)
        return std::any_of(v->seq().begin(), v->seq().end(), tracked);
      return false;
    };
    bool any = std::any_of(args.begin(), args.end(), tracked);
    for (const auto& [k, v] : kwargs) any |= tracked(v);
    if (any) return differentiable_function_apply(cls_var, args, kwargs, tracked);
  }
  std::vector<VarPtr> with_cls{cls_var};
  with_cls.insert(with_cls.end(), args.begin(), args.end());
  return inline_call(model, nullptr, std::move(with_cls), kwargs);
}

// The same where a gradient is wanted, as TorchDynamo captures it: the forward under no_grad
// (as autograd runs it) with a ctx made in the frame (kiln/_polyfills.py: function_forward),
// then the backward, captured from a placeholder gradient (custom_grad) outside grad mode and
// autocast, as autograd's engine runs it. The result is a custom_vjp node, whose derivative is
// that template (core/ops/custom_function_ops.cpp). One tensor result; a floating one.
VarPtr Interpreter::differentiable_function_apply(const VarPtr& cls_var, const std::vector<VarPtr>& args,
                                                  const KwArgs& kwargs, const std::function<bool(const VarPtr&)>& tracked) {
  static PyObject* forward = object_at("kiln._polyfills.function_forward");
  static PyObject* backward = object_at("kiln._polyfills.function_backward");
  if (!forward || !backward) unsupported("internal: kiln's autograd.Function polyfills are missing");
  if (!kwargs.empty()) unsupported("autograd.Function.apply with keyword arguments");
  std::vector<VarPtr> needs;
  for (const VarPtr& a : args) needs.push_back(Var::constant(tracked(a) ? Py_True : Py_False));
  std::vector<VarPtr> fwd_args{cls_var, Var::tuple(std::move(needs))};
  fwd_args.insert(fwd_args.end(), args.begin(), args.end());
  VarPtr result;
  without_grad([&] { result = inline_call(forward, nullptr, std::move(fwd_args), {}); }, false);
  const VarPtr out = result->seq().at(0), ctx = result->seq().at(1);
  if (!out->is_tensor())
    unsupported("autograd.Function whose forward returns other than one tensor, with a gradient: not captured yet");
  ir::Node* o = out->node();
  if (!is_floating(o->meta.dtype)) return out;  // autograd records no gradient for it
  ir::Attrs ga;
  ga.set("size", ir::sizes_attr(o->meta.sizes));
  ga.set("dtype", o->meta.dtype);
  ga.set("device", o->meta.device.str());
  ir::Node* grad_input = add_node("custom_grad", {}, ga);
  VarPtr grads;
  without_grad([&] { grads = inline_call(backward, nullptr, {cls_var, ctx, Var::tensor(grad_input)}, {}); }, true);
  std::vector<VarPtr> gs = grads->kind() == Var::Kind::Tuple || grads->kind() == Var::Kind::List ? grads->seq()
                                                                                                   : std::vector<VarPtr>{grads};
  auto is_none = [](const VarPtr& v) { return v->is_const() && v->known() == Py_None; };
  if (gs.size() < args.size())
    unsupported("autograd.Function backward returned an incorrect number of gradients (expected " +
                std::to_string(args.size()) + ", got " + std::to_string(gs.size()) + ")");
  for (size_t i = args.size(); i < gs.size(); ++i)
    if (!is_none(gs[i])) unsupported("autograd.Function backward returned an incorrect number of gradients");
  std::vector<ir::Node*> xs, gx;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i]->is_tensor()) {
      if (!is_none(gs[i])) unsupported("autograd.Function backward returned a gradient for an input that is not a tensor");
      continue;
    }
    if (!is_none(gs[i]) && !gs[i]->is_tensor()) unsupported("autograd.Function backward returned a gradient that is not a tensor");
    xs.push_back(args[i]->node());
    gx.push_back(is_none(gs[i]) || !tracked(args[i]) ? nullptr : gs[i]->node());
  }
  std::vector<ir::Node*> inputs{o, grad_input};
  inputs.insert(inputs.end(), xs.begin(), xs.end());
  inputs.insert(inputs.end(), gx.begin(), gx.end());
  return Var::tensor(add_node("custom_vjp", inputs, {}));
}

// Whether `f` is the forward one of the module's classes defines (its own, or a base class's).
bool Interpreter::own_forward_of(PyObject* module, PyObject* f) {
  PyObject* mro = Py_TYPE(module)->tp_mro;
  for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); ++i) {
    PyObject* dict = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_dict;
    if (dict && PyDict_GetItemString(dict, "forward") == f) return true;
  }
  return false;
}

// torch's own functions that TorchDynamo wraps in torch._dynamo.disable once it has run
// (TorchPatcher: optimizer internals): the function itself, which kiln traces (borrowed, kept by
// the wrapper). nullptr otherwise: a user's disabled function stays a call in Python (its
// wrapper's set_eval_frame ends capture there).
PyObject* Interpreter::dynamo_disabled_torch_function(PyObject* f) {
  PyObject* disabled = PyObject_GetAttrString(f, "_torchdynamo_disable");
  PyObject* wrapped = disabled == Py_True ? PyObject_GetAttrString(f, "__wrapped__") : nullptr;
  clear_error();
  Py_XDECREF(disabled);
  if (wrapped) Py_DECREF(wrapped);  // the wrapper's __dict__ keeps it
  return wrapped && PyFunction_Check(wrapped) && is_torch_internal(wrapped) ? wrapped : nullptr;
}

namespace {

// f.__module__ ("" where it has none)
std::string module_name(PyObject* f) {
  PyObject* mod = PyObject_GetAttrString(f, "__module__");
  if (!mod) clear_error();
  std::string m = mod && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : "";
  Py_XDECREF(mod);
  return m;
}

}  // namespace

bool Interpreter::torch_optim_function(PyObject* f) { return module_name(f).rfind("torch.optim.", 0) == 0; }

bool Interpreter::is_torch_internal(PyObject* f) {
  const std::string m = module_name(f);
  return m == "torch" || m.rfind("torch.", 0) == 0;  // torchvision and others are user code here
}

namespace {

// Whether torch's checked conversion takes the Python number `v` into dtype `t` (fill_ raises
// "value cannot be converted to type uint8_t without overflow" where it does not): that
// conversion itself, filling a tensor on the CPU. torch fills a tensor of one element without
// the check (float16's 1e6 is inf there, and raises for two elements or none): so does the probe.
bool fits_dtype(PyObject* empty, PyObject* v, DType t, bool one_element) {
  PyObject* shape = Py_BuildValue("(i)", one_element ? 1 : 2);
  PyObject* args = empty ? PyTuple_Pack(1, shape) : nullptr;
  PyObject* kwargs = Py_BuildValue("{s:O}", "dtype", torch_dtype_object(t));
  PyObject* scalar = args && kwargs ? PyObject_Call(empty, args, kwargs) : nullptr;
  PyObject* filled = scalar ? PyObject_CallMethod(scalar, "fill_", "O", v) : nullptr;
  const bool ok = filled != nullptr;
  if (!ok) PyErr_Clear();
  for (PyObject* o : {filled, scalar, kwargs, args, shape}) Py_XDECREF(o);
  return ok;
}

}  // namespace

VarPtr Interpreter::assumed_constant_call(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  // torch._dynamo.assume_constant_result (Hugging Face's is_*_available probes, under their
  // lru_cache too): the marker promises the result is the same at every call, so it is taken
  // now, as TorchDynamo takes it, and not traced (the probes walk importlib's machinery).
  static PyObject* marker = PyUnicode_InternFromString("_dynamo_marked_constant");
  auto marked = [](PyObject* o) {
    PyObject* m = o ? PyObject_GetAttr(o, marker) : nullptr;
    const bool yes = m && PyObject_IsTrue(m) == 1;
    Py_XDECREF(m);
    clear_error();
    return yes;
  };
  // Plain functions, and functools.lru_cache wrappers of them (marked on either): no other
  // object's attribute lookup runs here.
  static PyObject* lru_wrapper = object_at("functools._lru_cache_wrapper");
  bool is_marked = PyFunction_Check(f) && marked(f);
  if (!is_marked && lru_wrapper && PyObject_TypeCheck(f, reinterpret_cast<PyTypeObject*>(lru_wrapper))) {
    PyObject* wrapped = PyObject_GetAttrString(f, "__wrapped__");
    clear_error();
    is_marked = marked(f) || (wrapped && PyFunction_Check(wrapped) && marked(wrapped));
    Py_XDECREF(wrapped);
  }
  if (!is_marked) return nullptr;
  for (const VarPtr& a : args)
    if (!a->is_const() || a->symint().valid()) return nullptr;
  for (const auto& [k, v] : kwargs)
    if (!v->is_const() || v->symint().valid()) return nullptr;
  return real(call_for_real(f, args, kwargs));
}

// torch calls whose answer capture knows (questions about how the code runs, checks, no-ops).
const std::unordered_map<PyObject*, Interpreter::Known>& Interpreter::known_torch_calls() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<PyObject*, Known>();
    const std::pair<const char*, Known> entries[] = {
        {"torch.jit.is_scripting", Known::False},           {"torch.jit.is_tracing", Known::False},
        {"torch._jit_internal.is_scripting", Known::False}, {"torch.compiler.is_compiling", Known::True},
        {"torch.compiler.is_dynamo_compiling", Known::True}, {"torch._utils.is_compiling", Known::True},
        {"torch._C._get_tracing_state", Known::None},       {"torch._assert", Known::Assert},
        {"torch.is_grad_enabled", Known::GradEnabled},      {"torch._C._has_torch_function", Known::False},
        {"torch._C._has_torch_function_unary", Known::False}, {"torch._C._has_torch_function_variadic", Known::False},
        {"torch._C._len_torch_dispatch_stack", Known::Zero}, {"torch._C._log_api_usage_once", Known::NoOp},
        {"torch.is_autocast_enabled", Known::AutocastQuery}, {"torch.is_autocast_cpu_enabled", Known::AutocastQuery},
        {"torch._C._is_any_autocast_enabled", Known::AutocastQuery},
        {"torch.get_default_dtype", Known::StateQuery},     {"torch.is_inference_mode_enabled", Known::StateQuery},
        {"torch._C._get_privateuse1_backend_name", Known::StateQuery},
        {"torch.are_deterministic_algorithms_enabled", Known::Deterministic},
        {"torch._C._get_deterministic_algorithms", Known::Deterministic},
        {"torch.is_deterministic_algorithms_warn_only_enabled", Known::DeterministicWarnOnly},
        {"torch._C._get_deterministic_algorithms_warn_only", Known::DeterministicWarnOnly},
        {"torch.get_autocast_gpu_dtype", Known::AutocastQuery}, {"torch.get_autocast_cpu_dtype", Known::AutocastQuery},
        {"torch.get_autocast_dtype", Known::AutocastQuery}, {"torch.nn.functional.dropout", Known::Dropout},
        {"torch.nn.functional.dropout1d", Known::Dropout},  {"torch.nn.functional.dropout2d", Known::Dropout},
        {"torch.nn.functional.dropout3d", Known::Dropout},  {"torch.nn.functional.alpha_dropout", Known::Dropout},
        {"torch.nn.functional.feature_alpha_dropout", Known::Dropout}, {"torch.as_tensor", Known::AsTensor},
    };
    for (const auto& [path, k] : entries)
      if (PyObject* o = object_at(path)) t->emplace(o, k);
    return t;
  }();
  return *table;
}

// nullptr: no answer here (the call goes on as any other).
VarPtr Interpreter::known_torch_call(Known k, PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs,
                                     bool any_tensor) {
  switch (k) {
    case Known::False:  // not scripted, not traced, plain tensors only (eager's answers)
      return Var::constant(Py_False);
    case Known::True:  // being compiled: as under torch.compile, code takes its graph-friendly path
      return args.empty() ? Var::constant(Py_True) : nullptr;
    case Known::None: return args.empty() ? Var::constant(Py_None) : nullptr;
    case Known::Zero: return args.empty() ? Var::steal_constant(PyLong_FromLong(0)) : nullptr;  // no modes in a graph
    case Known::NoOp: return Var::constant(Py_None);  // usage logging: nothing the program sees
    case Known::GradEnabled: return args.empty() ? Var::constant(root()->grad_mode_ ? Py_True : Py_False) : nullptr;
    case Known::Assert:
      if (args.empty() || !args[0]->is_const()) return nullptr;
      if (!truth(args[0])) unsupported("torch._assert fails: eager raises");
      return Var::constant(Py_None);
    case Known::AutocastQuery: return any_tensor ? nullptr : autocast_query(f, args, kwargs);
    case Known::StateQuery: {
      // torch's global modes that capture does not change, read as they are now
      if (any_tensor || !kwargs.empty()) return nullptr;
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
      for (size_t i = 0; i < args.size(); ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(const_obj(args[i], "argument")));
      PyObject* r = PyObject_Call(f, t, nullptr);
      Py_DECREF(t);
      return real(r);
    }
    case Known::Deterministic:
    case Known::DeterministicWarnOnly: {
      // torch's deterministic-algorithms setting, read now and guarded (the call sees the same)
      if (!args.empty() || !kwargs.empty()) return nullptr;
      const bool on = k == Known::Deterministic ? deterministic_algorithms() : deterministic_algorithms_warn_only();
      out_.guards.add_global_flag(k == Known::Deterministic ? Guard::Kind::Deterministic : Guard::Kind::DeterministicWarnOnly, on);
      return Var::constant(on ? Py_True : Py_False);
    }
    case Known::Dropout: {
      // F.dropout(x, p, training=False) is x; in training it draws random numbers (Python's)
      if (args.empty() || !args[0]->is_tensor()) return nullptr;
      VarPtr training;
      for (auto& [name, v] : kwargs)
        if (name == "training") training = v;
      if (!training && args.size() >= 3) training = args[2];
      return training && training->is_const() && training->known() == Py_False ? args[0] : nullptr;
    }
    case Known::AsTensor: {
      // torch.as_tensor(x, dtype=, device=) of a tensor: x itself where both match, else a copy
      // converted, which is what x.to(device=, dtype=) gives (torch.distributions' log_prob)
      if (args.size() != 1 || !args[0]->is_tensor()) return nullptr;
      KwArgs to_kwargs;
      for (const auto& [name, v] : kwargs) {
        if (name != "dtype" && name != "device") return nullptr;
        if (!v->is_const()) return nullptr;
        if (v->known() != Py_None) to_kwargs.emplace_back(name, v);
      }
      return call_tensor_method(args[0], "to", {}, to_kwargs);
    }
  }
  return nullptr;
}

VarPtr Interpreter::pointwise_of_numbers(PyObject* f, const OpBinding& b, const std::vector<VarPtr>& args,
                                         const KwArgs& kwargs) {
  if (b.op->kind != ops::OpKind::Pointwise || !b.fixed.items().empty()) return nullptr;
  // Python numbers, strings (rounding_mode) and None; tensors only where capture knows them
  auto plain = [&](const VarPtr& v) -> PyObject* {
    if (PyObject* k = known_value(v)) return k;
    if (!v->is_const() || v->symint().valid() || v->symfloat()) return nullptr;
    PyObject* o = v->known();
    return (is_python_scalar(o) || PyUnicode_Check(o) || o == Py_None) ? o : nullptr;
  };
  bool any_number = false;
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
  PyObject* kw = PyDict_New();
  bool ok = t && kw;
  for (size_t i = 0; ok && i < args.size(); ++i) {
    PyObject* o = plain(args[i]);
    ok = o != nullptr;
    if (ok) PyTuple_SET_ITEM(t, i, Py_NewRef(o)), any_number |= is_python_scalar(o) || is_tensor(o);
  }
  for (const auto& [k, v] : kwargs) {
    PyObject* o = ok ? plain(v) : nullptr;
    ok = o && PyDict_SetItemString(kw, k.c_str(), o) == 0;
  }
  PyObject* r = ok && any_number ? PyObject_Call(f, t, kw) : nullptr;
  Py_XDECREF(t);
  Py_XDECREF(kw);
  if (!r) {
    clear_error();  // an error eager raises: the usual path reports it
    return nullptr;
  }
  VarPtr out = known_tensor(r);
  Py_DECREF(r);
  return out;
}

VarPtr Interpreter::call_const(VarPtr fn, std::vector<VarPtr> args, KwArgs kwargs) {
  PyObject* f = fn->obj();
  if (ModeChange m; mode_setter_modes(f, m)) {
    // the __exit__ of a with block a graph break left open (mode_setter.h): its modes from here on
    enter_modes(m);
    root()->out_.modes_after = current_modes();  // and for real, when the call runs
    return Var::constant(Py_False);
  }
  if (VarPtr r = numpy_call(fn, args, kwargs)) return r;  // numpy.cpp: NumPy functions, torch.from_numpy
  // torch.sigmoid(x, out=o), torch.sort(x, out=(v, i)): the call without `out`, written into
  // the tensors named, which keep their dtype (a cast where torch allows one), as copy_ would.
  // Another shape (torch resizes `out`) runs in Python.
  if (auto at = std::find_if(kwargs.begin(), kwargs.end(), [](const auto& kv) { return kv.first == "out"; });
      at != kwargs.end() && is_torch_internal(f)) {
    VarPtr out = at->second;
    if (out->is_const() && out->known() == Py_None) {
      KwArgs rest(kwargs.begin(), kwargs.end());
      rest.erase(rest.begin() + (at - kwargs.begin()));
      return call(fn, std::move(args), std::move(rest));
    }
    std::vector<VarPtr> targets = out->kind() == Var::Kind::Tuple || out->kind() == Var::Kind::List ? out->seq() : std::vector<VarPtr>{out};
    if (targets.empty() || !std::all_of(targets.begin(), targets.end(), [](const VarPtr& t) { return t->is_tensor(); }))
      unsupported("call to " + callable_name(f) + " with an out= kiln cannot write");
    KwArgs rest(kwargs.begin(), kwargs.end());
    rest.erase(rest.begin() + (at - kwargs.begin()));
    VarPtr r = call(fn, std::move(args), std::move(rest));
    std::vector<VarPtr> results = targets.size() == 1 && r->is_tensor() ? std::vector<VarPtr>{r}
                                  : r->kind() == Var::Kind::Tuple ? r->seq() : std::vector<VarPtr>{};
    if (results.size() != targets.size()) unsupported("call to " + callable_name(f) + " with out= of another arity");
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!results[i]->is_tensor() || results[i]->node()->meta.sizes != targets[i]->node()->meta.sizes)
        unsupported("call to " + callable_name(f) + " with out= of another shape (torch resizes it)");
      static PyObject* float_power = resolve_torch("float_power");
      if (f == float_power) exact_result_dtype(targets[i], results[i], "the output given to float_power");
      check_inplace_target(targets[i], "out=");
      mutate(targets[i], results[i]->node());
    }
    return out->kind() == Var::Kind::List ? Var::tuple(targets) : out;
  }
  static PyObject* torch_clone = resolve_torch("clone");
  if (f == torch_clone && args.size() == 1 && args[0]->is_tensor() && !kwargs.empty())
    return call_tensor_method(args[0], "clone", {}, kwargs);  // torch.clone(x, memory_format=...)
  if (const OpBinding* b = function_binding(f)) {
    if (VarPtr r = pointwise_of_numbers(f, *b, args, kwargs)) return r;
    if (VarPtr r = call_op(*b, args, kwargs)) return r;  // else a call the entry leaves to torch
  }
  if (VarPtr r = call_rule(fn, args, kwargs)) return r;  // call_rules.cpp: by the callee object
  if (VarPtr r = optimizer_method(fn, args, kwargs)) return r;  // optimizers.cpp: torch.optim's steps
  // ---- by category ----
  auto python_init = [](PyObject* cls) {  // an __init__ or __new__ written in Python: code to capture
    static PyObject* init = PyUnicode_InternFromString("__init__");
    static PyObject* new_ = PyUnicode_InternFromString("__new__");
    PyObject* i = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(cls), init);
    PyObject* n = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(cls), new_);
    return (i && PyFunction_Check(i)) || (n && (Py_IS_TYPE(n, &PyStaticMethod_Type) || PyFunction_Check(n)));
  };
  if (PyExceptionClass_Check(f) && (!PyType_HasFeature(reinterpret_cast<PyTypeObject*>(f), Py_TPFLAGS_HEAPTYPE) || !python_init(f))) {
    // ValueError("...") (or a user's subclass that keeps its constructor) with Python values:
    // made now, as eager makes it (raised, or caught)
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
    for (size_t i = 0; i < args.size(); ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(const_obj(args[i], "exception argument")));
    PyObject* r = kwargs.empty() ? PyObject_Call(f, t, nullptr) : nullptr;
    Py_DECREF(t);
    if (kwargs.empty()) return real(r);
  }
  if (PyType_Check(f)) {
    // a typing.TypedDict class: calling it makes a plain dict
    static PyObject* typed_dict_meta = object_at("typing._TypedDictMeta");
    if (typed_dict_meta && Py_TYPE(f) == reinterpret_cast<PyTypeObject*>(typed_dict_meta))
      return call(Var::constant(reinterpret_cast<PyObject*>(&PyDict_Type)), std::move(args), std::move(kwargs));
    if (VarPtr r = make_typed_dict(f, args, kwargs)) return r;
    if (VarPtr r = make_torch_module(f, args, kwargs)) return r;
    if (VarPtr r = make_record(f, args, kwargs)) return r;
    if (VarPtr r = make_user_module(f, args, kwargs)) return r;
    if (VarPtr r = make_object(f, args, kwargs)) return r;  // a plain user class: __init__ inlined
  }
  if (const std::string* method = function_as_method(f); method && !args.empty() && args[0]->is_tensor()) {
    // torch.relu_(x), torch.numel(x): the Tensor method of the same name
    std::vector<VarPtr> rest(args.begin() + 1, args.end());
    return call_tensor_method(args[0], *method, std::move(rest), kwargs);
  }
  if (PyMethod_Check(f) && args.empty() && kwargs.empty()) {
    // @torch.no_grad() on a function: its wrapper enters `ctx.clone()`, a fresh context like ctx
    PyObject* self = PyMethod_GET_SELF(f);
    PyObject* fname = PyObject_GetAttrString(PyMethod_GET_FUNCTION(f), "__name__");
    bool clone = fname && PyUnicode_Check(fname) && PyUnicode_CompareWithASCIIString(fname, "clone") == 0;
    Py_XDECREF(fname);
    clear_error();
    static PyObject* inference_mode = resolve_torch("inference_mode");
    PyObject* cls = reinterpret_cast<PyObject*>(Py_TYPE(self));
    if (clone && cls == inference_mode) {
      PyObject* m = PyObject_GetAttrString(self, "mode");
      if (!m) real(nullptr);
      keep_.push_back(m);
      if (VarPtr r = mode_context(cls, {Var::constant(m)}, {})) return r;
    } else if (clone) {
      if (VarPtr r = mode_context(cls, {}, {})) return r;
    }
  }
  if (VarPtr r = builtin_over_trackers(f, args, kwargs)) return r;
  static PyObject* partial_type = object_at("functools.partial");
  if (partial_type && Py_TYPE(f) == reinterpret_cast<PyTypeObject*>(partial_type)) {
    // functools.partial(g, *a, **k)(...): g(*a, ..., **k, ...); its fields are read-only.
    PyObject* pargs = PyObject_GetAttrString(f, "args");
    PyObject* pkw = PyObject_GetAttrString(f, "keywords");
    keep_.push_back(pargs);
    keep_.push_back(pkw);
    std::vector<VarPtr> all;
    for (Py_ssize_t i = 0; pargs && i < PyTuple_GET_SIZE(pargs); ++i) all.push_back(Var::constant(PyTuple_GET_ITEM(pargs, i)));
    all.insert(all.end(), args.begin(), args.end());
    KwArgs kw;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (pkw && PyDict_Check(pkw) && PyDict_Next(pkw, &pos, &k, &v)) kw.emplace_back(PyUnicode_AsUTF8(k), Var::constant(v));
    for (auto& x : kwargs) {  // the call's keywords override the partial's, as partial does
      auto same = std::find_if(kw.begin(), kw.end(), [&](const auto& k) { return k.first == x.first; });
      if (same != kw.end()) same->second = x.second;
      else kw.push_back(x);
    }
    PyObject* inner = PyObject_GetAttrString(f, "func");
    keep_.push_back(inner);
    VarPtr g = fn->source ? wrap(inner, Source::attr(fn->source, "func")) : Var::constant(inner);
    return call(g, std::move(all), std::move(kw));
  }
  if (!args.empty() && args[0]->is_tensor() && Py_TYPE(f) == &PyMethodDescr_Type) {
    // torch.Tensor.matmul(x, y), a method of the tensor class called through the class: x.matmul(y)
    PyObject* owner = reinterpret_cast<PyObject*>(PyDescr_TYPE(f));
    if (PyObject_IsSubclass(resolve_torch("Tensor"), owner) == 1) {
      std::vector<VarPtr> rest(args.begin() + 1, args.end());
      return call(getattr(args[0], PyUnicode_AsUTF8(PyDescr_NAME(f))), std::move(rest), std::move(kwargs));
    }
    if (PyErr_Occurred()) clear_error();
  }
  if (is_compiled_function(f) && !compiled_function_disabled(f)) {
    // A compiled function called from compiled code: its body is inlined into this graph.
    PyObject* target = compiled_function_target(f);
    if (PyFunction_Check(target) && fn->source)
      return inline_call(target, Source::attr(fn->source, "__wrapped__"), std::move(args), kwargs);
  }
  {
    // A method of a private copy (its bound method, or its function called with it first), and
    // setattr on one: run for real, on the capture's own object.
    PyObject* receiver = PyMethod_Check(f) ? PyMethod_GET_SELF(f)
                         : (!args.empty() && args[0]->is_const() &&
                            (PyFunction_Check(f) || f == builtin("setattr") || f == builtin("delattr")))
                             ? args[0]->known() : nullptr;
    if (receiver && is_private(receiver)) return real(call_for_real(f, args, kwargs));
  }
  if (VarPtr r = assumed_constant_call(f, args, kwargs)) return r;
  if (PyFunction_Check(f) && !is_torch_internal(f)) return inline_call(f, fn->source, std::move(args), kwargs);
  if (VarPtr r = autograd_function_apply(fn, args, kwargs)) return r;
  if (PyFunction_Check(f) && !args.empty() && args[0]->get_if<ModuleV>() && own_forward_of(args[0]->get_if<ModuleV>()->module, f))
    // nn.LayerNorm.forward(self, x) in a subclass's forward (SqueezeBERT): that class's forward,
    // inlined on the module, as a call of the module inlines it
    return inline_call(f, fn->source, std::move(args), kwargs);
  if (PyFunction_Check(f) && fn->source)
    if (PyObject* inner = dynamo_disabled_torch_function(f))
      return inline_call(inner, Source::attr(fn->source, "__wrapped__"), std::move(args), kwargs);
  {
    // A functools.lru_cache / cache helper: its function inlined, the cache neither read nor
    // filled, as TorchDynamo does (the function's result is what the cache would hold, for the
    // pure helpers such caches wrap).
    static PyObject* lru_wrapper = object_at("functools._lru_cache_wrapper");
    if (lru_wrapper && PyObject_TypeCheck(f, reinterpret_cast<PyTypeObject*>(lru_wrapper)) && fn->source) {
      PyObject* wrapped = PyObject_GetAttrString(f, "__wrapped__");
      if (!wrapped) clear_error();
      if (wrapped && PyFunction_Check(wrapped)) {
        keep_.push_back(wrapped);
        log("graph_breaks", "inlining " + callable_name(f) + " through its lru_cache wrapper (the cache is not used)");
        return inline_call(wrapped, Source::attr(fn->source, "__wrapped__"), std::move(args), kwargs);
      }
      Py_XDECREF(wrapped);
    }
  }
  // A method of one of torch's Python objects that hold state (GradScaler.scale, which makes
  // its scale on first use) is inlined like a user's: as an extern its layout probe would run it
  // on meta tensors, for real, leaving meta tensors in the object.
  const bool stateful_torch_method = PyMethod_Check(f) && PyFunction_Check(PyMethod_GET_FUNCTION(f)) &&
                                     !is_tensor(PyMethod_GET_SELF(f)) && !is_nn_module(PyMethod_GET_SELF(f)) &&
                                     !PyModule_Check(PyMethod_GET_SELF(f)) && !PyType_Check(PyMethod_GET_SELF(f));
  if (PyMethod_Check(f) && PyFunction_Check(PyMethod_GET_FUNCTION(f)) &&
      (!is_torch_internal(PyMethod_GET_FUNCTION(f)) || stateful_torch_method)) {
    // A bound method of a user object: inline its function with the receiver first.
    static PyObject* environ = object_at("os.environ");
    if (PyMethod_GET_SELF(f) == environ && kwargs.empty()) {
      // os.environ.get("FLAG", "0") (and os.getenv, which calls it): read now, and the variable
      // guarded (its value, or its absence), so that setting it later recompiles
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
      for (size_t i = 0; i < args.size(); ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(const_obj(args[i], "argument")));
      PyObject* r = PyObject_Call(f, t, nullptr);
      Py_DECREF(t);
      PyObject* key = args.empty() ? nullptr : const_obj(args[0], "argument");
      if (r && key && PyUnicode_Check(key)) {
        SourcePtr env = Source::pinned_object(environ, "os.environ");
        PyObject* now = PyObject_GetItem(environ, key);
        if (now) out_.guards.add_equals(Source::key_of(env, key), now);
        else clear_error(), out_.guards.add_haskey(env, key, false);
        Py_XDECREF(now);
      }
      return real(r);
    }
    if (!fn->source && is_torch_internal(PyMethod_GET_FUNCTION(f))) {
      // a method of one of torch's objects that capture holds as a constant (a distribution's
      // constraint, read from its class's arg_constraints): inlined on it, as torch's own
      // objects are taken as fixed
      args.insert(args.begin(), Var::constant(PyMethod_GET_SELF(f)));
      keep_.push_back(Py_NewRef(f));
      return inline_call(PyMethod_GET_FUNCTION(f), nullptr, std::move(args), kwargs);
    }
    if (!fn->source) unsupported("bound method " + callable_name(f) + " with no known source");
    VarPtr self = wrap(PyMethod_GET_SELF(f), Source::attr(fn->source, "__self__"));
    args.insert(args.begin(), self);
    if (PyObject* inner = dynamo_disabled_torch_function(PyMethod_GET_FUNCTION(f)))
      return inline_call(inner, Source::attr(Source::attr(fn->source, "__func__"), "__wrapped__"), std::move(args), kwargs);
    return inline_call(PyMethod_GET_FUNCTION(f), Source::attr(fn->source, "__func__"), std::move(args), kwargs);
  }
  if (fn->source && !PyType_Check(f) && !PyCFunction_Check(f) &&
      PyObject_HasAttrString(reinterpret_cast<PyObject*>(Py_TYPE(f)), "__call__")) {
    PyObject* call_attr = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(f)), "__call__");
    bool python = call_attr && PyFunction_Check(call_attr);
    Py_XDECREF(call_attr);
    clear_error();
    if (python) return call(getattr(fn, "__call__"), std::move(args), std::move(kwargs));  // obj(x): type(obj).__call__
  }
  std::string name = callable_name(f);
  std::function<bool(const VarPtr&)> has_tensor = [&](const VarPtr& a) {
    if (a->in_graph()) return true;
    if (a->kind() == Var::Kind::Tuple || a->kind() == Var::Kind::List) return std::any_of(a->seq().begin(), a->seq().end(), has_tensor);
    return false;
  };
  bool any_tensor = std::any_of(args.begin(), args.end(), has_tensor) ||
                    std::any_of(kwargs.begin(), kwargs.end(), [&](auto& kv) { return has_tensor(kv.second); });
  if (auto known = known_torch_calls().find(f); known != known_torch_calls().end())
    if (VarPtr r = known_torch_call(known->second, f, args, kwargs, any_tensor)) return r;
  // Values a call to torch cannot be handed (an object made in the function: custom_fwd's
  // `_cast` of the ctx with the inputs): a Python function of torch's is inlined instead.
  std::function<bool(const VarPtr&)> passable = [&](const VarPtr& a) {
    if (a->kind() == Var::Kind::Tuple || a->kind() == Var::Kind::List) return std::all_of(a->seq().begin(), a->seq().end(), passable);
    return a->kind() == Var::Kind::Tensor || a->kind() == Var::Kind::Const;
  };
  const bool all_passable = std::all_of(args.begin(), args.end(), passable) &&
                            std::all_of(kwargs.begin(), kwargs.end(), [&](auto& kv) { return passable(kv.second); });
  if (any_tensor && is_torch_internal(f) && !all_passable && PyFunction_Check(f))
    return inline_call(f, fn->source, std::move(args), kwargs);
  // torch.optim's functional updates (adagrad(params, grads, ...)): Python over torch's ops,
  // updating the state tensors in place, which a call to torch would hide from the graph
  if (any_tensor && PyFunction_Check(f) && torch_optim_function(f)) {
    // While compiling, torch.optim keeps the step count a float32 tensor and derives step sizes
    // from it in float32 (as under torch.compile), where eager reads it as a Python float: within
    // float32's rounding, not float64's. Float64 parameters' updates run in Python.
    std::function<bool(const VarPtr&)> f64 = [&](const VarPtr& a) {
      if (a->kind() == Var::Kind::Tuple || a->kind() == Var::Kind::List) return std::any_of(a->seq().begin(), a->seq().end(), f64);
      return a->is_tensor() && a->node()->meta.dtype == DType::Float64;
    };
    if (std::any_of(args.begin(), args.end(), f64))
      unsupported("torch.optim update of float64 parameters (its compiled form derives step sizes in float32)");
    return inline_call(f, fn->source, std::move(args), kwargs);
  }
  if (any_tensor && is_torch_internal(f)) {
    if (VarPtr r = torch_extern(f, name, args, kwargs)) return r;
    // a torch Python helper that answers with Python values (a check, a size): inlined
    return inline_call(f, fn->source, std::move(args), kwargs);
  }
  static const std::unordered_set<PyObject*> factories = [this] {
    // a tensor from Python values alone, made by the graph at each call
    std::unordered_set<PyObject*> s;
    for (const char* fac : {"arange", "zeros", "ones", "full", "tensor", "as_tensor", "eye", "linspace", "logspace",
                            "scalar_tensor"})
      if (PyObject* o = resolve_torch(fac)) s.insert(o);
    return s;
  }();
  if (!any_tensor && factories.count(f))
    if (VarPtr r = torch_extern(f, name, args, kwargs)) return r;
  if (VarPtr drawn = random_draw(f, args, kwargs)) return drawn;  // torch.rand(4, 8): kiln's draw
  // torch's own Python helpers on Python values (F._none_or_dtype, ...): inlined like user code
  if (!any_tensor && PyFunction_Check(f)) return inline_call(f, fn->source, std::move(args), kwargs);
  if (is_namedtuple_class(f)) return make_namedtuple(f, args, kwargs);
  // itertools, functools.reduce, operator, sum(start=), sorted(key=), min/max over tensors, and
  // dict.fromkeys: their Python model, traced like user code (kiln/_polyfills.py)
  if (PyObject* model = polyfill_of(f, any_tensor)) return inline_call(model, nullptr, std::move(args), kwargs);
  if (any_tensor && !fn->source && PyCFunction_Check(f) && PyCFunction_GET_SELF(f) && PyAnySet_CheckExact(PyCFunction_GET_SELF(f)) &&
      args.size() == 1 && kwargs.empty() && args[0]->is_tensor()) {
    // s.add(x), s.discard(x) on a set the function made: x hashes by identity, as its stand-in
    // key object (key_obj) does, which the set already holds where it holds x
    PyObject* r = PyObject_CallOneArg(f, key_obj(args[0], "set item"));
    return real(r);
  }
  if (any_tensor) unsupported("call to " + name + " with tensor arguments is not captured");
  // Reduction("sum"): an Enum member looked up by value, a constant (an unknown value raises
  // ValueError when the call runs eagerly)
  if (is_enum_class(f) && args.size() == 1 && kwargs.empty() && args[0]->is_const()) {
    PyObject* member = PyObject_CallOneArg(f, args[0]->obj());
    if (!member) {
      clear_error();
      unsupported("call to " + name + " with a value it has no member for");
    }
    return Var::steal_constant(member);
  }
  if (PyWeakref_CheckRef(f) && args.empty() && kwargs.empty()) {
    // ref(): the object it refers to (torch's RNN modules test their weights' identity so),
    // read through the weakref's source and guarded like any read
    PyObject* referent = PyWeakref_GetObject(f);  // borrowed; None once dead
    return fn->source ? wrap(referent, Source::deref(fn->source)) : Var::constant(referent);
  }
  if (!args.empty())  // object.__getattribute__(obj, key)
    if (VarPtr r = generic_getattr(f, args[0], std::vector<VarPtr>(args.begin() + 1, args.end()), kwargs)) return r;
  if (!pure_callable(f) && !(!fn->source && private_container_method(f))) unsupported("call to " + name);
  // An iterator object (a generator the caller made: model.parameters()) would be used up by
  // the call (list, sum, sorted, ...) here, and then be empty when the code runs for real after
  // a break: the call runs in Python. Calls that only look at the object are made.
  static const std::set<PyObject*> looks = [this] {
    std::set<PyObject*> s;
    for (const char* n : {"type", "isinstance", "issubclass", "hasattr", "getattr", "callable", "repr", "str"}) s.insert(builtin(n));
    return s;
  }();
  // "-".join(str(v) for v in l): a generator the frame made, taken whole as the method takes it
  PyObject* join_self = PyCFunction_Check(f) ? PyCFunction_GET_SELF(f) : nullptr;
  if (join_self && (PyUnicode_CheckExact(join_self) || PyBytes_CheckExact(join_self)) && args.size() == 1 &&
      args[0]->kind() == Var::Kind::Iterator && std::string(reinterpret_cast<PyCFunctionObject*>(f)->m_ml->ml_name) == "join")
    args[0] = Var::tuple(drain(args[0]));
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
  for (size_t i = 0; i < args.size(); ++i) {
    PyObject* o = const_obj(args[i], "argument");
    if (PyIter_Check(o) && !looks.count(f)) {
      Py_DECREF(tuple);
      unsupported("call to " + name + " would use up an iterator of the caller's (" + Py_TYPE(o)->tp_name + "), so it runs in Python");
    }
    Py_INCREF(o);
    PyTuple_SET_ITEM(tuple, i, o);
  }
  PyObject* kw = nullptr;
  if (!kwargs.empty()) {
    kw = PyDict_New();
    for (auto& [k, v] : kwargs) PyDict_SetItemString(kw, k.c_str(), const_obj(v, "argument"));
  }
  PyObject* r = PyObject_Call(f, tuple, kw);
  Py_DECREF(tuple);
  Py_XDECREF(kw);
  return real(r);
}

VarPtr Interpreter::order_by_key(PyObject* f, const VarPtr& iterable, const KwArgs& kwargs) {
  // sorted(items, key=fn, reverse=r), min/max(items, key=fn): fn called on each item as the
  // code would call it (a lambda made here, a method), and Python orders the items by the keys
  // it gave, where they are Python values. nullptr: another keyword, or keys that are tensors.
  VarPtr key, reverse, fallback;
  for (const auto& [k, v] : kwargs) {
    if (k == "key") key = v;
    else if (k == "reverse" && f == builtin("sorted")) reverse = v;
    else if (k == "default" && f != builtin("sorted")) fallback = v;  // min/max of nothing
    else return nullptr;
  }
  const std::vector<VarPtr> items = items_of(iterable);  // drained once answered
  if (fallback && items.empty()) {
    drain(iterable);
    return fallback;
  }
  PyObject* keys = PyList_New(0);
  keep_.push_back(keys);
  // a key of Python values: a constant, or a tuple of them (key=lambda v: (v.rank, -v.size))
  std::function<bool(const VarPtr&)> python_value = [&](const VarPtr& v) {
    if (v->kind() == Var::Kind::Tuple) return std::all_of(v->seq().begin(), v->seq().end(), python_value);
    return v->is_const() && !v->symint().valid() && !v->symfloat() && !structural(v);
  };
  for (const VarPtr& item : items) {
    VarPtr k = key && !(key->is_const() && key->known() == Py_None) ? call(key, {item}, {}) : item;
    if (!python_value(k)) return nullptr;
    if (PyList_Append(keys, const_obj(k, "sort key")) < 0) real(nullptr);
  }
  PyObject* count = PyLong_FromSsize_t(PyList_GET_SIZE(keys));
  PyObject* positions = PyObject_CallOneArg(reinterpret_cast<PyObject*>(&PyRange_Type), count);
  Py_DECREF(count);
  keep_.push_back(positions);
  PyObject* by = PyObject_GetAttrString(keys, "__getitem__");
  keep_.push_back(by);
  PyObject* kw = Py_BuildValue("{s:O}", "key", by);
  keep_.push_back(kw);
  if (reverse && PyDict_SetItemString(kw, "reverse", const_obj(reverse, "reverse")) < 0) real(nullptr);
  PyObject* a = PyTuple_Pack(1, positions);
  keep_.push_back(a);
  PyObject* r = PyObject_Call(f, a, kw);  // the positions in order (min/max: one), or Python's error
  if (!r) real(nullptr);
  keep_.push_back(r);
  drain(iterable);
  if (PyLong_Check(r)) return items[PyLong_AsSize_t(r)];
  std::vector<VarPtr> ordered;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(r); ++i) ordered.push_back(items[PyLong_AsSize_t(PyList_GET_ITEM(r, i))]);
  return Var::list(std::move(ordered));
}

VarPtr Interpreter::builtin_over_trackers(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  auto tracker = [](const VarPtr& v) {
    return v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List || v->kind() == Var::Kind::Dict ||
           v->kind() == Var::Kind::Iterator;
  };
  if ((f == builtin("sorted") || f == builtin("min") || f == builtin("max")) && args.size() == 1 && !kwargs.empty())
    if (VarPtr r = order_by_key(f, args[0], kwargs)) return r;
  if (!kwargs.empty()) return nullptr;
  if ((f == builtin("min") || f == builtin("max")) && args.size() >= 2 && kwargs.empty()) {
    // max(n - w + 1, 0) over symbolic ints: a min/max expression, not the values at capture
    bool symbolic = false, ints = true;
    std::vector<sym::Expr> xs;
    for (const VarPtr& v : args) {
      sym::Expr e = v->symint();
      symbolic |= e.valid();
      PyObject* o = v->is_const() ? v->known() : nullptr;
      if (!e.valid() && o && PyLong_CheckExact(o)) e = sym::Expr(static_cast<int64_t>(PyLong_AsLongLong(o)));
      ints = ints && e.valid();
      xs.push_back(e);
    }
    if (symbolic && ints) {
      sym::Expr r = xs[0];
      for (size_t i = 1; i < xs.size(); ++i) r = f == builtin("max") ? sym::max(r, xs[i]) : sym::min(r, xs[i]);
      return Var::symint(r, root()->out_.guards.value_at_hints(r));
    }
    // max(a.sum(), b.sum()) over 0-d tensors of one dtype and device: Python keeps the first
    // unless a later one compares greater (less, for min), so a NaN first stays, a NaN later is
    // passed over: where(b > a, b, a), folded left. Tensors of more elements make eager raise
    // (a Tensor's truth value is ambiguous), and mixed dtypes would come back promoted: left.
    bool scalars = true;
    for (const VarPtr& v : args)
      scalars = scalars && v->is_tensor() && v->node()->meta.dim() == 0 &&
                v->node()->meta.dtype == args[0]->node()->meta.dtype && v->node()->meta.device == args[0]->node()->meta.device;
    if (scalars) {
      const char* cmp = f == builtin("max") ? "gt" : "lt";
      ir::Node* r = args[0]->node();
      for (size_t i = 1; i < args.size(); ++i) {
        ir::Node* b = args[i]->node();
        r = add_node("where", {add_node(cmp, {b, r}, {}), b, r}, {});
      }
      return Var::tensor(r);
    }
  }
  if ((f == builtin("list") || f == builtin("tuple")) && args.empty()) return Var::tuple({}, f == builtin("list"));
  // An object made in the frame, or a container module of the caller's (list(self.layers)):
  // iterated through items_of, so a module's children keep their sources and guards.
  auto is_object = [](const VarPtr& v) {
    if (v->kind() == Var::Kind::Module) return v->source && is_container_module(v->obj());
    return v->kind() == Var::Kind::Record && v->as<RecordV>().plain;
  };
  if (std::any_of(args.begin(), args.end(), is_object)) {
    // builtins that iterate an object made in the frame: over the items its __iter__ gives
    bool consumer = false;
    for (const char* c : {"sum", "list", "tuple", "min", "max", "sorted", "any", "all", "enumerate", "zip", "map", "filter"})
      consumer |= f == builtin(c);
    if (consumer) {
      std::vector<VarPtr> iterated = args;
      for (VarPtr& a : iterated)
        if (is_object(a)) a = Var::iterator(items_of(a));
      return builtin_over_trackers(f, iterated, kwargs);
    }
  }
  if (f == builtin("dict") && args.empty()) return Var::dict();
  if (f == builtin("map") && args.size() >= 2 && std::any_of(args.begin() + 1, args.end(), tracker)) {
    std::vector<std::vector<VarPtr>> cols;
    for (size_t i = 1; i < args.size(); ++i) cols.push_back(items_of(args[i]));
    size_t n = cols[0].size();
    for (auto& c : cols) n = std::min(n, c.size());
    std::vector<VarPtr> out;
    for (size_t j = 0; j < n; ++j) {
      std::vector<VarPtr> call_args;
      for (auto& c : cols) call_args.push_back(c[j]);
      out.push_back(call(args[0], std::move(call_args), {}));
    }
    VarPtr it = Var::iterator(std::move(out));
    return it;
  }
  if (f == builtin("filter") && args.size() == 2 && (tracker(args[1]) || args[0]->kind() == Var::Kind::Function)) {
    std::vector<VarPtr> out;
    for (const VarPtr& x : items_of(args[1])) {
      bool keep = args[0]->is_const() && args[0]->known() == Py_None ? truth(x) : truth(call(args[0], {x}, {}));
      if (keep) out.push_back(x);
    }
    VarPtr it = Var::iterator(std::move(out));
    return it;
  }
  if (args.empty() || !tracker(args[0])) return nullptr;
  const VarPtr& a = args[0];
  if (f == builtin("len") && args.size() == 1 && a->kind() != Var::Kind::Iterator)
    return Var::steal_constant(PyLong_FromSize_t(a->kind() == Var::Kind::Dict ? a->entries().values.size() : a->seq().size()));
  if ((f == builtin("list") || f == builtin("tuple")) && args.size() == 1) return Var::tuple(drain(a), f == builtin("list"));
  if (f == builtin("dict") && args.size() == 1) {
    VarPtr d = Var::dict();
    if (a->kind() == Var::Kind::Dict) {
      for (auto& [k, v] : dict_entries(a)) dict_set(d, k, v);
    } else {
      for (const VarPtr& pair : drain(a)) {
        std::vector<VarPtr> kv = items_of(pair);
        if (kv.size() != 2) unsupported("dict() of items that are not pairs");
        dict_set(d, key_obj(kv[0], "dict key"), kv[1]);
      }
    }
    return d;
  }
  if ((f == builtin("min") || f == builtin("max") || f == builtin("sorted") || f == builtin("set") ||
       f == builtin("frozenset")) && args.size() == 1) {
    // over values known here: Python computes it; items holding tensors (sorted(d.items())) go
    // to the Python models (kiln/_polyfills.py), which compare them as Python does
    std::vector<VarPtr> items = items_of(a);
    std::function<bool(const VarPtr&)> holds_tensor = [&](const VarPtr& v) {
      if (v->in_graph()) return true;
      return (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List) &&
             std::any_of(v->seq().begin(), v->seq().end(), holds_tensor);
    };
    if (std::any_of(items.begin(), items.end(), holds_tensor)) return nullptr;
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
    for (size_t i = 0; i < items.size(); ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(const_obj(items[i], "item")));
    PyObject* r = PyObject_CallOneArg(f, t);
    Py_DECREF(t);
    return real(r);
  }
  if (f == builtin("sum") && (args.size() == 1 || args.size() == 2)) {
    VarPtr acc = args.size() == 2 ? args[1] : Var::steal_constant(PyLong_FromLong(0));
    if (PyObject* s = acc->is_const() ? acc->known() : nullptr; s && (PyUnicode_Check(s) || PyBytes_Check(s) || PyByteArray_Check(s))) {
      PyErr_Format(PyExc_TypeError, "sum() can't sum %s [use %s''.join(seq) instead]",
                   PyUnicode_Check(s) ? "strings" : PyBytes_Check(s) ? "bytes" : "bytearray", PyUnicode_Check(s) ? "" : "b");
      real(nullptr);
    }
    for (const VarPtr& x : items_of(a)) acc = binary("NB_ADD", acc, x);
    return acc;
  }
  if ((f == builtin("any") || f == builtin("all")) && args.size() == 1) {
    bool any = f == builtin("any");
    for (const VarPtr& x : items_of(a))
      if (truth(x) == any) return Var::constant(any ? Py_True : Py_False);
    return Var::constant(any ? Py_False : Py_True);
  }
  if (f == builtin("isinstance") && args.size() == 2) {
    PyTypeObject* t = a->kind() == Var::Kind::Tuple ? &PyTuple_Type : a->kind() == Var::Kind::List ? &PyList_Type : &PyDict_Type;
    PyObject* cls = reinterpret_cast<PyObject*>(t);
    if (auto* dv = a->get_if<DictV>(); dv && dv->cls) cls = dv->cls;  // an OrderedDict, a defaultdict
    if (auto* tv = a->get_if<TupleV>(); tv && tv->structseq) cls = tv->structseq;  // a namedtuple's class
    if (auto* lv = a->get_if<ListV>()) {
      static PyObject* deque = object_at("collections.deque");
      if (lv->deque) cls = deque;
      if (lv->sliced_module) return nullptr;  // the module's container class: asked elsewhere
    }
    int r = PyObject_IsSubclass(cls, const_obj(args[1], "class"));
    if (r < 0) real(nullptr);
    return Var::constant(r ? Py_True : Py_False);
  }
  return nullptr;
}

bool Interpreter::private_container_method(PyObject* f) {
  if (!PyCFunction_Check(f)) return false;
  PyObject* self = PyCFunction_GET_SELF(f);
  return self && (PyList_CheckExact(self) || PyDict_CheckExact(self) || PySet_CheckExact(self));
}

// A class made by collections.namedtuple or typing.NamedTuple: a tuple subclass with `_fields`
// and `_make` (what TorchDynamo tests too).
bool Interpreter::is_namedtuple_class(PyObject* f) {
  if (!PyType_Check(f) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(f), &PyTuple_Type) || f == reinterpret_cast<PyObject*>(&PyTuple_Type))
    return false;
  PyObject* fields = PyObject_GetAttrString(f, "_fields");
  PyObject* make = fields ? PyObject_GetAttrString(f, "_make") : nullptr;
  if (!make) clear_error();
  const bool yes = fields && make && PyTuple_Check(fields);
  Py_XDECREF(fields);
  Py_XDECREF(make);
  return yes;
}

// What makes a tuple of `type` from a plain tuple at the boundary: a structseq's type itself
// (torch.return_types.max((values, indices))), a namedtuple class's `_make`. New reference.
PyObject* Interpreter::tuple_maker(PyObject* type) {
  if (!is_namedtuple_class(type)) return Py_NewRef(type);
  PyObject* make = PyObject_GetAttrString(type, "_make");
  if (!make) unsupported("a namedtuple class without _make");
  return make;
}

// The index of field `name` in a namedtuple class's `_fields`, or -1.
Py_ssize_t Interpreter::namedtuple_field(PyObject* fields, const std::string& name) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); ++i)
    if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(fields, i), name.c_str()) == 0) return i;
  return -1;
}

// NT(a, b=x): a tuple tracker of the class, its items the arguments bound to the fields (with
// the class's defaults), as the generated __new__ binds them.
VarPtr Interpreter::make_namedtuple(PyObject* cls, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  PyObject* fields = PyObject_GetAttrString(cls, "_fields");
  PyObject* defaults = PyObject_GetAttrString(cls, "_field_defaults");
  if (!defaults) clear_error();
  keep_.push_back(fields);
  if (defaults) keep_.push_back(defaults);
  const Py_ssize_t n = PyTuple_GET_SIZE(fields);
  if (static_cast<Py_ssize_t>(args.size()) > n) unsupported("too many arguments to a namedtuple");
  std::vector<VarPtr> items(static_cast<size_t>(n));
  for (size_t i = 0; i < args.size(); ++i) items[i] = args[i];
  for (const auto& [k, v] : kwargs) {
    const Py_ssize_t at = namedtuple_field(fields, k);
    if (at < 0 || items[static_cast<size_t>(at)]) unsupported("namedtuple argument " + k + " (unknown or given twice)");
    items[static_cast<size_t>(at)] = v;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (items[static_cast<size_t>(i)]) continue;
    PyObject* d = defaults && PyDict_Check(defaults) ? PyDict_GetItem(defaults, PyTuple_GET_ITEM(fields, i)) : nullptr;
    if (!d) unsupported("a namedtuple field without a value or default");
    items[static_cast<size_t>(i)] = Var::constant(d);
  }
  VarPtr t = Var::tuple(std::move(items));
  t->as<TupleV>().structseq = Py_NewRef(cls);
  return t;
}

bool Interpreter::is_enum_class(PyObject* o) {
  static PyObject* meta = [] {
    PyObject* m = PyImport_ImportModule("enum");
    PyObject* t = m ? PyObject_GetAttrString(m, "EnumMeta") : nullptr;
    Py_XDECREF(m);
    if (!t) PyErr_Clear();
    return t;
  }();
  return meta && PyType_Check(o) && PyObject_IsInstance(o, meta) == 1;
}

bool Interpreter::pure_callable(PyObject* f) {
  static const char* names[] = {"len",   "abs",     "min",        "max",     "int",     "float",     "bool",
                                "range", "tuple",   "list",       "round",   "pow",     "divmod",    "isinstance",
                                "sum",   "any",     "all",        "str",     "hasattr", "getattr",   "set",
                                "frozenset", "sorted", "callable", "repr",   "dict",    "issubclass", "chr", "ord", "slice", "hash",
                                "format", "bin", "hex", "oct", "ascii"};
  for (const char* n : names)
    if (f == builtin(n)) return true;
  // The operator module's functions that compute a value from their operands (not the in-place
  // ones, nor setitem/delitem): operator.add(len(l), 2), functools.reduce(operator.mul, dims)
  static const std::set<PyObject*> operator_values = [] {
    std::set<PyObject*> s;
    for (const char* n : {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq", "ne", "lt",
                          "le", "gt", "ge", "not_", "truth", "and_", "or_", "xor", "lshift", "rshift", "invert", "inv",
                          "index", "concat", "contains", "countOf", "indexOf", "getitem", "is_", "is_not", "matmul"})
      if (PyObject* o = object_at(std::string("operator.") + n)) s.insert(o);
    return s;
  }();
  if (operator_values.count(f)) return true;
  // str.isalnum(c), int.bit_length(n): a method of an immutable builtin type, called through the type
  if (Py_IS_TYPE(f, &PyMethodDescr_Type)) {
    PyTypeObject* owner = PyDescr_TYPE(f);
    if (owner == &PyUnicode_Type || owner == &PyLong_Type || owner == &PyFloat_Type || owner == &PyBytes_Type ||
        owner == &PyTuple_Type || owner == &PyFrozenSet_Type || owner == &PyComplex_Type)
      return true;
  }
  if (f == builtin("type")) return true;  // type(obj) of a Python value
  static PyObject* finfo = resolve_torch("finfo");
  static PyObject* iinfo = resolve_torch("iinfo");
  static PyObject* promote_types = resolve_torch("promote_types");
  static PyObject* device = resolve_torch("device");
  static PyObject* size = resolve_torch("Size");
  if (f == size) return true;  // torch.Size((4, 6)): a tuple of ints
  if (f == finfo || f == iinfo || f == promote_types) return true;  // limits of a dtype, dtypes combined
  if (f == device) return true;  // torch.device("cuda", 0): a value, made from its arguments
  // Methods of strings, numbers and tuples (immutable receivers): "{}".format, "-".join, ...
  if (PyCFunction_Check(f)) {
    PyObject* self = PyCFunction_GET_SELF(f);
    if (self && (PyUnicode_Check(self) || PyLong_Check(self) || PyFloat_Check(self) || PyTuple_Check(self) ||
                 PyBytes_Check(self) || PyFrozenSet_CheckExact(self)))  // (keyword.iskeyword: a frozenset's __contains__)
      return true;
  }
  PyObject* mod = PyObject_GetAttrString(f, "__module__");
  if (!mod) clear_error();
  bool math = mod && PyUnicode_Check(mod) && std::string(PyUnicode_AsUTF8(mod)) == "math";
  Py_XDECREF(mod);
  if (!math) {
    // Builtin functions of the math module report no __module__ on some versions.
    PyObject* self = PyCFunction_Check(f) ? PyCFunction_GET_SELF(f) : nullptr;
    math = self && PyModule_Check(self) && std::string(PyModule_GetName(self)) == "math";
    if (PyErr_Occurred()) clear_error();
  }
  if (math) return true;
  DType t;
  return dtype_from_object(f, t);
}

PyObject* Interpreter::builtin(const char* name) { return PyDict_GetItemString(builtins_, name); }

PyObject* Interpreter::resolve_torch(const std::string& attr) {
  static PyObject* torch = PyImport_ImportModule("torch");
  PyObject* r = PyObject_GetAttrString(torch, attr.c_str());
  if (!r) clear_error();
  if (r) keep_.push_back(r);
  return r;
}

std::string Interpreter::callable_name(PyObject* f) {
  PyObject* mod = PyObject_GetAttrString(f, "__module__");
  PyObject* qn = PyObject_GetAttrString(f, "__qualname__");
  clear_error();
  std::string m = mod && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : "";
  std::string q = qn && PyUnicode_Check(qn) ? PyUnicode_AsUTF8(qn) : Py_TYPE(f)->tp_name;
  Py_XDECREF(mod);
  Py_XDECREF(qn);
  if (m == "torch" || m.empty()) return m.empty() ? q : "torch." + q;
  return m + "." + q;
}

VarPtr Interpreter::full_node(const std::vector<VarPtr>& size, const VarPtr& value, bool infer_dtype, PyObject* dtype,
                              PyObject* device) {
  std::vector<VarPtr> items = size;
  if (size.size() == 1 && (size[0]->kind() == Var::Kind::Tuple || size[0]->kind() == Var::Kind::List)) items = size[0]->seq();
  std::vector<sym::Expr> sizes;
  bool symbolic = false;
  for (const VarPtr& v : items) {
    if (sym::Expr e = v->symint(); e.valid()) {
      sizes.push_back(e);
      symbolic = true;
      continue;
    }
    PyObject* o = v->is_const() ? v->known() : nullptr;
    if (!o || !PyLong_CheckExact(o)) return nullptr;
    sizes.push_back(sym::Expr(static_cast<int64_t>(PyLong_AsLongLong(o))));
  }
  PyObject* fill = value->is_const() ? value->obj() : nullptr;  // a symbolic float: specialized
  if (!symbolic || !fill || !is_python_scalar(fill)) return nullptr;
  DType t;
  if (dtype && dtype != Py_None) {
    if (!dtype_from_object(dtype, t)) return nullptr;
  } else if (infer_dtype && PyBool_Check(fill)) {
    t = DType::Bool;
  } else if (infer_dtype && PyLong_Check(fill)) {
    t = DType::Int64;
  } else {
    static PyObject* default_dtype = resolve_torch("get_default_dtype");
    PyObject* d = PyObject_CallNoArgs(default_dtype);
    bool ok = d && dtype_from_object(d, t);
    Py_XDECREF(d);
    if (!ok) return nullptr;
  }
  std::optional<std::string> d = device_name(device);
  if (!d) return nullptr;
  const std::string& where = *d;
  if (where != "cpu" && where.rfind("cuda", 0) != 0) return nullptr;
  ir::Attrs a;
  a.set("size", sizes);
  a.set("value", PyFloat_AsDouble(fill));
  a.set("dtype", t);
  a.set("device", where);
  return Var::tensor(add_node("full", {}, a));
}

int64_t Interpreter::concrete_size(const sym::Expr& e) {
  if (auto c = e.as_const()) return *c;
  GuardSet& guards = root()->out_.guards;
  std::vector<sym::Expr> syms;
  sym::collect_symbols(e, syms);
  for (const sym::Expr& s : syms) {
    if (!guards.specialized(s) && log_enabled("guards"))
      log("guards", "specialized " + s.str() + " (a size a torch operator or a Python value needs) at " + location());
    guards.specialize(s);
  }
  return guards.value_at_hints(e);
}

VarPtr Interpreter::size_const(const sym::Expr& e) {
  if (e.as_const()) return Var::steal_constant(PyLong_FromLongLong(*e.as_const()));
  // A symbolic int: shape arithmetic and view sizes keep it symbolic; reading its value
  // specializes it.
  GuardSet& guards = root()->out_.guards;
  return Var::symint(e, guards.value_at_hints(e));
}

VarPtr Interpreter::shape_tuple(const ir::TensorMeta& m) {
  static PyObject* size_type = resolve_torch("Size");
  bool symbolic = false;
  for (const sym::Expr& e : m.sizes) symbolic |= !e.as_const();
  if (symbolic) {  // a tuple of symbolic ints (torch.Size of SymInts in torch)
    std::vector<VarPtr> items;
    for (const sym::Expr& e : m.sizes) items.push_back(size_const(e));
    VarPtr shape = Var::tuple(std::move(items));
    shape->as<TupleV>().structseq = Py_NewRef(size_type);  // a torch.Size: numel(), its type, and so made at the boundary
    return shape;
  }
  PyObject* t = PyTuple_New(m.dim());
  for (int64_t i = 0; i < m.dim(); ++i) {
    PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(concrete_size(m.sizes[i])));
  }
  PyObject* size = PyObject_CallOneArg(size_type, t);
  Py_DECREF(t);
  return real(size);
}

VarPtr Interpreter::split_tensor(const VarPtr& x, bool chunk, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  const ir::TensorMeta& m = x->node()->meta;
  VarPtr what, dim_v;
  if (!args.empty()) what = args[0];
  if (args.size() > 1) dim_v = args[1];
  if (args.size() > 2) return nullptr;
  for (const auto& [k, v] : kwargs) {
    if (k == "dim") dim_v = v;
    else if (k == (chunk ? "chunks" : "split_size_or_sections") || (!chunk && k == "split_size")) what = v;
    else return nullptr;
  }
  if (!what || m.dim() == 0) return nullptr;
  int64_t d = 0;
  if (dim_v) {
    PyObject* o = const_obj(dim_v, "dim");
    if (!PyLong_Check(o) || PyBool_Check(o)) return nullptr;
    d = PyLong_AsLongLong(o);
  }
  std::string err;
  if (!ops::wrap_dim(d, m.dim(), err)) return nullptr;
  // The number of pieces is a Python value: a symbolic size along `dim` is specialized.
  const int64_t n = concrete_size(m.sizes[d]);
  std::vector<int64_t> lengths;
  PyObject* o = const_obj(what, "split size");
  if (PyLong_Check(o) && !PyBool_Check(o)) {
    int64_t k = PyLong_AsLongLong(o);
    if (k <= 0 || n == 0) return nullptr;  // torch's own errors and edge cases
    if (chunk) k = (n + k - 1) / k;
    for (int64_t start = 0; start < n; start += k) lengths.push_back(std::min(k, n - start));
  } else if (!chunk && (PyList_Check(o) || PyTuple_Check(o))) {
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < PySequence_Size(o); ++i) {
      PyObject* item = PySequence_GetItem(o, i);
      const bool ok = item && PyLong_Check(item) && !PyBool_Check(item);
      const int64_t len = ok ? PyLong_AsLongLong(item) : -1;
      Py_XDECREF(item);
      if (len < 0) return nullptr;
      lengths.push_back(len);
      total += len;
    }
    if (total != n) return nullptr;  // torch raises its own message
  } else {
    return nullptr;
  }
  std::vector<VarPtr> pieces;
  int64_t start = 0;
  for (int64_t len : lengths) {
    ir::Attrs a;
    a.set("dim", d);
    a.set("start", start);
    a.set("end", start + len);
    a.set("step", int64_t{1});
    pieces.push_back(Var::tensor(add_node("slice", {x->node()}, a)));
    start += len;
  }
  return Var::tuple(std::move(pieces));
}

namespace {
// The legacy tensor types' names (torch.FloatTensor, ...) by dtype; nullptr where none exists.
const char* legacy_tensor_type_name(DType t) {
  switch (t) {
    case DType::Float32: return "FloatTensor";
    case DType::Float64: return "DoubleTensor";
    case DType::Float16: return "HalfTensor";
    case DType::BFloat16: return "BFloat16Tensor";
    case DType::Int64: return "LongTensor";
    case DType::Int32: return "IntTensor";
    case DType::Int16: return "ShortTensor";
    case DType::Int8: return "CharTensor";
    case DType::UInt8: return "ByteTensor";
    case DType::Bool: return "BoolTensor";
  }
  return nullptr;
}

// A legacy tensor type, as Tensor.type takes it: its name ("torch.DoubleTensor",
// "torch.cuda.HalfTensor") or the class itself (torch.DoubleTensor, which has dtype and is_cuda).
bool legacy_tensor_type(PyObject* o, DType& t, bool& cuda) {
  std::string name;
  if (PyUnicode_Check(o)) {
    name = PyUnicode_AsUTF8(o);
  } else if (PyType_Check(o)) {
    PyObject* mod = PyObject_GetAttrString(o, "__module__");
    const char* qual = reinterpret_cast<PyTypeObject*>(o)->tp_name;
    if (mod && PyUnicode_Check(mod)) name = std::string(PyUnicode_AsUTF8(mod)) + "." + (std::strrchr(qual, '.') ? std::strrchr(qual, '.') + 1 : qual);
    Py_XDECREF(mod);
    if (PyErr_Occurred()) PyErr_Clear();
  }
  std::string rest;
  if (name.rfind("torch.cuda.", 0) == 0) cuda = true, rest = name.substr(11);
  else if (name.rfind("torch.", 0) == 0) cuda = false, rest = name.substr(6);
  else return false;
  for (DType d : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64, DType::Int32,
                  DType::Int16, DType::Int8, DType::UInt8, DType::Bool})
    if (rest == legacy_tensor_type_name(d)) {
      t = d;
      return true;
    }
  return false;
}
}  // namespace

bool Interpreter::in_memory_format(const ir::TensorMeta& m, PyObject* fmt) {
  // torch's rule: dims of one element index nothing, an empty tensor is contiguous; with
  // torch.channels_last, the order C, W, H, N
  static PyObject* channels_last = object_at("torch.channels_last");
  static PyObject* contiguous_format = object_at("torch.contiguous_format");
  if (fmt == channels_last && m.dim() != 4)
    unsupported("torch.channels_last for a tensor of other than 4 dims: RuntimeError");
  if (fmt != contiguous_format && fmt != channels_last) unsupported("a memory format other than contiguous or channels_last");
  if (fmt == contiguous_format) return ir::is_contiguous(m.sizes, m.strides);
  return ir::is_contiguous({m.sizes[0], m.sizes[2], m.sizes[3], m.sizes[1]},
                           {m.strides[0], m.strides[2], m.strides[3], m.strides[1]});
}

VarPtr Interpreter::in_layout(const VarPtr& x, PyObject* fmt) {
  static PyObject* preserve_format = object_at("torch.preserve_format");
  static PyObject* channels_last = object_at("torch.channels_last");
  if (fmt == preserve_format || in_memory_format(x->node()->meta, fmt)) return x;
  return Var::tensor(add_node(fmt == channels_last ? "channels_last" : "contiguous", {x->node()}));
}

VarPtr Interpreter::call_tensor_method(VarPtr self, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs) {
  const ir::TensorMeta& m = self->node()->meta;
  // x.requires_grad_() on a tensor autograd already tracks (transformers' enable_input_require_grads
  // hook on an embedding's output): nothing changes, x is the result
  if (name == "requires_grad_" && args.size() + kwargs.size() <= 1 && root()->grad_mode_ && root()->needs_grad_.count(self->node())) {
    const VarPtr& flag = args.empty() ? (kwargs.empty() ? nullptr : kwargs[0].second) : args[0];
    if (!flag || (flag->is_const() && flag->known() == Py_True && (kwargs.empty() || kwargs[0].first == "requires_grad")))
      return self;
  }
  if ((name == "addcdiv" || name == "addcmul" || name == "addcdiv_" || name == "addcmul_") && is_floating(m.dtype))
    if (VarPtr r = add_product(self, name, args, kwargs)) return r;
  if (name == "clone" && args.empty() && kwargs.size() == 1 && kwargs[0].first == "memory_format" && kwargs[0].second->is_const()) {
    // x.clone(memory_format=...): a copy laid out as asked (preserve_format: as clone lays it)
    PyObject* format = kwargs[0].second->known();
    static PyObject* preserve = resolve_torch("preserve_format");
    static PyObject* contiguous = resolve_torch("contiguous_format");
    static PyObject* channels_last = resolve_torch("channels_last");
    if (format == preserve) return Var::tensor(add_node("clone", {self->node()}));
    if (format == contiguous) return Var::tensor(add_node("contiguous", {self->node()}));
    if (format == channels_last && m.dim() == 4) return Var::tensor(add_node("channels_last", {self->node()}));
  }
  // x.t_(), x.unsqueeze_(0): x itself becomes that view of its memory, under every name the
  // function has for it. An input's would change the caller's tensor: that runs in Python.
  static const std::set<std::string> view_in_place = {"t_", "transpose_", "squeeze_", "unsqueeze_", "swapaxes_", "swapdims_"};
  if (view_in_place.count(name)) {
    const auto& ins = root()->input_vars_;
    if (std::find(ins.begin(), ins.end(), self) != ins.end() || self->node()->op_name() == "placeholder")
      unsupported("Tensor." + name + "() on an input (it changes the caller's tensor's shape)");
    VarPtr view = call_tensor_method(self, name.substr(0, name.size() - 1), std::move(args), kwargs);
    if (!view->is_tensor()) unsupported("Tensor." + name + "() gave no tensor");
    self->node() = view->node();
    return self;
  }
  // x.view(torch.int32): the same memory read as another dtype, torch's view as a torch call
  if (name == "view" && args.size() == 1 && kwargs.empty() && args[0]->is_const()) {
    DType t;
    if (dtype_from_object(args[0]->known(), t)) {
      static PyObject* view = PyObject_GetAttrString(resolve_torch("Tensor"), "view");
      if (VarPtr r = torch_extern(view, "Tensor.view", {self, args[0]}, {})) return r;
    }
  }
  // x.type_as(w) reads only w's type and device: w is no input of the result, so autograd
  // gives w no gradient (as a call to torch with w among its inputs would: a zero one).
  if (name == "type_as" && args.size() == 1 && kwargs.empty() && args[0]->is_tensor()) {
    const ir::TensorMeta& w = args[0]->node()->meta;
    return call_tensor_method(self, "to", {Var::constant(torch_device_object(w.device)), Var::constant(torch_dtype_object(w.dtype))}, {});
  }
  if (name == "size") {
    if (args.empty() && kwargs.empty()) return shape_tuple(m);
    int64_t d = PyLong_AsLongLong(const_obj(args.empty() ? kwargs[0].second : args[0], "dim"));
    std::string err;
    if (m.dim() == 0)  // wrap_dim lets scalars take dims 0 and -1; size() does not
      unsupported("shape/dtype check of size failed: IndexError: Dimension specified as " + std::to_string(d) +
                  " but tensor has no dimensions");
    if (!ops::wrap_dim(d, m.dim(), err)) unsupported("shape/dtype check of size failed: " + err);
    return size_const(m.sizes[d]);
  }
  if (name == "stride" && args.size() + kwargs.size() <= 1) {
    // x.stride(): a tuple of ints, eager's layout of the value (symbolic where sizes are)
    if (args.empty() && kwargs.empty()) {
      std::vector<VarPtr> items;
      for (const sym::Expr& e : m.strides) items.push_back(size_const(e));
      return Var::tuple(std::move(items));
    }
    int64_t d = PyLong_AsLongLong(const_obj(args.empty() ? kwargs[0].second : args[0], "dim"));
    std::string err;
    if (!ops::wrap_dim(d, m.dim(), err)) unsupported("shape/dtype check of stride failed: " + err);
    return size_const(m.strides[d]);
  }
  if (name == "split" || name == "chunk")
    if (VarPtr r = split_tensor(self, name == "chunk", args, kwargs)) return r;
  // x.view_as(y), reshape_as, expand_as: the op on y's sizes (symbolic ones included), as
  // torch defines them; they were torch calls, which autocast capture does not know
  if ((name == "view_as" || name == "reshape_as" || name == "expand_as") && args.size() == 1 && kwargs.empty() &&
      args[0]->is_tensor())
    return call_tensor_method(self, name.substr(0, name.size() - 3), {shape_tuple(args[0]->node()->meta)}, {});
  // x.new_empty(...): zeros, one of the values its uninitialized memory may hold
  if (name == "new_empty") return call_tensor_method(self, "new_zeros", std::move(args), kwargs);
  if (name == "new_ones" || name == "new_zeros" || name == "new_full") {
    // x.new_ones(B, T) with a symbolic size: a `full` node in x's dtype and on x's device
    std::vector<VarPtr> size = args;
    for (VarPtr& a : args) {  // a size capture knows as a 0-d tensor: its int
      if (a->kind() == Var::Kind::Tuple || a->kind() == Var::Kind::List) {
        std::vector<VarPtr> items = a->seq();
        for (VarPtr& x : items) x = known_int(x);
        a = Var::tuple(std::move(items));
      } else if (name != "new_full" || &a == &args.front()) {
        a = known_int(a);
      }
    }
    size = args;
    VarPtr fill = Var::steal_constant(PyLong_FromLong(name == "new_ones"));
    if (name == "new_full") {
      if (args.size() != 2) size.clear();
      else size = {args[0]}, fill = args[1];
    }
    PyObject* dtype = torch_dtype_object(m.dtype);
    PyObject* device = torch_device_object(m.device);
    bool plain = !size.empty();
    for (auto& [k, v] : kwargs) {
      if (k == "dtype") dtype = const_obj(v, "dtype");
      else if (k == "device") device = const_obj(v, "device");
      else if (!(k == "requires_grad" && v->is_const() && v->known() == Py_False)) plain = false;
    }
    if (plain)
      if (VarPtr r = full_node(size, fill, false, dtype, device)) return r;
  }
  if (name == "dim" || name == "ndimension") return Var::steal_constant(PyLong_FromLongLong(m.dim()));
  if (name == "numel" || name == "nelement") return size_const(m.numel());
  if (name == "is_contiguous" && args.size() + kwargs.size() <= 1 && (kwargs.empty() || kwargs[0].first == "memory_format")) {
    static PyObject* contiguous_format = object_at("torch.contiguous_format");
    PyObject* fmt = args.empty() && kwargs.empty() ? contiguous_format
                                                  : const_obj(args.empty() ? kwargs[0].second : args[0], "memory_format");
    return Var::constant(in_memory_format(m, fmt) ? Py_True : Py_False);
  }
  if (name == "element_size") return Var::steal_constant(PyLong_FromLong(dtype_size(m.dtype)));
  if (name == "is_floating_point" && args.empty()) return Var::constant(is_floating(m.dtype) ? Py_True : Py_False);
  if (name == "is_complex" && args.empty()) return Var::constant(Py_False);
  if (name == "get_device" && args.empty())
    return Var::steal_constant(PyLong_FromLong(m.device.type == DeviceType::CUDA ? m.device.index : -1));
  if (name == "item" || name == "tolist" || name == "numpy" || name == "__bool__" || name == "nonzero")
    unsupported("Tensor." + name + "() depends on tensor data");
  if (name == "to") {
    // x.to(dtype), x.to(device), x.to(other), with dtype=/device=/non_blocking=: a conversion, or x
    // itself where nothing changes. Device moves and copy=True stay eager.
    std::optional<DType> dtype;
    bool same_device = true, plain = true, copy = false;
    PyObject* target = nullptr;  // the device named, if any (a torch.device)
    auto take = [&](const VarPtr& v) {
      if (v->is_tensor()) {
        dtype = v->node()->meta.dtype;
        same_device = same_device && v->node()->meta.device == m.device;
        return;
      }
      PyObject* o = const_obj(v, "Tensor.to argument");
      DType t;
      if (o == Py_None) return;
      if (dtype_from_object(o, t)) {
        dtype = t;
        return;
      }
      static PyObject* device_type = resolve_torch("device");
      PyObject* d = PyObject_CallOneArg(device_type, o);
      if (!d) {
        clear_error();
        plain = false;
        return;
      }
      same_device = same_device && PyObject_RichCompareBool(d, torch_device_object(m.device), Py_EQ) == 1;
      keep_.push_back(d);
      target = d;
    };
    for (const VarPtr& a : args) take(a);
    static PyObject* preserve_format = object_at("torch.preserve_format");
    PyObject* format = preserve_format;
    for (auto& [k, v] : kwargs) {
      if (k == "dtype" || k == "device") take(v);
      else if (k == "copy" && v->is_const() && v->known() == Py_True) copy = true;
      else if (k == "memory_format") format = const_obj(v, "memory_format");
      else if (k != "non_blocking" && k != "copy") plain = false;
    }
    if (plain && same_device) {
      VarPtr r = self;
      if (dtype && *dtype != m.dtype) {
        ir::Attrs a;
        a.set("dtype", *dtype);
        r = Var::tensor(add_node("convert", {self->node()}, a));
      } else if (copy) {  // copy=True: a new tensor even where nothing changes (GradScaler's replicas)
        r = call_tensor_method(self, "clone", {}, {});
      }
      return in_layout(r, format);
    }
    if (copy) plain = false;  // a move with copy=True: torch's
    if (format != preserve_format) plain = false;
    if (plain && target) {
      // A move to another device (a CPU counter moved to the GPU): torch's Tensor.to as a
      // torch_call that names the device it makes its result on; strides as the source's where
      // they are contiguous (torch's preserve_format), else contiguous (the runtime lays out).
      PyObject* type = PyObject_GetAttrString(target, "type");
      PyObject* index = PyObject_GetAttrString(target, "index");
      const bool cuda = type && PyUnicode_CompareWithASCIIString(type, "cuda") == 0;
      const bool cpu = type && PyUnicode_CompareWithASCIIString(type, "cpu") == 0;
      const int64_t at = index && index != Py_None ? PyLong_AsLongLong(index) : 0;
      Py_XDECREF(type), Py_XDECREF(index);
      clear_error();
      if (cuda || cpu) {
        static PyObject* to = PyObject_GetAttrString(resolve_torch("Tensor"), "to");
        PyObject* slot = tensor_slot(0);
        PyObject* targs = PyTuple_Pack(2, slot, target);
        Py_DECREF(slot);
        PyObject* tkw = dtype ? Py_BuildValue("{s:O}", "dtype", torch_dtype_object(*dtype)) : nullptr;
        keep_.push_back(targs);
        if (tkw) keep_.push_back(tkw);
        ir::Attrs a;
        a.set("fn", static_cast<int64_t>(register_torch_call(to, targs, tkw, -1)));
        a.set("target", std::string("Tensor.to"));
        a.set("out_sizes", m.sizes);
        a.set("out_strides", m.strides == ir::contiguous_strides(m.sizes) ? m.strides : ir::contiguous_strides(m.sizes));
        a.set("out_dtype", dtype ? *dtype : m.dtype);
        a.set("out_device", cuda ? at : int64_t{-1});
        return Var::tensor(add_node("torch_call", {self->node()}, a));
      }
    }
  }
  if (name == "type" && kwargs.empty() && args.size() <= 1 && (args.empty() || args[0]->is_const())) {
    // x.type(): the legacy type's name ("torch.FloatTensor", "torch.cuda.HalfTensor");
    // x.type(torch.float64), x.type("torch.DoubleTensor"), x.type(torch.DoubleTensor): a
    // conversion on the same device (another device's type stays torch's).
    const bool cuda = m.device.type == DeviceType::CUDA;
    if (args.empty()) {
      const char* legacy = legacy_tensor_type_name(m.dtype);
      if (!legacy) unsupported("Tensor.type() of a " + std::string(dtype_name(m.dtype)) + " tensor");
      return Var::steal_constant(PyUnicode_FromFormat("torch.%s%s", cuda ? "cuda." : "", legacy));
    }
    DType t;
    bool on_cuda = cuda;
    if (dtype_from_object(args[0]->obj(), t) || legacy_tensor_type(args[0]->obj(), t, on_cuda)) {
      if (on_cuda != cuda) unsupported("Tensor.type() to another device");
      if (t == m.dtype) return self;
      ir::Attrs a;
      a.set("dtype", t);
      return Var::tensor(add_node("convert", {self->node()}, a));
    }
  }
  // x.contiguous() is x itself when torch's is_contiguous() holds (size-1 dims not compared)
  if (name == "contiguous" && args.empty() && kwargs.empty() && ir::is_contiguous(m.sizes, m.strides)) return self;
  if (name == "contiguous" && args.empty() && kwargs.size() == 1 && kwargs[0].first == "memory_format") {
    static PyObject* preserve_format = object_at("torch.preserve_format");
    PyObject* fmt = const_obj(kwargs[0].second, "memory_format");
    if (fmt == preserve_format) unsupported("contiguous(memory_format=torch.preserve_format): RuntimeError");
    return in_layout(self, fmt);
  }
  if ((name == "max" || name == "min") && args.empty() && kwargs.empty())  // over all elements
    return call_op(*function_binding(resolve_torch(name == "max" ? "amax" : "amin")), {self}, {});
  if (name == "where") {
    // x.where(condition, y) == torch.where(condition, x, y)
    if (args.size() != 2 || !kwargs.empty()) unsupported("Tensor.where() takes (condition, other)");
    return call_op(*function_binding(resolve_torch_path("torch.where")), {args[0], self, args[1]}, {});
  }
  if (name.size() > 1 && name.back() == '_' && name[name.size() - 2] != '_') {
    // x.add_(y), x.relu_(): the out-of-place op, then every alias of x takes the result.
    std::string base = name.substr(0, name.size() - 1);
    const bool number = args.size() == 1 && args[0]->is_const() && is_python_scalar(args[0]->known());
    if (base == "copy" && args.size() == 1 && (args[0]->is_tensor() || number) && kwargs.empty()) {
      // x.copy_(src): src broadcast to x's shape, in x's dtype; a Python number is torch's
      // 0-d tensor of it (an out-of-range one wraps as a cast does, where fill_ raises)
      check_inplace_target(self, name);
      ir::Node* src = as_node(args[0], "copy_");
      if (src->meta.sizes != m.sizes) {
        ir::Attrs a;
        a.set("size", m.sizes);  // symbolic sizes stay symbolic
        src = add_node("expand", {src}, a);
      }
      if (src->meta.dtype != m.dtype) {
        ir::Attrs a;
        a.set("dtype", m.dtype);
        src = add_node("convert", {src}, a);
      }
      ir::Node* copied = add_node("clone", {src});  // a copy, not `src + 0`: -0.0 stays -0.0
      // On a tensor autograd tracks, eager's result still requires grad and passes zeros back
      // to the old value (CopyBackwards), as fill_ below (fuzz_grad seed 509203)
      if (root()->grad_mode_ && root()->needs_grad_.count(self->node()))
        copied = add_node("where", {as_node(Var::constant(Py_True), "copy_"), copied, self->node()});
      return mutate(self, copied);
    }
    if (base == "bernoulli" && args.size() + kwargs.size() == 1 && (kwargs.empty() || kwargs[0].first == "p")) {
      // x.bernoulli_(p): ones with probability p (torchvision's StochasticDepth, timm's DropPath
      // draw their keep masks so), from kiln's draws
      PyObject* p = const_obj(args.empty() ? kwargs[0].second : args[0], "p");
      if (PyFloat_Check(p) || (PyLong_Check(p) && !PyBool_Check(p))) {
        const double prob = PyFloat_AsDouble(p);
        if (!(prob >= 0 && prob <= 1)) unsupported("bernoulli_ with p outside [0, 1]: RuntimeError");
        if (root()->grad_mode_ && root()->needs_grad_.count(self->node())) unsupported("bernoulli_ on a tensor autograd tracks");
        check_inplace_target(self, name);
        ir::Node* u = uniform_draw(m.sizes, m.device.str());
        ir::Attrs c;
        c.set("dtype", m.dtype);
        return mutate(self, add_node("convert", {add_node("lt", {u, as_node(Var::steal_constant(PyFloat_FromDouble(prob)), "p")})}, c));
      }
    }
    if ((base == "normal" || base == "uniform") && is_floating(m.dtype))
      if (VarPtr r = random_fill(self, base == "normal", args, kwargs)) return r;
    if (base == "zero" && args.empty() && kwargs.empty())  // x.zero_() is x.fill_(0) (NaNs too)
      return call_tensor_method(self, "fill_", {Var::steal_constant(PyLong_FromLong(0))}, {});
    if (base == "fill" && args.size() == 1 && kwargs.empty()) {
      // x.fill_(v): every element v, in x's dtype; v a Python number or a 0-d tensor. On a
      // tensor autograd tracks, eager's result still requires grad and passes zeros back
      // (FillBackward): where(True, filled, x) keeps that edge to x.
      auto filled_into = [&](ir::Node* filled) {
        if (root()->grad_mode_ && root()->needs_grad_.count(self->node()))
          filled = add_node("where", {as_node(Var::constant(Py_True), "fill_"), filled, self->node()});
        return mutate(self, filled);
      };
      if (args[0]->is_tensor()) {
        ir::Node* v = args[0]->node();
        if (v->meta.dim() != 0) unsupported("fill_ with a tensor of dims: RuntimeError");
        check_inplace_target(self, name);
        if (v->meta.dtype != m.dtype) {
          ir::Attrs c;
          c.set("dtype", m.dtype);
          v = add_node("convert", {v}, c);
        }
        ir::Attrs e;
        e.set("size", m.sizes);
        return filled_into(add_node("clone", {add_node("expand", {v}, e)}));
      }
      PyObject* v = const_obj(args[0], "fill value");
      if (PyBool_Check(v) || !(PyFloat_Check(v) || PyLong_Check(v))) unsupported("fill_ with a value that is not a real number");
      const double d = PyFloat_AsDouble(v);
      if (PyLong_Check(v)) {
        int overflow = 0;
        const long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || static_cast<long long>(d) != i) unsupported("fill_ with an integer a double cannot hold");
      }
      // torch converts the value to the dtype checked ("value cannot be converted to type
      // uint8_t without overflow"): the same conversion on a scalar tensor tells.
      if (!fits_dtype(resolve_torch("empty"), v, m.dtype, sym::same_size(sym::product(m.sizes), 1))) unsupported("fill_ with a value out of the tensor dtype's range: RuntimeError");
      check_inplace_target(self, name);
      ir::Attrs a;
      a.set("size", m.sizes);
      a.set("value", d);
      a.set("dtype", m.dtype);
      a.set("device", m.device.str());
      return filled_into(add_node("full", {}, a));
    }
    const OpBinding* ob = method_binding(base);
    if (ob && (ob->op->kind == ops::OpKind::View || ob->op->aliases())) unsupported("Tensor." + name + "() is not captured yet");
    check_inplace_target(self, name);
    args.insert(args.begin(), self);
    VarPtr r = ob ? call_op(*ob, args, kwargs) : nullptr;
    if (!r) {
      // x.index_copy_(...): torch's out-of-place operator (x.index_copy) as a torch_call
      PyObject* method = PyObject_GetAttrString(resolve_torch("Tensor"), base.c_str());
      if (!method) clear_error();
      else keep_.push_back(method);
      if (method) r = torch_extern(method, "Tensor." + base, args, kwargs);
      PyObject* inplace = r ? PyObject_GetAttrString(resolve_torch("Tensor"), name.c_str()) : nullptr;
      if (inplace) {
        keep_.push_back(inplace);
        offer_in_place(r, self, inplace);
      }
      clear_error();
    }
    if (!r || !r->is_tensor()) unsupported("Tensor." + name + "() is not captured yet");
    static PyObject* tensor_type = resolve_torch("Tensor");
    static PyObject* float_power_ = object_at("torch.Tensor.float_power_");
    PyObject* key = PyUnicode_FromString(name.c_str());
    PyObject* method = key ? _PyType_Lookup(reinterpret_cast<PyTypeObject*>(tensor_type), key) : nullptr;  // borrowed
    Py_XDECREF(key);
    if (method && method == float_power_) exact_result_dtype(self, r, "the base given to float_power_");
    return mutate(self, r->node());
  }
  const OpBinding* b = method_binding(name);
  if (!b) {
    PyObject* method = PyObject_GetAttrString(resolve_torch("Tensor"), name.c_str());
    if (!method) {
      clear_error();
      unsupported("Tensor." + name + "() does not exist");
    }
    keep_.push_back(method);
    args.insert(args.begin(), self);
    if (VarPtr r = torch_extern(method, "Tensor." + name, args, kwargs)) return r;
    return inline_call(method, nullptr, std::move(args), kwargs);  // a Python method (Tensor.__len__)
  }
  // x.float() on a float32 x is x itself in eager (an alias, not a copy).
  if (b->op->name == "convert" && args.empty() && b->fixed.get_dtype("dtype") == m.dtype) return self;
  args.insert(args.begin(), self);
  if (VarPtr r = call_op(*b, args, kwargs)) return r;
  // A call the entry leaves to torch: the method as a torch_call.
  PyObject* method = PyObject_GetAttrString(resolve_torch("Tensor"), name.c_str());
  if (!method) {
    clear_error();
    unsupported("Tensor." + name + "() does not exist");
  }
  keep_.push_back(method);
  if (VarPtr r = torch_extern(method, "Tensor." + name, args, kwargs)) return r;
  unsupported("Tensor." + name + "() with these arguments is not captured yet");
}

PyObject* Interpreter::resolve_torch_path(const std::string& path) {
  PyObject* obj = object_at(path);
  if (!obj) unsupported("cannot resolve " + path);
  keep_.push_back(obj);
  return obj;
}

std::optional<std::vector<sym::Expr>> Interpreter::symbolic_layouts(const std::vector<ir::Node*>& inputs,
                                                                    const std::vector<TensorInfo>& results,
                                                                    const MakeMetas& make_metas, const CallOnMetas& call_on) {
  GuardSet& guards = root()->out_.guards;
  std::vector<sym::Expr> syms;
  for (ir::Node* n : inputs) {
    for (const sym::Expr& e : n->meta.sizes) sym::collect_symbols(e, syms);
    for (const sym::Expr& e : n->meta.strides) sym::collect_symbols(e, syms);
  }
  std::sort(syms.begin(), syms.end());
  syms.erase(std::unique(syms.begin(), syms.end()), syms.end());
  syms.erase(std::remove_if(syms.begin(), syms.end(), [&](const sym::Expr& s) { return guards.specialized(s); }), syms.end());
  if (syms.empty()) return std::nullopt;
  std::vector<int64_t> hints;
  for (const sym::Expr& s : syms) hints.push_back(guards.value_at_hints(s));
  auto probe = [&](const std::vector<int64_t>& values) -> std::optional<std::vector<int64_t>> {
    auto value = [&](const sym::Expr& v) {
      for (size_t i = 0; i < syms.size(); ++i)
        if (syms[i] == v) return values[i];
      return guards.value_at_hints(v);
    };
    std::vector<PyObject*> metas;
    PyObject* r = make_metas(value, metas) ? call_on(metas) : nullptr;
    for (PyObject* m : metas) Py_DECREF(m);
    if (!r) {
      clear_error();
      return std::nullopt;
    }
    std::vector<PyObject*> items;
    if (PyTuple_Check(r)) for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r); ++i) items.push_back(PyTuple_GET_ITEM(r, i));
    else items.push_back(r);
    std::vector<int64_t> flat;
    bool ok = items.size() == results.size();
    for (size_t k = 0; ok && k < items.size(); ++k) {
      TensorInfo info;
      std::string why;
      ok = is_tensor(items[k]) && tensor_info(items[k], info, why) && info.sizes.size() == results[k].sizes.size() &&
           info.dtype == results[k].dtype;
      if (!ok) break;
      flat.insert(flat.end(), info.sizes.begin(), info.sizes.end());
      flat.insert(flat.end(), info.strides.begin(), info.strides.end());
    }
    Py_DECREF(r);
    if (!ok) return std::nullopt;
    return flat;
  };
  if (auto fit = sym::fit_multilinear(syms, hints, probe)) return fit;
  // The sizes whose change alone changes what the call returns (how many results, their ranks
  // or dtypes: x.unbind(1) over s1) are specialized, and the others fitted again; where none
  // stands out, all are this call's.
  std::vector<sym::Expr> structural;
  for (size_t i = 0; i < syms.size() && syms.size() > 1; ++i) {
    std::vector<int64_t> values = hints;
    values[i] += 1;
    if (!probe(values)) structural.push_back(syms[i]);
  }
  if (!structural.empty() && structural.size() < syms.size()) {
    for (const sym::Expr& s : structural) concrete_size(s);
    return symbolic_layouts(inputs, results, make_metas, call_on);
  }
  for (const sym::Expr& s : syms) concrete_size(s);  // no shape-generic layout: this call's sizes
  return std::nullopt;
}

// float_power writes only into a tensor of its result's dtype (double, or complex double), where
// other in-place ops and out= cast: eager's RuntimeError, before anything changes.
void Interpreter::exact_result_dtype(const VarPtr& target, const VarPtr& result, const std::string& what) {
  const DType have = target->node()->meta.dtype, want = result->node()->meta.dtype;
  if (have != want)
    raise_new(PyExc_RuntimeError, what + " has dtype " + ops::torch_dtype_name(have) + " but the operation's result requires dtype " +
                                      ops::torch_dtype_name(want));
}

void Interpreter::offer_in_place(const VarPtr& result, const VarPtr& target, PyObject* inplace_fn) {
  static const ops::OpDef* torch_call_op = ops::find_op("torch_call");
  if (!result->is_tensor() || !target->is_tensor()) return;
  ir::Node* call = result->node();
  if (call->op != torch_call_op || call->inputs.empty() || call->inputs[0] != target->node()) return;
  call->attrs.set("inplace_fn", static_cast<int64_t>(register_inplace_variant(static_cast<int>(call->attrs.get_int("fn")), inplace_fn)));
}

// Losses in the float32 list of torch's CUDA autocast (aten/src/ATen/autocast_mode.cpp) that kiln
// runs as torch calls, by the function object. CPU autocast casts some of their parts and not
// others: not taken there.
// A torch function (torch.gather, not a Tensor method or a Python function) whose result depends
// on its arguments alone, by torch's own op metadata: the aten op of its name, none of whose
// functional overloads is tagged nondeterministic_seeded (random numbers) or mutates an input.
// The prologue (passes/prologue.cpp) may compute such a call once.
bool Interpreter::meta_disagrees(PyObject* f, PyObject*& meta_result, const std::vector<ir::Node*>& inputs,
                                 const std::function<PyObject*(const std::vector<PyObject*>&)>& call) {
  constexpr int64_t kSmall = 4096;  // elements, all inputs together
  int64_t elements = 0;
  bool fixed = true;
  for (const ir::Node* n : inputs) {
    if (!n || n->meta.device.type != DeviceType::CPU) return false;
    int64_t count = 1;
    for (const sym::Expr& e : n->meta.sizes) {
      fixed = fixed && e.as_const();
      count *= e.as_const() ? *e.as_const() : kSmall;
    }
    elements += count;
  }
  // Larger inputs: a Python function of torch's (which may ask a tensor's device: autocast's
  // `_cast` leaves a meta tensor as it is) still runs for real at two points a dim, for the
  // dtypes of its results.
  const bool whole = fixed && elements <= kSmall;
  if (!whole && !PyFunction_Check(f)) return false;
  static PyObject* get_state = resolve_torch("get_rng_state");
  static PyObject* set_state = resolve_torch("set_rng_state");
  std::vector<PyObject*> reals;
  auto drop = [&] {
    for (PyObject* t : reals) Py_DECREF(t);
  };
  if (!stand_in_tensors(root()->out_.guards, inputs, whole ? INT64_MAX : 2, std::nullopt, reals)) return false;
  PyObject* state = PyObject_CallNoArgs(get_state);
  PyObject* r = state ? call(reals) : nullptr;
  if (state) {
    PyObject* done = PyObject_CallOneArg(set_state, state);
    Py_XDECREF(done);
    Py_DECREF(state);
  }
  drop();
  bool differs = false;
  if (r) {
    const bool tuple = PyTuple_Check(meta_result);
    const Py_ssize_t n = tuple ? PyTuple_GET_SIZE(meta_result) : 1;
    if (tuple != static_cast<bool>(PyTuple_Check(r)) || (tuple && PyTuple_GET_SIZE(r) != n)) differs = true;
    for (Py_ssize_t i = 0; !differs && i < n; ++i) {
      PyObject* m = tuple ? PyTuple_GET_ITEM(meta_result, i) : meta_result;
      PyObject* x = tuple ? PyTuple_GET_ITEM(r, i) : r;
      if (!is_tensor(m) || !is_tensor(x)) continue;
      for (const char* what : {"dtype", "shape"}) {
        if (!whole && std::strcmp(what, "shape") == 0) continue;
        PyObject* ms = PyObject_GetAttrString(m, what);
        PyObject* xs = PyObject_GetAttrString(x, what);
        differs = differs || (ms && xs && PyObject_RichCompareBool(ms, xs, Py_NE) == 1);
        Py_XDECREF(ms);
        Py_XDECREF(xs);
      }
      // and the layout the kernel gives a new tensor (torch.roll keeps a channels-last input's,
      // its meta function makes it row-major): the kernel's, which eager's result has
      PyObject* mst = whole && !differs ? PyObject_CallMethod(m, "stride", nullptr) : nullptr;
      PyObject* xst = mst ? PyObject_CallMethod(x, "stride", nullptr) : nullptr;
      PyObject* base = xst ? PyObject_GetAttrString(m, "_base") : nullptr;
      if (base == Py_None && PyObject_RichCompareBool(mst, xst, Py_NE) == 1) {
        static PyObject* empty_strided = resolve_torch("empty_strided");
        PyObject* size = PyObject_GetAttrString(m, "shape");
        PyObject* dtype = PyObject_GetAttrString(m, "dtype");
        PyObject* kw = size && dtype ? Py_BuildValue("{s:O,s:s}", "dtype", dtype, "device", "meta") : nullptr;
        PyObject* a = kw ? PyTuple_Pack(2, size, xst) : nullptr;
        PyObject* fresh = a ? PyObject_Call(empty_strided, a, kw) : nullptr;
        if (fresh && tuple) {
          PyObject* copy = PyTuple_New(n);
          for (Py_ssize_t j = 0; j < n; ++j) PyTuple_SET_ITEM(copy, j, Py_NewRef(j == i ? fresh : PyTuple_GET_ITEM(meta_result, j)));
          Py_DECREF(fresh);
          if (!PyTuple_CheckExact(meta_result)) {  // torch.return_types.frexp and its kin: made again of its class
            PyObject* typed = PyObject_CallOneArg(reinterpret_cast<PyObject*>(Py_TYPE(meta_result)), copy);
            Py_DECREF(copy);
            copy = typed;
          }
          if (copy) Py_SETREF(meta_result, copy);
        } else if (fresh) {
          Py_SETREF(meta_result, fresh);
        }
        Py_XDECREF(a), Py_XDECREF(kw), Py_XDECREF(dtype), Py_XDECREF(size);
      }
      Py_XDECREF(base), Py_XDECREF(xst), Py_XDECREF(mst);
      clear_error();
    }
    Py_DECREF(r);
  }
  clear_error();  // the real call may fail on these values (a solver of a singular matrix): no answer
  return differs;
}

static bool deterministic_torch_function(PyObject* f) {
  static std::unordered_map<PyObject*, bool> known;
  auto [it, fresh] = known.emplace(f, false);
  if (!fresh) return it->second;
  static PyObject* torch_mod = PyImport_ImportModule("torch");
  static PyObject* aten = object_at("torch.ops.aten");
  static PyObject* seeded = object_at("torch.Tag.nondeterministic_seeded");
  PyObject* name = PyObject_GetAttrString(f, "__name__");
  PyObject* same = name && PyUnicode_Check(name) && torch_mod ? PyObject_GetAttr(torch_mod, name) : nullptr;
  PyObject* packet = same == f && aten && seeded ? PyObject_GetAttr(aten, name) : nullptr;
  PyObject* overloads = packet ? PyObject_CallMethod(packet, "overloads", nullptr) : nullptr;
  bool ok = overloads && PyList_Check(overloads) && PyList_GET_SIZE(overloads) > 0;
  for (Py_ssize_t i = 0; ok && overloads && i < PyList_GET_SIZE(overloads); ++i) {
    PyObject* op = PyObject_GetAttr(packet, PyList_GET_ITEM(overloads, i));
    PyObject* tags = op ? PyObject_GetAttrString(op, "tags") : nullptr;
    PyObject* schema = op ? PyObject_GetAttrString(op, "_schema") : nullptr;
    PyObject* mutable_ = schema ? PyObject_GetAttrString(schema, "is_mutable") : nullptr;
    // an out= overload writes its out argument only (capture refuses out=); others must not mutate
    bool is_out = false;
    PyObject* arguments = schema ? PyObject_GetAttrString(schema, "arguments") : nullptr;
    for (Py_ssize_t k = 0; arguments && PyList_Check(arguments) && k < PyList_GET_SIZE(arguments); ++k) {
      PyObject* flag = PyObject_GetAttrString(PyList_GET_ITEM(arguments, k), "is_out");
      is_out = is_out || flag == Py_True;
      Py_XDECREF(flag);
    }
    Py_XDECREF(arguments);
    if (!tags || !mutable_ || PySequence_Contains(tags, seeded) != 0 || (mutable_ == Py_True && !is_out)) ok = false;
    Py_XDECREF(mutable_);
    Py_XDECREF(schema);
    Py_XDECREF(tags);
    Py_XDECREF(op);
  }
  Py_XDECREF(overloads);
  Py_XDECREF(packet);
  Py_XDECREF(same);
  Py_XDECREF(name);
  clear_error();
  return it->second = ok;
}

// The losses autocast computes in float32 on both CUDA and the CPU (autocast_mode.cpp's fp32
// lists; the CPU's casts checked against torch 2.11 and 2.14).
static bool float32_loss(PyObject* f) {
  static const std::unordered_set<PyObject*> losses = [] {
    std::unordered_set<PyObject*> m;
    for (const char* name : {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
                             "binary_cross_entropy_with_logits", "poisson_nll_loss", "margin_ranking_loss",
                             "soft_margin_loss", "hinge_embedding_loss", "cosine_embedding_loss", "multi_margin_loss",
                             "multilabel_margin_loss", "triplet_margin_loss"}) {
      PyObject* fn = object_at(std::string("torch.nn.functional.") + name);
      if (fn) m.insert(fn);
      clear_error();
    }
    return m;
  }();
  return losses.count(f) > 0;
}

namespace {

bool positive_float(const VarPtr& v) { return v && v->is_const() && PyFloat_Check(v->known()) && PyFloat_AsDouble(v->known()) > 0; }
bool is_true(const VarPtr& v) { return v && v->is_const() && v->known() == Py_True; }

}  // namespace

std::string Interpreter::rerun_differs(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  // A torch call's gradient is the backward of running it again (aten_vjp): fine for a pure
  // function, wrong for one that draws random numbers (another mask in the backward) or updates
  // an input in place (running statistics updated twice).
  static PyObject* sdpa = resolve_torch_path("torch.nn.functional.scaled_dot_product_attention");
  static const std::set<PyObject*> rnns = [this] {
    std::set<PyObject*> s;
    for (const char* n : {"torch._VF.lstm", "torch._VF.gru", "torch._VF.rnn_tanh", "torch._VF.rnn_relu"})
      if (PyObject* o = resolve_torch_path(n)) s.insert(o);
    return s;
  }();
  auto arg = [&](size_t i, const char* key) -> VarPtr {
    for (const auto& [k, v] : kwargs)
      if (k == key) return v;
    return i < args.size() ? args[i] : nullptr;
  };
  static const std::set<PyObject*> fractional = [this] {
    std::set<PyObject*> s;
    for (const char* n : {"torch.nn.functional.fractional_max_pool2d", "torch.nn.functional.fractional_max_pool3d",
                          "torch.nn.functional.fractional_max_pool2d_with_indices",
                          "torch.nn.functional.fractional_max_pool3d_with_indices"})
      if (PyObject* o = resolve_torch_path(n)) s.insert(o);
    return s;
  }();
  if (f == sdpa && positive_float(arg(4, "dropout_p"))) return "attention with dropout draws its mask again in the backward";
  // embedding_bag(sparse=True): a sparse gradient, which a backward program's dense buffers
  // cannot hold. (F.embedding_bag(input, weight, offsets, max_norm, norm_type,
  // scale_grad_by_freq, mode, sparse, ...); torch.embedding_bag(weight, input, offsets,
  // scale_grad_by_freq, mode, sparse, ...).)
  static PyObject* embedding_bag = resolve_torch_path("torch.embedding_bag");
  static PyObject* functional_embedding_bag = resolve_torch_path("torch.nn.functional.embedding_bag");
  if (f == embedding_bag || f == functional_embedding_bag)
    if (VarPtr sp = arg(f == embedding_bag ? 5 : 7, "sparse"); sp && sp->is_const() && sp->known() == Py_True)
      return "embedding_bag(sparse=True) gives a sparse gradient";
  if (fractional.count(f)) {
    VarPtr samples = arg(5, "_random_samples");
    if (!samples || (samples->is_const() && samples->known() == Py_None)) return "fractional max-pooling draws its windows again in the backward";
  }
  if (rnns.count(f))  // (..., num_layers, dropout, train, ...): the one float argument
    for (size_t i = 0; i + 1 < args.size(); ++i)
      if (positive_float(args[i]) && is_true(args[i + 1])) return "a recurrent layer's dropout draws its masks again in the backward";
  // (running_mean's position, the flag that updates it, its position and default)
  struct Norm { int stats; const char* flag; int at; bool dflt; };
  static const std::map<PyObject*, Norm> norms = [this] {
    std::map<PyObject*, Norm> m;
    auto add = [&](const char* path, Norm n) {
      if (PyObject* o = resolve_torch_path(path)) m[o] = n;
    };
    add("torch.instance_norm", {3, "use_input_stats", 5, false});
    add("torch.batch_norm", {3, "training", 5, false});
    add("torch.nn.functional.instance_norm", {1, "use_input_stats", 5, true});
    add("torch.nn.functional.batch_norm", {1, "training", 5, false});
    return m;
  }();
  if (auto it = norms.find(f); it != norms.end()) {
    const Norm& n = it->second;
    VarPtr stats = arg(static_cast<size_t>(n.stats), "running_mean"), flag = arg(static_cast<size_t>(n.at), n.flag);
    if (stats && stats->is_tensor() && (flag ? is_true(flag) : n.dflt))
      return "a norm's running statistics would be updated again in the backward";
  }
  return {};
}

VarPtr Interpreter::torch_extern(PyObject* f, const std::string& name, const std::vector<VarPtr>& args_in, const KwArgs& kwargs_in) {
  if (root()->grad_mode_) {
    std::string why = rerun_differs(f, args_in, kwargs_in);
    std::function<bool(const VarPtr&)> tracked = [&](const VarPtr& v) {
      if (v->is_tensor()) return root()->needs_grad_.count(v->node()) > 0;
      if (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List)
        return std::any_of(v->seq().begin(), v->seq().end(), tracked);
      return false;
    };
    if (!why.empty() && (std::any_of(args_in.begin(), args_in.end(), tracked) ||
                         std::any_of(kwargs_in.begin(), kwargs_in.end(), [&](const auto& kv) { return tracked(kv.second); })))
      unsupported("call to " + name + " with inputs that require grad: " + why);
  }
  // A size tuple holding 0-d tensors capture knows (as_strided(size=(B, n + 1, w, d))): their
  // ints, as torch reads them through __index__. Only in a tuple or list whose other items
  // are Python ints, so that a list of tensors (torch.stack([a, b])) stays one.
  auto sizes_of_known = [&](const VarPtr& v) -> VarPtr {
    if (v->kind() != Var::Kind::Tuple && v->kind() != Var::Kind::List) return v;
    std::vector<VarPtr> items = v->seq();
    bool known = false, ints = false;
    for (const VarPtr& x : items) {
      if (known_value(x)) known = true;
      else if ((x->is_const() && PyLong_CheckExact(x->known())) || x->symint().valid()) ints = true;
      else return v;
    }
    if (!known || !ints) return v;
    for (VarPtr& x : items) x = known_int(x);
    return Var::tuple(std::move(items));
  };
  std::vector<VarPtr> args = args_in;
  KwArgs kwargs = kwargs_in;
  for (VarPtr& a : args) a = sizes_of_known(a);
  for (auto& kv : kwargs) kv.second = sizes_of_known(kv.second);
  // F.relu6(x, inplace=True) and the other functions with an `inplace` parameter: the call out
  // of place, then the input takes the result (as a registry op's inplace=True does). Left in
  // the call, the update would land in a buffer that other nodes, or a backward, still read.
  if (PyFunction_Check(f)) {
    auto* co = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(f));
    PyObject* names = PyCode_GetVarnames(co);
    Py_ssize_t at = -1;
    for (Py_ssize_t i = 0; names && i < co->co_argcount + co->co_kwonlyargcount; ++i)
      if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(names, i), "inplace") == 0) at = i;
    Py_XDECREF(names);
    if (!names) real(nullptr);
    std::vector<VarPtr> a = args;
    KwArgs kw = kwargs;
    VarPtr* flag = at >= 0 && at < co->co_argcount && static_cast<size_t>(at) < a.size() ? &a[static_cast<size_t>(at)] : nullptr;
    for (auto& [k, v] : kw)
      if (k == "inplace") flag = &v;
    if (flag && (*flag)->is_const() && (*flag)->known() == Py_True && !a.empty() && a[0]->is_tensor()) {
      *flag = Var::constant(Py_False);
      VarPtr out = torch_extern(f, name, a, kw);
      if (!out || !out->is_tensor()) unsupported("in-place " + name + " with a result kiln cannot take");
      check_inplace_target(args[0], name);
      return mutate(args[0], out->node());
    }
  }
  std::string leaf = name.substr(name.rfind('.') + 1);
  // Random draws (their order against eager's RNG stream matters), device moves, data reads
  // and autograd state stay in Python.
  // By the words of the name (F.normalize is no draw; torch.randn_like, Tensor.log_normal_ are)
  static const std::set<std::string> random = {"rand", "randn", "randint", "randperm", "random", "dropout",
                                               "dropout1d", "dropout2d", "dropout3d", "bernoulli", "normal",
                                               "multinomial", "poisson", "exponential", "uniform", "cauchy",
                                               "geometric", "rrelu", "gumbel"};
  auto draws = [&] {
    size_t start = 0;
    while (start <= leaf.size()) {
      size_t end = leaf.find('_', start);
      if (end == std::string::npos) end = leaf.size();
      if (random.count(leaf.substr(start, end - start))) return true;
      start = end + 1;
    }
    return false;
  };
  static const char* refused[] = {"empty", "item", "tolist", "numpy", "to", "cuda", "cpu", "type", "data_ptr",
                                  "backward", "register_hook", "requires_grad", "detach", "set_", "share_memory",
                                  "pin_memory", "new_empty"};
  static PyObject* f_dropout = resolve_torch_path("torch.nn.functional.dropout");
  static PyObject* torch_dropout = resolve_torch_path("torch.dropout");
  if (f == f_dropout || f == torch_dropout) return dropout(args, kwargs, f == f_dropout);
  if (VarPtr drawn = random_draw(f, args, kwargs)) return drawn;
  // named after a distribution, drawing nothing: the Poisson negative log-likelihood
  static const std::set<PyObject*> draw_free = {resolve_torch_path("torch.nn.functional.poisson_nll_loss"),
                                                resolve_torch_path("torch.poisson_nll_loss")};
  if (draws() && !draw_free.count(f)) unsupported("call to " + name + " draws random numbers: not captured yet");
  // x.detach(): the same values, outside autograd (the training graph stops gradients there).
  if (leaf == "detach" && args.size() == 1 && args[0]->is_tensor() && kwargs.empty()) {
    ir::Attrs a;
    a.set("detach", true);
    ir::Node* n = add_node("alias", {args[0]->node()}, a);
    root()->needs_grad_.erase(n);
    return Var::tensor(n);
  }
  for (const char* r : refused)
    if (leaf == r) unsupported("call to " + name + " is not captured (device, data or autograd state)");
  bool dunder = leaf.size() > 4 && leaf.rfind("__", 0) == 0 && leaf.substr(leaf.size() - 2) == "__";
  if (!leaf.empty() && leaf.back() == '_' && !dunder) unsupported("in-place " + name + " is not captured yet");
  for (auto& [k, v] : kwargs)
    if (k == "out") unsupported(name + "(out=...) is not captured");
  std::vector<ir::Node*> inputs;
  std::vector<VarPtr> input_vars;  // the tracker of each input
  // Symbolic ints an indexed assignment's key holds (cache[:, pos] = k, pos a size or a Python
  // int the entry is generic over): markers evaluated per call, so that the entry does not
  // specialize on them. The result has its base's sizes whatever they are.
  const bool symbolic_key = f == functional_setitem();
  std::vector<sym::Expr> sym_args;
  auto sym_marker = [&](const sym::Expr& e) -> PyObject* {
    if (!e.valid()) return Py_NewRef(Py_None);
    if (auto c = e.as_const()) return PyLong_FromLongLong(*c);
    sym_args.push_back(e);
    return sym_slot(static_cast<int>(sym_args.size()) - 1);
  };
  std::function<PyObject*(const VarPtr&)> tmpl = [&](const VarPtr& v) -> PyObject* {
    if (symbolic_key && v->kind() == Var::Kind::Const) {
      if (sym::Expr e = v->symint(); e.valid()) return sym_marker(e);
      if (const std::vector<sym::Expr>* sl = v->symslice()) {
        PyObject* start = sym_marker((*sl)[0]);
        PyObject* stop = sym_marker((*sl)[1]);
        PyObject* step = sym_marker((*sl)[2]);
        PyObject* out = PySlice_New(start, stop, step);
        Py_DECREF(start);
        Py_DECREF(stop);
        Py_DECREF(step);
        return out;
      }
    }
    switch (v->kind()) {
      case Var::Kind::Tensor:
        if (v->is_array()) unsupported("call to " + name + " with an ndarray argument (torch takes tensors): not captured");
        inputs.push_back(v->node());
        input_vars.push_back(v);
        return tensor_slot(static_cast<int>(inputs.size()) - 1);
      case Var::Kind::Tuple:
      case Var::Kind::List: {
        const auto& items = v->seq();
        PyObject* t = v->kind() == Var::Kind::Tuple ? PyTuple_New(static_cast<Py_ssize_t>(items.size()))
                                                  : PyList_New(static_cast<Py_ssize_t>(items.size()));
        for (size_t i = 0; i < items.size(); ++i) {
          PyObject* item = tmpl(items[i]);
          if (v->kind() == Var::Kind::Tuple) PyTuple_SET_ITEM(t, i, item);
          else PyList_SET_ITEM(t, i, item);
        }
        return t;
      }
      case Var::Kind::Const: return Py_NewRef(v->obj());
      default: unsupported("call to " + name + " with an argument kiln cannot pass");
    }
  };
  PyObject* targs = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
  keep_.push_back(targs);
  for (size_t i = 0; i < args.size(); ++i) PyTuple_SET_ITEM(targs, i, tmpl(args[i]));
  PyObject* tkw = nullptr;
  if (!kwargs.empty()) {
    tkw = PyDict_New();
    keep_.push_back(tkw);
    for (auto& [k, v] : kwargs) {
      PyObject* item = tmpl(v);
      PyDict_SetItemString(tkw, k.c_str(), item);
      Py_DECREF(item);
    }
  }
  // Under torch.autocast, an operator kiln has an entry for (whose `covers` sent this call to
  // torch: attention with grouped heads, a cat with a legacy empty tensor) casts its inputs as
  // that entry's policy says, before its layout is probed. Another takes the cast its own
  // autocast kernel, or the inner calls of its composite (einsum's bmm), make: what running it
  // under autocast on small tensors shows (probe_autocast). Where that fails, the cast is
  // unknown and add_node refuses the call.
  bool cast_as_entry = false;
  if (root()->autocast_.any() && !inputs.empty()) {
    const bool passes_by = autocast_passes_by(f, inputs.front()->meta.device.type == DeviceType::CUDA);
    if (float32_loss(f)) {
      // a loss torch's autocast computes in float32 (its own kernel, or log_softmax and
      // nll_loss for cross_entropy, both on the list): its floating inputs cast to float32
      ir::Attrs unused;
      autocast_inputs(ops::AutocastPolicy::Float32, ops::AutocastPolicy::Float32, name, inputs, unused);
      cast_as_entry = true;
    } else if (passes_by) {
      cast_as_entry = true;  // no cast: autocast's dispatch passes the operator by
    } else if (std::optional<ops::AutocastPolicy> p = !function_binding(f)
                                                          ? probe_autocast(f, targs, tkw, inputs, sym_args)
                                                          : std::nullopt) {
      ir::Attrs unused;
      autocast_inputs(*p, *p, name, inputs, unused);
      cast_as_entry = true;
    } else if (const OpBinding* b = function_binding(f)) {
      const bool cuda = inputs.front()->meta.device.type == DeviceType::CUDA;
      const ops::AutocastPolicy p = cuda ? b->op->autocast_cuda : b->op->autocast_cpu;
      cast_as_entry = p == ops::AutocastPolicy::None || p == ops::AutocastPolicy::LowerPrecision ||
                      p == ops::AutocastPolicy::Float32;
      if (cast_as_entry) {
        ir::Attrs unused;
        autocast_inputs(b->op, inputs, unused);
      }
    }
  }
  // A factory (arange, zeros, full, tensor, ...): its layout from the same call on the meta
  // device; the device it would make the tensor on, from its `device` argument or torch's default.
  PyObject* factory_device = nullptr;
  if (inputs.empty()) {
    static PyObject* device_type = resolve_torch("device");
    static PyObject* default_device = resolve_torch("get_default_device");
    PyObject* dev = tkw ? PyDict_GetItemString(tkw, "device") : nullptr;
    factory_device = dev && dev != Py_None ? PyObject_CallOneArg(device_type, dev) : PyObject_CallNoArgs(default_device);
    if (!factory_device) real(nullptr);
    keep_.push_back(factory_device);
    if (!tkw) {
      tkw = PyDict_New();
      keep_.push_back(tkw);
    }
  }
  // The layout of the result: the operator on meta tensors of the inputs' layouts, at the
  // sizes of this call (`value` gives each size symbol's value; symbols stay unspecialized).
  static PyObject* empty_strided = resolve_torch("empty_strided");
  GuardSet& guards = root()->out_.guards;
  std::vector<int64_t> sym_values;  // sym_args at the sizes of the metas last made
  auto make_metas = [&](const std::function<int64_t(const sym::Expr&)>& value, std::vector<PyObject*>& metas) {
    sym_values.clear();
    for (const sym::Expr& e : sym_args) sym_values.push_back(sym::evaluate(e, value));
    for (ir::Node* n : inputs) {
      PyObject* sz = PyTuple_New(static_cast<Py_ssize_t>(n->meta.sizes.size()));
      PyObject* st = PyTuple_New(static_cast<Py_ssize_t>(n->meta.strides.size()));
      for (size_t i = 0; i < n->meta.sizes.size(); ++i) PyTuple_SET_ITEM(sz, i, PyLong_FromLongLong(sym::evaluate(n->meta.sizes[i], value)));
      for (size_t i = 0; i < n->meta.strides.size(); ++i) PyTuple_SET_ITEM(st, i, PyLong_FromLongLong(sym::evaluate(n->meta.strides[i], value)));
      PyObject* kw = Py_BuildValue("{s:O,s:s}", "dtype", torch_dtype_object(n->meta.dtype), "device", "meta");
      PyObject* a = PyTuple_Pack(2, sz, st);
      PyObject* m = PyObject_Call(empty_strided, a, kw);
      Py_DECREF(a);
      Py_DECREF(kw);
      Py_DECREF(sz);
      Py_DECREF(st);
      if (!m) return false;
      metas.push_back(m);
    }
    return true;
  };
  auto call_on = [&](const std::vector<PyObject*>& metas) -> PyObject* {
    PyObject* margs = substitute(targs, metas.data(), sym_values.data());
    PyObject* mkw = tkw ? substitute(tkw, metas.data(), sym_values.data()) : nullptr;
    if (!margs || (tkw && !mkw)) {
      Py_XDECREF(margs);
      Py_XDECREF(mkw);
      return nullptr;
    }
    if (factory_device) {
      PyObject* meta = PyUnicode_FromString("meta");
      PyDict_SetItemString(mkw, "device", meta);
      Py_DECREF(meta);
    }
    PyObject* r = PyObject_Call(f, margs, mkw);
    Py_DECREF(margs);
    Py_XDECREF(mkw);
    return r;
  };
  std::vector<PyObject*> metas;
  auto drop_metas = [&] {
    for (PyObject* m : metas) Py_DECREF(m);
    metas.clear();
  };
  auto at_hints = [&](const sym::Expr& v) { return guards.value_at_hints(v); };
  if (!make_metas(at_hints, metas)) {
    drop_metas();
    real(nullptr);
  }
  auto versions = [&] {
    std::vector<long long> v;
    for (PyObject* m : metas) {
      PyObject* ver = PyObject_GetAttrString(m, "_version");
      v.push_back(ver ? PyLong_AsLongLong(ver) : -1);
      Py_XDECREF(ver);
      clear_error();
    }
    return v;
  };
  const std::vector<long long> before = versions();
  PyObject* r = call_on(metas);
  // torch's meta kernels are a second implementation of each operator's shape rule, and a few
  // disagree with the kernel (multi_margin_loss of a 0-d input: [1] where the kernel gives []).
  // On small CPU inputs of fixed sizes the call runs for real too, torch's random state kept,
  // and a disagreement sends the call to Python.
  if (r && meta_disagrees(f, r, inputs, [&](const std::vector<PyObject*>& reals) { return call_on(reals); })) {
    Py_DECREF(r);
    drop_metas();
    if (PyFunction_Check(f) && is_torch_internal(f)) return nullptr;  // a Python function of torch's: inlined instead (call)
    unsupported("call to " + name + ": on meta tensors it gives its result another shape or dtype than on the call's device");
  }
  // An operator that hands back an input itself, unchanged (x.type_as(x)): eager's result is
  // that very tensor, so it is that very tracker, and later in-place updates reach both names.
  // (F.hardtanh(x, inplace=True) hands back x changed: its version counter moved.)
  const std::vector<long long> after = r ? versions() : before;
  for (size_t j = 0; r && j < metas.size(); ++j)
    if (r == metas[j] && before[j] == after[j] && before[j] >= 0) {
      Py_DECREF(r);
      drop_metas();
      return inputs[j] == input_vars[j]->node() ? input_vars[j] : Var::tensor(inputs[j]);  // the autocast copy
    }
  // A result that views the call's first tensor (torch.diagonal, Tensor.unfold): where it lies in
  // that tensor's memory, its storage offset from the meta input's start (sizes all constant:
  // an offset fixed for the entry), so that an in-place update through it can be written back.
  std::vector<std::optional<int64_t>> view_offsets;
  // Which results view one of the call's tensors. torch's `_base` is the root of a chain of
  // views: a result whose base is none of the meta inputs views memory the call made itself
  // (einsum's permuted product), which an in-place update may change like a fresh tensor's.
  std::vector<bool> views_an_input;
  if (r) {
    // each meta input's root (one made as a view of other memory, for its strides or offset)
    std::vector<PyObject*> roots;
    for (PyObject* m : metas) {
      PyObject* root = is_tensor(m) ? PyObject_GetAttrString(m, "_base") : nullptr;
      clear_error();
      if (!root || root == Py_None) {
        Py_XDECREF(root);
        root = Py_NewRef(m);
      }
      roots.push_back(root);
    }
    const Py_ssize_t n = PyTuple_Check(r) ? PyTuple_GET_SIZE(r) : 1;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* t = PyTuple_Check(r) ? PyTuple_GET_ITEM(r, i) : r;
      PyObject* base = is_tensor(t) ? PyObject_GetAttrString(t, "_base") : nullptr;
      clear_error();
      bool views = !base || (base != Py_None && metas.empty());  // no meta run to tell: as before
      for (size_t j = 0; j < metas.size(); ++j) views |= base == metas[j] || base == roots[j];
      views_an_input.push_back(views);
      Py_XDECREF(base);
    }
    for (PyObject* root : roots) Py_DECREF(root);
  }
  bool fixed_first = !inputs.empty() && inputs[0];
  for (size_t i = 0; fixed_first && i < inputs[0]->meta.sizes.size(); ++i)
    fixed_first = inputs[0]->meta.sizes[i].as_const() && inputs[0]->meta.strides[i].as_const();
  if (r && fixed_first && !metas.empty()) {
    const Py_ssize_t n = PyTuple_Check(r) ? PyTuple_GET_SIZE(r) : 1;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* t = PyTuple_Check(r) ? PyTuple_GET_ITEM(r, i) : r;
      PyObject* base = is_tensor(t) ? PyObject_GetAttrString(t, "_base") : nullptr;
      PyObject* off = base == metas[0] ? PyObject_CallMethod(t, "storage_offset", nullptr) : nullptr;
      view_offsets.push_back(off && PyLong_Check(off) ? std::optional<int64_t>(PyLong_AsLongLong(off)) : std::nullopt);
      Py_XDECREF(off);
      Py_XDECREF(base);
      clear_error();
    }
  }
  drop_metas();
  if (!r) {
    clear_error();  // no meta kernel, or an error eager raises itself when the call runs there
    unsupported("call to " + name + " (no layout from meta tensors)");
  }
  keep_.push_back(r);
  auto all_tensors = [&] {
    if (!PyTuple_Check(r)) return is_tensor(r);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r); ++i)
      if (!is_tensor(PyTuple_GET_ITEM(r, i))) return false;
    return PyTuple_GET_SIZE(r) > 0;
  };
  if (!all_tensors() && PyFunction_Check(f)) return nullptr;  // the caller inlines it instead
  std::vector<PyObject*> results;
  const bool tuple = PyTuple_Check(r);
  if (tuple) for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r); ++i) results.push_back(PyTuple_GET_ITEM(r, i));
  else results.push_back(r);
  // Each result is a node of its own that calls the function again: one that writes into its
  // arguments (native_batch_norm's running statistics, declared `Tensor(a!)` in its schema and
  // written without a version bump) would write once per result.
  if (results.size() > 1 && writes_arguments(f)) unsupported("call to " + name + ", which writes into its arguments and returns several tensors");
  std::vector<TensorInfo> infos(results.size());
  for (size_t k = 0; k < results.size(); ++k) {
    std::string why;
    if (!is_tensor(results[k]) || !tensor_info(results[k], infos[k], why)) unsupported(name + " returns something other than tensors");
    // torch.ones(2, requires_grad=True): a new leaf autograd tracks, which the graph's value is not
    if (infos[k].requires_grad) unsupported(name + " makes a tensor that requires grad (a new leaf): not captured");
  }
  // Which results autograd tracks, as eager decides it: the call again on meta tensors that
  // require grad where the inputs do (x.type_as(w) does not track w; most operators do).
  std::vector<bool> tracked(results.size(), true);
  // And which results torch's backward reads (its node keeps `_saved_result`: logsumexp's,
  // cumprod's): changed in place before backward(), eager's backward raises, and kiln's must.
  std::vector<bool> saves_result(results.size(), false);
  std::set<int64_t> kept_inputs;  // inputs torch's backward keeps (OpDef::keeps_inputs, found)
  // Per result, the tracked inputs its autograd graph does not reach (hinge_embedding_loss's
  // target, read only by a comparison): eager gives them no gradient (None), not a zero one.
  std::vector<std::vector<int64_t>> unreached(results.size());
  bool tracked_input = false;
  for (ir::Node* n : inputs) tracked_input |= root()->needs_grad_.count(n) > 0;
  if (root()->grad_mode_ && tracked_input) {
    std::vector<PyObject*> leaves;
    if (make_metas(at_hints, leaves)) {
      for (size_t j = 0; j < inputs.size(); ++j) {
        if (!root()->needs_grad_.count(inputs[j]) || !is_floating(inputs[j]->meta.dtype)) continue;
        // a non-leaf that requires grad: in-place operators may write it, as they may the input
        PyObject* leaf = PyObject_CallMethod(leaves[j], "requires_grad_", nullptr);
        PyObject* inner = leaf ? PyObject_CallMethod(leaf, "clone", nullptr) : nullptr;
        Py_XDECREF(leaf);
        if (inner) Py_SETREF(leaves[j], inner);
      }
      const bool was = set_grad_enabled(true);
      PyObject* rg = call_on(leaves);
      set_grad_enabled(was);
      for (size_t k = 0; rg && k < results.size(); ++k) {
        PyObject* t = PyTuple_Check(rg) ? (k < size_t(PyTuple_GET_SIZE(rg)) ? PyTuple_GET_ITEM(rg, k) : nullptr) : rg;
        PyObject* rq = t ? PyObject_GetAttrString(t, "requires_grad") : nullptr;
        if (rq) tracked[k] = rq == Py_True;
        Py_XDECREF(rq);
        PyObject* node = t ? PyObject_GetAttrString(t, "grad_fn") : nullptr;
        if (node && node != Py_None) {
          saves_result[k] = PyObject_HasAttrString(node, "_saved_result") == 1;
          // and which inputs it keeps (`_saved_self`, `_saved_other`, ...: the meta inputs themselves)
          PyObject* names = PyObject_Dir(node);
          for (Py_ssize_t i = 0; names && i < PyList_GET_SIZE(names); ++i) {
            const char* attr = PyUnicode_AsUTF8(PyList_GET_ITEM(names, i));
            if (!attr || std::strncmp(attr, "_saved_", 7) != 0 || std::strcmp(attr, "_saved_result") == 0) continue;
            PyObject* saved = PyObject_GetAttrString(node, attr);
            for (size_t j = 0; saved && j < leaves.size(); ++j)
              if (saved == leaves[j]) kept_inputs.insert(static_cast<int64_t>(j));
            Py_XDECREF(saved);
            clear_error();
          }
          Py_XDECREF(names);
          clear_error();
        }
        Py_XDECREF(node);
        // torch.autograd.grad over the meta tensors (no arithmetic): None for what is unreached
        static PyObject* grad_fn = object_at("torch.autograd.grad");
        static PyObject* ones_like = resolve_torch("ones_like");
        std::vector<size_t> asked;
        for (size_t j = 0; j < inputs.size(); ++j)
          if (root()->needs_grad_.count(inputs[j]) && is_floating(inputs[j]->meta.dtype)) asked.push_back(j);
        PyObject* rq2 = t && tracked[k] && !asked.empty() ? PyObject_GetAttrString(t, "requires_grad") : nullptr;
        if (rq2 == Py_True && grad_fn && ones_like) {
          PyObject* wrt = PyTuple_New(static_cast<Py_ssize_t>(asked.size()));
          for (size_t i = 0; i < asked.size(); ++i) PyTuple_SET_ITEM(wrt, i, Py_NewRef(leaves[asked[i]]));
          PyObject* seed = PyObject_CallOneArg(ones_like, t);
          PyObject* kw = seed ? Py_BuildValue("{s:O,s:O,s:O}", "grad_outputs", seed, "allow_unused", Py_True, "retain_graph", Py_True)
                              : nullptr;
          PyObject* a = kw ? PyTuple_Pack(2, t, wrt) : nullptr;
          const bool was_on = set_grad_enabled(true);
          PyObject* grads = a ? PyObject_Call(grad_fn, a, kw) : nullptr;
          set_grad_enabled(was_on);
          for (size_t i = 0; grads && PyTuple_Check(grads) && i < asked.size(); ++i)
            if (PyTuple_GET_ITEM(grads, i) == Py_None) unreached[k].push_back(static_cast<int64_t>(asked[i]));
          Py_XDECREF(grads);
          Py_XDECREF(a);
          Py_XDECREF(kw);
          Py_XDECREF(seed);
          Py_DECREF(wrt);
          clear_error();  // no meta backward: every tracked input takes a gradient, as before
        }
        Py_XDECREF(rq2);
      }
      Py_XDECREF(rg);
    }
    for (PyObject* m : leaves) Py_DECREF(m);
    clear_error();  // no meta autograd for it: eager's rule for registry ops (any tracked input)
  }
  std::optional<std::vector<sym::Expr>> layouts = symbolic_layouts(inputs, infos, make_metas, call_on);
  std::vector<VarPtr> outs;
  size_t next_expr = 0;
  for (size_t k = 0; k < results.size(); ++k) {
    const TensorInfo& info = infos[k];
    ir::Attrs a;
    a.set("fn", static_cast<int64_t>(register_torch_call(f, targs, tkw, tuple ? static_cast<int>(k) : -1)));
    a.set("target", name);
    if (!sym_args.empty()) a.set("sym_args", sym_args);
    if (tuple) a.set("result", static_cast<int64_t>(k));
    if (layouts) {
      std::vector<sym::Expr> sizes(layouts->begin() + next_expr, layouts->begin() + next_expr + info.sizes.size());
      next_expr += info.sizes.size();
      std::vector<sym::Expr> strides(layouts->begin() + next_expr, layouts->begin() + next_expr + info.strides.size());
      next_expr += info.strides.size();
      a.set("out_sizes", sizes);
      a.set("out_strides", strides);
    } else {
      a.set("out_sizes", info.sizes);
      a.set("out_strides", info.strides);
    }
    a.set("out_dtype", info.dtype);
    if (deterministic_torch_function(f)) a.set("deterministic", true);
    if (saves_result[k]) a.set("saves_result", true);
    if (!kept_inputs.empty()) a.set("kept_inputs", std::vector<int64_t>(kept_inputs.begin(), kept_inputs.end()));
    if (!unreached[k].empty()) a.set("unreached_inputs", unreached[k]);
    if (factory_device) {
      PyObject* type = PyObject_GetAttrString(factory_device, "type");
      PyObject* index = PyObject_GetAttrString(factory_device, "index");
      bool cuda = type && PyUnicode_CompareWithASCIIString(type, "cuda") == 0;
      bool cpu = type && PyUnicode_CompareWithASCIIString(type, "cpu") == 0;
      int64_t at = index && index != Py_None ? PyLong_AsLongLong(index) : 0;
      Py_XDECREF(type);
      Py_XDECREF(index);
      if (!cuda && !cpu) unsupported(name + " on a device kiln does not compile for");
      a.set("out_device", cuda ? at : int64_t{-1});
    }
    PyObject* is_view = PyObject_CallMethod(results[k], "_is_view", nullptr);
    if (is_view == Py_True && (k >= views_an_input.size() || views_an_input[k])) a.set("view", true);
    if (is_view == Py_True && k < view_offsets.size() && view_offsets[k]) a.set("view_offset", *view_offsets[k]);
    Py_XDECREF(is_view);
    clear_error();
    static const ops::OpDef* torch_call_op = ops::find_op("torch_call");
    ir::Node* node = add_node(torch_call_op, inputs, a, !cast_as_entry);
    if (!tracked[k]) root()->needs_grad_.erase(node);
    outs.push_back(Var::tensor(node));
  }
  if (!tuple) return outs[0];
  VarPtr t = Var::tuple(std::move(outs));
  if (!PyTuple_CheckExact(r)) t->as<TupleV>().structseq = Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(r)));  // (values, indices)
  return t;
}

}  // namespace kiln::bind::detail
