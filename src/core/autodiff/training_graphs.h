// The two programs kiln compiles for a captured graph that autograd must differentiate
// (AOTAutograd's job, seed 003): decompose, build the joint graph, partition it, split it.
// The binding runs the forward program in a call and the backward program in backward().
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/ir/graph.h"

namespace kiln::autodiff {

struct TrainingGraphs {
  // Inputs: the captured graph's. Outputs: the captured graph's, then the saved values.
  std::unique_ptr<ir::Graph> forward;
  // Inputs: the saved values, then one tangent per output that has one. Outputs: the
  // gradients that exist, in `wrt` order.
  std::unique_ptr<ir::Graph> backward;
  size_t outputs = 0;              // the captured graph's outputs, first among the forward's
  size_t saved = 0;                // the saved values after them
  std::vector<int> tangent_of;     // per output: its tangent's index among the backward's tangent inputs, or -1
  std::vector<int> saved_as_output;  // per saved value: the output (with a tangent) it also is, or -1
  std::vector<int> grad_of;        // per `wrt` input: its gradient's index among the backward's outputs, or -1
  // Per `wrt` input: the tangents its gradient is computed from. Where autograd reaches none
  // of them (the outputs they belong to are unused), the gradient is None, as eager's is.
  std::vector<std::vector<int>> grad_tangents;
  // Eager's version-counter error, kept: where capture saw a result or an input that autograd
  // saves (OpDef::saves_result, OpDef::keeps_inputs) changed in place (`result_modified`),
  // backward() raises `backward_error` when a gradient reaches any of `error_tangents`; and the
  // outputs in `result_witnesses` share memory with such values, whose in-place change after
  // the call (at a graph break) the runtime checks as autograd checks a saved one.
  std::string backward_error;
  std::vector<int> error_tangents;
  std::vector<int> result_witnesses;
  // Size symbols the backward uses that none of its inputs carries (sum's gradient expands a
  // 0-d tangent to the input's [s0]): the backward's scalar_symbols after the forward's, each
  // read at the forward call from a forward input's dim (input index, dim).
  std::vector<std::pair<int, int>> backward_symbol_dims;
  int64_t saved_bytes = 0;         // the partition's cut (symbolic sizes at their hints)
  size_t recomputed = 0;           // forward nodes the backward computes again
};

// `g` is a captured graph (rewritten in place); `wrt` its inputs that require grad; `tracked`
// the nodes autograd would record (a node outside it whose input is inside it was made under
// torch.no_grad(): no gradient flows through it). False with the reason (an op without a
// derivative, named) when the graph cannot be differentiated.
bool make_training_graphs(ir::Graph& g, const std::vector<ir::Node*>& wrt, const std::set<const ir::Node*>& tracked,
                          TrainingGraphs& out, std::string& why);

// Lets the forward save values in the layout their producer writes (Graph::free_layout_outputs
// on the saved values that are not also outputs): call before compiling the forward.
void free_saved_layouts(TrainingGraphs& t);
// After the forward's passes: each saved value whose layout changed (passes::
// saved_in_producer_layout) reaches the backward as it is, its placeholder taking that layout
// and a row-major copy of it (fused into its readers) standing where the placeholder stood.
void adopt_saved_layouts(TrainingGraphs& t);

}  // namespace kiln::autodiff
