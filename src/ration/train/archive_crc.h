// archive_crc.h — integrity check of a zip archive held in memory (the format torch.save and
// torch::pickle_save write: one stored entry per pickle and per tensor storage).
// Owns: walking the zip central directory (zip64 included) and comparing each entry's CRC-32 with its
//       bytes. Does not own: reading files, or what the entries mean (train/checkpoint.cpp).
#pragma once
#include <cstddef>
#include <string>

namespace ration::train {

// "" when every entry's bytes match its recorded CRC-32; otherwise the first problem, e.g.
// "entry 'archive/data/3' fails its CRC-32 check (recorded 1a2b3c4d, computed 0badf00d)" or
// "no zip end-of-central-directory record (truncated?)". Compressed entries are inflated to check them.
std::string zip_integrity_problem(const char* data, size_t size);

}  // namespace ration::train
