// NVRTC through dlopen. The handful of NVRTC entry points kiln uses are declared here by hand
// (C ABI, from the public NVRTC documentation) so that the core neither includes CUDA headers
// nor links against CUDA: a machine without CUDA still builds and runs everything else.
#include "core/compile/nvrtc.h"

#include <dlfcn.h>
#include <link.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/compile/disk_cache.h"
#include "core/support/hash.h"

namespace kiln::compile {
namespace {

// ---- the NVRTC C API, as much of it as we call ----
using nvrtcResult = int;  // an enum in nvrtc.h; 0 is NVRTC_SUCCESS
using nvrtcProgram = struct _nvrtcProgram*;
constexpr nvrtcResult kNvrtcSuccess = 0;

using CreateProgramFn = nvrtcResult (*)(nvrtcProgram*, const char* src, const char* name,
                                        int num_headers, const char* const* headers,
                                        const char* const* include_names);
using CompileProgramFn = nvrtcResult (*)(nvrtcProgram, int num_options, const char* const* options);
using DestroyProgramFn = nvrtcResult (*)(nvrtcProgram*);
using GetSizeFn = nvrtcResult (*)(nvrtcProgram, size_t*);  // log, CUBIN and PTX sizes
using GetBytesFn = nvrtcResult (*)(nvrtcProgram, char*);   // log, CUBIN and PTX contents
using VersionFn = nvrtcResult (*)(int* major, int* minor);
using GetErrorStringFn = const char* (*)(nvrtcResult);

struct Nvrtc {
  void* handle = nullptr;
  std::string path;   // which file was loaded
  std::string error;  // why loading failed, when it did
  std::string version;
  bool minimal = false;  // accepts -minimal (CUDA 12.4+)
  CreateProgramFn create = nullptr;
  CompileProgramFn compile = nullptr;
  DestroyProgramFn destroy = nullptr;
  GetSizeFn log_size = nullptr;
  GetBytesFn log = nullptr;
  GetSizeFn cubin_size = nullptr;  // absent before CUDA 11.1; only needed for sm_XX
  GetBytesFn cubin = nullptr;
  GetSizeFn ptx_size = nullptr;
  GetBytesFn ptx = nullptr;
  VersionFn version_fn = nullptr;
  GetErrorStringFn error_string = nullptr;

  std::string describe(nvrtcResult r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return std::string(s ? s : "NVRTC error") + " (" + std::to_string(r) + ")";
  }
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) parts.push_back(cur);
  return parts;
}

// NVRTC dlopens its companion libnvrtc-builtins.so.<major>.<minor> by bare name at compile
// time. Pip wheels carry no rpath for it, so outside of the loader's search path that fails
// ("failed to open libnvrtc-builtins"). Loading it ourselves first, from the directory NVRTC
// came from, makes NVRTC's own dlopen find it already resident (matched by soname).
void preload_builtins(void* nvrtc_handle, const std::string& version) {
  link_map* map = nullptr;
  if (dlinfo(nvrtc_handle, RTLD_DI_LINKMAP, &map) != 0 || !map || !map->l_name) return;
  std::string dir = map->l_name;
  const size_t slash = dir.rfind('/');
  if (slash == std::string::npos) return;
  dir.resize(slash);
  // Failure is harmless: NVRTC may still find the library on its own, or report it.
  if (!dlopen((dir + "/libnvrtc-builtins.so." + version).c_str(), RTLD_NOW | RTLD_LOCAL))
    dlerror();  // clear the pending error so a later dlerror() call does not report it
}

// Tries the candidates in order and binds the symbols of the first that loads.
void load_into(Nvrtc& n) {
  static const char* const kNames[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"};
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("KILN_NVRTC_PATH"); p && *p) candidates.push_back(p);
  if (const char* dirs = std::getenv("KILN_NVRTC_DIRS"); dirs && *dirs)
    for (const auto& dir : split(dirs, ':'))
      for (const char* name : kNames) candidates.push_back(dir + "/" + name);
  for (const char* name : kNames) candidates.push_back(name);  // the loader's own search path

  std::string tried;
  for (const auto& c : candidates) {
    // RTLD_LOCAL: keep NVRTC's symbols out of the global namespace of the host process.
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      tried += "\n  " + c + ": " + (e ? e : "not loadable");
      continue;
    }
    auto sym = [&](const char* name) { return dlsym(h, name); };
    n.create = reinterpret_cast<CreateProgramFn>(sym("nvrtcCreateProgram"));
    n.compile = reinterpret_cast<CompileProgramFn>(sym("nvrtcCompileProgram"));
    n.destroy = reinterpret_cast<DestroyProgramFn>(sym("nvrtcDestroyProgram"));
    n.log_size = reinterpret_cast<GetSizeFn>(sym("nvrtcGetProgramLogSize"));
    n.log = reinterpret_cast<GetBytesFn>(sym("nvrtcGetProgramLog"));
    n.cubin_size = reinterpret_cast<GetSizeFn>(sym("nvrtcGetCUBINSize"));
    n.cubin = reinterpret_cast<GetBytesFn>(sym("nvrtcGetCUBIN"));
    n.ptx_size = reinterpret_cast<GetSizeFn>(sym("nvrtcGetPTXSize"));
    n.ptx = reinterpret_cast<GetBytesFn>(sym("nvrtcGetPTX"));
    n.version_fn = reinterpret_cast<VersionFn>(sym("nvrtcVersion"));
    n.error_string = reinterpret_cast<GetErrorStringFn>(sym("nvrtcGetErrorString"));
    if (!n.create || !n.compile || !n.destroy || !n.log_size || !n.log || !n.ptx_size || !n.ptx ||
        !n.version_fn) {
      tried += "\n  " + c + ": loaded, but it lacks NVRTC entry points";
      dlclose(h);
      n = Nvrtc{};
      continue;
    }
    int major = 0, minor = 0;
    n.version_fn(&major, &minor);
    n.version = std::to_string(major) + "." + std::to_string(minor);
    n.minimal = major > 12 || (major == 12 && minor >= 4);
    n.handle = h;
    n.path = c;
    preload_builtins(h, n.version);
    return;
  }
  n.error = "NVRTC not found (set KILN_NVRTC_PATH or KILN_NVRTC_DIRS); tried:" + tried;
}

// Loaded once per process and never unloaded: NVRTC is only ever used from here, and a
// leaked handle avoids any ordering problem with static destructors at exit.
const Nvrtc& nvrtc() {
  static Nvrtc* n = new Nvrtc;
  static std::once_flag once;
  std::call_once(once, [] { load_into(*n); });
  return *n;
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return !f.bad();
}

bool write_file(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  return static_cast<bool>(f);
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Runs NVRTC itself. Fills r.image (or r.log) and returns whether it compiled.
bool compile_uncached(const Nvrtc& n, const std::string& source, const std::string& name,
                      bool want_cubin, const std::vector<std::string>& options, NvrtcResult& r) {
  nvrtcProgram prog = nullptr;
  // No headers: generated kernels are self-contained (the device prelude is pasted in).
  nvrtcResult rc = n.create(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr);
  if (rc != kNvrtcSuccess) {
    r.log = "nvrtcCreateProgram failed: " + n.describe(rc);
    return false;
  }
  std::vector<const char*> opts;
  for (const auto& o : options) opts.push_back(o.c_str());
  rc = n.compile(prog, static_cast<int>(opts.size()), opts.data());

  // The log is worth keeping on success too: it carries warnings.
  size_t log_size = 0;
  if (n.log_size(prog, &log_size) == kNvrtcSuccess && log_size > 1) {
    std::string log(log_size, '\0');
    if (n.log(prog, log.data()) == kNvrtcSuccess) {
      log.resize(log_size - 1);  // the size counts the terminating NUL
      r.log = std::move(log);
    }
  }
  bool ok = false;
  if (rc != kNvrtcSuccess) {
    if (r.log.empty()) r.log = "nvrtcCompileProgram failed: " + n.describe(rc);
  } else {
    GetSizeFn size_fn = want_cubin ? n.cubin_size : n.ptx_size;
    GetBytesFn bytes_fn = want_cubin ? n.cubin : n.ptx;
    size_t size = 0;
    rc = size_fn(prog, &size);
    if (rc == kNvrtcSuccess) {
      r.image.assign(size, '\0');
      rc = bytes_fn(prog, r.image.data());
    }
    if (rc != kNvrtcSuccess) {
      r.image.clear();
      r.log += std::string(r.log.empty() ? "" : "\n") + "retrieving the " +
               (want_cubin ? "CUBIN" : "PTX") + " failed: " + n.describe(rc);
    } else {
      // PTX comes with a terminating NUL; std::string keeps its own, so drop it.
      if (!want_cubin && !r.image.empty() && r.image.back() == '\0') r.image.pop_back();
      ok = !r.image.empty();
      if (!ok) r.log += "NVRTC produced an empty image";
    }
  }
  n.destroy(&prog);
  return ok;
}

}  // namespace

bool nvrtc_available(std::string* why) {
  const Nvrtc& n = nvrtc();
  if (n.handle) return true;
  if (why) *why = n.error;
  return false;
}

NvrtcResult nvrtc_compile(const std::string& source, const std::string& arch,
                          const std::string& name_hint) {
  NvrtcResult r;
  const auto start = std::chrono::steady_clock::now();
  auto finish = [&]() -> NvrtcResult {
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::move(r);
  };

  const Nvrtc& n = nvrtc();
  if (!n.handle) {
    r.log = n.error;
    return finish();
  }
  const bool want_cubin = starts_with(arch, "sm_");
  if (!want_cubin && !starts_with(arch, "compute_")) {
    r.log = "nvrtc_compile: arch must be sm_XX or compute_XX, got '" + arch + "'";
    return finish();
  }
  if (want_cubin && (!n.cubin_size || !n.cubin)) {
    r.log = "NVRTC " + n.version + " cannot produce CUBIN (needs CUDA 11.1+); ask for compute_XX";
    return finish();
  }

  // No --use_fast_math: kiln must match eager PyTorch numerics, so keep IEEE division, sqrt
  // and denormals. -default-device lets helper functions omit __device__. -minimal leaves out
  // the runtime API's declarations, textures and device-side launches, which kernels never use:
  // about 10 ms of each compile's fixed cost (an empty kernel's 40-50 ms).
  std::vector<std::string> options = {"--std=c++17", "-default-device", "-arch=" + arch};
  if (n.minimal) options.push_back("-minimal");

  uint64_t h = hash_str("kiln-nvrtc-1");  // bump to invalidate every entry
  h = hash_combine(h, hash_str(source));
  h = hash_combine(h, hash_str(arch));
  h = hash_combine(h, hash_str(n.version));
  for (const auto& o : options) h = hash_combine(h, hash_str(o));
  const std::string key = hex64(h);
  const std::string ext = want_cubin ? ".cubin" : ".ptx";

  // The directory is read on every compile, as the CPU compiler's: KILN_CACHE_DIR may move.
  const DiskCache cache(cache_dir() + "/cuda");
  if (auto path = cache.lookup(key, ext)) {
    if (read_file(*path, r.image) && !r.image.empty()) {
      r.ok = true;
      r.cache_hit = true;
      return finish();
    }
    r.image.clear();  // unreadable entry: fall through and rebuild it
  }

  const std::string name = (name_hint.empty() ? std::string("kiln_kernel") : name_hint) + ".cu";
  if (!compile_uncached(n, source, name, want_cubin, options, r)) return finish();
  r.ok = true;

  // The cache only saves time: when publishing fails the freshly built image is still good.
  std::string error;
  auto published = cache.publish(
      key, ext,
      [&](const std::string& tmp, std::string& err) {
        if (write_file(tmp, r.image)) return true;
        err = "cannot write " + tmp;
        return false;
      },
      error);
  if (!published) {
    r.log += std::string(r.log.empty() ? "" : "\n") + "kiln: not cached: " + error;
  } else {
    // Keep the source beside the entry so that a user can read what was compiled.
    write_file(cache.source_path(key, ".cu"), source);
  }
  return finish();
}

}  // namespace kiln::compile
