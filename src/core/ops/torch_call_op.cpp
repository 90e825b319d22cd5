// torch_call: any torch operator kiln has no entry for, called as an extern inside the graph.
//
// Capture works out the result's layout (it runs the operator on meta tensors) and records it
// in the node's attributes, as expressions in the inputs' size symbols where probing found
// them (the runtime checks the sizes the operator gives against them); the runtime calls the
// operator itself. The node's inputs are the
// tensors the call takes (none for a factory, which names its device in `out_device`), in the order the runtime substitutes them into its arguments
// (`fn` names that call in the binding layer's table; `target` is for printing).
#include "core/ops/registry.h"

namespace kiln::ops {

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
  // tensors the kernel leaves undefined when unused, as attention's weights).
  d.keep_unused = [](const Node& n) { return n.attrs.get_int("result", -1) <= 0; };
  // torch_call stands for any torch operator: whether autocast casts its inputs is not known here
  d.autocast_cuda = d.autocast_cpu = AutocastPolicy::Unknown;
  return {d};
}

}  // namespace kiln::ops
