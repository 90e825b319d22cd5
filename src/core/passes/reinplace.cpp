// In-place updates of graph inputs that torch's operators make (x.index_copy_(...), x[i] = v on a
// KV cache) are captured out of place, as every in-place op is: the operator's out-of-place form
// copies the whole input and changes the copy, and the executor copies the result back into the
// caller's tensor after the graph. For a static cache of a decoder that is two copies of each
// layer's keys and values per step, where eager writes one row.
//
// When nothing else reads the input's old value, the update can be made where the input lies,
// as eager makes it: the call is marked `in_place`, and the executor runs the operator's in-place
// form (`inplace_fn`, recorded by capture) on the input itself. The write-back stays, and costs
// nothing when the result already is the input's memory; it still copies when the executor ran
// the update on a copy of the input (a CUDA graph's static buffer for an input that moves).
#include <algorithm>

#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

void reinplace_input_updates(ir::Graph& g) {
  static const ops::OpDef* torch_call = ops::find_op("torch_call");
  static const ops::OpDef* placeholder = ops::find_op("placeholder");
  for (const auto& n : g.nodes()) {
    if (n->op != torch_call || !n->attrs.has("inplace_fn") || n->inputs.empty()) continue;
    ir::Node* input = n->inputs[0];
    if (!input || input->op != placeholder || n->attrs.get_int("inplace_of", -1) != input->id) continue;
    // The old value read by this call alone (not by a kernel the scheduler may place after it,
    // not returned), and the result laid out as the input is (kernels read it by those strides).
    const bool only_reader = std::all_of(input->users.begin(), input->users.end(), [&](const ir::Node* u) { return u == n.get(); });
    const bool returned = std::find(g.outputs().begin(), g.outputs().end(), input) != g.outputs().end();
    // and the update is used (written back, or read on the way there): a call left over from an
    // inlined function a graph break stopped (an optimizer step that then runs for real) changes
    // nothing in place
    const bool used = !n->users.empty() || std::find(g.outputs().begin(), g.outputs().end(), n.get()) != g.outputs().end();
    if (!only_reader || returned || !used || !(n->meta.strides == input->meta.strides)) continue;
    n->attrs.set("in_place", true);
  }
}

}  // namespace kiln::passes
