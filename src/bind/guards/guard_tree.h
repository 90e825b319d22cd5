// An entry's guards and input fetches as one walk over the tree of their sources.
//
// A module's guards and inputs name a thousand or more sources that share long prefixes
// (L['self'].encoder.layer[3].attention.self.query.weight). Checked one by one, each source is
// looked up again from its root (or in a per-call memo keyed by source); the tree reads each
// value once, from its parent's value, checks the guards on it, and hands the graph's inputs out
// as it passes them, so a call that hits the cache walks its sources once. This is what
// TorchDynamo's C++ guard manager does for the same reason.
//
// A node's own guards are checked before its children are read: a type or identity guard on an
// object comes before any attribute read from it, as in the guard set's order. Guards whose
// meaning depends on order (the size symbols a shape-generic tensor or an int binds) or that
// compare values at several sources (Same, NoAlias) run after the walk, in the set's order.
#pragma once
#include <Python.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bind/guards/source.h"

namespace kiln::bind {

class GuardSet;
struct Guard;

// The values one call reads from an entry's fetch sources (new references, released on
// destruction). Small calls keep them on the stack.
class FetchedValues {
 public:
  FetchedValues() = default;
  FetchedValues(const FetchedValues&) = delete;
  FetchedValues& operator=(const FetchedValues&) = delete;
  ~FetchedValues() { release(); }
  // n null slots (drops what it held)
  PyObject** reset(size_t n);
  void release();
  PyObject** data() { return data_; }
  // Slot i's reference, handed to the caller (the slot is left empty).
  PyObject* take(size_t i) { return std::exchange(data_[i], nullptr); }
  size_t size() const { return size_; }

 private:
  PyObject* local_[32];
  std::vector<PyObject*> heap_;
  PyObject** data_ = local_;
  size_t size_ = 0;
};

class GuardTree {
 public:
  // `fetch`: the sources whose values a call hands on (the graph's inputs, its int scalars).
  GuardTree(const GuardSet& guards, const std::vector<SourcePtr>& fetch);
  ~GuardTree();
  GuardTree(const GuardTree&) = delete;
  GuardTree& operator=(const GuardTree&) = delete;

  // True when every guard of `guards` (the set this tree was built from) holds for the call in
  // `f`; `out` then holds the values at the fetch sources, in order, with the per-call ones
  // (Source::per_call) left null. False: `out` holds nothing.
  bool check(const GuardSet& guards, const FrameView& f, FetchedValues& out) const;
  size_t nodes() const { return nodes_.size(); }

 private:
  struct Node {
    const Source* source;  // how its value is read: from the frame (roots) or its parent's value
    int parent = -1;       // earlier in nodes_ (preorder)
    std::vector<const Guard*> checks;  // checked on this value during the walk, in set order
  };
  // The node of a source (made with its ancestors' on first sight).
  int node_for(const SourcePtr& s);
  // While building: a node by parent and step (kind, slot or index, name, globals, key).
  using StepKey = std::tuple<int, int, int64_t, std::string, PyObject*, PyObject*>;
  std::map<StepKey, int> index_;

  std::vector<Node> nodes_;
  std::vector<const Guard*> process_checks_;  // grad mode, autocast: first, no source to read
  // After the walk, in set order: each guard with the nodes of its source(s).
  struct Late {
    const Guard* guard;
    std::vector<int> nodes;  // Same: [value, other]; NoAlias: one per source; else [value]
  };
  std::vector<Late> late_;
  std::vector<std::pair<int, int>> fetch_;  // (slot of the fetched values, node)
  size_t fetch_count_ = 0;
  std::vector<SourcePtr> keep_;  // the sources nodes point into
};

}  // namespace kiln::bind
