#include "core/compile/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <vector>

#include "core/support/hash.h"

namespace fs = std::filesystem;

namespace kiln::compile {

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// FNV-1a streamed in chunks: artifacts can be tens of MB and need not sit in memory.
// Chaining works because the FNV state is the hash itself.
std::optional<uint64_t> hash_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  uint64_t h = hash_str("");
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = hash_bytes(buf.data(), static_cast<size_t>(in.gcount()), h);
  }
  if (in.bad()) return std::nullopt;
  return h;
}

std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return std::nullopt;
  return s;
}

std::string sidecar_of(const std::string& artifact) { return artifact + ".sum"; }

// Which pids this process can vouch for: the boot (pids restart after a reboot) and the pid
// namespace (containers on one host each count their own). 8 hex digits.
const std::string& host_tag() {
  static const std::string tag = [] {
    std::string id;
    if (auto boot = read_small_file("/proc/sys/kernel/random/boot_id")) id += *boot;
    char ns[128];
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (n > 0) id.append(ns, static_cast<size_t>(n));
    char host[256] = {};
    if (id.empty() && gethostname(host, sizeof host - 1) == 0) id = host;  // no /proc
    return hex64(hash_str(id)).substr(0, 8);
  }();
  return tag;
}

// "<tag>-<pid>-": what follows ".tmp-" in this process's temporaries. The pid is read each
// time: a forked child writes under its own.
std::string temp_owner() { return host_tag() + "-" + std::to_string(static_cast<long>(getpid())) + "-"; }

// A unique, still-empty file next to `final_path`, so that the later rename stays within one
// filesystem (and is therefore atomic). The extension is kept at the end because some tools
// (compilers, linkers) decide what to produce from the output file's suffix.
std::optional<std::string> make_temp_beside(const std::string& dir, const std::string& stem,
                                            const std::string& ext, std::string& error) {
  std::string templ = dir + "/" + stem + ".tmp-" + temp_owner() + "XXXXXX" + ext;
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  int fd = mkstemps(buf.data(), static_cast<int>(ext.size()));
  if (fd < 0) {
    error = "kiln: cannot create a temporary file in " + dir + ": " + std::strerror(errno);
    return std::nullopt;
  }
  // mkstemp's 0600 would make a shared cache directory unusable for other users.
  fchmod(fd, 0644);
  close(fd);
  return std::string(buf.data());
}

// The writer named in a temporary's file name: host tag and pid, if it has the current form.
bool parse_owner(const std::string& filename, std::string& tag, long& pid) {
  size_t at = filename.rfind(".tmp-");
  if (at == std::string::npos) return false;
  size_t p = at + 5;
  if (filename.size() < p + 8 + 1) return false;
  tag = filename.substr(p, 8);
  for (char c : tag)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  p += 8;
  if (filename[p] != '-') return false;
  size_t q = ++p;
  while (q < filename.size() && std::isdigit(static_cast<unsigned char>(filename[q]))) ++q;
  if (q == p || q - p > 10 || q >= filename.size() || filename[q] != '-') return false;
  pid = std::stol(filename.substr(p, q - p));
  return pid > 0;
}

// Removes the temporary file unless it has been renamed into place.
struct TempGuard {
  std::string path;
  bool armed = true;
  ~TempGuard() {
    if (armed && !path.empty()) unlink(path.c_str());
  }
};

bool rename_into_place(const std::string& from, const std::string& to, std::string& error) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    error = "kiln: cannot rename " + from + " to " + to + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

void remove_entry(const std::string& artifact) {
  unlink(artifact.c_str());
  unlink(sidecar_of(artifact).c_str());
}

}  // namespace

bool write_file_atomic(const std::string& dir, const std::string& name, const std::string& bytes,
                       std::string& error) {
  auto tmp = make_temp_beside(dir, name, "", error);
  if (!tmp) return false;
  TempGuard guard{*tmp};
  {
    std::ofstream out(*tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      error = "kiln: cannot write " + *tmp;
      return false;
    }
  }
  if (!rename_into_place(*tmp, dir + "/" + name, error)) return false;
  guard.armed = false;
  return true;
}

bool is_temporary_of(const std::string& filename, long pid) {
  std::string tag;
  long owner = 0;
  return parse_owner(filename, tag, owner) && tag == host_tag() && owner == pid;
}

int sweep_stale_temporaries(const std::string& dir, double max_age_seconds) {
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  int removed = 0;
  const std::time_t now = std::time(nullptr);
  while (dirent* ent = readdir(d)) {
    const std::string name = ent->d_name;
    if (name.find(".tmp-") == std::string::npos) continue;
    const std::string path = dir + "/" + name;
    std::string tag;
    long pid = 0;
    bool stale;
    if (parse_owner(name, tag, pid) && tag == host_tag()) {
      // Its writer is a process of this boot and pid namespace: stale once that process is gone.
      // (EPERM: it runs, as another user.) A reused pid only keeps the file a while longer.
      stale = pid != static_cast<long>(getpid()) && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    } else {
      // Another machine's or container's (whose pids mean nothing here), or the older naming:
      // by age. No compile takes a day.
      struct stat st;
      stale = lstat(path.c_str(), &st) == 0 && std::difftime(now, st.st_mtime) > max_age_seconds;
    }
    if (stale && unlink(path.c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

const std::string& cache_dir() {
  // Re-read on every call (a few getenv calls and a stat) so that tests and long-running
  // processes can redirect the cache. thread_local keeps the returned reference stable
  // against other threads; only a later call on the same thread refreshes it.
  thread_local std::string dir;
  std::string d = env_or_empty("KILN_CACHE_DIR");
  if (d.empty()) {
    std::string xdg = env_or_empty("XDG_CACHE_HOME");
    if (!xdg.empty()) {
      d = xdg + "/kiln";
    } else {
      std::string home = env_or_empty("HOME");
      d = (home.empty() ? std::string("/tmp") : home) + "/.cache/kiln";
    }
  }
  std::error_code ec;
  fs::create_directories(d, ec);  // a failure surfaces later, when publishing into it
  dir = std::move(d);
  return dir;
}

DiskCache::DiskCache(std::string dir) : dir_(std::move(dir)) {
  static std::mutex mu;
  static std::set<std::string> swept;
  std::lock_guard<std::mutex> lock(mu);
  if (swept.insert(dir_).second) sweep_stale_temporaries(dir_);
}

std::string DiskCache::source_path(const std::string& key, const std::string& ext) const {
  return dir_ + "/" + key + ext;
}

std::optional<std::string> DiskCache::lookup(const std::string& key,
                                             const std::string& ext) const {
  const std::string artifact = dir_ + "/" + key + ext;
  // No artifact: a miss. A lone sidecar is left alone: it may belong to a publish in flight.
  if (access(artifact.c_str(), F_OK) != 0) return std::nullopt;

  auto sum = read_small_file(sidecar_of(artifact));
  auto actual = hash_file(artifact);
  if (!actual) return std::nullopt;  // vanished or unreadable right now; don't destroy it
  if (!sum || sum->size() < 16 || sum->compare(0, 16, hex64(*actual)) != 0) {
    remove_entry(artifact);
    return std::nullopt;
  }
  return artifact;
}

std::optional<std::string> DiskCache::publish(
    const std::string& key, const std::string& ext,
    const std::function<bool(const std::string& tmp_path, std::string& error)>& build,
    std::string& error) const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    error = "kiln: cannot create cache directory " + dir_ + ": " + ec.message();
    return std::nullopt;
  }

  auto tmp = make_temp_beside(dir_, key, ext, error);
  if (!tmp) return std::nullopt;
  TempGuard guard{*tmp};

  if (!build(*tmp, error)) {
    if (error.empty()) error = "kiln: building " + key + ext + " failed";
    return std::nullopt;
  }
  // Hash the bytes we are about to rename, not whatever sits at the final path later.
  auto h = hash_file(*tmp);
  if (!h) {
    error = "kiln: cannot read back the built artifact " + *tmp;
    return std::nullopt;
  }

  // The sidecar goes in first. Readers treat "artifact without a matching sidecar" as corrupt
  // and delete it; with the artifact first, a reader arriving between the two renames would
  // delete a brand-new, valid entry (possibly right before our caller opens it). With the
  // sidecar first, that reader sees only a sidecar and reports a plain miss. Either way an
  // entry is used only once both halves agree.
  const std::string name = key + ext;
  if (!write_file_atomic(dir_, name + ".sum", hex64(*h) + "\n", error)) return std::nullopt;
  const std::string final_path = dir_ + "/" + name;
  if (!rename_into_place(*tmp, final_path, error)) return std::nullopt;
  guard.armed = false;
  return final_path;
}

std::optional<std::string> read_decision(const std::string& name) {
  std::ifstream f(cache_dir() + "/" + name);
  std::string line;
  if (!f || !std::getline(f, line) || line.empty()) return std::nullopt;
  return line;
}

void write_decision(const std::string& name, const std::string& value) {
  const std::string dir = cache_dir();  // a copy: cache_dir()'s reference is per thread and call
  std::string error;
  write_file_atomic(dir, name, value + "\n", error);  // a decision not kept is timed again: no error to raise
}

}  // namespace kiln::compile
