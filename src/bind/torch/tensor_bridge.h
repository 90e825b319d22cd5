// The binding layer's window onto torch tensors, with no torch headers: the capture and guard
// code includes this; only tensor_bridge.cpp sees torch's C++ API.
#pragma once
#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/ir/dtype.h"
#include "core/sym/expr.h"

namespace kiln::bind {

struct TensorInfo {
  DType dtype = DType::Float32;
  bool dtype_supported = true;  // false for complex, fp8, ... (kiln leaves those to eager)
  Device device;
  std::vector<int64_t> sizes, strides;
  bool requires_grad = false;
  bool meta = false;  // on the meta device: a layout without memory
  PyTypeObject* type = nullptr;
  // A shape-generic guard (dynamic dims): per dim, the index of its size symbol in the guard
  // set's symbol table, or -1 where the size must equal sizes[d]; and the strides as
  // expressions of the symbols. Empty: every size and stride must be equal.
  std::vector<int> size_symbols;
  std::vector<sym::Expr> stride_exprs;
};

// The values of a guard set's size symbols during one check: -1 until a tensor binds it.
struct SymbolBindings {
  const std::vector<sym::Expr>* symbols = nullptr;
  std::vector<int64_t> values;
  int64_t value_of(const sym::Expr& e) const;
};

// True for torch.Tensor and its subclasses (Parameter included).
bool is_tensor(PyObject* obj);
// Reads metadata of a tensor; false (with a reason) for tensors kiln does not take
// (sparse, quantized, nested, meta, ...).
bool tensor_info(PyObject* obj, TensorInfo& out, std::string& why);

// Fast guard check: does `obj` still match `info`? Compares type, dtype, device, sizes,
// strides and requires_grad. Fills `why` with the first mismatch.
// A shape-generic `info` binds its symbols in `bindings` (a dim of size 0 or 1 never matches a
// symbol; a symbol met again must have the same value: duck sizing) and checks its strides.
bool tensor_matches(PyObject* obj, const TensorInfo& info, std::string* why, SymbolBindings* bindings = nullptr);

// torch.dtype / torch.device objects for a kiln dtype/device (borrowed references).
PyObject* torch_dtype_object(DType t);
PyObject* torch_device_object(const Device& d);
// The kiln dtype of a torch.dtype object, if kiln has one.
bool dtype_from_object(PyObject* obj, DType& out);

// A Python number as torch's operators take it where a tensor is expected: a 0-d CPU tensor
// marked as a wrapped number (it takes part in type promotion by category only). New reference.
PyObject* wrapped_number_tensor(PyObject* number);

bool grad_enabled();
// torch.get_default_dtype() (Float32 where torch's is one kiln lacks).
DType default_dtype();
// torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
bool deterministic_algorithms();
bool deterministic_algorithms_warn_only();
// Turns grad mode on or off for this thread; returns what it was.
bool set_grad_enabled(bool on);

// The memory a tensor's storage starts at (tensors that share storage share it); nullptr for a
// non-tensor.
const void* storage_of(PyObject* obj);
// t.size(dim) of a tensor.
int64_t tensor_dim_size(PyObject* t, int dim);
// A 0-d int64 CPU tensor holding a seed drawn from torch's default CPU generator (so
// torch.manual_seed makes it reproducible). New reference; nullptr with a Python error set.
PyObject* fresh_seed();
// t.detach() (new reference; nullptr with a Python error set).
PyObject* detached(PyObject* t);
// dst.copy_(src) for two tensors (an in-place update of an input, written back after the
// graph), without autograd; where src already is dst's elements (an update made in place), only
// dst's version is counted, unless `bump` is false (torch's own in-place op counted it). False
// with a Python error set when torch raises.
bool copy_into(PyObject* dst, PyObject* src, bool bump = true);
// t._version (-1 where t is not a tensor or is an inference tensor, which counts none)
int64_t tensor_version(PyObject* t);

// The value of a 0-d floating CPU tensor, read without dispatch (an optimizer's step count);
// false with a Python error set for anything else.
bool cpu_scalar_value(PyObject* t, double& out);
// Adds one to such a tensor in place, bumping its version as torch's add_ does.
bool add_one_in_place(PyObject* t);

// NumPy arrays at the boundary of a compiled function (capture/numpy.cpp): an input ndarray is
// read as the tensor torch.from_numpy makes of it, an output handed out as Tensor.numpy()'s
// ndarray; both share memory with what they are made from.
// Exactly numpy.ndarray (no subclass: np.matrix and masked arrays behave otherwise); false
// when NumPy was never imported.
bool is_ndarray(PyObject* obj);
// torch.from_numpy(arr) as a new reference; nullptr, with no error set, for an array it refuses
// (a dtype torch lacks, strides that are not a multiple of the item size, byte-swapped data).
PyObject* tensor_from_ndarray(PyObject* arr);
// t.numpy() as a new reference; nullptr with a Python error set.
PyObject* ndarray_from_tensor(PyObject* t);

// torch.autocast's state for the device types kiln compiles for: whether it is on, and its dtype.
struct AutocastState {
  bool cpu = false, cuda = false;
  DType cpu_dtype = DType::BFloat16, cuda_dtype = DType::Float16;
  bool any() const { return cpu || cuda; }
  bool on(DeviceType t) const { return t == DeviceType::CUDA ? cuda : cpu; }
  DType dtype(DeviceType t) const { return t == DeviceType::CUDA ? cuda_dtype : cpu_dtype; }
  bool operator==(const AutocastState&) const = default;
  std::string str() const;
};
AutocastState autocast_state();
// Sets torch.autocast's state for both devices (what a with block's modes are, at a graph break
// inside it).
void set_autocast_state(const AutocastState& s);

}  // namespace kiln::bind
