#include "core/autodiff/joint_graph.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <set>

#include "core/ops/registry.h"
#include "core/sym/shape_env.h"

namespace kiln::autodiff {

using ir::Node;

namespace {

bool differentiable(const Node* n) { return n && is_floating(n->meta.dtype); }

// A value autograd does not track past: `x.detach()`, or one computed under torch.no_grad().
bool detached(const Node* n) { return n->attrs.get_bool("detach"); }

}  // namespace

Node* reduce_to(ir::Graph& g, Node* grad, const ir::TensorMeta& meta) {
  const auto& have = grad->meta.sizes;
  const auto& want = meta.sizes;
  if (have.size() < want.size())
    throw std::runtime_error("kiln: a gradient of " + grad->meta.str() + " for a value of " + meta.str());
  // Leading dims the broadcast added, then dims of size 1 that it stretched.
  std::vector<int64_t> dims;
  const size_t lead = have.size() - want.size();
  for (size_t d = 0; d < lead; ++d) dims.push_back(static_cast<int64_t>(d));
  std::vector<int64_t> ones;
  for (size_t d = 0; d < want.size(); ++d)
    if (want[d].is_const(1) && !have[lead + d].is_const(1)) ones.push_back(static_cast<int64_t>(lead + d));
  if (!ones.empty()) {
    ir::Attrs a;
    a.set("dim", ones);
    a.set("keepdim", true);
    grad = g.must_add("sum", {grad}, a);
  }
  if (!dims.empty()) {
    ir::Attrs a;
    a.set("dim", dims);
    grad = g.must_add("sum", {grad}, a);
  }
  if (grad->meta.dtype != meta.dtype) {
    ir::Attrs a;
    a.set("dtype", meta.dtype);
    grad = g.must_add("convert", {grad}, a);
  }
  return grad;
}

bool build_joint(ir::Graph& g, const std::vector<Node*>& wrt, JointGraph& out, std::string& why) {
  out = JointGraph{};
  // The nodes a gradient flows through: reachable from `wrt` along differentiable values.
  std::set<const Node*> active(wrt.begin(), wrt.end());
  std::vector<Node*> order;
  for (const auto& n : g.nodes()) order.push_back(n.get());
  out.forward.assign(order.begin(), order.end());
  for (Node* n : order) {
    if (active.count(n) || !differentiable(n) || detached(n)) continue;
    for (Node* in : n->inputs)
      if (in && active.count(in)) {
        active.insert(n);
        break;
      }
  }
  std::map<const Node*, Node*> grad;
  auto accumulate = [&](Node* at, Node* gi) {
    gi = reduce_to(g, gi, at->meta);
    auto [it, fresh] = grad.emplace(at, gi);
    if (!fresh) it->second = g.must_add("add", {it->second, gi});
  };
  const std::vector<Node*> outputs = g.outputs();
  out.forward_outputs = outputs.size();
  for (size_t i = 0; i < outputs.size(); ++i) {
    Node* o = outputs[i];
    // No gradient flows back through an output that is a graph input itself (autograd reaches
    // the caller's tensor directly) or that no `wrt` input reaches.
    if (!differentiable(o) || !active.count(o) || o->op_name() == "placeholder") {
      out.tangents.push_back(nullptr);
      continue;
    }
    ir::TensorMeta m = o->meta;
    m.strides = ir::contiguous_strides(m.sizes);
    m.offset = 0;
    Node* t = g.placeholder("tangent_" + std::to_string(i), m);
    out.tangents.push_back(t);
    accumulate(o, t);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    auto gi = grad.find(n);
    if (gi == grad.end() || n->inputs.empty()) continue;
    bool feeds = false;  // some input still needs a gradient
    for (Node* in : n->inputs) feeds |= in && active.count(in) > 0;
    if (!feeds) continue;
    if (!n->op->derivative) {
      const std::string what = n->attrs.has("target") ? n->attrs.get_str("target") : n->op_name();
      why = "no derivative for " + what + (n->source_loc.empty() ? "" : " (" + n->source_loc + ")");
      return false;
    }
    try {
      std::vector<Node*> in_grads = n->op->derivative(g, n, gi->second);
      for (size_t k = 0; k < n->inputs.size() && k < in_grads.size(); ++k)
        if (in_grads[k] && n->inputs[k] && active.count(n->inputs[k])) accumulate(n->inputs[k], in_grads[k]);
    } catch (const std::exception& e) {  // a case the derivative does not cover (a strided slice)
      why = std::string(e.what()) + (n->source_loc.empty() ? "" : " (" + n->source_loc + ")");
      return false;
    }
  }
  for (Node* w : wrt) {
    auto it = grad.find(w);
    out.grads.push_back(it == grad.end() ? nullptr : it->second);
    if (out.grads.back()) g.outputs().push_back(out.grads.back());
  }
  // autograd.Function results have given their gradients: the forward keeps their values alone
  ops::remove_custom_vjps(g);
  std::set<const Node*> kept;
  for (const auto& n : g.nodes()) kept.insert(n.get());
  out.forward.erase(std::remove_if(out.forward.begin(), out.forward.end(), [&](const Node* n) { return !kept.count(n); }),
                    out.forward.end());
  g.recompute_users();
  return true;
}

}  // namespace kiln::autodiff
