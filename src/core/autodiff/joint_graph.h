// The joint forward + backward graph (AOTAutograd's first step, seed 003): reverse-mode
// differentiation of a captured graph, built from each op's registry derivative.
//
// The backward is appended to the same graph, after the forward: one graph whose outputs are
// the forward's, then the gradients. Its nodes are ordinary nodes, so the backward goes
// through the same passes, fusion and code generation as the forward, and a partitioner can
// later split the graph into the program a forward call runs and the one backward() runs.
#pragma once
#include <string>
#include <vector>

#include "core/ir/graph.h"

namespace kiln::autodiff {

struct JointGraph {
  // The forward's nodes, in graph order; every other node of the graph is the backward's
  // (the tangents among them: placeholders go before the other nodes of a graph).
  std::vector<const ir::Node*> forward;
  size_t forward_outputs = 0;  // the graph's first outputs are the forward's, then the gradients
  // The incoming gradient of each forward output, as new placeholders (`tangent_<i>`, the
  // output's sizes and dtype, row-major); nullptr for an output no gradient flows back through
  // (an integer or bool result, one no `wrt` input reaches, or a graph input handed back).
  std::vector<ir::Node*> tangents;
  // The gradient of each `wrt` input, in order (also appended to the graph's outputs); nullptr
  // where no differentiable path leads from that input to an output (torch's None).
  std::vector<ir::Node*> grads;
};

// Appends to `g` the gradients of its outputs with respect to `wrt` (placeholders of `g`).
// Gradients stop at nodes with the attribute `detach` (x.detach(), values made under no_grad).
// False, with the reason naming the op, when a node on a path from `wrt` to an output has no
// derivative: the caller runs that graph as it did before (eagerly), with the reason.
bool build_joint(ir::Graph& g, const std::vector<ir::Node*>& wrt, JointGraph& out, std::string& why);

// `grad` summed over the dims it was broadcast along to reach `meta`'s sizes, then converted
// to meta's dtype: the gradient of an input that an op broadcast or promoted.
ir::Node* reduce_to(ir::Graph& g, ir::Node* grad, const ir::TensorMeta& meta);

}  // namespace kiln::autodiff
