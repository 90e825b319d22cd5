// The CUDA driver API through dlopen. The entry points kiln calls are declared here by hand
// (C ABI, from the public driver API documentation) so that the core neither includes CUDA
// headers nor links against libcuda. Where the driver exports versioned symbols (cuMemAlloc
// and friends), the _v2 names are the ones with 64-bit sizes that cuda.h maps to.
#include "core/compile/cuda_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <functional>

#include <mutex>
#include <vector>

#include "core/compile/nvrtc.h"

namespace kiln::compile {
namespace {

// ---- the driver API types, as opaque as the real ones ----
using CUresult = int;  // an enum in cuda.h; 0 is CUDA_SUCCESS
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUdeviceptr = unsigned long long;  // CUdeviceptr_v2 on 64-bit hosts
constexpr CUresult kCudaSuccess = 0;
constexpr int kAttrComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR

struct Driver {
  void* handle = nullptr;
  std::string error;  // why the driver is unusable, when it is

  CUresult (*init)(unsigned flags) = nullptr;
  CUresult (*device_get)(CUdevice*, int ordinal) = nullptr;
  CUresult (*device_get_attribute)(int*, int attrib, CUdevice) = nullptr;
  CUresult (*device_get_name)(char*, int len, CUdevice) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*ctx_get_device)(CUdevice*) = nullptr;
  CUresult (*ctx_synchronize)() = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void* image) = nullptr;
  CUresult (*module_unload)(CUmodule) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char* name) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shared_bytes, CUstream,
                            void** params, void** extra) = nullptr;
  CUresult (*graph_launch)(void* exec, CUstream) = nullptr;  // CUgraphExec
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  // Only for cuda_selftest() and autotuning's scratch buffers: kiln's kernels run on memory
  // that PyTorch allocated.
  CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*mem_free)(CUdeviceptr) = nullptr;
  CUresult (*memcpy_htod)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*memcpy_dtoh)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t) = nullptr;
  // Timing (autotuning): CUevent handles.
  CUresult (*event_create)(void**, unsigned flags) = nullptr;
  CUresult (*event_record)(void*, CUstream) = nullptr;
  CUresult (*event_synchronize)(void*) = nullptr;
  CUresult (*event_elapsed)(float*, void*, void*) = nullptr;
  CUresult (*event_destroy)(void*) = nullptr;

  // "what: CUDA_ERROR_X (code): description"
  std::string describe(const char* what, CUresult r) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (get_error_name) get_error_name(r, &name);
    if (get_error_string) get_error_string(r, &text);
    std::string s = std::string(what) + " failed: " + (name ? name : "CUDA error") + " (" +
                    std::to_string(r) + ")";
    if (text) s += std::string(": ") + text;
    return s;
  }
};

template <typename Fn>
bool bind(void* h, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(h, name));
  if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

void load_into(Driver& d) {
  // libcuda.so.1 is what the driver package installs; libcuda.so is only a dev symlink.
  // If PyTorch already loaded the driver, dlopen hands back that same instance.
  void* h = nullptr;
  std::string tried;
  for (const char* name : {"libcuda.so.1", "libcuda.so"}) {
    h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h) break;
    const char* e = dlerror();
    tried += std::string("\n  ") + name + ": " + (e ? e : "not loadable");
  }
  if (!h) {
    d.error = "CUDA driver not found; tried:" + tried;
    return;
  }
  std::string missing;
  bind(h, "cuInit", d.init, missing);
  bind(h, "cuDeviceGet", d.device_get, missing);
  bind(h, "cuDeviceGetAttribute", d.device_get_attribute, missing);
  bind(h, "cuDeviceGetName", d.device_get_name, missing);
  bind(h, "cuDevicePrimaryCtxRetain", d.primary_ctx_retain, missing);
  bind(h, "cuCtxGetCurrent", d.ctx_get_current, missing);
  bind(h, "cuCtxSetCurrent", d.ctx_set_current, missing);
  bind(h, "cuCtxGetDevice", d.ctx_get_device, missing);
  bind(h, "cuCtxSynchronize", d.ctx_synchronize, missing);
  bind(h, "cuModuleLoadData", d.module_load_data, missing);
  bind(h, "cuModuleUnload", d.module_unload, missing);
  bind(h, "cuModuleGetFunction", d.module_get_function, missing);
  bind(h, "cuLaunchKernel", d.launch_kernel, missing);
  bind(h, "cuGraphLaunch", d.graph_launch, missing);
  bind(h, "cuGetErrorString", d.get_error_string, missing);
  bind(h, "cuGetErrorName", d.get_error_name, missing);
  bind(h, "cuMemAlloc_v2", d.mem_alloc, missing);
  bind(h, "cuMemFree_v2", d.mem_free, missing);
  bind(h, "cuMemcpyHtoD_v2", d.memcpy_htod, missing);
  bind(h, "cuMemcpyDtoH_v2", d.memcpy_dtoh, missing);
  bind(h, "cuMemsetD8_v2", d.memset_d8, missing);
  bind(h, "cuEventCreate", d.event_create, missing);
  bind(h, "cuEventRecord", d.event_record, missing);
  bind(h, "cuEventSynchronize", d.event_synchronize, missing);
  bind(h, "cuEventElapsedTime", d.event_elapsed, missing);
  bind(h, "cuEventDestroy_v2", d.event_destroy, missing);
  if (!missing.empty()) {
    d.error = "the CUDA driver is too old (missing " + missing + ")";
    dlclose(h);
    return;
  }
  // cuInit is cheap and idempotent, and PyTorch calls it too; it fails without a GPU.
  if (CUresult r = d.init(0); r != kCudaSuccess) {
    d.error = d.describe("cuInit", r);
    return;  // keep the handle: describe() needs its error-string functions
  }
  d.handle = h;
}

// Loaded once and never unloaded: CudaModule destructors may run during static destruction
// at exit, and must still find the function pointers.
const Driver& driver() {
  static Driver* d = new Driver;
  static std::once_flag once;
  std::call_once(once, [] { load_into(*d); });
  return *d;
}

// Makes a context of `device` current on this thread. An existing current context of that
// device (PyTorch's, normally) is used as is; otherwise the device's primary context is
// retained and made current. PyTorch works in the primary context too, so the modules we load
// there see its allocations. The retain is deliberately never released: it keeps the context
// alive for as long as kiln's modules might be used.
bool ensure_context(const Driver& d, int device, std::string& error) {
  CUcontext cur = nullptr;
  if (CUresult r = d.ctx_get_current(&cur); r != kCudaSuccess) {
    error = d.describe("cuCtxGetCurrent", r);
    return false;
  }
  if (cur) {
    CUdevice cur_dev = -1;
    if (d.ctx_get_device(&cur_dev) == kCudaSuccess && cur_dev == device) return true;
  }
  CUdevice dev = 0;
  if (CUresult r = d.device_get(&dev, device); r != kCudaSuccess) {
    error = d.describe("cuDeviceGet", r);
    return false;
  }
  static std::mutex mu;
  static std::vector<CUcontext> retained;  // by device ordinal; one retain per device
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (static_cast<size_t>(device) >= retained.size()) retained.resize(device + 1, nullptr);
    if (!retained[device]) {
      if (CUresult r = d.primary_ctx_retain(&retained[device], dev); r != kCudaSuccess) {
        retained[device] = nullptr;
        error = d.describe("cuDevicePrimaryCtxRetain", r);
        return false;
      }
    }
    ctx = retained[device];
  }
  if (CUresult r = d.ctx_set_current(ctx); r != kCudaSuccess) {
    error = d.describe("cuCtxSetCurrent", r);
    return false;
  }
  return true;
}

}  // namespace

bool cuda_driver_available(std::string* why) {
  const Driver& d = driver();
  if (d.handle) return true;
  if (why) *why = d.error;
  return false;
}

std::string cuda_device_name(int device) {
  const Driver& d = driver();
  char name[256] = {0};
  CUdevice dev = 0;
  if (!d.handle || !d.device_get_name || d.device_get(&dev, device) != kCudaSuccess ||
      d.device_get_name(name, sizeof name - 1, dev) != kCudaSuccess)
    return "";
  return name;
}

int cuda_compute_capability(int device) {
  const Driver& d = driver();
  if (!d.handle) return 0;
  CUdevice dev = 0;
  int major = 0, minor = 0;
  if (d.device_get(&dev, device) != kCudaSuccess ||
      d.device_get_attribute(&major, kAttrComputeCapabilityMajor, dev) != kCudaSuccess ||
      d.device_get_attribute(&minor, kAttrComputeCapabilityMinor, dev) != kCudaSuccess)
    return 0;
  return major * 10 + minor;
}

std::shared_ptr<CudaModule> CudaModule::load(const std::string& image, int device,
                                              std::string& error) {
  const Driver& d = driver();
  if (!d.handle) {
    error = d.error;
    return nullptr;
  }
  if (device < 0) {
    error = "CudaModule::load: bad device " + std::to_string(device);
    return nullptr;
  }
  if (image.empty()) {
    error = "CudaModule::load: empty image";
    return nullptr;
  }
  if (!ensure_context(d, device, error)) return nullptr;
  // A PTX image must be NUL-terminated; std::string's storage always is.
  CUmodule mod = nullptr;
  if (CUresult r = d.module_load_data(&mod, image.c_str()); r != kCudaSuccess) {
    error = d.describe("cuModuleLoadData", r);
    return nullptr;
  }
  std::shared_ptr<CudaModule> m(new CudaModule());
  m->module_ = mod;
  m->device_ = device;
  return m;
}

CudaModule::~CudaModule() {
  // At process exit the driver may already be shutting down; there is nobody to tell then.
  if (module_) driver().module_unload(static_cast<CUmodule>(module_));
}

void* CudaModule::function(const std::string& name, std::string& error) const {
  const Driver& d = driver();
  CUfunction fn = nullptr;
  if (CUresult r = d.module_get_function(&fn, static_cast<CUmodule>(module_), name.c_str());
      r != kCudaSuccess) {
    error = d.describe(("cuModuleGetFunction(" + name + ")").c_str(), r);
    return nullptr;
  }
  return fn;
}

bool cuda_make_current(int device, std::string& error) {
  const Driver& d = driver();
  if (!d.handle) {
    error = d.error;
    return false;
  }
  return ensure_context(d, device, error);
}

bool cuda_launch(void* fn, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                 unsigned block_y, unsigned block_z, unsigned shared_bytes, void* stream,
                 void** args, std::string& error) {
  const Driver& d = driver();
  if (!d.handle) {
    error = d.error;
    return false;
  }
  if (!fn) {
    error = "cuda_launch: null function";
    return false;
  }
  CUresult r = d.launch_kernel(static_cast<CUfunction>(fn), grid_x, grid_y, grid_z, block_x,
                               block_y, block_z, shared_bytes, static_cast<CUstream>(stream),
                               args, nullptr);
  if (r != kCudaSuccess) {
    error = d.describe("cuLaunchKernel", r);
    return false;
  }
  return true;
}

bool cuda_graph_launch(void* exec, void* stream, std::string& error) {
  const Driver& d = driver();
  if (!d.handle) {
    error = d.error;
    return false;
  }
  if (CUresult r = d.graph_launch(exec, static_cast<CUstream>(stream)); r != kCudaSuccess) {
    error = d.describe("cuGraphLaunch", r);
    return false;
  }
  return true;
}

std::unique_ptr<CudaScratch> CudaScratch::make(size_t bytes, int device, std::string& error) {
  const Driver& d = driver();
  if (!d.handle) {
    error = d.error;
    return nullptr;
  }
  if (!ensure_context(d, device, error)) return nullptr;
  CUdeviceptr p = 0;
  if (CUresult r = d.mem_alloc(&p, std::max<size_t>(bytes, 16)); r != kCudaSuccess) {
    error = d.describe("cuMemAlloc", r);
    return nullptr;
  }
  std::unique_ptr<CudaScratch> s(new CudaScratch());
  s->ptr_ = reinterpret_cast<void*>(p);
  // Zeros: every integer a kernel may read as an index is then in range.
  if (CUresult r = d.memset_d8(p, 0, std::max<size_t>(bytes, 16)); r != kCudaSuccess) {
    error = d.describe("cuMemsetD8", r);
    return nullptr;
  }
  return s;
}

CudaScratch::~CudaScratch() {
  if (ptr_) driver().mem_free(reinterpret_cast<CUdeviceptr>(ptr_));
}

namespace {

// A kernel that keeps the GPU busy for `ns` nanoseconds (of its global timer): launched ahead
// of a timed run, it lets the host enqueue all of the run's work before the GPU reaches it, so
// the events time the GPU's work alone, not how fast the host launches it.
constexpr const char* kSpinSource =
    "extern \"C\" __global__ void kiln_spin(unsigned long long ns) {\n"
    "  unsigned long long start, now;\n"
    "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(start));\n"
    "  do {\n"
    "    __nanosleep(1000);\n"
    "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(now));\n"
    "  } while (now - start < ns);\n"
    "}\n";

void* spin_kernel(int device, std::string& error) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<CudaModule>> modules;  // by device
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<size_t>(device) >= modules.size()) modules.resize(device + 1);
  if (!modules[device]) {
    const int cc = cuda_compute_capability(device);
    NvrtcResult r = nvrtc_compile(kSpinSource, cc >= 70 ? "sm_" + std::to_string(cc) : "sm_70", "kiln_spin");
    if (!r.ok) {
      error = "spin kernel: " + r.log;
      return nullptr;
    }
    if (!(modules[device] = CudaModule::load(r.image, device, error))) return nullptr;
  }
  return modules[device]->function("kiln_spin", error);
}

}  // namespace

double cuda_time(const std::function<bool(std::string&)>& work, int reps, int device, void* stream,
                 std::string& error, double host_ahead_ms) {
  const Driver& d = driver();
  if (!d.handle) {
    error = d.error;
    return -1;
  }
  if (!ensure_context(d, device, error)) return -1;
  void* spin = nullptr;
  if (host_ahead_ms > 0 && !(spin = spin_kernel(device, error))) return -1;
  void *start = nullptr, *stop = nullptr;
  if (CUresult r = d.event_create(&start, 0); r != kCudaSuccess) return error = d.describe("cuEventCreate", r), -1;
  if (CUresult r = d.event_create(&stop, 0); r != kCudaSuccess) {
    d.event_destroy(start);
    return error = d.describe("cuEventCreate", r), -1;
  }
  double ms = -1;
  do {
    if (!work(error)) break;  // warm: caches, clocks
    if (spin) {
      unsigned long long ns = static_cast<unsigned long long>(host_ahead_ms * 1e6);
      void* args[] = {&ns};
      if (!cuda_launch(spin, 1, 1, 1, 1, 1, 1, 0, stream, args, error)) break;
    }
    if (CUresult r = d.event_record(start, static_cast<CUstream>(stream)); r != kCudaSuccess) {
      error = d.describe("cuEventRecord", r);
      break;
    }
    bool ran = true;
    for (int i = 0; i < reps && ran; ++i) ran = work(error);
    if (!ran) break;
    if (CUresult r = d.event_record(stop, static_cast<CUstream>(stream)); r != kCudaSuccess) {
      error = d.describe("cuEventRecord", r);
      break;
    }
    // Surfaces a fault the kernel raised while it ran.
    if (CUresult r = d.event_synchronize(stop); r != kCudaSuccess) {
      error = d.describe("cuEventSynchronize", r);
      break;
    }
    float elapsed = 0;
    if (CUresult r = d.event_elapsed(&elapsed, start, stop); r != kCudaSuccess) {
      error = d.describe("cuEventElapsedTime", r);
      break;
    }
    ms = static_cast<double>(elapsed) / std::max(reps, 1);
  } while (false);
  d.event_destroy(start);
  d.event_destroy(stop);
  return ms;
}

double cuda_benchmark(const std::function<bool(std::string&)>& work, int max_reps, int device, void* stream,
                      std::string& error) {
  const double once = cuda_time(work, 1, device, stream, error);
  if (once < 0) return -1;
  const int reps = static_cast<int>(std::clamp(1.0 / std::max(once, 1e-4), 1.0, static_cast<double>(max_reps)));
  double best = -1;
  for (int r = 0; r < 3; ++r) {
    const double t = cuda_time(work, reps, device, stream, error, once * reps * 1.5 + 0.05);
    if (t < 0) return -1;
    best = best < 0 ? t : std::min(best, t);
  }
  return best;
}

bool cuda_selftest(std::string& error) {
  const Driver& d = driver();
  if (!d.handle) {
    error = d.error;
    return false;
  }
  const int cc = cuda_compute_capability(0);
  if (cc == 0) {
    error = "cuda_selftest: cannot read the compute capability of device 0";
    return false;
  }
  const char* source =
      "extern \"C\" __global__ void k(float* x, int n) {\n"
      "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
      "  if (i < n) x[i] = x[i] * 2.0f;\n"
      "}\n";
  NvrtcResult compiled = nvrtc_compile(source, "sm_" + std::to_string(cc), "kiln_selftest");
  if (!compiled.ok) {
    error = "cuda_selftest: NVRTC failed:\n" + compiled.log;
    return false;
  }
  auto mod = CudaModule::load(compiled.image, 0, error);
  if (!mod) return false;
  void* fn = mod->function("k", error);
  if (!fn) return false;

  int n = 1000;  // not a multiple of the block size, so the bounds check is exercised
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i) - 0.5f;
  const size_t bytes = host.size() * sizeof(float);
  CUdeviceptr buf = 0;
  if (CUresult r = d.mem_alloc(&buf, bytes); r != kCudaSuccess) {
    error = d.describe("cuMemAlloc", r);
    return false;
  }
  bool ok = false;
  do {  // one exit path, so that the buffer is always freed
    if (CUresult r = d.memcpy_htod(buf, host.data(), bytes); r != kCudaSuccess) {
      error = d.describe("cuMemcpyHtoD", r);
      break;
    }
    void* args[] = {&buf, &n};
    const unsigned block = 256, grid = (n + block - 1) / block;
    if (!cuda_launch(fn, grid, 1, 1, block, 1, 1, 0, nullptr, args, error)) break;
    // Surfaces faults raised while the kernel ran, which the launch itself cannot report.
    if (CUresult r = d.ctx_synchronize(); r != kCudaSuccess) {
      error = d.describe("cuCtxSynchronize", r);
      break;
    }
    std::vector<float> out(n);
    if (CUresult r = d.memcpy_dtoh(out.data(), buf, bytes); r != kCudaSuccess) {
      error = d.describe("cuMemcpyDtoH", r);
      break;
    }
    ok = true;
    for (int i = 0; i < n && ok; ++i) {
      if (out[i] != host[i] * 2.0f) {
        error = "cuda_selftest: x[" + std::to_string(i) + "] = " + std::to_string(out[i]) +
                ", expected " + std::to_string(host[i] * 2.0f);
        ok = false;
      }
    }
  } while (false);
  d.mem_free(buf);
  return ok;
}

}  // namespace kiln::compile
