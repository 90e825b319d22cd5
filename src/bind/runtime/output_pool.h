// Memory for a CPU program's outputs that comes back to the program when the caller drops them.
//
// torch has no caching allocator on the CPU: a multi-megabyte tensor is an mmap of its own, so
// every call's fresh output is fresh pages, faulted in one by one by the kernel that writes it,
// and every dropped one is an munmap. For a 64 MB softmax on 2 cores that is 26 ms of a 40 ms
// call. A compiled CPU program allocates its large outputs here instead: the storage's deleter
// hands the block back to the pool, and the next call of the program takes it again, as the
// CUDA caching allocator does for GPU tensors. The tensors are ordinary CPU tensors otherwise
// (resizable, through torch's own allocator), and the pool keeps at most one block per output
// of the program: memory a caller holds on to is the caller's, as in eager.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace kiln::bind {

class OutputPool : public std::enable_shared_from_this<OutputPool> {
 public:
  // Blocks smaller than this come from glibc's heap, which reuses them without new pages.
  static constexpr size_t kMinBytes = size_t{256} << 10;

  explicit OutputPool(size_t max_blocks) : max_blocks_(max_blocks) {}
  ~OutputPool();
  OutputPool(const OutputPool&) = delete;
  OutputPool& operator=(const OutputPool&) = delete;

  // A CPU tensor of these sizes and strides; memory from the pool when a block of its byte
  // size is free there, else new.
  at::Tensor empty_strided(at::IntArrayRef sizes, at::IntArrayRef strides, at::ScalarType dtype);

 private:
  struct Block;
  static void release(void* block);
  void* take(size_t bytes);
  void give_back(void* data, size_t bytes);

  std::mutex mutex_;  // a tensor may die on any thread
  std::vector<std::pair<void*, size_t>> free_;
  size_t max_blocks_;
};

}  // namespace kiln::bind
