// After the joint graph is split: a `detach` alias only told build_joint where gradients stop.
// In the forward and backward programs it is the value itself, and an alias in the way keeps
// CSE from seeing that two computations are one: a training batch norm's running statistics
// (computed from its input under no_grad) repeated the batch statistics its normalization had
// just computed, two more passes over every activation.
#include <algorithm>

#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

void drop_detach_aliases(ir::Graph& g) {
  static const ops::OpDef* alias = ops::find_op("alias");
  auto through = [](ir::Node* n) {
    while (n && n->op == alias && n->attrs.get_bool("detach") && !n->inputs.empty()) n = n->inputs[0];
    return n;
  };
  bool changed = false;
  for (auto& n : g.nodes())
    for (ir::Node*& in : n->inputs)
      if (ir::Node* t = through(in); t != in) in = t, changed = true;
  if (changed) g.recompute_users();  // outputs keep their aliases: a detached view handed out
}

}  // namespace kiln::passes
