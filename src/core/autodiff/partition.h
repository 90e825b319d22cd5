// Which forward values the backward reads from memory and which it computes again: the min-cut
// rematerialization partitioner (AOTAutograd's default for training, seed 003).
//
// Saving a value costs its bytes, kept alive from the forward to the backward. Recomputing it
// costs the backward a few cheap operations, if its inputs are at hand. So the joint graph
// becomes a flow network: each forward node is an edge whose capacity is its size, values the
// backward reads flow to the sink, graph inputs come from the source, and nodes that must not be
// recomputed (matrix products, convolutions, attention, torch calls: costly, or not repeatable)
// are tied to the source. The minimum cut is the cheapest set of saved values from which the
// backward can rebuild everything it reads; nodes on the sink side are recomputed there.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/autodiff/joint_graph.h"

namespace kiln::autodiff {

struct Partition {
  std::vector<const ir::Node*> saved;          // forward values kept for the backward, in graph order
  std::set<const ir::Node*> recomputed;        // forward nodes the backward computes again
  int64_t saved_bytes = 0;                     // the cut's cost (symbolic sizes at their hints)
};

// Whether the partitioner may recompute `n` in the backward: pointwise ops, views, reductions
// and gathers, whose cost is memory traffic that a fused backward kernel absorbs.
bool recomputable(const ir::Node& n);

// Whether capture marked `n` as made inside torch.utils.checkpoint (attribute `checkpoint`;
// decomposition hands the mark on): recomputed in the backward rather than saved.
bool checkpointed(const ir::Node& n);

Partition partition_joint(const ir::Graph& g, const JointGraph& jg);

// The two programs of a training step, cut from the joint graph where the partition says.
struct SplitGraphs {
  // Inputs: the joint's graph inputs other than the tangents, in order. Outputs: the joint's
  // forward outputs, then the saved values (the partition's order).
  std::unique_ptr<ir::Graph> forward;
  // Inputs: the saved values, then the tangents (for differentiable outputs). Outputs: the
  // gradients that exist, in `wrt` order. A recomputed forward node comes just before the first
  // node that reads it.
  std::unique_ptr<ir::Graph> backward;
};
bool split_joint(const ir::Graph& g, const JointGraph& jg, const Partition& p, SplitGraphs& out, std::string& why);

}  // namespace kiln::autodiff
