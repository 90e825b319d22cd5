#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "core/sym/shape_env.h"
#include "bind/capture/resume.h"
#include "bind/python_objects.h"
#include "bind/capture/torch_call.h"
#include "bind/runtime/compiled_function.h"
#include "bind/torch/tensor_bridge.h"

namespace kiln::bind::detail {

namespace {

// The views from the tensor `n` views to `n`: that tensor first, `n` last (just `n` when it is
// not a view).
std::vector<ir::Node*> view_chain(ir::Node* n) {
  std::vector<ir::Node*> chain{n};
  while (Interpreter::is_view(chain.back())) chain.push_back(chain.back()->inputs[0]);
  std::reverse(chain.begin(), chain.end());
  return chain;
}

// Whether some elements of a tensor of this layout share memory (an expanded tensor, an
// overlapping as_strided or unfold), sizes and strides at this call's values.
bool elements_overlap(const ir::TensorMeta& m, const GuardSet& guards) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    const int64_t size = guards.value_at_hints(m.sizes[d]);
    if (size > 1) dims.emplace_back(guards.value_at_hints(m.strides[d]), size);
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // the farthest element offset the smaller-stride dims reach
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return true;
    reach += stride * (size - 1);
  }
  return false;
}

// Whether a view's values can be taken again from a new base and its place in the base is known:
// registry views, and torch calls whose result views their first tensor at a fixed offset
// (`view_offset`, found by capture on meta tensors).
bool retakeable(const ir::Node* n) { return n->op->aliases() || n->attrs.has("view_offset"); }

// Where the last view of `chain` starts in the memory of the first, in elements (nullopt: not a
// constant).
std::optional<int64_t> offset_in_base(const std::vector<ir::Node*>& chain) {
  sym::Expr off = 0;
  for (size_t i = 1; i < chain.size(); ++i)
    off = off + (chain[i]->op->aliases() ? chain[i]->meta.offset - chain[i - 1]->meta.offset
                                          : sym::Expr(chain[i]->attrs.get_int("view_offset")));
  return off.as_const();
}

}  // namespace

// An in-place update of a view (x[:, 0] += 1, x.t().mul_(2), x.view(-1)[::2] = 0) is captured
// functionally, as AOTAutograd's functionalization does: the view's new values are scattered
// into a copy of the tensor it views, which the tensor's tracker then holds (an input's is
// written back after the graph), and the view, like every other live view of that tensor, is
// taken again from that copy (retake_views). Taken where the viewed tensor is dense, with fixed
// sizes: `view_target` gives its tracker, or refuses.
VarPtr Interpreter::view_target(const VarPtr& a, const std::string& what) {
  const std::vector<ir::Node*> chain = view_chain(a->node());
  ir::Node* base = chain.front();
  for (size_t i = 1; i < chain.size(); ++i)  // views that can be taken again (below)
    if (!retakeable(chain[i])) unsupported("in-place " + what + " on a view torch made: not captured yet");
  Interpreter* r = root();
  VarPtr target;
  for (const VarPtr& in : r->input_vars_)
    if (in->in_graph() && in->node() == base) target = in;
  if (!target && base->op->kind == ops::OpKind::Source && base->op_name() == "placeholder")
    unsupported("in-place " + what + " on a view of an input kiln no longer tracks");
  const ir::TensorMeta& bm = base->meta;
  if (bm.strides != ops::preserved_strides(bm)) unsupported("in-place " + what + " on a view of a tensor that is not dense");
  const ir::TensorMeta& vm = a->node()->meta;
  for (const auto* list : {&vm.sizes, &vm.strides})
    for (const sym::Expr& e : *list)
      if (!e.as_const()) unsupported("in-place " + what + " on a view of symbolic size");
  if (!offset_in_base(chain)) unsupported("in-place " + what + " on a view at a symbolic offset");
  // eager updates such a view element by element, each shared place as often as it appears;
  // scattering the view's new values writes each place once
  if (elements_overlap(vm, r->out_.guards)) unsupported("in-place " + what + " on a view whose elements share memory");
  if (base->op_name() == "placeholder") check_input_update(base, what);
  return target ? target : tracker_of(base, what);
}

VarPtr Interpreter::tracker_of(ir::Node* base, const std::string& what) {
  Interpreter* r = root();
  VarPtr found;
  auto it = r->trackers_.find(base);
  if (it != r->trackers_.end()) {
    for (const std::weak_ptr<Var>& w : it->second) {
      VarPtr v = w.lock();
      if (!v || !v->in_graph() || v->node() != base || v == found) continue;
      // two trackers of one node would be two Python tensors kiln cannot tell apart
      if (found) unsupported("in-place " + what + " on a view of a tensor two trackers hold");
      found = v;
    }
  }
  return found ? found : Var::tensor(base);
}

// A view of an input the graph updated, handed out: view_of the caller's tensor (`base`, its
// spec) after the write-back, at the view's sizes, strides and offset.
OutSpec Interpreter::input_view_spec(const VarPtr& v, OutSpec base) {
  const std::vector<ir::Node*> chain = view_chain(v->node());
  std::optional<int64_t> offset = offset_in_base(chain);
  for (size_t i = 1; i < chain.size(); ++i)
    if (!retakeable(chain[i])) offset.reset();
  if (!offset) unsupported("a view at a symbolic offset of an input updated in place is handed out: not captured yet");
  if (root()->needs_grad_.count(v->node())) unsupported("a view of an input updated in place is handed out, tracked by autograd: not captured yet");
  // sizes, strides and offset as output_spec gives ints: constants, or evaluated per call
  auto ints = [&](const std::vector<sym::Expr>& es) {
    std::vector<VarPtr> items;
    for (const sym::Expr& e : es) items.push_back(size_const(e));
    return output_spec(Var::tuple(std::move(items)));
  };
  OutSpec kw;
  kw.kind = OutSpec::Kind::Dict;
  kw.value = Py_BuildValue("(ssss)", "base", "size", "stride", "offset");
  kw.items.push_back(std::move(base));
  kw.items.push_back(ints(v->node()->meta.sizes));
  kw.items.push_back(ints(v->node()->meta.strides));
  kw.items.push_back(output_spec(size_const(sym::Expr(*offset))));
  OutSpec s;
  s.kind = OutSpec::Kind::Construct;
  s.value = Py_NewRef(view_of());
  s.items.push_back(std::move(kw));
  return s;
}

void Interpreter::check_inplace_target(const VarPtr& a, const std::string& what) {
  const ir::Node* n = a->node();
  if (is_view(n)) return void(view_target(a, what));
  if (n->op_name() != "placeholder") return;
  check_input_update(n, what);
}

void Interpreter::check_input_update(const ir::Node* n, const std::string& what) {
  // An input: updated out of place in the graph, the result copied into the caller's tensor
  // after it (write_back). Every read of the input shares this tracker, so later reads see the
  // update; another input sharing its memory would not, so capture and guards refuse that.
  Interpreter* r = root();
  if (r->needs_grad_.count(n) && r->grad_mode_)
    unsupported("in-place " + what + " on an input that requires grad: kiln does not build backward graphs yet");
  // The write-back is a copy into the input: an input whose elements share memory (an
  // expanded tensor) cannot take one, though some in-place ops (fill_) accept it in eager.
  if (elements_overlap(n->meta, r->out_.guards))
    unsupported("in-place " + what + " on an input whose elements share memory (expanded): not captured");
  const auto& ins = g_->inputs();
  const size_t i = static_cast<size_t>(std::find(ins.begin(), ins.end(), n) - ins.begin());
  if (i >= r->input_objects_.size()) unsupported("in-place " + what + " on an input kiln cannot write back");
  const void* mine = storage_of(r->input_objects_[i]);
  for (size_t k = 0; k < r->input_objects_.size(); ++k)
    if (k != i && mine && storage_of(r->input_objects_[k]) == mine)
      unsupported("in-place " + what + " on an input that shares memory with another input (" + r->out_.input_sources[k]->str() + ")");
}

std::vector<std::pair<size_t, ir::Node*>> Interpreter::input_mutations() {
  std::vector<std::pair<size_t, ir::Node*>> out;
  const auto& ins = g_->inputs();
  for (size_t i = 0; i < input_vars_.size(); ++i)
    if (input_vars_[i]->in_graph() && input_vars_[i]->node() != ins[i]) out.emplace_back(i, input_vars_[i]->node());
  return out;
}

void Interpreter::write_back(const std::vector<std::pair<size_t, ir::Node*>>& mutations) {
  if (mutations.empty()) return;
  auto& outs = g_->outputs();
  std::vector<bool> mutated(out_.input_sources.size(), false);
  for (const auto& [input, value] : mutations) {
    auto it = std::find(outs.begin(), outs.end(), value);
    const int index = static_cast<int>(it - outs.begin());
    if (it == outs.end()) outs.push_back(value);
    out_.writebacks.emplace_back(static_cast<int>(input), index);
    g_->input_updates.emplace_back(static_cast<int>(input), index);
    written_back_[value] = input;
    mutated[input] = true;
  }
  out_.guards.add_no_alias(out_.input_sources, std::move(mutated));
}

VarPtr Interpreter::mutate(const VarPtr& a, ir::Node* result) {
  // x.data.mul_(c) changes x's memory without counting in x's version (autograd's saved-value
  // checks do not see it), which the graph's write-back would count: run in Python instead
  if (is_view(a->node()))
    for (const ir::Node* v : view_chain(a->node()))
      if (v->attrs.get_bool("tensor_data")) unsupported("an in-place update through Tensor.data");
  // A result of a wider type (a bfloat16 tensor += a float32 one, as under autocast) is cast to
  // the tensor's type, as torch's in-place ops do where that cast is allowed: never a floating
  // value into an integer tensor, nor a number into a bool one.
  const DType self = a->node()->meta.dtype, got = result->meta.dtype;
  const bool castable = (is_floating(self) || !is_floating(got)) && (self != DType::Bool || got == DType::Bool);
  if (got != self && castable && result->meta.sizes == a->node()->meta.sizes && !result->meta.wrapped_number) {
    ir::Attrs to;
    to.set("dtype", self);
    result = add_node("convert", {result}, to);
  }
  if (result->meta.dtype != a->node()->meta.dtype || result->meta.sizes != a->node()->meta.sizes) {
    // torch keeps the tensor's dtype and shape in place: a result that changes either is an error
    // there (or a cast), which eager reports. The result is not computed: eager raises before it
    // would (an integer division by zero in it must not raise first).
    if (result->users.empty()) g_->erase_if([&](const ir::Node* n) { return n == result; });
    unsupported("in-place result of another dtype or shape");
  }
  // torch's in-place op leaves the tensor's layout: a fresh value made for the update (fill_'s
  // full, copy_'s clone: row-major by their own rules) takes the tensor's strides
  static const ops::OpDef* full = ops::find_op("full");
  static const ops::OpDef* clone = ops::find_op("clone");
  if ((result->op == full || result->op == clone) && result->users.empty() && !is_view(a->node()) &&
      result->meta.strides != a->node()->meta.strides)
    result->meta.strides = a->node()->meta.strides;
  if (is_view(a->node())) {
    // Through a view: the new values scattered into a copy of the viewed tensor (view_target).
    const std::vector<ir::Node*> chain = view_chain(a->node());
    VarPtr base = view_target(a, "update");
    const ir::TensorMeta& vm = a->node()->meta;
    auto ints = [](const std::vector<sym::Expr>& xs) {
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(xs.size()));
      for (size_t i = 0; i < xs.size(); ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(*xs[i].as_const()));
      return Var::steal_constant(t);
    };
    VarPtr copy = torch_extern(view_scatter(), "view_scatter",
                               {base, Var::tensor(result), ints(vm.sizes), ints(vm.strides),
                                Var::steal_constant(PyLong_FromLongLong(*offset_in_base(chain)))},
                               {});
    copy->node()->attrs.set("view_scatter", true);
    mutate(base, copy->node());  // and every live view of the input, `a` among them, taken again
    if (a->node() == chain.back()) retake(a, chain.front(), base->node());  // a tracker made otherwise
    return a;
  }
  const ir::Node* old = a->node();
  Interpreter* r = root();
  if (old->op_name() == "placeholder" && r->grad_mode_ && r->needs_grad_.count(result) && !r->needs_grad_.count(old))
    // Eager gives the caller's tensor a history of its own (x.add_(y), x[0] = y with y tracked):
    // the update then runs in Python, where autograd records it.
    unsupported("an in-place update that makes an input require grad");
  if (!r->grad_mode_ && r->needs_grad_.count(a->node()) && !r->needs_grad_.count(result)) {
    // Under no_grad the tensor keeps its history: its new value differentiates as the old.
    static const ops::OpDef* passthrough = ops::find_op("grad_passthrough");
    ir::Node* value = result;
    result = add_node(passthrough, {value, a->node()}, {});
    r->needs_grad_.insert(result);
    value->attrs.set("inplace_of", static_cast<int64_t>(a->node()->id));
  }
  // The node computes the update out of place; which node it updates is kept for backends that
  // run torch's ops (the eager backend writes the result into the old tensor, as torch's
  // in-place op leaves the tensor's layout).
  if (result != a->node()) {
    result->attrs.set("inplace_of", static_cast<int64_t>(a->node()->id));
    // Autograd may have saved the old value (exp's result, mm's input): eager's backward would
    // then raise. autodiff's version_facts decides whether a derivative reads it.
    a->node()->attrs.set("result_modified", true);
    // by whom: an in-place op's own formula reads the value before its update (torch saves
    // that original, `self.clone()`), so its own update never makes it stale
    a->node()->attrs.set("modified_by", static_cast<int64_t>(result->id));
  }
  a->node() = result;
  root()->trackers_[result].push_back(a);
  retake_views(old, a);
  return a;
}

void Interpreter::retake(const VarPtr& v, const ir::Node* old_base, ir::Node* new_base) {
  std::vector<ir::Node*> chain = view_chain(v->node());
  if (chain.front() != old_base) return;
  ir::Node* prev = new_base;
  for (size_t i = 1; i < chain.size(); ++i) {
    if (!retakeable(chain[i])) unsupported("an in-place update of a tensor with a live view torch made: not captured yet");
    std::vector<ir::Node*> ins = chain[i]->inputs;
    ins[0] = prev;
    prev = add_node(chain[i]->op_name(), ins, chain[i]->attrs);
  }
  v->node() = prev;
}

void Interpreter::retake_views(const ir::Node* old, const VarPtr& a) {
  // Only a tensor something took a view of has trackers to retake (most updates: none, and the
  // list is not walked).
  if (std::none_of(old->users.begin(), old->users.end(), [](const ir::Node* u) { return is_view(u); })) return;
  auto& views = root()->view_vars_;
  std::vector<VarPtr> live;
  views.erase(std::remove_if(views.begin(), views.end(),
                             [&](const std::weak_ptr<Var>& w) {
                               VarPtr v = w.lock();
                               if (v && v->in_graph() && v != a) live.push_back(v);
                               return !v;
                             }),
              views.end());
  for (const VarPtr& v : live) retake(v, old, a->node());
}

namespace {
// An int operand as a size expression: a symbolic int, or a plain int (not a bool).
std::optional<sym::Expr> int_expr(const VarPtr& v) {
  if (sym::Expr e = v->symint(); e.valid()) return e;
  PyObject* o = v->is_const() ? v->known() : nullptr;
  if (o && PyLong_CheckExact(o)) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (!overflow) return sym::Expr(static_cast<int64_t>(x));
  }
  return std::nullopt;
}
}  // namespace

// Shape arithmetic on symbolic ints stays symbolic: + - * on any, // and % by a positive
// constant or a size (Python's floor semantics, which sym::floordiv/mod follow). Its value for
// this call comes from Python on the hints. nullptr: not such an operation.
VarPtr Interpreter::symint_binary(const std::string& base, const VarPtr& a, const VarPtr& b) {
  if (!a->symint().valid() && !b->symint().valid()) return nullptr;
  auto x = int_expr(a), y = int_expr(b);
  if (!x || !y) return nullptr;
  sym::Expr r;
  if (base == "ADD") r = *x + *y;
  else if (base == "SUBTRACT") r = *x - *y;
  else if (base == "MULTIPLY") r = *x * *y;
  else if ((base == "FLOOR_DIVIDE" || base == "REMAINDER") &&
           ((y->as_const() && *y->as_const() > 0) || y->is_size_symbol()))
    r = base == "FLOOR_DIVIDE" ? sym::floordiv(*x, *y) : sym::mod(*x, *y);
  else return nullptr;
  GuardSet& guards = root()->out_.guards;
  return Var::symint(r, guards.value_at_hints(r));
}

// A comparison of sizes: decided for this call's sizes, and the outcome becomes a fact of the
// entry (s0 > 1, s0 <= 512), so the branch taken holds for every call the guards admit. An
// outcome no fact can state (s0 != 7) specializes the sizes instead.
VarPtr Interpreter::symint_compare(const std::string& op, const VarPtr& a, const VarPtr& b) {
  if (!a->symint().valid() && !b->symint().valid()) return nullptr;
  auto x = int_expr(a), y = int_expr(b);
  if (!x || !y) return nullptr;
  GuardSet& guards = root()->out_.guards;
  auto hint = [&](const sym::Expr& e) { return guards.value_at_hints(e); };
  const int64_t hx = hint(*x), hy = hint(*y);
  bool result;
  sym::Expr lo, hi;  // the fact: lo <= hi
  if (op == "==" || op == "!=") {
    result = (hx == hy) == (op == "==");
    if (hx == hy) {
      if (!sym::same_size(*x, *y)) unsupported("internal: an equality of sizes could not be recorded");
      return Var::constant(result ? Py_True : Py_False);
    }
    // Unequal (s0 != 1): the strict order the sizes have now is the fact, x < y or x > y.
    lo = (hx < hy ? *x : *y) + 1;
    hi = hx < hy ? *y : *x;
  } else {
    // l < r or l <= r; the outcome, or its negation, is the fact.
    const bool flip = op == ">" || op == ">=", strict = op == "<" || op == ">";
    const sym::Expr &l = flip ? *y : *x, &r = flip ? *x : *y;
    const int64_t hl = flip ? hy : hx, hr = flip ? hx : hy;
    result = strict ? hl < hr : hl <= hr;
    lo = result ? l + (strict ? 1 : 0) : r + (strict ? 0 : 1);  // l (+1) <= r, or r (+1) <= l
    hi = result ? r : l;
  }
  sym::Expr gap = hi - lo;
  if (auto c = gap.as_const()) {
    if (*c < 0) unsupported("internal: a size comparison contradicts its own hint");
  } else if (!(sym::bounds(gap).lo && *sym::bounds(gap).lo >= 0)) {
    sym::ShapeEnv* env = sym::current_shape_env();
    if (!env || !env->assume_nonnegative(gap)) a->obj(), b->obj();
  }
  return Var::constant(result ? Py_True : Py_False);
}

// Two Python numbers promote to the default float dtype, as torch's wrapped numbers do; Python
// computes in double. One operand a double 0-d tensor makes the op compute in double.
ir::Node* Interpreter::as_double(ir::Node* n) {
  ir::Attrs a;
  a.set("dtype", DType::Float64);
  return add_node("convert", {n}, a);
}

// + - * on a symbolic float and another Python number, and / by a nonzero constant: nodes on
// wrapped Float64 values, which promote as Python floats do. Python raises where such a graph
// would not (a float ** that overflows, a division by zero), so **, // and % and a division by
// a symbolic value read the values instead (specializing them).
VarPtr Interpreter::symfloat_binary(const std::string& base, const VarPtr& a, const VarPtr& b) {
  if (!a->symfloat() && !b->symfloat()) return nullptr;
  auto number = [](const VarPtr& v) {
    return v->symfloat() || v->symint().valid() || (v->is_const() && is_python_scalar(v->known()));
  };
  if (!number(a) || !number(b)) return nullptr;
  static const std::unordered_map<std::string, std::pair<const char*, binaryfunc>> ops = {
      {"ADD", {"add", PyNumber_Add}}, {"SUBTRACT", {"sub", PyNumber_Subtract}},
      {"MULTIPLY", {"mul", PyNumber_Multiply}}, {"TRUE_DIVIDE", {"div", PyNumber_TrueDivide}}};
  auto it = ops.find(base);
  if (it == ops.end()) return nullptr;
  if (base == "TRUE_DIVIDE") {
    PyObject* d = b->symfloat() || b->symint().valid() ? nullptr : b->known();
    if (!d || PyObject_IsTrue(d) != 1) return nullptr;
  }
  PyObject* hint = it->second.second(a->known(), b->known());
  if (!hint) real(nullptr);
  ir::Node* r = add_node(it->second.first, {as_double(as_node(a, "operand")), as_node(b, "operand")});
  r->meta.wrapped_number = true;  // a Python float still
  VarPtr out = Var::symfloat(r, PyFloat_AsDouble(hint));
  Py_DECREF(hint);
  return out;
}

VarPtr Interpreter::symfloat_negative(const VarPtr& a) {
  ir::Node* r = add_node("neg", {as_double(a->symfloat())});
  r->meta.wrapped_number = true;
  return Var::symfloat(r, -PyFloat_AS_DOUBLE(a->known()));
}

VarPtr Interpreter::binary(const std::string& nb, VarPtr a, VarPtr b) {
  bool inplace = nb.rfind("NB_INPLACE_", 0) == 0;
  std::string base = inplace ? nb.substr(11) : nb.substr(3);
  if (a->is_array() || b->is_array()) return array_binary(base, inplace, a, b);  // numpy.cpp
  auto set_like = [](const VarPtr& v) { return v->dict_view() && v->dict_view()->which != "values"; };
  if ((set_like(a) || set_like(b)) && !(a->dict_view() && !set_like(a)) && !(b->dict_view() && !set_like(b)) &&
      (base == "AND" || base == "OR" || base == "XOR" || base == "SUBTRACT")) {
    // d.keys() & e.keys(): a set of the keys (Python values), as the view's set operations give
    auto as_set = [&](const VarPtr& v) -> PyObject* {
      if (v->is_const() && PyAnySet_Check(v->obj())) return Py_NewRef(v->obj());
      PyObject* s = PySet_New(nullptr);
      for (const VarPtr& item : items_of(v)) {
        std::function<bool(const VarPtr&)> python_value = [&](const VarPtr& x) {
          if (x->kind() == Var::Kind::Tuple) return std::all_of(x->seq().begin(), x->seq().end(), python_value);
          return x->is_const() && !x->symint().valid() && !x->symfloat() && !structural(x);
        };
        if (!python_value(item) || PySet_Add(s, const_obj(item, "set item")) < 0) {
          Py_DECREF(s);
          return nullptr;
        }
      }
      return s;
    };
    PyObject *sa = as_set(a), *sb = sa ? as_set(b) : nullptr;
    if (sa && sb) {
      PyObject* r = base == "AND" ? PyNumber_And(sa, sb) : base == "OR" ? PyNumber_Or(sa, sb)
                  : base == "XOR" ? PyNumber_Xor(sa, sb) : PyNumber_Subtract(sa, sb);
      Py_DECREF(sa);
      Py_DECREF(sb);
      return real(r);
    }
    Py_XDECREF(sa);
    clear_error();
  }
  if (VarPtr r = object_operator(base, inplace, a, b)) return r;  // __add__ of an object made in the frame
  if (!inplace && (known_value(a) || known_value(b))) {
    // n - 1 with n a 0-d tensor capture knows the value of: computed now, known too
    static const std::unordered_map<std::string, binaryfunc> fold = {
        {"ADD", PyNumber_Add}, {"SUBTRACT", PyNumber_Subtract}, {"MULTIPLY", PyNumber_Multiply},
        {"TRUE_DIVIDE", PyNumber_TrueDivide}, {"FLOOR_DIVIDE", PyNumber_FloorDivide}, {"REMAINDER", PyNumber_Remainder}};
    auto value = [&](const VarPtr& v) -> PyObject* {
      if (PyObject* k = known_value(v)) return k;
      return v->is_const() && !v->symint().valid() && !v->symfloat() && is_python_scalar(v->known()) ? v->known() : nullptr;
    };
    auto it = fold.find(base);
    PyObject *x = value(a), *y = value(b);
    if (it != fold.end() && x && y) {
      PyObject* r = it->second(x, y);
      if (!r) clear_error();  // an error eager raises (a division by zero): the usual path gives it
      VarPtr out = r ? known_tensor(r) : nullptr;
      Py_XDECREF(r);
      if (out) return out;
    }
  }
  if (a->is_tensor() || b->is_tensor()) {
    if (inplace && a->is_tensor()) check_inplace_target(a, base);
    static const std::unordered_map<std::string, std::string> ops = {
        {"ADD", "add"}, {"SUBTRACT", "sub"}, {"MULTIPLY", "mul"}, {"TRUE_DIVIDE", "div"},
        {"FLOOR_DIVIDE", "floor_divide"}, {"REMAINDER", "remainder"}, {"POWER", "pow"}, {"MATRIX_MULTIPLY", "matmul"}};
    if (base == "AND" || base == "OR" || base == "XOR") {
      // On bool tensors (masks) the logical ops; on integers torch's bitwise kernels, extern.
      auto is_bool = [](const VarPtr& v) {
        return v->is_tensor() ? v->node()->meta.dtype == DType::Bool : v->is_const() && PyBool_Check(v->obj());
      };
      if (is_bool(a) && is_bool(b)) {
        const char* op = base == "AND" ? "logical_and" : base == "OR" ? "logical_or" : "ne";
        ir::Node* r = add_node(op, {as_node(a, "operand"), as_node(b, "operand")});
        if (inplace && a->is_tensor()) return mutate(a, r);
        return Var::tensor(r);
      }
      if (inplace) unsupported("in-place bitwise operator on integer tensors is not captured yet");
      std::string fn = base == "AND" ? "bitwise_and" : base == "OR" ? "bitwise_or" : "bitwise_xor";
      return torch_extern(resolve_torch(fn), "torch." + fn, {a, b}, {});
    }
    if (base == "LSHIFT" || base == "RSHIFT") {  // integer shifts: torch's kernels, extern
      if (inplace) unsupported("in-place shift operator on tensors is not captured yet");
      std::string fn = base == "LSHIFT" ? "bitwise_left_shift" : "bitwise_right_shift";
      return torch_extern(resolve_torch(fn), "torch." + fn, {a, b}, {});
    }
    auto it = ops.find(base);
    if (it == ops.end()) unsupported("operator " + base + " on tensors is not captured yet");
    if (a->kind() == Var::Kind::Tuple || b->kind() == Var::Kind::Tuple) unsupported("tensor operator with a tuple");
    ir::Node* r = add_node(it->second, {as_node(a, "operand"), as_node(b, "operand")});
    if (inplace && a->is_tensor()) return mutate(a, r);
    return Var::tensor(r);
  }
  // a | b on dicts with tensor values: a new dict, b's entries after (and over) a's; d |= other
  // updates a dict tracker only this frame holds.
  if (base == "OR" && (a->kind() == Var::Kind::Dict || b->kind() == Var::Kind::Dict) && is_dict(a) && (inplace || is_dict(b))) {
    if (inplace && a->kind() == Var::Kind::Dict) {
      note_mutation(a, "|=");
      dict_merge(a, b);
      return a;
    }
    for (const VarPtr& v : {a, b})
      if (v->is_const() && Py_TYPE(v->obj()) != &PyDict_Type) unsupported("| on a dict subclass");
    VarPtr r = Var::dict();
    dict_merge(r, a);
    dict_merge(r, b);
    return r;
  }
  // (-1,) + shape[1:]: a constant tuple joins a tuple of trackers item by item (materializing
  // the trackers would read symbolic sizes as Python values)
  auto as_items = [](VarPtr& v, const VarPtr& other) {
    PyObject* o = v->is_const() ? v->known() : nullptr;
    const bool tuple = o && PyTuple_CheckExact(o) && other->kind() == Var::Kind::Tuple;
    const bool list = o && PyList_CheckExact(o) && other->kind() == Var::Kind::List && !v->source;
    if (!tuple && !list) return;
    std::vector<VarPtr> items;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i) items.push_back(Var::constant(PySequence_Fast_GET_ITEM(o, i)));
    v = Var::tuple(std::move(items), list);
  };
  // t += (x,) on a tuple is t + (x,) (tuples are immutable); a list's += must stay in place.
  const bool tuple_const_a = a->is_const() && a->known() && PyTuple_CheckExact(a->known());
  if (base == "ADD" && (!inplace || tuple_const_a)) as_items(a, b), as_items(b, a);
  const bool seq_a = a->kind() == Var::Kind::Tuple || a->kind() == Var::Kind::List;
  const bool seq_b = b->kind() == Var::Kind::Tuple || b->kind() == Var::Kind::List;
  if ((seq_a || seq_b) && !(a->is_const() && b->is_const())) {
    if (base == "ADD" && inplace && a->kind() == Var::Kind::List) {  // list += any iterable: extend
      const std::vector<VarPtr> more = items_of(b);  // before the change: l += l doubles it
      note_mutation(a, "+=");
      for (const VarPtr& x : more) a->seq().push_back(x);
      return a;
    }
    if (base == "ADD" && a->kind() == b->kind()) {  // (x,) + rest, [a] + [b]
      std::vector<VarPtr> items = a->seq();
      items.insert(items.end(), b->seq().begin(), b->seq().end());
      return Var::tuple(std::move(items), a->kind() == Var::Kind::List);
    }
    if (base == "MULTIPLY" && (seq_a != seq_b)) {  // [x] * 3
      const VarPtr& seq = seq_a ? a : b;
      PyObject* n = const_obj(seq_a ? b : a, "repeat count");
      if (!PyLong_Check(n)) unsupported("sequence repeated by a non-integer");
      std::vector<VarPtr> items;
      for (long k = 0; k < PyLong_AsLong(n); ++k) items.insert(items.end(), seq->seq().begin(), seq->seq().end());
      if (inplace && seq_a && a->kind() == Var::Kind::List) {  // l *= 2: the same list, repeated in place
        note_mutation(a, "*=");
        a->seq() = std::move(items);
        return a;
      }
      return Var::tuple(std::move(items), seq->kind() == Var::Kind::List);
    }
  }
  if (VarPtr r = symint_binary(base, a, b)) return r;
  if (VarPtr r = symfloat_binary(base, a, b)) return r;
  static const std::unordered_map<std::string, binaryfunc> py = {
      {"ADD", PyNumber_Add}, {"SUBTRACT", PyNumber_Subtract}, {"MULTIPLY", PyNumber_Multiply},
      {"TRUE_DIVIDE", PyNumber_TrueDivide}, {"FLOOR_DIVIDE", PyNumber_FloorDivide}, {"REMAINDER", PyNumber_Remainder},
      {"AND", PyNumber_And}, {"OR", PyNumber_Or}, {"XOR", PyNumber_Xor}, {"LSHIFT", PyNumber_Lshift},
      {"RSHIFT", PyNumber_Rshift}, {"MATRIX_MULTIPLY", PyNumber_MatrixMultiply}};
  PyObject *x = const_obj(a, "operand"), *y = const_obj(b, "operand");
  // s |= t on a mutable object (a set, a Counter, a bytearray) changes it in place: its aliases
  // see the change. One the function made is changed as it is; a caller's would change at capture.
  const bool mutable_operand = (PyAnySet_Check(x) && !PyFrozenSet_Check(x)) || PyByteArray_Check(x) ||
                               (PyDict_Check(x) && !PyDict_CheckExact(x)) || PyList_Check(x);
  if (inplace && mutable_operand) {
    if (a->source) unsupported("in-place operator " + nb + " on a caller's " + Py_TYPE(x)->tp_name);
    static const std::unordered_map<std::string, binaryfunc> in_place = {
        {"ADD", PyNumber_InPlaceAdd}, {"SUBTRACT", PyNumber_InPlaceSubtract}, {"MULTIPLY", PyNumber_InPlaceMultiply},
        {"AND", PyNumber_InPlaceAnd}, {"OR", PyNumber_InPlaceOr}, {"XOR", PyNumber_InPlaceXor}};
    if (auto ip = in_place.find(base); ip != in_place.end()) {
      PyObject* r = ip->second(x, y);
      if (r == x) {  // the same object: the same tracker, so `a is alias` holds
        Py_DECREF(r);
        return a;
      }
      return real(r);
    }
  }
  if (base == "POWER") return real(PyNumber_Power(x, y, Py_None));
  auto it = py.find(base);
  if (it == py.end()) unsupported("operator " + nb);
  return real(it->second(x, y));
}

VarPtr Interpreter::object_operator(const std::string& base, bool inplace, const VarPtr& a, const VarPtr& b) {
  // An object made in the frame, or a caller's object guarded by its structure whose class
  // defines the operator in Python: the dunder is inlined. (Run for real at capture, a caller's
  // object's __add__ did its side effects then, and its result was a constant of the entry
  // that a later change of the object's attributes left stale.)
  auto plain = [&](const VarPtr& v) { return dunder_class(v) != nullptr; };
  if (!plain(a) && !plain(b)) return nullptr;
  static const std::unordered_map<std::string, std::string> names = {
      {"ADD", "add"}, {"SUBTRACT", "sub"}, {"MULTIPLY", "mul"}, {"TRUE_DIVIDE", "truediv"},
      {"FLOOR_DIVIDE", "floordiv"}, {"REMAINDER", "mod"}, {"POWER", "pow"}, {"MATRIX_MULTIPLY", "matmul"},
      {"AND", "and"}, {"OR", "or"}, {"XOR", "xor"}, {"LSHIFT", "lshift"}, {"RSHIFT", "rshift"}};
  auto it = names.find(base);
  if (it == names.end()) return nullptr;
  auto answered = [](const VarPtr& r) { return r && !(r->is_const() && r->known() == Py_NotImplemented); };
  auto dunder = [&](const VarPtr& self, const std::string& name, const VarPtr& other) {
    return object_dunder(self, name.c_str(), {other});
  };
  // Python's order: a.__iadd__(b) for +=, then a.__add__(b), then b.__radd__(a) (a type of its
  // own on the right goes first only for subclasses, which plain classes made here are not)
  if (plain(a)) {
    if (inplace)
      if (VarPtr r = dunder(a, "__i" + it->second + "__", b); answered(r)) return r;
    if (VarPtr r = dunder(a, "__" + it->second + "__", b); answered(r)) return r;
  }
  if (plain(b))
    if (VarPtr r = dunder(b, "__r" + it->second + "__", a); answered(r)) return r;
  unsupported("unsupported operand type(s) for " + it->second + ": TypeError");
}

VarPtr Interpreter::compare(const std::string& op, VarPtr a, VarPtr b) {
  // d.keys() and d.items() are sets to compare with (== {"a", "b"}, <=): as Python sets of the
  // values they show, where those are Python values. values() views compare by identity.
  auto as_set = [&](const VarPtr& v) -> VarPtr {
    const DictView* view = v->dict_view();
    if (!view) return v;
    if (view->which == "values") return nullptr;
    PyObject* s = PySet_New(nullptr);
    keep_.push_back(s);
    for (const VarPtr& item : v->seq()) {
      if (item->kind() == Var::Kind::Tuple && item->seq().size() == 2 && item->seq()[1]->in_graph())
        unsupported("comparing a dict's items() holding tensors");
      if (PySet_Add(s, key_obj(item, "dict view item")) < 0) real(nullptr);
    }
    return Var::constant(s);
  };
  if (a->dict_view() || b->dict_view()) {
    VarPtr sa = as_set(a), sb = as_set(b);
    if (!sa || !sb) {  // a values() view: equal only to itself
      if (op == "==" || op == "!=") return Var::constant((a.get() == b.get()) == (op == "==") ? Py_True : Py_False);
      unsupported("'" + op + "' between a dict's values() and another value: TypeError");
    }
    a = sa, b = sb;
  }
  // Tuples (lists) holding tensors compare as Python compares them: item by item until two
  // differ, identity first. (2, x) < (0, y) is decided by the ints; two different tensors in
  // the deciding place would need their values.
  if (a->kind() == b->kind() && (a->kind() == Var::Kind::Tuple || a->kind() == Var::Kind::List)) {
    const std::vector<VarPtr>&xs = a->seq(), &ys = b->seq();
    auto item_eq = [&](const VarPtr& x, const VarPtr& y) {
      if (x->is_tensor() && y->is_tensor() && x->node() == y->node()) return true;
      if (x->is_tensor() || y->is_tensor()) unsupported("comparing sequences whose deciding items are tensors");
      return truth(compare("==", x, y));
    };
    size_t i = 0;
    while (i < xs.size() && i < ys.size() && item_eq(xs[i], ys[i])) ++i;
    if (i < xs.size() && i < ys.size()) {
      if (op == "==") return Var::constant(Py_False);
      if (op == "!=") return Var::constant(Py_True);
      return compare(op, xs[i], ys[i]);
    }
    return compare(op, Var::steal_constant(PyLong_FromSize_t(xs.size())), Var::steal_constant(PyLong_FromSize_t(ys.size())));
  }
  if (a->is_array() || b->is_array()) return array_compare(op, a, b);  // numpy.cpp
  if (a->is_tensor() || b->is_tensor()) {
    static const std::unordered_map<std::string, std::string> ops = {{"<", "lt"}, {"<=", "le"}, {"==", "eq"},
                                                                     {"!=", "ne"}, {">", "gt"}, {">=", "ge"}};
    return Var::tensor(add_node(ops.at(op), {as_node(a, "operand"), as_node(b, "operand")}));
  }
  if (VarPtr r = symint_compare(op, a, b)) return r;
  if (VarPtr r = object_compare(op, a, b)) return r;
  // An object made in the frame whose class leaves equality to object (a plain class's
  // instance, a function): == and != are identity, whatever the other side is.
  auto made = [](const VarPtr& v) {
    const auto* r = v->get_if<RecordV>();
    return (r && r->plain) || v->kind() == Var::Kind::Function;
  };
  if ((op == "==" || op == "!=") && (made(a) || made(b))) {
    const bool same = a.get() == b.get();
    return Var::constant(same == (op == "==") ? Py_True : Py_False);
  }
  static const std::unordered_map<std::string, int> cmp = {{"<", Py_LT}, {"<=", Py_LE}, {"==", Py_EQ},
                                                          {"!=", Py_NE}, {">", Py_GT}, {">=", Py_GE}};
  return real(PyObject_RichCompare(const_obj(a, "operand"), const_obj(b, "operand"), cmp.at(op)));
}

// A comparison of a caller's object guarded by its structure, or of one made in the frame, whose
// class defines it in Python: the dunder inlined in Python's order (a's, then b's reflected one;
// != through __eq__ where only that is defined). Run for real, its result was a constant of the
// entry that a change of the objects' attributes left stale. nullptr: no such dunder.
VarPtr Interpreter::object_compare(const std::string& op, const VarPtr& a, const VarPtr& b) {
  static const std::unordered_map<std::string, std::pair<const char*, const char*>> names = {
      {"<", {"__lt__", "__gt__"}}, {"<=", {"__le__", "__ge__"}}, {"==", {"__eq__", "__eq__"}},
      {"!=", {"__ne__", "__ne__"}}, {">", {"__gt__", "__lt__"}}, {">=", {"__ge__", "__le__"}}};
  const auto& [own, reflected] = names.at(op);
  PyTypeObject *ta = dunder_class(a), *tb = dunder_class(b);
  auto answered = [](const VarPtr& r) { return r && !(r->is_const() && r->known() == Py_NotImplemented); };
  auto call = [&](const VarPtr& self, PyTypeObject* t, const char* name, const VarPtr& other) -> VarPtr {
    if (!t) return nullptr;
    if (python_function(t, name)) return python_dunder(self, t, name, {other});
    if (std::string(name) == "__ne__" && python_function(t, "__eq__")) {  // object.__ne__ inverts __eq__
      VarPtr eq = python_dunder(self, t, "__eq__", {other});
      if (!answered(eq)) return eq;
      return Var::constant(truth(eq) ? Py_False : Py_True);
    }
    return nullptr;
  };
  const bool any = (ta && (python_function(ta, own) || python_function(ta, "__eq__"))) ||
                   (tb && (python_function(tb, reflected) || python_function(tb, "__eq__")));
  if (!any) return nullptr;
  if (VarPtr r = call(a, ta, own, b); answered(r)) return r;
  if (VarPtr r = call(b, tb, reflected, a); answered(r)) return r;
  if (op == "==" || op == "!=") {  // identity, as object's default
    const bool same = a.get() == b.get() || (a->known() && a->known() == b->known());
    return Var::constant(same == (op == "==") ? Py_True : Py_False);
  }
  unsupported("'" + op + "' not supported between instances: TypeError");
}

VarPtr Interpreter::positive(const VarPtr& a) {
  if (a->is_array()) return array_unary("pos", a);
  if (!a->is_tensor()) return real(PyNumber_Positive(const_obj(a, "operand")));
  if (a->node()->meta.dtype == DType::Bool)
    unsupported("shape/dtype check of positive failed: NotImplementedError: The `+` operator, on a bool tensor is not supported.");
  return a;  // +x is x itself in eager too
}

bool Interpreter::truth(const VarPtr& v) {
  if (v->is_tensor()) unsupported("data-dependent branch on a tensor value");
  if (v->is_array()) unsupported("data-dependent branch on an ndarray value");
  if (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List || v->kind() == Var::Kind::Dict)
    return !(v->kind() == Var::Kind::Dict ? v->entries().values.empty() : v->seq().empty());
  if (v->kind() == Var::Kind::Function) return true;
  if (v->kind() == Var::Kind::Module) {
    // a container module's __len__ (an empty ModuleList or Sequential is false), else true
    const int r = PyObject_IsTrue(v->obj());
    if (r < 0) real(nullptr);
    return r == 1;
  }
  // An object made in the frame or a caller's: __bool__, else __len__, inlined; else true. A
  // caller's object whose class has them in C (a dict subclass) is asked for real below.
  if (PyTypeObject* t = dunder_class(v)) {
    const bool made = v->get_if<RecordV>() != nullptr;
    auto dunder = [&](const char* name) { return made ? object_dunder(v, name, {}) : python_dunder(v, t, name, {}); };
    if (VarPtr b = dunder("__bool__")) {
      if (!(b->is_const() && PyBool_Check(b->known()))) unsupported("__bool__ should return bool: TypeError");
      return b->known() == Py_True;
    }
    if (VarPtr n = dunder("__len__")) return truth(n);
    if (made) return true;
  }
  int r = PyObject_IsTrue(const_obj(v, "condition"));
  if (r < 0) real(nullptr);
  return r == 1;
}

VarPtr Interpreter::subscript(VarPtr base, VarPtr index) {
  if (base->is_array()) return array_subscript(base, index);
  if (base->kind() == Var::Kind::Tuple || base->kind() == Var::Kind::List) {
    if (index->is_const() && PyLong_Check(index->obj())) {
      Py_ssize_t i = PyLong_AsSsize_t(index->obj()), n = static_cast<Py_ssize_t>(base->seq().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) {
        PyObject* msg = PyUnicode_FromString(base->kind() == Var::Kind::List ? "list index out of range" : "tuple index out of range");
        PyObject* e = msg ? PyObject_CallOneArg(PyExc_IndexError, msg) : nullptr;
        Py_XDECREF(msg);
        if (!e) real(nullptr);
        root()->keep_.push_back(e);
        raise(e);
      }
      return base->seq()[i];
    }
    if (index->is_const() && PySlice_Check(index->obj())) {
      Py_ssize_t start, stop, step, n = static_cast<Py_ssize_t>(base->seq().size());
      if (PySlice_Unpack(index->obj(), &start, &stop, &step) < 0) real(nullptr);
      Py_ssize_t len = PySlice_AdjustIndices(n, &start, &stop, step);
      std::vector<VarPtr> items;
      for (Py_ssize_t k = 0; k < len; ++k) items.push_back(base->seq()[start + k * step]);
      return Var::tuple(std::move(items), base->kind() == Var::Kind::List);
    }
    unsupported("subscript of a container with a non-constant index");
  }
  if (base->kind() == Var::Kind::Dict) {
    PyObject* key = key_obj(index, "dict key", base);
    Py_ssize_t i = dict_find(base, key);
    if (auto* dv = base->get_if<DictV>();
        i < 0 && dv && ((dv->factory && dv->factory != Py_None) || dv->made_factory)) {
      // a defaultdict's missing key: its factory's value, stored under the key (in a caller's
      // defaultdict too, put back after the graph)
      note_mutation(base, "a missing key of a defaultdict");
      PyObject* f = dv->factory;
      VarPtr v = dv->made_factory                                  ? call(dv->made_factory, {}, {})
                 : f == reinterpret_cast<PyObject*>(&PyList_Type) ? Var::list({})  // trackers: tensors go in
                 : f == reinterpret_cast<PyObject*>(&PyDict_Type) ? Var::dict()
                                                                   : call(Var::constant(f), {}, {});
      dict_set(base, key, v);
      return v;
    }
    if (i < 0) {  // eager's KeyError (code catches it): the dict's keys are guarded
      PyObject* e = PyObject_CallOneArg(PyExc_KeyError, key);
      if (!e) real(nullptr);
      root()->keep_.push_back(e);
      raise(e);
    }
    return base->entries().values[i];
  }
  if (base->is_tensor()) return index_tensor(base, index);
  if (auto* r = base->get_if<RecordV>(); r && r->plain) {
    if (VarPtr v = object_dunder(base, "__getitem__", {index})) return v;
    unsupported(std::string("'") + reinterpret_cast<PyTypeObject*>(r->cls)->tp_name + "' object is not subscriptable: TypeError");
  }
  if (base->kind() == Var::Kind::Record) return record_subscript(base, index);
  if (base->kind() == Var::Kind::Module && index->is_const() && PyUnicode_Check(index->obj())) {
    module_children(base);  // ModuleDict["name"], ParameterDict["name"]
    return module_attr(base, PyUnicode_AsUTF8(index->obj()));
  }
  if (base->kind() == Var::Kind::Module && index->is_const() && PySlice_Check(index->obj())) {
    std::vector<std::string> names = module_keys(base);
    Py_ssize_t start, stop, step, n = static_cast<Py_ssize_t>(names.size());
    if (PySlice_Unpack(index->obj(), &start, &stop, &step) < 0) real(nullptr);
    Py_ssize_t len = PySlice_AdjustIndices(n, &start, &stop, step);
    std::vector<VarPtr> items;
    for (Py_ssize_t k = 0; k < len; ++k) items.push_back(module_attr(base, names[start + k * step].c_str()));
    VarPtr sliced = Var::tuple(std::move(items), true);
    sliced->as<ListV>().sliced_module = base;
    // Handed out (or live at a graph break), it is eager's value: the caller's module sliced
    // again, a new container of its class. A source also makes list updates on it breaks.
    if (base->source) sliced->source = Source::key_of(base->source, index->obj());
    return sliced;
  }
  if (base->kind() == Var::Kind::Module) {
    // self.layers[i] on a ModuleList/Sequential: the child module, guarded like any other.
    // (a ParameterList's items are its parameters, kept in _parameters: module_keys reads those)
    if (!index->is_const() || !PyLong_Check(index->obj())) unsupported("module indexed by a non-integer");
    const std::vector<std::string> names = module_keys(base, /*guard_children=*/false);  // the one read is guarded
    Py_ssize_t n = static_cast<Py_ssize_t>(names.size()), i = PyLong_AsSsize_t(index->obj());
    if (i < 0) i += n;
    if (i < 0 || i >= n) unsupported("module index out of range");
    return module_attr(base, names[i].c_str());
  }
  // A caller's object guarded by structure stays so where what is read of it is guarded itself:
  // its class's Python __getitem__ inlined (ModelOutput's `eo[0]`), or a dict's or list's item
  // through its source below. (Pinned by identity, every generate() call's new encoder output
  // recompiled the decoder.)
  PyObject* known = structural(base) ? base->known() : nullptr;
  const bool python_getitem = known && !PyDict_CheckExact(known) && !PyList_Check(known) && !PyTuple_Check(known) &&
                              python_function(Py_TYPE(known), "__getitem__");
  PyObject* container = known && (python_getitem || PyDict_Check(known) || PyList_Check(known)) ? known : const_obj(base, "container");
  // An object whose class defines __getitem__ in Python (a Mapping of the caller's, Hugging
  // Face's GeneralInterface): its __getitem__ inlined, so what it reads of the object is
  // guarded; called for real here, its answer would outlive a change of the object's state.
  // (Subclasses of list and tuple keep their storage in the builtin: read below, each item
  // guarded where the container has a source; a dict subclass's __getitem__ reads its storage
  // through dict.__getitem__, a call rule.)
  // A type annotation (List[torch.Tensor], Optional[int]): typing's own cached, pure answer.
  static PyObject* typing_final = object_at("typing._Final");
  if (typing_final && index->is_const() && PyObject_IsInstance(container, typing_final) == 1)
    return real(PyObject_GetItem(container, index->obj()));
  clear_error();
  if (!PyDict_CheckExact(container) && !PyList_Check(container) && !PyTuple_Check(container))
    if (VarPtr v = python_dunder(base, Py_TYPE(container), "__getitem__", {index})) return v;
  PyObject* key = const_obj(index, "index");
  // A missing key of the caller's defaultdict: __missing__ inserts into the caller's object,
  // a change that runs in Python, not at capture.
  if (base->source && PyDict_Check(container) && !PyDict_CheckExact(container) && !PySlice_Check(key)) {
    const int has = PyDict_Contains(container, key);
    if (has < 0) return real(nullptr);
    static PyObject* missing = PyUnicode_InternFromString("__missing__");
    if (has == 0 && _PyType_Lookup(Py_TYPE(container), missing))
      unsupported(std::string("a missing key of a ") + Py_TYPE(container)->tp_name + " the caller can see (__missing__)");
  }
  PyObject* v = PyObject_GetItem(container, key);
  if (!v) return real(nullptr);
  // An item of a container read from the frame (a config dict, a list) is guarded itself.
  if (base->source && (PyDict_Check(container) || PyList_Check(container)) && !PySlice_Check(key)) {
    VarPtr r = wrap(v, Source::key_of(base->source, key));
    Py_DECREF(v);
    return r;
  }
  return Var::steal_constant(v);
}

}  // namespace kiln::bind::detail
