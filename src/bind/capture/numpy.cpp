// NumPy code in a captured function (issue 15, part 5), captured as torch.compile captures it:
// arrays are graph nodes, NumPy's functions, methods and operators are spelled as torch's ops on
// them, and NumPy's dtype rules are made explicit around those ops.
//
// - An np.ndarray read from the frame is a graph input: the tensor torch.from_numpy makes of it
//   per call (same memory, so an update the graph writes back reaches the caller's array),
//   guarded by type, dtype, shape and strides, never by identity (Source::Kind::Array).
// - An array is a TensorV tracker whose form is NdArray, or NumpyScalar for what NumPy gives as
//   a scalar (np.float64: full reductions, full indexing, ufuncs of those). node() works on it;
//   is_tensor() does not, so torch code handed an array is not captured (eager raises there).
// - Calls are dispatched on the callee object: a table from each NumPy callable kiln maps to its
//   rule, built from the numpy module once capture meets NumPy (kiln never imports it). Methods
//   of arrays share the functions' rules, with the array first.
// - Dtypes follow NumPy 2 (NEP 50): arrays and NumPy scalars promote by dtype, with NumPy's
//   integer-to-float table (int32 with float32 is float64); Python numbers are weak; integer
//   inputs of float functions compute in the smallest float that holds them; sums of integers
//   are int64; means, variances and true division of integers are float64. Each operand is cast
//   to the result dtype before torch's op, so torch's own promotion never decides.
// - A graph output, or a value at a graph break, that is an array is handed out as the ndarray
//   Tensor.numpy() makes of the result (OutSpec::Kind::Array); a NumPy scalar as arr[()].
//
// - A ufunc's (and clip's) out= array takes the result in its own dtype under NumPy's
//   same_kind casting, as `a += b` does, and is the call's result.
//
// Not mapped (capture stops with the function named, as for any unknown call): np.random, FFTs
// (complex dtypes), object and string arrays, `where=` arguments, `out=` of other functions,
// data-dependent shapes (one-argument np.where, boolean-mask reads, nonzero, unique),
// ndarray.sort (in place).
#include <cmath>
#include <optional>
#include <unordered_map>

#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"
#include "bind/torch/tensor_bridge.h"

namespace kiln::bind::detail {

namespace {

// NumPy's objects kiln compares against, looked up once NumPy is imported.
struct NumpyObjects {
  PyObject* module = nullptr;
  PyObject* ndarray = nullptr;
  PyObject* generic = nullptr;     // np.generic: the base of NumPy's scalar types
  PyObject* dtype_class = nullptr; // np.dtype
  PyObject* scalar_type[kNumDTypes] = {};  // np.bool_, np.uint8, ..., np.float64 (none for bfloat16)
  PyObject* dtype_obj[kNumDTypes] = {};    // np.dtype of each
};

const NumpyObjects* numpy_objects() {
  static const NumpyObjects* objs = nullptr;
  if (objs) return objs;
  PyObject* name = PyUnicode_FromString("numpy");
  PyObject* np = name ? PyImport_GetModule(name) : nullptr;
  Py_XDECREF(name);
  if (!np) {
    clear_error();
    return nullptr;
  }
  auto* o = new NumpyObjects;  // for the life of the process
  o->module = np;
  o->ndarray = PyObject_GetAttrString(np, "ndarray");
  o->generic = PyObject_GetAttrString(np, "generic");
  o->dtype_class = PyObject_GetAttrString(np, "dtype");
  static const std::pair<DType, const char*> types[] = {
      {DType::Bool, "bool_"},     {DType::UInt8, "uint8"},     {DType::Int8, "int8"},       {DType::Int16, "int16"},
      {DType::Int32, "int32"},    {DType::Int64, "int64"},     {DType::Float16, "float16"}, {DType::Float32, "float32"},
      {DType::Float64, "float64"}};
  for (auto [dt, n] : types) {
    PyObject* t = PyObject_GetAttrString(np, n);
    o->scalar_type[static_cast<int>(dt)] = t;
    o->dtype_obj[static_cast<int>(dt)] = t && o->dtype_class ? PyObject_CallOneArg(o->dtype_class, t) : nullptr;
  }
  clear_error();
  objs = o;
  return o;
}

bool is_numpy_scalar(PyObject* v) {
  const NumpyObjects* np = numpy_objects();
  return np && np->generic && PyObject_TypeCheck(v, reinterpret_cast<PyTypeObject*>(np->generic));
}

// The kiln dtype of a NumPy scalar type (np.float32).
std::optional<DType> dtype_of_scalar_type(PyObject* t) {
  const NumpyObjects* np = numpy_objects();
  for (int i = 0; np && i < kNumDTypes; ++i)
    if (np->scalar_type[i] && np->scalar_type[i] == t) return static_cast<DType>(i);
  return std::nullopt;
}

// The category NumPy promotes Python numbers by: bool < int < float.
int category(DType d) { return d == DType::Bool ? 0 : is_floating(d) ? 2 : 1; }

// The smallest float NumPy computes an integer (or bool) type in: int8 -> float16, int16 ->
// float32, int32 and int64 -> float64. A float stays.
DType float_holding(DType d) {
  switch (d) {
    case DType::Bool:
    case DType::Int8:
    case DType::UInt8: return DType::Float16;
    case DType::Int16: return DType::Float32;
    case DType::Int32:
    case DType::Int64: return DType::Float64;
    default: return d;
  }
}

// np.promote_types for the dtypes kiln has: as torch's within a category; an integer with a
// float promotes to a float that holds the integer (int32 with float32: float64).
DType promote(DType a, DType b) {
  if (is_floating(a) == is_floating(b)) return promote_types(a, b);
  const DType f = is_floating(a) ? a : b, i = is_floating(a) ? b : a;
  return promote_types(f, float_holding(i));
}

// An operand of a NumPy operation, as NEP 50 sees it.
struct Operand {
  DType dtype;
  bool weak;  // a Python number: it takes the other operands' dtype where its category allows
};

}  // namespace

struct NumpyRules {
  using KwArgs = Interpreter::KwArgs;
  using Rule = VarPtr (*)(Interpreter& I, const char* torch_name, std::vector<VarPtr>& args, KwArgs& kwargs);
  struct Entry {
    Rule rule;
    const char* torch_name;  // the torch function it is spelled with, where one is
    bool creates = false;    // makes a new array from Python values (never run for real)
    bool from_torch = false; // a torch function given an array (nullptr from the rule otherwise)
  };

  // ---- operands ----
  static std::optional<Operand> operand(const VarPtr& v) {
    if (v->is_array()) return Operand{v->node()->meta.dtype, false};
    if (v->symint().valid()) return Operand{DType::Int64, true};
    if (!v->is_const()) return std::nullopt;
    PyObject* o = v->known();
    if (is_numpy_scalar(o)) {
      if (auto d = dtype_of_scalar_type(reinterpret_cast<PyObject*>(Py_TYPE(o)))) return Operand{*d, false};
      return std::nullopt;
    }
    if (PyBool_Check(o)) return Operand{DType::Bool, true};
    if (PyLong_Check(o)) return Operand{DType::Int64, true};
    if (PyFloat_Check(o)) return Operand{DType::Float64, true};
    return std::nullopt;
  }

  // NumPy's result dtype of operands (NEP 50); nullopt where one is not an operand kiln knows.
  static std::optional<DType> result_dtype(const std::vector<VarPtr>& vs) {
    std::optional<DType> strong;
    int weak = -1;
    for (const VarPtr& v : vs) {
      if (!v || (v->is_const() && v->known() == Py_None)) continue;
      auto op = operand(v);
      if (!op) return std::nullopt;
      if (op->weak) weak = std::max(weak, category(op->dtype));
      else strong = strong ? promote(*strong, op->dtype) : op->dtype;
    }
    if (!strong) return weak == 2 ? DType::Float64 : weak == 1 ? DType::Int64 : DType::Bool;
    DType r = *strong;
    if (weak == 2 && !is_floating(r)) r = DType::Float64;
    if (weak == 1 && r == DType::Bool) r = DType::Int64;
    return r;
  }

  static DType dtype_or_fail(const std::vector<VarPtr>& vs, const char* what) {
    auto r = result_dtype(vs);
    if (!r) unsupported(std::string("numpy ") + what + " of an operand kiln does not take");
    return *r;
  }

  // A tensor tracker of operand v in dtype `to`: an array cast, or a Python or NumPy number as a
  // 0-d constant.
  static VarPtr as_tensor(Interpreter& I, const VarPtr& v, DType to) {
    ir::Node* n;
    if (v->is_array()) {
      n = v->node();
    } else if (v->is_const() && is_numpy_scalar(v->known())) {
      PyObject* plain = PyObject_CallMethod(v->known(), "item", nullptr);
      n = I.as_node(I.real(plain), "operand");
    } else {
      n = I.as_node(v, "operand");
    }
    if (n->meta.dtype != to) {
      ir::Attrs a;
      a.set("dtype", to);
      n = I.add_node("convert", {n}, a);
    }
    return Var::tensor(n);
  }
  // The array itself as a tensor tracker (same node, same dtype).
  static VarPtr tensor_of(const VarPtr& a) { return Var::tensor(a->node()); }

  // A torch result as an array. `ufunc`: NumPy gives a 0-d result of this operation as a
  // scalar. `inputs`: a result that is one of them is copied (NumPy made a new array).
  static VarPtr as_array(Interpreter& I, const VarPtr& r, bool ufunc, std::initializer_list<VarPtr> inputs = {}) {
    if (!r->is_tensor()) unsupported("a NumPy operation whose torch spelling gives no tensor");
    ir::Node* n = r->node();
    for (const VarPtr& in : inputs)
      if (in && in->get_if<TensorV>() && in->node() == n) n = I.add_node("clone", {n});
    return Var::tensor(n, nullptr, ufunc && n->meta.dim() == 0 ? PyForm::NumpyScalar : PyForm::NdArray);
  }

  static PyObject* torch_callable(const char* path) {
    static std::unordered_map<std::string, PyObject*> cache;
    auto [it, fresh] = cache.emplace(path, nullptr);
    if (fresh) it->second = object_at(std::string("torch.") + path);
    if (!it->second) unsupported(std::string("torch.") + path + " is missing from this torch");
    return it->second;
  }
  static VarPtr call_torch(Interpreter& I, const char* path, std::vector<VarPtr> args, KwArgs kwargs = {}) {
    return I.call(Var::constant(torch_callable(path)), std::move(args), std::move(kwargs));
  }

  static VarPtr int_const(int64_t v) { return Var::steal_constant(PyLong_FromLongLong(v)); }
  static VarPtr bool_const(bool v) { return Var::constant(v ? Py_True : Py_False); }
  static VarPtr dtype_const(DType d) { return Var::constant(torch_dtype_object(d)); }
  static VarPtr ints_const(const std::vector<int64_t>& xs) {
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(xs.size()));
    for (size_t i = 0; i < xs.size(); ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(xs[i]));
    return Var::steal_constant(t);
  }

  // ---- arguments, bound to NumPy's parameter names ----
  struct Args {
    std::vector<VarPtr> v;  // per parameter; nullptr: not given
    const VarPtr& operator[](size_t i) const { return v[i]; }
    bool given(size_t i) const { return v[i] && !(v[i]->is_const() && v[i]->known() == Py_None); }
  };
  static Args bind(const char* fn, std::initializer_list<const char*> params, const std::vector<VarPtr>& args,
                   const KwArgs& kwargs) {
    std::vector<const char*> names(params);
    Args r;
    r.v.resize(names.size());
    if (args.size() > names.size()) unsupported(std::string("numpy ") + fn + "() takes fewer arguments: TypeError");
    for (size_t i = 0; i < args.size(); ++i) r.v[i] = args[i];
    for (const auto& [k, val] : kwargs) {
      size_t i = 0;
      while (i < names.size() && k != names[i]) ++i;
      if (i == names.size()) unsupported(std::string("numpy ") + fn + "(" + k + "=...) is not mapped");
      if (r.v[i]) unsupported(std::string("numpy ") + fn + "() got multiple values for " + k + ": TypeError");
      r.v[i] = val;
    }
    return r;
  }
  // Arguments kiln leaves to NumPy (out=, where=, initial=): given, capture stops.
  static void refuse(const Args& a, const char* fn, std::initializer_list<std::pair<size_t, const char*>> which) {
    for (auto [i, name] : which)
      if (i < a.v.size() && a.given(i)) {
        if (std::string(name) == "where" && a[i]->is_const() && a[i]->known() == Py_True) continue;
        unsupported(std::string("numpy ") + fn + "(" + name + "=...) is not mapped");
      }
  }
  // `res` stored into the existing array `target` (a += b; np.add(a, b, out=c)), in target's
  // dtype under NumPy's same_kind casting, every alias of the array seeing it; target is the
  // result, as NumPy returns `out` itself.
  static VarPtr store_into(Interpreter& I, const VarPtr& target, const VarPtr& res, const char* what) {
    const DType own = target->node()->meta.dtype, r = res->node()->meta.dtype;
    if ((is_floating(r) && !is_floating(own)) || (r != DType::Bool && own == DType::Bool))
      unsupported(std::string(what) + " casting its result into an array of a lower kind: UFuncTypeError");
    ir::Node* n = res->node();
    if (n->meta.sizes != target->node()->meta.sizes) {
      // NumPy broadcasts the result into the array (np.sin(np.arange(3), out=zeros((2, 3)))),
      // never the array to the result
      const auto& from = n->meta.sizes;
      const auto& to = target->node()->meta.sizes;
      bool fits = from.size() <= to.size();
      for (size_t k = 0; fits && k < from.size(); ++k) {
        const sym::Expr& f = from[from.size() - 1 - k];
        fits = sym::same_size(f, to[to.size() - 1 - k]) || sym::same_size(f, sym::Expr(1));
      }
      if (!fits) unsupported(std::string(what) + " whose result does not broadcast to the array it is stored into: ValueError");
      ir::Attrs at;
      at.set("size", ir::sizes_attr(to));
      n = I.add_node("expand", {n}, at);
    }
    if (n->meta.dtype != own) {
      ir::Attrs at;
      at.set("dtype", own);
      n = I.add_node("convert", {n}, at);
    }
    target->as<TensorV>().form = PyForm::Tensor;  // the tensor machinery updates the tracker every alias shares
    try {
      I.check_inplace_target(target, what);
      I.mutate(target, n);
    } catch (...) {
      target->as<TensorV>().form = PyForm::NdArray;
      throw;
    }
    target->as<TensorV>().form = PyForm::NdArray;
    return target;
  }
  // A ufunc's out= (an array, or a tuple of one): the result stored into it, else the result.
  static VarPtr with_out(Interpreter& I, const Args& a, size_t i_out, const VarPtr& res, const char* fn) {
    if (!a.given(i_out)) return res;
    VarPtr out = a[i_out];
    if ((out->kind() == Var::Kind::Tuple || out->kind() == Var::Kind::List) && out->seq().size() == 1) out = out->seq()[0];
    if (!out->is_array() || out->as<TensorV>().form != PyForm::NdArray)
      unsupported(std::string("numpy ") + fn + "(out=...) of a value that is not an array: TypeError");
    return store_into(I, out, res, (std::string("numpy ") + fn + "(out=...)").c_str());
  }

  static const VarPtr& array_arg(const Args& a, size_t i, const char* fn) {
    if (!a[i] || !a[i]->is_array()) unsupported(std::string("numpy ") + fn + "() of a value that is not an array");
    return a[i];
  }
  static bool bool_arg(Interpreter& I, const Args& a, size_t i, bool dflt) {
    if (!a.given(i)) return dflt;
    return I.truth(a[i]);
  }
  static int64_t int_arg(Interpreter& I, const VarPtr& v, const char* what) {
    PyObject* o = I.const_obj(v, what);
    if (!PyLong_Check(o)) unsupported(std::string("numpy: ") + what + " is not an int");
    return PyLong_AsLongLong(o);
  }
  // NumPy's dtype= argument (np.float32, np.dtype("f4"), "float32", float, ...), as np.dtype
  // reads it.
  static std::optional<DType> dtype_arg(Interpreter& I, const Args& a, size_t i) {
    if (!a.given(i)) return std::nullopt;
    const NumpyObjects* np = numpy_objects();
    PyObject* d = PyObject_CallOneArg(np->dtype_class, I.const_obj(a[i], "dtype"));
    if (!d) I.real(nullptr);
    PyObject* t = PyObject_GetAttrString(d, "type");
    Py_DECREF(d);
    auto r = t ? dtype_of_scalar_type(t) : std::nullopt;
    Py_XDECREF(t);
    if (!r) unsupported("a NumPy dtype kiln has no kernels for");
    return r;
  }
  // axis= as dims of an array of `ndim` dims, each wrapped and checked; nullopt: None (all).
  static std::optional<std::vector<int64_t>> axes_arg(Interpreter& I, const Args& a, size_t i, int64_t ndim) {
    if (!a.given(i)) return std::nullopt;
    PyObject* o = I.const_obj(a[i], "axis");
    std::vector<int64_t> out;
    auto add = [&](PyObject* x) {
      if (!PyLong_Check(x)) unsupported("numpy: axis is not an int: TypeError");
      int64_t d = PyLong_AsLongLong(x);
      if (d < -ndim || d >= std::max<int64_t>(ndim, 1) || (ndim == 0 && d != 0 && d != -1))
        unsupported("numpy: axis " + std::to_string(d) + " is out of bounds: AxisError");
      if (ndim == 0) unsupported("numpy: axis of a 0-d array: AxisError");
      out.push_back(d < 0 ? d + ndim : d);
    };
    if (PyTuple_Check(o) || PyList_Check(o)) {
      for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(o); ++k) add(PySequence_Fast_GET_ITEM(o, k));
    } else {
      add(o);
    }
    std::vector<int64_t> sorted = out;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) unsupported("numpy: repeated axis: ValueError");
    return out;
  }
  static std::vector<int64_t> all_dims(int64_t ndim) {
    std::vector<int64_t> d;
    for (int64_t k = 0; k < ndim; ++k) d.push_back(k);
    return d;
  }

  // ---- ufuncs ----
  // How an elementwise function's result dtype follows its input's.
  enum class Loop { Float, Same, Bool };
  template <Loop L>
  static VarPtr unary(Interpreter& I, const char* torch_name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(torch_name, {"x", "out", "where", "dtype"}, args, kwargs);
    refuse(a, torch_name, {{2, "where"}, {3, "dtype"}});
    const VarPtr& x = array_arg(a, 0, torch_name);
    const DType d = x->node()->meta.dtype;
    const DType to = L == Loop::Float ? float_holding(d) : d;
    return with_out(I, a, 1, as_array(I, call_torch(I, torch_name, {as_tensor(I, x, to)}), true, {x}), torch_name);
  }
  // floor, ceil, trunc, rint: integers (and bools) are already whole: a copy.
  static VarPtr rounding(Interpreter& I, const char* torch_name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(torch_name, {"x", "out", "where"}, args, kwargs);
    refuse(a, torch_name, {{1, "out"}, {2, "where"}});
    const VarPtr& x = array_arg(a, 0, torch_name);
    if (!is_floating(x->node()->meta.dtype)) return as_array(I, tensor_of(x), true, {x});
    return as_array(I, call_torch(I, torch_name, {tensor_of(x)}), true, {x});
  }
  static VarPtr absolute(Interpreter& I, const char* torch_name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("absolute", {"x", "out", "where"}, args, kwargs);
    refuse(a, "absolute", {{1, "out"}, {2, "where"}});
    const VarPtr& x = array_arg(a, 0, "absolute");
    if (x->node()->meta.dtype == DType::Bool) return as_array(I, tensor_of(x), true, {x});
    return as_array(I, Var::tensor(I.add_node("abs", {x->node()})), true, {x});
  }
  // np.round(a, decimals=0) (np.around): half to even, as torch.round
  static VarPtr round(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("round", {"a", "decimals", "out"}, args, kwargs);
    refuse(a, "round", {{2, "out"}});
    const VarPtr& x = array_arg(a, 0, "round");
    if (!is_floating(x->node()->meta.dtype)) {
      if (a.given(1) && int_arg(I, a[1], "decimals") < 0) unsupported("numpy round of integers to negative decimals");
      return as_array(I, tensor_of(x), true, {x});
    }
    KwArgs kw;
    if (a.given(1)) kw.emplace_back("decimals", a[1]);
    return as_array(I, call_torch(I, "round", {tensor_of(x)}, kw), true);
  }
  // np.float64(v), np.int32(v), ...: of Python values NumPy makes the scalar (run for real,
  // before any rule); of an array, not mapped
  static VarPtr scalar_type(Interpreter&, const char*, std::vector<VarPtr>&, KwArgs&) {
    unsupported("a NumPy scalar type called on an array");
  }
  static VarPtr square(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("square", {"x", "out", "where"}, args, kwargs);
    refuse(a, "square", {{1, "out"}, {2, "where"}});
    const VarPtr& x = array_arg(a, 0, "square");
    return as_array(I, Var::tensor(I.add_node("mul", {x->node(), x->node()})), true);
  }
  static VarPtr positive(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("positive", {"x", "out", "where"}, args, kwargs);
    refuse(a, "positive", {{1, "out"}, {2, "where"}});
    const VarPtr& x = array_arg(a, 0, "positive");
    if (x->node()->meta.dtype == DType::Bool) unsupported("numpy positive of a bool array: TypeError");
    return as_array(I, tensor_of(x), true, {x});
  }

  // How a binary function's operands are cast.
  enum class Cast { Promote, Divide, Float, None, Compare };
  template <Cast C>
  static VarPtr binary_fn(Interpreter& I, const char* torch_name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(torch_name, {"x1", "x2", "out", "where", "dtype"}, args, kwargs);
    refuse(a, torch_name, {{3, "where"}, {4, "dtype"}});
    if (!a[0] || !a[1]) unsupported(std::string("numpy ") + torch_name + "() takes two operands: TypeError");
    if (!a[0]->is_array() && !a[1]->is_array()) unsupported(std::string("numpy ") + torch_name + "() of values that are not arrays");
    DType r = dtype_or_fail({a[0], a[1]}, torch_name);
    if (C == Cast::Divide && !is_floating(r)) r = DType::Float64;
    if (C == Cast::Float) r = float_holding(r);
    VarPtr x = C == Cast::None ? (a[0]->is_array() ? tensor_of(a[0]) : as_tensor(I, a[0], r)) : as_tensor(I, a[0], r);
    VarPtr y = C == Cast::None ? (a[1]->is_array() ? tensor_of(a[1]) : as_tensor(I, a[1], r)) : as_tensor(I, a[1], r);
    return with_out(I, a, 2, as_array(I, call_torch(I, torch_name, {x, y}), true), torch_name);
  }

  // ---- reductions ----
  enum class Red { Sum, Prod, Mean, Var, Std, Max, Min, ArgMax, ArgMin, Any, All, CumSum, CumProd };
  template <Red R>
  static VarPtr reduce(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    // NumPy's parameters of each; out/where/initial are refused when given.
    Args a = R == Red::Sum || R == Red::Prod ? bind(name, {"a", "axis", "dtype", "out", "keepdims", "initial", "where"}, args, kwargs)
             : R == Red::Mean ? bind(name, {"a", "axis", "dtype", "out", "keepdims", "where"}, args, kwargs)
             : R == Red::Var || R == Red::Std
                 ? bind(name, {"a", "axis", "dtype", "out", "ddof", "keepdims", "where", "mean", "correction"}, args, kwargs)
             : R == Red::Max || R == Red::Min ? bind(name, {"a", "axis", "out", "keepdims", "initial", "where"}, args, kwargs)
             : R == Red::ArgMax || R == Red::ArgMin ? bind(name, {"a", "axis", "out", "keepdims"}, args, kwargs)
             : R == Red::Any || R == Red::All ? bind(name, {"a", "axis", "out", "keepdims", "where"}, args, kwargs)
                                                : bind(name, {"a", "axis", "dtype", "out"}, args, kwargs);
    size_t i_dtype = 99, i_out = 99, i_keep = 99, i_where = 99, i_initial = 99;
    switch (R) {
      case Red::Sum: case Red::Prod: i_dtype = 2, i_out = 3, i_keep = 4, i_initial = 5, i_where = 6; break;
      case Red::Mean: i_dtype = 2, i_out = 3, i_keep = 4, i_where = 5; break;
      case Red::Var: case Red::Std: i_dtype = 2, i_out = 3, i_keep = 5, i_where = 6; break;
      case Red::Max: case Red::Min: i_out = 2, i_keep = 3, i_initial = 4, i_where = 5; break;
      case Red::ArgMax: case Red::ArgMin: i_out = 2, i_keep = 3; break;
      case Red::Any: case Red::All: i_out = 2, i_keep = 3, i_where = 4; break;
      case Red::CumSum: case Red::CumProd: i_dtype = 2, i_out = 3; break;
    }
    refuse(a, name, {{i_out, "out"}, {i_where, "where"}, {i_initial, "initial"}});
    if ((R == Red::Var || R == Red::Std) && a.given(7)) unsupported(std::string("numpy ") + name + "(mean=...) is not mapped");
    const VarPtr& x = array_arg(a, 0, name);
    const ir::TensorMeta& m = x->node()->meta;
    const int64_t nd = m.dim();
    auto axes = axes_arg(I, a, 1, nd);
    const bool keep = i_keep < a.v.size() && bool_arg(I, a, i_keep, false);
    const auto dtype = i_dtype < a.v.size() ? dtype_arg(I, a, i_dtype) : std::nullopt;
    const DType in = m.dtype;
    auto fail = [&](const char* why) -> VarPtr { unsupported(std::string("numpy ") + name + ": " + why); };
    // The dtype NumPy accumulates and answers in.
    DType to = in;
    if (R == Red::Sum || R == Red::Prod || R == Red::CumSum || R == Red::CumProd) {
      if (in == DType::UInt8 && !dtype) return fail("a sum of uint8 is uint64, which kiln lacks");
      to = dtype ? *dtype : is_floating(in) ? in : DType::Int64;
    } else if (R == Red::Mean || R == Red::Var || R == Red::Std) {
      to = dtype ? *dtype : is_floating(in) ? in : DType::Float64;
    }
    if (axes && axes->empty() && R != Red::CumSum && R != Red::CumProd) {
      // axis=(): nothing reduced; an elementwise copy (a variance of 0 per element)
      if (R == Red::Var || R == Red::Std) return as_array(I, call_torch(I, "zeros_like", {as_tensor(I, x, to)}), true);
      if (R == Red::ArgMax || R == Red::ArgMin) return fail("argmax over axis=()");
      VarPtr t = R == Red::Any || R == Red::All ? as_tensor(I, x, DType::Bool) : as_tensor(I, x, to);
      return as_array(I, t, true, {x});
    }
    const std::vector<int64_t> dims = axes ? *axes : all_dims(nd);
    VarPtr t = as_tensor(I, x, to);
    KwArgs kw;
    auto dim_kw = [&] { kw.emplace_back("dim", ints_const(dims)); };
    VarPtr r;
    switch (R) {
      case Red::Sum:
      case Red::Mean:
      case Red::Max:
      case Red::Min:
        if (nd == 0) {
          r = t;  // a 0-d array reduces to itself
          break;
        }
        dim_kw();
        kw.emplace_back("keepdim", bool_const(keep));
        r = call_torch(I, R == Red::Sum ? "sum" : R == Red::Mean ? "mean" : R == Red::Max ? "amax" : "amin", {t}, kw);
        break;
      case Red::Prod: {
        // torch.prod takes one dim: the highest first, so the others keep their places
        std::vector<int64_t> ds = dims;
        std::sort(ds.rbegin(), ds.rend());
        r = t;
        for (int64_t d : ds) r = call_torch(I, "prod", {r}, {{"dim", int_const(d)}, {"keepdim", bool_const(keep)}});
        break;
      }
      case Red::Var:
      case Red::Std: {
        VarPtr ddof = a.given(4) ? a[4] : a.given(8) ? a[8] : int_const(0);
        if (a.given(4) && a.given(8)) return fail("ddof and correction both given: ValueError");
        if (nd == 0) {
          r = t;
          kw = {{"correction", ddof}};
        } else {
          dim_kw();
          kw.emplace_back("correction", ddof);
          kw.emplace_back("keepdim", bool_const(keep));
        }
        r = call_torch(I, R == Red::Var ? "var" : "std", {t}, kw);
        break;
      }
      case Red::ArgMax:
      case Red::ArgMin:
        if (!axes && keep) return fail("argmax(keepdims=True) over all axes");
        if (axes && axes->size() != 1) return fail("argmax over several axes: TypeError");
        if (axes) kw = {{"dim", int_const((*axes)[0])}, {"keepdim", bool_const(keep)}};
        r = call_torch(I, R == Red::ArgMax ? "argmax" : "argmin", {t}, kw);
        break;
      case Red::Any:
      case Red::All:
        if (nd == 0) {
          r = as_tensor(I, x, DType::Bool);
          break;
        }
        dim_kw();
        kw.emplace_back("keepdim", bool_const(keep));
        r = call_torch(I, R == Red::Any ? "any" : "all", {t}, kw);
        break;
      case Red::CumSum:
      case Red::CumProd: {
        int64_t d = 0;
        if (!axes) t = call_torch(I, "reshape", {t, ints_const({-1})});  // over the flattened array
        else if (axes->size() != 1) return fail("a cumulative op over several axes: TypeError");
        else d = (*axes)[0];
        r = call_torch(I, R == Red::CumSum ? "cumsum" : "cumprod", {t}, {{"dim", int_const(d)}});
        break;
      }
    }
    return as_array(I, r, true, {x});
  }

  // ---- the functions that are neither ufuncs nor reductions ----
  static VarPtr clip(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("clip", {"a", "a_min", "a_max", "out"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "clip");
    const DType r = dtype_or_fail({x, a[1], a[2]}, "clip");
    VarPtr t = as_tensor(I, x, r);
    // np.clip is minimum(maximum(a, a_min), a_max)
    if (a.given(1)) t = call_torch(I, "maximum", {t, as_tensor(I, a[1], r)});
    if (a.given(2)) t = call_torch(I, "minimum", {t, as_tensor(I, a[2], r)});
    return with_out(I, a, 3, as_array(I, t, true, {x}), "clip");
  }
  static VarPtr where(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 3 || !kwargs.empty()) unsupported("numpy where() with one argument (data-dependent shape)");
    if (!args[0]->is_array() && !args[1]->is_array() && !args[2]->is_array()) unsupported("numpy where() of no array");
    const DType r = dtype_or_fail({args[1], args[2]}, "where");
    VarPtr c = args[0]->is_array() ? as_tensor(I, args[0], DType::Bool) : as_tensor(I, args[0], DType::Bool);
    VarPtr w = call_torch(I, "where", {c, as_tensor(I, args[1], r), as_tensor(I, args[2], r)});
    if (w->is_tensor() && w->node()->meta.dtype != r) {  // two Python numbers: torch's float32, NumPy's float64
      ir::Attrs a;
      a.set("dtype", r);
      w = Var::tensor(I.add_node("convert", {w->node()}, a));
    }
    return as_array(I, w, true);
  }
  static VarPtr matmul(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(name, {"a", "b", "out"}, args, kwargs);
    refuse(a, name, {{2, "out"}});
    const VarPtr& x = array_arg(a, 0, name);
    const VarPtr& y = array_arg(a, 1, name);
    const DType r = dtype_or_fail({x, y}, name);
    if (r == DType::Bool) unsupported("numpy matrix product of bool arrays");
    const std::string n = name;
    // np.dot of a 0-d operand is a product; of two higher-rank arrays a sum over a's last and
    // b's second-to-last dims (not matmul's batching)
    if (n == "dot" && (x->node()->meta.dim() == 0 || y->node()->meta.dim() == 0))
      return as_array(I, Var::tensor(I.add_node("mul", {as_tensor(I, x, r)->node(), as_tensor(I, y, r)->node()})), true);
    if (n == "dot" && (x->node()->meta.dim() > 2 || y->node()->meta.dim() > 2)) unsupported("numpy dot of arrays of more than 2 dims");
    if (n == "outer")
      return as_array(I, call_torch(I, "outer", {call_torch(I, "reshape", {as_tensor(I, x, r), ints_const({-1})}),
                                                 call_torch(I, "reshape", {as_tensor(I, y, r), ints_const({-1})})}), true);
    return as_array(I, call_torch(I, "matmul", {as_tensor(I, x, r), as_tensor(I, y, r)}), true);
  }
  static VarPtr einsum(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (!kwargs.empty() || args.size() < 2) unsupported("numpy einsum with keywords or no operands");
    std::vector<VarPtr> ops(args.begin() + 1, args.end());
    for (const VarPtr& v : ops)
      if (!v->is_array()) unsupported("numpy einsum of a value that is not an array");
    const DType r = dtype_or_fail(ops, "einsum");
    std::vector<VarPtr> targs = {args[0]};
    for (const VarPtr& v : ops) targs.push_back(as_tensor(I, v, r));
    return as_array(I, call_torch(I, "einsum", std::move(targs)), true);
  }

  // The arrays of a sequence argument (concatenate's, stack's), as tensors of their common dtype.
  static std::vector<VarPtr> array_list(Interpreter& I, const VarPtr& seq, const char* fn, std::optional<DType> dtype) {
    if (seq->kind() != Var::Kind::Tuple && seq->kind() != Var::Kind::List) unsupported(std::string("numpy ") + fn + " of a value that is not a list of arrays");
    const std::vector<VarPtr>& items = seq->seq();
    for (const VarPtr& v : items)
      if (!v->is_array()) unsupported(std::string("numpy ") + fn + " of an item that is not an array");
    const DType r = dtype ? *dtype : dtype_or_fail(items, fn);
    std::vector<VarPtr> out;
    for (const VarPtr& v : items) out.push_back(as_tensor(I, v, r));
    return out;
  }
  static VarPtr concatenate(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(name, {"arrays", "axis", "out", "dtype", "casting"}, args, kwargs);
    refuse(a, name, {{2, "out"}, {4, "casting"}});
    std::vector<VarPtr> ts = array_list(I, a[0], name, dtype_arg(I, a, 3));
    int64_t axis = 0;
    if (a[1] && a[1]->is_const() && a[1]->known() == Py_None) {  // axis=None: the flattened arrays
      for (VarPtr& t : ts) t = call_torch(I, "reshape", {t, ints_const({-1})});
    } else if (a[1]) {
      axis = int_arg(I, a[1], "axis");
    }
    return as_array(I, call_torch(I, "cat", {Var::list(ts)}, {{"dim", int_const(axis)}}), false);
  }
  static VarPtr stack(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(name, {"arrays", "axis", "out", "dtype", "casting"}, args, kwargs);
    refuse(a, name, {{2, "out"}, {4, "casting"}});
    std::vector<VarPtr> ts = array_list(I, a[0], name, dtype_arg(I, a, 3));
    const std::string n = name;
    if (n == "vstack" || n == "hstack") {
      // vstack: rows (1-d arrays become 1×n); hstack: along axis 1, or 0 for 1-d arrays
      bool one_d = !ts.empty() && ts[0]->node()->meta.dim() == 1;
      if (n == "vstack")
        for (VarPtr& t : ts)
          if (t->node()->meta.dim() == 1) t = call_torch(I, "unsqueeze", {t, int_const(0)});
      return as_array(I, call_torch(I, "cat", {Var::list(ts)}, {{"dim", int_const(n == "hstack" && !one_d ? 1 : 0)}}), false);
    }
    return as_array(I, call_torch(I, "stack", {Var::list(ts)}, {{"dim", a[1] ? a[1] : int_const(0)}}), false);
  }

  // ---- sorting, shifting, tiling, triangles, padding, quantiles ----
  static bool is_none(const VarPtr& v) { return v && v->is_const() && v->known() == Py_None; }
  // The array flattened where axis=None (the default of `none_default`), else its dim; -1 when
  // not given and the default is the last axis.
  static std::pair<VarPtr, int64_t> axis_or_flat(Interpreter& I, const VarPtr& x, const VarPtr& axis, bool none_default,
                                                 const char* fn) {
    const int64_t nd = x->node()->meta.dim();
    if ((!axis && none_default) || is_none(axis)) return {call_torch(I, "reshape", {tensor_of(x), ints_const({-1})}), 0};
    const int64_t d = axis ? int_arg(I, axis, "axis") : -1;
    if (nd == 0 || d < -nd || d >= nd) unsupported(std::string("numpy ") + fn + ": axis out of bounds: AxisError");
    return {tensor_of(x), d < 0 ? d + nd : d};
  }
  // np.sort / np.argsort(a, axis=-1, kind=None, order=None, *, stable=None): torch's stable sort
  // (NumPy's default quicksort is not stable; its values are the same, its order of equal
  // elements' indices may differ only where NumPy's is unspecified anyway)
  static VarPtr sort(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(name, {"a", "axis", "kind", "order", "stable"}, args, kwargs);
    refuse(a, name, {{3, "order"}});
    const VarPtr& x = array_arg(a, 0, name);
    auto [t, d] = axis_or_flat(I, x, a[1], false, name);
    const bool indices = std::string(name) == "argsort";
    KwArgs kw = {{"dim", int_const(d)}, {"stable", bool_const(true)}};
    if (x->node()->meta.dtype == DType::Bool) t = as_tensor(I, t, DType::UInt8);  // no bool sort kernel
    VarPtr r = call_torch(I, indices ? "argsort" : "sort", {t}, kw);
    if (!indices) r = I.subscript(r, int_const(0));
    if (!indices && x->node()->meta.dtype == DType::Bool) r = as_tensor(I, r, DType::Bool);
    return as_array(I, r, false, {x});
  }
  // np.roll(a, shift, axis=None): torch.roll (no dims: the flattened array, reshaped back)
  static VarPtr roll(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("roll", {"a", "shift", "axis"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "roll");
    if (!a[1]) unsupported("numpy roll() without a shift: TypeError");
    std::vector<VarPtr> targs = {tensor_of(x), Var::constant(I.const_obj(a[1], "shift"))};
    if (a.given(2)) targs.push_back(Var::constant(I.const_obj(a[2], "axis")));
    return as_array(I, call_torch(I, "roll", targs), false, {x});
  }
  // np.tile(A, reps): torch.tile (an int reps is a 1-tuple)
  static VarPtr tile(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("tile", {"A", "reps"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "tile");
    if (!a[1]) unsupported("numpy tile() without reps: TypeError");
    PyObject* reps = I.const_obj(a[1], "reps");
    VarPtr r = PyLong_Check(reps) ? ints_const({PyLong_AsLongLong(reps)}) : Var::constant(reps);
    return as_array(I, call_torch(I, "tile", {tensor_of(x), r}), false, {x});
  }
  // np.diff(a, n=1, axis=-1): torch.diff (bools: not_equal, torch's logical_xor)
  static VarPtr diff(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("diff", {"a", "n", "axis", "prepend", "append"}, args, kwargs);
    refuse(a, "diff", {{3, "prepend"}, {4, "append"}});
    const VarPtr& x = array_arg(a, 0, "diff");
    const int64_t n = a.given(1) ? int_arg(I, a[1], "n") : 1;
    if (n <= 0) unsupported("numpy diff(n=" + std::to_string(n) + ") (the array itself, or ValueError)");
    auto [t, d] = axis_or_flat(I, x, a[2], false, "diff");
    return as_array(I, call_torch(I, "diff", {t}, {{"n", int_const(n)}, {"dim", int_const(d)}}), false, {x});
  }
  // np.triu / np.tril(m, k=0) of matrices (a 1-d m is broadcast to a square by NumPy: not mapped)
  static VarPtr triangle(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(name, {"m", "k"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, name);
    if (x->node()->meta.dim() < 2) unsupported(std::string("numpy ") + name + " of an array of fewer than 2 dims");
    KwArgs kw;
    if (a.given(1)) kw.emplace_back("diagonal", int_const(int_arg(I, a[1], "k")));
    return as_array(I, call_torch(I, name, {tensor_of(x)}, kw), false, {x});
  }
  // np.trace(a, offset=0, axis1=0, axis2=1, dtype=None): the diagonal's sum, in sum's dtype
  static VarPtr trace(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("trace", {"a", "offset", "axis1", "axis2", "dtype", "out"}, args, kwargs);
    refuse(a, "trace", {{5, "out"}});
    const VarPtr& x = array_arg(a, 0, "trace");
    if (x->node()->meta.dim() < 2) unsupported("numpy trace of an array of fewer than 2 dims: ValueError");
    VarPtr diag = call_torch(I, "diagonal", {tensor_of(x)},
                             {{"offset", int_const(a.given(1) ? int_arg(I, a[1], "offset") : 0)},
                              {"dim1", int_const(a.given(2) ? int_arg(I, a[2], "axis1") : 0)},
                              {"dim2", int_const(a.given(3) ? int_arg(I, a[3], "axis2") : 1)}});
    // the diagonal's sum along its last axis, with np.sum's dtype rules
    std::vector<VarPtr> sargs = {as_array(I, diag, false), int_const(-1)};
    KwArgs skw;
    if (a.given(4)) skw.emplace_back("dtype", a[4]);
    return reduce<Red::Sum>(I, "sum", sargs, skw);
  }
  // np.meshgrid(*xi, copy=True, sparse=False, indexing='xy'): torch.meshgrid's grids, copied
  // (NumPy's copy=True), as a tuple
  static VarPtr meshgrid(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    VarPtr indexing;
    for (const auto& [k, v] : kwargs) {
      if (k == "indexing") indexing = v;
      else if (k == "copy" && I.truth(v)) continue;
      else if (k == "sparse" && !I.truth(v)) continue;
      else unsupported("numpy meshgrid(" + k + "=...) is not mapped");
    }
    if (args.empty()) return Var::tuple({});
    std::vector<VarPtr> flat;
    for (const VarPtr& v : args) {  // NumPy flattens each and keeps its dtype
      if (!v->is_array()) unsupported("numpy meshgrid of a value that is not an array");
      flat.push_back(call_torch(I, "reshape", {tensor_of(v), ints_const({-1})}));
    }
    VarPtr grids = call_torch(I, "meshgrid", flat, {{"indexing", indexing ? indexing : Var::steal_constant(PyUnicode_FromString("xy"))}});
    std::vector<VarPtr> out;
    for (size_t i = 0; i < args.size(); ++i)
      out.push_back(as_array(I, call_torch(I, "clone", {I.subscript(grids, int_const(static_cast<int64_t>(i)))}), false));
    return Var::tuple(out);
  }
  // np.pad(array, pad_width, mode='constant', constant_values=0): F.pad's constant mode
  static VarPtr pad(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("pad", {"array", "pad_width", "mode", "constant_values"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "pad");
    if (a.given(2)) {
      PyObject* m = I.const_obj(a[2], "mode");
      if (!PyUnicode_Check(m) || std::string(PyUnicode_AsUTF8(m)) != "constant") unsupported("numpy pad(mode=...) other than 'constant' is not mapped");
    }
    const int64_t nd = x->node()->meta.dim();
    // pad_width: n, (n,), (before, after), ((before, after),), or one pair per dim
    PyObject* pw = I.const_obj(a[1], "pad_width");
    std::vector<std::pair<int64_t, int64_t>> pairs;
    auto as_int = [&](PyObject* o) {
      if (!PyLong_Check(o)) unsupported("numpy pad: pad_width of non-integers: TypeError");
      int64_t v = PyLong_AsLongLong(o);
      if (v < 0) unsupported("numpy pad: negative pad_width: ValueError");
      return v;
    };
    if (PyLong_Check(pw)) {
      pairs.assign(static_cast<size_t>(nd), {as_int(pw), as_int(pw)});
    } else if (PyTuple_Check(pw) || PyList_Check(pw)) {
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(pw);
      PyObject* first = n ? PySequence_Fast_GET_ITEM(pw, 0) : nullptr;
      if (first && PyLong_Check(first)) {
        if (n == 1) pairs.assign(static_cast<size_t>(nd), {as_int(first), as_int(first)});
        else if (n == 2) pairs.assign(static_cast<size_t>(nd), {as_int(first), as_int(PySequence_Fast_GET_ITEM(pw, 1))});
        else unsupported("numpy pad: a pad_width NumPy cannot broadcast: ValueError");
      } else {
        for (Py_ssize_t k = 0; k < n; ++k) {
          PyObject* p = PySequence_Fast_GET_ITEM(pw, k);
          if (!(PyTuple_Check(p) || PyList_Check(p)) || PySequence_Fast_GET_SIZE(p) != 2) unsupported("numpy pad: pad_width pairs of another form");
          pairs.emplace_back(as_int(PySequence_Fast_GET_ITEM(p, 0)), as_int(PySequence_Fast_GET_ITEM(p, 1)));
        }
        if (pairs.size() == 1) pairs.assign(static_cast<size_t>(nd), pairs[0]);
        if (static_cast<int64_t>(pairs.size()) != nd) unsupported("numpy pad: pad_width of another rank than the array: ValueError");
      }
    } else {
      unsupported("numpy pad: pad_width of another form");
    }
    std::vector<int64_t> flat;  // F.pad's order: the last dim first
    for (int64_t d = nd - 1; d >= 0; --d) flat.push_back(pairs[static_cast<size_t>(d)].first), flat.push_back(pairs[static_cast<size_t>(d)].second);
    double value = 0;
    if (a.given(3)) {
      PyObject* v = I.const_obj(a[3], "constant_values");
      if (!PyFloat_Check(v) && !PyLong_Check(v)) unsupported("numpy pad: constant_values other than one number");
      value = PyFloat_Check(v) ? PyFloat_AsDouble(v) : static_cast<double>(PyLong_AsLongLong(v));
      const DType d = x->node()->meta.dtype;
      if (!is_floating(d)) value = d == DType::Bool ? (value != 0) : std::trunc(value);  // NumPy's cast into the array
    }
    static PyObject* fpad = object_at("torch.nn.functional.pad");
    return as_array(I, I.call(Var::constant(fpad), {tensor_of(x), ints_const(flat)}, {{"value", Var::steal_constant(PyFloat_FromDouble(value))}}),
                    false, {x});
  }
  // np.quantile(a, q, axis=None, ..., keepdims=False), np.percentile (q in percent), np.median:
  // torch.quantile's linear interpolation (NumPy's default method), in float64 for integers
  static VarPtr quantile(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    const std::string n = name;
    Args a = n == "median" ? bind(name, {"a", "axis", "out", "overwrite_input", "keepdims"}, args, kwargs)
                           : bind(name, {"a", "q", "axis", "out", "overwrite_input", "method", "keepdims", "weights", "interpolation"},
                                  args, kwargs);
    const size_t i_axis = n == "median" ? 1 : 2, i_keep = n == "median" ? 4 : 6;
    refuse(a, name, {{i_axis + 1, "out"}});
    if (n != "median") {
      refuse(a, name, {{7, "weights"}, {8, "interpolation"}});
      if (a.given(5)) {
        PyObject* m = I.const_obj(a[5], "method");
        if (!PyUnicode_Check(m) || std::string(PyUnicode_AsUTF8(m)) != "linear") unsupported("numpy " + n + "(method=...) other than 'linear' is not mapped");
      }
    }
    const VarPtr& x = array_arg(a, 0, name);
    const DType in = x->node()->meta.dtype;
    if (in == DType::Bool && n != "median") unsupported("numpy " + n + " of a bool array (NumPy's subtract of bools): TypeError");
    // q: a Python number (weak) or a list of them (a float64 array, which promotes)
    VarPtr q;
    DType to = float_holding(in);
    if (to == DType::Float16) to = DType::Float64;  // NumPy's quantile of small ints: float64
    if (n == "median") {
      q = Var::steal_constant(PyFloat_FromDouble(0.5));
    } else {
      if (!a[1]) unsupported("numpy " + n + "() without q: TypeError");
      PyObject* qo = I.const_obj(a[1], "q");
      const double scale = n == "percentile" ? 100.0 : 1.0;
      if (PyFloat_Check(qo) || PyLong_Check(qo)) {
        q = Var::steal_constant(PyFloat_FromDouble(PyFloat_AsDouble(qo) / scale));
      } else if (PyList_Check(qo) || PyTuple_Check(qo)) {
        to = promote(to, DType::Float64);
        PyObject* qs = PyList_New(0);
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(qo); ++k) {
          PyObject* e = PySequence_Fast_GET_ITEM(qo, k);
          if (!PyFloat_Check(e) && !PyLong_Check(e)) unsupported("numpy " + n + ": q of other than numbers");
          PyObject* f = PyFloat_FromDouble(PyFloat_AsDouble(e) / scale);
          PyList_Append(qs, f);
          Py_DECREF(f);
        }
        q = call_torch(I, "tensor", {Var::steal_constant(qs)}, {{"dtype", dtype_const(to)}});
      } else {
        unsupported("numpy " + n + ": q of another form than numbers");
      }
      if (PyErr_Occurred()) I.real(nullptr);
    }
    VarPtr t = as_tensor(I, x, to);
    KwArgs kw = {{"keepdim", bool_const(bool_arg(I, a, i_keep, false))}};
    auto axes = axes_arg(I, a, i_axis, x->node()->meta.dim());
    if (axes && axes->size() != 1) unsupported("numpy " + n + " over several axes is not mapped");
    if (axes) kw.emplace_back("dim", int_const((*axes)[0]));
    if (!axes && kw[0].second->known() == Py_True) unsupported("numpy " + n + "(keepdims=True) of the whole array is not mapped");
    return as_array(I, call_torch(I, "quantile", {t, q}, kw), true);
  }

  // ---- repeating, splitting, stacking columns ----
  // np.repeat(a, repeats, axis=None): repeat_interleave by an int (axis None: the flattened array)
  static VarPtr repeat(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("repeat", {"a", "repeats", "axis"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "repeat");
    if (!a[1]) unsupported("numpy repeat() without repeats: TypeError");
    const int64_t n = int_arg(I, a[1], "repeats");
    if (n < 0) unsupported("numpy repeat: negative repeats: ValueError");
    auto [t, d] = axis_or_flat(I, x, a[2], true, "repeat");
    return as_array(I, call_torch(I, "repeat_interleave", {t, int_const(n)}, {{"dim", int_const(d)}}), false, {x});
  }
  // np.split / np.array_split(ary, sections or indices, axis=0): torch.tensor_split's views, a
  // list as NumPy gives (split's sections must divide the axis: NumPy's ValueError otherwise)
  static VarPtr split(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(name, {"ary", "indices_or_sections", "axis"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, name);
    if (!a[1]) unsupported(std::string("numpy ") + name + "() without sections: TypeError");
    auto [t, d] = axis_or_flat(I, x, a[2] ? a[2] : int_const(0), false, name);
    PyObject* how = I.const_obj(a[1], "indices_or_sections");
    VarPtr spec;
    if (PyLong_Check(how)) {
      const int64_t k = PyLong_AsLongLong(how);
      auto len = x->node()->meta.sizes[static_cast<size_t>(d)].as_const();
      if (k <= 0 || !len) unsupported(std::string("numpy ") + name + ": sections of another form");
      if (std::string(name) == "split" && *len % k != 0) unsupported("numpy split does not result in an equal division: ValueError");
      spec = int_const(k);
    } else if (PyList_Check(how) || PyTuple_Check(how)) {
      std::vector<int64_t> at;
      for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(how); ++i) {
        PyObject* e = PySequence_Fast_GET_ITEM(how, i);
        if (!PyLong_Check(e) || PyLong_AsLongLong(e) < 0) unsupported(std::string("numpy ") + name + ": indices other than non-negative ints");
        at.push_back(PyLong_AsLongLong(e));
      }
      spec = ints_const(at);
    } else {
      unsupported(std::string("numpy ") + name + ": sections of another form");
    }
    VarPtr parts = call_torch(I, "tensor_split", {t, spec}, {{"dim", int_const(d)}});
    std::vector<VarPtr> out;
    for (const VarPtr& v : parts->seq()) out.push_back(as_array(I, v, false));
    return Var::list(out);
  }
  // np.atleast_1d / _2d / _3d of one array: NumPy's reshapes ((N,) -> (1, N), (1, N, 1); ...)
  static VarPtr atleast(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 1 || !kwargs.empty() || !args[0]->is_array()) unsupported(std::string("numpy ") + name + " of other than one array");
    const VarPtr& x = args[0];
    const auto& sz = x->node()->meta.sizes;
    const int want = name[8] - '0';  // "atleast_2d"
    if (static_cast<int>(sz.size()) >= want) return x;  // NumPy returns the array itself
    std::vector<VarPtr> shape;
    auto dim = [&](size_t i) { return I.size_const(sz[i]); };
    if (want == 1) shape = {int_const(1)};
    else if (want == 2) shape = sz.empty() ? std::vector<VarPtr>{int_const(1), int_const(1)} : std::vector<VarPtr>{int_const(1), dim(0)};
    else if (sz.empty()) shape = {int_const(1), int_const(1), int_const(1)};
    else if (sz.size() == 1) shape = {int_const(1), dim(0), int_const(1)};
    else shape = {dim(0), dim(1), int_const(1)};
    return as_array(I, call_torch(I, "reshape", {tensor_of(x), Var::tuple(shape)}), false);
  }
  // np.column_stack(tup): 1-d arrays as columns, 2-d ones as they are, side by side
  static VarPtr column_stack(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 1 || !kwargs.empty()) unsupported("numpy column_stack() takes one sequence: TypeError");
    std::vector<VarPtr> ts = array_list(I, args[0], "column_stack", std::nullopt);
    for (VarPtr& t : ts) {
      if (t->node()->meta.dim() == 1) t = call_torch(I, "unsqueeze", {t, int_const(1)});
      else if (t->node()->meta.dim() != 2) unsupported("numpy column_stack of arrays of other than 1 or 2 dims");
    }
    return as_array(I, call_torch(I, "cat", {Var::list(ts)}, {{"dim", int_const(1)}}), false);
  }

  // ---- NaN-aware and other reductions ----
  // np.nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None): torch's (the same defaults:
  // the dtype's largest finite values); integers come back as a copy
  static VarPtr nan_to_num(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("nan_to_num", {"x", "copy", "nan", "posinf", "neginf"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "nan_to_num");
    if (a.given(1) && !I.truth(a[1])) unsupported("numpy nan_to_num(copy=False) is not mapped");
    if (!is_floating(x->node()->meta.dtype)) return as_array(I, Var::tensor(I.add_node("clone", {x->node()})), false);
    KwArgs kw;
    for (auto [i, k] : {std::pair<size_t, const char*>{2, "nan"}, {3, "posinf"}, {4, "neginf"}})
      if (a.given(i)) kw.emplace_back(k, Var::constant(I.const_obj(a[i], k)));
    return as_array(I, call_torch(I, "nan_to_num", {tensor_of(x)}, kw), false, {x});
  }
  // np.nansum / np.nanmean(a, axis=None, ..., keepdims=False): torch's, over floats; integers
  // hold no NaN: np.sum's and np.mean's rules
  template <Red R>
  static VarPtr nan_reduce(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(name, {"a", "axis", "dtype", "out", "keepdims", "initial", "where"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, name);
    if (!is_floating(x->node()->meta.dtype)) return reduce<R>(I, R == Red::Sum ? "sum" : "mean", args, kwargs);
    refuse(a, name, {{2, "dtype"}, {3, "out"}, {5, "initial"}, {6, "where"}});
    auto axes = axes_arg(I, a, 1, x->node()->meta.dim());
    KwArgs kw = {{"dim", ints_const(axes ? *axes : all_dims(x->node()->meta.dim()))}, {"keepdim", bool_const(bool_arg(I, a, 4, false))}};
    return as_array(I, call_torch(I, R == Red::Sum ? "nansum" : "nanmean", {tensor_of(x)}, kw), true, {x});
  }
  // np.count_nonzero(a, axis): int64 counts (without an axis NumPy gives a Python int: the
  // data's, not captured)
  static VarPtr count_nonzero(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("count_nonzero", {"a", "axis", "keepdims"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "count_nonzero");
    auto axes = axes_arg(I, a, 1, x->node()->meta.dim());
    if (!axes) unsupported("numpy count_nonzero without an axis gives a Python int of the data");
    if (bool_arg(I, a, 2, false)) unsupported("numpy count_nonzero(keepdims=True) is not mapped");
    return as_array(I, call_torch(I, "count_nonzero", {tensor_of(x)}, {{"dim", ints_const(*axes)}}), true);
  }
  // np.average(a, axis=None) without weights: np.mean
  static VarPtr average(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("average", {"a", "axis", "weights", "returned", "keepdims"}, args, kwargs);
    refuse(a, "average", {{2, "weights"}});
    if (a.given(3) && I.truth(a[3])) unsupported("numpy average(returned=True) is not mapped");
    std::vector<VarPtr> margs = {a[0]};
    KwArgs mkw;
    if (a.given(1)) mkw.emplace_back("axis", a[1]);
    if (a.given(4)) mkw.emplace_back("keepdims", a[4]);
    return reduce<Red::Mean>(I, "mean", margs, mkw);
  }
  // np.ptp(a, axis=None, out=None, keepdims=False): max - min, in the array's dtype
  static VarPtr ptp(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("ptp", {"a", "axis", "out", "keepdims"}, args, kwargs);
    refuse(a, "ptp", {{2, "out"}});
    const VarPtr& x = array_arg(a, 0, "ptp");
    if (x->node()->meta.dtype == DType::Bool) unsupported("numpy ptp of a bool array: TypeError");
    auto axes = axes_arg(I, a, 1, x->node()->meta.dim());
    KwArgs kw = {{"dim", ints_const(axes ? *axes : all_dims(x->node()->meta.dim()))}, {"keepdim", bool_const(bool_arg(I, a, 3, false))}};
    VarPtr hi = call_torch(I, "amax", {tensor_of(x)}, kw), lo = call_torch(I, "amin", {tensor_of(x)}, kw);
    return as_array(I, call_torch(I, "sub", {hi, lo}), true);
  }

  // ---- products and set-like tests of two arrays ----
  // np.inner, np.kron: torch's, in the operands' NumPy dtype
  static VarPtr product2(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(name, {"a", "b"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, name);
    const VarPtr& y = array_arg(a, 1, name);
    const DType r = dtype_or_fail({x, y}, name);
    if (r == DType::Bool) unsupported(std::string("numpy ") + name + " of bool arrays is not mapped");
    return as_array(I, call_torch(I, name, {as_tensor(I, x, r), as_tensor(I, y, r)}), true);
  }
  // np.cross(a, b) of 3-vectors along the last axis: torch.linalg.cross
  static VarPtr cross(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("cross", {"a", "b", "axisa", "axisb", "axisc", "axis"}, args, kwargs);
    refuse(a, "cross", {{2, "axisa"}, {3, "axisb"}, {4, "axisc"}, {5, "axis"}});
    const VarPtr& x = array_arg(a, 0, "cross");
    const VarPtr& y = array_arg(a, 1, "cross");
    for (const VarPtr* v : {&x, &y})
      if ((*v)->node()->meta.dim() == 0 || !(*v)->node()->meta.sizes.back().is_const(3))
        unsupported("numpy cross of other than 3-vectors is not mapped");
    const DType r = dtype_or_fail({x, y}, "cross");
    if (r == DType::Bool) unsupported("numpy cross of bool arrays: TypeError");
    return as_array(I, call_torch(I, "linalg.cross", {as_tensor(I, x, r), as_tensor(I, y, r)}), false);
  }
  // np.searchsorted(a, v, side='left'): a 1-d sorted array, v an array; int64 positions
  static VarPtr searchsorted(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("searchsorted", {"a", "v", "side", "sorter"}, args, kwargs);
    refuse(a, "searchsorted", {{3, "sorter"}});
    const VarPtr& s = array_arg(a, 0, "searchsorted");
    const VarPtr& v = array_arg(a, 1, "searchsorted");
    if (s->node()->meta.dim() != 1) unsupported("numpy searchsorted into an array of other than 1 dim: ValueError");
    DType r = dtype_or_fail({s, v}, "searchsorted");
    if (r == DType::Bool) r = DType::UInt8;  // False < True, as NumPy orders them; torch has no bool kernel
    KwArgs kw;
    if (a.given(2)) kw.emplace_back("side", Var::constant(I.const_obj(a[2], "side")));
    return as_array(I, call_torch(I, "searchsorted", {as_tensor(I, s, r), as_tensor(I, v, r)}, kw), true);
  }
  // np.isin(element, test_elements, assume_unique=False, invert=False): torch.isin of arrays
  static VarPtr isin(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("isin", {"element", "test_elements", "assume_unique", "invert", "kind"}, args, kwargs);
    refuse(a, "isin", {{4, "kind"}});
    const VarPtr& x = array_arg(a, 0, "isin");
    const VarPtr& y = array_arg(a, 1, "isin");
    DType r = dtype_or_fail({x, y}, "isin");
    if (r == DType::Bool) r = DType::UInt8;  // torch.isin has no bool kernel
    return as_array(I, call_torch(I, "isin", {as_tensor(I, x, r), as_tensor(I, y, r)}, {{"invert", bool_const(bool_arg(I, a, 3, false))}}), false);
  }
  // np.cov / np.corrcoef(m, rowvar=True, bias=False, ddof=None): torch's, in float64 at least
  // (NumPy computes them in result_type(m, float64))
  static VarPtr covariance(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    const bool cov = std::string(name) == "cov";
    Args a = cov ? bind(name, {"m", "y", "rowvar", "bias", "ddof", "fweights", "aweights", "dtype"}, args, kwargs)
                 : bind(name, {"x", "y", "rowvar", "bias", "ddof", "dtype"}, args, kwargs);
    refuse(a, name, {{1, "y"}});
    if (cov) refuse(a, name, {{5, "fweights"}, {6, "aweights"}, {7, "dtype"}});
    else refuse(a, name, {{3, "bias"}, {4, "ddof"}, {5, "dtype"}});
    const VarPtr& x = array_arg(a, 0, name);
    if (x->node()->meta.dim() > 2 || x->node()->meta.dim() == 0) unsupported(std::string("numpy ") + name + " of other than 1 or 2 dims");
    VarPtr t = as_tensor(I, x, promote(float_holding(x->node()->meta.dtype), DType::Float64));
    const bool one_d = x->node()->meta.dim() == 1;
    if (one_d) t = call_torch(I, "unsqueeze", {t, int_const(0)});
    else if (a.given(2) && !I.truth(a[2])) t = call_torch(I, "t", {t});
    // rows are variables, columns observations: (X - mean) (X - mean)^T / (N - ddof)
    int64_t correction = bool_arg(I, a, 3, false) ? 0 : 1;
    if (cov && a.given(4)) correction = int_arg(I, a[4], "ddof");
    auto n = t->node()->meta.sizes[1].as_const();
    if (!n) unsupported(std::string("numpy ") + name + " over a symbolic number of observations");
    VarPtr centered = call_torch(I, "sub", {t, call_torch(I, "mean", {t}, {{"dim", int_const(1)}, {"keepdim", bool_const(true)}})});
    VarPtr c = call_torch(I, "matmul", {centered, call_torch(I, "t", {centered})});
    c = call_torch(I, "div", {c, Var::steal_constant(PyFloat_FromDouble(static_cast<double>(*n - correction)))});
    if (!cov) {  // c / sqrt(d d^T), clipped to [-1, 1] as NumPy does
      VarPtr d = call_torch(I, "sqrt", {call_torch(I, "diagonal", {c})});
      c = call_torch(I, "div", {call_torch(I, "div", {c, call_torch(I, "unsqueeze", {d, int_const(1)})}),
                                call_torch(I, "unsqueeze", {d, int_const(0)})});
      c = call_torch(I, "clamp", {c, Var::steal_constant(PyFloat_FromDouble(-1.0)), Var::steal_constant(PyFloat_FromDouble(1.0))});
    }
    if (one_d) c = call_torch(I, "reshape", {c, ints_const({})});
    return as_array(I, c, false);
  }
  // np.reciprocal of floats (NumPy's integer reciprocal truncates: not mapped)
  static VarPtr reciprocal(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("reciprocal", {"x", "out", "where"}, args, kwargs);
    refuse(a, "reciprocal", {{2, "where"}});
    const VarPtr& x = array_arg(a, 0, "reciprocal");
    if (!is_floating(x->node()->meta.dtype)) unsupported("numpy reciprocal of integers (truncating) is not mapped");
    return with_out(I, a, 1, as_array(I, call_torch(I, "reciprocal", {tensor_of(x)}), true, {x}), "reciprocal");
  }
  // np.logspace(start, stop, num=50, endpoint=True, base=10.0, dtype=None): float64 by default
  static VarPtr logspace(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("logspace", {"start", "stop", "num", "endpoint", "base", "dtype", "axis"}, args, kwargs);
    if (a.given(3) && !I.truth(a[3])) unsupported("numpy logspace(endpoint=False) is not mapped");
    if (a.given(6) && int_arg(I, a[6], "axis") != 0) unsupported("numpy logspace(axis=...) is not mapped");
    const DType dt = dtype_arg(I, a, 5).value_or(DType::Float64);
    std::vector<VarPtr> targs = {Var::constant(I.const_obj(a[0], "start")), Var::constant(I.const_obj(a[1], "stop")),
                                 a.given(2) ? Var::constant(I.const_obj(a[2], "num")) : int_const(50)};
    KwArgs kw = {{"dtype", dtype_const(dt)}};
    if (a.given(4)) kw.emplace_back("base", Var::constant(I.const_obj(a[4], "base")));
    return as_array(I, call_torch(I, "logspace", targs, kw), false);
  }

  // The shape given as ints or one tuple of them (a.reshape(2, 3), np.zeros((2, 3))).
  static VarPtr shape_of(const std::vector<VarPtr>& parts) {
    if (parts.size() == 1 && (parts[0]->kind() == Var::Kind::Tuple || parts[0]->kind() == Var::Kind::List)) return Var::tuple(parts[0]->seq());
    if (parts.size() == 1 && parts[0]->is_const() && (PyTuple_Check(parts[0]->known()) || PyList_Check(parts[0]->known()))) return parts[0];
    return Var::tuple(parts);
  }
  static VarPtr reshape(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    // np.reshape(a, shape, order="C"); a.reshape(*shape) goes through the method table
    Args a = bind("reshape", {"a", "shape", "order", "newshape", "copy"}, args, kwargs);
    refuse(a, "reshape", {{4, "copy"}});
    if (a.given(2) && PyUnicode_CompareWithASCIIString(I.const_obj(a[2], "order"), "C") != 0) unsupported("numpy reshape(order!='C')");
    const VarPtr& x = array_arg(a, 0, "reshape");
    VarPtr shape = a.given(1) ? a[1] : a[3];
    if (!shape) unsupported("numpy reshape() without a shape: TypeError");
    return as_array(I, call_torch(I, "reshape", {tensor_of(x), shape_of({shape})}), false);
  }
  static VarPtr transpose(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("transpose", {"a", "axes"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "transpose");
    const int64_t nd = x->node()->meta.dim();
    std::vector<int64_t> perm;
    if (a.given(1)) {
      auto ax = axes_arg(I, a, 1, nd);
      perm = *ax;
      if (static_cast<int64_t>(perm.size()) != nd) unsupported("numpy transpose: axes don't match array: ValueError");
    } else {
      for (int64_t k = nd; k-- > 0;) perm.push_back(k);
    }
    return as_array(I, call_torch(I, "permute", {tensor_of(x), ints_const(perm)}), false);
  }
  static VarPtr swapaxes(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = std::string(name) == "swapaxes" ? bind(name, {"a", "axis1", "axis2"}, args, kwargs)
                                             : bind(name, {"a", "source", "destination"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, name);
    if (!a[1] || !a[2]) unsupported(std::string("numpy ") + name + "() takes two axes: TypeError");
    return as_array(I, call_torch(I, std::string(name) == "swapaxes" ? "transpose" : "movedim", {tensor_of(x), a[1], a[2]}), false);
  }
  static VarPtr expand_dims(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("expand_dims", {"a", "axis"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "expand_dims");
    PyObject* o = I.const_obj(a[1] ? a[1] : Var::constant(Py_None), "axis");
    std::vector<int64_t> axes;
    if (PyLong_Check(o)) axes.push_back(PyLong_AsLongLong(o));
    else if (PyTuple_Check(o) || PyList_Check(o))
      for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(o); ++k) axes.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(o, k)));
    else unsupported("numpy expand_dims without an int axis: TypeError");
    const int64_t out_nd = x->node()->meta.dim() + static_cast<int64_t>(axes.size());
    for (int64_t& d : axes) {
      if (d < -out_nd || d >= out_nd) unsupported("numpy expand_dims: axis out of bounds: AxisError");
      if (d < 0) d += out_nd;
    }
    std::sort(axes.begin(), axes.end());
    VarPtr t = tensor_of(x);
    for (int64_t d : axes) t = call_torch(I, "unsqueeze", {t, int_const(d)});
    return as_array(I, t, false);
  }
  static VarPtr squeeze(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("squeeze", {"a", "axis"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "squeeze");
    const ir::TensorMeta& m = x->node()->meta;
    std::vector<int64_t> dims;
    if (auto ax = axes_arg(I, a, 1, m.dim())) {
      for (int64_t d : *ax) {
        if (I.concrete_size(m.sizes[d]) != 1) unsupported("numpy squeeze of an axis whose size is not 1: ValueError");
        dims.push_back(d);
      }
    } else {
      for (int64_t d = 0; d < m.dim(); ++d)
        if (I.concrete_size(m.sizes[d]) == 1) dims.push_back(d);
    }
    VarPtr t = tensor_of(x);
    std::sort(dims.rbegin(), dims.rend());
    for (int64_t d : dims) t = call_torch(I, "squeeze", {t, int_const(d)});
    return as_array(I, t, false);
  }
  static VarPtr ravel(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind(name, {"a", "order"}, args, kwargs);
    if (a.given(1) && PyUnicode_CompareWithASCIIString(I.const_obj(a[1], "order"), "C") != 0) unsupported("numpy ravel(order!='C')");
    const VarPtr& x = array_arg(a, 0, name);
    VarPtr r = call_torch(I, "reshape", {tensor_of(x), ints_const({-1})});
    // flatten always copies; ravel gives a view where it can
    return as_array(I, r, false, std::string(name) == "flatten" ? std::initializer_list<VarPtr>{x} : std::initializer_list<VarPtr>{});
  }
  static VarPtr broadcast_to(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("broadcast_to", {"array", "shape", "subok"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "broadcast_to");
    if (!a[1]) unsupported("numpy broadcast_to() without a shape: TypeError");
    return as_array(I, call_torch(I, "broadcast_to", {tensor_of(x), shape_of({a[1]})}), false);
  }
  static VarPtr flip(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("flip", {"m", "axis"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "flip");
    auto axes = axes_arg(I, a, 1, x->node()->meta.dim());
    return as_array(I, call_torch(I, "flip", {tensor_of(x), ints_const(axes ? *axes : all_dims(x->node()->meta.dim()))}), false);
  }
  // np.array([[1, 2], [3, 4]]) of Python numbers: a new array per call (a torch.tensor factory in
  // the graph), its dtype the one NumPy infers (float64 for floats, int64 for ints) or is given.
  static VarPtr from_python_values(Interpreter& I, const Args& a, size_t i_dtype, const char* name) {
    if (!a[0]) unsupported(std::string("numpy ") + name + "() without a value: TypeError");
    PyObject* values = I.const_obj(a[0], "array values");  // lists of tensors stop capture here
    const NumpyObjects* np = numpy_objects();
    PyObject* asarray = PyObject_GetAttrString(np->module, "asarray");
    PyObject* kw = PyDict_New();
    if (a.given(i_dtype)) PyDict_SetItemString(kw, "dtype", I.const_obj(a[i_dtype], "dtype"));
    PyObject* t = PyTuple_Pack(1, values);
    PyObject* arr = asarray && t ? PyObject_Call(asarray, t, kw) : nullptr;  // what NumPy makes of them
    Py_XDECREF(t);
    Py_DECREF(kw);
    Py_XDECREF(asarray);
    if (!arr) I.real(nullptr);
    PyObject* dtype = PyObject_GetAttrString(arr, "dtype");
    PyObject* type = dtype ? PyObject_GetAttrString(dtype, "type") : nullptr;
    const auto dt = type ? dtype_of_scalar_type(type) : std::nullopt;
    PyObject* list = dt ? PyObject_CallMethod(arr, "tolist", nullptr) : nullptr;  // the values NumPy cast
    Py_XDECREF(type);
    Py_XDECREF(dtype);
    Py_DECREF(arr);
    if (!dt) unsupported(std::string("numpy ") + name + "() of values that make an array kiln has no kernels for");
    if (!list) I.real(nullptr);
    return as_array(I, call_torch(I, "tensor", {I.real(list)}, {{"dtype", dtype_const(*dt)}}), false);
  }
  static VarPtr copy(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    // np.copy(a), np.array(a) (copy=True), a.copy()
    Args a = bind(name, {"a", "dtype", "copy", "order", "subok", "ndmin"}, args, kwargs);
    refuse(a, name, {{3, "order"}, {5, "ndmin"}});
    if (!a[0] || !a[0]->is_array()) return from_python_values(I, a, 1, name);
    const VarPtr& x = a[0];
    const auto dt = dtype_arg(I, a, 1);
    const bool no_copy = a.given(2) && !I.truth(a[2]);
    if (no_copy && (!dt || *dt == x->node()->meta.dtype)) return x;  // np.array(a, copy=False): a itself
    VarPtr t = as_tensor(I, x, dt ? *dt : x->node()->meta.dtype);
    return as_array(I, t, false, {x});
  }
  static VarPtr asarray(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    // np.asarray(a) and np.ascontiguousarray(a): a itself where its dtype (and layout) already
    // are what is asked (the same object, as NumPy returns it), else a copy
    Args a = bind(name, {"a", "dtype", "order", "like", "copy"}, args, kwargs);
    refuse(a, name, {{3, "like"}});
    if (!a[0] || !a[0]->is_array()) return from_python_values(I, a, 1, name);
    const VarPtr& x = a[0];
    const auto dt = dtype_arg(I, a, 1);
    const bool contiguous = std::string(name) == "ascontiguousarray";
    if ((!dt || *dt == x->node()->meta.dtype) && (!contiguous || ir::is_contiguous(x->node()->meta.sizes, x->node()->meta.strides))) return x;
    VarPtr t = as_tensor(I, x, dt ? *dt : x->node()->meta.dtype);
    if (contiguous) t = I.call_tensor_method(t, "contiguous", {}, {});
    return as_array(I, t, false, {x});
  }

  // ---- arrays made from Python values ----
  static VarPtr filled(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    // np.zeros/ones/empty(shape, dtype=float64), np.full(shape, fill_value, dtype=None)
    const std::string n = name;
    Args a = n == "full" ? bind(name, {"shape", "fill_value", "dtype", "order", "like"}, args, kwargs)
                         : bind(name, {"shape", "dtype", "order", "like"}, args, kwargs);
    const size_t i_dtype = n == "full" ? 2 : 1;
    refuse(a, name, {{i_dtype + 2, "like"}});
    if (!a[0]) unsupported(std::string("numpy ") + name + "() without a shape: TypeError");
    VarPtr fill = n == "full" ? a[1] : int_const(n == "ones" ? 1 : 0);
    if (!fill) unsupported("numpy full() without a fill value: TypeError");
    std::optional<DType> dt = dtype_arg(I, a, i_dtype);
    if (!dt) dt = n == "full" ? dtype_or_fail({fill}, "full") : DType::Float64;
    if (fill->is_array()) unsupported("numpy full() with an array fill value");
    VarPtr shape = a[0]->is_const() && PyLong_Check(a[0]->known()) ? Var::tuple({a[0]}) : shape_of({a[0]});
    VarPtr value = as_plain_number(I, fill);
    return as_array(I, call_torch(I, "full", {shape, value}, {{"dtype", dtype_const(*dt)}}), false);
  }
  static VarPtr as_plain_number(Interpreter& I, const VarPtr& v) {
    if (v->is_const() && is_numpy_scalar(v->known())) return I.real(PyObject_CallMethod(v->known(), "item", nullptr));
    return v;
  }
  static VarPtr filled_like(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    const std::string n = name;
    Args a = n == "full_like" ? bind(name, {"a", "fill_value", "dtype", "order", "subok", "shape"}, args, kwargs)
                              : bind(name, {"a", "dtype", "order", "subok", "shape"}, args, kwargs);
    const size_t i_dtype = n == "full_like" ? 2 : 1;
    refuse(a, name, {{i_dtype + 3, "shape"}});
    const VarPtr& x = array_arg(a, 0, name);
    VarPtr fill = n == "full_like" ? a[1] : int_const(n == "ones_like" ? 1 : 0);
    if (!fill || fill->is_array()) unsupported("numpy full_like() without a number to fill with");
    const DType dt = dtype_arg(I, a, i_dtype).value_or(x->node()->meta.dtype);
    return as_array(I, call_torch(I, "full_like", {tensor_of(x), as_plain_number(I, fill)}, {{"dtype", dtype_const(dt)}}), false);
  }
  static VarPtr arange(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("arange", {"start", "stop", "step", "dtype", "device", "like"}, args, kwargs);
    refuse(a, "arange", {{4, "device"}, {5, "like"}});
    std::vector<VarPtr> bounds;
    for (size_t i = 0; i < 3; ++i)
      if (a.given(i)) {
        if (a[i]->is_array()) unsupported("numpy arange() with an array bound");
        bounds.push_back(as_plain_number(I, a[i]));
      }
    if (bounds.empty()) unsupported("numpy arange() without a bound: TypeError");
    const DType dt = dtype_arg(I, a, 3).value_or(dtype_or_fail(bounds, "arange"));
    return as_array(I, call_torch(I, "arange", bounds, {{"dtype", dtype_const(dt)}}), false);
  }
  static VarPtr linspace(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("linspace", {"start", "stop", "num", "endpoint", "retstep", "dtype", "axis"}, args, kwargs);
    if (a.given(3) && !I.truth(a[3])) unsupported("numpy linspace(endpoint=False) is not mapped");
    if (a.given(4) && I.truth(a[4])) unsupported("numpy linspace(retstep=True) is not mapped");
    if (a.given(6) && int_arg(I, a[6], "axis") != 0) unsupported("numpy linspace(axis=...) is not mapped");
    if (!a[0] || !a[1] || a[0]->is_array() || a[1]->is_array()) unsupported("numpy linspace() of arrays");
    const DType dt = dtype_arg(I, a, 5).value_or(DType::Float64);
    if (!is_floating(dt)) unsupported("numpy linspace() of an integer dtype (NumPy floors the float values)");
    return as_array(I, call_torch(I, "linspace", {as_plain_number(I, a[0]), as_plain_number(I, a[1]), a[2] ? a[2] : int_const(50)},
                                  {{"dtype", dtype_const(dt)}}),
                    false);
  }
  static VarPtr eye(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("eye", {"N", "M", "k", "dtype", "order", "device", "like"}, args, kwargs);
    refuse(a, "eye", {{5, "device"}, {6, "like"}});
    if (a.given(2) && int_arg(I, a[2], "k") != 0) unsupported("numpy eye(k=...) is not mapped");
    if (!a[0]) unsupported("numpy eye() without N: TypeError");
    const DType dt = dtype_arg(I, a, 3).value_or(DType::Float64);
    std::vector<VarPtr> dims = {a[0]};
    if (a.given(1)) dims.push_back(a[1]);
    return as_array(I, call_torch(I, "eye", dims, {{"dtype", dtype_const(dt)}}), false);
  }

  // ---- numpy.linalg ----
  static VarPtr norm(Interpreter& I, const char*, std::vector<VarPtr>& args, KwArgs& kwargs) {
    Args a = bind("norm", {"x", "ord", "axis", "keepdims"}, args, kwargs);
    const VarPtr& x = array_arg(a, 0, "linalg.norm");
    const DType to = is_floating(x->node()->meta.dtype) ? x->node()->meta.dtype : DType::Float64;
    auto axes = axes_arg(I, a, 2, x->node()->meta.dim());
    if (a.given(1) && (!axes || axes->size() != 1)) unsupported("numpy linalg.norm(ord=...) of a matrix is not mapped");
    // ord=None: the 2-norm of the vectors along axis, or the Frobenius norm of the matrices
    // (the 2-norm of their elements): a vector norm either way
    KwArgs kw = {{"keepdim", bool_const(bool_arg(I, a, 3, false))}};
    if (axes) kw.emplace_back("dim", ints_const(*axes));
    std::vector<VarPtr> targs = {as_tensor(I, x, to)};
    if (a.given(1)) targs.push_back(a[1]);
    return as_array(I, call_torch(I, "linalg.vector_norm", targs, kw), true);
  }
  static VarPtr linalg(Interpreter& I, const char* torch_name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (!kwargs.empty()) unsupported(std::string("numpy ") + torch_name + " with keywords is not mapped");
    std::vector<VarPtr> targs;
    for (const VarPtr& v : args) {
      if (!v->is_array()) unsupported(std::string("numpy ") + torch_name + " of a value that is not an array");
      const DType d = v->node()->meta.dtype;
      targs.push_back(as_tensor(I, v, is_floating(d) ? d : DType::Float64));
    }
    return as_array(I, call_torch(I, torch_name, targs), true);
  }

  // ---- the boundary with torch ----
  // torch.from_numpy(a) and torch.as_tensor(a): a tensor over the array's memory (a view, so an
  // update through either is one the other sees, as in eager); torch.tensor(a): a copy.
  static VarPtr from_numpy(Interpreter& I, const char* name, std::vector<VarPtr>& args, KwArgs& kwargs) {
    if (args.size() != 1 || !kwargs.empty() || !args[0]->is_array()) return nullptr;
    ir::Node* n = I.add_node(std::string(name) == "tensor" ? "clone" : "alias", {args[0]->node()});
    return Var::tensor(n);
  }

  static const std::unordered_map<PyObject*, Entry>& table() {
    static const std::unordered_map<PyObject*, Entry> t = [] {
      std::unordered_map<PyObject*, Entry> m;
      const NumpyObjects* np = numpy_objects();
      auto add = [&](PyObject* owner, const char* attr, Rule r, const char* torch_name, bool creates = false,
                     bool from_torch = false) {
        PyObject* f = owner ? PyObject_GetAttrString(owner, attr) : nullptr;
        if (f) m.emplace(f, Entry{r, torch_name, creates, from_torch});  // kept: the table lives as long as the process
        clear_error();
      };
      PyObject* mod = np->module;
      for (auto [n, t] : std::initializer_list<std::pair<const char*, const char*>>{
               {"exp", "exp"}, {"exp2", "exp2"}, {"expm1", "expm1"}, {"log", "log"}, {"log2", "log2"}, {"log10", "log10"},
               {"log1p", "log1p"}, {"sqrt", "sqrt"}, {"sin", "sin"}, {"cos", "cos"}, {"tan", "tan"}, {"arcsin", "asin"},
               {"arccos", "acos"}, {"arctan", "atan"}, {"sinh", "sinh"}, {"cosh", "cosh"}, {"tanh", "tanh"},
               {"arcsinh", "asinh"}, {"arccosh", "acosh"}, {"arctanh", "atanh"}, {"deg2rad", "deg2rad"},
               {"rad2deg", "rad2deg"}, {"radians", "deg2rad"}, {"degrees", "rad2deg"}})
        add(mod, n, unary<Loop::Float>, t);
      for (auto [n, t] : std::initializer_list<std::pair<const char*, const char*>>{{"negative", "neg"}, {"sign", "sign"}})
        add(mod, n, unary<Loop::Same>, t);
      for (auto [n, t] : std::initializer_list<std::pair<const char*, const char*>>{
               {"isnan", "isnan"}, {"isinf", "isinf"}, {"isfinite", "isfinite"}, {"logical_not", "logical_not"}, {"signbit", "signbit"}})
        add(mod, n, unary<Loop::Bool>, t);
      for (auto [n, t] : std::initializer_list<std::pair<const char*, const char*>>{{"floor", "floor"}, {"ceil", "ceil"}, {"trunc", "trunc"},
                                                                                    {"rint", "round"}, {"fix", "trunc"}})
        add(mod, n, rounding, t);
      add(mod, "round", round, "round");
      add(mod, "around", round, "round");
      for (int k = 0; k < kNumDTypes; ++k)
        if (np->scalar_type[k]) m.emplace(Py_NewRef(np->scalar_type[k]), Entry{scalar_type, "scalar"});
      add(mod, "abs", absolute, "abs");
      add(mod, "absolute", absolute, "abs");
      add(mod, "square", square, "square");
      add(mod, "positive", positive, "positive");
      for (auto [n, t] : std::initializer_list<std::pair<const char*, const char*>>{
               {"add", "add"}, {"subtract", "sub"}, {"multiply", "mul"}, {"power", "pow"}, {"maximum", "maximum"},
               {"minimum", "minimum"}, {"fmax", "fmax"}, {"fmin", "fmin"}, {"floor_divide", "floor_divide"},
               {"remainder", "remainder"}, {"mod", "remainder"}, {"fmod", "fmod"}, {"bitwise_and", "bitwise_and"},
               {"bitwise_or", "bitwise_or"}, {"bitwise_xor", "bitwise_xor"}})
        add(mod, n, binary_fn<Cast::Promote>, t);
      add(mod, "true_divide", binary_fn<Cast::Divide>, "div");
      add(mod, "divide", binary_fn<Cast::Divide>, "div");
      for (auto [n, t] : std::initializer_list<std::pair<const char*, const char*>>{
               {"arctan2", "atan2"}, {"hypot", "hypot"}, {"logaddexp", "logaddexp"}, {"copysign", "copysign"}})
        add(mod, n, binary_fn<Cast::Float>, t);
      for (auto [n, t] : std::initializer_list<std::pair<const char*, const char*>>{
               {"logical_and", "logical_and"}, {"logical_or", "logical_or"}, {"logical_xor", "logical_xor"}})
        add(mod, n, binary_fn<Cast::None>, t);
      for (auto [n, t] : std::initializer_list<std::pair<const char*, const char*>>{
               {"equal", "eq"}, {"not_equal", "ne"}, {"less", "lt"}, {"less_equal", "le"}, {"greater", "gt"},
               {"greater_equal", "ge"}, {"isclose", "isclose"}})
        add(mod, n, binary_fn<Cast::Compare>, t);
      add(mod, "sum", reduce<Red::Sum>, "sum");
      add(mod, "prod", reduce<Red::Prod>, "prod");
      add(mod, "mean", reduce<Red::Mean>, "mean");
      add(mod, "var", reduce<Red::Var>, "var");
      add(mod, "std", reduce<Red::Std>, "std");
      for (const char* n : {"max", "amax"}) add(mod, n, reduce<Red::Max>, "max");
      for (const char* n : {"min", "amin"}) add(mod, n, reduce<Red::Min>, "min");
      add(mod, "argmax", reduce<Red::ArgMax>, "argmax");
      add(mod, "argmin", reduce<Red::ArgMin>, "argmin");
      add(mod, "any", reduce<Red::Any>, "any");
      add(mod, "all", reduce<Red::All>, "all");
      add(mod, "cumsum", reduce<Red::CumSum>, "cumsum");
      add(mod, "cumprod", reduce<Red::CumProd>, "cumprod");
      add(mod, "clip", clip, "clip");
      add(mod, "where", where, "where");
      add(mod, "dot", matmul, "dot");
      add(mod, "matmul", matmul, "matmul");
      add(mod, "outer", matmul, "outer");
      add(mod, "einsum", einsum, "einsum");
      add(mod, "concatenate", concatenate, "concatenate");
      add(mod, "concat", concatenate, "concat");
      add(mod, "stack", stack, "stack");
      add(mod, "vstack", stack, "vstack");
      add(mod, "hstack", stack, "hstack");
      add(mod, "reshape", reshape, "reshape");
      add(mod, "transpose", transpose, "transpose");
      add(mod, "swapaxes", swapaxes, "swapaxes");
      add(mod, "moveaxis", swapaxes, "moveaxis");
      add(mod, "expand_dims", expand_dims, "expand_dims");
      add(mod, "squeeze", squeeze, "squeeze");
      add(mod, "ravel", ravel, "ravel");
      add(mod, "broadcast_to", broadcast_to, "broadcast_to");
      add(mod, "flip", flip, "flip");
      add(mod, "sort", sort, "sort");
      add(mod, "argsort", sort, "argsort");
      add(mod, "roll", roll, "roll");
      add(mod, "tile", tile, "tile");
      add(mod, "diff", diff, "diff");
      add(mod, "triu", triangle, "triu");
      add(mod, "tril", triangle, "tril");
      add(mod, "trace", trace, "trace");
      add(mod, "meshgrid", meshgrid, "meshgrid");
      add(mod, "pad", pad, "pad");
      add(mod, "median", quantile, "median");
      add(mod, "quantile", quantile, "quantile");
      add(mod, "percentile", quantile, "percentile");
      add(mod, "repeat", repeat, "repeat");
      add(mod, "split", split, "split");
      add(mod, "array_split", split, "array_split");
      for (const char* n : {"atleast_1d", "atleast_2d", "atleast_3d"}) add(mod, n, atleast, n);
      add(mod, "column_stack", column_stack, "column_stack");
      add(mod, "nan_to_num", nan_to_num, "nan_to_num");
      add(mod, "nansum", nan_reduce<Red::Sum>, "nansum");
      add(mod, "nanmean", nan_reduce<Red::Mean>, "nanmean");
      add(mod, "count_nonzero", count_nonzero, "count_nonzero");
      add(mod, "average", average, "average");
      add(mod, "ptp", ptp, "ptp");
      add(mod, "inner", product2, "inner");
      add(mod, "kron", product2, "kron");
      add(mod, "cross", cross, "cross");
      add(mod, "searchsorted", searchsorted, "searchsorted");
      add(mod, "isin", isin, "isin");
      add(mod, "cov", covariance, "cov");
      add(mod, "corrcoef", covariance, "corrcoef");
      add(mod, "reciprocal", reciprocal, "reciprocal");
      add(mod, "heaviside", binary_fn<Cast::Float>, "heaviside");
      add(mod, "logspace", logspace, "logspace", true);
      add(mod, "copy", copy, "copy", true);
      add(mod, "array", copy, "array", true);
      add(mod, "asarray", asarray, "asarray", true);
      add(mod, "ascontiguousarray", asarray, "ascontiguousarray", true);
      for (const char* n : {"zeros", "ones", "full"}) add(mod, n, filled, n, true);
      add(mod, "empty", filled, "zeros", true);  // any values will do; zeros are reproducible
      for (const char* n : {"zeros_like", "ones_like", "full_like"}) add(mod, n, filled_like, n, true);
      add(mod, "empty_like", filled_like, "zeros_like", true);
      add(mod, "arange", arange, "arange", true);
      add(mod, "linspace", linspace, "linspace", true);
      add(mod, "eye", eye, "eye", true);
      PyObject* la = PyObject_GetAttrString(mod, "linalg");
      clear_error();
      add(la, "norm", norm, "linalg.norm");
      add(la, "inv", linalg, "linalg.inv");
      add(la, "det", linalg, "linalg.det");
      add(la, "solve", linalg, "linalg.solve");
      Py_XDECREF(la);
      PyObject* torch = PyImport_ImportModule("torch");
      add(torch, "from_numpy", from_numpy, "from_numpy", false, true);
      add(torch, "as_tensor", from_numpy, "as_tensor", false, true);
      add(torch, "tensor", from_numpy, "tensor", false, true);
      Py_XDECREF(torch);
      return m;
    }();
    return t;
  }

  // ndarray methods: the functions' rules with the array first, where the signatures agree.
  static const std::unordered_map<std::string, Entry>& methods() {
    static const std::unordered_map<std::string, Entry> t = {
        {"sum", {reduce<Red::Sum>, "sum"}},          {"prod", {reduce<Red::Prod>, "prod"}},
        {"mean", {reduce<Red::Mean>, "mean"}},       {"var", {reduce<Red::Var>, "var"}},
        {"std", {reduce<Red::Std>, "std"}},          {"max", {reduce<Red::Max>, "max"}},
        {"min", {reduce<Red::Min>, "min"}},          {"argmax", {reduce<Red::ArgMax>, "argmax"}},
        {"argmin", {reduce<Red::ArgMin>, "argmin"}}, {"any", {reduce<Red::Any>, "any"}},
        {"all", {reduce<Red::All>, "all"}},          {"cumsum", {reduce<Red::CumSum>, "cumsum"}},
        {"cumprod", {reduce<Red::CumProd>, "cumprod"}}, {"clip", {clip, "clip"}},
        {"dot", {matmul, "dot"}},                    {"swapaxes", {swapaxes, "swapaxes"}},
        {"ravel", {ravel, "ravel"}},                 {"flatten", {ravel, "flatten"}},
        {"squeeze", {squeeze, "squeeze"}},           {"copy", {copy, "copy"}},
        {"argsort", {sort, "argsort"}},              {"trace", {trace, "trace"}},
        {"repeat", {repeat, "repeat"}},
    };
    return t;
  }
};

// ---- the Interpreter's entry points ----

VarPtr Interpreter::wrap_numpy(PyObject* v, SourcePtr src) {
  if (is_ndarray(v)) {
    // A graph input read per call as torch.from_numpy(v): guarded by the array's type, then
    // like any tensor (dtype, shape, strides).
    out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
    PyObject* t = tensor_from_ndarray(v);
    if (!t) unsupported("input " + src->str() + ": an ndarray torch.from_numpy does not take (dtype, byte order or strides)");
    VarPtr r = wrap(t, Source::array(src));
    Py_DECREF(t);
    if (!r->get_if<TensorV>()) unsupported("input " + src->str() + ": an ndarray kiln cannot take");
    r->as<TensorV>().form = PyForm::NdArray;
    return r;
  }
  if (is_numpy_scalar(v) && dtype_of_scalar_type(reinterpret_cast<PyObject*>(Py_TYPE(v)))) {
    out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
    out_.guards.add_equals(src, v);
    return Var::constant(v, src);
  }
  return nullptr;
}

PyObject* Interpreter::array_type(const VarPtr& a) {
  const NumpyObjects* np = numpy_objects();
  if (a->as<TensorV>().form == PyForm::NdArray) return np->ndarray;
  return np->scalar_type[static_cast<int>(a->node()->meta.dtype)];
}

VarPtr Interpreter::array_attr(const VarPtr& a, const std::string& name) {
  const ir::TensorMeta& m = a->node()->meta;
  const NumpyObjects* np = numpy_objects();
  if (name == "shape") {  // a plain tuple (a tensor's is a torch.Size)
    VarPtr sh = shape_tuple(m);
    return sh->is_const() ? real(PySequence_Tuple(sh->known())) : sh;
  }
  if (name == "ndim") return Var::steal_constant(PyLong_FromLongLong(m.dim()));
  if (name == "size") return size_const(m.numel());
  if (name == "dtype") return Var::constant(np->dtype_obj[static_cast<int>(m.dtype)]);
  if (name == "itemsize") return Var::steal_constant(PyLong_FromLong(dtype_size(m.dtype)));
  if (name == "nbytes") return size_const(m.numel() * sym::Expr(dtype_size(m.dtype)));
  if (name == "T") {
    std::vector<int64_t> perm;
    for (int64_t k = m.dim(); k-- > 0;) perm.push_back(k);
    return NumpyRules::as_array(*this, NumpyRules::call_torch(*this, "permute", {NumpyRules::tensor_of(a), NumpyRules::ints_const(perm)}), false);
  }
  if (name == "__class__") return Var::constant(array_type(a));
  if (NumpyRules::methods().count(name) || name == "reshape" || name == "transpose" || name == "astype" || name == "round" ||
      name == "fill" || name == "item" || name == "tolist")
    return Var::method(a, name);
  unsupported("ndarray." + name + " is not mapped");
}

VarPtr Interpreter::call_array_method(const VarPtr& a, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs) {
  using R = NumpyRules;
  if (name == "item" || name == "tolist") unsupported("ndarray." + name + "() depends on the array's data");
  if (name == "reshape" || name == "transpose") {
    // a.reshape(2, 3) / a.reshape((2, 3)); a.transpose(1, 0) / a.transpose((1, 0)) / a.transpose()
    KwArgs kw = kwargs;
    for (auto& [k, v] : kw)
      if (k != "order" && k != "shape" && k != "copy") unsupported("ndarray." + name + "(" + k + "=...) is not mapped");
    std::vector<VarPtr> full = {a};
    if (!args.empty()) full.push_back(R::shape_of(args));
    return name == "reshape" ? R::reshape(*this, "reshape", full, kw) : R::transpose(*this, "transpose", full, kw);
  }
  if (name == "astype") {
    // a.astype(dtype, order, casting, subok, copy=True): a copy unless copy=False and no cast
    R::Args b = R::bind("astype", {"dtype", "order", "casting", "subok", "copy"}, args, kwargs);
    R::refuse(b, "astype", {{1, "order"}, {2, "casting"}});
    auto dt = R::dtype_arg(*this, b, 0);
    if (!dt) unsupported("ndarray.astype() without a dtype: TypeError");
    if (*dt == a->node()->meta.dtype && b.given(4) && !truth(b[4])) return a;
    return R::as_array(*this, R::as_tensor(*this, a, *dt), false, {a});
  }
  if (name == "round") {
    args.insert(args.begin(), a);
    KwArgs kw = kwargs;
    return R::round(*this, "round", args, kw);
  }
  if (name == "fill") {
    // a.fill(v): every element v, in place
    if (args.size() != 1 || !kwargs.empty()) unsupported("ndarray.fill() takes one value: TypeError");
    if (a->as<TensorV>().form != PyForm::NdArray) unsupported("fill() of a NumPy scalar: AttributeError");
    VarPtr all = Var::constant(Py_Ellipsis);
    array_store_subscript(a, all, args[0]);
    return Var::constant(Py_None);
  }
  auto it = R::methods().find(name);
  if (it == R::methods().end()) unsupported("ndarray." + name + "() is not mapped");
  args.insert(args.begin(), a);
  KwArgs kw = kwargs;
  VarPtr r = it->second.rule(*this, it->second.torch_name, args, kw);
  if (!r) unsupported("ndarray." + name + "() with these arguments is not mapped");
  return r;
}

VarPtr Interpreter::numpy_call(const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs) {
  if (!numpy_objects()) return nullptr;
  const auto& t = NumpyRules::table();
  auto it = t.find(fn->known());
  if (it == t.end()) return nullptr;
  const NumpyRules::Entry& e = it->second;
  std::function<bool(const VarPtr&)> holds_array = [&](const VarPtr& v) {
    if (v->is_array() || v->is_tensor()) return true;
    if (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List)
      return std::any_of(v->seq().begin(), v->seq().end(), holds_array);
    return false;
  };
  const bool any_array = std::any_of(args.begin(), args.end(), holds_array) ||
                         std::any_of(kwargs.begin(), kwargs.end(), [&](const auto& kv) { return holds_array(kv.second); });
  if (e.from_torch) return e.rule(*this, e.torch_name, args, kwargs);
  if (!any_array && !e.creates) {
    // NumPy on Python values alone (np.sqrt(2.0), np.float32(x) arithmetic): run for real, as
    // every call would; an array made so would be one object shared by every call: refused.
    PyObject* r = call_for_real(fn->known(), args, kwargs, "numpy argument");
    if (r && is_ndarray(r)) {
      Py_DECREF(r);
      unsupported("numpy " + callable_name(fn->known()) + " of Python values makes an array: not captured");
    }
    return real(r);
  }
  VarPtr r = e.rule(*this, e.torch_name, args, kwargs);
  return r;
}

VarPtr Interpreter::array_binary(const std::string& base, bool inplace, const VarPtr& a, const VarPtr& b) {
  using R = NumpyRules;
  if ((a->is_tensor() || b->is_tensor()))
    unsupported("an operator between an ndarray and a tensor (NumPy converts the tensor): not captured");
  static const std::unordered_map<std::string, const char*> named = {
      {"ADD", "add"}, {"SUBTRACT", "sub"}, {"MULTIPLY", "mul"}, {"TRUE_DIVIDE", "div"}, {"FLOOR_DIVIDE", "floor_divide"},
      {"REMAINDER", "remainder"}, {"POWER", "pow"}, {"MATRIX_MULTIPLY", "matmul"}, {"AND", "bitwise_and"},
      {"OR", "bitwise_or"}, {"XOR", "bitwise_xor"}, {"LSHIFT", "bitwise_left_shift"}, {"RSHIFT", "bitwise_right_shift"}};
  auto it = named.find(base);
  if (it == named.end()) unsupported("operator " + base + " on arrays is not mapped");
  auto dt = R::result_dtype({a, b});
  if (!dt) unsupported("operator " + base + " between an array and a value kiln does not take");
  DType r = *dt;
  if (base == "TRUE_DIVIDE" && !is_floating(r)) r = DType::Float64;
  if ((base == "AND" || base == "OR" || base == "XOR" || base == "LSHIFT" || base == "RSHIFT") && is_floating(r))
    unsupported("bitwise operator on float arrays: TypeError");
  if (base == "MATRIX_MULTIPLY" && (!a->is_array() || !b->is_array())) unsupported("@ with a scalar: ValueError");
  VarPtr x = R::as_tensor(*this, a, r), y = R::as_tensor(*this, b, r);
  VarPtr out;
  if (r == DType::Bool && (base == "AND" || base == "OR" || base == "XOR")) {
    out = binary("NB_" + base, x, y);  // logical ops on masks
  } else if (base == "AND" || base == "OR" || base == "XOR" || base == "LSHIFT" || base == "RSHIFT") {
    out = R::call_torch(*this, it->second, {x, y});
  } else {
    out = binary("NB_" + base, x, y);
  }
  VarPtr res = R::as_array(*this, out, true);
  // a += b on an ndarray updates it in place, in its own dtype (NumPy's same_kind casting); on a
  // NumPy scalar (immutable) it is a + b
  if (inplace && a->is_array() && a->as<TensorV>().form == PyForm::NdArray)
    return R::store_into(*this, a, res, ("in-place operator " + base).c_str());
  return res;
}

VarPtr Interpreter::array_compare(const std::string& op, const VarPtr& a, const VarPtr& b) {
  using R = NumpyRules;
  if (a->is_tensor() || b->is_tensor()) unsupported("comparing an ndarray with a tensor: not captured");
  auto dt = R::result_dtype({a, b});
  if (!dt) unsupported("comparing an array with a value kiln does not take");
  return R::as_array(*this, compare(op, R::as_tensor(*this, a, *dt), R::as_tensor(*this, b, *dt)), true);
}

VarPtr Interpreter::array_unary(const std::string& op, const VarPtr& a) {
  using R = NumpyRules;
  const DType d = a->node()->meta.dtype;
  if (op == "pos") {
    if (d == DType::Bool) unsupported("unary + of a bool array: TypeError");
    return R::as_array(*this, R::tensor_of(a), true, {a});
  }
  if (op == "neg") {
    if (d == DType::Bool) unsupported("unary - of a bool array: TypeError");
    return R::as_array(*this, Var::tensor(add_node("neg", {a->node()})), true);
  }
  if (op == "abs") {
    if (d == DType::Bool) return R::as_array(*this, R::tensor_of(a), true, {a});
    return R::as_array(*this, Var::tensor(add_node("abs", {a->node()})), true);
  }
  if (op == "invert") {
    if (d == DType::Bool) return R::as_array(*this, Var::tensor(add_node("logical_not", {a->node()})), true);
    if (is_floating(d)) unsupported("~ of a float array: TypeError");
    return R::as_array(*this, R::call_torch(*this, "bitwise_not", {R::tensor_of(a)}), true);
  }
  unsupported("unary " + op + " of an array");
}

// An index into an array: arrays in it (masks, integer index arrays) as tensors.
static VarPtr index_of(const VarPtr& key) {
  if (key->is_array()) return NumpyRules::tensor_of(key);
  if (key->kind() == Var::Kind::Tuple) {
    std::vector<VarPtr> items;
    for (const VarPtr& k : key->seq()) items.push_back(k->is_array() ? NumpyRules::tensor_of(k) : k);
    return Var::tuple(std::move(items));
  }
  return key;
}

VarPtr Interpreter::array_subscript(const VarPtr& a, const VarPtr& key) {
  if (a->as<TensorV>().form != PyForm::NdArray) unsupported("indexing a NumPy scalar");
  const bool mask = key->is_array() && key->node()->meta.dtype == DType::Bool;
  if (mask) unsupported("reading an array through a boolean mask (its size depends on the data)");
  VarPtr r = subscript(NumpyRules::tensor_of(a), index_of(key));
  // a[i, j] of every dim (and a[()] of a 0-d array) is a NumPy scalar; a[...] an array
  const bool ellipsis = key->is_const() && key->known() == Py_Ellipsis;
  return NumpyRules::as_array(*this, r, !ellipsis);
}

void Interpreter::array_store_subscript(const VarPtr& a, const VarPtr& key, const VarPtr& value) {
  using R = NumpyRules;
  if (a->as<TensorV>().form != PyForm::NdArray) unsupported("item assignment into a NumPy scalar: TypeError");
  if (value->is_tensor()) unsupported("assigning a tensor into an ndarray: not captured");
  const DType own = a->node()->meta.dtype;
  // NumPy casts the value to the array's dtype (unsafe casting, as assignment does)
  VarPtr v = value->is_array() || (value->is_const() && is_numpy_scalar(value->known())) ? R::as_tensor(*this, value, own) : value;
  if (!v->is_tensor() && !(v->is_const() && is_python_scalar(v->known())) && !v->symint().valid())
    unsupported("assigning a value kiln does not take into an array");
  a->as<TensorV>().form = PyForm::Tensor;  // the tensor machinery updates the tracker every alias shares
  try {
    store_subscript(a, index_of(key), v);
  } catch (...) {
    a->as<TensorV>().form = PyForm::NdArray;
    throw;
  }
  a->as<TensorV>().form = PyForm::NdArray;
}

VarPtr Interpreter::tensor_to_array(const VarPtr& t, const KwArgs& kwargs) {
  // t.numpy(): an ndarray over the tensor's memory (an alias: an update through either is one
  // the other sees). torch refuses tensors autograd records, on another device, or of a dtype
  // NumPy lacks; so does capture.
  const ir::TensorMeta& m = t->node()->meta;
  for (auto& [k, v] : kwargs)
    if (k != "force" || truth(v)) unsupported("Tensor.numpy(" + k + "=...) is not captured");
  if (root()->needs_grad_.count(t->node())) unsupported("Tensor.numpy() of a tensor that requires grad: RuntimeError");
  if (m.device.type != DeviceType::CPU) unsupported("Tensor.numpy() of a tensor on " + m.device.str() + ": TypeError");
  if (m.dtype == DType::BFloat16) unsupported("Tensor.numpy() of a bfloat16 tensor: TypeError");
  if (!numpy_objects()) unsupported("Tensor.numpy() before NumPy is imported");
  return Var::tensor(add_node("alias", {t->node()}), nullptr, PyForm::NdArray);
}

}  // namespace kiln::bind::detail
