// Convolutions on the GPU in channels-last.
//
// cuDNN's fast convolution kernels on tensor-core GPUs read and write NHWC. Given row-major
// (NCHW) activations, torch's cuDNN path converts the input, the weight and the output around
// every convolution (three layout-conversion kernels: a third of a float32 ResNet's time on an
// H100). This pass gives each such convolution a channels-last copy of its input and hands
// its result on row-major again:
//
//   conv2d(x, w, b)  ->  contiguous(conv2d(channels_last(x), w, b))
//
// Neither copy is a kernel of its own where it fuses: channels_last(x) is the layout the kernel
// that makes x (batch norm, ReLU, the residual add) writes, and contiguous(...) is how the next
// kernel reads the convolution's channels-last result. Every other node keeps its layout, so
// results keep eager's strides.
#include <vector>

#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

void channels_last_convolutions(ir::Graph& g) {
  bool changed = false;
  // The convolutions of the graph as it comes (never the ones this pass makes).
  std::vector<ir::Node*> convs;
  for (auto& n : g.nodes())
    if (n->op_name() == "conv2d" && n->meta.device.type == DeviceType::CUDA) convs.push_back(n.get());
  for (ir::Node* conv : convs) {
    ir::Node *x = conv->inputs[0], *w = conv->inputs[1];
    const DType t = x->meta.dtype;
    if (!(t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16)) continue;
    if (conv->attrs.get_int("groups", 1) != 1) continue;  // grouped and depthwise: left to cuDNN
    if (ops::suggests_channels_last(x->meta) || ops::suggests_channels_last(w->meta)) continue;
    const size_t tail = g.nodes().size();
    changed = true;  // what a failed attempt below adds, dead code elimination removes
    std::string error;
    ir::Node* x_cl = g.add("channels_last", {x}, {}, error);
    if (!x_cl) continue;
    std::vector<ir::Node*> inputs = conv->inputs;
    inputs[0] = x_cl;
    ir::Node* conv_cl = g.add("conv2d", inputs, conv->attrs, error);
    if (!conv_cl || !ops::suggests_channels_last(conv_cl->meta)) continue;
    ir::Node* back = g.add("contiguous", {conv_cl}, {}, error);
    if (!back || back->meta.strides != conv->meta.strides) continue;
    g.move_tail_before(tail, conv);
    g.replace_all_uses(conv, back);
  }
  if (changed) dead_code_elimination(g);
}

}  // namespace kiln::passes
