#include "core/compile/disk_cache.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
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
