// Training entries at run time: the forward program runs with grad mode off, and its outputs
// get one autograd node of kiln's own whose backward runs the backward program (AOTAutograd's
// CompiledFunction, seed 003). Only autograd_node.cpp sees torch's autograd API.
#pragma once
#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "core/autodiff/backward_stages.h"
#include "core/pipeline/compile_graph.h"

namespace kiln::bind {

struct PreparedProgram;

// One program of the backward and the autograd node that runs it. The backward is one stage,
// or several cut at DistributedDataParallel's bucket boundaries (core/autodiff/backward_stages.h):
// a node per stage, the first the grad_fn of the outputs, each the next one's only producer
// (an edge carrying its first gradient, which orders them), so autograd accumulates (and DDP's
// hooks all-reduce) one stage's gradients while the next stage computes. What a stage hands a
// later one (integer masks and indices too, which no autograd edge may carry) is kept for it in
// the backward pass's own store.
struct BackwardStageProgram {
  std::unique_ptr<pipeline::CompiledGraph> compiled;
  std::shared_ptr<PreparedProgram> prepared;
  std::vector<int> saved;    // the program's first inputs: these saved values
  // The program's inputs after `saved` (later stages): what earlier stages kept, by (stage,
  // output); and the kept values whose last reader this stage is.
  std::vector<std::pair<int, int>> receive, release;
  std::vector<int> keep;     // program outputs later stages read
  // The node's next edges: gradients (per edge, the `wrt` index and the program output, -1 for
  // none), then the edge to the next stage.
  std::vector<int> grad_wrt, grad_output;
  bool feeds_next = false;
};

// What an entry's autograd nodes run in backward(), and how the forward program's outputs map
// onto it (autodiff::TrainingGraphs' bookkeeping, plus where the `wrt` inputs are).
struct BackwardProgram {
  std::vector<BackwardStageProgram> stages;  // at least one
  size_t outputs = 0, saved = 0, tangents = 0;
  std::vector<int> tangent_of, saved_as_output, grad_of;
  std::vector<std::vector<int>> grad_tangents;  // per gradient: the tangents it is computed from
  std::vector<int> wrt;  // per gradient edge: the graph input it flows to
  // Eager's version-counter error (autodiff::TrainingGraphs): raised when a gradient reaches
  // one of `error_tangents`; outputs whose in-place change after the call backward() reports.
  std::string backward_error;
  std::vector<int> error_tangents, result_witnesses;
  // The forward's Python-int symbols come first in the scalars a call passes; after them the
  // backward reads these sizes of forward inputs (input, dim): autodiff::TrainingGraphs's
  // backward_symbol_dims.
  size_t forward_int_symbols = 0;
  std::vector<std::pair<int, int>> symbol_dims;
  ~BackwardProgram();
};

// The stages' tables, from the core's cut (empty: one stage, the whole backward, whose inputs
// are all saved values and the tangents and whose outputs are the gradients). `stages` holds
// the compiled programs already, one per cut stage.
void plan_backward_stages(BackwardProgram& p, const std::vector<autodiff::BackwardStage>& cut);

// Runs the forward program of a training entry (grad mode off), keeps its saved values in new
// autograd nodes (one per backward stage) and makes the first the grad_fn of the outputs that
// have a tangent. `outputs`
// gets the captured graph's outputs only. False with a Python error set on failure.
bool run_forward_with_backward(const pipeline::CompiledGraph& forward, PreparedProgram& prep,
                               const std::shared_ptr<BackwardProgram>& backward, PyObject* const* inputs,
                               std::vector<PyObject*>& outputs, const int64_t* scalars, size_t scalar_count);

}  // namespace kiln::bind
