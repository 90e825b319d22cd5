// The other place (with torch/tensor_bridge.cpp) that sees torch's C++ API.
#include "bind/runtime/executor.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

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

struct ExternPlan {
  c10::OperatorHandle op;
  const ops::OpDef* def;
};

}  // namespace

struct PreparedProgram {
  std::vector<ExternPlan> externs;
  std::vector<int64_t> slot_bytes;
  std::vector<int64_t> buffer_bytes;
  std::vector<bool> extern_output;  // buffers that extern ops allocate themselves
  bool has_cuda = false;
  PyObject* raw_stream_fn = nullptr;  // torch._C._cuda_getCurrentRawStream
};

std::shared_ptr<PreparedProgram> prepare_program(const pipeline::CompiledGraph& cg, std::string& error) {
  auto prep = std::make_shared<PreparedProgram>();
  const loop::Program& p = cg.program;
  for (const loop::Extern& e : p.externs) {
    auto handle = c10::Dispatcher::singleton().findSchema({e.aten, ""});
    if (!handle) {
      error = "torch has no operator " + e.aten;
      return nullptr;
    }
    prep->externs.push_back({*handle, ops::find_op(e.op)});
  }
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
    if (b.slot >= 0) prep->slot_bytes[b.slot] = std::max(prep->slot_bytes[b.slot], *bytes);
  }
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
      at::Tensor t = at::empty_strided(ints(b.sizes), ints(b.strides), options.dtype(scalar_type(b.dtype)));
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
      torch::jit::Stack stack;
      size_t next_input = 0;
      for (const ops::Param& param : plan.def->schema.params) {
        if (param.is_tensor()) {
          const loop::BufferView& v = e.inputs[next_input++];
          if (v.buffer < 0) {
            stack.emplace_back();
            continue;
          }
          const at::Tensor& base = tensors[v.buffer];
          bool whole = ints(v.sizes) == base.sizes().vec() && ints(v.strides) == base.strides().vec() && v.offset.is_const(0);
          stack.emplace_back(whole ? base : base.as_strided(ints(v.sizes), ints(v.strides), base.storage_offset() + *v.offset.as_const()));
        } else if (const ir::AttrValue* a = e.attrs.find(param.name)) {
          stack.push_back(attr_ivalue(*a));
        } else if (auto d = param.default_value()) {
          stack.push_back(attr_ivalue(*d));
        } else {
          stack.emplace_back();  // None
        }
      }
      plan.op.callBoxed(&stack);
      at::Tensor r = stack[0].toTensor();
      const loop::Buffer& out = p.buffers[e.output];
      if (r.strides().vec() != ints(out.strides)) r = r.contiguous();
      ptrs[e.output] = r.data_ptr();
      tensors[e.output] = std::move(r);
    }

    if (cg.take_error && cg.take_error()) {
      PyErr_SetString(PyExc_RuntimeError, "ZeroDivisionError");
      return false;
    }
    outputs.clear();
    for (const loop::Output& o : p.outputs) {
      if (o.input_alias >= 0) {
        Py_INCREF(inputs[o.input_alias]);
        outputs.push_back(inputs[o.input_alias]);
        continue;
      }
      const at::Tensor& base = tensors[o.view.buffer];
      bool whole = ints(o.view.sizes) == base.sizes().vec() && ints(o.view.strides) == base.strides().vec() &&
                   o.view.offset.is_const(0);
      outputs.push_back(THPVariable_Wrap(whole ? base
                                               : base.as_strided(ints(o.view.sizes), ints(o.view.strides),
                                                                 base.storage_offset() + *o.view.offset.as_const())));
    }
    return true;
  } catch (const c10::IndexError& e) {  // torch's own Python exception types, as eager raises them
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    return false;
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    return false;
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    return false;
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
    return false;
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return false;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return false;
  }
}

}  // namespace kiln::bind
