// The slice of the CUDA driver API kiln needs to load and launch its kernels. libcuda is
// loaded with dlopen on first use; nothing here links against CUDA.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace kiln::compile {

bool cuda_driver_available(std::string* why = nullptr);

// The device's name ("NVIDIA H100 80GB HBM3"); "" if unknown.
std::string cuda_device_name(int device);

// Compute capability of `device`, e.g. 90 for sm_90; 0 if unknown.
int cuda_compute_capability(int device);

// A module loaded from a CUBIN/PTX image into the current (primary) context of a device.
class CudaModule {
 public:
  static std::shared_ptr<CudaModule> load(const std::string& image, int device, std::string& error);
  ~CudaModule();
  // Function handle (CUfunction) or nullptr.
  void* function(const std::string& name, std::string& error) const;

 private:
  CudaModule() = default;
  void* module_ = nullptr;
  int device_ = 0;
};

// Launches `fn` on `stream` (a CUstream, 0 for the legacy default stream). `args` is the usual
// array of pointers to each kernel argument. Returns false and fills `error` on failure.
// Makes a context of `device` current on the calling thread (torch's, or the primary one):
// autograd runs a backward on a device thread of its own, where none may be current yet.
bool cuda_make_current(int device, std::string& error);

bool cuda_launch(void* fn, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                 unsigned block_y, unsigned block_z, unsigned shared_bytes, void* stream,
                 void** args, std::string& error);

// Launches an instantiated CUDA graph (a CUgraphExec, as torch.cuda.CUDAGraph instantiates
// it) on `stream`. Returns false and fills `error` on failure.
bool cuda_graph_launch(void* exec, void* stream, std::string& error);

// Device memory of kiln's own, zero-filled: the scratch buffers autotuning times kernels on
// (at run time kernels work on memory PyTorch allocated).
class CudaScratch {
 public:
  static std::unique_ptr<CudaScratch> make(size_t bytes, int device, std::string& error);
  ~CudaScratch();
  void* ptr() const { return ptr_; }

 private:
  CudaScratch() = default;
  void* ptr_ = nullptr;
};

// Milliseconds per run of `work` (which enqueues GPU work on `stream` and returns false with
// `error` on failure), averaged over `reps` back-to-back runs after one warm-up run; -1 with
// `error` on failure. Events on `stream` bracket the runs. With `host_ahead_ms` > 0 the GPU is
// first held busy that long (a spin kernel), so that the host enqueues the runs ahead of it and
// the time is the GPU's alone (as a CUDA graph replays them); otherwise a run the host launches
// slower than the GPU executes it is timed at the host's pace (as eager-style calls run).
double cuda_time(const std::function<bool(std::string& error)>& work, int reps, int device, void* stream,
                 std::string& error, double host_ahead_ms = 0);

// What the autotuners measure: milliseconds of GPU time one run of `work` takes. A first run
// at the host's pace bounds how long the host takes to enqueue one; then runs batched to about
// a millisecond (`max_reps` at most) are timed behind a spin that long, best of three. -1 with
// `error` on failure.
double cuda_benchmark(const std::function<bool(std::string& error)>& work, int max_reps, int device, void* stream,
                      std::string& error);

// End-to-end check of the driver path on device 0: compiles a doubling kernel with NVRTC for
// the device's own arch, loads it, runs it on a buffer it allocates itself and compares the
// result. Returns false and fills `error` on any failure. For tests and diagnostics.
bool cuda_selftest(std::string& error);

}  // namespace kiln::compile
