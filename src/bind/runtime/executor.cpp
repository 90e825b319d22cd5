// The other place (with torch/tensor_bridge.cpp) that sees torch's C++ API.
#include "bind/runtime/executor.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include "bind/capture/torch_call.h"
#include "core/compile/cuda_driver.h"

namespace kiln::bind {

using sym::Expr;

namespace {

c10::ScalarType scalar_type(DType t) {
  static const c10::ScalarType map[] = {c10::ScalarType::Bool,  c10::ScalarType::Byte,  c10::ScalarType::Char,
                                        c10::ScalarType::Short, c10::ScalarType::Int,   c10::ScalarType::Long,
                                        c10::ScalarType::Half,  c10::ScalarType::BFloat16, c10::ScalarType::Float,
                                        c10::ScalarType::Double};
  return map[static_cast<int>(t)];
}

std::vector<int64_t> ints(const std::vector<Expr>& xs) {
  std::vector<int64_t> out;
  for (const Expr& e : xs) out.push_back(*e.as_const());
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
  };
  return std::visit(V{}, v);
}

// A buffer view with its sizes resolved once, at prepare time.
struct ViewPlan {
  int buffer = -1;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};

ViewPlan plan_view(const loop::BufferView& v) {
  if (v.buffer < 0) return {};
  return {v.buffer, ints(v.sizes), ints(v.strides), *v.offset.as_const()};
}

// The tensor a view describes: the buffer's own tensor when the view covers it as it is.
at::Tensor view_of(const at::Tensor& base, const ViewPlan& v) {
  if (v.offset == 0 && base.sizes().equals(v.sizes) && base.strides().equals(v.strides)) return base;
  return base.as_strided(v.sizes, v.strides, base.storage_offset() + v.offset);
}

struct ExternPlan {
  std::optional<c10::OperatorHandle> op;  // none: a torch_call (the callable is in its attributes)
  const ops::OpDef* def;
  std::vector<ViewPlan> inputs;
  std::vector<int64_t> out_strides;
};

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

// A torch_call: the operator called from Python with this run's tensors; its result laid out
// as capture planned (a copy when the operator chose other strides).
bool run_torch_call(const loop::Extern& e, const ExternPlan& plan, const std::vector<at::Tensor>& tensors, at::Tensor& out) {
  const TorchCall& call = torch_call(static_cast<int>(e.attrs.get_int("fn")));
  std::vector<PyObject*> ins;
  for (const ViewPlan& v : plan.inputs) ins.push_back(THPVariable_Wrap(view_of(tensors[v.buffer], v)));
  PyObject* args = substitute(call.args, ins.data());
  PyObject* kwargs = call.kwargs ? substitute(call.kwargs, ins.data()) : nullptr;
  PyObject* r = PyObject_Call(call.fn, args, kwargs);
  Py_DECREF(args);
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
  if (!out.strides().equals(plan.out_strides)) {
    at::Tensor laid = at::empty_strided(out.sizes(), plan.out_strides, out.options());
    laid.copy_(out);
    out = std::move(laid);
  }
  return true;
}

}  // namespace

struct PreparedProgram {
  std::vector<ExternPlan> externs;
  std::vector<int64_t> slot_bytes;
  std::vector<int64_t> buffer_bytes;
  std::vector<bool> extern_output;  // buffers that extern ops allocate themselves
  std::vector<std::vector<int64_t>> sizes, strides;  // of each buffer, resolved once
  std::vector<ViewPlan> outputs;
  bool has_cuda = false;
  PyObject* raw_stream_fn = nullptr;  // torch._C._cuda_getCurrentRawStream
};

std::shared_ptr<PreparedProgram> prepare_program(const pipeline::CompiledGraph& cg, std::string& error) {
  auto prep = std::make_shared<PreparedProgram>();
  const loop::Program& p = cg.program;
  prep->extern_output.assign(p.buffers.size(), false);
  for (const loop::Extern& e : p.externs) prep->extern_output[e.output] = true;
  prep->slot_bytes.assign(p.num_slots, 0);
  for (const loop::Buffer& b : p.buffers) {
    auto bytes = b.bytes().as_const();
    if (!bytes) {
      error = "symbolic buffer size";
      return nullptr;
    }
    prep->buffer_bytes.push_back(*bytes);
    prep->sizes.push_back(ints(b.sizes));
    prep->strides.push_back(ints(b.strides));
    if (b.slot >= 0) prep->slot_bytes[b.slot] = std::max(prep->slot_bytes[b.slot], *bytes);
  }
  // Sizes are known to be constant from here on (the check above).
  for (const loop::Extern& e : p.externs) {
    std::optional<c10::OperatorHandle> handle;
    if (e.op != "torch_call") {
      handle = c10::Dispatcher::singleton().findSchema({e.aten, ""});
      if (!handle) {
        error = "torch has no operator " + e.aten;
        return nullptr;
      }
    }
    ExternPlan plan{handle, ops::find_op(e.op), {}, ints(p.buffers[e.output].strides)};
    for (const loop::BufferView& v : e.inputs) plan.inputs.push_back(plan_view(v));
    prep->externs.push_back(std::move(plan));
  }
  for (const loop::Output& o : p.outputs) prep->outputs.push_back(o.input_alias >= 0 ? ViewPlan{} : plan_view(o.view));
  prep->has_cuda = p.device.type == DeviceType::CUDA;
  if (prep->has_cuda) {
    PyObject* c = PyImport_ImportModule("torch._C");
    prep->raw_stream_fn = c ? PyObject_GetAttrString(c, "_cuda_getCurrentRawStream") : nullptr;
    Py_XDECREF(c);
    if (!prep->raw_stream_fn) {
      PyErr_Clear();
      error = "torch._C._cuda_getCurrentRawStream is unavailable";
      return nullptr;
    }
  }
  return prep;
}

bool run_program(const pipeline::CompiledGraph& cg, PreparedProgram& prep, PyObject* const* inputs,
                 std::vector<PyObject*>& outputs) {
  const loop::Program& p = cg.program;
  try {
    std::vector<at::Tensor> tensors(p.buffers.size());
    std::vector<void*> ptrs(p.buffers.size(), nullptr);
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      const at::Tensor& t = THPVariable_Unpack(inputs[i]);
      tensors[p.inputs[i]] = t;
      ptrs[p.inputs[i]] = t.data_ptr();
    }
    const auto options = at::TensorOptions().device(device_of(p.device));
    for (const loop::Buffer& b : p.buffers) {
      // Outputs, and temporaries that extern ops read (slot -1), are tensors of their own.
      bool own = b.live && (b.kind == loop::BufferKind::Output || (b.kind == loop::BufferKind::Temp && b.slot < 0));
      if (!own || prep.extern_output[b.id]) continue;
      at::Tensor t = at::empty_strided(prep.sizes[b.id], prep.strides[b.id], options.dtype(scalar_type(b.dtype)));
      ptrs[b.id] = t.data_ptr();
      tensors[b.id] = std::move(t);
    }
    std::vector<at::Tensor> slots(prep.slot_bytes.size());
    for (size_t s = 0; s < slots.size(); ++s) slots[s] = at::empty({prep.slot_bytes[s]}, options.dtype(at::kByte));
    for (const loop::Buffer& b : p.buffers)
      if (b.kind == loop::BufferKind::Temp && b.slot >= 0) ptrs[b.id] = slots[b.slot].data_ptr();

    void* stream = nullptr;
    if (prep.has_cuda) {
      PyObject* idx = PyLong_FromLong(p.device.index < 0 ? 0 : p.device.index);
      PyObject* r = PyObject_CallOneArg(prep.raw_stream_fn, idx);
      Py_DECREF(idx);
      if (!r) return false;
      stream = PyLong_AsVoidPtr(r);
      Py_DECREF(r);
    }

    std::vector<void*> args;
    for (const loop::Step& st : p.steps) {
      if (st.kind == loop::Step::Kind::Kernel) {
        const loop::Kernel& k = p.kernels[st.index];
        const pipeline::CompiledKernel& ck = cg.kernels[st.index];
        args.clear();
        for (int b : k.buffers) args.push_back(ptrs[b]);
        if (ck.cpu_fn) {
          ck.cpu_fn(args.data());
        } else {
          std::vector<void*> argp;
          for (void*& a : args) argp.push_back(&a);
          std::string err;
          if (!compile::cuda_launch(ck.cuda_fn, ck.grid, 1, 1, ck.block, 1, 1, 0, stream, argp.data(), err)) {
            PyErr_SetString(PyExc_RuntimeError, ("kiln: kernel launch failed: " + err).c_str());
            return false;
          }
        }
        continue;
      }
      const loop::Extern& e = p.externs[st.index];
      ExternPlan& plan = prep.externs[st.index];
      if (!plan.op) {
        at::Tensor r;
        if (!run_torch_call(e, plan, tensors, r)) return false;
        ptrs[e.output] = r.data_ptr();
        tensors[e.output] = std::move(r);
        continue;
      }
      torch::jit::Stack stack;
      size_t next_input = 0;
      for (const ops::Param& param : plan.def->schema.params) {
        if (param.is_tensor()) {
          const ViewPlan& v = plan.inputs[next_input++];
          if (v.buffer < 0) stack.emplace_back();
          else stack.emplace_back(view_of(tensors[v.buffer], v));
        } else if (const ir::AttrValue* a = e.attrs.find(param.name)) {
          stack.push_back(attr_ivalue(*a));
        } else if (auto d = param.default_value()) {
          stack.push_back(attr_ivalue(*d));
        } else {
          stack.emplace_back();  // None
        }
      }
      plan.op->callBoxed(&stack);
      at::Tensor r = stack[0].toTensor();
      if (!r.strides().equals(plan.out_strides)) r = r.contiguous();
      ptrs[e.output] = r.data_ptr();
      tensors[e.output] = std::move(r);
    }

    if (cg.take_error && cg.take_error()) {
      PyErr_SetString(PyExc_RuntimeError, "ZeroDivisionError");
      return false;
    }
    outputs.clear();
    for (size_t i = 0; i < p.outputs.size(); ++i) {
      int alias = p.outputs[i].input_alias;
      if (alias >= 0) {
        Py_INCREF(inputs[alias]);
        outputs.push_back(inputs[alias]);
        continue;
      }
      const ViewPlan& v = prep.outputs[i];
      outputs.push_back(THPVariable_Wrap(view_of(tensors[v.buffer], v)));
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

}  // namespace kiln::bind
