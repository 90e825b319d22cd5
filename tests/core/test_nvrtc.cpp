// NVRTC compilation and the CUDA driver path. NVRTC tests run wherever an NVRTC library can be
// found (no GPU needed); the launch test needs a GPU and skips elsewhere.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "core/compile/cuda_driver.h"
#include "core/compile/nvrtc.h"

using namespace kiln::compile;

namespace {

// Points NVRTC at the wheel in the dev venv when the environment does not say otherwise. Must
// run before the first NVRTC call, which loads the library once per process.
void use_dev_nvrtc() {
  const char* dir = "/root/.kiln-dev/venv/lib/python3.11/site-packages/nvidia/cu13/lib";
  struct stat st;
  if (stat(dir, &st) == 0) setenv("KILN_NVRTC_DIRS", dir, /*overwrite=*/0);
  // Keep test entries out of the user's cache unless a cache was chosen explicitly.
  setenv("KILN_CACHE_DIR", "/tmp/kiln-test-cache", /*overwrite=*/0);
}

bool have_nvrtc() {
  use_dev_nvrtc();
  std::string why;
  if (nvrtc_available(&why)) return true;
  std::cerr << "NVRTC unavailable: " << why << "\n";
  return false;
}

// A fresh token on every call, so that a test's first compile cannot be a hit left over from
// an earlier run (or an earlier --gtest_repeat iteration).
std::string run_token() {
  static int counter = 0;
  return std::to_string(getpid()) + "_" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "_" +
         std::to_string(counter++);
}

const char* kDoubling =
    "extern \"C\" __global__ void k(float* x, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) x[i] = x[i] * 2.0f;\n"
    "}\n";

}  // namespace

TEST(Nvrtc, CompilesCubinAndCaches) {
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC library";
  const std::string src = std::string("// run ") + run_token() + "\n" + kDoubling;

  NvrtcResult first = nvrtc_compile(src, "sm_90", "doubling");
  ASSERT_TRUE(first.ok) << first.log;
  EXPECT_FALSE(first.cache_hit);
  ASSERT_FALSE(first.image.empty());
  EXPECT_EQ(first.image.compare(0, 4, "\x7f" "ELF"), 0) << "a CUBIN is an ELF file";
  EXPECT_GE(first.seconds, 0.0);

  NvrtcResult second = nvrtc_compile(src, "sm_90", "doubling");
  ASSERT_TRUE(second.ok) << second.log;
  EXPECT_TRUE(second.cache_hit);
  EXPECT_EQ(second.image, first.image);

  // A different arch is a different entry.
  NvrtcResult other = nvrtc_compile(src, "sm_80", "doubling");
  ASSERT_TRUE(other.ok) << other.log;
  EXPECT_FALSE(other.cache_hit);
}

TEST(Nvrtc, CompilesPtx) {
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC library";
  const std::string src = std::string("// ptx ") + run_token() + "\n" + kDoubling;
  NvrtcResult r = nvrtc_compile(src, "compute_90", "doubling");
  ASSERT_TRUE(r.ok) << r.log;
  EXPECT_NE(r.image.find(".entry k"), std::string::npos);
  EXPECT_EQ(r.image.find('\0'), std::string::npos) << "no embedded NUL in PTX text";
}

TEST(Nvrtc, SyntaxErrorReportsLog) {
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC library";
  const std::string src = std::string("// bad ") + run_token() +
                          "\nextern \"C\" __global__ void k(float* x) { x[0] = ; }\n";
  NvrtcResult r = nvrtc_compile(src, "sm_90", "broken");
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.log.empty());
  EXPECT_TRUE(r.image.empty());
  // Failures are not cached: a retry compiles (and fails) again.
  NvrtcResult again = nvrtc_compile(src, "sm_90", "broken");
  EXPECT_FALSE(again.ok);
  EXPECT_FALSE(again.cache_hit);
}

TEST(Nvrtc, RejectsUnknownArch) {
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC library";
  NvrtcResult r = nvrtc_compile(kDoubling, "gfx90a", "doubling");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.log.find("arch"), std::string::npos);
}

TEST(CudaDriver, AvailabilityIsReportedWithoutCrashing) {
  std::string why;
  bool ok = cuda_driver_available(&why);
  if (ok) {
    EXPECT_GT(cuda_compute_capability(0), 0);
  } else {
    EXPECT_FALSE(why.empty());
    EXPECT_EQ(cuda_compute_capability(0), 0);
    std::string error;
    EXPECT_EQ(CudaModule::load("not an image", 0, error), nullptr);
    EXPECT_FALSE(error.empty());
    error.clear();
    EXPECT_FALSE(cuda_launch(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, error));
    EXPECT_FALSE(error.empty());
  }
}

TEST(CudaDriver, SelftestLaunchesKernel) {
  std::string why;
  if (!cuda_driver_available(&why)) GTEST_SKIP() << "no CUDA driver: " << why;
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC library";
  std::string error;
  EXPECT_TRUE(cuda_selftest(error)) << error;
}

TEST(CudaDriver, BadImageAndMissingFunctionAreErrors) {
  std::string why;
  if (!cuda_driver_available(&why)) GTEST_SKIP() << "no CUDA driver: " << why;
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC library";
  std::string error;
  EXPECT_EQ(CudaModule::load("definitely not a cubin", 0, error), nullptr);
  EXPECT_FALSE(error.empty());

  const int cc = cuda_compute_capability(0);
  NvrtcResult r = nvrtc_compile(kDoubling, "sm_" + std::to_string(cc), "doubling");
  ASSERT_TRUE(r.ok) << r.log;
  error.clear();
  auto mod = CudaModule::load(r.image, 0, error);
  ASSERT_NE(mod, nullptr) << error;
  error.clear();
  EXPECT_EQ(mod->function("no_such_kernel", error), nullptr);
  EXPECT_NE(error.find("no_such_kernel"), std::string::npos) << error;
}
