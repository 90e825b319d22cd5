// The eager backend: kiln.compile(fn, backend="eager") captures as usual (guards, per-code
// cache, recompiles, graph breaks) and runs the captured graph node by node through torch's own
// Python callables, as torch.compile(backend="eager") runs its FX graph. No passes, no
// lowering, no kernels, no C++ compiler.
//
// How a node runs is derived from its op's registry entry, never from a table of names here:
//   - the callable is the op's first `python` spelling that names a function ("torch.sum",
//     "torch.nn.functional.gelu") or a Tensor method ("Tensor.view" -> torch.Tensor.view), with
//     no fixed attributes ("Tensor.float{dtype=float32}" is skipped);
//   - its arguments are the schema's: parameters before the `*` positionally (an absent one as
//     its default, trailing ones at their default left out), keyword-only ones by name when they
//     differ from their default; tensor parameters take the input nodes' values;
//   - a Python number operand (a `scalar` node) is passed as the number eager passed; where the
//     number comes first and the op has an operator spelling ("Tensor.__truediv__"), the node
//     runs as that Python operator (`2 / x` is x.__rtruediv__(2), as in eager); an op whose
//     tensors take no numbers (`tensors_only`, `mask & True` captured as logical_and) gets the
//     number as a wrapped-number tensor, as torch's own operators make it;
//   - an in-place update capture made out of place (`inplace_of`: x.masked_fill_(...), x += y,
//     x[i] = v on an intermediate) is copied into the updated tensor, which keeps its layout as
//     torch's in-place op keeps it (nothing reads the old value after the update);
//   - `torch_call` nodes call their recorded callable, as the compiled executor does (one call
//     for all results of a tuple-returning operator), and keep torch's result layout.
#pragma once
#include <Python.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/ir/graph.h"

namespace kiln::bind {

struct TorchProgram;

// Resolves, once per entry, each node's callable and argument template. nullptr with `error`
// when a node has no way to run through torch. `tracked` (for a graph whose results need
// autograd): the nodes autograd records; the others (computed in a torch.no_grad() block) run
// with grad mode off, as they ran in eager.
std::shared_ptr<TorchProgram> prepare_torch_program(const ir::Graph& g, std::string& error,
                                                    const std::set<const ir::Node*>* tracked = nullptr);

// Runs the graph: `inputs` are the graph inputs (borrowed); fills `outputs` with new references.
// False with the Python error torch raised (eager's own type and message) on failure.
bool run_torch_program(const TorchProgram& p, PyObject* const* inputs, std::vector<PyObject*>& outputs);

// The spelling whose callable runs `op` ("torch.sum"), or "" when it has none: for the op table.
std::string torch_spelling(const ops::OpDef& op);

}  // namespace kiln::bind
