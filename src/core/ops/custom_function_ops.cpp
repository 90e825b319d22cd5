// A torch.autograd.Function whose gradient is wanted: its forward is captured as ops (under
// no_grad, as autograd runs it), and its backward, captured once from a placeholder gradient
// (`custom_grad`), is the template of the gradient. `custom_vjp` stands for the Function's
// result: its value is the forward's, its derivative a copy of the template reading the real
// gradient. build_joint uses it and then takes it out (with the template) of the graph.
#include <map>
#include <set>
#include <stdexcept>

#include "core/ops/registry.h"

namespace kiln::ops {

namespace {

// The nodes of the template: those that read `grad_input`, in graph order (it included).
std::set<const Node*> reading(const Graph& g, const Node* grad_input) {
  std::set<const Node*> d{grad_input};
  for (const auto& m : g.nodes())
    for (const Node* in : m->inputs)
      if (in && d.count(in)) {
        d.insert(m.get());
        break;
      }
  return d;
}

// A composite whose value is its first input's, differentiated by a rule of its own.
OpDef value_of_first_input(const char* name, const char* schema, const char* doc) {
  OpDef d;
  d.name = name;
  d.schema = Schema::parse(schema);
  d.kind = OpKind::Composite;
  d.promotion = Promotion::None;
  d.doc = doc;
  d.infer = [](const std::vector<Node*>& in, const Attrs&, TensorMeta& out, std::string&) {
    out = in[0]->meta;
    return true;
  };
  d.decompose = [](Graph&, Node* n) { return n->inputs[0]; };
  return d;
}

}  // namespace

std::vector<OpDef> custom_function_ops() {
  OpDef grad;
  grad.name = "custom_grad";
  grad.schema = Schema::parse("custom_grad(SymInt[] size, ScalarType dtype, str device)");
  grad.kind = OpKind::Source;
  grad.doc = "the gradient an autograd.Function's captured backward reads (a template's input)";
  grad.infer = [](const std::vector<Node*>&, const Attrs& a, TensorMeta& out, std::string&) {
    out.dtype = *a.get_dtype("dtype");
    out.sizes = a.get_exprs("size");
    out.strides = ir::contiguous_strides(out.sizes);
    out.device = Device::parse(a.get_str("device"));
    return true;
  };

  // Inputs: the forward's result, the template's custom_grad, the Function's k tensor inputs,
  // then the k gradients its backward returned for them (nullptr: None).
  OpDef vjp = value_of_first_input("custom_vjp",
                                   "custom_vjp(Tensor result, Tensor grad_input, Tensor[] inputs, Tensor?[] grads)",
                                   "an autograd.Function's result, differentiated by its own backward");
  vjp.derivative = [](Graph& g, Node* n, Node* grad) {
    const Node* grad_input = n->inputs[1];
    const size_t k = (n->inputs.size() - 2) / 2;
    const std::set<const Node*> templ = reading(g, grad_input);
    // the template nodes the returned gradients need, copied in graph order reading `grad`
    std::set<const Node*> needed;
    std::vector<const Node*> stack;
    for (size_t i = 0; i < k; ++i) stack.push_back(n->inputs[2 + k + i]);
    while (!stack.empty()) {
      const Node* m = stack.back();
      stack.pop_back();
      if (!m || !templ.count(m) || !needed.insert(m).second) continue;
      for (const Node* in : m->inputs) stack.push_back(in);
    }
    std::vector<Node*> order;
    for (const auto& m : g.nodes()) order.push_back(m.get());
    std::map<const Node*, Node*> copy{{grad_input, grad}};
    for (Node* m : order) {
      if (m == grad_input || !needed.count(m)) continue;
      std::vector<Node*> ins;
      for (Node* in : m->inputs) ins.push_back(in && copy.count(in) ? copy.at(in) : in);
      std::string error;
      Node* c = g.add(m->op, ins, m->attrs, error);
      if (!c) throw std::runtime_error("kiln: the gradient of an autograd.Function: " + error);
      c->meta.wrapped_number = m->meta.wrapped_number;
      c->source_loc = m->source_loc;
      copy[m] = c;
    }
    std::vector<Node*> out(n->inputs.size(), nullptr);
    for (size_t i = 0; i < k; ++i) {
      Node* gi = n->inputs[2 + k + i];
      out[2 + i] = gi && copy.count(gi) ? copy.at(gi) : gi;
    }
    return out;
  };
  // An in-place op under torch.no_grad() on a tensor autograd tracks: eager changes the values
  // and leaves the history, so the tensor's gradient still flows to what it was computed from.
  OpDef passthrough = value_of_first_input(
      "grad_passthrough", "grad_passthrough(Tensor value, Tensor history)",
      "the value of an in-place op made under no_grad, differentiated as the tensor's history before it");
  passthrough.derivative = [](Graph&, Node*, Node* grad) { return std::vector<Node*>{nullptr, grad}; };
  // No Python spelling: backend="eager" runs such a call eagerly, with this op as the reason.
  return {grad, vjp, passthrough};
}

// After build_joint: each custom_vjp replaced by the forward's result, its template removed.
void remove_custom_vjps(Graph& g) {
  static const OpDef* vjp = find_op("custom_vjp");
  static const OpDef* grad = find_op("custom_grad");
  std::set<const Node*> gone;
  for (const auto& m : g.nodes())
    if (m->op == vjp) gone.insert(m.get());
  if (gone.empty()) return;
  for (const Node* v : gone) g.replace_all_uses(const_cast<Node*>(v), v->inputs[0]);
  for (const auto& m : g.nodes()) {
    if (m->op == grad) {
      const std::set<const Node*> t = reading(g, m.get());
      gone.insert(t.begin(), t.end());
    }
  }
  g.erase_if([&](const Node* m) { return gone.count(m) > 0; });
}

}  // namespace kiln::ops
