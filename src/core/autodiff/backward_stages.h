// The backward program cut into stages at gradient-bucket boundaries, for data-parallel training.
//
// DistributedDataParallel all-reduces gradients in buckets (about 25 MB, the first 1 MB), each
// started by autograd's hooks as soon as its last gradient is accumulated. A backward that is one
// program hands autograd every gradient at its end, so no all-reduce overlaps it. Cut into stages
// (torch.compile's DDPOptimizer cuts the forward graph for the same reason), each stage is a
// program and an autograd node of its own: the first stage's gradients reach their parameters,
// and their bucket's all-reduce runs, while the next stage computes.
//
// Gradients are taken in the order the backward computes them (the last layer's first), and a
// stage closes once its gradients reach the bucket cap. Every other node runs in the earliest
// stage that reads it, so a stage reads only what earlier stages made: values one stage makes and
// a later one reads are handed over (autograd carries them from node to node as it carries
// gradients). The first stage receives the tangents; a later stage that reads one gets it handed
// over from the first.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/ir/graph.h"

namespace kiln::autodiff {

struct BackwardStage {
  // Inputs: `saved` (as the whole backward's saved inputs), then the first stage's tangents (all
  // of them, in order) or a later stage's `received` values. Outputs: `grads`, then the values
  // later stages receive.
  std::unique_ptr<ir::Graph> graph;
  std::vector<int> saved;      // indices among the backward's saved inputs
  std::vector<int> grads;      // indices among the backward's outputs
  struct From {
    int stage = 0;             // an earlier stage
    int output = 0;            // its graph output (after its grads)
  };
  std::vector<From> received;  // later stages only
};

// Cuts `backward` (inputs: `saved` saved values, then tangents; outputs: gradients) into stages
// whose gradients' bytes reach `first_cap` (the first stage) and `cap` (the others). One stage
// (the whole program) when the gradients fit in the first; false with the reason on failure.
bool split_backward_stages(const ir::Graph& backward, size_t saved, int64_t first_cap, int64_t cap,
                           std::vector<BackwardStage>& out, std::string& why);

}  // namespace kiln::autodiff
