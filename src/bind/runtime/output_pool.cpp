#include "bind/runtime/output_pool.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

namespace kiln::bind {

// A storage's deleter context: the block and the pool it goes back to (kept alive by it, so a
// tensor may outlive the program that made it).
struct OutputPool::Block {
  void* data;
  size_t bytes;
  std::shared_ptr<OutputPool> pool;
};

OutputPool::~OutputPool() {
  for (auto& [data, bytes] : free_) c10::free_cpu(data);
}

void* OutputPool::take(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i].second != bytes) continue;
    void* data = free_[i].first;
    free_[i] = free_.back();
    free_.pop_back();
    return data;
  }
  return nullptr;
}

void OutputPool::give_back(void* data, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < max_blocks_) {
      free_.emplace_back(data, bytes);
      return;
    }
  }
  c10::free_cpu(data);
}

void OutputPool::release(void* ctx) {
  std::unique_ptr<Block> block(static_cast<Block*>(ctx));
  block->pool->give_back(block->data, block->bytes);
}

at::Tensor OutputPool::empty_strided(at::IntArrayRef sizes, at::IntArrayRef strides, at::ScalarType dtype) {
  const caffe2::TypeMeta meta = caffe2::TypeMeta::fromScalarType(dtype);
  const size_t bytes = at::detail::computeStorageNbytes(sizes, strides, meta.itemsize());
  if (bytes < kMinBytes) return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype));
  void* data = take(bytes);
  if (!data) data = c10::alloc_cpu(bytes);
  auto* block = new Block{data, bytes, shared_from_this()};
  c10::DataPtr ptr(data, block, &OutputPool::release, c10::Device(c10::DeviceType::CPU));
  // torch's CPU allocator for a later resize_; this block still comes back here when replaced.
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(bytes), std::move(ptr),
                       c10::GetDefaultCPUAllocator(), /*resizable=*/true);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                         meta);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return t;
}

}  // namespace kiln::bind
