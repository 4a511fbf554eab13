#include <cstring>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util/checksum.h"
#include "util/result.h"

namespace plyfs {

uint64_t xxh3(const void* data, size_t len) { return XXH3_64bits(data, len); }
uint64_t xxh3(std::span<const std::byte> data) { return XXH3_64bits(data.data(), data.size()); }

std::string Error::message() const {
  std::string s = reason;
  if (block != kNoBlock) s += " (block " + std::to_string(block) + ")";
  if (system) {
    s += ": ";
    s += std::strerror(code);
  }
  return s;
}

std::string Error::user_message(std::string_view image) const {
  std::string s = message();
  if (is_corruption()) {
    s += "; the image is damaged: run fsck.plyfs";
    if (!image.empty()) s += " " + std::string(image);
  }
  return s;
}

}  // namespace plyfs
