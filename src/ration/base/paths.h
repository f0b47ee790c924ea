// paths.h — a path the user gave, checked before the filesystem sees it: a file or folder name longer
// than the system allows would otherwise surface as a raw "filesystem error: ... File name too long".
// Owns: check_path_length. Does not own: whether the path exists or can be written (its callers).
#pragma once
#include <string>

namespace ration {

// Throws ration::Error naming `what` (the flag or key, e.g. "--report" or "run.toml: train.checkpoint_dir"),
// the path, and the offending component when a component is longer than 255 bytes (NAME_MAX) or the
// whole path longer than 4095 bytes (PATH_MAX).
void check_path_length(const std::string& path, const std::string& what);

}  // namespace ration
