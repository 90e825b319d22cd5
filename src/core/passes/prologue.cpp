// The prologue: what a graph computes from its stable inputs alone, split into a graph of its own.
//
// Stable inputs are a module's parameters and buffers (ir::Graph::stable_inputs, set by the
// binding for inference graphs). Values computed from them alone (a batch-norm-folded weight,
// a channels-last copy of a convolution's weight, a weight cast to bfloat16 under autocast)
// are the same at every call until one of those tensors changes. The prologue computes them;
// the main graph reads them as inputs of its own, appended after the captured ones. The
// runtime keeps the prologue's results and runs it again only when a tensor it reads has
// changed (another tensor, other memory, or a new version counter: an in-place update such as
// an optimizer step or load_state_dict), so no call reads a stale value.
//
// What is hoisted: nodes whose inputs are all stable placeholders, constants or hoisted nodes,
// with constant sizes, on one device, and that are neither torch_calls of callables capture did
// not find deterministic (attribute `deterministic`: a torch function whose aten op is neither
// seeded-random nor mutating; BERT's gather of its token-type buffer) nor per-call values
// (size_value, scalar_input). The values that cross to the main graph are
// computed ones, never views (a view of a parameter costs nothing per call, and a cached view
// would outlive what it views) nor graph outputs (a cached tensor handed to the caller could be
// written to); such a node stays in the main graph and what it reads crosses instead.
#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

bool is_stable_input(const ir::Graph& g, const ir::Node* n) {
  if (!n || n->op_name() != "placeholder") return false;
  const int64_t i = n->attrs.get_int("index", -1);
  return i >= 0 && static_cast<size_t>(i) < g.stable_inputs.size() && g.stable_inputs[static_cast<size_t>(i)];
}

bool computed_from_stable(const ir::Graph& g, const ir::Node* n) {
  if (n->op_name() == "placeholder") return is_stable_input(g, n);
  if (n->op->kind == ops::OpKind::Source && n->op_name() != "scalar") return false;
  if (n->op_name() == "torch_call" && !n->attrs.get_bool("deterministic")) return false;
  for (const ir::Node* in : n->inputs)
    if (in && !computed_from_stable(g, in)) return false;
  return true;
}

namespace {

bool all_sizes_constant(const ir::TensorMeta& m) {
  for (const sym::Expr& e : m.sizes)
    if (!e.as_const()) return false;
  for (const sym::Expr& e : m.strides)
    if (!e.as_const()) return false;
  return m.offset.as_const().has_value();
}

}  // namespace

std::unique_ptr<ir::Graph> split_prologue(ir::Graph& g, std::vector<int>& prologue_inputs) {
  prologue_inputs.clear();
  if (g.stable_inputs.empty()) return nullptr;
  g.recompute_users();
  static const ops::OpDef* torch_call = ops::find_op("torch_call");
  static const ops::OpDef* scalar = ops::find_op("scalar");
  static const ops::OpDef* placeholder = ops::find_op("placeholder");
  static const ops::OpDef* size_value = ops::find_op("size_value");
  static const ops::OpDef* scalar_input = ops::find_op("scalar_input");
  // Which nodes the prologue could compute, and on which device.
  std::unordered_set<const ir::Node*> hoistable;
  std::optional<Device> device;
  for (auto& up : g.nodes()) {
    const ir::Node* n = up.get();
    if (n->op == placeholder) {
      if (is_stable_input(g, n)) hoistable.insert(n);
      continue;
    }
    if (n->op == scalar) {
      hoistable.insert(n);
      continue;
    }
    if ((n->op == torch_call && !n->attrs.get_bool("deterministic")) || n->op == size_value || n->op == scalar_input) continue;
    if (!all_sizes_constant(n->meta)) continue;
    // a side effect of its own (a deterministic torch_call is kept only so that its errors raise,
    // which the prologue's run does)
    if (n->op->keep_unused && n->op->keep_unused(*n) && !(n->op == torch_call && n->attrs.get_bool("deterministic"))) continue;
    bool inputs_ok = true;
    for (const ir::Node* in : n->inputs)
      inputs_ok = inputs_ok && (!in || hoistable.count(in));
    if (!inputs_ok) continue;
    if (device && !(*device == n->meta.device)) continue;
    device = n->meta.device;
    hoistable.insert(n);
  }
  auto computed = [&](const ir::Node* n) {
    return hoistable.count(n) && n->op->kind != ops::OpKind::Source && !n->op->aliases() && !n->attrs.get_bool("view");
  };
  // Views and outputs stay in the main graph: what they read crosses instead, down to
  // computed values (a view of a stable placeholder reads that placeholder, which is an input
  // of the main graph anyway).
  std::unordered_set<const ir::Node*> kept;  // hoistable nodes the main graph computes
  std::vector<const ir::Node*> work;
  for (const ir::Node* o : g.outputs())
    if (hoistable.count(o)) work.push_back(o);
  for (auto& up : g.nodes()) {
    const ir::Node* n = up.get();
    if (hoistable.count(n) || n->op->kind == ops::OpKind::Source) continue;
    for (const ir::Node* in : n->inputs)
      if (in && hoistable.count(in) && !computed(in)) work.push_back(in);
  }
  while (!work.empty()) {
    const ir::Node* n = work.back();
    work.pop_back();
    if (!kept.insert(n).second) continue;
    // A kept node reads its inputs in the main graph: views and constants stay with it, a
    // computed value crosses.
    for (const ir::Node* in : n->inputs)
      if (in && hoistable.count(in) && !computed(in)) work.push_back(in);
  }
  // The values that cross: computed hoistable nodes a main-graph node reads.
  std::vector<ir::Node*> crossing;
  std::unordered_set<const ir::Node*> crossing_set;
  for (auto& up : g.nodes()) {
    const ir::Node* n = up.get();
    if (hoistable.count(n) && !kept.count(n)) continue;
    for (ir::Node* in : n->inputs)
      if (in && computed(in) && !kept.count(in) && crossing_set.insert(in).second) crossing.push_back(in);
  }
  if (crossing.empty()) return nullptr;

  // The prologue graph: the crossing values' ancestors, copied in order.
  std::unordered_set<const ir::Node*> needed;
  std::vector<const ir::Node*> stack(crossing.begin(), crossing.end());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (!needed.insert(n).second) continue;
    for (const ir::Node* in : n->inputs)
      if (in) stack.push_back(in);
  }
  auto pg = std::make_unique<ir::Graph>();
  std::unordered_map<const ir::Node*, ir::Node*> copy;
  for (auto& up : g.nodes()) {
    const ir::Node* n = up.get();
    if (!needed.count(n)) continue;
    if (n->op_name() == "placeholder") {
      copy[n] = pg->placeholder(n->name, n->meta);
      prologue_inputs.push_back(static_cast<int>(n->attrs.get_int("index")));
      continue;
    }
    std::vector<ir::Node*> inputs;
    for (const ir::Node* in : n->inputs) inputs.push_back(in ? copy.at(in) : nullptr);
    std::string error;
    pg->source_loc = n->source_loc;
    ir::Node* c = pg->add(n->op, inputs, n->attrs, error);
    // The same op on the same inputs infers the same result; anything else leaves the graph
    // whole, as it was.
    if (!c || c->meta.sizes != n->meta.sizes || c->meta.strides != n->meta.strides || c->meta.dtype != n->meta.dtype) {
      prologue_inputs.clear();
      return nullptr;
    }
    copy[n] = c;
  }
  for (ir::Node* n : crossing) pg->outputs().push_back(copy.at(n));

  // The main graph reads each crossing value as a new input, after the captured ones.
  for (ir::Node* n : crossing) {
    ir::Node* in = g.placeholder(n->name, n->meta);
    g.replace_all_uses(n, in);
  }
  // A deterministic torch_call the prologue computes is kept in the main graph only for the
  // errors it may raise, which the prologue's run raises: the main graph drops it once unused.
  dead_code_elimination(g);
  g.recompute_users();
  for (bool erased = true; erased;) {
    erased = false;
    g.erase_if([&](const ir::Node* n) {
      const bool gone = n->op == torch_call && n->users.empty() && needed.count(n) && !kept.count(n) &&
                        std::find(g.outputs().begin(), g.outputs().end(), n) == g.outputs().end();
      erased = erased || gone;
      return gone;
    });
    g.recompute_users();
  }
  dead_code_elimination(g);
  return pg;
}

}  // namespace kiln::passes
