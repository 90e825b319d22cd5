// The prologue's results, kept between calls (pipeline::CompiledGraph::prologue).
//
// A graph's prologue computes what its stable inputs alone make (a batch-norm-folded weight, a
// channels-last weight). Its results are kept with what each input it read was at the time: the
// tensor, its memory and its version counter. A call whose inputs all match reads the kept
// results; any difference (an optimizer step, load_state_dict, `p.data = t`, a new parameter)
// runs the prologue again first. Writes through `p.data` bypass version counters, as they
// bypass autograd's checks, and are not seen (docs/architecture.md).
#pragma once
#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/compile_graph.h"

namespace kiln::bind {

struct PreparedProgram;

class PrologueCache {
 public:
  // For `cg.prologue` (which must be set); nullptr with `error` when it cannot be prepared.
  static std::unique_ptr<PrologueCache> make(const pipeline::CompiledGraph& cg, std::string& error);
  ~PrologueCache();
  PrologueCache(const PrologueCache&) = delete;
  PrologueCache& operator=(const PrologueCache&) = delete;

  // Appends the prologue's results for the captured `inputs` to `program_inputs` (borrowed
  // references, valid until the next call), running it first where an input it reads changed.
  // false with a Python error set.
  bool append_results(PyObject* const* inputs, std::vector<PyObject*>& program_inputs);

 private:
  PrologueCache();
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace kiln::bind
