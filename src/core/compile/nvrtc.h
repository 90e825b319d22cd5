// Run-time compilation of generated CUDA C++ with NVRTC. The NVRTC library is loaded with
// dlopen on first use, so kiln builds and imports on machines without CUDA.
#pragma once
#include <string>

namespace kiln::compile {

// True when an NVRTC library could be loaded (searched: $KILN_NVRTC_PATH, libnvrtc.so,
// libnvrtc.so.13, libnvrtc.so.12, and the nvidia/cu13|cuda_nvrtc wheels next to torch, found
// through $KILN_NVRTC_DIRS, a ':'-separated list the binding layer fills in).
bool nvrtc_available(std::string* why = nullptr);

struct NvrtcResult {
  bool ok = false;
  std::string image;     // CUBIN when `arch` is an sm_XX, else PTX
  std::string log;       // compiler log (errors and warnings)
  bool cache_hit = false;
  double seconds = 0;
};

// Compiles `source` for `arch` (e.g. "sm_90", or "compute_90" for PTX). Results are cached on
// disk by content hash (source, arch, NVRTC version, options).
NvrtcResult nvrtc_compile(const std::string& source, const std::string& arch,
                          const std::string& name_hint);

}  // namespace kiln::compile
