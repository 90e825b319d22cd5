#include <algorithm>
#include <unordered_map>

#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

void common_subexpression_elimination(ir::Graph& g) {
  std::unordered_map<std::string, ir::Node*> seen;
  bool changed = false;
  for (auto& up : g.nodes()) {
    ir::Node* n = up.get();
    if (n->op_name() == "placeholder") continue;
    std::string key = n->op_name() + "(";
    for (ir::Node* in : n->inputs) key += (in ? std::to_string(in->id) : "-") + ",";
    key += ")" + n->attrs.str();
    auto [it, inserted] = seen.emplace(key, n);
    if (inserted) continue;
    // An output is a tensor of its own in eager: merged into another node it could alias
    // another output (that node, or a view of it), and an in-place change of one (after a
    // break, or by the caller) would show in the other (fuzzer seed 320145).
    if (std::find(g.outputs().begin(), g.outputs().end(), n) != g.outputs().end()) continue;
    // Rewire users now so later keys see the survivor's id.
    for (auto& m : g.nodes())
      for (ir::Node*& in : m->inputs)
        if (in == n) in = it->second;
    for (ir::Node*& o : g.outputs())
      if (o == n) o = it->second;
    changed = true;
  }
  if (changed) {
    g.recompute_users();
    dead_code_elimination(g);
  }
}

}  // namespace kiln::passes
