#include "core/autodiff/training_graphs.h"

#include <map>
#include <stdexcept>

#include "core/autodiff/joint_graph.h"
#include "core/autodiff/partition.h"
#include "core/ops/registry.h"
#include "core/passes/passes.h"
#include "core/sym/expr.h"

namespace kiln::autodiff {

using ir::Node;

namespace {

// Where capture recorded an untracked node reading a tracked value (made under no_grad), the
// value goes through a detaching alias first, so the cut survives decomposition.
void detach_untracked_reads(ir::Graph& g, const std::set<const Node*>& tracked) {
  std::vector<Node*> order;
  for (const auto& n : g.nodes()) order.push_back(n.get());
  std::map<Node*, Node*> detached;
  for (Node* n : order) {
    if (tracked.count(n) || n->op->kind == ops::OpKind::Source || !is_floating(n->meta.dtype)) continue;
    for (Node*& in : n->inputs) {
      if (!in || !tracked.count(in)) continue;
      auto [it, fresh] = detached.emplace(in, nullptr);
      if (fresh) {
        ir::Attrs a;
        a.set("detach", true);
        const size_t tail = g.nodes().size();
        it->second = g.must_add("alias", {in}, a);
        g.move_tail_before(tail, n);
      }
      in = it->second;
    }
  }
  g.recompute_users();
}

// What eager's version counters would say of the captured graph, found before composites
// decompose away (output indices outlive that): the outputs that are (views of) a result torch's
// backward reads (OpDef::saves_result) or share memory with an input it keeps
// (OpDef::keeps_inputs), and such a value changed in place in the graph.
struct VersionFacts {
  std::set<size_t> witnesses;
  std::string stale_error;         // empty: no such value changed in place
  std::set<size_t> stale_outputs;  // graph outputs that depend on one
};

// `what`: the value autograd saved ("result of exp", "an input of mm"), `n` its node.
std::string modified_message(const Node& n, const std::string& what) {
  std::string sizes;
  for (const sym::Expr& d : n.meta.sizes) sizes += (sizes.empty() ? "" : ", ") + d.str();
  return "one of the variables needed for gradient computation has been modified by an inplace operation: " + what +
         " [" + sizes + "]" + (n.source_loc.empty() ? "" : " (" + n.source_loc + ")") +
         " was changed in place after autograd saved it";
}

// Whether torch's backward of `n` reads its result: the op's registry entry says so, or, for a
// torch_call, capture found torch's autograd node keeping it (attribute `saves_result`).
bool saves_result(const Node& n) { return n.op->saves_result || n.attrs.get_bool("saves_result"); }

// The tensor whose version counter `n` shares: the first input through views and ops that may
// alias it, unless this node copies (a reshape of memory no strides describe).
const Node* memory_root(const Node* n) {
  while (n && n->op->aliases() && !n->inputs.empty() && !(n->op->copies && n->op->copies(*n))) n = n->inputs[0];
  return n;
}

// An input torch's backward of `n` keeps (OpDef::keeps_inputs, given which inputs need a
// gradient), whose memory was changed in place after `n` read it; nullptr if none.
// Whether torch keeps input k of `n` for its backward, given which inputs need a gradient: its
// registry entry says so, or, for a torch_call, capture found torch's node keeping it.
bool keeps_input(const Node& n, size_t k, const std::set<const Node*>& active) {
  if (n.attrs.has("kept_inputs")) {
    for (int64_t i : n.attrs.get_ints("kept_inputs"))
      if (static_cast<size_t>(i) == k) return true;
    return false;
  }
  const auto& keeps = n.op->keeps_inputs;
  if (k >= keeps.size()) return false;
  for (size_t j : keeps[k])
    if (j < n.inputs.size() && n.inputs[j] && active.count(n.inputs[j])) return true;
  return false;
}

// Whether torch keeps n's result: always for some ops (saves_result), for others while an input
// needs a gradient (pow's exponent: result * log(self)).
bool keeps_result(const Node& n, const std::set<const Node*>& active) {
  if (saves_result(n)) return true;
  for (size_t j : n.op->keeps_result_for)
    if (j < n.inputs.size() && n.inputs[j] && active.count(n.inputs[j])) return true;
  return false;
}

// Whether the update that replaced `root` is `n`'s own (an in-place op: x.mul_(c) is mul(x, c)
// taking x's place, or, through a view, the view_scatter of n's result): torch's in-place op
// keeps the value of its target (input 0) before its update, so that one is not stale. Another
// input in the same memory (x.mul_(x), x[0].mul_(x[1])) is kept as it was, and the op's own
// update makes it stale (fuzz_grad seed 503098).
bool own_update(const Node& n, size_t k, const Node& root, const std::map<int64_t, const Node*>& by_id) {
  if (k != 0) return false;
  auto it = by_id.find(root.attrs.get_int("modified_by", -1));
  if (it == by_id.end()) return false;
  const Node* by = it->second;
  return by == &n || (by->attrs.get_bool("view_scatter") && by->inputs.size() > 1 && by->inputs[1] == &n);
}

// An input torch's backward of `n` keeps, whose memory was changed in place after `n` read it;
// nullptr if none.
const Node* stale_kept_input(const Node& n, const std::set<const Node*>& active, const std::map<int64_t, const Node*>& by_id) {
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const Node* root = n.inputs[k] && keeps_input(n, k, active) ? memory_root(n.inputs[k]) : nullptr;
    if (root && root->attrs.get_bool("result_modified") && !own_update(n, k, *root, by_id)) return n.inputs[k];
  }
  return nullptr;
}

VersionFacts version_facts(const ir::Graph& g, const std::vector<Node*>& wrt) {
  VersionFacts f;
  // eager's backward raises once a gradient reaches a stale result or kept input
  std::set<const Node*> active(wrt.begin(), wrt.end()), reach, kept_memory;
  std::map<int64_t, const Node*> by_id;
  for (const auto& n : g.nodes()) by_id[n->id] = n.get();
  for (const auto& n : g.nodes()) {
    bool on_path = false, reached = false;
    for (const Node* in : n->inputs) on_path = on_path || (in && active.count(in)), reached = reached || (in && reach.count(in));
    // No gradient flows through a value that is not floating (a comparison feeding where's
    // condition): what it reads is no saved value on a gradient's path (fuzz_grad seed 596017).
    if (!is_floating(n->meta.dtype)) on_path = reached = false;
    // A detaching alias (a read under no_grad, detach_untracked_reads) ends the path: autograd
    // saves nothing past it.
    if (n->attrs.get_bool("detach")) on_path = false;
    if (on_path) active.insert(n.get());
    for (size_t k = 0; on_path && k < n->inputs.size(); ++k)
      if (n->inputs[k] && keeps_input(*n, k, active)) kept_memory.insert(memory_root(n->inputs[k]));
    if (on_path && keeps_result(*n, active)) kept_memory.insert(n.get());
    if (on_path && keeps_result(*n, active) && n->attrs.get_bool("result_modified")) {
      if (f.stale_error.empty()) f.stale_error = modified_message(*n, "result of " + n->op_name());
      reached = true;
    }
    if (const Node* kept = on_path ? stale_kept_input(*n, active, by_id) : nullptr) {
      if (f.stale_error.empty()) f.stale_error = modified_message(*kept, "an input of " + n->op_name());
      reached = true;
    }
    if (reached) reach.insert(n.get());
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    if (reach.count(g.outputs()[i])) f.stale_outputs.insert(i);
    // an output sharing memory with a kept input, or a view of a saved result: changed in place
    // after the call (at a graph break), eager's backward would raise
    const Node* o = g.outputs()[i];
    while (o && o->op->kind == ops::OpKind::View && !o->inputs.empty()) o = o->inputs[0];
    if (o && (saves_result(*o) || kept_memory.count(memory_root(g.outputs()[i])))) f.witnesses.insert(i);
  }
  return f;
}

// TrainingGraphs::backward_error, error_tangents and result_witnesses.
void version_checks(const VersionFacts& f, size_t outputs, TrainingGraphs& out) {
  out.backward_error = f.stale_error;
  for (size_t i : f.stale_outputs)
    if (i < outputs && out.tangent_of[i] >= 0) out.error_tangents.push_back(out.tangent_of[i]);
  for (size_t i : f.witnesses)
    if (i < outputs && out.tangent_of[i] >= 0) out.result_witnesses.push_back(static_cast<int>(i));
}

}  // namespace

namespace {

void collect(const sym::Expr& e, std::set<sym::Expr>& out) {
  if (!e.valid()) return;
  std::vector<sym::Expr> syms;
  sym::collect_symbols(e, syms);
  out.insert(syms.begin(), syms.end());
}

// The size symbols the backward reads that neither its inputs' sizes nor the forward's Python
// ints bind: appended to its scalar_symbols, each with the forward input dim it is read from.
void bind_backward_symbols(const ir::Graph& fwd, ir::Graph& bwd, std::vector<std::pair<int, int>>& dims) {
  std::set<sym::Expr> used, bound(bwd.scalar_symbols.begin(), bwd.scalar_symbols.end());
  for (const auto& n : bwd.nodes()) {
    for (const auto* list : {&n->meta.sizes, &n->meta.strides})
      for (const sym::Expr& e : *list) collect(e, used);
    collect(n->meta.offset, used);
    for (const auto& [k, v] : n->attrs.items()) {
      if (auto* e = std::get_if<sym::Expr>(&v)) collect(*e, used);
      if (auto* l = std::get_if<std::vector<sym::Expr>>(&v))
        for (const sym::Expr& e : *l) collect(e, used);
    }
  }
  for (const ir::Node* in : bwd.inputs())
    for (const sym::Expr& e : in->meta.sizes)
      if (e.is_size_symbol()) bound.insert(e);
  for (const sym::Expr& s : used) {
    if (bound.count(s) || !s.is_size_symbol()) continue;
    bool found = false;
    for (size_t i = 0; i < fwd.inputs().size() && !found; ++i)
      for (size_t d = 0; d < fwd.inputs()[i]->meta.sizes.size() && !found; ++d)
        if (fwd.inputs()[i]->meta.sizes[d] == s) {
          dims.emplace_back(static_cast<int>(i), static_cast<int>(d));
          bwd.scalar_symbols.push_back(s);
          found = true;
        }
    if (!found) throw std::runtime_error("kiln: the backward reads size " + s.str() + ", which no forward input has");
  }
}

bool make_training_graphs_or_throw(ir::Graph& g, const std::vector<Node*>& wrt, const std::set<const Node*>& tracked,
                                   TrainingGraphs& out, std::string& why);
}

bool make_training_graphs(ir::Graph& g, const std::vector<Node*>& wrt, const std::set<const Node*>& tracked,
                          TrainingGraphs& out, std::string& why) {
  // A decomposition or a derivative that meets a case it does not cover throws (a shape rule
  // on symbolic sizes): the call then runs eagerly with that reason, never ends the process.
  try {
    return make_training_graphs_or_throw(g, wrt, tracked, out, why);
  } catch (const std::exception& e) {
    why = e.what();
    out = TrainingGraphs{};
    return false;
  }
}

namespace {
bool make_training_graphs_or_throw(ir::Graph& g, const std::vector<Node*>& wrt, const std::set<const Node*>& tracked,
                                   TrainingGraphs& out, std::string& why) {
  out = TrainingGraphs{};
  detach_untracked_reads(g, tracked);
  const VersionFacts versions = version_facts(g, wrt);
  // Composite ops are differentiated through what they decompose into, unless their entry has
  // a derivative of its own (clamp: torch's mask at the bounds, where max/min would halve).
  passes::decompose(g, [](const Node& n) { return static_cast<bool>(n.op->derivative); });
  JointGraph jg;
  if (!build_joint(g, wrt, jg, why)) return false;
  const Partition p = partition_joint(g, jg);
  SplitGraphs split;
  if (!split_joint(g, jg, p, split, why)) return false;
  out.forward = std::move(split.forward);
  out.backward = std::move(split.backward);
  for (ir::Graph* h : {out.forward.get(), out.backward.get()}) {
    passes::drop_detach_aliases(*h);
    passes::common_subexpression_elimination(*h);
  }
  out.forward->scalar_symbols = g.scalar_symbols;
  out.backward->scalar_symbols = g.scalar_symbols;
  bind_backward_symbols(*out.forward, *out.backward, out.backward_symbol_dims);
  out.forward->scalar_inputs = g.scalar_inputs;
  out.backward->scalar_inputs = g.scalar_inputs;
  out.outputs = jg.forward_outputs;
  out.saved = p.saved.size();
  out.saved_bytes = p.saved_bytes;
  out.recomputed = p.recomputed.size();
  int tangents = 0;
  for (const Node* t : jg.tangents) out.tangent_of.push_back(t ? tangents++ : -1);
  for (const Node* s : p.saved) {
    int as_output = -1;
    for (size_t i = 0; i < jg.forward_outputs && as_output < 0; ++i)
      if (g.outputs()[i] == s && out.tangent_of[i] >= 0) as_output = static_cast<int>(i);
    out.saved_as_output.push_back(as_output);
  }
  version_checks(versions, jg.forward_outputs, out);
  int grads = 0;
  for (const Node* gr : jg.grads) out.grad_of.push_back(gr ? grads++ : -1);
  std::map<const Node*, int> tangent_index;
  for (size_t i = 0; i < jg.tangents.size(); ++i)
    if (jg.tangents[i]) tangent_index[jg.tangents[i]] = out.tangent_of[i];
  for (const Node* gr : jg.grads) {
    std::set<int> reached;
    std::set<const Node*> seen;
    std::vector<const Node*> stack;
    if (gr) stack.push_back(gr);
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      if (!n || !seen.insert(n).second) continue;
      if (auto it = tangent_index.find(n); it != tangent_index.end()) reached.insert(it->second);
      for (const Node* in : n->inputs) stack.push_back(in);
    }
    out.grad_tangents.emplace_back(reached.begin(), reached.end());
  }
  return true;
}

}  // namespace

void free_saved_layouts(TrainingGraphs& t) {
  std::vector<bool>& free = t.forward->free_layout_outputs;
  free.assign(t.forward->outputs().size(), false);
  for (size_t j = 0; j < t.saved && t.outputs + j < free.size(); ++j) free[t.outputs + j] = t.saved_as_output[j] < 0;
}

void adopt_saved_layouts(TrainingGraphs& t) {
  ir::Graph& bwd = *t.backward;
  bool changed = false;
  for (size_t j = 0; j < t.saved && j < bwd.inputs().size() && t.outputs + j < t.forward->outputs().size(); ++j) {
    const ir::TensorMeta& saved = t.forward->outputs()[t.outputs + j]->meta;
    Node* ph = bwd.inputs()[j];
    if (saved.strides == ph->meta.strides || saved.sizes != ph->meta.sizes || saved.dtype != ph->meta.dtype) continue;
    const std::vector<sym::Expr> expected = ph->meta.strides;
    std::vector<Node*> readers = ph->users;
    ph->meta.strides = saved.strides;
    ph->meta.offset = saved.offset;
    const size_t tail = bwd.nodes().size();
    Node* copy = bwd.must_add("contiguous", {ph});
    if (copy->meta.strides != expected) throw std::logic_error("kiln: a saved value's layout cannot be adopted");
    // Right after the placeholders: every reader comes later.
    const Node* first = nullptr;
    for (const auto& n : bwd.nodes())
      if (n->op_name() != "placeholder" && n.get() != copy) {
        first = n.get();
        break;
      }
    if (first) bwd.move_tail_before(tail, first);
    for (Node* r : readers)
      for (Node*& in : r->inputs)
        if (in == ph) in = copy;
    for (Node*& o : bwd.outputs())
      if (o == ph) o = copy;
    changed = true;
  }
  if (changed) bwd.recompute_users();
}

}  // namespace kiln::autodiff
