// torch_call: any torch operator kiln has no entry for, called as an extern inside the graph;
// and aten_vjp: the gradient of a registry op's torch kernel, through torch's autograd.
//
// Capture works out the result's layout (it runs the operator on meta tensors) and records it
// in the node's attributes, as expressions in the inputs' size symbols where probing found
// them (the runtime checks the sizes the operator gives against them); the runtime calls the
// operator itself. The node's inputs are the
// tensors the call takes (none for a factory, which names its device in `out_device`), in the order the runtime substitutes them into its arguments
// (`fn` names that call in the binding layer's table; `target` is for printing).
#include "core/ops/registry.h"

#include <algorithm>

namespace kiln::ops {

namespace {

// The node's attributes without the result layout (a gradient has its input's).
Attrs without_layout(const Attrs& attrs) {
  Attrs a;
  for (const auto& [key, v] : attrs.items())
    if (key != "out_sizes" && key != "out_strides" && key != "out_dtype" && key != "inplace_fn") a.set(key, v);
  return a;
}

void set_layout_of(Attrs& a, const Node* like) {
  a.set("out_sizes", ir::sizes_attr(like->meta.sizes));
  // torch's kernels give an input's gradient the layout empty_like(input) has (its strides
  // where dense, else dense in its dim order: attention's q, k and v as views of one packed
  // projection): planned so, the executor need not copy it into another.
  a.set("out_strides", ir::sizes_attr(preserved_strides(like->meta)));
  a.set("out_dtype", like->meta.dtype);
}

bool layout_from_attrs(const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
  auto dtype = a.get_dtype("out_dtype");
  if (!dtype) return err = "a gradient node without an output dtype", false;
  out = TensorMeta{};
  out.dtype = *dtype;
  out.device = in.back()->meta.device;
  out.sizes = a.get_exprs("out_sizes");
  out.strides = a.get_exprs("out_strides");
  return true;
}

// The gradient nodes of one forward call share this number (the graph's size when they are
// made: deterministic, so kernels cache by graph text): the runtime computes all of them from
// one forward and one backward of the operator (executor.cpp, ExternPlan).
int64_t vjp_group(const Graph& g) { return static_cast<int64_t>(g.nodes().size()); }

// Per floating input k of `n`: a node of op `op` over n's inputs and the result's gradient, with
// n's attributes (less its layout), `extra`, `vjp_input` = k and the group, laid out as input k.
std::vector<Node*> vjp_nodes(Graph& g, Node* n, Node* grad, const char* op, const Attrs& extra) {
  std::vector<Node*> out(n->inputs.size(), nullptr);
  const int64_t group = vjp_group(g);
  std::vector<Node*> ins = n->inputs;
  ins.push_back(grad);
  const std::vector<int64_t> unreached = n->attrs.has("unreached_inputs") ? n->attrs.get_ints("unreached_inputs") : std::vector<int64_t>{};
  for (size_t k = 0; k < n->inputs.size(); ++k) {
    const Node* in = n->inputs[k];
    if (!in || !is_floating(in->meta.dtype)) continue;
    // an input torch's autograd graph of the call does not reach: no gradient (None in eager)
    if (std::find(unreached.begin(), unreached.end(), static_cast<int64_t>(k)) != unreached.end()) continue;
    Attrs a = without_layout(n->attrs);
    for (const auto& [key, v] : extra.items()) a.set(key, v);
    a.set("vjp_input", static_cast<int64_t>(k));
    a.set("vjp_group", group);
    set_layout_of(a, in);
    out[k] = g.must_add(op, ins, a);
  }
  return out;
}

}  // namespace

DerivativeFn aten_vjp_derivative(const std::string& aten) {
  return [aten](Graph& g, Node* n, Node* grad) {
    Attrs extra;
    extra.set("of", n->op->name);  // whose schema orders the call's arguments
    extra.set("aten", aten);
    return vjp_nodes(g, n, grad, "aten_vjp", extra);
  };
}

std::vector<OpDef> torch_call_ops() {
  OpDef d = extern_op(
      "torch_call", "torch_call(int fn, str target, SymInt[] out_sizes, SymInt[] out_strides, ScalarType out_dtype)", "",
      [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
        auto dtype = a.get_dtype("out_dtype");
        if (!dtype) return err = "torch_call without an output dtype", false;
        out = TensorMeta{};
        out.dtype = *dtype;
        for (Node* i : in)
          if (i) {
            out.device = i->meta.device;
            break;
          }
        if (a.has("out_device")) {  // a factory (no input to take the device from), or a device move
          int64_t d = a.get_int("out_device");
          out.device = d < 0 ? Device{} : Device{DeviceType::CUDA, static_cast<int>(d)};
        }
        out.sizes = a.get_exprs("out_sizes");  // symbolic where capture fitted them (sym/fit.h)
        out.strides = a.get_exprs("out_strides");
        return true;
      },
      {});
  // One node per call is enough to raise: the first of a call's results (later ones may be
  // tensors the kernel leaves undefined when unused, as attention's weights). A deterministic
  // call that reads no tensor (torch.tensor([]) as a cache starts) raised nothing at capture and
  // reads only what the guards hold: unused, it is dropped.
  d.keep_unused = [](const Node& n) {
    if (n.attrs.has("vjp_input") || n.attrs.get_int("result", -1) > 0) return false;
    return !n.attrs.get_bool("deterministic") ||
           std::any_of(n.inputs.begin(), n.inputs.end(), [](const Node* i) { return i != nullptr; });
  };
  // Any operator's gradient, through torch's own autograd: the same call with its inputs and the
  // result's gradient, marked `vjp_input` = k, which the runtime answers with the gradient of
  // input k (it calls the operator again with grad on and asks autograd, once for every input
  // of the call that needs a gradient); registry entries with a derivative of their own avoid
  // the second forward.
  d.derivative = [](Graph& g, Node* n, Node* grad) { return vjp_nodes(g, n, grad, "torch_call", {}); };
  // torch_call stands for any torch operator: whether autocast casts its inputs is not known here
  d.autocast_cuda = d.autocast_cpu = AutocastPolicy::Unknown;
  // The gradient of input `vjp_input` of a registry op run by torch's kernel `aten`; its inputs
  // are the op's, then the result's gradient (aten_vjp_derivative makes it).
  OpDef v = extern_op("aten_vjp", "aten_vjp(str of, str aten, int vjp_input, SymInt[] out_sizes, SymInt[] out_strides, ScalarType out_dtype)",
                      "", layout_from_attrs, {});
  v.autocast_cuda = v.autocast_cpu = AutocastPolicy::Unknown;
  return {d, v};
}

}  // namespace kiln::ops
