// Graph passes. Each is one function over the graph; pipeline.cpp runs them in order and can
// dump the graph after each (KILN_DEBUG).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/ir/graph.h"

namespace kiln::passes {

// Rewrites composite ops into primitives (pointwise, reduction, view, extern) until none remain.
void decompose(ir::Graph& g);
// The same, leaving the composite nodes `keep` holds as they are (the training graphs keep the
// composites that have a derivative of their own, to differentiate them by it).
void decompose(ir::Graph& g, const std::function<bool(const ir::Node&)>& keep);
// Rewrites hand-written attention on CUDA (matmul, scale, mask, softmax, matmul) into torch's
// fused scaled_dot_product_attention where the semantics are the same (fuse_attention.cpp).
void fuse_attention(ir::Graph& g);
// Gives scaled_dot_product_attention a boolean mask already turned into the additive mask of
// the query's dtype (0 or -inf) that torch's operator would make from it in every call, once
// per graph instead of once per layer, fused into a kiln kernel (fuse_attention.cpp).
void additive_attention_masks(ir::Graph& g);
// Convolutions on CUDA with row-major activations read and write channels-last copies, which
// fuse into the kernels around them, instead of cuDNN converting layouts in every call.
void channels_last_convolutions(ir::Graph& g);
// After decompose: the pointwise ops and max-pools between CUDA convolutions compute in
// channels-last too, the row-major copy moved to where something else reads them (channels_last.cpp).
void channels_last_activations(ir::Graph& g);
// A saved value (Graph::free_layout_outputs) that is a row-major copy of a dense tensor is
// saved as that tensor (channels_last.cpp).
void saved_in_producer_layout(ir::Graph& g);
// max-autotune's measurements of torch's kernels: `time(node)` runs the extern op of `node` (its
// attributes, on inputs of its inputs' sizes, strides and dtypes) and returns milliseconds a
// call, or a negative value when it cannot. `device_key` names the GPU in the disk-cache key of
// the winners. The passes that time count their decisions in `timed` and `from_disk`.
struct ExternTiming {
  std::function<double(const ir::Node&)> time;
  std::string device_key;
  int timed = 0, from_disk = 0;
};
// On CUDA, an addmm followed by relu or tanh-GELU becomes torch's _addmm_activation (the
// activation in cuBLASLt's epilogue); with `timing`, the epilogues are timed against the plain
// GEMMs and the faster kept. A CUDA convolution's bias joins the kernel of the pointwise ops
// that read its result (gemm_epilogues.cpp).
void gemm_epilogues(ir::Graph& g, ExternTiming* timing = nullptr);
// Marks torch_calls that update a graph input out of place (with the in-place form capture
// recorded) `in_place` where nothing else reads the input's old value: the executor then updates
// the input where it lies instead of copying it twice (reinplace.cpp).
void reinplace_input_updates(ir::Graph& g);
// A placeholder the graph marks stable (ir::Graph::stable_inputs): a parameter or buffer.
bool is_stable_input(const ir::Graph& g, const ir::Node* n);
// `n` is a stable input or computed from stable inputs and constants alone (what
// split_prologue moves into the prologue).
bool computed_from_stable(const ir::Graph& g, const ir::Node* n);
// On the CPU, a float32 convolution whose weight stable inputs alone make becomes
// conv2d_prepacked: oneDNN's kernel with the weight reordered into its own blocked format once
// (by the executor, kept while the weight is the same tensor at the same version), where
// aten::conv2d reorders it in every call (prepack.cpp).
void prepack_convolutions(ir::Graph& g);
// Eval-mode batch norm after a convolution, over stable inputs, becomes the convolution with
// folded weights and bias (fold_batch_norm.cpp).
void fold_batch_norm(ir::Graph& g);
// Moves what `g` computes from its stable inputs alone into a graph of its own, the prologue,
// whose outputs `g` then reads as new placeholders after its captured inputs; nullptr when
// nothing is worth moving. `prologue_inputs`: the captured input each prologue placeholder is
// (prologue.cpp).
std::unique_ptr<ir::Graph> split_prologue(ir::Graph& g, std::vector<int>& prologue_inputs);
// Reads through the `detach` aliases that marked where gradients stop, once the joint graph is
// split (detach.cpp); graph outputs keep theirs.
void drop_detach_aliases(ir::Graph& g);
// Removes nodes whose values are never used.
void dead_code_elimination(ir::Graph& g);
// Merges nodes that compute the same op on the same inputs with the same attributes.
void common_subexpression_elimination(ir::Graph& g);

}  // namespace kiln::passes
