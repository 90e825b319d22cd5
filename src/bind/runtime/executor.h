// Runs a compiled graph: allocates outputs and temporaries through torch's allocators, calls
// the generated kernels with raw pointers and extern ops through torch's dispatcher.
#pragma once
#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/compile_graph.h"

namespace kiln::bind {

struct PreparedProgram;

// Releases the GIL for a scope of pure C++ work (a kernel, an extern op, a compile), so other
// Python threads run meanwhile; reacquired on every way out, exceptions included.
class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  ~GilRelease() { PyEval_RestoreThread(state_); }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

// While it lives, torch's autocast dispatch keys are excluded: the graph holds the casts
// torch.autocast makes (capture put them there), so the ops it runs must not be cast again.
class AutocastExcluded {
 public:
  AutocastExcluded();
  ~AutocastExcluded();
  AutocastExcluded(const AutocastExcluded&) = delete;
  AutocastExcluded& operator=(const AutocastExcluded&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Resolves what the run needs once: extern operator handles, slot sizes.
std::shared_ptr<PreparedProgram> prepare_program(const pipeline::CompiledGraph& cg, std::string& error);

// `inputs` are the graph inputs (tensors, borrowed); `scalars` the values of the graph's
// Python-int symbols (Graph::scalar_symbols). Fills `outputs` with new references. Returns
// false with a Python error set on failure.
bool run_program(const pipeline::CompiledGraph& cg, PreparedProgram& prep, PyObject* const* inputs,
                 std::vector<PyObject*>& outputs, const int64_t* scalars = nullptr);

// The step a failed run of this thread stopped at (an index into the program's steps), or -1:
// what the caller of a failed run_program asks to know whether any input was written yet.
int failed_step();

// As run_program, but the program takes over the references in `inputs` (new ones the caller
// gives up): each input is let go after the last step that reads it, as torch.compile's boxed
// calling convention frees a backward's saved values while the backward runs. Memory nothing
// else holds (a saved activation, once its node has let it go) is freed mid-program.
bool run_program_consuming(const pipeline::CompiledGraph& cg, PreparedProgram& prep, PyObject* const* inputs,
                           std::vector<PyObject*>& outputs, const int64_t* scalars = nullptr);

// Step profiling (bench/profile_cpu.py, bench/train_profile.py --host): while on, each step's
// host wall time (a CPU step's run, a CUDA step's launch) is summed under its label ("kernel
// <name>" or the torch operator an extern calls). Turning it on or off hands back the totals so
// far, as (label, seconds, runs) in first-run order, and clears them.
struct StepTime {
  std::string label;
  double seconds = 0;
  int64_t runs = 0;
};
std::vector<StepTime> profile_steps(bool on);

// Whether the program copies an input to its device per call (a CPU tensor a GPU kernel reads).
bool moves_inputs(const PreparedProgram& prep);

// max-autotune's measurements of torch's kernels (GEMMs with and without cuBLASLt's epilogues)
// on the GPU `device`; empty (nothing timed) without a CUDA driver.
passes::ExternTiming torch_extern_timing(int device);

// The current CUDA stream of `device` (a CUstream), as torch's kernels would use it; nullptr
// with a Python error set on failure (nullptr without one is the legacy default stream).
void* current_stream(int device);

}  // namespace kiln::bind
