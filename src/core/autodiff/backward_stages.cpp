#include "core/autodiff/backward_stages.h"

#include <algorithm>
#include <climits>
#include <map>
#include <numeric>

#include "core/autodiff/node_copier.h"

namespace kiln::autodiff {

using ir::Node;

namespace {

// Which stage computes each gradient: in the order the program computes them, closing a stage
// once its gradients' bytes reach its cap.
std::vector<int> stage_of_gradients(const ir::Graph& b, const std::map<const Node*, size_t>& pos, int64_t first_cap,
                                    int64_t cap) {
  const auto& outs = b.outputs();
  std::vector<size_t> order(outs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return pos.at(outs[x]) < pos.at(outs[y]); });
  std::vector<int> stage(outs.size(), 0);
  int s = 0;
  int64_t filled = 0;
  for (size_t k : order) {
    if (filled >= (s == 0 ? first_cap : cap)) {
      ++s;
      filled = 0;
    }
    stage[k] = s;
    filled += bytes_of(*outs[k]);
  }
  return stage;
}

}  // namespace

bool split_backward_stages(const ir::Graph& b, size_t saved, int64_t first_cap, int64_t cap,
                           std::vector<BackwardStage>& out, std::string& why) {
  out.clear();
  const auto& nodes = b.nodes();
  const auto& outs = b.outputs();
  std::map<const Node*, size_t> pos;
  for (size_t i = 0; i < nodes.size(); ++i) pos[nodes[i].get()] = i;
  std::map<const Node*, int> saved_index;
  for (size_t i = 0; i < saved && i < b.inputs().size(); ++i) saved_index[b.inputs()[i]] = static_cast<int>(i);
  auto is_saved = [&](const Node* n) { return saved_index.count(n) > 0; };
  auto is_tangent = [&](const Node* n) { return n->op_name() == "placeholder" && !is_saved(n); };

  const std::vector<int> grad_stage = stage_of_gradients(b, pos, first_cap, cap);
  const int stages = grad_stage.empty() ? 1 : *std::max_element(grad_stage.begin(), grad_stage.end()) + 1;
  if (stages < 2) return true;

  // Every node in the earliest stage that reads it (a gradient: at the latest in its own).
  std::vector<int> stage(nodes.size(), INT_MAX);
  for (size_t k = 0; k < outs.size(); ++k) stage[pos.at(outs[k])] = std::min(stage[pos.at(outs[k])], grad_stage[k]);
  for (size_t i = nodes.size(); i-- > 0;)
    for (const Node* u : nodes[i]->users) stage[i] = std::min(stage[i], stage[pos.at(u)]);
  for (size_t i = 0; i < nodes.size(); ++i)
    if (is_tangent(nodes[i].get())) stage[i] = 0;  // the first stage receives them all
  auto computed = [&](const Node* n) { return !constant(*n) && !is_saved(n); };

  // What each stage reads from earlier ones (tangents from the first), in program order.
  std::vector<std::vector<const Node*>> received(static_cast<size_t>(stages));
  std::vector<std::vector<bool>> sends(static_cast<size_t>(stages), std::vector<bool>(nodes.size(), false));
  std::vector<std::vector<bool>> reads(static_cast<size_t>(stages), std::vector<bool>(nodes.size(), false));
  auto read = [&](int s, const Node* v) {
    if (!v || !computed(v)) return;
    const size_t p = pos.at(v);
    if (stage[p] < s) reads[static_cast<size_t>(s)][p] = true;
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node* n = nodes[i].get();
    if (stage[i] == INT_MAX || !computed(n) || is_tangent(n)) continue;
    for (const Node* u : n->inputs) read(stage[i], u);
  }
  for (size_t k = 0; k < outs.size(); ++k) read(grad_stage[k], outs[k]);
  for (int s = 0; s < stages; ++s)
    for (size_t i = 0; i < nodes.size(); ++i)
      if (reads[static_cast<size_t>(s)][i]) {
        received[static_cast<size_t>(s)].push_back(nodes[i].get());
        sends[static_cast<size_t>(stage[i])][i] = true;
      }
  std::vector<std::map<const Node*, int>> output_of(static_cast<size_t>(stages));

  for (int s = 0; s < stages; ++s) {
    const auto su = static_cast<size_t>(s);
    BackwardStage st;
    st.graph = std::make_unique<ir::Graph>();
    ir::Graph& g = *st.graph;
    NodeCopier c(g);
    std::vector<bool> wants_saved(saved, false);
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node* n = nodes[i].get();
      if (stage[i] != s || !computed(n) || is_tangent(n)) continue;
      for (const Node* u : n->inputs)
        if (u && is_saved(u)) wants_saved[static_cast<size_t>(saved_index.at(u))] = true;
    }
    for (size_t k = 0; k < outs.size(); ++k)
      if (grad_stage[k] == s && is_saved(outs[k])) wants_saved[static_cast<size_t>(saved_index.at(outs[k]))] = true;
    for (size_t j = 0; j < saved; ++j)
      if (wants_saved[j]) {
        const Node* in = b.inputs()[j];
        c.map[in] = g.placeholder(in->name, in->meta);
        st.saved.push_back(static_cast<int>(j));
      }
    if (s == 0) {
      for (size_t i = saved; i < b.inputs().size(); ++i) c.map[b.inputs()[i]] = g.placeholder(b.inputs()[i]->name, b.inputs()[i]->meta);
    } else {
      for (const Node* v : received[su]) {
        c.map[v] = g.placeholder(v->name, is_tangent(v) ? v->meta : as_input(*v));
        const int from = stage[pos.at(v)];
        st.received.push_back({from, output_of[static_cast<size_t>(from)].at(v)});
      }
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node* n = nodes[i].get();
      if (stage[i] == s && computed(n) && !is_tangent(n) && !c.copy(*n, why)) return false;
    }
    for (size_t k = 0; k < outs.size(); ++k)
      if (grad_stage[k] == s) {
        Node* o = c.lookup(*outs[k], why);
        if (!o) return false;
        g.outputs().push_back(o);
        st.grads.push_back(static_cast<int>(k));
      }
    for (size_t i = 0; i < nodes.size(); ++i)
      if (sends[su][i]) {
        output_of[su][nodes[i].get()] = static_cast<int>(g.outputs().size());
        g.outputs().push_back(c.map.at(nodes[i].get()));
      }
    g.scalar_symbols = b.scalar_symbols;
    g.scalar_inputs = b.scalar_inputs;
    g.recompute_users();
    out.push_back(std::move(st));
  }
  return true;
}

}  // namespace kiln::autodiff
