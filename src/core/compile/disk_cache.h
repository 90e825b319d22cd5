// The on-disk cache of compiled artifacts (shared libraries, CUDA images).
//
// Entries are addressed by a content key (hash of source + compiler + flags). Writes are
// atomic: an artifact is written under a temporary name in the same directory and renamed
// into place, with a checksum sidecar `<key><ext>.sum` renamed in just before it. A reader
// verifies the checksum before trusting an entry, so a half-written or corrupted entry is
// rebuilt, never loaded. Several processes may share one cache directory.
//
// Temporary files are named `<name>.tmp-<host>-<pid>-XXXXXX[<ext>]`: `host` identifies this
// boot and pid namespace, `pid` the process writing it. A process killed mid-compile (SIGKILL,
// a crash, a power cut) leaves its temporaries behind; the first DiskCache of a directory in
// each process removes those whose writer is gone (same host tag, pid no longer running), and
// any temporary older than a day (another machine's or container's, or of the older naming),
// never one a live process may still rename.
#pragma once
#include <functional>
#include <optional>
#include <string>

namespace kiln::compile {

// $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; created if missing.
// The environment is re-read on each call; the reference stays valid until this thread's
// next call.
const std::string& cache_dir();

class DiskCache {
 public:
  // Sweeps stale temporaries out of `dir` (once per directory and process).
  explicit DiskCache(std::string dir);

  // Path of a verified artifact for `key` with extension `ext` (e.g. ".so", ".cubin"), or
  // nullopt if there is none or it fails its checksum (a bad entry is deleted).
  std::optional<std::string> lookup(const std::string& key, const std::string& ext) const;

  // Runs `build(tmp_path)` to produce the artifact at a temporary path, then publishes it
  // atomically and returns its final path. `build` returns false and fills `error` on failure;
  // nothing is published then.
  std::optional<std::string> publish(const std::string& key, const std::string& ext,
                                     const std::function<bool(const std::string& tmp_path,
                                                              std::string& error)>& build,
                                     std::string& error) const;

  // Where a source file for `key` may be written for inspection (not part of the entry).
  std::string source_path(const std::string& key, const std::string& ext) const;

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// A tuning decision (one line of text) kept in cache_dir() under `name`: what the autotuners
// read instead of timing again. nullopt when there is none.
std::optional<std::string> read_decision(const std::string& name);
void write_decision(const std::string& name, const std::string& value);

// Writes `bytes` to dir/name atomically (a temporary beside it, renamed into place).
bool write_file_atomic(const std::string& dir, const std::string& name, const std::string& bytes,
                       std::string& error);

// Removes the stale temporaries of `dir` (see above) now; returns how many. `max_age_seconds`:
// the age past which any temporary counts as stale.
int sweep_stale_temporaries(const std::string& dir, double max_age_seconds = 24 * 3600.0);

// Whether `filename` is a temporary of the given process on this host (for tests and tools).
bool is_temporary_of(const std::string& filename, long pid);

}  // namespace kiln::compile
