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
  // Outputs, and what they view: an output is a tensor of its own in eager, and so is the
  // memory it views. Merged into another node, it could alias another output (that node, or a
  // view of it), and an in-place change of one (after a break, or by the caller) would show in
  // the other (fuzzer seed 320145; `x, y = v * 2, v * 2; return x[0], y[0]`).
  std::unordered_set<const ir::Node*> outputs;
  for (const ir::Node* o : g.outputs())
    for (const ir::Node* n = o; n && outputs.insert(n).second;) {
      const bool view = (n->op->aliases() || n->attrs.get_bool("view")) && !n->inputs.empty() && !(n->op->copies && n->op->copies(*n));
      n = view ? n->inputs[0] : nullptr;
    }
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
    if (outputs.count(n)) continue;
    survivor.emplace(n, it->second);
  }
  if (!survivor.empty()) {
    g.recompute_users();
    dead_code_elimination(g);
  }
}

}  // namespace kiln::passes
