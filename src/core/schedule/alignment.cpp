// Which buffers a GPU kernel may read and write 16 bytes at a time without testing the pointer.
// A vector access needs its address aligned to the vector's size. A kernel that cannot know it
// tests each pointer and keeps an element-by-element path beside the vector one, which about
// doubles the code NVRTC compiles (BERT's layer norm: 360 ms with the tests, 130 ms without, on
// two cores) for a path that almost never runs. kiln can know it for most buffers: those it
// allocates start an allocation (torch's caching allocator hands out 512-byte blocks), and the
// executor makes it true of the rest. It copies an input whose pointer is not aligned before
// the kernels read it, as inductor copies misaligned inputs, and lays out a torch result that is
// not aligned as it lays out one of unplanned strides. An input a kernel stores into is never
// copied: its pointer is tested in the kernel as before.
#include "core/schedule/schedule.h"

namespace kiln::schedule {

void mark_aligned(loop::Program& p) {
  if (p.device.type != DeviceType::CUDA) return;
  std::vector<bool> stored(p.buffers.size(), false);
  for (const loop::Kernel& k : p.kernels)
    for (const loop::Stage& st : k.stages)
      for (const loop::Store& s : st.stores) stored[s.buffer] = true;
  for (loop::Buffer& b : p.buffers)
    b.aligned = b.device.type == DeviceType::CUDA && b.offset.is_const(0) &&
                (b.kind != loop::BufferKind::Input || !stored[b.id]);
}

}  // namespace kiln::schedule
