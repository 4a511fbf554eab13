// Byte ranges in flight, for the devices' write-back queues (FileDevice F3,
// NbdDevice N4): offset -> length of each, never overlapping one another.
#pragma once

#include <cstdint>
#include <map>

namespace plyfs {

// Whether [offset, offset + len) meets a range of `disjoint`. Disjoint, so
// only the last range that begins before the end can reach into it.
inline bool overlaps_any(const std::map<uint64_t, uint64_t>& disjoint, uint64_t offset, uint64_t len) {
  auto it = disjoint.lower_bound(offset + len);
  if (it == disjoint.begin()) return false;
  --it;
  return it->first + it->second > offset;
}

}  // namespace plyfs
