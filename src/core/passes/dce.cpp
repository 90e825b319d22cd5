#include <unordered_set>

#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

void dead_code_elimination(ir::Graph& g) {
  std::unordered_set<const ir::Node*> live(g.outputs().begin(), g.outputs().end());
  for (const auto& n : g.nodes())
    if (n->op->keep_unused && n->op->keep_unused(*n)) live.insert(n.get());
  for (auto it = g.nodes().rbegin(); it != g.nodes().rend(); ++it) {
    const ir::Node* n = it->get();
    if (!live.count(n)) continue;
    for (const ir::Node* in : n->inputs)
      if (in) live.insert(in);
  }
  // Placeholders stay: they are the calling convention of the compiled graph.
  g.erase_if([&](const ir::Node* n) { return !live.count(n) && n->op_name() != "placeholder"; });
}

}  // namespace kiln::passes
