#include "core/support/log.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>

namespace kiln {

bool log_enabled(const std::string& channel) {
  const char* v = std::getenv("KILN_LOGS");
  if (!v || !*v) return false;
  std::string s = std::string(",") + v + ",";
  return s.find("," + channel + ",") != std::string::npos || s.find(",all,") != std::string::npos;
}

void log(const std::string& channel, const std::string& message) {
  if (!log_enabled(channel)) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[kiln:%s] %s\n", channel.c_str(), message.c_str());
}

std::string debug_dir() {
  const char* v = std::getenv("KILN_DEBUG");
  return v ? v : "";
}

void debug_dump(const std::string& name, const std::string& text) {
  std::string dir = debug_dir();
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ofstream(dir + "/" + name) << text;
}

}  // namespace kiln
