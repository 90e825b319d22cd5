// Convolutions in channels-last.
//
// cuDNN's fast convolution kernels on tensor-core GPUs read and write NHWC. Given row-major
// (NCHW) activations, torch's cuDNN path converts the input, the weight and the output around
// every convolution (three layout-conversion kernels: a third of a float32 ResNet's time on an
// H100). oneDNN on the CPU prefers NHWC too, as inductor's CPU layout choice does (resnet18
// batch 4 on 2 cores: 167 -> 136-147 ms). This pass gives each such convolution a channels-last
// copy of its input and hands its result on row-major again:
//
//   conv2d(x, w, b)  ->  contiguous(conv2d(channels_last(x), w, b))
//
// Neither copy is a kernel of its own where it fuses: channels_last(x) is the layout the kernel
// that makes x (batch norm, ReLU, the residual add) writes, and contiguous(...) is how the next
// kernel reads the convolution's channels-last result. Every other node keeps its layout, so
// results keep eager's strides.
#include <unordered_map>
#include <vector>

#include "core/ops/registry.h"
#include "core/passes/passes.h"

namespace kiln::passes {

void channels_last_convolutions(ir::Graph& g) {
  bool changed = false;
  // The convolutions of the graph as it comes (never the ones this pass makes).
  std::vector<ir::Node*> convs;
  for (auto& n : g.nodes())
    if (n->op_name() == "conv2d") convs.push_back(n.get());
  for (ir::Node* conv : convs) {
    ir::Node *x = conv->inputs[0], *w = conv->inputs[1];
    const DType t = x->meta.dtype;
    if (!(t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16)) continue;
    // Grouped and depthwise convolutions on CUDA stay as they are: torch's depthwise kernel there
    // is NCHW's alone. oneDNN computes them in channels-last as well (mobilenet_v2 alternates
    // depthwise and 1x1 convolutions: a layout conversion around every other one otherwise).
    if (conv->attrs.get_int("groups", 1) != 1 && conv->meta.device.type != DeviceType::CPU) continue;
    if (ops::suggests_channels_last(x->meta) || ops::suggests_channels_last(w->meta)) continue;
    const size_t tail = g.nodes().size();
    changed = true;  // what a failed attempt below adds, dead code elimination removes
    std::string error;
    ir::Node* x_cl = g.add("channels_last", {x}, {}, error);
    if (!x_cl) continue;
    std::vector<ir::Node*> inputs = conv->inputs;
    inputs[0] = x_cl;
    // torch copies a row-major weight to channels-last in every call too; one that stable
    // inputs alone make (a parameter, a batch-norm-folded weight) is copied once, in the
    // prologue. A 1x1 kernel's weight is both layouts already, and a float32 one on the CPU is
    // reordered into oneDNN's own format once instead (prepack_convolutions).
    const bool prepacked = conv->meta.device.type == DeviceType::CPU && t == DType::Float32;
    if (!prepacked && computed_from_stable(g, w) && !(w->meta.sizes[2].is_const(1) && w->meta.sizes[3].is_const(1)))
      if (ir::Node* w_cl = g.add("channels_last", {w}, {}, error)) inputs[1] = w_cl;
    ir::Node* conv_cl = g.add("conv2d", inputs, conv->attrs, error);
    if (!conv_cl || !ops::suggests_channels_last(conv_cl->meta)) continue;
    ir::Node* back = g.add("contiguous", {conv_cl}, {}, error);
    if (!back || back->meta.strides != conv->meta.strides) continue;
    g.move_tail_before(tail, conv);
    g.replace_all_uses(conv, back);
  }
  if (changed) dead_code_elimination(g);
}

namespace {

// A reduction of a row-major copy (a training batch norm's statistics of a convolution's
// result) reads the channels-last twin instead: the same values, a different order of the
// same sum, and no copy of the activation. Kept where its result is what the original's was.
void reduce_twin(ir::Graph& g, ir::Node* n, ir::Node* twin) {
  const size_t tail = g.nodes().size();
  std::string error;
  ir::Node* m = g.add(n->op, {twin}, n->attrs, error);
  if (!m || m->meta.sizes != n->meta.sizes || m->meta.dtype != n->meta.dtype) return;
  if (m->meta.strides != n->meta.strides && !(m = g.add("contiguous", {m}, {}, error))) return;
  if (m->meta.strides != n->meta.strides) return;
  g.move_tail_before(tail, n);
  g.replace_all_uses(n, m);
}

}  // namespace

// After decomposition. A convolution's row-major copy, contiguous(conv2d(...)), is read by the
// batch norm, ReLU, residual add and max-pool before the next convolution: a kernel that reads
// channels-last memory in row-major order (a max-pool over a ResNet's stem output reads 512
// bytes apart) and writes a layout the next convolution copies back. The pointwise ops and
// max-pools that read such a copy are made again over its channels-last twin, and so on down
// the chain, so they compute in channels-last; the row-major copy moves to where something
// else reads the chain (a graph output, a view, an extern op), and a convolution's
// channels_last() of a twin is the twin itself; a reduction of a copy or of a pointwise result
// in the chain reduces its twin. Values do not change: only where a layout
// conversion happens.
void channels_last_activations(ir::Graph& g) {
  static const ops::OpDef* contiguous = ops::find_op("contiguous");
  static const ops::OpDef* channels_last = ops::find_op("channels_last");
  static const ops::OpDef* conv = ops::find_op("conv2d");
  static const ops::OpDef* max_pool = ops::find_op("max_pool2d");
  std::unordered_map<const ir::Node*, ir::Node*> twin;  // row-major node -> its channels-last twin
  std::vector<ir::Node*> order;
  for (auto& n : g.nodes()) order.push_back(n.get());
  for (ir::Node* n : order) {
    if (n->op == contiguous && n->inputs[0]->op == conv &&
        ops::suggests_channels_last(n->inputs[0]->meta))
      twin[n] = n->inputs[0];
  }
  if (twin.empty()) return;
  std::vector<ir::Node*> made;  // originals with a twin the pass made, in order
  for (ir::Node* n : order) {
    if (n->op->kind == ops::OpKind::Reduction && n->inputs.size() == 1 && twin.count(n->inputs[0])) {
      reduce_twin(g, n, twin[n->inputs[0]]);
      continue;
    }
    if (twin.count(n) || n->meta.dim() != 4) continue;
    const bool follows = (n->op->kind == ops::OpKind::Pointwise && n->op != contiguous && n->op != channels_last) ||
                         n->op == max_pool;
    if (!follows) continue;
    std::vector<ir::Node*> inputs = n->inputs;
    bool reads_twin = false;
    for (ir::Node*& in : inputs)
      if (in && twin.count(in)) {
        in = twin[in];
        reads_twin = true;
      }
    if (!reads_twin) continue;
    const size_t tail = g.nodes().size();
    std::string error;
    ir::Node* m = g.add(n->op, inputs, n->attrs, error);
    // Kept only where it is what it stands for, in channels-last (else the tail is dead code).
    if (!m || m->meta.sizes != n->meta.sizes || m->meta.dtype != n->meta.dtype || !ops::suggests_channels_last(m->meta))
      continue;
    g.move_tail_before(tail, n);
    twin[n] = m;
    made.push_back(n);
  }
  // Readers of an original read the row-major copy of its twin; where that reader is a
  // convolution's channels_last(), the twin itself.
  for (ir::Node* n : made) {
    const size_t tail = g.nodes().size();
    std::string error;
    ir::Node* back = g.add(contiguous, {twin[n]}, {}, error);
    if (!back || back->meta.strides != n->meta.strides) continue;  // the original stays
    g.move_tail_before(tail, n);
    g.replace_all_uses(n, back);
  }
  for (auto& n : g.nodes()) {
    if (n->op != channels_last || n->inputs[0]->op != contiguous) continue;
    ir::Node* cl = n->inputs[0]->inputs[0];
    if (cl->meta.strides == n->meta.strides && cl->meta.sizes == n->meta.sizes) g.replace_all_uses(n.get(), cl);
  }
  dead_code_elimination(g);
}

// A value saved for the backward that is a row-major copy of a dense tensor (a convolution's
// channels-last result, copied for eager's layout) is saved as that tensor: the forward makes
// no copy, and the backward reads the layout it gets (autodiff::adopt_saved_layouts).
void saved_in_producer_layout(ir::Graph& g) {
  static const ops::OpDef* contiguous = ops::find_op("contiguous");
  bool changed = false;
  for (size_t i = 0; i < g.outputs().size() && i < g.free_layout_outputs.size(); ++i) {
    ir::Node*& out = g.outputs()[i];
    if (!g.free_layout_outputs[i] || out->op != contiguous) continue;
    ir::Node* in = out->inputs[0];
    if (in->meta.sizes != out->meta.sizes || in->meta.dtype != out->meta.dtype ||
        ops::preserved_strides(in->meta) != in->meta.strides)  // dense: a copy would keep its strides
      continue;
    out = in;
    changed = true;
  }
  if (!changed) return;
  g.recompute_users();
  dead_code_elimination(g);
}

}  // namespace kiln::passes
