// The one place (with runtime/executor.cpp) where the binding layer sees torch's C++ API.
#include "bind/torch/tensor_bridge.h"
#include "bind/interrupts.h"

#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/tensor_dtypes.h>
#include <torch/csrc/utils/tensor_numpy.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ScalarOps.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>

namespace kiln::bind {
namespace {

bool to_kiln(c10::ScalarType s, DType& out) {
  switch (s) {
    case c10::ScalarType::Bool: out = DType::Bool; return true;
    case c10::ScalarType::Byte: out = DType::UInt8; return true;
    case c10::ScalarType::Char: out = DType::Int8; return true;
    case c10::ScalarType::Short: out = DType::Int16; return true;
    case c10::ScalarType::Int: out = DType::Int32; return true;
    case c10::ScalarType::Long: out = DType::Int64; return true;
    case c10::ScalarType::Half: out = DType::Float16; return true;
    case c10::ScalarType::BFloat16: out = DType::BFloat16; return true;
    case c10::ScalarType::Float: out = DType::Float32; return true;
    case c10::ScalarType::Double: out = DType::Float64; return true;
    default: return false;
  }
}

c10::ScalarType to_torch(DType t) {
  static const c10::ScalarType map[] = {c10::ScalarType::Bool,  c10::ScalarType::Byte,  c10::ScalarType::Char,
                                        c10::ScalarType::Short, c10::ScalarType::Int,   c10::ScalarType::Long,
                                        c10::ScalarType::Half,  c10::ScalarType::BFloat16, c10::ScalarType::Float,
                                        c10::ScalarType::Double};
  return map[static_cast<int>(t)];
}

// torch.Tensor itself, and subclasses that switch __torch_function__ off (nn.Parameter): their
// ops give plain tensors, as kiln's graph does. Any other subclass's __torch_function__ sees
// (and may change) every op, so such inputs run eagerly.
bool has_plain_torch_function(PyTypeObject* type) {
  static PyObject* tensor_type = reinterpret_cast<PyObject*>(THPVariableClass);
  if (reinterpret_cast<PyObject*>(type) == tensor_type) return true;
  static PyObject* disabled = [] {
    PyObject* c = PyImport_ImportModule("torch._C");
    PyObject* f = c ? PyObject_GetAttrString(c, "_disabled_torch_function_impl") : nullptr;
    Py_XDECREF(c);
    clear_error();
    return f;
  }();
  PyObject* tf = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__torch_function__");
  if (!tf) {
    clear_error();
    return false;
  }
  // A classmethod read from the class is a bound method of it: compare what it binds.
  PyObject* f = PyMethod_Check(tf) ? PyMethod_GET_FUNCTION(tf) : tf;
  bool plain = f == disabled;
  Py_DECREF(tf);
  return plain;
}

}  // namespace

bool is_tensor(PyObject* obj) { return THPVariable_Check(obj); }

int64_t tensor_dim_size(PyObject* t, int dim) { return THPVariable_Unpack(t).size(dim); }

const void* storage_of(PyObject* obj) {
  if (!THPVariable_Check(obj)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  return t.has_storage() ? t.storage().data() : nullptr;
}

PyObject* fresh_seed() {
  try {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    uint64_t v;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      v = gen.get<at::CPUGeneratorImpl>()->random64();
    }
    return THPVariable_Wrap(at::scalar_tensor(static_cast<int64_t>(v >> 1), at::kLong));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* detached(PyObject* t) {
  try {
    return THPVariable_Wrap(THPVariable_Unpack(t).detach());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

int64_t tensor_version(PyObject* t) {
  if (!THPVariable_Check(t)) return -1;
  const at::Tensor& x = THPVariable_Unpack(t);
  return x.is_inference() ? -1 : static_cast<int64_t>(x._version());
}

bool copy_into(PyObject* dst, PyObject* src, bool bump) {
  try {
    const at::Tensor& d = THPVariable_Unpack(dst);
    const at::Tensor& s = THPVariable_Unpack(src);
    // Already there: an update the executor made in place (another tensor object over the
    // same elements, as a CUDA graph's outputs are).
    if (d.data_ptr() == s.data_ptr() && d.device() == s.device() && d.dtype() == s.dtype() &&
        d.sizes().equals(s.sizes()) && d.strides().equals(s.strides())) {
      if (bump && !d.is_inference()) d.unsafeGetTensorImpl()->bump_version();  // as torch's in-place op would
      return true;
    }
    // Capture refuses in-place updates autograd would see; one it took under no_grad (an
    // optimizer's update of a parameter) is no_grad's copy here too.
    at::AutoGradMode no_grad(false);
    d.copy_(s);
    return true;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return false;
  }
}

namespace {
const at::Tensor* cpu_scalar(PyObject* obj) {
  if (!THPVariable_Check(obj)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (t.dim() != 0 || !t.device().is_cpu() || (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble)) return nullptr;
  return &t;
}
}  // namespace

bool cpu_scalar_value(PyObject* obj, double& out) {
  const at::Tensor* t = cpu_scalar(obj);
  if (!t) {
    PyErr_SetString(PyExc_RuntimeError, "kiln: a step count is no longer a 0-d floating CPU tensor");
    return false;
  }
  out = t->scalar_type() == at::kFloat ? static_cast<double>(*t->const_data_ptr<float>()) : *t->const_data_ptr<double>();
  return true;
}

bool add_one_in_place(PyObject* obj) {
  const at::Tensor* t = cpu_scalar(obj);
  if (!t) {
    PyErr_SetString(PyExc_RuntimeError, "kiln: a step count is no longer a 0-d floating CPU tensor");
    return false;
  }
  if (t->scalar_type() == at::kFloat) *t->mutable_data_ptr<float>() += 1.0f;
  else *t->mutable_data_ptr<double>() += 1.0;
  if (!t->is_inference()) t->unsafeGetTensorImpl()->bump_version();
  return true;
}

bool tensor_info(PyObject* obj, TensorInfo& out, std::string& why) {
  if (!THPVariable_Check(obj)) {
    why = "not a tensor";
    return false;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined()) return why = "undefined tensor", false;
  if (t.layout() != c10::kStrided) return why = "non-strided tensor layout", false;
  if (t.is_quantized()) return why = "quantized tensor", false;
  if (t.is_nested()) return why = "nested tensor", false;
  if (t.is_neg() || t.is_conj()) return why = "tensor with a lazy negation/conjugation bit", false;
  if (t.key_set().has(c10::DispatchKey::Python)) return why = "tensor subclass with __torch_dispatch__", false;
  // torch.func's transforms (grad, vmap, jvp) wrap tensors in ones with no storage of their own
  if (!t.has_storage())
    return why = "a tensor of a torch.func transform (grad, vmap): kiln's kernels would read memory it does not own", false;
  if (!has_plain_torch_function(Py_TYPE(obj)))
    return why = std::string("tensor subclass ") + Py_TYPE(obj)->tp_name + " (its __torch_function__ decides results)", false;
  // meta: the layouts capture works out for torch_call results (inputs on meta are refused
  // by the caller: kiln's kernels would read their memory)
  if (t.device().type() != c10::DeviceType::CPU && t.device().type() != c10::DeviceType::CUDA &&
      t.device().type() != c10::DeviceType::Meta)
    return why = "tensor on device " + t.device().str(), false;
  out.meta = t.is_meta();
  out.dtype_supported = to_kiln(t.scalar_type(), out.dtype);
  if (!out.dtype_supported) return why = std::string("dtype ") + c10::toString(t.scalar_type()), false;
  out.device.type = t.is_cuda() ? DeviceType::CUDA : DeviceType::CPU;
  out.device.index = t.is_cuda() ? t.device().index() : -1;
  out.sizes.assign(t.sizes().begin(), t.sizes().end());
  out.strides.assign(t.strides().begin(), t.strides().end());
  out.requires_grad = t.requires_grad();
  out.type = Py_TYPE(obj);
  return true;
}

int64_t SymbolBindings::value_of(const sym::Expr& e) const {
  if (auto c = e.as_const()) return *c;
  bool overflow = false;
  const int64_t r = sym::evaluate(e, [this](const sym::Expr& v) -> int64_t {
    for (size_t i = 0; i < symbols->size(); ++i)
      if ((*symbols)[i] == v) return values[i];
    return -1;
  }, overflow);
  // past int64 no fact holds (== 0 and >= 0 both fail on the minimum): the entry is not used
  return overflow ? INT64_MIN : r;
}

bool tensor_matches(PyObject* obj, const TensorInfo& info, std::string* why, SymbolBindings* bindings) {
  if (Py_TYPE(obj) != info.type) {
    if (why) *why = "type changed";
    return false;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  DType d;
  if (!to_kiln(t.scalar_type(), d) || d != info.dtype) {
    if (why) *why = "dtype changed";
    return false;
  }
  bool cuda = t.is_cuda();
  if (cuda != (info.device.type == DeviceType::CUDA) || (cuda && t.device().index() != info.device.index)) {
    if (why) *why = "device changed";
    return false;
  }
  auto sizes = t.sizes();
  auto strides = t.strides();
  if (!info.size_symbols.empty() && bindings) {
    if (sizes.size() != info.sizes.size()) {
      if (why) *why = "dim changed";
      return false;
    }
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int k = info.size_symbols[d];
      if (k < 0) {
        if (sizes[d] != info.sizes[d]) {
          if (why) *why = "size of dim " + std::to_string(d) + " changed";
          return false;
        }
        continue;
      }
      int64_t& bound = bindings->values[k];
      if (sizes[d] < 2) {
        if (why) *why = "dim " + std::to_string(d) + " of dynamic size " + (*bindings->symbols)[k].str() + " is " +
                        std::to_string(sizes[d]) + " (sizes 0 and 1 are specialized)";
        return false;
      }
      if (bound >= 0 && bound != sizes[d]) {
        if (why) *why = "dim " + std::to_string(d) + " is " + std::to_string(sizes[d]) + ", no longer equal to " +
                        (*bindings->symbols)[k].str() + " = " + std::to_string(bound);
        return false;
      }
      bound = sizes[d];
    }
    for (size_t d = 0; d < strides.size(); ++d) {
      if (sizes[d] == 1) continue;  // a size-1 dim's stride never matters
      if (strides[d] != bindings->value_of(info.stride_exprs[d])) {
        if (why) *why = "stride changed";
        return false;
      }
    }
  } else {
    if (sizes.size() != info.sizes.size() || !std::equal(sizes.begin(), sizes.end(), info.sizes.begin())) {
      if (why) *why = "size changed";
      return false;
    }
    if (!std::equal(strides.begin(), strides.end(), info.strides.begin())) {
      if (why) *why = "stride changed";
      return false;
    }
  }
  if (t.requires_grad() != info.requires_grad) {
    if (why) *why = "requires_grad changed";
    return false;
  }
  if (t.layout() != c10::kStrided || t.is_neg() || t.is_conj()) {
    if (why) *why = "layout changed";
    return false;
  }
  return true;
}

PyObject* torch_dtype_object(DType t) { return reinterpret_cast<PyObject*>(torch::getTHPDtype(to_torch(t))); }

PyObject* torch_device_object(const Device& d) {
  static PyObject* cpu = nullptr;
  static PyObject* cuda[64] = {};
  if (d.type == DeviceType::CPU) {
    if (!cpu) cpu = THPDevice_New(c10::Device(c10::DeviceType::CPU));
    return cpu;
  }
  int i = d.index < 0 ? 0 : d.index;
  if (!cuda[i]) cuda[i] = THPDevice_New(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(i)));
  return cuda[i];
}

bool dtype_from_object(PyObject* obj, DType& out) {
  if (!THPDtype_Check(obj)) return false;
  return to_kiln(reinterpret_cast<THPDtype*>(obj)->scalar_type, out);
}

PyObject* wrapped_number_tensor(PyObject* number) {
  c10::Scalar s;
  if (PyBool_Check(number)) s = c10::Scalar(number == Py_True);
  else if (PyLong_Check(number)) s = c10::Scalar(static_cast<int64_t>(PyLong_AsLongLong(number)));
  else s = c10::Scalar(PyFloat_AsDouble(number));
  at::Tensor t = c10::scalar_to_tensor(s);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return THPVariable_Wrap(std::move(t));
}

bool grad_enabled() { return c10::GradMode::is_enabled(); }
bool deterministic_algorithms() { return at::globalContext().deterministicAlgorithms(); }
bool deterministic_algorithms_warn_only() { return at::globalContext().deterministicAlgorithmsWarnOnly(); }

DType default_dtype() {
  DType out = DType::Float32;
  to_kiln(c10::typeMetaToScalarType(c10::get_default_dtype()), out);
  return out;
}

bool set_grad_enabled(bool on) {
  const bool was = c10::GradMode::is_enabled();
  c10::GradMode::set_enabled(on);
  return was;
}

AutocastState autocast_state() {
  AutocastState s;
  s.cpu = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
  s.cuda = at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
  // The dtypes too where autocast is off: a torch.autocast region inside the function takes
  // the device's dtype from here when it names none.
  to_kiln(at::autocast::get_autocast_dtype(c10::DeviceType::CPU), s.cpu_dtype);
  to_kiln(at::autocast::get_autocast_dtype(c10::DeviceType::CUDA), s.cuda_dtype);
  return s;
}

void set_autocast_state(const AutocastState& s) {
  at::autocast::set_autocast_enabled(c10::DeviceType::CPU, s.cpu);
  at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, s.cuda);
  at::autocast::set_autocast_dtype(c10::DeviceType::CPU, to_torch(s.cpu_dtype));
  at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, to_torch(s.cuda_dtype));
}

std::string AutocastState::str() const {
  auto one = [](bool on, DType t) { return std::string(on ? "" : "off, ") + dtype_name(t); };
  return "cpu=" + one(cpu, cpu_dtype) + " cuda=" + one(cuda, cuda_dtype);
}

bool is_ndarray(PyObject* obj) {
  static PyObject* ndarray = nullptr;  // found once NumPy is imported (kiln never imports it)
  if (!ndarray) {
    PyObject* name = PyUnicode_FromString("numpy");
    PyObject* np = name ? PyImport_GetModule(name) : nullptr;
    Py_XDECREF(name);
    if (np) ndarray = PyObject_GetAttrString(np, "ndarray");
    Py_XDECREF(np);
    if (!ndarray) {
      PyErr_Clear();
      return false;
    }
  }
  return reinterpret_cast<PyObject*>(Py_TYPE(obj)) == ndarray;
}

PyObject* tensor_from_ndarray(PyObject* arr) {
  try {
    // A read-only array is taken too (torch warns of it; kiln never writes into an input it
    // did not see written in the function).
    return THPVariable_Wrap(torch::utils::tensor_from_numpy(arr, /*warn_if_not_writeable=*/false));
  } catch (...) {
    PyErr_Clear();
    return nullptr;
  }
}

PyObject* ndarray_from_tensor(PyObject* t) {
  if (!THPVariable_Check(t)) {
    PyErr_SetString(PyExc_TypeError, "kiln: an ndarray output that is not a tensor");
    return nullptr;
  }
  try {
    return torch::utils::tensor_to_numpy(THPVariable_Unpack(t), /*force=*/false);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

}  // namespace kiln::bind
