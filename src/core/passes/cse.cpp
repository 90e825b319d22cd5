#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

void common_subexpression_elimination(ir::Graph& g) {
  std::unordered_map<std::string, ir::Node*> seen;
  // Merged nodes and their survivors. Nodes come in topological order, so each node's inputs
  // are rewired before its key is made, and later keys see the survivors' ids; rewiring as we go
  // keeps the pass linear (a chain of scalar ops repeats its constants once per op).
  std::unordered_map<const ir::Node*, ir::Node*> survivor;
  const std::unordered_set<const ir::Node*> outputs(g.outputs().begin(), g.outputs().end());
  for (auto& up : g.nodes()) {
    ir::Node* n = up.get();
    for (ir::Node*& in : n->inputs)
      if (auto it = survivor.find(in); it != survivor.end()) in = it->second;
    if (n->op_name() == "placeholder") continue;
    std::string key = n->op_name() + "(";
    for (ir::Node* in : n->inputs) key += (in ? std::to_string(in->id) : "-") + ",";
    key += ")" + n->attrs.str();
    auto [it, inserted] = seen.emplace(key, n);
    if (inserted) continue;
    // An output is a tensor of its own in eager: merged into another node it could alias
    // another output (that node, or a view of it), and an in-place change of one (after a
    // break, or by the caller) would show in the other (fuzzer seed 320145).
    if (outputs.count(n)) continue;
    survivor.emplace(n, it->second);
  }
  if (!survivor.empty()) {
    g.recompute_users();
    dead_code_elimination(g);
  }
}

}  // namespace kiln::passes
