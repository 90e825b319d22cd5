#include "core/compile/disk_cache.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using kiln::compile::cache_dir;
using kiln::compile::DiskCache;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  return names;
}

// A builder that writes fixed bytes to the temporary path it is given.
auto writes(std::string bytes) {
  return [bytes](const std::string& tmp, std::string&) {
    write_all(tmp, bytes);
    return true;
  };
}

class DiskCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/kiln-disk-cache-test-XXXXXX";
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

}  // namespace

TEST_F(DiskCacheTest, CacheDirFollowsEnvironment) {
  EXPECT_EQ(cache_dir(), root_);
  std::string sub = root_ + "/a/b";
  setenv("KILN_CACHE_DIR", sub.c_str(), 1);
  EXPECT_EQ(cache_dir(), sub);
  EXPECT_TRUE(fs::is_directory(sub));

  unsetenv("KILN_CACHE_DIR");
  std::string xdg = root_ + "/xdg";
  setenv("XDG_CACHE_HOME", xdg.c_str(), 1);
  EXPECT_EQ(cache_dir(), xdg + "/kiln");
  EXPECT_TRUE(fs::is_directory(xdg + "/kiln"));
  unsetenv("XDG_CACHE_HOME");
}

TEST_F(DiskCacheTest, PublishThenLookup) {
  DiskCache cache(root_ + "/entries");
  EXPECT_FALSE(cache.lookup("k1", ".bin").has_value());

  std::string error;
  auto path = cache.publish("k1", ".bin", writes("hello artifact"), error);
  ASSERT_TRUE(path.has_value()) << error;
  EXPECT_EQ(*path, root_ + "/entries/k1.bin");
  EXPECT_EQ(read_all(*path), "hello artifact");
  EXPECT_TRUE(fs::exists(*path + ".sum"));

  auto hit = cache.lookup("k1", ".bin");
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, *path);
  // Another extension of the same key is a different entry.
  EXPECT_FALSE(cache.lookup("k1", ".so").has_value());
  // No temporaries are left behind.
  EXPECT_EQ(entries_of(cache.dir()).size(), 2u);
}

TEST_F(DiskCacheTest, EmptyArtifactRoundTrips) {
  DiskCache cache(root_);
  std::string error;
  ASSERT_TRUE(cache.publish("empty", ".bin", writes(""), error).has_value()) << error;
  EXPECT_TRUE(cache.lookup("empty", ".bin").has_value());
}

TEST_F(DiskCacheTest, BuilderSeesTemporaryPathWithExtension) {
  DiskCache cache(root_);
  std::string seen, error;
  auto path = cache.publish(
      "key", ".cubin",
      [&](const std::string& tmp, std::string&) {
        seen = tmp;
        write_all(tmp, "x");
        return true;
      },
      error);
  ASSERT_TRUE(path.has_value()) << error;
  EXPECT_NE(seen, *path);
  EXPECT_EQ(fs::path(seen).parent_path(), fs::path(*path).parent_path());
  EXPECT_EQ(fs::path(seen).extension(), ".cubin");
  EXPECT_FALSE(fs::exists(seen));
}

TEST_F(DiskCacheTest, CorruptedArtifactIsDetectedAndRemoved) {
  DiskCache cache(root_);
  std::string error;
  auto path = cache.publish("k", ".so", writes("0123456789abcdef"), error);
  ASSERT_TRUE(path.has_value()) << error;

  {  // Same length, different bytes, written in place.
    std::fstream f(*path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    f.write("XYZ", 3);
  }
  EXPECT_FALSE(cache.lookup("k", ".so").has_value());
  EXPECT_FALSE(fs::exists(*path));
  EXPECT_FALSE(fs::exists(*path + ".sum"));
  EXPECT_FALSE(cache.lookup("k", ".so").has_value());
}

TEST_F(DiskCacheTest, TruncatedArtifactIsDetected) {
  DiskCache cache(root_);
  std::string error;
  auto path = cache.publish("k", ".so", writes(std::string(100000, 'q')), error);
  ASSERT_TRUE(path.has_value()) << error;
  fs::resize_file(*path, 50000);
  EXPECT_FALSE(cache.lookup("k", ".so").has_value());
  EXPECT_FALSE(fs::exists(*path));
}

TEST_F(DiskCacheTest, MissingOrGarbageSidecarInvalidatesEntry) {
  DiskCache cache(root_);
  std::string error;
  auto path = cache.publish("a", ".so", writes("payload"), error);
  ASSERT_TRUE(path.has_value()) << error;
  fs::remove(*path + ".sum");
  EXPECT_FALSE(cache.lookup("a", ".so").has_value());
  EXPECT_FALSE(fs::exists(*path));

  path = cache.publish("b", ".so", writes("payload"), error);
  ASSERT_TRUE(path.has_value()) << error;
  write_all(*path + ".sum", "zz");
  EXPECT_FALSE(cache.lookup("b", ".so").has_value());
  EXPECT_FALSE(fs::exists(*path));
}

TEST_F(DiskCacheTest, LoneSidecarIsAMissNotAnError) {
  DiskCache cache(root_);
  write_all(root_ + "/k.so.sum", "0000000000000000\n");
  EXPECT_FALSE(cache.lookup("k", ".so").has_value());
}

TEST_F(DiskCacheTest, FailingBuildPublishesNothing) {
  DiskCache cache(root_ + "/fail");
  std::string error;
  auto path = cache.publish(
      "k", ".so",
      [](const std::string& tmp, std::string& err) {
        write_all(tmp, "half-written");
        err = "compiler said no";
        return false;
      },
      error);
  EXPECT_FALSE(path.has_value());
  EXPECT_EQ(error, "compiler said no");
  EXPECT_FALSE(cache.lookup("k", ".so").has_value());
  EXPECT_TRUE(entries_of(cache.dir()).empty());
}

TEST_F(DiskCacheTest, ThrowingBuildLeavesNoTemporary) {
  DiskCache cache(root_);
  std::string error;
  EXPECT_THROW(cache.publish(
                   "k", ".so",
                   [](const std::string&, std::string&) -> bool { throw std::runtime_error("x"); },
                   error),
               std::runtime_error);
  EXPECT_TRUE(entries_of(cache.dir()).empty());
}

TEST_F(DiskCacheTest, RepublishReplacesEntry) {
  DiskCache cache(root_);
  std::string error;
  ASSERT_TRUE(cache.publish("k", ".bin", writes("first"), error).has_value());
  auto path = cache.publish("k", ".bin", writes("second, longer"), error);
  ASSERT_TRUE(path.has_value()) << error;
  auto hit = cache.lookup("k", ".bin");
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(read_all(*hit), "second, longer");
}

TEST_F(DiskCacheTest, ConcurrentPublishersOfOneKey) {
  DiskCache cache(root_);
  const std::string bytes(200000, 'z');
  std::atomic<int> published{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        std::string error;
        if (cache.publish("shared", ".so", writes(bytes), error)) ++published;
        // A reader racing the publishers must only ever see a valid entry or a miss.
        if (auto hit = cache.lookup("shared", ".so")) {
          EXPECT_EQ(read_all(*hit).size(), bytes.size());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(published.load(), 160);
  auto hit = cache.lookup("shared", ".so");
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(read_all(*hit), bytes);
  EXPECT_EQ(entries_of(cache.dir()).size(), 2u);
}

namespace {

// A pid that no process has any more: a child that exited and was reaped.
long dead_pid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

// This process's host tag, as it names its temporaries.
std::string own_tag(DiskCache& cache) {
  std::string seen, error;
  cache.publish("probe", ".so", [&](const std::string& tmp, std::string&) { seen = tmp; return true; }, error);
  std::string name = fs::path(seen).filename();
  EXPECT_TRUE(kiln::compile::is_temporary_of(name, getpid())) << name;
  size_t at = name.find(".tmp-") + 5;
  return name.substr(at, 8);
}

void age(const std::string& path, int days) {
  struct timespec t[2];
  t[0].tv_sec = t[1].tv_sec = time(nullptr) - days * 24 * 3600;
  t[0].tv_nsec = t[1].tv_nsec = 0;
  utimensat(AT_FDCWD, path.c_str(), t, 0);
}

}  // namespace

TEST_F(DiskCacheTest, StaleTemporariesOfDeadProcessesAreSwept) {
  DiskCache cache(root_);
  const std::string tag = own_tag(cache);
  const std::string d = root_ + "/";
  const long dead = dead_pid();
  const std::string other_tag = tag == "00000000" ? "11111111" : "00000000";
  auto tmp = [&](const std::string& t, long pid, const char* ext) {
    return "k.tmp-" + t + "-" + std::to_string(pid) + "-Ab12Cd" + ext;
  };
  // Gone: the writer is dead; of another host or the older naming, and older than a day.
  const std::vector<std::string> stale = {tmp(tag, dead, ".so"), "k.cpp.tmp-" + tag + "-" + std::to_string(dead) + "-x1y2z3",
                                          tmp(other_tag, 12345, ".so"), "k.tmp-Zz9Yy8.so"};
  // Kept: this process's own, another host's or the older naming while recent, entries.
  const std::vector<std::string> kept = {tmp(tag, getpid(), ".so"), tmp(other_tag, dead, ".cubin"), "k.tmp-Qq1Ww2.so",
                                         "k.so", "k.so.sum", "k.cpp"};
  for (const auto& n : stale) write_all(d + n, "x");
  for (const auto& n : kept) write_all(d + n, "x");
  age(d + stale[2], 2);
  age(d + stale[3], 2);
  age(d + "k.so", 30);
  EXPECT_EQ(kiln::compile::sweep_stale_temporaries(root_), 4);
  for (const auto& n : stale) EXPECT_FALSE(fs::exists(d + n)) << n;
  for (const auto& n : kept) EXPECT_TRUE(fs::exists(d + n)) << n;
}

TEST_F(DiskCacheTest, LiveProcessTemporaryIsKept) {
  DiskCache cache(root_);
  const std::string tag = own_tag(cache);
  pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  const std::string name = root_ + "/k.tmp-" + tag + "-" + std::to_string(child) + "-Ab12Cd.so";
  write_all(name, "x");
  EXPECT_EQ(kiln::compile::sweep_stale_temporaries(root_), 0);
  EXPECT_TRUE(fs::exists(name));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_EQ(kiln::compile::sweep_stale_temporaries(root_), 1);
  EXPECT_FALSE(fs::exists(name));
}

TEST_F(DiskCacheTest, OpeningACacheSweepsItOnce) {
  const std::string dir = root_ + "/fresh";
  fs::create_directories(dir);
  DiskCache probe(root_);
  const std::string name = dir + "/k.tmp-" + own_tag(probe) + "-" + std::to_string(dead_pid()) + "-Ab12Cd.so";
  write_all(name, "x");
  DiskCache cache(dir);
  EXPECT_FALSE(fs::exists(name));
}
