// What the parts of the union layer share (union.h; semantics in
// format.md#fs-union). Internal to lib/union: union.cpp (nodes and
// resolution), union_readdir.cpp, union_copyup.cpp, union_names.cpp,
// union_data.cpp and union_stack.cpp include it; nothing outside does.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fs/disk_fs.h"
#include "union/union.h"

namespace plyfs::union_internal {

constexpr uint8_t kWh = disk::kDtWhiteout;
constexpr int kMaxDepth = 4096;

inline bool missing(const Error& e) { return e.code == ENOENT || e.code == ENOTDIR; }

// A merged directory's link count: its parts' counts do not add up to the
// subdirectories the union shows, and counting them means listing every
// part. 1 says "not counted" (as overlayfs, btrfs and find(1)'s -noleaf
// understand it), so no tool takes a wrong count for the true one.
inline void merged_nlink(Attr& a, size_t parts) {
  if (parts > 1 && S_ISDIR(a.mode)) a.nlink = 1;
}

struct Merged {
  std::string name;
  uint64_t ino;
  uint8_t type;
  // Every branch's entry for the name, left to right: (branch, inode, type).
  std::vector<std::tuple<int, uint64_t, uint8_t>> occ;
};

// One round of a merged listing (union_readdir.cpp): the listings and
// materialize read the branches' entries through it.
Result<void> gather(const std::vector<UnionBranch>& br,
                    const std::vector<std::pair<int, uint64_t>>& inst, uint64_t from_hash,
                    std::map<std::pair<uint64_t, std::string>, Merged>& first,
                    uint64_t& bound);

}  // namespace plyfs::union_internal
