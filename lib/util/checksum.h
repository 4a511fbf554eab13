// XXH3-64, the one checksum of the format (format.md#encoding).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace plyfs {

uint64_t xxh3(std::span<const std::byte> data);
uint64_t xxh3(const void* data, size_t len);

}  // namespace plyfs
