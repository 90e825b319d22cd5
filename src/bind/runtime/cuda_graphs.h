// mode="reduce-overhead": a compiled CUDA program recorded once as a CUDA graph and replayed.
//
// The first call of an entry runs the program as usual (a warm-up: cuBLAS handles, lazy
// module loads). The second records it with torch.cuda.CUDAGraph (its private memory pool, on
// a side stream), then replays it. An input at the same address on both calls (a parameter, a
// buffer, a KV cache) is read where it lies, and a later call that moves it records afresh; any
// other input is copied into a buffer of the recording before each replay (not when it is
// already there). Outputs live in the recording's pool, so a replay overwrites the previous
// call's: a tensor handed out earlier that is still alive then raises on access, as torch's CUDA
// graphs do, never reads stale data. A shape-generic program is recorded per size (its symbol
// values), each on its second call of that size, up to 8 sizes; the recordings share one memory
// pool, and a replay of any size overwrites the outputs of the previous call. A program the graph
// cannot hold (an input that must move to the GPU per call, an output that is an input) runs as
// usual, the reason in kiln.explain; so does one whose recording fails (an operator that
// synchronizes).
#pragma once
#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/compile_graph.h"

namespace kiln::bind {

struct PreparedProgram;
struct CudaGraphState;

class CudaGraphRunner {
 public:
  CudaGraphRunner();
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  // As run_program (executor.h): fills `outputs` with new references, or returns false with a
  // Python error set. Records on the second call; replays from then on.
  bool run(const pipeline::CompiledGraph& cg, PreparedProgram& prep, PyObject* const* inputs,
           std::vector<PyObject*>& outputs, const int64_t* scalars);

  // Why this runner stopped recording (the program then runs as usual), or "".
  const std::string& refusal() const;

 private:
  struct Sizes;
  std::unique_ptr<Sizes> sizes_;
};

// Why `cg` cannot be held by a CUDA graph, or "" when it can.
std::string cuda_graph_refusal(const pipeline::CompiledGraph& cg, const PreparedProgram& prep);

}  // namespace kiln::bind
