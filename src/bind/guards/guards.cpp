#include "bind/guards/guards.h"
#include "bind/interrupts.h"

namespace kiln::bind {

std::string Guard::str() const {
  std::string s = source ? source->str() : "";
  switch (kind) {
    case Kind::Tensor: {
      std::string sizes, strides;
      for (size_t i = 0; i < tensor.sizes.size(); ++i) {
        sizes += (i ? ", " : "") + std::to_string(tensor.sizes[i]);
        strides += (i ? ", " : "") + std::to_string(tensor.strides[i]);
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
  }
  return "?";
}

GuardSet::~GuardSet() {
  if (!Py_IsInitialized()) return;
  for (Guard& g : guards_) Py_XDECREF(g.expected);
}

bool GuardSet::needed(const Guard& g) {
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
  Py_INCREF(value);
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
void GuardSet::add_grad_mode(bool enabled) {
  Guard g{Guard::Kind::GradMode, nullptr};
  g.flag = enabled;
  if (needed(g)) guards_.push_back(std::move(g));
}

void GuardSet::add_autocast(const AutocastState& state) {
  Guard g{Guard::Kind::Autocast, nullptr};
  g.autocast = state;
  if (needed(g)) guards_.push_back(std::move(g));
}

bool GuardSet::check(const FrameView& f, std::string* why) const {
  for (const Guard& g : guards_) {
    if (g.kind == Guard::Kind::Autocast) {
      if (!(autocast_state() == g.autocast)) {
        if (why) *why = g.str() + " failed (now " + autocast_state().str() + ")";
        return false;
      }
      continue;
    }
    if (g.kind == Guard::Kind::GradMode) {
      if (grad_enabled() != g.flag) {
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
    if (ok) {
      switch (g.kind) {
        case Guard::Kind::Tensor: ok = tensor_matches(v, g.tensor, why ? &detail : nullptr); break;
        case Guard::Kind::Type: ok = reinterpret_cast<PyObject*>(Py_TYPE(v)) == g.expected; break;
        case Guard::Kind::Identity: ok = v == g.expected; break;
        case Guard::Kind::Length: {
          Py_ssize_t n = PyObject_Size(v);
          if (n < 0) clear_error();
          ok = n == g.length;
          break;
        }
        case Guard::Kind::Equals: {
          ok = Py_TYPE(v) == Py_TYPE(g.expected);
          if (ok && v != g.expected) {
            int r = PyObject_RichCompareBool(v, g.expected, Py_EQ);
            if (r < 0) clear_error();
            ok = r == 1;
          }
          break;
        }
        default: break;
      }
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
