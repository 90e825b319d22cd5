#include "core/compile/cpu_compiler.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using kiln::compile::compile_cpp;
using kiln::compile::cpu_compiler_id;

namespace {

const char* kAddSource = R"(extern "C" int kiln_test_add(int a, int b) { return a + b; }
)";

using AddFn = int (*)(int, int);

class CpuCompilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/kiln-cpu-compiler-test-XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    root_ = templ;
    setenv("KILN_CACHE_DIR", root_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("KILN_CACHE_DIR");
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  std::string root_;
};

int call_add(const kiln::compile::CpuCompileResult& r, int a, int b) {
  auto fn = reinterpret_cast<AddFn>(r.library->symbol("kiln_test_add"));
  EXPECT_NE(fn, nullptr);
  return fn ? fn(a, b) : -1;
}

}  // namespace

TEST_F(CpuCompilerTest, CompilerIdIsDescriptive) {
  const std::string& id = cpu_compiler_id();
  EXPECT_NE(id.find(" | "), std::string::npos) << id;
  EXPECT_EQ(&id, &cpu_compiler_id());
}

TEST_F(CpuCompilerTest, CompilesLoadsAndCaches) {
  auto first = compile_cpp(kAddSource);
  ASSERT_TRUE(first.library) << first.error;
  EXPECT_FALSE(first.cache_hit);
  EXPECT_GT(first.seconds, 0);
  EXPECT_EQ(call_add(first, 2, 40), 42);
  EXPECT_EQ(first.library->symbol("no_such_symbol"), nullptr);
  EXPECT_EQ(fs::path(first.so_path).parent_path(), fs::path(root_) / "cpu");
  ASSERT_TRUE(fs::exists(first.source_path));
  std::ifstream src(first.source_path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(src), {}), kAddSource);

  auto second = compile_cpp(kAddSource);
  ASSERT_TRUE(second.library) << second.error;
  EXPECT_TRUE(second.cache_hit);
  EXPECT_EQ(second.so_path, first.so_path);
  EXPECT_EQ(call_add(second, -5, 3), -2);

  // A different source is a different entry.
  auto other = compile_cpp(std::string(kAddSource) + "// variant\n");
  ASSERT_TRUE(other.library) << other.error;
  EXPECT_FALSE(other.cache_hit);
  EXPECT_NE(other.so_path, first.so_path);
}

TEST_F(CpuCompilerTest, SyntaxErrorReportsCompilerOutput) {
  auto r = compile_cpp("extern \"C\" int broken( { return }\n");
  EXPECT_FALSE(r.library);
  EXPECT_FALSE(r.error.empty());
  EXPECT_NE(r.error.find("error"), std::string::npos) << r.error;
  EXPECT_LT(r.error.size(), 4500u);
  // Only the source was left behind; no library was published.
  for (const auto& e : fs::directory_iterator(fs::path(root_) / "cpu"))
    EXPECT_EQ(e.path().extension(), ".cpp") << e.path();
}

TEST_F(CpuCompilerTest, CorruptedCacheEntryIsRebuilt) {
  std::string so_path;
  {
    auto r = compile_cpp(kAddSource);
    ASSERT_TRUE(r.library) << r.error;
    so_path = r.so_path;
  }  // unloaded here, before its file is tampered with
  {  // Replace the file rather than writing into it: a still-mapped library must not change.
    std::vector<char> bytes;
    {
      std::ifstream in(so_path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    ASSERT_GT(bytes.size(), 100u);
    bytes[bytes.size() / 2] ^= 0x5a;
    fs::remove(so_path);
    std::ofstream out(so_path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto rebuilt = compile_cpp(kAddSource);
  ASSERT_TRUE(rebuilt.library) << rebuilt.error;
  EXPECT_FALSE(rebuilt.cache_hit);
  EXPECT_EQ(call_add(rebuilt, 20, 22), 42);

  auto again = compile_cpp(kAddSource);
  ASSERT_TRUE(again.library) << again.error;
  EXPECT_TRUE(again.cache_hit);
}

TEST_F(CpuCompilerTest, ConcurrentCompilesOfOneSource) {
  const std::string source = std::string(kAddSource) + "// concurrent\n";
  std::vector<kiln::compile::CpuCompileResult> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&r, &source] { r = compile_cpp(source); });
  for (auto& t : threads) t.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.library) << r.error;
    EXPECT_EQ(call_add(r, 1, 1), 2);
  }
}

TEST_F(CpuCompilerTest, CacheDirWithSpaces) {
  std::string spaced = root_ + "/with space";
  setenv("KILN_CACHE_DIR", spaced.c_str(), 1);
  auto r = compile_cpp(std::string(kAddSource) + "// spaces\n");
  ASSERT_TRUE(r.library) << r.error;
  EXPECT_EQ(call_add(r, 3, 4), 7);
  EXPECT_EQ(r.so_path.rfind(spaced, 0), 0u);
}

// A compile that takes seconds: the constant is worked out by the compiler.
const char* kSlowSource = R"(constexpr long kiln_slow() {
  long s = 0;
  for (long i = 0; i < 30000000; ++i) s += i ^ (s >> 3);
  return s;
}
extern "C" long kiln_test_slow() { constexpr long v = kiln_slow(); return v; }
)";

TEST_F(CpuCompilerTest, CancelKillsTheCompilerAndPublishesNothing) {
  int asked = 0;
  auto start = std::chrono::steady_clock::now();
  auto r = compile_cpp(kSlowSource, [&] { return ++asked >= 2; });
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(r.cancelled) << r.error;
  EXPECT_FALSE(r.library);
  EXPECT_EQ(asked, 2);
  EXPECT_LT(took, 5.0);
  // No library and no temporary: only the source is left.
  for (const auto& e : fs::directory_iterator(fs::path(root_) / "cpu"))
    EXPECT_EQ(e.path().extension(), ".cpp") << e.path();
  // A cancel that never fires changes nothing.
  auto ok = compile_cpp(kAddSource, [] { return false; });
  ASSERT_TRUE(ok.library) << ok.error;
  EXPECT_FALSE(ok.cancelled);
  EXPECT_EQ(call_add(ok, 2, 3), 5);
}
