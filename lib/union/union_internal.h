// What the parts of the union layer share (union.h; semantics in
// format.md#fs-union). Internal to lib/union: union.cpp (nodes and
// resolution), union_readdir.cpp, union_copyup.cpp, union_names.cpp,
// union_data.cpp and union_stack.cpp include it; nothing outside does.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string_view>
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

// Entries a listing reads ahead per branch (union_readdir.cpp): one hash
// group (at most 128 names) always fits a batch.
constexpr size_t kStreamBatch = 128;

// One branch's entries of a merged directory, read ahead in batches of
// whole hash groups; the names lie back to back in one string.
struct BranchStream {
  struct Ent {
    uint64_t hash, ino;
    uint32_t off, len;  // of the name in `names`
    uint8_t type;
  };
  int b = 0;             // branch index
  uint64_t dino = 0;     // the directory's inode there
  std::vector<Ent> ents;
  std::string names;
  size_t pos = 0;          // the head: the first entry not merged yet
  uint64_t next_hash = 0;  // where the next batch starts
  bool end = false;        // nothing after this batch
  std::string_view name(const Ent& e) const { return {names.data() + e.off, e.len}; }
};

// An entry of the hash group being merged: parts[part].ents[ent].
struct GroupRef {
  uint32_t part, ent;
};

// A merged listing in progress (union_readdir.cpp, invariants L1-L3): the
// branches' streams and the cookie it continues from.
struct Listing {
  Listing(uint64_t dir_ino, uint64_t parent_ino, const std::vector<std::pair<int, uint64_t>>& inst,
          uint64_t cookie, uint64_t mu_count);
  uint64_t dir, parent;
  uint64_t next;     // the cookie the next reply starts from
  uint64_t changes;  // Union::mu_'s count of exclusive holds when read
  bool done = false;  // every stream at its end
  std::vector<BranchStream> parts;  // left to right
  std::vector<GroupRef> group;      // reused by each group
  Merged m;                         // the name handed out, reused
};

using ListFn = std::function<Result<bool>(const DirEntry&, const Merged*)>;
using HiddenFn = std::function<Result<bool>(const Merged&)>;
Result<void> run_listing(Listing& l, const std::vector<UnionBranch>& br, const HiddenFn& hidden,
                         const ListFn& fn);

}  // namespace plyfs::union_internal
