#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

void decompose(ir::Graph& g) { decompose(g, nullptr); }

void decompose(ir::Graph& g, const std::function<bool(const ir::Node&)>& keep) {
  // Decompositions may produce composites (linear -> matmul): sweep until a fixpoint.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      ir::Node* n = g.nodes()[i].get();
      if (n->op->kind != ops::OpKind::Composite || (keep && keep(*n))) continue;
      size_t tail = g.nodes().size();
      std::string saved = g.source_loc;
      g.source_loc = n->source_loc;
      ir::Node* r = n->op->decompose(g, n);
      g.source_loc = saved;
      size_t added = g.nodes().size() - tail;
      // What a torch.utils.checkpoint region computes stays marked as its (autodiff/partition.h).
      if (n->attrs.get_bool("checkpoint"))
        for (size_t j = tail; j < g.nodes().size(); ++j)
          if (g.nodes()[j]->op->kind != ops::OpKind::Source) g.nodes()[j]->attrs.set("checkpoint", true);
      g.move_tail_before(tail, n);
      g.replace_all_uses(n, r);
      i += added;  // step past the expansion and the (now dead) composite itself
      changed = true;
    }
    if (changed) dead_code_elimination(g);
  }
}

}  // namespace kiln::passes
