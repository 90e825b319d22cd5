#include "core/autodiff/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <queue>

#include "core/autodiff/node_copier.h"
#include "core/ops/registry.h"

namespace kiln::autodiff {

using ir::Node;

namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

// Dinic's maximum flow; after run(), reachable() is the source side of a minimum cut.
class MaxFlow {
 public:
  explicit MaxFlow(size_t n) : adj_(n) {}
  void edge(size_t a, size_t b, int64_t cap) {
    adj_[a].push_back(edges_.size());
    edges_.push_back({b, cap});
    adj_[b].push_back(edges_.size());
    edges_.push_back({a, 0});
  }
  void run(size_t s, size_t t) {
    while (levels(s, t)) {
      next_.assign(adj_.size(), 0);
      while (push(s, t, kInf) > 0) {}
    }
  }
  // Vertices reachable from s in the residual network.
  std::vector<bool> reachable(size_t s) const {
    std::vector<bool> seen(adj_.size(), false);
    std::vector<size_t> stack = {s};
    seen[s] = true;
    while (!stack.empty()) {
      const size_t v = stack.back();
      stack.pop_back();
      for (size_t e : adj_[v])
        if (edges_[e].cap > 0 && !seen[edges_[e].to]) {
          seen[edges_[e].to] = true;
          stack.push_back(edges_[e].to);
        }
    }
    return seen;
  }

 private:
  struct Edge {
    size_t to;
    int64_t cap;
  };
  bool levels(size_t s, size_t t) {
    level_.assign(adj_.size(), -1);
    std::queue<size_t> q;
    level_[s] = 0;
    q.push(s);
    while (!q.empty()) {
      const size_t v = q.front();
      q.pop();
      for (size_t e : adj_[v])
        if (edges_[e].cap > 0 && level_[edges_[e].to] < 0) {
          level_[edges_[e].to] = level_[v] + 1;
          q.push(edges_[e].to);
        }
    }
    return level_[t] >= 0;
  }
  int64_t push(size_t v, size_t t, int64_t f) {
    if (v == t) return f;
    for (size_t& i = next_[v]; i < adj_[v].size(); ++i) {
      const size_t e = adj_[v][i];
      Edge& ed = edges_[e];
      if (ed.cap <= 0 || level_[ed.to] != level_[v] + 1) continue;
      const int64_t got = push(ed.to, t, std::min(f, ed.cap));
      if (got > 0) {
        ed.cap -= got;
        edges_[e ^ 1].cap += got;
        return got;
      }
    }
    return 0;
  }
  std::vector<std::vector<size_t>> adj_;
  std::vector<Edge> edges_;
  std::vector<int> level_;
  std::vector<size_t> next_;
};

}  // namespace

bool checkpointed(const Node& n) { return n.attrs.get_bool("checkpoint"); }

bool recomputable(const Node& n) {
  switch (n.op->kind) {
    case ops::OpKind::Reduction: {
      // A reduction to less than a quarter of what it reads (a norm's row statistics) is kept:
      // recomputing it reads its whole input again, and a chain of them (each layer's norm reads
      // the last one's output) would put every layer's statistics in one serial backward
      // kernel. Its small result is cheap to save (AOTAutograd bans the same reductions).
      int64_t read = 0;
      for (const Node* u : n.inputs)
        if (u) read += bytes_of(*u);
      return bytes_of(n) * 4 >= read;
    }
    case ops::OpKind::Pointwise:
    case ops::OpKind::View:
    case ops::OpKind::Gather:
    case ops::OpKind::Composite:  // kept whole only when it has a derivative of its own: clamp
      return true;
    case ops::OpKind::Source:  // Python numbers and sizes are free; graph inputs are inputs
      return constant(n);
    default:
      return false;
  }
}

Partition partition_joint(const ir::Graph& g, const JointGraph& jg) {
  Partition out;
  const std::vector<const Node*>& forward = jg.forward;
  std::map<const Node*, size_t> index;
  for (size_t i = 0; i < forward.size(); ++i) index[forward[i]] = i;
  // The forward values the backward reads.
  std::set<const Node*> read;
  for (const auto& b : g.nodes())
    if (!index.count(b.get()))
      for (const Node* u : b->inputs)
        if (u && index.count(u)) read.insert(u);
  // A gradient that does not read the incoming one (a custom backward returning a constant, or
  // a function of the forward's values alone) is a forward value the backward hands out
  for (const Node* gr : jg.grads)
    if (gr && index.count(gr)) read.insert(gr);
  // torch.utils.checkpoint regions (nodes marked `checkpoint`): their interior values (read by
  // nothing outside the region and not outputs) are never saved, and their matrix products and
  // other externs are recomputed like the rest; what leaves a region may be saved.
  std::set<const Node*> leaves;
  for (size_t i = 0; i < jg.forward_outputs; ++i) leaves.insert(g.outputs()[i]);
  for (const Node* n : forward)
    if (!checkpointed(*n))
      for (const Node* u : n->inputs)
        if (u) leaves.insert(u);
  // Each forward node's distance from the backward: 1 for a value the backward reads, else one
  // more than its nearest user's. Saving a value costs its bytes times 1.1 per step of distance
  // (at most 100), as AOTAutograd weighs them: between cuts of equal bytes, the one nearer the
  // backward wins, so that the backward does not rebuild a value through a long chain of
  // recomputation from far back in the forward. Graph inputs cost their bytes alone: their
  // owner keeps them alive anyway (not those the graph updates in place: their old value is
  // not kept, and a saved one would be at another version by the backward).
  std::vector<int> distance(forward.size(), 100);
  for (size_t i = forward.size(); i-- > 0;) {  // users come after: a node's distance is final here
    if (read.count(forward[i])) distance[i] = 1;
    for (const Node* u : forward[i]->inputs)
      if (auto it = u ? index.find(u) : index.end(); it != index.end())
        distance[it->second] = std::min(distance[it->second], distance[i] + 1);
  }
  std::set<int64_t> updated;
  for (const auto& [input, output] : g.input_updates) updated.insert(input);
  auto weight = [&](size_t i) {
    if (forward[i]->op_name() == "placeholder" && !updated.count(forward[i]->attrs.get_int("index", -1)))
      return bytes_of(*forward[i]);
    return static_cast<int64_t>(static_cast<double>(bytes_of(*forward[i])) * std::pow(1.1, distance[i]));
  };
  // Vertices: each forward node's in (2i) and out (2i + 1), then source and sink.
  const size_t source = 2 * forward.size(), sink = source + 1;
  MaxFlow flow(sink + 1);
  for (size_t i = 0; i < forward.size(); ++i) {
    const Node* n = forward[i];
    const bool interior = checkpointed(*n) && !leaves.count(n);
    flow.edge(2 * i, 2 * i + 1, constant(*n) || interior ? kInf : weight(i));
    if (n->op_name() == "placeholder" || (!recomputable(*n) && !checkpointed(*n))) flow.edge(source, 2 * i, kInf);
    for (const Node* u : n->inputs)
      if (u && index.count(u)) flow.edge(2 * index[u] + 1, 2 * i, kInf);
    if (read.count(n)) flow.edge(2 * i + 1, sink, kInf);
  }
  flow.run(source, sink);
  // Saved: the cut (in on the source side, out on the sink side).
  const std::vector<bool> side = flow.reachable(source);
  for (size_t i = 0; i < forward.size(); ++i)
    if (side[2 * i] && !side[2 * i + 1] && !constant(*forward[i])) {
      out.saved.push_back(forward[i]);
      out.saved_bytes += bytes_of(*forward[i]);
    }
  // Recomputed: what the backward reads, walked back until a saved value.
  std::set<const Node*> saved(out.saved.begin(), out.saved.end());
  std::vector<const Node*> work(read.begin(), read.end());
  while (!work.empty()) {
    const Node* n = work.back();
    work.pop_back();
    if (saved.count(n) || n->op->kind == ops::OpKind::Source || !out.recomputed.insert(n).second) continue;
    for (const Node* u : n->inputs)
      if (u && index.count(u)) work.push_back(u);
  }
  return out;
}

bool split_joint(const ir::Graph& g, const JointGraph& jg, const Partition& p, SplitGraphs& out, std::string& why) {
  std::set<const Node*> forward_set(jg.forward.begin(), jg.forward.end());
  std::set<const Node*> tangents(jg.tangents.begin(), jg.tangents.end());
  out.forward = std::make_unique<ir::Graph>();
  out.backward = std::make_unique<ir::Graph>();
  NodeCopier f(*out.forward);
  for (const Node* n : jg.forward) {
    if (n->op_name() == "placeholder") f.map[n] = out.forward->placeholder(n->name, n->meta);
    else if (!f.copy(*n, why)) return false;
  }
  for (size_t i = 0; i < jg.forward_outputs; ++i) out.forward->outputs().push_back(f.map.at(g.outputs()[i]));
  for (const Node* s : p.saved) out.forward->outputs().push_back(f.map.at(s));
  NodeCopier b(*out.backward);
  for (const Node* s : p.saved) b.map[s] = out.backward->placeholder("saved_" + s->name, as_input(*s));
  for (const Node* t : jg.tangents)
    if (t) b.map[t] = out.backward->placeholder(t->name, t->meta);
  // A recomputed forward node is copied just before the first backward node that reads it, so
  // that the backward program makes each recomputed value when it needs it, not all of them at
  // its start (where they would all be alive at once).
  auto recompute = [&](const Node* root) {
    std::vector<std::pair<const Node*, bool>> work{{root, false}};
    while (!work.empty()) {
      auto [n, inputs_done] = work.back();
      work.pop_back();
      if (b.map.count(n)) continue;
      if (inputs_done) {
        if (!b.copy(*n, why)) return false;
        continue;
      }
      work.emplace_back(n, true);
      for (const Node* u : n->inputs)
        if (u && p.recomputed.count(u) && !b.map.count(u)) work.emplace_back(u, false);
    }
    return true;
  };
  auto recompute_inputs = [&](const Node& n) {
    for (const Node* u : n.inputs)
      if (u && p.recomputed.count(u) && !b.map.count(u) && !recompute(u)) return false;
    return true;
  };
  for (const auto& up : g.nodes()) {
    const Node* n = up.get();
    if (forward_set.count(n) || tangents.count(n)) continue;
    if (!recompute_inputs(*n) || !b.copy(*n, why)) return false;
  }
  for (const Node* gr : jg.grads) {
    if (!gr) continue;
    if (p.recomputed.count(gr) && !recompute(gr)) return false;
    out.backward->outputs().push_back(b.map.at(gr));
  }
  out.forward->recompute_users();
  out.backward->recompute_users();
  return true;
}

}  // namespace kiln::autodiff
