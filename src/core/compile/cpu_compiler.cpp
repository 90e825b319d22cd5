#include "core/compile/cpu_compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "core/compile/disk_cache.h"
#include "core/support/hash.h"

extern char** environ;

namespace kiln::compile {

namespace {

std::vector<void*>& sleef_table() {
  static std::vector<void*> t;
  return t;
}

std::string vector_math_choice() {
  const char* v = std::getenv("KILN_VECTOR_MATH");
  return v ? v : "";
}

// glibc's libmvec has SIMD versions of exp, tanh, sin... The kernel prelude declares them
// `omp declare simd` when it is there, so loops over transcendental functions vectorize.
// Preferred to Sleef where both are there: the same accuracy class, and faster on the machines
// measured (erf over 24,576 floats on an AMD EPYC: 22 µs against Sleef's 79 µs).
bool have_libmvec() {
  static const bool have = [] {
    const std::string choice = vector_math_choice();
    if (choice == "own" || choice == "sleef") return false;
    void* h = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);
    bool ok = h && dlsym(h, "_ZGVdN8v_tanhf") && dlsym(h, "_ZGVdN4v_exp") && dlsym(h, "_ZGVbN4v_erff");
    if (h) dlclose(h);
    return ok;
  }();
  return have;
}

// The 512-bit libmvec functions (glibc 2.35 has them all), called on AVX-512 machines.
bool have_libmvec_512() {
  static const bool have = [] {
    if (!have_libmvec()) return false;
    void* h = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);
    bool ok = h;
    for (const std::string& fn : vector_math_functions())
      ok = ok && dlsym(h, ("_ZGVeN16v_" + fn + "f").c_str()) && dlsym(h, ("_ZGVeN8v_" + fn).c_str());
    if (h) dlclose(h);
    return ok;
  }();
  return have;
}

bool use_sleef() {
  static const bool use = sleef_table().size() >= 2 * vector_math_functions().size() && !have_libmvec() &&
                          vector_math_choice() != "own" && vector_math_choice() != "libmvec";
  return use;
}

const std::vector<std::string>& compile_flags() {
  static const std::vector<std::string> flags = [] {
    // -mtune=generic: the machine's instructions (-march=native), but GCC's generic tuning, which
    // does not turn strided reads into AVX2 gathers. GCC 12 with -fwrapv and a native (znver3,
    // icelake) tuning miscompiled such gathers under `omp simd`: a cat of transposed inputs read
    // one element from the wrong place (tests/python/test_join_ops.py).
    std::vector<std::string> f = {"-O3", "-march=native", "-mtune=generic", "-fopenmp", "-shared", "-fPIC",
                                  "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
                                  "-fwrapv"};  // signed overflow wraps, as torch's integer kernels do
    if (use_sleef()) f.push_back("-DKILN_SLEEF");
    if (use_sleef() && sleef_table().size() == 4 * vector_math_functions().size()) f.push_back("-DKILN_SLEEF_512");
    if (have_libmvec()) f.push_back("-DKILN_HAVE_MVEC");
    if (have_libmvec_512()) f.push_back("-DKILN_HAVE_MVEC_512");
    return f;
  }();
  return flags;
}

// Libraries go after the source on the command line.
const std::vector<std::string>& link_flags() {
  static const std::vector<std::string> flags = [] {
    std::vector<std::string> f;
    if (have_libmvec()) f.push_back("-lmvec");
    return f;
  }();
  return flags;
}

const std::string& flags_string() {
  static const std::string s = [] {
    std::string out;
    for (const auto& f : compile_flags()) out += f + " ";
    for (const auto& f : link_flags()) out += f + " ";
    return out;
  }();
  return s;
}

// Resolved once, together with cpu_compiler_id(): the compiler that builds an entry must be
// the one its key names. Taken as a single program path (no word splitting), so a path
// with spaces works; a wrapper such as "ccache g++" needs a small script instead.
const std::string& compiler() {
  static const std::string cxx = [] {
    for (const char* var : {"KILN_CXX", "CXX"}) {
      const char* v = std::getenv(var);
      if (v && *v) return std::string(v);
    }
    return std::string("c++");
  }();
  return cxx;
}

struct ProcessResult {
  bool ok = false;     // ran and exited with status 0
  bool cancelled = false;  // killed because `cancel` said so
  std::string status;  // how it ended, for messages
  std::string output;  // stdout and stderr interleaved, capped
};

// Runs argv[0] (searched on PATH) without a shell, collecting stdout+stderr through a pipe.
// The child leads a process group of its own, so that cancelling kills everything it started;
// Ctrl-C at a terminal reaches only kiln's process, which decides (through `cancel`).
ProcessResult run_process(const std::vector<std::string>& args, const std::function<bool()>& cancel = {}) {
  constexpr size_t kMaxOutput = 1 << 16;  // keep draining past this so the child never blocks
  ProcessResult res;
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  // O_CLOEXEC: another thread spawning at the same time must not inherit our write end, or
  // we would wait for EOF until that unrelated child exits too.
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    res.status = std::string("pipe failed: ") + std::strerror(errno);
    return res;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (cancel) {
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  }
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    res.status = "cannot run " + args[0] + ": " + std::strerror(rc);
    return res;
  }

  char buf[4096];
  auto asked = std::chrono::steady_clock::now();
  for (;;) {
    if (cancel && !res.cancelled) {
      // Asked every 50 ms, whether or not the compiler is printing.
      pollfd p{fds[0], POLLIN, 0};
      int ready = poll(&p, 1, 50);
      if (ready < 0 && errno != EINTR) break;
      auto now = std::chrono::steady_clock::now();
      if (now - asked >= std::chrono::milliseconds(50)) {
        asked = now;
        if (cancel()) {
          res.cancelled = true;
          kill(-pid, SIGKILL);  // the group: the driver's children hold the pipe open too
          continue;
        }
      }
      if (ready <= 0) continue;
    }
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (res.output.size() < kMaxOutput) res.output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);

  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) {
      res.status = std::string("waitpid failed: ") + std::strerror(errno);
      return res;
    }
  }
  if (res.cancelled) {
    res.status = "cancelled";
  } else if (WIFEXITED(wstatus)) {
    res.ok = WEXITSTATUS(wstatus) == 0;
    res.status = "exit status " + std::to_string(WEXITSTATUS(wstatus));
  } else if (WIFSIGNALED(wstatus)) {
    res.status = "killed by signal " + std::to_string(WTERMSIG(wstatus));
  } else {
    res.status = "ended abnormally";
  }
  return res;
}

// -march=native makes the artifact specific to this CPU, yet a cache directory under a
// shared $HOME can be reached from machines with different CPUs. Keying on the CPU model
// and feature list keeps one machine from loading another's code (and dying on SIGILL).
const std::string& host_cpu_id() {
  static const std::string id = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model, features;
    while (std::getline(in, line)) {
      auto starts = [&](const char* p) { return line.rfind(p, 0) == 0; };
      if (model.empty() && (starts("model name") || starts("CPU part"))) model = line;
      if (features.empty() && (starts("flags") || starts("Features"))) features = line;
      if (!model.empty() && !features.empty()) break;
    }
    return model + " | " + hex64(hash_str(features));
  }();
  return id;
}

std::string cache_key(const std::string& source) {
  uint64_t h = hash_str("kiln-cpu-v1");
  h = hash_combine(h, hash_str(source));
  h = hash_combine(h, hash_str(cpu_compiler_id()));
  h = hash_combine(h, hash_str(flags_string()));
  h = hash_combine(h, hash_str(host_cpu_id()));
  return hex64(h);
}

// The source is replaced atomically as well: another thread or process may be compiling
// from this very path while we (re)write it.
bool write_source(const std::string& path, const std::string& text, std::string& error) {
  size_t slash = path.rfind('/');
  return write_file_atomic(path.substr(0, slash), path.substr(slash + 1), text, error);
}

bool run_compiler(const std::string& src, const std::string& out, const std::function<bool()>& cancel,
                  bool& cancelled, std::string& error) {
  std::vector<std::string> args = {compiler()};
  args.insert(args.end(), compile_flags().begin(), compile_flags().end());
  args.insert(args.end(), {"-o", out, src});
  args.insert(args.end(), link_flags().begin(), link_flags().end());
  ProcessResult p = run_process(args, cancel);
  if (p.ok) return true;
  if (p.cancelled) {
    cancelled = true;
    error = "kiln: C++ compilation of " + src + " cancelled";
    return false;
  }
  constexpr size_t kMaxError = 4000;
  error = "kiln: C++ compilation of ";
  error += src;
  error += " failed (" + compiler() + ": " + p.status + ")";
  if (!p.output.empty()) {
    error += '\n';
    error.append(p.output, 0, kMaxError);
    if (p.output.size() > kMaxError) error += "\n[... output truncated]";
  }
  return false;
}

// Compiles `srcs` to objects in parallel and links them into `out`; the objects are removed.
bool run_compilers(const std::vector<std::string>& srcs, const std::string& out, const std::function<bool()>& cancel,
                   bool& cancelled, std::string& error) {
  std::vector<std::string> objects, errors(srcs.size());
  std::vector<char> ok(srcs.size(), 0), stopped(srcs.size(), 0);
  for (size_t i = 0; i < srcs.size(); ++i) objects.push_back(out + "." + std::to_string(i) + ".o");
  auto compile_one = [&](size_t i) {
    std::vector<std::string> args = {compiler()};
    for (const std::string& f : compile_flags())
      if (f != "-shared") args.push_back(f);
    args.insert(args.end(), {"-c", "-o", objects[i], srcs[i]});
    ProcessResult p = run_process(args, cancel);
    ok[i] = p.ok;
    stopped[i] = p.cancelled;
    if (!p.ok) errors[i] = p.status + (p.output.empty() ? "" : "\n" + p.output.substr(0, 4000));
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < srcs.size(); ++i) threads.emplace_back(compile_one, i);
  compile_one(0);
  for (std::thread& t : threads) t.join();
  auto remove_objects = [&] {
    for (const std::string& o : objects) std::remove(o.c_str());
  };
  for (size_t i = 0; i < srcs.size(); ++i) {
    if (ok[i]) continue;
    remove_objects();
    cancelled = stopped[i];
    error = "kiln: C++ compilation of " + srcs[i] + (cancelled ? " cancelled" : " failed (" + compiler() + ": " + errors[i] + ")");
    return false;
  }
  std::vector<std::string> args = {compiler()};
  args.insert(args.end(), compile_flags().begin(), compile_flags().end());
  args.insert(args.end(), {"-o", out});
  args.insert(args.end(), objects.begin(), objects.end());
  args.insert(args.end(), link_flags().begin(), link_flags().end());
  ProcessResult p = run_process(args, cancel);
  remove_objects();
  if (p.ok) return true;
  cancelled = p.cancelled;
  error = "kiln: linking " + out + (cancelled ? " cancelled" : " failed (" + compiler() + ": " + p.status + ")\n" + p.output.substr(0, 4000));
  return false;
}

}  // namespace

const std::vector<std::string>& vector_math_functions() {
  static const std::vector<std::string> fns = {"exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan", "tanh", "erf"};
  return fns;
}

std::string vector_math_in_use() { return have_libmvec() ? "libmvec" : use_sleef() ? "sleef" : "own"; }

void set_vector_math(std::vector<void*> table) {
  const size_t half = 2 * vector_math_functions().size();
  if (table.size() < half) return;
  for (size_t i = 0; i < half; ++i)
    if (!table[i]) return;
  bool wide = table.size() == 2 * half;
  for (size_t i = half; wide && i < table.size(); ++i) wide = table[i] != nullptr;
  table.resize(wide ? 2 * half : half);
  sleef_table() = std::move(table);
}

std::shared_ptr<SharedLibrary> SharedLibrary::open(const std::string& path, std::string& error) {
  // RTLD_NOW: an unresolved symbol should fail here, not at the first call of a kernel.
  // RTLD_LOCAL: every generated library exports the same entry-point names.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* msg = dlerror();
    error = "kiln: cannot load " + path + ": " + (msg ? msg : "unknown dlopen error");
    return nullptr;
  }
  // The OpenMP runtime a kernel library brings in keeps its worker threads alive after each
  // parallel region: were it unloaded with the last kernel library (a process that has no
  // other use for it, such as the core's tests), those threads would run unmapped code.
  // RTLD_NOLOAD | RTLD_NODELETE pins the copy already loaded, whichever it is.
  static bool pinned = false;
  if (!pinned) pinned = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) != nullptr;
  // Kernels built to call Sleef find its functions in this table (prelude: kiln_sleef).
  if (auto* set = reinterpret_cast<void (*)(void* const*)>(dlsym(handle, "kiln_set_sleef"))) {
    if (sleef_table().empty()) {
      dlclose(handle);
      error = "kiln: " + path + " was built to call Sleef, which this process has not given kiln";
      return nullptr;
    }
    set(sleef_table().data());
  }
  return std::shared_ptr<SharedLibrary>(new SharedLibrary(handle, path));
}

SharedLibrary::~SharedLibrary() {
  if (handle_) dlclose(handle_);
}

void* SharedLibrary::symbol(const std::string& name) const {
  return dlsym(handle_, name.c_str());
}

const std::string& cpu_compiler_id() {
  static const std::string id = [] {
    ProcessResult p = run_process({compiler(), "--version"});
    std::string first = p.output.substr(0, p.output.find('\n'));
    if (!p.ok || first.empty()) first = "(--version failed: " + p.status + ")";
    return compiler() + " | " + first;
  }();
  return id;
}

// Needs no lock: the shared state is either immutable statics or the cache directory, whose
// publish protocol already tolerates concurrent builders of the same key.
CpuCompileResult compile_cpp(const std::string& source, const std::function<bool()>& cancel) {
  return compile_cpp_units({source}, cancel);
}

CpuCompileResult compile_cpp_units(const std::vector<std::string>& sources, const std::function<bool()>& cancel) {
  const auto start = std::chrono::steady_clock::now();
  CpuCompileResult r;
  auto finish = [&]() -> CpuCompileResult {
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::move(r);
  };

  std::string joined = sources.size() == 1 ? sources[0] : "";
  for (size_t i = 0; sources.size() > 1 && i < sources.size(); ++i)
    joined += "\n// ---- unit " + std::to_string(i) + " of " + std::to_string(sources.size()) + "\n" + sources[i];
  const std::string key = cache_key(joined);
  const DiskCache cache(cache_dir() + "/cpu");
  std::vector<std::string> paths;
  for (size_t i = 0; i < sources.size(); ++i)
    paths.push_back(cache.source_path(key, sources.size() == 1 ? ".cpp" : "." + std::to_string(i) + ".cpp"));
  r.source_path = paths[0];

  std::string error;
  if (auto hit = cache.lookup(key, ".so")) {
    if (auto lib = SharedLibrary::open(*hit, error)) {
      r.library = std::move(lib);
      r.so_path = *hit;
      r.cache_hit = true;
      return finish();
    }
    // Verified but not loadable (e.g. built against a library that has since changed):
    // rebuild over it.
  }

  // The source may already be there; rewriting it is cheap and restores a deleted one.
  std::error_code ec;
  std::filesystem::create_directories(cache.dir(), ec);
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!write_source(paths[i], sources[i], error)) {
      r.error = error;
      return finish();
    }
  }

  auto build = [&](const std::string& tmp, std::string& err) {
    if (sources.size() == 1) return run_compiler(r.source_path, tmp, cancel, r.cancelled, err);
    return run_compilers(paths, tmp, cancel, r.cancelled, err);
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    error.clear();
    auto so = cache.publish(key, ".so", build, error);
    if (!so || r.cancelled) break;
    if (auto lib = SharedLibrary::open(*so, error)) {
      r.library = std::move(lib);
      r.so_path = *so;
      r.error.clear();
      return finish();
    }
    // A concurrent reader may have discarded the fresh entry before we opened it (possible
    // only when two builders produced different bytes); one more build settles that. Any
    // other load failure would just repeat, so report it.
    if (access(so->c_str(), F_OK) == 0) break;
  }
  r.error = error;
  return finish();
}

}  // namespace kiln::compile
