// Grad mode and torch.autocast as capture-time state: the context managers and decorators that
// change them (torch.no_grad, enable_grad, inference_mode, autocast and its device-specific
// spellings, nullcontext) become Context trackers; `with` enters them by changing the root
// interpreter's modes, which every op added later reads (needs_grad_, autocast_inputs), and the
// block's exit restores what it found. The graph then holds the casts autocast would make, so
// nothing of it depends on the modes at run time; the modes at the call are guarded.
#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"

namespace kiln::bind::detail {

namespace {

// The device type an autocast class stands for: torch.autocast takes it as its first argument;
// torch.cuda.amp.autocast and torch.cpu.amp.autocast fix it.
struct AutocastClass {
  PyObject* cls;
  const char* device;  // nullptr: the first argument
};

const std::vector<AutocastClass>& autocast_classes() {
  static const std::vector<AutocastClass> classes = [] {
    std::vector<AutocastClass> c;
    if (PyObject* o = object_at("torch.autocast")) c.push_back({o, nullptr});
    if (PyObject* o = object_at("torch.cuda.amp.autocast")) c.push_back({o, "cuda"});
    if (PyObject* o = object_at("torch.cpu.amp.autocast")) c.push_back({o, "cpu"});
    clear_error();
    return c;
  }();
  return classes;
}

const AutocastClass* autocast_class(PyObject* f) {
  for (const AutocastClass& c : autocast_classes())
    if (f == c.cls) return &c;
  return nullptr;
}

}  // namespace

ModeChange Interpreter::current_modes() {
  Interpreter* r = root();
  return ModeChange{r->grad_mode_, r->autocast_};
}

ModeChange Interpreter::enter_modes(const ModeChange& m) {
  ModeChange before = current_modes();
  Interpreter* r = root();
  if (m.grad) r->grad_mode_ = *m.grad;
  if (m.autocast) r->autocast_ = *m.autocast;
  return before;
}

void Interpreter::restore_modes(const ModeChange& m) {
  enter_modes(m);
  if (root()->out_.modes_after) root()->out_.modes_after = current_modes();
}

AutocastState Interpreter::autocast_region(const std::string& device, PyObject* dtype, bool enabled) {
  if (device != "cpu" && device != "cuda")
    unsupported("torch.autocast for device '" + device + "' (kiln compiles for cpu and cuda)");
  AutocastState s = root()->autocast_;
  const DeviceType t = device == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
  DType dt = s.dtype(t);  // torch.get_autocast_dtype(device) where the region starts (guarded)
  if (dtype && dtype != Py_None && !dtype_from_object(dtype, dt)) unsupported("torch.autocast with an unknown dtype");
  if (enabled && dt != DType::BFloat16 && dt != DType::Float16 && !(t == DeviceType::CPU && dt == DType::Float32))
    unsupported("torch.autocast with dtype " + std::string(dtype_name(dt)) + " (eager warns and disables it)");
  (t == DeviceType::CUDA ? s.cuda : s.cpu) = enabled;
  if (enabled) (t == DeviceType::CUDA ? s.cuda_dtype : s.cpu_dtype) = dt;
  return s;
}

VarPtr Interpreter::mode_context(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  static PyObject* no_grad = resolve_torch("no_grad");
  static PyObject* enable_grad = resolve_torch("enable_grad");
  static PyObject* inference_mode = resolve_torch("inference_mode");
  static PyObject* set_grad_enabled = resolve_torch("set_grad_enabled");
  static PyObject* nullcontext = object_at("contextlib.nullcontext");
  ModeChange m;
  if (f == no_grad && args.empty() && kwargs.empty()) m.grad = false;
  else if (f == enable_grad && args.empty() && kwargs.empty()) m.grad = true;
  else if (f == inference_mode && kwargs.empty() && args.size() <= 1) {
    // inference_mode(False) changes nothing here; inference_mode() makes inference tensors, which
    // later autograd refuses to save and in-place updates outside it refuse: the graph's
    // results would be ordinary tensors. The block runs for real (a break at the call).
    if (args.empty() || truth(args[0])) unsupported("torch.inference_mode() inside the function: its results are inference tensors, not captured");
  }
  else if (f == set_grad_enabled && kwargs.empty() && args.size() == 1) {
    // torch.set_grad_enabled(b) sets grad mode when called (a statement of its own, or a with
    // block's head, whose exit restores the mode before the call). Left set at the return, the
    // function leaves it so for the caller (modes_after).
    PyObject* b = const_obj(args[0], "set_grad_enabled argument");
    if (!PyBool_Check(b)) unsupported("torch.set_grad_enabled() of a non-bool: TypeError");
    ModeChange set;
    set.grad = b == Py_True;
    ModeChange before = enter_modes(set);
    Interpreter* r = root();
    if (before.grad != set.grad || r->out_.modes_after) r->out_.modes_after = current_modes();
    VarPtr c = Var::context(std::move(set));
    c->as<ContextV>().restore = std::make_shared<const ModeChange>(std::move(before));
    return c;
  }
  else if (f == nullcontext && args.empty() && kwargs.empty()) {
    // changes nothing
  } else if (const AutocastClass* ac = autocast_class(f)) {
    // torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None); the amp
    // spellings take (enabled=True, dtype=..., cache_enabled=True) with the device fixed.
    std::vector<std::string> names = ac->device ? std::vector<std::string>{"enabled", "dtype", "cache_enabled"}
                                                : std::vector<std::string>{"device_type", "dtype", "enabled", "cache_enabled"};
    std::unordered_map<std::string, PyObject*> given;
    if (args.size() > names.size()) unsupported("torch.autocast() with too many arguments");
    for (size_t i = 0; i < args.size(); ++i) given[names[i]] = const_obj(args[i], "autocast argument");
    for (const auto& [k, v] : kwargs) {
      if (std::find(names.begin(), names.end(), k) == names.end()) unsupported("torch.autocast() got an unexpected keyword " + k);
      given[k] = const_obj(v, "autocast argument");
    }
    std::string device = ac->device ? ac->device : "";
    if (!ac->device) {
      PyObject* d = given.count("device_type") ? given["device_type"] : nullptr;
      if (!d || !PyUnicode_Check(d)) unsupported("torch.autocast() needs device_type as a str");
      device = PyUnicode_AsUTF8(d);
    }
    bool enabled = true;
    if (given.count("enabled")) {
      if (!PyBool_Check(given["enabled"])) unsupported("torch.autocast(enabled=...) must be a bool");
      enabled = given["enabled"] == Py_True;
    }
    m.autocast = autocast_region(device, given.count("dtype") ? given["dtype"] : nullptr, enabled);
  } else {
    return nullptr;
  }
  return Var::context(std::move(m));
}

bool Interpreter::is_autocast_object(PyObject* ctx) { return autocast_class(reinterpret_cast<PyObject*>(Py_TYPE(ctx))) != nullptr; }

ModeChange Interpreter::modes_of_object(PyObject* ctx) {
  // An autocast or grad-mode object made outside the function (`with self.autocast:`, the
  // wrapper torch's decorators make): the modes it would set, read from its fields.
  static PyObject* no_grad = resolve_torch("no_grad");
  static PyObject* enable_grad = resolve_torch("enable_grad");
  PyObject* cls = reinterpret_cast<PyObject*>(Py_TYPE(ctx));
  ModeChange m;
  if (cls == no_grad) m.grad = false;
  else if (cls == enable_grad) m.grad = true;
  else if (autocast_class(cls)) {
    PyObject* device = PyObject_GetAttrString(ctx, "device");
    PyObject* dtype = PyObject_GetAttrString(ctx, "fast_dtype");
    PyObject* enabled = PyObject_GetAttrString(ctx, "_enabled");
    keep_.push_back(device);
    keep_.push_back(dtype);
    keep_.push_back(enabled);
    if (!device || !dtype || !enabled || !PyUnicode_Check(device)) {
      clear_error();
      unsupported("with of a torch.autocast object kiln cannot read");
    }
    m.autocast = autocast_region(PyUnicode_AsUTF8(device), dtype, enabled == Py_True);
  } else {
    unsupported(std::string("with of a context manager other than torch.no_grad/enable_grad/inference_mode/autocast/nullcontext (") +
                Py_TYPE(ctx)->tp_name + ")");
  }
  return m;
}

VarPtr Interpreter::autocast_query(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  static PyObject* is_enabled = object_at("torch.is_autocast_enabled");
  static PyObject* is_cpu_enabled = object_at("torch.is_autocast_cpu_enabled");
  static PyObject* gpu_dtype = object_at("torch.get_autocast_gpu_dtype");
  static PyObject* cpu_dtype = object_at("torch.get_autocast_cpu_dtype");
  static PyObject* dtype_of = object_at("torch.get_autocast_dtype");
  static PyObject* any_enabled = object_at("torch._C._is_any_autocast_enabled");  // nn.RNNBase's check
  if (!kwargs.empty() || args.size() > 1) return nullptr;
  if (f == any_enabled) return args.empty() ? Var::constant(root()->autocast_.any() ? Py_True : Py_False) : nullptr;
  std::string device = "cuda";
  if (f == is_cpu_enabled || f == cpu_dtype) device = "cpu";
  if (args.size() == 1) {
    PyObject* d = const_obj(args[0], "device type");
    if (!PyUnicode_Check(d) || (f != is_enabled && f != dtype_of)) return nullptr;
    device = PyUnicode_AsUTF8(d);
  } else if (f == dtype_of) {
    return nullptr;  // torch raises: it takes a device type
  }
  if (device != "cpu" && device != "cuda") return nullptr;  // other devices: torch's own answer
  const AutocastState& s = root()->autocast_;
  const DeviceType t = device == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
  if (f == is_enabled || f == is_cpu_enabled) return Var::constant(s.on(t) ? Py_True : Py_False);
  return Var::constant(torch_dtype_object(s.dtype(t)));
}

}  // namespace kiln::bind::detail
