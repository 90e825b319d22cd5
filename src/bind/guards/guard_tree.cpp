#include "bind/guards/guard_tree.h"

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>

#include "bind/guards/guards.h"

namespace kiln::bind {

PyObject** FetchedValues::reset(size_t n) {
  release();
  if (n <= std::size(local_)) {
    data_ = local_;
    std::fill(local_, local_ + n, nullptr);
  } else {
    heap_.assign(n, nullptr);
    data_ = heap_.data();
  }
  size_ = n;
  return data_;
}

void FetchedValues::release() {
  for (size_t i = 0; i < size_; ++i) Py_XDECREF(data_[i]);
  size_ = 0;
}

namespace {

// Guards whose check waits for the walk's end: they bind size symbols (their order in the set
// decides which value binds and which compares) or read values at two or more sources.
bool checked_late(const Guard& g) {
  switch (g.kind) {
    case Guard::Kind::Same:
    case Guard::Kind::NotSame:
    case Guard::Kind::NoAlias:
    case Guard::Kind::IntSymbol: return true;
    case Guard::Kind::Tensor: return !g.tensor.size_symbols.empty();
    default: return false;
  }
}

}  // namespace

GuardTree::GuardTree(const GuardSet& guards, const std::vector<SourcePtr>& fetch) {
  for (const Guard& g : guards.guards()) {
    if (g.is_global()) {
      process_checks_.push_back(&g);
      continue;
    }
    if (!checked_late(g)) {
      nodes_[node_for(g.source)].checks.push_back(&g);
      continue;
    }
    Late late{&g, {}};
    if (g.source) late.nodes.push_back(node_for(g.source));
    for (const SourcePtr& s : g.sources) late.nodes.push_back(node_for(s));
    late_.push_back(std::move(late));
  }
  // A per-call source (a seed, a module built at every call) is read once the guards held: its
  // slot stays empty, and the call reads it (run_entry).
  for (size_t i = 0; i < fetch.size(); ++i)
    if (!fetch[i]->per_call()) fetch_.emplace_back(static_cast<int>(i), node_for(fetch[i]));
  fetch_count_ = fetch.size();
  index_.clear();

  // Preorder (each subtree contiguous), so that a walk could pass over a subtree as a range.
  std::vector<std::vector<int>> children(nodes_.size());
  std::vector<int> roots;
  for (size_t i = 0; i < nodes_.size(); ++i) (nodes_[i].parent < 0 ? roots : children[nodes_[i].parent]).push_back(static_cast<int>(i));
  std::vector<int> order, renumber(nodes_.size());
  std::function<void(int)> visit = [&](int i) {
    renumber[i] = static_cast<int>(order.size());
    order.push_back(i);
    for (int c : children[i]) visit(c);
  };
  for (int r : roots) visit(r);
  std::vector<Node> sorted;
  sorted.reserve(nodes_.size());
  for (int i : order) {
    sorted.push_back(std::move(nodes_[i]));
    if (sorted.back().parent >= 0) sorted.back().parent = renumber[sorted.back().parent];
  }
  nodes_ = std::move(sorted);
  for (Late& l : late_)
    for (int& n : l.nodes) n = renumber[n];
  for (auto& [slot, node] : fetch_) node = renumber[node];
}

GuardTree::~GuardTree() = default;

int GuardTree::node_for(const SourcePtr& s) {
  const int parent = s->base ? node_for(s->base) : -1;
  // Two source objects for one place (capture builds L['self'].fc separately for a guard and
  // an input) share a node: same parent and the same step from it.
  // (Each Made source names one object the frame builds, each Pinned one the object it holds:
  // their names are unique.)
  const bool named = s->kind == Source::Kind::Global || s->kind == Source::Kind::Attr || s->kind == Source::Kind::Made ||
                     s->kind == Source::Kind::Pinned;
  StepKey key{parent,
              static_cast<int>(s->kind),
              s->kind == Source::Kind::Local ? s->local : static_cast<int64_t>(s->index),
              named ? s->name : std::string(),
              s->globals,
              s->kind == Source::Kind::Key || s->kind == Source::Kind::DictItem ? s->key : nullptr};
  auto [it, added] = index_.emplace(std::move(key), static_cast<int>(nodes_.size()));
  if (added) {
    keep_.push_back(s);
    nodes_.push_back(Node{s.get(), parent, {}});
  }
  return it->second;
}

bool GuardTree::check(const GuardSet& guards, const FrameView& f, FetchedValues& out) const {
  out.release();
  for (const Guard* g : process_checks_)
    if (!g->holds_globally()) return false;
  FetchedValues held;  // every node's value, until the walk ends
  PyObject** values = held.reset(nodes_.size());
  SymbolBindings bindings{&guards.symbols(), std::vector<int64_t>(guards.symbols().size(), -1)};
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    PyObject* v = n.parent < 0 ? read_root(*n.source, f) : read_from_base(*n.source, values[n.parent]);
    if (!v) return false;
    values[i] = v;
    for (const Guard* g : n.checks)
      if (!g->holds_for(v, bindings, nullptr)) return false;
  }
  for (const Late& l : late_) {
    const Guard& g = *l.guard;
    bool ok;
    if (g.kind == Guard::Kind::Same || g.kind == Guard::Kind::NotSame) {
      ok = (values[l.nodes[0]] == values[l.nodes[1]]) == (g.kind == Guard::Kind::Same);
    } else if (g.kind == Guard::Kind::NoAlias) {
      std::vector<PyObject*> at;
      for (int n : l.nodes) at.push_back(values[n]);
      ok = g.no_alias_holds(at.data());
    } else {
      ok = g.holds_for(values[l.nodes[0]], bindings, nullptr);
    }
    if (!ok) return false;
  }
  if (!guards.check_facts(bindings, nullptr)) return false;
  PyObject** fetched = out.reset(fetch_count_);
  for (const auto& [slot, node] : fetch_) fetched[slot] = Py_NewRef(values[node]);
  return true;
}

}  // namespace kiln::bind
