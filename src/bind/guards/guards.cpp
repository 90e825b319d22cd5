#include "bind/guards/guards.h"

#include <cmath>

#include <algorithm>
#include "bind/interrupts.h"

namespace kiln::bind {

std::string Guard::str() const {
  std::string s = source ? source->str() : "";
  switch (kind) {
    case Kind::Tensor: {
      std::string sizes, strides;
      const bool generic = !tensor.size_symbols.empty();
      for (size_t i = 0; i < tensor.sizes.size(); ++i) {
        const bool dynamic = generic && tensor.size_symbols[i] >= 0;
        sizes += (i ? ", " : "") + (dynamic ? "s" + std::to_string(tensor.size_symbols[i]) : std::to_string(tensor.sizes[i]));
        strides += (i ? ", " : "") + (generic ? tensor.stride_exprs[i].str() : std::to_string(tensor.strides[i]));
      }
      return "TENSOR_MATCH: " + s + " " + dtype_name(tensor.dtype) + " " + tensor.device.str() + " size=[" + sizes +
             "] stride=[" + strides + "] requires_grad=" + (tensor.requires_grad ? "True" : "False");
    }
    case Kind::Type: return "TYPE_MATCH: type(" + s + ") is " + reinterpret_cast<PyTypeObject*>(expected)->tp_name;
    case Kind::Equals: {
      PyObject* r = PyObject_Repr(expected);
      std::string v = r ? PyUnicode_AsUTF8(r) : "?";
      Py_XDECREF(r);
      if (!r) clear_error();
      return "EQUALS_MATCH: " + s + " == " + v;
    }
    case Kind::Identity: return "ID_MATCH: " + s + " is <" + Py_TYPE(expected)->tp_name + " object>";
    case Kind::Length: return "LENGTH_CHECK: len(" + s + ") == " + std::to_string(length);
    case Kind::GradMode: return std::string("GRAD_MODE: torch.is_grad_enabled() == ") + (flag ? "True" : "False");
    case Kind::Autocast: return "AUTOCAST: " + autocast.str();
    case Kind::DefaultDtype: return std::string("DEFAULT_DTYPE: torch.get_default_dtype() == ") + dtype_name(dtype);
    case Kind::Deterministic:
      return std::string("DETERMINISTIC: torch.are_deterministic_algorithms_enabled() == ") + (flag ? "True" : "False");
    case Kind::DeterministicWarnOnly:
      return std::string("DETERMINISTIC_WARN_ONLY: torch.is_deterministic_algorithms_warn_only_enabled() == ") +
             (flag ? "True" : "False");
    case Kind::HasAttr:
      return std::string("HASATTR: ") + (flag ? "" : "not ") + "hasattr(" + s + ", '" + PyUnicode_AsUTF8(expected) + "')";
    case Kind::DictVersion: return "DICT_VERSION: " + s + ".__dict__ unchanged";
    case Kind::HasKey:
      return std::string("HAS_KEY: '") + PyUnicode_AsUTF8(expected) + "' " + (flag ? "in " : "not in ") + s;
    case Kind::Same: return "SAME_OBJECT: " + s + " is " + sources[0]->str();
    case Kind::NotSame: return "NOT_SAME_OBJECT: " + s + " is not " + sources[0]->str();
    case Kind::KeyOrder: {
      PyObject* r = PyObject_Repr(expected);
      std::string keys = r ? PyUnicode_AsUTF8(r) : "?";
      Py_XDECREF(r);
      clear_error();
      return "KEY_ORDER: tuple(" + s + ") == " + keys;
    }
    case Kind::IntSymbol: return "INT_SYMBOL: " + s + " is an int >= 2, bound to s" + std::to_string(length);
    case Kind::NoAlias: {
      std::string m;
      for (size_t i = 0; i < sources.size(); ++i)
        if (mutated[i]) m += (m.empty() ? "" : ", ") + sources[i]->str();
      return "NO_ALIAS: " + m + " (updated in place) share memory with no other input";
    }
  }
  return "?";
}

GuardSet::~GuardSet() {
  if (!Py_IsInitialized()) return;
  for (Guard& g : guards_) {
    Py_XDECREF(g.expected);
    for (auto& [k, v] : g.entries) Py_DECREF(k), Py_DECREF(v);
  }
}

namespace {

// A dict's version tag (PEP 509): a new value at every change. CPython 3.12 keeps dict watchers'
// ids in its low 8 bits, which watching a dict sets without changing it.
uint64_t dict_version(PyObject* d) {
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  const uint64_t tag = reinterpret_cast<PyDictObject*>(d)->ma_version_tag;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
  return PY_VERSION_HEX >= 0x030C0000 ? tag >> 8 : tag;
}

}  // namespace

void GuardSet::finalize(const std::vector<SourcePtr>& fetch) {
  // The module dicts as the entry leaves them: capture and compilation may import a submodule
  // (which sets an attribute of its parent) after the attribute reads the guard stands for.
  for (Guard& g : guards_)
    if (g.kind == Guard::Kind::DictVersion) g.version = dict_version(PyModule_GetDict(g.expected));
  tree_ = std::make_unique<GuardTree>(*this, fetch);
}

void GuardSet::add_dict_version(SourcePtr module_source, PyObject* module, PyObject* name, PyObject* value) {
  Guard g{Guard::Kind::DictVersion, std::move(module_source)};
  g.expected = module;
  std::string key = g.str();
  Guard* at = nullptr;
  if (needed(g)) {
    Py_INCREF(module);
    dict_versions_[std::move(key)] = guards_.size();
    guards_.push_back(std::move(g));
    at = &guards_.back();
  } else if (auto it = dict_versions_.find(key); it != dict_versions_.end()) {
    at = &guards_[it->second];
  }
  if (!at) return;  // (not needed: under a fixed root)
  for (const auto& [k, v] : at->entries)
    if (PyUnicode_Compare(k, name) == 0) return;
  at->entries.emplace_back(Py_NewRef(name), Py_NewRef(value));
}

bool GuardSet::needed(const Guard& g) {
  tree_.reset();  // it points into guards_, which may grow
  if (g.source && g.source->made_in_frame()) return false;  // the same at every call (Source::Made)
  if (g.source)
    for (const Source* a = g.source->base.get(); a; a = a->base.get())
      if (fixed_roots_.count(a->str())) return false;
  return seen_.insert(g.str()).second;
}

void GuardSet::add_tensor(SourcePtr s, const TensorInfo& info) {
  Guard g{Guard::Kind::Tensor, std::move(s)};
  g.tensor = info;
  if (needed(g)) guards_.push_back(std::move(g));
}
void GuardSet::add_type(SourcePtr s, PyObject* type) {
  Guard g{Guard::Kind::Type, std::move(s)};
  g.expected = type;
  if (!needed(g)) return;
  Py_INCREF(type);
  guards_.push_back(std::move(g));
}
void GuardSet::add_equals(SourcePtr s, PyObject* value) {
  Guard g{Guard::Kind::Equals, std::move(s)};
  g.expected = value;
  if (!needed(g)) return;
  // A set is compared with a copy: the caller's set itself would always equal what it became.
  g.expected = PySet_CheckExact(value) ? PySet_New(value) : Py_NewRef(value);
  if (!g.expected) {
    clear_error();
    g.expected = Py_NewRef(value);
  }
  guards_.push_back(std::move(g));
}
void GuardSet::add_identity(SourcePtr s, PyObject* obj) {
  // An identity guard's str() names the type, not the object: two objects of one type at one
  // source are the same source read twice, so the first guard is the one to keep.
  Guard g{Guard::Kind::Identity, std::move(s)};
  g.expected = obj;
  if (!needed(g)) return;
  if (PyCode_Check(obj)) fixed_roots_.insert(g.source->str());
  Py_INCREF(obj);
  guards_.push_back(std::move(g));
}
void GuardSet::add_length(SourcePtr s, Py_ssize_t n) {
  Guard g{Guard::Kind::Length, std::move(s)};
  g.length = n;
  if (needed(g)) guards_.push_back(std::move(g));
}
void GuardSet::add_key_order(SourcePtr s, PyObject* dict) {
  Guard g{Guard::Kind::KeyOrder, std::move(s)};
  g.expected = PySequence_Tuple(dict);
  if (!g.expected) {
    clear_error();
    return;
  }
  if (!needed(g)) {
    Py_DECREF(g.expected);
    return;
  }
  guards_.push_back(std::move(g));
}
void GuardSet::add_grad_mode(bool enabled) {
  Guard g{Guard::Kind::GradMode, nullptr};
  g.flag = enabled;
  if (needed(g)) guards_.push_back(std::move(g));
}

void GuardSet::add_same(SourcePtr s, SourcePtr other) {
  Guard g{Guard::Kind::Same, std::move(s)};
  g.sources.push_back(std::move(other));
  if (needed(g)) guards_.push_back(std::move(g));
}

void GuardSet::drop_instance_identities(size_t from) {
  tree_.reset();
  auto instance = [](const Guard& g) {
    PyObject* o = g.expected;
    return g.kind == Guard::Kind::Identity && o && !PyModule_Check(o) && !PyType_Check(o) && !PyFunction_Check(o) &&
           !PyCFunction_Check(o) && !PyMethod_Check(o);
  };
  for (auto it = guards_.begin() + static_cast<std::ptrdiff_t>(std::min(from, guards_.size())); it != guards_.end();) {
    if (instance(*it)) {
      seen_.erase(it->str());
      Py_XDECREF(it->expected);
      it = guards_.erase(it);
    } else {
      ++it;
    }
  }
  dict_versions_.clear();  // the indices moved
  for (size_t i = 0; i < guards_.size(); ++i)
    if (guards_[i].kind == Guard::Kind::DictVersion) dict_versions_[guards_[i].str()] = i;
}

void GuardSet::add_not_same(SourcePtr s, SourcePtr other) {
  Guard g{Guard::Kind::NotSame, std::move(s)};
  g.sources.push_back(std::move(other));
  if (needed(g)) guards_.push_back(std::move(g));
}

void GuardSet::add_int_symbol(SourcePtr s, const sym::Expr& symbol) {
  Guard g{Guard::Kind::IntSymbol, std::move(s)};
  for (size_t i = 0; i < symbols_.size(); ++i)
    if (symbols_[i] == symbol) g.length = static_cast<Py_ssize_t>(i);
  if (needed(g)) guards_.push_back(std::move(g));
}

void GuardSet::add_no_alias(std::vector<SourcePtr> inputs, std::vector<bool> mutated) {
  tree_.reset();
  Guard g{Guard::Kind::NoAlias, nullptr};
  // What a call builds afresh (a module's parameters drawn at every call) shares memory with
  // nothing of the caller's; reading it here would build it before the guards held.
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] && inputs[i]->per_call()) continue;
    g.sources.push_back(std::move(inputs[i]));
    g.mutated.push_back(mutated[i]);
  }
  guards_.push_back(std::move(g));
}

void GuardSet::add_haskey(SourcePtr s, PyObject* key, bool present) {
  Guard g{Guard::Kind::HasKey, std::move(s)};
  g.expected = key;
  g.flag = present;
  if (!needed(g)) return;
  Py_INCREF(key);
  guards_.push_back(std::move(g));
}

void GuardSet::add_hasattr(SourcePtr s, PyObject* name, bool present) {
  Guard g{Guard::Kind::HasAttr, std::move(s)};
  g.expected = name;
  g.flag = present;
  if (!needed(g)) return;
  Py_INCREF(name);
  guards_.push_back(std::move(g));
}

void GuardSet::add_autocast(const AutocastState& state) {
  Guard g{Guard::Kind::Autocast, nullptr};
  g.autocast = state;
  if (needed(g)) guards_.push_back(std::move(g));
}

void GuardSet::add_default_dtype(DType dtype) {
  Guard g{Guard::Kind::DefaultDtype, nullptr};
  g.dtype = dtype;
  if (needed(g)) guards_.push_back(std::move(g));
}

void GuardSet::add_global_flag(Guard::Kind kind, bool flag) {
  Guard g{kind, nullptr};
  g.flag = flag;
  if (needed(g)) guards_.push_back(std::move(g));
}

sym::Expr GuardSet::add_symbol(int64_t hint) {
  symbols_.push_back(sym::Expr::size_symbol("s" + std::to_string(symbols_.size())));
  hints_.push_back(hint);
  return symbols_.back();
}

int64_t GuardSet::hint(const sym::Expr& symbol) const {
  for (size_t i = 0; i < symbols_.size(); ++i)
    if (symbols_[i] == symbol) return hints_[i];
  return -1;
}

int64_t GuardSet::value_at_hints(const sym::Expr& e) const {
  return sym::evaluate(e, [this](const sym::Expr& v) { return hint(v); });
}

void GuardSet::specialize(const sym::Expr& symbol) {
  for (size_t i = 0; i < symbols_.size(); ++i)
    if (symbols_[i] == symbol && !specialized(symbol)) specialized_.push_back(static_cast<int>(i));
}

bool GuardSet::specialized(const sym::Expr& symbol) const {
  for (int i : specialized_)
    if (symbols_[i] == symbol) return true;
  return false;
}

void GuardSet::size_changes(const FrameView& f, std::map<std::string, std::set<int64_t>>& out) const {
  for (const Guard& g : guards_) {
    if (g.kind == Guard::Kind::Equals && (PyLong_CheckExact(g.expected) || PyFloat_CheckExact(g.expected))) {
      // a Python int (an argument, a counter attribute) that changed: the int itself becomes a
      // symbol (dim -1); a float that changed, a value read at each call
      PyObject* v = eval_source(*g.source, f);
      const bool both_nan = v && PyFloat_CheckExact(v) && PyFloat_CheckExact(g.expected) &&
                            std::isnan(PyFloat_AS_DOUBLE(v)) && std::isnan(PyFloat_AS_DOUBLE(g.expected));
      if (v && !both_nan && Py_TYPE(v) == Py_TYPE(g.expected) && PyObject_RichCompareBool(v, g.expected, Py_EQ) == 0)
        out[g.source->str()].insert(-1);
      Py_XDECREF(v);
      if (PyErr_Occurred()) clear_error();
      continue;
    }
    if (g.kind != Guard::Kind::Tensor) continue;
    bool borrowed = g.source->kind == Source::Kind::Local;
    PyObject* v = borrowed ? f.locals[g.source->local] : eval_source(*g.source, f);
    if (!v) {
      clear_error();
      continue;
    }
    TensorInfo now;
    std::string why;
    if (is_tensor(v) && tensor_info(v, now, why) && now.sizes.size() == g.tensor.sizes.size() &&
        now.dtype == g.tensor.dtype && now.device == g.tensor.device) {
      for (size_t d = 0; d < now.sizes.size(); ++d) {
        const bool symbolic = !g.tensor.size_symbols.empty() && g.tensor.size_symbols[d] >= 0;
        if (!symbolic && now.sizes[d] != g.tensor.sizes[d]) out[g.source->str()].insert(static_cast<int64_t>(d));
      }
    }
    if (!borrowed) Py_DECREF(v);
  }
}

void GuardSet::add_fact(const sym::Expr& zero) {
  if (std::find(facts_.begin(), facts_.end(), zero) == facts_.end()) facts_.push_back(zero);
}

void GuardSet::add_fact_nonnegative(const sym::Expr& e) {
  if (std::find(nonneg_facts_.begin(), nonneg_facts_.end(), e) == nonneg_facts_.end()) nonneg_facts_.push_back(e);
}

bool GuardSet::has_fact(const sym::Expr& zero) const {
  return std::find(facts_.begin(), facts_.end(), zero) != facts_.end() ||
         std::find(facts_.begin(), facts_.end(), -zero) != facts_.end();
}

bool GuardSet::has_fact_nonnegative(const sym::Expr& e) const {
  return std::find(nonneg_facts_.begin(), nonneg_facts_.end(), e) != nonneg_facts_.end();
}

std::optional<int64_t> GuardShapeEnv::hint(const sym::Expr& e) {
  std::vector<sym::Expr> syms;
  sym::collect_symbols(e, syms);
  for (const sym::Expr& s : syms)
    if (guards_.hint(s) < 0) return std::nullopt;
  return guards_.value_at_hints(e);
}

bool GuardShapeEnv::assume_equal(const sym::Expr& a, const sym::Expr& b) {
  auto ha = hint(a), hb = hint(b);
  if (!ha || !hb || *ha != *hb) return false;
  const bool spec_a = a.is_size_symbol() && b.as_const(), spec_b = b.is_size_symbol() && a.as_const();
  if (frozen_) {
    return (spec_a && guards_.specialized(a)) || (spec_b && guards_.specialized(b)) || guards_.has_fact(a - b);
  }
  if (spec_a) guards_.specialize(a);
  else if (spec_b) guards_.specialize(b);
  else guards_.add_fact(a - b);
  return true;
}

bool GuardShapeEnv::assume_nonnegative(const sym::Expr& e) {
  auto h = hint(e);
  if (!h || *h < 0) return false;
  if (frozen_) return guards_.has_fact_nonnegative(e);
  guards_.add_fact_nonnegative(e);
  return true;
}

std::map<sym::Expr, sym::Expr> GuardSet::specializations() const {
  std::map<sym::Expr, sym::Expr> out;
  for (int i : specialized_) out.emplace(symbols_[i], sym::Expr(hints_[i]));
  return out;
}

bool GuardSet::check(const FrameView& f, std::string* why) const {
  SymbolBindings bindings{&symbols_, std::vector<int64_t>(symbols_.size(), -1)};
  return check_guards(f, why, bindings) && check_facts(bindings, why);
}

bool GuardSet::check_facts(const SymbolBindings& bindings, std::string* why) const {
  for (const sym::Expr& z : facts_) {
    if (bindings.value_of(z) != 0) {
      if (why) *why = "SIZE_FACT: " + z.str() + " == 0 failed";
      return false;
    }
  }
  for (const sym::Expr& z : nonneg_facts_) {
    if (bindings.value_of(z) < 0) {
      if (why) *why = "SIZE_FACT: " + z.str() + " >= 0 failed";
      return false;
    }
  }
  for (int i : specialized_) {
    if (bindings.values[i] != hints_[i]) {
      if (why) *why = "SIZE_FACT: " + symbols_[i].str() + " == " + std::to_string(hints_[i]) + " failed (now " +
                      std::to_string(bindings.values[i]) + ")";
      return false;
    }
  }
  return true;
}

bool Guard::holds_globally() const {
  switch (kind) {
    case Kind::Autocast: return autocast_state() == autocast;
    case Kind::GradMode: return grad_enabled() == flag;
    case Kind::DefaultDtype: return default_dtype() == dtype;
    case Kind::Deterministic: return deterministic_algorithms() == flag;
    case Kind::DeterministicWarnOnly: return deterministic_algorithms_warn_only() == flag;
    default: return false;
  }
}

bool Guard::holds_for(PyObject* v, SymbolBindings& bindings, std::string* detail) const {
  switch (kind) {
    case Kind::Tensor: return tensor_matches(v, tensor, detail, &bindings);
    case Kind::Type: return reinterpret_cast<PyObject*>(Py_TYPE(v)) == expected;
    case Kind::Identity: return v == expected;
    case Kind::HasAttr: {
      // A lookup that reports a missing attribute without building an AttributeError: a
      // hasattr(...) that is False on every call costs no exception object per call.
      if (int known = module_has_attr(v, expected); known >= 0) return known == (flag ? 1 : 0);
      PyObject* a = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
      int r = PyObject_GetOptionalAttr(v, expected, &a);
#else
      int r = _PyObject_LookupAttr(v, expected, &a);
#endif
      Py_XDECREF(a);
      if (r < 0) clear_error();
      return r == (flag ? 1 : 0);
    }
    case Kind::DictVersion: {
      if (v != expected) return false;
      PyObject* d = PyModule_GetDict(v);
      const uint64_t now = dict_version(d);
      if (now == version) return true;
      for (const auto& [k, x] : entries)
        if (PyDict_GetItemWithError(d, k) != x) {
          if (PyErr_Occurred()) clear_error();
          if (detail) *detail = std::string("'") + PyUnicode_AsUTF8(k) + "' changed";
          return false;
        }
      version = now;  // its entries all hold: the change was elsewhere in the dict
      return true;
    }
    case Kind::HasKey: {
      // a dict, or a mapping of another kind (os.environ)
      const int r = PyDict_Check(v) ? PyDict_Contains(v, expected) : PyMapping_Check(v) ? PySequence_Contains(v, expected) : -1;
      if (r < 0) clear_error();
      return r == (flag ? 1 : 0);
    }
    case Kind::IntSymbol: {
      long long x = PyLong_CheckExact(v) ? PyLong_AsLongLong(v) : -1;
      if (x == -1 && PyErr_Occurred()) clear_error();
      int64_t& bound = bindings.values[static_cast<size_t>(length)];
      if (x < 2 || (bound >= 0 && bound != x)) return false;
      bound = x;
      return true;
    }
    case Kind::KeyOrder: {
      if (!PyDict_Check(v) || PyDict_Size(v) != PyTuple_GET_SIZE(expected)) return false;
      if (!PyDict_CheckExact(v) && Py_TYPE(v)->tp_iter != PyDict_Type.tp_iter) {
        // an OrderedDict: its own order (move_to_end), not its table's
        PyObject* keys = PySequence_Tuple(v);
        const int eq = keys ? PyObject_RichCompareBool(keys, expected, Py_EQ) : -1;
        Py_XDECREF(keys);
        if (eq < 0) clear_error();
        return eq == 1;
      }
      PyObject *k, *unused;
      Py_ssize_t pos = 0;
      for (Py_ssize_t i = 0; PyDict_Next(v, &pos, &k, &unused); ++i) {
        PyObject* want = PyTuple_GET_ITEM(expected, i);
        if (k == want) continue;
        const int eq = PyObject_RichCompareBool(k, want, Py_EQ);
        if (eq < 0) clear_error();
        if (eq != 1) return false;
      }
      return true;
    }
    case Kind::Length: {
      Py_ssize_t n = PyObject_Size(v);
      if (n < 0) clear_error();
      return n == length;
    }
    case Kind::Equals: {
      if (Py_TYPE(v) != Py_TYPE(expected)) return false;
      if (v == expected) return true;
      if (PyFloat_CheckExact(v)) {  // -0.0 == 0.0, but 1 / -0.0 and copysign tell them apart;
        const double a = PyFloat_AS_DOUBLE(v), b = PyFloat_AS_DOUBLE(expected);  // nan is nan
        return (a == b && std::signbit(a) == std::signbit(b)) || (std::isnan(a) && std::isnan(b));
      }
      int r = PyObject_RichCompareBool(v, expected, Py_EQ);
      if (r < 0) clear_error();
      return r == 1;
    }
    default: return false;
  }
}

bool Guard::no_alias_holds(PyObject* const* values) const {
  // storages of the inputs updated in place, against every input's
  std::vector<const void*> written, all;
  for (size_t i = 0; i < sources.size(); ++i) {
    const void* s = storage_of(values[i]);
    if (!s) continue;
    for (const void* w : written)
      if (w == s) return false;
    if (mutated[i]) {
      for (const void* a : all)
        if (a == s) return false;
      written.push_back(s);
    }
    all.push_back(s);
  }
  return true;
}

bool GuardSet::check_guards(const FrameView& f, std::string* why, SymbolBindings& bindings) const {
  for (const Guard& g : guards_) {
    if (g.is_global()) {
      if (!g.holds_globally()) {
        if (why) *why = g.str() + " failed" + (g.kind == Guard::Kind::Autocast ? " (now " + autocast_state().str() + ")" : "");
        return false;
      }
      continue;
    }
    if (g.kind == Guard::Kind::NoAlias) {
      std::vector<PyObject*> values;
      bool ok = true;
      for (size_t i = 0; i < g.sources.size() && ok; ++i) {
        values.push_back(eval_source(*g.sources[i], f));
        ok = values.back() != nullptr;
      }
      ok = ok && g.no_alias_holds(values.data());
      for (PyObject* v : values) Py_XDECREF(v);
      if (!ok) {
        if (why) *why = g.str() + " failed";
        return false;
      }
      continue;
    }
    // Locals are read without a reference: the frame holds them for the whole call.
    bool borrowed = g.source->kind == Source::Kind::Local;
    PyObject* v = borrowed ? f.locals[g.source->local] : eval_source(*g.source, f);
    bool ok = v != nullptr;
    std::string detail;
    if (ok && (g.kind == Guard::Kind::Same || g.kind == Guard::Kind::NotSame)) {
      PyObject* o = eval_source(*g.sources[0], f);
      ok = (o == v) == (g.kind == Guard::Kind::Same);
      Py_XDECREF(o);
    } else if (ok) {
      ok = g.holds_for(v, bindings, why ? &detail : nullptr);
    }
    if (!borrowed) Py_XDECREF(v);
    if (!ok) {
      if (why) *why = g.str() + " failed" + (detail.empty() ? "" : " (" + detail + ")");
      return false;
    }
  }
  return true;
}

std::vector<std::string> GuardSet::strs() const {
  std::vector<std::string> out;
  for (const Guard& g : guards_) out.push_back(g.str());
  return out;
}

}  // namespace kiln::bind
