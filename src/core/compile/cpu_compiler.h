// Compiles generated C++ into a shared library with the system compiler and loads it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln::compile {

// A loaded shared library; unloaded when the last reference goes.
class SharedLibrary {
 public:
  static std::shared_ptr<SharedLibrary> open(const std::string& path, std::string& error);
  ~SharedLibrary();
  void* symbol(const std::string& name) const;  // nullptr if absent
  const std::string& path() const { return path_; }

 private:
  SharedLibrary(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  void* handle_;
  std::string path_;
};

struct CpuCompileResult {
  std::shared_ptr<SharedLibrary> library;  // null on failure
  std::string error;                       // compiler output on failure
  bool cache_hit = false;                  // loaded from the disk cache without compiling
  bool cancelled = false;                  // `cancel` asked to stop: the compiler was killed
  double seconds = 0;                      // wall time spent (compile or load)
  std::string so_path, source_path;
};

// $KILN_CXX, else $CXX, else "c++". Flags: -O3 -march=native -fopenmp -shared -fPIC
// -fno-math-errno -fno-trapping-math. The cache key covers source, compiler, its version and
// flags. The source is also written next to the entry so that users can read it.
// `cancel`, if given, is asked about every 50 ms while the compiler runs; when it returns true
// the compiler (its whole process group: driver, cc1plus, as, ld) is killed, nothing is
// published and the result is `cancelled`.
CpuCompileResult compile_cpp(const std::string& source, const std::function<bool()>& cancel = {});

// Several translation units of one library (codegen::generate_cpp_units), each compiled to an
// object on a thread of its own (the compilers run in parallel), then linked; cached as one
// entry keyed by all the sources. One source is compile_cpp. `source_path` is the first
// unit's (the others lie beside it, `<key>.<i>.cpp`).
CpuCompileResult compile_cpp_units(const std::vector<std::string>& sources, const std::function<bool()>& cancel = {});

// Vector math for CPU kernels: SIMD versions of exp, exp2, expm1, log, log2, log1p, sin, cos,
// tan, tanh and erf, float (8 lanes) then double (4 lanes), in `vector_math_functions()` order,
// as Sleef's Sleef_<fn>f8_u10 / Sleef_<fn>d4_u10 (what eager's own CPU kernels call; torch's
// library exports them), optionally followed by the 512-bit ones (f16, d8; kernels on AVX-512
// machines call those when all are there). Given before the first compile, kernels on AVX2 machines call them
// through a table each loaded library receives where glibc's libmvec is not there (libmvec is
// preferred), else kiln's own float functions (codegen/prelude/cpu_prelude.h).
// $KILN_VECTOR_MATH=sleef, =libmvec or =own picks one (tests).
const std::vector<std::string>& vector_math_functions();
void set_vector_math(std::vector<void*> float8_double4_then_float16_double8);
// "libmvec", "sleef" or "own": what CPU kernels compiled now call.
std::string vector_math_in_use();

// Identification of the compiler used (path + first line of --version), computed once.
const std::string& cpu_compiler_id();

}  // namespace kiln::compile
