// archive_crc.cpp — CRC-32 verification of every entry of an in-memory zip archive (see archive_crc.h).
// Format: PKWARE APPNOTE (end-of-central-directory record, zip64 locator and record, central directory
// headers with the zip64 extra field 0x0001, local headers).
#include "ration/train/archive_crc.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace ration::train {
namespace {

constexpr uint32_t kEndOfCentralDir = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfCentralDir = 0x06064b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr size_t kEndRecordSize = 22;
constexpr size_t kMaxCommentSize = 0xFFFF;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kStored = 0;
constexpr uint16_t kDeflated = 8;

struct Reader {
  const unsigned char* data;
  size_t size;
  bool has(size_t at, size_t n) const { return at <= size && n <= size - at; }
  uint64_t le(size_t at, int bytes) const {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | data[at + static_cast<size_t>(i)];
    return v;
  }
};

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

uint32_t crc_of(const unsigned char* p, uint64_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<uint64_t>(n, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

// CRC-32 of the inflated bytes of a raw-deflate stream, or false if it does not inflate to `expected` bytes.
bool inflated_crc(const unsigned char* p, uint64_t n, uint64_t expected, uint32_t& crc_out) {
  z_stream zs{};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) return false;
  std::vector<unsigned char> out(1 << 16);
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t total = 0;
  zs.next_in = const_cast<unsigned char*>(p);
  zs.avail_in = static_cast<uInt>(n);
  int rc = Z_OK;
  while (rc == Z_OK) {
    zs.next_out = out.data();
    zs.avail_out = static_cast<uInt>(out.size());
    rc = inflate(&zs, Z_NO_FLUSH);
    const size_t got = out.size() - zs.avail_out;
    crc = crc32(crc, out.data(), static_cast<uInt>(got));
    total += got;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) break;
  }
  inflateEnd(&zs);
  crc_out = static_cast<uint32_t>(crc);
  return rc == Z_STREAM_END && total == expected;
}

}  // namespace

std::string zip_integrity_problem(const char* bytes, size_t size) {
  const Reader r{reinterpret_cast<const unsigned char*>(bytes), size};
  if (size < kEndRecordSize) return "too short to be a zip archive (" + std::to_string(size) + " bytes)";
  // The end record is the last 22 bytes plus a comment of at most 64 KiB: search backwards for it.
  size_t end = std::string::npos;
  const size_t lowest = size > kEndRecordSize + kMaxCommentSize ? size - kEndRecordSize - kMaxCommentSize : 0;
  for (size_t at = size - kEndRecordSize + 1; at-- > lowest;) {
    if (r.le(at, 4) == kEndOfCentralDir) {
      end = at;
      break;
    }
  }
  if (end == std::string::npos) return "no zip end-of-central-directory record (truncated or not a zip archive)";
  uint64_t entries = r.le(end + 10, 2);
  uint64_t dir_offset = r.le(end + 16, 4);
  if ((entries == 0xFFFF || dir_offset == 0xFFFFFFFFu) && end >= 20 && r.le(end - 20, 4) == kZip64Locator) {
    const uint64_t rec = r.le(end - 20 + 8, 8);
    if (!r.has(rec, 56) || r.le(rec, 4) != kZip64EndOfCentralDir) return "bad zip64 end-of-central-directory record";
    entries = r.le(rec + 32, 8);
    dir_offset = r.le(rec + 48, 8);
  }
  size_t at = dir_offset;
  for (uint64_t i = 0; i < entries; ++i) {
    if (!r.has(at, 46) || r.le(at, 4) != kCentralHeader) return "zip central directory entry " + std::to_string(i) + " is damaged";
    const auto method = static_cast<uint16_t>(r.le(at + 10, 2));
    const auto crc = static_cast<uint32_t>(r.le(at + 16, 4));
    uint64_t packed = r.le(at + 20, 4);
    uint64_t unpacked = r.le(at + 24, 4);
    const size_t name_len = r.le(at + 28, 2), extra_len = r.le(at + 30, 2), comment_len = r.le(at + 32, 2);
    uint64_t local = r.le(at + 42, 4);
    if (!r.has(at + 46, name_len + extra_len + comment_len)) return "zip central directory entry " + std::to_string(i) + " is cut short";
    const std::string name(reinterpret_cast<const char*>(r.data) + at + 46, name_len);
    // zip64: the sizes and offset that read 0xFFFFFFFF are in extra field 0x0001, in this order.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const auto id = static_cast<uint16_t>(r.le(x, 2));
      const size_t len = r.le(x + 2, 2);
      size_t field = x + 4;
      if (id == kZip64ExtraId) {
        if (unpacked == 0xFFFFFFFFu && field + 8 <= x + 4 + len) unpacked = r.le(field, 8), field += 8;
        if (packed == 0xFFFFFFFFu && field + 8 <= x + 4 + len) packed = r.le(field, 8), field += 8;
        if (local == 0xFFFFFFFFu && field + 8 <= x + 4 + len) local = r.le(field, 8), field += 8;
      }
      x += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (!r.has(local, 30) || r.le(local, 4) != kLocalHeader) return "entry '" + name + "': local header is damaged";
    const uint64_t data_at = local + 30 + r.le(local + 26, 2) + r.le(local + 28, 2);
    if (!r.has(data_at, packed)) return "entry '" + name + "' is cut short (truncated file)";
    uint32_t computed = 0;
    if (method == kStored) {
      if (packed != unpacked) return "entry '" + name + "': stored sizes disagree";
      computed = crc_of(r.data + data_at, packed);
    } else if (method == kDeflated) {
      if (!inflated_crc(r.data + data_at, packed, unpacked, computed)) return "entry '" + name + "' does not inflate";
    } else {
      return "entry '" + name + "' uses zip method " + std::to_string(method) + " (only stored and deflated are read)";
    }
    if (computed != crc) {
      return "entry '" + name + "' fails its CRC-32 check (recorded " + hex32(crc) + ", computed " + hex32(computed) + ")";
    }
  }
  return "";
}

}  // namespace ration::train
