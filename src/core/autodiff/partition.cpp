#include "core/autodiff/partition.h"

#include <algorithm>
#include <limits>
#include <map>
#include <queue>

#include "core/ops/registry.h"
#include "core/sym/shape_env.h"

namespace kiln::autodiff {

using ir::Node;

namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

// Dinic's maximum flow; after run(), reachable() is the source side of a minimum cut.
class MaxFlow {
 public:
  explicit MaxFlow(int n) : adj_(static_cast<size_t>(n)) {}
  void edge(int a, int b, int64_t cap) {
    adj_[a].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({b, cap});
    adj_[b].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({a, 0});
  }
  void run(int s, int t) {
    while (levels(s, t)) {
      next_.assign(adj_.size(), 0);
      while (push(s, t, kInf) > 0) {}
    }
  }
  // Nodes reachable from s in the residual network.
  std::vector<bool> reachable(int s) const {
    std::vector<bool> seen(adj_.size(), false);
    std::vector<int> stack = {s};
    seen[static_cast<size_t>(s)] = true;
    while (!stack.empty()) {
      int v = stack.back();
      stack.pop_back();
      for (int e : adj_[static_cast<size_t>(v)])
        if (edges_[static_cast<size_t>(e)].cap > 0 && !seen[static_cast<size_t>(edges_[static_cast<size_t>(e)].to)]) {
          seen[static_cast<size_t>(edges_[static_cast<size_t>(e)].to)] = true;
          stack.push_back(edges_[static_cast<size_t>(e)].to);
        }
    }
    return seen;
  }

 private:
  struct Edge {
    int to;
    int64_t cap;
  };
  bool levels(int s, int t) {
    level_.assign(adj_.size(), -1);
    std::queue<int> q;
    level_[static_cast<size_t>(s)] = 0;
    q.push(s);
    while (!q.empty()) {
      int v = q.front();
      q.pop();
      for (int e : adj_[static_cast<size_t>(v)]) {
        const Edge& ed = edges_[static_cast<size_t>(e)];
        if (ed.cap > 0 && level_[static_cast<size_t>(ed.to)] < 0) {
          level_[static_cast<size_t>(ed.to)] = level_[static_cast<size_t>(v)] + 1;
          q.push(ed.to);
        }
      }
    }
    return level_[static_cast<size_t>(t)] >= 0;
  }
  int64_t push(int v, int t, int64_t f) {
    if (v == t) return f;
    for (size_t& i = next_[static_cast<size_t>(v)]; i < adj_[static_cast<size_t>(v)].size(); ++i) {
      const int e = adj_[static_cast<size_t>(v)][i];
      Edge& ed = edges_[static_cast<size_t>(e)];
      if (ed.cap <= 0 || level_[static_cast<size_t>(ed.to)] != level_[static_cast<size_t>(v)] + 1) continue;
      const int64_t got = push(ed.to, t, std::min(f, ed.cap));
      if (got > 0) {
        ed.cap -= got;
        edges_[static_cast<size_t>(e ^ 1)].cap += got;
        return got;
      }
    }
    return 0;
  }
  std::vector<std::vector<int>> adj_;
  std::vector<Edge> edges_;
  std::vector<int> level_;
  std::vector<size_t> next_;
};

// Bytes of a value, symbolic sizes at their hints (or 1024 when they have none).
int64_t bytes_of(const Node& n) {
  int64_t elems = 1;
  for (const sym::Expr& s : n.meta.sizes) {
    auto c = s.as_const();
    if (!c) c = sym::size_hint(s);
    elems *= c ? std::max<int64_t>(*c, 1) : 1024;
  }
  return std::max<int64_t>(elems * static_cast<int64_t>(dtype_size(n.meta.dtype)), 1);
}

}  // namespace

bool recomputable(const Node& n) {
  switch (n.op->kind) {
    case ops::OpKind::Pointwise:
    case ops::OpKind::View:
    case ops::OpKind::Reduction:
    case ops::OpKind::Gather:
      return true;
    case ops::OpKind::Source:  // Python numbers and sizes are free; graph inputs are inputs
      return n.op_name() != "placeholder";
    default:
      return false;
  }
}

Partition partition_joint(const ir::Graph& g, const JointGraph& jg) {
  Partition out;
  const std::vector<const Node*>& forward = jg.forward;
  const size_t fwd = forward.size();
  std::map<const Node*, int> index;
  for (size_t i = 0; i < fwd; ++i) index[forward[i]] = static_cast<int>(i);
  std::vector<const Node*> backward;
  for (const auto& n : g.nodes())
    if (!index.count(n.get())) backward.push_back(n.get());
  // Vertices: each forward node's in (2i) and out (2i + 1), then source and sink.
  const int source = static_cast<int>(2 * fwd), sink = source + 1;
  MaxFlow flow(sink + 1);
  for (size_t i = 0; i < fwd; ++i) {
    const Node* n = forward[i];
    const int in = static_cast<int>(2 * i), o = in + 1;
    // Python numbers and sizes cost nothing to have anywhere.
    const bool free = n->op->kind == ops::OpKind::Source && n->op_name() != "placeholder";
    flow.edge(in, o, free ? kInf : bytes_of(*n));
    if (n->op_name() == "placeholder" || !recomputable(*n)) flow.edge(source, in, kInf);
    for (const Node* u : n->inputs)
      if (u && index.count(u)) flow.edge(2 * index[u] + 1, in, kInf);
  }
  // What the backward reads of the forward goes to the sink.
  for (const Node* b : backward)
    for (const Node* u : b->inputs)
      if (u && index.count(u)) flow.edge(2 * index[u] + 1, sink, kInf);
  flow.run(source, sink);
  const std::vector<bool> side = flow.reachable(source);
  std::set<const Node*> needed;  // forward nodes the backward reaches through recomputation
  for (const Node* b : backward)
    for (const Node* u : b->inputs)
      if (u && index.count(u)) needed.insert(u);
  // Saved: the cut (source-side in, sink-side out). Recomputed: sink-side nodes the backward
  // needs, walked back from what it reads until a saved value.
  for (size_t i = 0; i < fwd; ++i) {
    const Node* n = forward[i];
    if (side[2 * i] && !side[2 * i + 1] && !(n->op->kind == ops::OpKind::Source && n->op_name() != "placeholder")) {
      out.saved.push_back(n);
      out.saved_bytes += bytes_of(*n);
    }
  }
  std::set<const Node*> saved(out.saved.begin(), out.saved.end());
  std::vector<const Node*> work(needed.begin(), needed.end());
  while (!work.empty()) {
    const Node* n = work.back();
    work.pop_back();
    if (saved.count(n) || n->op->kind == ops::OpKind::Source || !out.recomputed.insert(n).second) continue;
    for (const Node* u : n->inputs)
      if (u && index.count(u)) work.push_back(u);
  }
  return out;
}

namespace {

// Copies nodes of one graph into another, their inputs mapped through `map`; Python numbers and
// sizes a copied node reads are copied on first use.
class Copier {
 public:
  explicit Copier(ir::Graph& to) : to_(to) {}
  std::map<const Node*, Node*> map;
  Node* copy(const Node& n, std::string& why) {
    std::vector<Node*> in;
    for (const Node* u : n.inputs) {
      if (!u) {
        in.push_back(nullptr);
        continue;
      }
      Node* m = lookup(*u, why);
      if (!m) return nullptr;
      in.push_back(m);
    }
    Node* c = to_.add(n.op, in, n.attrs, why);
    if (c) {
      c->source_loc = n.source_loc;
      map[&n] = c;
    }
    return c;
  }
  Node* lookup(const Node& u, std::string& why) {
    auto it = map.find(&u);
    if (it != map.end()) return it->second;
    if (u.op->kind == ops::OpKind::Source && u.op_name() != "placeholder") return copy(u, why);
    why = "kiln: " + u.name + " is neither saved nor recomputed";
    return nullptr;
  }

 private:
  ir::Graph& to_;
};

ir::TensorMeta as_input(const Node& n) {
  ir::TensorMeta m = n.meta;
  m.offset = 0;
  return m;
}

}  // namespace

bool split_joint(const ir::Graph& g, const JointGraph& jg, const Partition& p, SplitGraphs& out, std::string& why) {
  std::set<const Node*> forward_set(jg.forward.begin(), jg.forward.end());
  std::set<const Node*> tangents(jg.tangents.begin(), jg.tangents.end());
  out.forward = std::make_unique<ir::Graph>();
  out.backward = std::make_unique<ir::Graph>();
  Copier f(*out.forward);
  for (const Node* n : jg.forward) {
    if (n->op_name() == "placeholder") f.map[n] = out.forward->placeholder(n->name, n->meta);
    else if (!f.copy(*n, why)) return false;
  }
  for (size_t i = 0; i < jg.forward_outputs; ++i) out.forward->outputs().push_back(f.map.at(g.outputs()[i]));
  for (const Node* s : p.saved) out.forward->outputs().push_back(f.map.at(s));
  Copier b(*out.backward);
  for (const Node* s : p.saved) b.map[s] = out.backward->placeholder("saved_" + s->name, as_input(*s));
  for (const Node* t : jg.tangents)
    if (t) b.map[t] = out.backward->placeholder(t->name, t->meta);
  for (const Node* n : jg.forward)
    if (p.recomputed.count(n) && !b.copy(*n, why)) return false;
  for (const auto& up : g.nodes()) {
    const Node* n = up.get();
    if (forward_set.count(n) || tangents.count(n)) continue;
    if (!b.copy(*n, why)) return false;
  }
  for (const Node* gr : jg.grads)
    if (gr) out.backward->outputs().push_back(b.map.at(gr));
  out.forward->recompute_users();
  out.backward->recompute_users();
  return true;
}

}  // namespace kiln::autodiff
