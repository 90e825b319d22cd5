// Lowering: graph IR -> loop-level IR.
//
// Every graph value becomes a lazy "reader" (index -> scalar expression). Pointwise ops and
// views compose readers, so producers are inlined into consumers for free (vertical fusion).
// A value is realized into a buffer, by a kernel of its own, only when it must be: graph
// outputs, reductions, operands of extern ops, and values read by several consumers whose
// recomputation would cost too much. The scheduler (schedule/) later fuses those kernels.
#pragma once
#include <string>

#include "core/ir/graph.h"
#include "core/loop/program.h"

namespace kiln::lower {

// Fills `p` from `g`. Returns false with a reason when the graph uses something the loop IR
// cannot express yet (the caller then runs the code eagerly).
bool lower_graph(const ir::Graph& g, loop::Program& p, std::string& error);

}  // namespace kiln::lower
