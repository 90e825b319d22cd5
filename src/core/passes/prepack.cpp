// Convolutions on the CPU with their weights prepacked for oneDNN.
//
// aten::conv2d on the CPU hands oneDNN a plain (OIHW or channels-last) weight, which oneDNN
// reorders into its blocked format in every call: a pass over the weights, most of the time of
// a ResNet's deep layers at small batches (resnet18's 3x3 convolutions over 512 channels, batch
// 4: 9.2 ms prepacked against 12.4 ms on 2 cores). Where the weight is made of stable inputs
// alone (a parameter, a batch-norm-folded weight from the prologue), it is the same tensor at
// every call until it changes, so conv2d_prepacked's executor path reorders it once (torch's
// mkldnn::_reorder_convolution_weight) and calls mkldnn::_convolution_pointwise with the packed
// weight, again only when the weight's tensor, memory, version or the input's sizes change. As
// inductor's CPU weight prepacking does, which it does under freezing only.
#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

void prepack_convolutions(ir::Graph& g) {
  if (g.stable_inputs.empty()) return;
  static const ops::OpDef* conv = ops::find_op("conv2d");
  static const ops::OpDef* prepacked = ops::find_op("conv2d_prepacked");
  for (auto& n : g.nodes()) {
    if (n->op != conv || n->meta.device.type != DeviceType::CPU || n->meta.dtype != DType::Float32) continue;
    if (!computed_from_stable(g, n->inputs[1])) continue;
    if (n->inputs.size() > 2 && n->inputs[2] && !computed_from_stable(g, n->inputs[2])) continue;
    n->op = prepacked;  // the same schema, shape rule and result
  }
}

}  // namespace kiln::passes
