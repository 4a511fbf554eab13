// The filesystem-object layer (fs.h; items in format.md#fs-tree): creating
// and opening a filesystem tree, its branch fields (format.md#fs-info), sync
// and statfs. The operations live in fs_*.cpp, a file per concern (orphans,
// names, union support, attributes, file data); fs_internal.h holds what
// they share.
#include "fs/fs.h"

#include <cstdio>
#include <cstring>

#include "fs/fs_internal.h"
#include "fs/quota.h"

namespace plyfs {

ValueRefs fs_value_refs() {
  return [](Key k, std::span<const std::byte> v, std::vector<ExtentRef>& out) {
    if (type_of(k) != ItemType::Extent || k.hi == 0 || v.size() < sizeof(disk::Extent)) return;
    const auto* d = view_as<disk::Extent>(v);
    if (d->disk_start.get() != 0)
      out.push_back(ExtentRef{BlockNo{d->disk_start.get()}, d->disk_nblocks.get()});
  };
}

std::map<uint8_t, ValueRefs> fs_kinds() { return {{disk::kKindFs, fs_value_refs()}}; }

// An Extent item names its space extent by disk_start alone (format.md#fs-extent):
// moving the extent rewrites that field; offset, lengths and the block
// checksums stay, since the bytes move unchanged (format.md#relocation).
std::map<uint8_t, ValueMove> fs_movers() {
  ValueMove mv = [](Key k, std::span<std::byte> v,
                    const std::function<std::optional<BlockNo>(BlockNo)>& moved) {
    if (type_of(k) != ItemType::Extent || k.hi == 0 || v.size() < sizeof(disk::Extent)) return false;
    disk::Extent d;
    std::memcpy(&d, v.data(), sizeof d);
    if (d.disk_start.get() == 0) return false;
    const auto to = moved(BlockNo{d.disk_start.get()});
    if (!to) return false;
    d.disk_start.set(to->v);
    std::memcpy(v.data(), &d, sizeof d);
    return true;
  };
  return {{disk::kKindFs, mv}};
}

// --- creation and opening -------------------------------------------------

Result<TreeId> Filesystem::create(Volume& v, const FsCreateOptions& o) {
  auto t = PLY_TRY(v.begin({.reserve_blocks = 8 * kOpBlocks}));
  return create(t, o);
}

Filesystem::Filesystem(Volume& v, TreeId tree, uint64_t root)
    : vol_(v), tree_(tree), root_(root), bs_(v.block_size()), policy_(&v.extension<PolicyState>()) {}

Result<std::unique_ptr<Filesystem>> Filesystem::open(Volume& v, TreeId tree, bool reader) {
  uint64_t root;
  bool old_version;
  {
    auto t = PLY_TRY(v.begin());
    auto fi = PLY_TRY(read_info(t, tree));
    root = fi.root_ino.get();
    old_version = fi.version.get() < disk::kFsVersion;
  }
  if (old_version && !v.read_only() && !reader) PLY_CHECK(set_branch(v, PLY_TRY(branch(v, tree))));
  std::unique_ptr<Filesystem> fs(new Filesystem(v, tree, root));
  {
    auto t = PLY_TRY(v.begin());
    Ctx c{*fs, std::move(t)};
    (void)PLY_TRY(c.dir(root));
  }
  if (!v.read_only() && !reader) PLY_CHECK(fs->free_orphans());
  return fs;
}

bool Filesystem::read_only() const { return failed_ || retired_ || vol_.read_only(); }

void Filesystem::fail(const Error& e) {
  if (!failed_.exchange(true))
    std::fprintf(stderr, "plyfs: %s; the filesystem is now read-only\n", e.message().c_str());
  vol_.fail(e);
}

Result<void> Filesystem::sync() {
  if (vol_.read_only()) return ok();
  (void)PLY_TRY(vol_.commit());
  return ok();
}

Filesystem::StatFs Filesystem::statfs() {
  SpaceStats s = vol_.space_stats();
  StatFs f{};
  f.bsize = bs_;
  f.namemax = 255;
  f.blocks = s.usable_blocks;
  f.bfree = s.free_blocks + s.pending_free;
  f.bavail = f.bfree > s.reserve_blocks ? f.bfree - s.reserve_blocks : 0;
  // A branch with a quota shows it, as ZFS's refquota does: its size is
  // the referenced limit, its free space what is left under the limits.
  if (auto q = quota_usage(vol_, tree_); q && (q->lim_ref || q->lim_excl)) {
    uint64_t room = ~0ull;
    if (q->lim_ref) {
      f.blocks = std::min(f.blocks, q->lim_ref / bs_);
      room = q->lim_ref > q->ref ? (q->lim_ref - q->ref) / bs_ : 0;
    }
    if (q->lim_excl) room = std::min(room, q->lim_excl > q->excl ? (q->lim_excl - q->excl) / bs_ : 0);
    f.bfree = std::min(f.bfree, room);
    f.bavail = std::min(f.bavail, room);
  }
  f.files = f.blocks;
  f.ffree = f.bavail;
  return f;
}

}  // namespace plyfs
