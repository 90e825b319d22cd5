// Scheduling: turns the one-kernel-per-realized-value program of the lowering into few,
// fused kernels, then plans memory.
//
//   fuse_kernels      merges consecutive kernels over compatible iteration spaces: pointwise
//                     with pointwise (same space), reductions with their epilogues and with
//                     each other over the same rows (softmax: max, sum and the normalisation in
//                     one kernel); a read of a value computed earlier in the same kernel at the
//                     same point becomes a register use, and buffers nobody reads disappear.
//   reuse_reduced_values  lets a loop read the values an earlier reduction of the same row
//                     computed (stored into the loop's output) instead of recomputing them.
//   order_loops       orders a kernel's outer loops as its output lies in memory (largest
//                     stride outermost), so a channels-last or transposed result is written
//                     in address order: coalesced on the GPU, vectorized on the CPU.
//   collapse_dims     merges adjacent loop dims that every access walks contiguously, so a
//                     pointwise kernel over contiguous tensors is one flat, vectorizable loop.
//   write_updates_in_place  lets the kernel that computes an update of a graph input store it
//                     into the input itself where that is what eager's in-place op would do.
//   split_reductions  (GPU) cuts a reduction of many points into few outputs (a batch norm's
//                     statistics) into partial results over many blocks and a kernel that
//                     combines them.
//   plan_buffers      assigns temporaries to shared allocation slots by liveness.
//   mark_aligned      (GPU) marks the buffers whose pointers are 16-byte aligned at every run
//                     (kiln allocates them, or the executor copies those that are not), so
//                     vector accesses to them need no test and no element-by-element path.
//   group_foreach     (GPU) groups consecutive flat pointwise kernels that compute the same
//                     thing over other buffers into one launch (Program::foreach_groups).
#pragma once
#include "core/loop/program.h"

namespace kiln::schedule {

void fuse_kernels(loop::Program& p);
void reuse_reduced_values(loop::Program& p);
void order_loops(loop::Program& p);
void collapse_dims(loop::Program& p);
void write_updates_in_place(loop::Program& p);
void split_reductions(loop::Program& p);
void plan_buffers(loop::Program& p);
void name_kernels(loop::Program& p);
void mark_aligned(loop::Program& p);
void group_foreach(loop::Program& p);

// All of the above, in order.
void schedule(loop::Program& p);

}  // namespace kiln::schedule
