// Training entries at run time: the forward program runs with grad mode off, and its outputs
// get one autograd node of kiln's own whose backward runs the backward program (AOTAutograd's
// CompiledFunction, seed 003). Only autograd_node.cpp sees torch's autograd API.
#pragma once
#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/compile_graph.h"

namespace kiln::bind {

struct PreparedProgram;

// What an entry's autograd node runs in backward(), and how the forward program's outputs
// map onto it (autodiff::TrainingGraphs' bookkeeping, plus where the `wrt` inputs are).
struct BackwardProgram {
  std::unique_ptr<pipeline::CompiledGraph> compiled;
  std::shared_ptr<PreparedProgram> prepared;
  size_t outputs = 0, saved = 0, tangents = 0;
  std::vector<int> tangent_of, saved_as_output, grad_of;
  std::vector<std::vector<int>> grad_tangents;  // per gradient: the tangents it is computed from
  std::vector<int> wrt;  // per gradient edge: the graph input it flows to
  // Eager's version-counter error (autodiff::TrainingGraphs): raised when a gradient reaches
  // one of `error_tangents`; outputs whose in-place change after the call backward() reports.
  std::string backward_error;
  std::vector<int> error_tangents, result_witnesses;
  ~BackwardProgram();
};

// Runs the forward program of a training entry (grad mode off), keeps its saved values in a new
// autograd node and makes that node the grad_fn of the outputs that have a tangent. `outputs`
// gets the captured graph's outputs only. False with a Python error set on failure.
bool run_forward_with_backward(const pipeline::CompiledGraph& forward, PreparedProgram& prep,
                               const std::shared_ptr<BackwardProgram>& backward, PyObject* const* inputs,
                               std::vector<PyObject*>& outputs, const int64_t* scalars, size_t scalar_count);

}  // namespace kiln::bind
