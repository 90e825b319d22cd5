// The third file that sees torch's C++ API (with executor.cpp and torch/tensor_bridge.cpp):
// static input buffers, output aliases and storages marked as overwritten.
#include "bind/runtime/cuda_graphs.h"

#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/python_variable.h>

#include <map>

#include "bind/runtime/executor.h"
#include "bind/runtime/stats.h"
#include "core/compile/cuda_driver.h"

namespace kiln::bind {

namespace {
// A static input that moves this often is not static: the entry stops recording.
constexpr int kMaxRecordings = 4;
// A shape-generic entry records each size it meets twice, up to this many sizes; calls of
// other sizes then run without CUDA graphs (each recording holds its outputs and buffers).
constexpr size_t kMaxRecordedSizes = 8;
const char* const kOverwritten =
    "Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run "
    "of the same kiln-compiled function (mode=\"reduce-overhead\"). Clone the tensor outside of the "
    "compiled function (y = f(x).clone()) to keep it past the next call.";

// Calls a Python callable, clearing nothing: nullptr with the error set.
PyObject* call_method(PyObject* obj, const char* name, PyObject* arg = nullptr) {
  PyObject* m = PyObject_GetAttrString(obj, name);
  if (!m) return nullptr;
  PyObject* r = arg ? PyObject_CallOneArg(m, arg) : PyObject_CallNoArgs(m);
  Py_DECREF(m);
  return r;
}
}  // namespace

// What the recordings of one entry share: the memory pool their captures allocate from (the
// intermediates of one size's graph reuse another's), and the outputs handed out by the last
// replay, whichever size it was: with one pool, any replay may write where they lie.
//
// The pool is the first recording's own (`graph.pool()`), handed to the later captures, as
// torch.cuda.graph documents for graphs that share memory; torch counts the graphs using it.
// When no recording is left the handle is dropped and the next capture starts a pool afresh.
// (A standalone torch.cuda.graph_pool_handle() was released twice when its graphs died: an
// internal assert in torch's allocator.)
struct GraphPool {
  PyObject* handle = nullptr;  // the first live recording's graph.pool()
  int live = 0;                // recordings holding memory in it
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> handed_out;

  void graph_dropped() {  // with the GIL held
    if (--live == 0) Py_CLEAR(handle);
  }

  void mark_overwritten() {
    for (auto& w : handed_out)
      if (auto storage = w.lock()) storage->release_data_and_set_meta_custom_data_ptr_error_msg_(std::string(kOverwritten));
    handed_out.clear();
  }
  ~GraphPool() {
    if (!handle) return;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_CLEAR(handle);
    PyGILState_Release(g);
  }
};

struct CudaGraphState {
  std::shared_ptr<GraphPool> pool;
  int calls = 0;
  int recordings = 0;
  std::string refusal;            // set once the entry stops recording
  PyObject* graph = nullptr;      // torch.cuda.CUDAGraph: owns the executable graph and its pool
  void* exec = nullptr;           // its CUgraphExec; nullptr: replay through graph.replay()
  std::vector<at::Tensor> seen;   // the inputs of the warm-up call (their addresses)
  std::vector<at::Tensor> reads;  // per input: the tensor whose memory the graph reads
  std::vector<bool> copied;       // per input: copied into reads[i] before each replay
  std::vector<at::Tensor> outputs;  // in the pool

  ~CudaGraphState() {
    if (!graph) return;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_CLEAR(graph);
    pool->graph_dropped();
    PyGILState_Release(g);
  }

  void drop_recording() {
    // Outputs handed out may lie in memory this recording held.
    pool->mark_overwritten();
    outputs.clear();
    reads.clear();
    copied.clear();
    exec = nullptr;
    if (!graph) return;
    Py_CLEAR(graph);
    pool->graph_dropped();
  }
};

struct CudaGraphRunner::Sizes {
  std::shared_ptr<GraphPool> pool = std::make_shared<GraphPool>();
  std::map<std::vector<int64_t>, std::shared_ptr<CudaGraphState>> by_size;  // symbol values -> recording
  std::string refusal;  // why calls of new sizes run without CUDA graphs, once that is so
};

CudaGraphRunner::CudaGraphRunner() : sizes_(std::make_unique<Sizes>()) {}
CudaGraphRunner::~CudaGraphRunner() = default;
const std::string& CudaGraphRunner::refusal() const {
  for (const auto& [key, s] : sizes_->by_size)
    if (!s->refusal.empty()) return s->refusal;
  return sizes_->refusal;
}

std::string cuda_graph_refusal(const pipeline::CompiledGraph& cg, const PreparedProgram& prep) {
  const loop::Program& p = cg.program;
  if (p.device.type != DeviceType::CUDA) return "the graph runs on the CPU";
  if (moves_inputs(prep)) return "an input is copied to the GPU per call (a CPU tensor a kernel reads)";
  for (const loop::Output& o : p.outputs)
    if (o.input_alias >= 0) return "an output is an input";
  if (p.steps.empty()) return "nothing runs on the GPU";
  // A recording would keep the values of the capture's call (a learning rate a scheduler changes).
  if (p.scalar_args > 0) return "it reads Python floats at each call (kernel arguments a recording would freeze)";
  return "";
}

namespace {

const at::Tensor& unpack(PyObject* t) { return THPVariable_Unpack(t); }

// Records `cg` into a new torch.cuda.CUDAGraph, reading the inputs `s.reads` says. Leaves the
// capture's outputs in s.outputs. On failure returns false with a Python error set, capture
// ended and nothing recorded.
bool record(CudaGraphState& s, const pipeline::CompiledGraph& cg, PreparedProgram& prep, const int64_t* scalars) {
  PyObject* cuda = PyImport_ImportModule("torch.cuda");
  if (!cuda) return false;
  PyObject *graph = nullptr, *side = nullptr, *main = nullptr, *r = nullptr;
  std::vector<PyObject*> read_objs, outs;
  bool ok = false, capturing = false;
  auto done = [&] {
    for (PyObject* o : read_objs) Py_DECREF(o);
    for (PyObject* o : outs) Py_DECREF(o);
    Py_XDECREF(side);
    Py_XDECREF(main);
    Py_XDECREF(cuda);
    if (!ok) Py_XDECREF(graph);
    return ok;
  };
  // torch.cuda.graph's order: drain the device, capture on a side stream that waits for the
  // current one, then make the current stream wait for the side stream.
  if (!(r = call_method(cuda, "synchronize"))) return done();
  Py_DECREF(r);
  PyObject* graph_cls = PyObject_GetAttrString(cuda, "CUDAGraph");
  graph = graph_cls ? PyObject_CallNoArgs(graph_cls) : nullptr;
  Py_XDECREF(graph_cls);
  if (!graph || !(main = call_method(cuda, "current_stream"))) return done();
  PyObject* stream_cls = PyObject_GetAttrString(cuda, "Stream");
  side = stream_cls ? PyObject_CallNoArgs(stream_cls) : nullptr;
  Py_XDECREF(stream_cls);
  if (!side || !(r = call_method(side, "wait_stream", main))) return done();
  Py_DECREF(r);
  if (!(r = call_method(cuda, "set_stream", side))) return done();
  Py_DECREF(r);
  for (const at::Tensor& t : s.reads) read_objs.push_back(THPVariable_Wrap(t));
  PyObject* kwargs = s.pool->handle
                         ? Py_BuildValue("{s:O,s:s}", "pool", s.pool->handle, "capture_error_mode", "thread_local")
                         : Py_BuildValue("{s:s}", "capture_error_mode", "thread_local");
  PyObject* begin = PyObject_GetAttrString(graph, "capture_begin");
  PyObject* empty = PyTuple_New(0);
  r = begin && kwargs ? PyObject_Call(begin, empty, kwargs) : nullptr;
  Py_XDECREF(begin);
  Py_XDECREF(kwargs);
  Py_DECREF(empty);
  capturing = r != nullptr;
  Py_XDECREF(r);
  bool ran = capturing && run_program(cg, prep, read_objs.data(), outs, scalars);
  if (capturing) {  // always end the capture, or the stream stays capturing
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    PyErr_Fetch(&type, &value, &tb);
    r = call_method(graph, "capture_end");
    if (r) Py_DECREF(r);
    else if (type) PyErr_Clear();  // the run's own error says more
    if (type) PyErr_Restore(type, value, tb);
    ran = ran && r != nullptr;
  }
  // Back to the caller's stream, ordered after the capture, whatever happened.
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  if ((r = call_method(cuda, "set_stream", main))) Py_DECREF(r);
  if ((r = call_method(main, "wait_stream", side))) Py_DECREF(r);
  if (PyErr_Occurred()) ran = false;
  if (type) {
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
  }
  if (!ran) return done();
  s.outputs.clear();
  for (PyObject* o : outs) s.outputs.push_back(unpack(o));
  // The executable graph's handle, where this torch gives it: replays then call the driver
  // directly, with no Python on the way. Older torch: graph.replay().
  s.exec = nullptr;
  if (PyObject_HasAttrString(graph, "raw_cuda_graph_exec")) {
    if ((r = call_method(graph, "raw_cuda_graph_exec"))) {
      s.exec = PyLong_AsVoidPtr(r);
      Py_DECREF(r);
    }
    if (PyErr_Occurred()) PyErr_Clear();
  }
  if (!s.pool->handle && !(s.pool->handle = call_method(graph, "pool"))) {
    PyErr_Clear();  // this recording's memory stays its own
  }
  s.graph = graph;
  ++s.pool->live;
  ok = true;
  return done();
}

bool replay(CudaGraphState& s, PreparedProgram& prep, int device) {
  if (s.exec) {
    void* stream = current_stream(device);
    if (!stream && PyErr_Occurred()) return false;
    std::string err;
    if (compile::cuda_graph_launch(s.exec, stream, err)) return true;
    PyErr_SetString(PyExc_RuntimeError, ("kiln: CUDA graph replay failed: " + err).c_str());
    return false;
  }
  PyObject* r = call_method(s.graph, "replay");
  Py_XDECREF(r);
  return r != nullptr;
}

}  // namespace

bool CudaGraphRunner::run(const pipeline::CompiledGraph& cg, PreparedProgram& prep, PyObject* const* inputs,
                          std::vector<PyObject*>& outputs, const int64_t* scalars) {
  const loop::Program& p = cg.program;
  const size_t n = p.inputs.size();
  const int device = p.device.index < 0 ? 0 : p.device.index;
  // The recording of this call's sizes: a shape-generic program's symbol values pick it.
  std::vector<int64_t> key;
  for (const loop::SymbolBinding& b : p.symbols)
    key.push_back(b.input < 0 ? scalars[b.dim] : unpack(inputs[b.input]).size(b.dim));
  auto found = sizes_->by_size.find(key);
  if (found == sizes_->by_size.end()) {
    if (sizes_->by_size.size() >= kMaxRecordedSizes) {
      if (sizes_->refusal.empty()) {
        sizes_->refusal = "more than " + std::to_string(kMaxRecordedSizes) + " sizes: calls of other sizes run without CUDA graphs";
        ++stats().fallback_reasons["cudagraphs: " + sizes_->refusal];
      }
      return run_program(cg, prep, inputs, outputs, scalars);
    }
    auto state = std::make_shared<CudaGraphState>();
    state->pool = sizes_->pool;
    found = sizes_->by_size.emplace(key, std::move(state)).first;
  }
  std::shared_ptr<CudaGraphState> state = found->second;
  CudaGraphState& s = *state;
  if (!s.refusal.empty()) return run_program(cg, prep, inputs, outputs, scalars);
  try {
    if (s.calls++ == 0) {  // the warm-up call
      for (size_t i = 0; i < n; ++i) s.seen.push_back(unpack(inputs[i]));
      return run_program(cg, prep, inputs, outputs, scalars);
    }
    // A static input (read where it lies) that moved since the recording: record afresh.
    bool stale = !s.graph;
    for (size_t i = 0; s.graph && i < n; ++i)
      if (!s.copied[i] && unpack(inputs[i]).data_ptr() != s.reads[i].data_ptr()) stale = true;
    if (stale) {
      if (s.recordings >= kMaxRecordings) {
        s.refusal = "inputs read in place moved " + std::to_string(kMaxRecordings) + " times";
        s.drop_recording();
        s.seen.clear();  // nothing is recorded any more: let the inputs go
        ++stats().fallback_reasons["cudagraphs: " + s.refusal];
        return run_program(cg, prep, inputs, outputs, scalars);
      }
      s.drop_recording();
      for (size_t i = 0; i < n; ++i) {
        const at::Tensor& t = unpack(inputs[i]);
        // Where it lay on the previous call too (a parameter, a cache): read in place.
        const bool in_place = i < s.seen.size() && s.seen[i].data_ptr() == t.data_ptr();
        s.copied.push_back(!in_place);
        s.reads.push_back(in_place ? t : at::empty_strided(t.sizes(), t.strides(), t.options()));
      }
      s.seen.clear();
      for (size_t i = 0; i < n; ++i) s.seen.push_back(unpack(inputs[i]));
      ++s.recordings;
      if (!record(s, cg, prep, scalars)) {
        PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject* str = value ? PyObject_Str(value) : nullptr;
        s.refusal = std::string("recording failed: ") + (str ? PyUnicode_AsUTF8(str) : "unknown error");
        Py_XDECREF(str);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyErr_Clear();
        s.drop_recording();
        s.seen.clear();  // nothing is recorded any more: let the inputs go
        ++stats().fallback_reasons["cudagraphs: " + s.refusal];
        return run_program(cg, prep, inputs, outputs, scalars);
      }
      ++stats().cudagraph_recordings;
    }
    // Inputs into the recording's buffers (not where they are already), then the replay.
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& t = unpack(inputs[i]);
      if (s.copied[i] && t.data_ptr() != s.reads[i].data_ptr()) s.reads[i].copy_(t, /*non_blocking=*/true);
    }
    // The previous call's outputs that are still alive are about to be overwritten (by this
    // size's graph, or another's sharing the pool).
    s.pool->mark_overwritten();
    if (!replay(s, prep, device)) return false;
    ++stats().cudagraph_replays;
    // Each call's outputs are tensors of their own over the pool's memory, so that marking them
    // overwritten later leaves the recording's own (and the next call's) intact. They keep the
    // recording alive.
    outputs.clear();
    for (const at::Tensor& o : s.outputs) {
      std::shared_ptr<CudaGraphState> keep = state;
      at::Tensor t = at::from_blob(o.data_ptr(), o.sizes(), o.strides(), [keep](void*) {}, o.options());
      s.pool->handed_out.emplace_back(t.storage().getWeakStorageImpl());
      outputs.push_back(THPVariable_Wrap(t));
    }
    return true;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, (std::string("kiln: CUDA graph: ") + e.what()).c_str());
    return false;
  }
}

}  // namespace kiln::bind
