// The other place (with torch/tensor_bridge.cpp) that sees torch's C++ API.
#include "bind/runtime/executor.h"
#include "bind/runtime/output_pool.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/core/stack.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <functional>

#include "bind/capture/torch_call.h"
#include "core/codegen/cuda_codegen.h"
#include "core/support/log.h"
#include "core/compile/cuda_driver.h"

namespace kiln::bind {

namespace {

// profile_steps' state. Read once per program run when off; the GIL guards it.
struct StepProfile {
  bool on = false;
  std::vector<StepTime> times;
  std::unordered_map<std::string, size_t> index;
  void add(const std::string& label, double seconds) {
    auto [it, fresh] = index.emplace(label, times.size());
    if (fresh) times.push_back({label, 0, 0});
    times[it->second].seconds += seconds;
    times[it->second].runs += 1;
  }
};
StepProfile& step_profile() {
  static StepProfile p;
  return p;
}

std::string step_label(const loop::Program& p, const pipeline::CompiledGraph& cg, const loop::Step& st) {
  return st.kind == loop::Step::Kind::Kernel ? "kernel " + cg.kernels[st.index].name : p.externs[st.index].label();
}

}  // namespace

using sym::Expr;

namespace {

c10::ScalarType scalar_type(DType t) {
  static const c10::ScalarType map[] = {c10::ScalarType::Bool,  c10::ScalarType::Byte,  c10::ScalarType::Char,
                                        c10::ScalarType::Short, c10::ScalarType::Int,   c10::ScalarType::Long,
                                        c10::ScalarType::Half,  c10::ScalarType::BFloat16, c10::ScalarType::Float,
                                        c10::ScalarType::Double};
  return map[static_cast<int>(t)];
}

// Values of the size symbols of one call (empty for a program of constant sizes).
struct SymbolValues {
  const std::vector<loop::SymbolBinding>* symbols = nullptr;
  std::vector<int64_t> values;
  int64_t operator()(const Expr& e) const {
    if (auto c = e.as_const()) return *c;
    bool overflow = false;
    const int64_t r = sym::evaluate(e, [this](const Expr& v) {
      for (size_t i = 0; i < symbols->size(); ++i)
        if ((*symbols)[i].symbol == v) return values[i];
      throw std::runtime_error("kiln: unbound size symbol " + v.str());
    }, overflow);
    // A size, stride or loop range of this call past int64: torch raises, so does kiln (a
    // wrapped value would size buffers and loops wrongly).
    if (overflow) throw std::overflow_error("kiln: a size of this call overflows int64 (" + e.str() + ")");
    return r;
  }
};

std::vector<int64_t> ints(const std::vector<Expr>& xs, const SymbolValues& sv) {
  std::vector<int64_t> out;
  for (const Expr& e : xs) out.push_back(sv(e));
  return out;
}

c10::Device device_of(const Device& d) {
  if (d.type == DeviceType::CPU) return c10::Device(c10::DeviceType::CPU);
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(d.index < 0 ? 0 : d.index));
}

c10::IValue attr_ivalue(const ir::AttrValue& v) {
  struct V {
    c10::IValue operator()(int64_t i) const { return c10::IValue(i); }
    c10::IValue operator()(double d) const { return c10::IValue(d); }
    c10::IValue operator()(bool b) const { return c10::IValue(b); }
    c10::IValue operator()(const std::vector<int64_t>& l) const { return c10::IValue(l); }
    c10::IValue operator()(const std::string& s) const { return c10::IValue(s); }
    c10::IValue operator()(DType t) const { return c10::IValue(scalar_type(t)); }
    c10::IValue operator()(const std::vector<sym::Expr>& l) const {
      std::vector<int64_t> out;
      for (const sym::Expr& e : l) out.push_back(operator()(e).toInt());
      return c10::IValue(out);
    }
    c10::IValue operator()(const sym::Expr& e) const {
      if (auto c = e.as_const()) return c10::IValue(*c);
      throw std::runtime_error("kiln: a symbolic size reached an extern operator's arguments");
    }
  };
  return std::visit(V{}, v);
}

// A buffer view with its sizes resolved once, at prepare time.
struct ViewPlan {
  int buffer = -1;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};

ViewPlan plan_view(const loop::BufferView& v, const SymbolValues& sv) {
  if (v.buffer < 0) return {};
  return {v.buffer, ints(v.sizes, sv), ints(v.strides, sv), sv(v.offset)};
}

// The tensor a view describes: the buffer's own tensor when the view covers it as it is.
at::Tensor view_of(const at::Tensor& base, const ViewPlan& v) {
  if (v.offset == 0 && base.sizes().equals(v.sizes) && base.strides().equals(v.strides)) return base;
  // An empty view reads nothing: where it starts is immaterial, and the index arithmetic of an
  // empty iteration space can put it before the buffer (a stack of empty tensors: -1).
  const bool empty = std::find(v.sizes.begin(), v.sizes.end(), 0) != v.sizes.end();
  return base.as_strided(v.sizes, v.strides, base.storage_offset() + (empty ? 0 : v.offset));
}

struct ExternPlan {
  std::optional<c10::OperatorHandle> op;  // none: a torch_call, `call` below
  const ops::OpDef* def;
  // A torch_call's registered call: its in-place form where the graph lets it update an input
  // where it lies (passes::reinplace_input_updates), resolved once here rather than per call.
  const TorchCall* call = nullptr;
  std::vector<Expr> sym_args;  // its symbolic int arguments (`sym_args`), evaluated per call
  // A gradient node (aten_vjp, or a torch_call with `vjp_input`): the nodes made for one
  // forward call share `vjp_group`; the first of them to run computes the gradients of every
  // input in `vjp_wanted` (the group's nodes this program kept) from one forward and one
  // backward, and the others take theirs from the run's stash.
  int64_t vjp_group = -1, vjp_input = -1;
  std::vector<int64_t> vjp_wanted;
  size_t result = 0;  // which of the kernel's results the node is (convolution_backward's)
  // conv2d_prepacked where torch has oneDNN: its convolution and weight reorder, and the packed
  // weight kept with what it was made from (the weight buffer's tensor, memory and version, and
  // the input's sizes, which oneDNN's choice of format depends on).
  struct PackedConv {
    c10::OperatorHandle conv, reorder;
    at::Tensor weight, packed;
    const void* memory = nullptr;
    int64_t version = -1;
    std::vector<int64_t> input_sizes;
  };
  std::shared_ptr<PackedConv> packed;
};

// A conv2d attribute as two ints (an int[2] given as one int is repeated, as torch does).
std::vector<int64_t> spatial_pair(const ir::Attrs& a, const char* key, int64_t dflt) {
  std::vector<int64_t> v = a.has(key) ? a.get_ints(key) : std::vector<int64_t>{dflt};
  if (v.size() == 1) v.push_back(v[0]);
  return v;
}

// conv2d_prepacked: the weight reordered for oneDNN when it is not the one packed last, then
// oneDNN's convolution with the packed weight (no fused operation: attr "none").
at::Tensor run_packed_conv(ExternPlan::PackedConv& pc, const ir::Attrs& attrs, const at::Tensor& x,
                           const at::Tensor& weight_buffer, const at::Tensor& w, const c10::IValue& bias) {
  const std::vector<int64_t> padding = spatial_pair(attrs, "padding", 0), stride = spatial_pair(attrs, "stride", 1),
                             dilation = spatial_pair(attrs, "dilation", 1);
  const int64_t groups = attrs.get_int("groups", 1);
  if (!pc.packed.defined() || !weight_buffer.is_same(pc.weight) || weight_buffer.data_ptr() != pc.memory ||
      weight_buffer._version() != pc.version || !x.sizes().equals(pc.input_sizes)) {
    torch::jit::Stack st{c10::IValue(w), c10::IValue(padding), c10::IValue(stride), c10::IValue(dilation),
                         c10::IValue(groups), c10::IValue(x.sizes().vec())};
    {
      GilRelease unlocked;
      pc.reorder.callBoxed(&st);
    }
    pc.packed = st[0].toTensor();
    pc.weight = weight_buffer;
    pc.memory = weight_buffer.data_ptr();
    pc.version = weight_buffer._version();
    pc.input_sizes = x.sizes().vec();
  }
  torch::jit::Stack st{c10::IValue(x), c10::IValue(pc.packed), bias, c10::IValue(padding), c10::IValue(stride),
                       c10::IValue(dilation), c10::IValue(groups), c10::IValue(std::string("none")),
                       c10::IValue(c10::List<std::optional<c10::Scalar>>()), c10::IValue()};
  {
    GilRelease unlocked;
    pc.conv.callBoxed(&st);
  }
  return st[0].toTensor();
}

// An extern's tensors, with sizes resolved.
struct ExternViews {
  std::vector<ViewPlan> inputs;
  std::vector<int64_t> out_strides;
};

// An extern op's arguments in its schema's order: the i-th tensor parameter from `tensor(i)`,
// the others from the node's attributes, else their defaults, else None.
void push_arguments(torch::jit::Stack& stack, const ops::OpDef& def, const ir::Attrs& attrs,
                    const std::function<c10::IValue(size_t)>& tensor) {
  size_t next_input = 0;
  for (const ops::Param& param : def.schema.params) {
    if (param.is_tensor()) {
      stack.push_back(tensor(next_input++));
    } else if (const ir::AttrValue* a = attrs.find(param.name)) {
      const auto* ints = std::get_if<std::vector<int64_t>>(a);
      const auto* one = std::get_if<int64_t>(a);
      if (ints && param.type.rfind("bool[", 0) == 0) {  // a mask (convolution_backward's output_mask)
        c10::List<bool> mask;
        for (int64_t v : *ints) mask.push_back(v != 0);
        stack.push_back(c10::IValue(mask));
      } else if (one && param.is_int_list()) {  // stride=2 for int[2] stride: torch repeats it
        stack.push_back(c10::IValue(std::vector<int64_t>(std::max<size_t>(param.list_size(), 1), *one)));
      } else if (one && (param.type == "float" || param.type == "float?")) {  // dropout_p=0, scale=1
        stack.push_back(c10::IValue(static_cast<double>(*one)));
      } else {
        stack.push_back(attr_ivalue(*a));
      }
    } else if (auto d = param.default_value()) {
      stack.push_back(attr_ivalue(*d));
    } else {
      stack.emplace_back();  // None
    }
  }
}

// Raises a torch error as the Python exception type eager would raise.
void set_python_error(const c10::Error& e) {
  PyObject* type = PyExc_RuntimeError;
  if (dynamic_cast<const c10::IndexError*>(&e)) type = PyExc_IndexError;
  else if (dynamic_cast<const c10::ValueError*>(&e)) type = PyExc_ValueError;
  else if (dynamic_cast<const c10::TypeError*>(&e)) type = PyExc_TypeError;
  else if (dynamic_cast<const c10::NotImplementedError*>(&e)) type = PyExc_NotImplementedError;
  PyErr_SetString(type, e.what_without_backtrace());
}

}  // namespace

namespace {

// Whether a tensor's strides index its elements as `strides` do: dims of size 1 (and empty
// tensors) do not care what their strides are.
bool same_layout(const at::Tensor& t, const std::vector<int64_t>& strides) {
  if (t.numel() == 0) return true;
  if (static_cast<size_t>(t.dim()) != strides.size()) return false;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1 && t.stride(d) != strides[d]) return false;
  return true;
}

// The gradients autograd gives for `wrt` from `out` and its gradient `grad`: zeros (row-major)
// for an input `out` does not depend on, as eager's autograd.grad(allow_unused) then materialized.
std::vector<at::Tensor> gradients_of(const at::Tensor& out, const std::vector<at::Tensor>& wrt, const at::Tensor& grad) {
  std::vector<at::Tensor> result(wrt.size());
  if (out.requires_grad()) {
    GilRelease unlocked;  // autograd's engine may run nodes on threads of its own
    result = torch::autograd::grad({out}, wrt, {grad}, /*retain_graph=*/false, /*create_graph=*/false,
                                   /*allow_unused=*/true);
  }
  for (size_t i = 0; i < wrt.size(); ++i)
    result[i] = result[i].defined() ? result[i].detach() : at::zeros_like(wrt[i], at::MemoryFormat::Contiguous);
  return result;
}

// The call's inputs as leaves for a gradient: detached, those in `wanted` requiring grad.
at::Tensor vjp_leaf(const at::Tensor& t, int64_t i, const std::vector<int64_t>& wanted, std::vector<at::Tensor>& wrt) {
  const bool want = std::find(wanted.begin(), wanted.end(), i) != wanted.end();
  at::Tensor leaf = t.detach().requires_grad_(want);
  if (want) wrt[static_cast<size_t>(std::find(wanted.begin(), wanted.end(), i) - wanted.begin())] = leaf;
  return leaf;
}

// Calls a torch_call's registered function with `ins` in its tensor slots; `out` gets the
// result (the element `call.output` of a tuple). False with a Python error set.
bool call_registered(const loop::Extern& e, const TorchCall& call, const std::vector<at::Tensor>& tensors,
                     const std::vector<Expr>& sym_args, const SymbolValues& symbols, at::Tensor& out) {
  std::vector<PyObject*> ins;
  for (const at::Tensor& t : tensors) ins.push_back(THPVariable_Wrap(t));
  std::vector<int64_t> syms;  // the call's symbolic ints (an indexed assignment's position)
  for (const Expr& x : sym_args) syms.push_back(symbols(x));
  PyObject* args = substitute(call.args, ins.data(), syms.data());
  PyObject* kwargs = args && call.kwargs ? substitute(call.kwargs, ins.data(), syms.data()) : nullptr;
  PyObject* r = args && (kwargs || !call.kwargs) ? PyObject_Call(call.fn, args, kwargs) : nullptr;
  Py_XDECREF(args);
  Py_XDECREF(kwargs);
  for (PyObject* o : ins) Py_DECREF(o);
  if (!r) return false;
  PyObject* t = call.output >= 0 ? (PyTuple_Check(r) ? PyTuple_GetItem(r, call.output) : nullptr) : r;
  if (!t || !THPVariable_Check(t)) {
    Py_DECREF(r);
    PyErr_Format(PyExc_RuntimeError, "kiln: %s did not return the tensor capture saw", e.attrs.get_str("target").c_str());
    return false;
  }
  out = THPVariable_Unpack(t);
  Py_DECREF(r);
  return true;
}

// A torch_call: the operator called from Python with this run's tensors, its sizes checked
// against what capture inferred.
bool run_torch_call(const loop::Extern& e, const TorchCall& call, const std::vector<Expr>& sym_args,
                    const ExternViews& plan, const std::vector<at::Tensor>& tensors, const SymbolValues& symbols,
                    const std::vector<int64_t>& expect_sizes, at::Tensor& out) {
  std::vector<at::Tensor> ins;
  for (const ViewPlan& v : plan.inputs) ins.push_back(view_of(tensors[v.buffer], v));
  if (!call_registered(e, call, ins, sym_args, symbols, out)) return false;
  if (out.sizes() != c10::IntArrayRef(expect_sizes)) {
    // Capture inferred these sizes from the operator's behaviour at other sizes (sym/fit.h):
    // a result that breaks the inference stops the call rather than being misread.
    std::string got, want;
    for (int64_t s : out.sizes()) got += (got.empty() ? "" : ", ") + std::to_string(s);
    for (int64_t s : expect_sizes) want += (want.empty() ? "" : ", ") + std::to_string(s);
    PyErr_Format(PyExc_RuntimeError, "kiln: %s returned sizes [%s] where its compiled graph expects [%s]",
                 e.attrs.get_str("target").c_str(), got.c_str(), want.c_str());
    return false;
  }
  return true;
}

// The gradients of a torch_call's inputs `wanted` (the nodes' `vjp_input`s): the call's inputs
// are followed by the result's gradient; the call runs again with grad on, and autograd gives
// every wanted gradient from that one forward.
bool torch_call_vjp(const loop::Extern& e, const TorchCall& call, const std::vector<Expr>& sym_args, const ExternViews& plan,
                    const std::vector<at::Tensor>& tensors, const SymbolValues& symbols,
                    const std::vector<int64_t>& wanted, std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> ins, wrt(wanted.size());
  for (size_t i = 0; i + 1 < plan.inputs.size(); ++i)
    ins.push_back(vjp_leaf(view_of(tensors[plan.inputs[i].buffer], plan.inputs[i]), static_cast<int64_t>(i), wanted, wrt));
  at::Tensor out;
  {
    torch::autograd::AutoGradMode grad_on(true);
    if (!call_registered(e, call, ins, sym_args, symbols, out)) return false;
  }
  const ViewPlan& g = plan.inputs.back();
  grads = gradients_of(out, wrt, view_of(tensors[g.buffer], g));
  return true;
}

// The gradients of inputs `wanted` of kernel `op` (arguments ordered by the registry op `def`'s
// schema), given the result's gradient (the nodes' last input): the kernel runs again with grad
// on, and torch's autograd gives every wanted gradient from that one forward.
std::vector<at::Tensor> kernel_vjp(const c10::OperatorHandle& op, const ops::OpDef& def, const ir::Attrs& attrs,
                                   const ExternViews& views, const std::vector<at::Tensor>& tensors,
                                   const std::vector<int64_t>& wanted) {
  std::vector<at::Tensor> wrt(wanted.size());
  torch::jit::Stack stack;
  push_arguments(stack, def, attrs, [&](size_t i) -> c10::IValue {
    const ViewPlan& v = views.inputs[i];
    if (v.buffer < 0) return {};
    return vjp_leaf(view_of(tensors[v.buffer], v), static_cast<int64_t>(i), wanted, wrt);
  });
  // Parameters of kiln's schema past the kernel's (max_pool2d's return_indices) are not passed.
  if (stack.size() > op.schema().arguments().size()) stack.resize(op.schema().arguments().size());
  if (log_enabled("vjp")) {  // what torch's kernel is given: its layouts pick its backward
    std::string text = op.schema().name() + "(";
    for (const c10::IValue& v : stack) {
      if (!v.isTensor()) {
        text += (v.isNone() ? std::string("None") : v.tagKind()) + ", ";
        continue;
      }
      const at::Tensor& t = v.toTensor();
      text += std::string(c10::toString(t.scalar_type())) + t.device().str() + "[";
      for (int64_t d = 0; d < t.dim(); ++d) text += std::to_string(t.size(d)) + ":" + std::to_string(t.stride(d)) + ",";
      text += t.requires_grad() ? "] grad, " : "], ";
    }
    log("vjp", text + ")");
  }
  at::Tensor out;
  {
    GilRelease unlocked;
    torch::autograd::AutoGradMode grad_on(true);
    op.callBoxed(&stack);
    out = stack[0].toTensor();
  }
  const ViewPlan& g = views.inputs.back();
  return gradients_of(out, wrt, view_of(tensors[g.buffer], g));
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// `t` at a fresh, aligned address: the bytes its strides span copied, so the copy has its sizes
// and strides whatever they are (expanded dims included). For a buffer whose kernels assume a
// 16-byte-aligned pointer (schedule/alignment.cpp) that `t` does not have.
at::Tensor aligned_copy(const at::Tensor& t) {
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  const int64_t bytes = span * static_cast<int64_t>(t.element_size());
  const auto byte_options = t.options().dtype(at::kByte);
  at::Tensor src = at::empty({0}, byte_options).set_(t.storage(), t.storage_offset() * t.element_size(), {bytes}, {1});
  at::Tensor dst = at::empty({bytes}, byte_options);
  dst.copy_(src);
  return dst.view(t.scalar_type()).as_strided(t.sizes(), t.strides(), 0);
}

// A tensor in the strides its buffer was planned with (kernels index by them), and aligned where
// the kernels assume it: itself, or a copy. `what`: the extern, named in the "copies" log
// (KILN_LOGS=copies), which says where a step's copies come from.
at::Tensor laid_out(at::Tensor t, const std::vector<int64_t>& strides, bool aligned, const loop::Extern& what) {
  if (same_layout(t, strides)) {
    if (!aligned || t.numel() == 0 || aligned16(t.data_ptr())) return t;
    if (log_enabled("copies")) log("copies", what.op + " " + what.aten + " " + what.attrs.get_str("target", "") + ": copied to an aligned address");
    return aligned_copy(t);
  }
  if (log_enabled("copies")) {
    std::string got, want;
    for (int64_t s : t.strides()) got += std::to_string(s) + ",";
    for (int64_t s : strides) want += std::to_string(s) + ",";
    log("copies", what.op + " " + what.aten + " " + what.attrs.get_str("target", "") + ": strides [" + got + "] laid out as [" + want + "]");
  }
  at::Tensor laid = at::empty_strided(t.sizes(), strides, t.options());
  laid.copy_(t);
  return laid;
}

}  // namespace

// Every size of one call: resolved once at prepare time when the program's sizes are constant,
// at each call from the inputs' sizes when it is shape-generic.
struct Resolved {
  SymbolValues symbols;
  std::vector<int64_t> slot_bytes;
  std::vector<std::vector<int64_t>> sizes, strides;  // of each buffer
  std::vector<ExternViews> externs;
  std::vector<ViewPlan> outputs;
  std::vector<unsigned> grids;  // CUDA launches
};

struct PreparedProgram {
  std::vector<ExternPlan> externs;
  // Inputs on another device than the program's that kernels read (a 0-d CPU tensor in a GPU
  // op, as eager allows): copied to the program's device per call, never read across devices.
  std::vector<size_t> moved_inputs;
  // Inputs that kernels read assuming a 16-byte-aligned pointer (schedule/alignment.cpp): one that
  // is not aligned is copied per call for the kernels (its own tensor still goes to torch's ops).
  std::vector<size_t> aligned_inputs;
  std::vector<bool> extern_output;  // buffers that extern ops allocate themselves
  bool symbolic = false;
  const std::vector<loop::SymbolBinding>* symbols_desc = nullptr;
  Resolved fixed;                   // !symbolic
  // Lifetimes, per step: tensors of kiln's own made just before the step that first touches
  // them, and every buffer no later step reads dropped right after its last step, as eager
  // frees what it no longer needs. Holding a whole model's intermediates to the end of the
  // call made the allocator hand out fresh pages on every call.
  std::vector<std::vector<int>> make_before, drop_after;            // buffers
  std::vector<std::vector<int>> make_slot_before, drop_slot_after;  // reuse slots
  // Inputs a consuming run (run_program_consuming) lets go: per step, the input buffers it read
  // last (not those an output is or views), and those no step reads; per input, whether an
  // output is that input itself.
  std::vector<std::vector<int>> input_drop_after;
  std::vector<int> unread_inputs;
  std::vector<bool> input_returned;
  std::vector<int> slot_of;  // per buffer: the reuse slot it lives in, or -1
  bool has_cuda = false;
  std::vector<std::vector<int>> kernel_scalar_args;  // per kernel: the scalar arguments a CUDA launch passes
  // Foreach groups (Program::foreach_groups): per kernel its group or -1, and per group its
  // table's layout with the extents and block starts filled in (addresses and arguments per call).
  std::vector<int> group_of;
  std::vector<codegen::ForeachTable> foreach_layouts;
  std::vector<std::vector<uint64_t>> foreach_tables;
  // CPU programs keep their temporaries' memory from one call to the next (kept_buffers,
  // kept_slots), as torch's caching allocator keeps GPU memory: a fresh multi-megabyte
  // allocation per call is fresh pages, and their first-touch faults serialize in the kernel
  // (mobilenet_v2 batch 4 on 2 cores: 73 ms a call, 42 ms with no page returned to the OS).
  // A kept tensor is reused only where nothing else holds its storage; a call while another
  // runs the same program (another thread) allocates its own.
  bool keeps_memory = false;
  std::atomic<bool> busy{false};
  std::vector<at::Tensor> kept_buffers, kept_slots;
  // Outputs' memory comes back here when the caller drops them (CPU; output_pool.h).
  std::shared_ptr<OutputPool> output_pool;
};

namespace {

void plan_lifetimes(const loop::Program& p, PreparedProgram& prep) {
  size_t nb = p.buffers.size(), ns = p.steps.size();
  std::vector<int> first(nb, -1), last(nb, -1);
  auto touch = [&](int b, int step) {
    if (b < 0) return;
    if (first[b] < 0) first[b] = step;
    last[b] = step;
  };
  for (size_t i = 0; i < ns; ++i) {
    const loop::Step& st = p.steps[i];
    if (st.kind == loop::Step::Kind::Kernel) {
      for (int b : p.kernels[st.index].buffers) touch(b, static_cast<int>(i));
    } else {
      const loop::Extern& e = p.externs[st.index];
      for (const loop::BufferView& v : e.inputs) touch(v.buffer, static_cast<int>(i));
      touch(e.output, static_cast<int>(i));
    }
  }
  std::vector<bool> keep(nb, false);  // graph inputs and whatever the outputs view
  for (int b : p.inputs) keep[b] = true;
  for (const loop::Output& o : p.outputs)
    if (o.input_alias < 0 && o.view.buffer >= 0) keep[o.view.buffer] = true;
  prep.make_before.assign(ns + 1, {});
  prep.drop_after.assign(ns, {});
  prep.make_slot_before.assign(ns + 1, {});
  prep.drop_slot_after.assign(ns, {});
  std::vector<int> slot_first(p.num_slots, -1), slot_last(p.num_slots, -1);
  prep.slot_of.assign(nb, -1);
  for (const loop::Buffer& b : p.buffers) {
    if (!b.live) continue;
    int f = first[b.id], l = last[b.id];
    if (b.kind == loop::BufferKind::Temp && b.slot >= 0) {
      prep.slot_of[b.id] = b.slot;
      if (f < 0) continue;
      int& sf = slot_first[b.slot];
      sf = sf < 0 ? f : std::min(sf, f);
      slot_last[b.slot] = std::max(slot_last[b.slot], l);
      continue;
    }
    bool own = b.kind == loop::BufferKind::Output || (b.kind == loop::BufferKind::Temp && b.slot < 0);
    // An output nothing writes (f < 0) is still made, before the first step.
    if (own && !prep.extern_output[b.id]) prep.make_before[f < 0 ? 0 : f].push_back(b.id);
    if (!keep[b.id] && l >= 0 && b.kind != loop::BufferKind::Input) prep.drop_after[l].push_back(b.id);
  }
  prep.input_drop_after.assign(ns, {});
  prep.input_returned.assign(p.inputs.size(), false);
  std::vector<bool> output_reads(nb, false);
  for (const loop::Output& o : p.outputs) {
    if (o.input_alias >= 0) prep.input_returned[static_cast<size_t>(o.input_alias)] = true;
    else if (o.view.buffer >= 0) output_reads[o.view.buffer] = true;
  }
  // An input a size symbol is read from is read at the start, whether or not a step reads it
  // (a backward's saved value no kernel reads still gives s0: let go of first, its size was 0).
  std::vector<bool> binds(p.inputs.size(), false);
  for (const loop::SymbolBinding& sb : p.symbols)
    if (sb.input >= 0) binds[static_cast<size_t>(sb.input)] = true;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    const int b = p.inputs[i];
    if (prep.input_returned[i] || output_reads[b]) continue;
    if (last[b] < 0 && binds[i]) {
      if (ns > 0) prep.input_drop_after[0].push_back(b);
    } else if (last[b] < 0) prep.unread_inputs.push_back(b);
    else prep.input_drop_after[last[b]].push_back(b);
  }
  for (int s = 0; s < p.num_slots; ++s) {
    if (slot_first[s] < 0) continue;
    prep.make_slot_before[slot_first[s]].push_back(s);
    prep.drop_slot_after[slot_last[s]].push_back(s);
  }
}

}  // namespace

struct AutocastExcluded::State {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
};
AutocastExcluded::AutocastExcluded() : state_(std::make_unique<State>()) {}
AutocastExcluded::~AutocastExcluded() = default;

namespace {

// Resolves every size of the program for the given symbol values.
void resolve(const pipeline::CompiledGraph& cg, SymbolValues sv, Resolved& r) {
  const loop::Program& p = cg.program;
  r.symbols = std::move(sv);
  r.slot_bytes.assign(p.num_slots, 0);
  r.sizes.clear();
  r.strides.clear();
  for (const loop::Buffer& b : p.buffers) {
    r.sizes.push_back(ints(b.sizes, r.symbols));
    r.strides.push_back(ints(b.strides, r.symbols));
    if (!p.symbols.empty()) {
      // Sizes computed from this call's symbols: a product past int64 (or a negative size) is
      // an error, as torch reports it, never a wrapped size.
      int64_t numel = 1;
      for (int64_t s : r.sizes.back())
        if (s < 0 || __builtin_mul_overflow(numel, s, &numel))
          throw std::overflow_error("kiln: the sizes of a tensor of this call overflow int64 (" + b.name + ")");
    }
    if (b.slot >= 0) r.slot_bytes[b.slot] = std::max(r.slot_bytes[b.slot], r.symbols(b.bytes()));
  }
  for (const loop::Kernel& k : p.kernels) {  // and so is a kernel's iteration space
    if (p.symbols.empty()) break;
    auto check = [&](const std::vector<sym::Expr>& ranges, int64_t n) {
      for (const sym::Expr& e : ranges) {
        const int64_t v = r.symbols(e);
        if (v < 0 || __builtin_mul_overflow(n, v, &n))
          throw std::overflow_error("kiln: the sizes of this call overflow int64 (in " + k.name + ")");
      }
      return n;
    };
    const int64_t outer = check(k.ranges, 1);
    for (const loop::Stage& st : k.stages) check(st.ranges, outer);
  }
  r.externs.clear();
  for (const loop::Extern& e : p.externs) {
    ExternViews v{{}, ints(p.buffers[e.output].strides, r.symbols)};
    for (const loop::BufferView& in : e.inputs) v.inputs.push_back(plan_view(in, r.symbols));
    r.externs.push_back(std::move(v));
  }
  r.outputs.clear();
  for (const loop::Output& o : p.outputs)
    r.outputs.push_back(o.input_alias >= 0 ? ViewPlan{} : plan_view(o.view, r.symbols));
  r.grids.clear();
  for (const pipeline::CompiledKernel& k : cg.kernels)
    r.grids.push_back(k.grid_expr.valid() ? static_cast<unsigned>(r.symbols(k.grid_expr)) : k.grid);
}

}  // namespace

std::shared_ptr<PreparedProgram> prepare_program(const pipeline::CompiledGraph& cg, std::string& error) {
  auto prep = std::make_shared<PreparedProgram>();
  const loop::Program& p = cg.program;
  prep->extern_output.assign(p.buffers.size(), false);
  for (const loop::Extern& e : p.externs) prep->extern_output[e.output] = true;
  prep->symbols_desc = &p.symbols;
  prep->symbolic = !p.symbols.empty();
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    const int id = p.inputs[i];
    bool read = false;  // by a kernel
    for (const loop::Kernel& k : p.kernels) read |= std::find(k.buffers.begin(), k.buffers.end(), id) != k.buffers.end();
    if (!read) continue;
    if (p.buffers[id].device != p.device) prep->moved_inputs.push_back(i);
    else if (p.buffers[id].aligned) prep->aligned_inputs.push_back(i);
  }
  if (!prep->symbolic) resolve(cg, SymbolValues{&p.symbols, {}}, prep->fixed);
  for (const loop::Kernel& k : p.kernels) prep->kernel_scalar_args.push_back(loop::scalar_args_of(p, k));
  prep->group_of.assign(p.kernels.size(), -1);
  for (size_t gi = 0; gi < p.foreach_groups.size(); ++gi) {
    const loop::ForeachGroup& g = p.foreach_groups[gi];
    for (int k : g.kernels) prep->group_of[k] = static_cast<int>(gi);
    codegen::ForeachTable t = codegen::foreach_table(g);
    std::vector<uint64_t> table(t.slots(), 0);
    for (size_t m = 0; m < t.members; ++m) table[t.points_slot(m)] = static_cast<uint64_t>(g.points[m]);
    for (size_t m = 0; m < t.members; ++m) table[t.variant_slot(m)] = static_cast<uint64_t>(g.variant[m]);
    for (size_t m = 0; m <= t.members; ++m) table[t.start_slot(m)] = static_cast<uint64_t>(t.block_start[m]);
    prep->foreach_layouts.push_back(std::move(t));
    prep->foreach_tables.push_back(std::move(table));
  }
  for (const loop::Extern& e : p.externs) {
    std::optional<c10::OperatorHandle> handle;
    const bool vjp = e.op == "aten_vjp";  // the gradient of a registry op's kernel (torch_call_op.cpp)
    const std::string aten = vjp ? e.attrs.get_str("aten") : e.aten;
    if (e.op != "torch_call") {
      handle = c10::Dispatcher::singleton().findSchema({aten, ""});
      if (!handle) {
        error = "torch has no operator " + aten;
        return nullptr;
      }
    }
    ExternPlan plan{handle, ops::find_op(vjp ? e.attrs.get_str("of") : e.op)};
    static const ops::OpDef* conv_prepacked = ops::find_op("conv2d_prepacked");
    if (plan.def == conv_prepacked) {
      auto conv = c10::Dispatcher::singleton().findSchema({"mkldnn::_convolution_pointwise", ""});
      auto reorder = c10::Dispatcher::singleton().findSchema({"mkldnn::_reorder_convolution_weight", ""});
      if (conv && reorder) plan.packed = std::make_shared<ExternPlan::PackedConv>(ExternPlan::PackedConv{*conv, *reorder});
    }
    if (!handle) plan.call = &torch_call(static_cast<int>(e.attrs.get_int(e.attrs.get_bool("in_place") ? "inplace_fn" : "fn")));
    if (!handle && e.attrs.has("sym_args")) plan.sym_args = e.attrs.get_exprs("sym_args");
    else plan.result = static_cast<size_t>(e.attrs.get_int("result", 0));
    plan.vjp_input = e.attrs.get_int("vjp_input", -1);
    if (plan.vjp_input >= 0) plan.vjp_group = e.attrs.get_int("vjp_group", -1);
    prep->externs.push_back(plan);
  }
  for (ExternPlan& a : prep->externs)
    for (const ExternPlan& b : prep->externs)
      if (a.vjp_input >= 0 && b.vjp_input >= 0 && a.vjp_group == b.vjp_group) a.vjp_wanted.push_back(b.vjp_input);
  plan_lifetimes(p, *prep);
  prep->has_cuda = p.device.type == DeviceType::CUDA;
  prep->keeps_memory = p.device.type == DeviceType::CPU;
  prep->kept_buffers.resize(p.buffers.size());
  prep->kept_slots.resize(static_cast<size_t>(p.num_slots));
  if (prep->keeps_memory) {
    size_t outputs = 0;
    for (const loop::Buffer& b : p.buffers) outputs += b.kind == loop::BufferKind::Output;
    if (outputs) prep->output_pool = std::make_shared<OutputPool>(outputs);
  }
  return prep;
}

bool moves_inputs(const PreparedProgram& prep) { return !prep.moved_inputs.empty(); }

void* current_stream(int device) {
  // c10's device-generic stream API (in libc10, no CUDA headers): the current stream of the
  // device, then its cudaStream_t. A CUDA replay asks on every call; a Python call here was
  // most of a replay's host time.
  try {
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    return impl->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device))).native_handle();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, (std::string("kiln: no current CUDA stream: ") + e.what()).c_str());
    return nullptr;
  }
}

namespace {

thread_local int t_failed_step = -1;

bool run(const pipeline::CompiledGraph& cg, PreparedProgram& prep, PyObject* const* inputs,
         std::vector<PyObject*>& outputs, const int64_t* scalars, bool consume) {
  const loop::Program& p = cg.program;
  t_failed_step = -1;
  // A consuming run holds the inputs as tensors only; those an output returns as they are, as
  // Python objects too, until the end.
  struct Returned {
    PyObject* const* inputs = nullptr;
    const std::vector<bool>* which = nullptr;
    ~Returned() {
      for (size_t i = 0; inputs && i < which->size(); ++i)
        if ((*which)[i]) Py_DECREF(inputs[i]);
    }
  } returned;
  try {
    // The graph holds the casts torch.autocast makes (capture put them there): the extern ops
    // it calls must not be cast again by autocast's dispatch keys.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    // Autograd sees none of a program's steps: a training program's gradients are its backward
    // program's, and an inference program's results need none (torch's own kernels it calls,
    // under the caller's grad mode, gave embeddings and losses made under no_grad a grad_fn,
    // which trained a frozen teacher's weights). The gradient steps (aten_vjp) turn it on.
    torch::autograd::AutoGradMode no_grad(false);
    std::vector<at::Tensor> tensors(p.buffers.size());
    std::vector<void*> ptrs(p.buffers.size(), nullptr);
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      const at::Tensor& t = THPVariable_Unpack(inputs[i]);
      tensors[p.inputs[i]] = t;
      ptrs[p.inputs[i]] = t.data_ptr();
    }
    if (consume) {
      for (size_t i = 0; i < p.inputs.size(); ++i)
        if (!prep.input_returned[i]) Py_DECREF(inputs[i]);
      returned = {inputs, &prep.input_returned};
      for (int b : prep.unread_inputs) tensors[b].reset(), ptrs[b] = nullptr;
    }
    for (size_t i : prep.moved_inputs) {
      at::Tensor& t = tensors[p.inputs[i]];
      t = t.to(device_of(p.device));
      ptrs[p.inputs[i]] = t.data_ptr();
    }
    std::vector<at::Tensor> aligned_copies;  // empty unless an input is a view at an odd offset
    for (size_t i : prep.aligned_inputs) {
      const int id = p.inputs[i];
      if (aligned16(ptrs[id]) || tensors[id].numel() == 0) continue;
      if (log_enabled("copies")) log("copies", "input " + std::to_string(i) + ": copied to an aligned address");
      aligned_copies.push_back(aligned_copy(tensors[id]));
      ptrs[id] = aligned_copies.back().data_ptr();
    }
    // A shape-generic program reads its size symbols off the inputs (the guards checked that
    // they satisfy what the entry relies on) and resolves its sizes for this call.
    Resolved per_call;
    if (prep.symbolic) {
      SymbolValues sv{&p.symbols, {}};
      for (const loop::SymbolBinding& b : p.symbols)  // an input dim's size, or a Python int passed in
        sv.values.push_back(b.input < 0 ? scalars[b.dim] : tensors[p.inputs[b.input]].size(b.dim));
      resolve(cg, std::move(sv), per_call);
    }
    const Resolved& rs = prep.symbolic ? per_call : prep.fixed;
    const auto options = at::TensorOptions().device(device_of(p.device));
    std::vector<at::Tensor> slots(rs.slot_bytes.size());
    const bool keep = prep.keeps_memory && !prep.busy.exchange(true);
    struct Unbusy {
      PreparedProgram* prep;
      ~Unbusy() {
        if (prep) prep->busy = false;
      }
    } unbusy{keep ? &prep : nullptr};
    // A kept tensor of these sizes that nothing outside this run holds, or a new one (kept).
    // (An inference tensor, made under torch.inference_mode, is kept for calls in that mode only:
    // outside it torch refuses in-place updates of one.)
    const bool inference = c10::InferenceMode::is_enabled();
    auto reuse = [inference](at::Tensor& kept, at::IntArrayRef sizes, at::IntArrayRef strides) {
      return kept.defined() && kept.storage().use_count() == 1 && kept.is_inference() == inference &&
             kept.sizes().equals(sizes) && kept.strides().equals(strides);
    };
    std::unordered_map<int64_t, std::vector<at::Tensor>> vjp_stash;  // per gradient group (ExternPlan)
    // Outputs, and temporaries that extern ops read (slot -1), are tensors of their own; the
    // other temporaries live in reuse slots.
    auto make = [&](size_t step) {
      for (int id : prep.make_before[step]) {
        const loop::Buffer& b = p.buffers[id];
        if (keep && b.kind == loop::BufferKind::Temp) {
          at::Tensor& k = prep.kept_buffers[id];
          if (!reuse(k, rs.sizes[id], rs.strides[id]))
            k = at::empty_strided(rs.sizes[id], rs.strides[id], options.dtype(scalar_type(b.dtype)));
          tensors[id] = k;
        } else if (b.kind == loop::BufferKind::Output && prep.output_pool) {
          tensors[id] = prep.output_pool->empty_strided(rs.sizes[id], rs.strides[id], scalar_type(b.dtype));
        } else {
          tensors[id] = at::empty_strided(rs.sizes[id], rs.strides[id], options.dtype(scalar_type(b.dtype)));
        }
        ptrs[id] = tensors[id].data_ptr();
      }
      for (int s : prep.make_slot_before[step]) {
        if (!keep) {
          slots[s] = at::empty({rs.slot_bytes[s]}, options.dtype(at::kByte));
          continue;
        }
        at::Tensor& k = prep.kept_slots[s];
        const int64_t bytes = rs.slot_bytes[s];
        if (!reuse(k, {bytes}, {1})) k = at::empty({bytes}, options.dtype(at::kByte));
        slots[s] = k;
      }
    };
    auto drop = [&](size_t step) {
      for (int id : prep.drop_after[step]) {
        tensors[id].reset();
        ptrs[id] = nullptr;
      }
      for (int s : prep.drop_slot_after[step]) slots[s].reset();
      if (consume)
        for (int id : prep.input_drop_after[step]) tensors[id].reset(), ptrs[id] = nullptr;
    };

    void* stream = nullptr;
    if (prep.has_cuda) {
      const int device = p.device.index < 0 ? 0 : p.device.index;
      std::string err;
      if (!compile::cuda_make_current(device, err)) {
        PyErr_SetString(PyExc_RuntimeError, ("kiln: " + err).c_str());
        return false;
      }
      stream = current_stream(device);
      if (!stream && PyErr_Occurred()) return false;
    }

    std::vector<void*> args, argp;  // a kernel's arguments, and pointers to them for a CUDA launch
    auto run_step = [&](const loop::Step& st) -> bool {
      if (st.kind == loop::Step::Kind::Kernel) {
        const loop::Kernel& k = p.kernels[st.index];
        const pipeline::CompiledKernel& ck = cg.kernels[st.index];
        args.clear();
        for (int b : k.buffers) args.push_back(prep.slot_of[b] >= 0 ? slots[prep.slot_of[b]].data_ptr() : ptrs[b]);
        // Scalar arguments (doubles) follow the int symbols' values in `scalars`.
        const int64_t* scalar_args = p.scalar_args > 0 ? scalars + p.scalar_symbols.size() : nullptr;
        if (ck.cpu_fn) {
          if (prep.symbolic) args.push_back(const_cast<int64_t*>(rs.symbols.values.data()));
          if (scalar_args) args.push_back(const_cast<int64_t*>(scalar_args));
          {
            GilRelease unlocked;  // other Python threads run while the kernel does
            ck.cpu_fn(args.data());
          }
          // An integer division by zero raises here, before any later step's own error, in
          // eager's order (fuzz seed 505050: a torch call's dtype error came first).
          if (cg.take_error && cg.take_error()) {
            PyErr_SetString(PyExc_RuntimeError, "ZeroDivisionError");
            return false;
          }
          return true;
        }
        argp.clear();
        for (void*& a : args) argp.push_back(&a);
        for (const int64_t& v : rs.symbols.values) argp.push_back(const_cast<int64_t*>(&v));
        for (int i : prep.kernel_scalar_args[st.index]) argp.push_back(const_cast<int64_t*>(scalar_args + i));
        std::string err;
        if (!compile::cuda_launch(ck.cuda_fn, rs.grids[st.index], 1, 1, ck.block, 1, 1, 0, stream, argp.data(), err)) {
          PyErr_SetString(PyExc_RuntimeError, ("kiln: kernel launch failed: " + err).c_str());
          return false;
        }
        return true;
      }
      const loop::Extern& e = p.externs[st.index];
      ExternPlan& plan = prep.externs[st.index];
      const ExternViews& views = rs.externs[st.index];
      at::Tensor r;
      if (plan.vjp_input >= 0) {
        auto it = vjp_stash.find(plan.vjp_group);
        if (it == vjp_stash.end()) {
          std::vector<at::Tensor> grads;
          if (!plan.op) {
            if (!torch_call_vjp(e, *plan.call, plan.sym_args, views, tensors, rs.symbols, plan.vjp_wanted, grads)) return false;
          } else {
            grads = kernel_vjp(*plan.op, *plan.def, e.attrs, views, tensors, plan.vjp_wanted);
          }
          it = vjp_stash.emplace(plan.vjp_group, std::move(grads)).first;
        }
        const size_t at = static_cast<size_t>(std::find(plan.vjp_wanted.begin(), plan.vjp_wanted.end(), plan.vjp_input) -
                                              plan.vjp_wanted.begin());
        r = laid_out(std::move(it->second[at]), views.out_strides, p.buffers[e.output].aligned, e);  // in the layout torch's backward chose: copied
      } else if (plan.packed) {
        const ViewPlan &vx = views.inputs[0], &vw = views.inputs[1];
        const ViewPlan* vb = views.inputs.size() > 2 && views.inputs[2].buffer >= 0 ? &views.inputs[2] : nullptr;
        at::Tensor out = run_packed_conv(*plan.packed, e.attrs, view_of(tensors[vx.buffer], vx), tensors[vw.buffer],
                                         view_of(tensors[vw.buffer], vw),
                                         vb ? c10::IValue(view_of(tensors[vb->buffer], *vb)) : c10::IValue());
        r = laid_out(std::move(out), views.out_strides, p.buffers[e.output].aligned, e);
      } else if (!plan.op) {
        if (!run_torch_call(e, *plan.call, plan.sym_args, views, tensors, rs.symbols, rs.sizes[e.output], r)) return false;
        r = laid_out(std::move(r), views.out_strides, p.buffers[e.output].aligned, e);
      } else {
        torch::jit::Stack stack;
        push_arguments(stack, *plan.def, e.attrs, [&](size_t i) -> c10::IValue {
          const ViewPlan& v = views.inputs[i];
          if (v.buffer < 0) return {};
          return view_of(tensors[v.buffer], v);
        });
        // Parameters of kiln's schema past the kernel's (conv2d_backward's `result`) are not passed.
        if (stack.size() > plan.op->schema().arguments().size()) stack.resize(plan.op->schema().arguments().size());
        {
          GilRelease unlocked;
          plan.op->callBoxed(&stack);
        }
        r = laid_out(stack[plan.result].toTensor(), views.out_strides, p.buffers[e.output].aligned, e);  // laid out as planned
      }
      ptrs[e.output] = r.data_ptr();
      tensors[e.output] = std::move(r);
      return true;
    };
    // A foreach group's members are consecutive steps launched as one kernel at the first:
    // everything the members write is made before that launch.
    std::vector<bool> made(p.foreach_groups.empty() ? 0 : p.steps.size(), false);  // no allocation without groups
    auto make_once = [&](size_t si) {
      if (made.empty()) return make(si);
      if (!made[si]) made[si] = true, make(si);
    };
    auto run_group = [&](int gi) -> bool {
      const loop::ForeachGroup& g = p.foreach_groups[gi];
      const codegen::ForeachTable& t = prep.foreach_layouts[gi];
      std::vector<uint64_t> table = prep.foreach_tables[gi];
      const int64_t* scalar_args = p.scalar_args > 0 ? scalars + p.scalar_symbols.size() : nullptr;
      for (size_t m = 0; m < t.members; ++m) {
        for (size_t j = 0; j < g.buffers[m].size(); ++j) {
          const int b = g.buffers[m][j];
          table[t.buffer_slot(m, j)] = reinterpret_cast<uint64_t>(prep.slot_of[b] >= 0 ? slots[prep.slot_of[b]].data_ptr() : ptrs[b]);
        }
        for (size_t j = 0; j < g.args[m].size(); ++j) table[t.arg_slot(m, j)] = static_cast<uint64_t>(scalar_args[g.args[m][j]]);
      }
      const pipeline::CompiledKernel& ck = cg.foreach[gi];
      void* argp[1] = {table.data()};
      std::string err;
      if (!compile::cuda_launch(ck.cuda_fn, ck.grid, 1, 1, ck.block, 1, 1, 0, stream, argp, err)) {
        PyErr_SetString(PyExc_RuntimeError, ("kiln: kernel launch failed: " + err).c_str());
        return false;
      }
      return true;
    };
    const bool profiling = step_profile().on;  // host time: a CUDA step's launch, a CPU step's run
    for (size_t si = 0; si < p.steps.size(); ++si) {
      t_failed_step = static_cast<int>(si);  // until the step has run
      make_once(si);
      const loop::Step& st = p.steps[si];
      const int gi = st.kind == loop::Step::Kind::Kernel ? prep.group_of[st.index] : -1;
      if (gi >= 0) {
        const loop::ForeachGroup& g = p.foreach_groups[gi];
        if (g.kernels[0] == st.index) {
          for (size_t m = 1; m < g.kernels.size() && si + m < p.steps.size(); ++m) make_once(si + m);
          if (!run_group(gi)) return false;
        }
      } else if (profiling) {
        const auto t0 = std::chrono::steady_clock::now();
        if (!run_step(st)) return false;
        step_profile().add(step_label(p, cg, st), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      } else if (!run_step(st)) {
        return false;
      }
      drop(si);
    }
    t_failed_step = -1;
    make(p.steps.size());  // outputs no step writes
    outputs.clear();
    for (size_t i = 0; i < p.outputs.size(); ++i) {
      int alias = p.outputs[i].input_alias;
      if (alias >= 0) {
        Py_INCREF(inputs[alias]);
        outputs.push_back(inputs[alias]);
        continue;
      }
      const ViewPlan& v = rs.outputs[i];
      at::Tensor out = view_of(tensors[v.buffer], v);
      // A view op's result is a new tensor over its base (b.view(b.shape) is not b, nor is
      // x.view(-1) of a 1-d x that is returned too): an alias where the view covers its base.
      if (p.outputs[i].view_op && out.unsafeGetTensorImpl() == tensors[v.buffer].unsafeGetTensorImpl()) out = out.alias();
      outputs.push_back(THPVariable_Wrap(std::move(out)));
    }
    return true;
  } catch (const c10::Error& e) {
    set_python_error(e);
    return false;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return false;
  }
}

}  // namespace

std::vector<StepTime> profile_steps(bool on) {
  std::vector<StepTime> out;
  out.swap(step_profile().times);
  step_profile().index.clear();
  step_profile().on = on;
  return out;
}

int failed_step() { return t_failed_step; }

bool run_program(const pipeline::CompiledGraph& cg, PreparedProgram& prep, PyObject* const* inputs,
                 std::vector<PyObject*>& outputs, const int64_t* scalars) {
  return run(cg, prep, inputs, outputs, scalars, false);
}

bool run_program_consuming(const pipeline::CompiledGraph& cg, PreparedProgram& prep, PyObject* const* inputs,
                           std::vector<PyObject*>& outputs, const int64_t* scalars) {
  return run(cg, prep, inputs, outputs, scalars, true);
}

namespace {

// Milliseconds a call of torch's kernel for extern node `n` takes, on inputs of its own with
// the sizes, strides and dtypes of n's inputs (random values: GEMM kernels' speed does not
// depend on them, but zeros would flatter them); -1 when it cannot be timed.
double time_extern_node(const ir::Node& n) {
  const ops::OpDef& def = *n.op;
  if (def.kind != ops::OpKind::Extern || def.aten.empty() || n.meta.device.type != DeviceType::CUDA) return -1;
  auto handle = c10::Dispatcher::singleton().findSchema({def.aten, ""});
  if (!handle) return -1;
  const int device = n.meta.device.index < 0 ? 0 : n.meta.device.index;
  void* stream = nullptr;
  {
    // Compiles run without the GIL; torch's current stream is read through Python.
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* c = PyImport_ImportModule("torch._C");
    PyObject* fn = c ? PyObject_GetAttrString(c, "_cuda_getCurrentRawStream") : nullptr;
    PyObject* r = fn ? PyObject_CallFunction(fn, "i", device) : nullptr;
    if (r) stream = PyLong_AsVoidPtr(r);
    const bool failed = !r;
    Py_XDECREF(r);
    Py_XDECREF(fn);
    Py_XDECREF(c);
    if (failed) PyErr_Clear();
    PyGILState_Release(gil);
    if (failed) return -1;
  }
  try {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    // The timed calls rotate over copies of the inputs that together exceed the L2 cache (50 MB
    // on an H100), as a model's GEMMs meet their weights: read from memory, not from L2. Timed
    // on one warm copy, a GEMM of 8 rows over a float32 768×768 weight ranked cuBLASLt's bias
    // epilogue first where, inside BERT, it was the slower choice.
    std::vector<at::Tensor> inputs;
    size_t bytes = 0;
    for (const ir::Node* in : n.inputs) {
      if (!in) {
        inputs.emplace_back();
        continue;
      }
      std::vector<int64_t> sizes, strides;
      for (const sym::Expr& e : in->meta.sizes) {
        if (!e.as_const()) return -1;
        sizes.push_back(*e.as_const());
      }
      for (const sym::Expr& e : in->meta.strides) {
        if (!e.as_const()) return -1;
        strides.push_back(*e.as_const());
      }
      at::Tensor t = at::empty_strided(sizes, strides, at::TensorOptions().dtype(scalar_type(in->meta.dtype)).device(device_of(in->meta.device)));
      if (is_floating(in->meta.dtype)) t.normal_();
      else t.zero_();
      bytes += t.storage().nbytes();
      inputs.push_back(t);
    }
    constexpr size_t kBeyondL2 = size_t{128} << 20;
    const size_t copies = std::clamp<size_t>(kBeyondL2 / std::max<size_t>(bytes, 1), 1, 64);
    std::vector<std::vector<at::Tensor>> sets{inputs};
    for (size_t c = 1; c < copies; ++c) {
      sets.emplace_back();
      for (const at::Tensor& t : inputs) sets.back().push_back(t.defined() ? t.clone() : t);
    }
    size_t turn = 0;
    std::string error;
    auto work = [&](std::string& err) {
      try {
        const std::vector<at::Tensor>& use = sets[turn++ % sets.size()];
        torch::jit::Stack stack;
        push_arguments(stack, def, n.attrs, [&](size_t i) -> c10::IValue {
          if (!use[i].defined()) return {};
          return use[i];
        });
        handle->callBoxed(&stack);
        return true;
      } catch (const std::exception& ex) {
        err = ex.what();
        return false;
      }
    };
    // GPU time alone: a small GEMM's host-side cost (cuBLASLt's above cuBLAS's) is not what a
    // kernel choice changes.
    return compile::cuda_benchmark(work, 50, device, stream, error);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

passes::ExternTiming torch_extern_timing(int device) {
  passes::ExternTiming t;
  if (!compile::cuda_driver_available()) return t;
  t.device_key = "sm_" + std::to_string(compile::cuda_compute_capability(device)) + "/" + compile::cuda_device_name(device);
  t.time = time_extern_node;
  return t;
}

}  // namespace kiln::bind
