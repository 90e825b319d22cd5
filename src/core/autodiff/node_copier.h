// Copying nodes from one graph into another: how the partitioner makes the forward and backward
// programs out of the joint graph, and how the backward is cut into stages.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "core/ir/graph.h"

namespace kiln::autodiff {

// Python numbers and sizes: free to have in any program, never saved or handed between programs.
bool constant(const ir::Node& n);

// Bytes of a value, symbolic sizes at their hints (or 1024 when they have none).
int64_t bytes_of(const ir::Node& n);

// A value's metadata as the input of another program: its own buffer, at offset 0.
ir::TensorMeta as_input(const ir::Node& n);

// Copies nodes of one graph into another, their inputs mapped through `map` (the caller maps
// the values the target graph receives as inputs); Python numbers and sizes a copied node reads
// are copied on first use.
class NodeCopier {
 public:
  explicit NodeCopier(ir::Graph& to) : to_(to) {}
  std::map<const ir::Node*, ir::Node*> map;
  // nullptr with `why` set when an input is neither mapped nor a constant.
  ir::Node* copy(const ir::Node& n, std::string& why);
  ir::Node* lookup(const ir::Node& u, std::string& why);

 private:
  ir::Graph& to_;
};

}  // namespace kiln::autodiff
