// Logging and debug dumps, both chosen by environment variables:
//   KILN_LOGS=graph,guards,recompiles,kernels,fallback,timing   print those channels to stderr
//   KILN_DEBUG=<dir>                                     write every graph, loop IR and kernel
#pragma once
#include <string>

namespace kiln {

bool log_enabled(const std::string& channel);
void log(const std::string& channel, const std::string& message);

// The KILN_DEBUG directory, or "" when dumping is off.
std::string debug_dir();
// Writes `text` to <debug dir>/<name> (no-op when dumping is off).
void debug_dump(const std::string& name, const std::string& text);

}  // namespace kiln
