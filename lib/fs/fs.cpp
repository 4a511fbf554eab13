// The filesystem-object layer (fs.h; items in format.md#fs-tree): creating
// and opening a filesystem tree, its branch fields (format.md#fs-info), sync
// and statfs. The operations live in fs_*.cpp, a file per concern (orphans,
// names, union support, attributes, file data); fs_internal.h holds what
// they share.
#include "fs/fs.h"

#include <cstdio>
#include <cstring>

#include "fs/fs_internal.h"

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

// --- creation and opening -------------------------------------------------

Result<TreeId> Filesystem::create(Volume& v, const FsCreateOptions& o) {
  auto t = PLY_TRY(v.begin({.reserve_blocks = 8 * kOpBlocks}));
  return create(t, o);
}

Result<TreeId> Filesystem::create(Volume::Txn& t, const FsCreateOptions& o) {
  TreeId id = PLY_TRY(t.create_tree(disk::kKindFs));
  uint64_t root = t.take_inode_number();
  disk::FsInfo info{};
  info.magic.set(disk::kFsMagic);
  info.version.set(disk::kFsVersion);
  info.root_ino.set(root);
  timespec n = now();
  info.created_ns.set(uint64_t(n.tv_sec) * 1000000000ull + uint64_t(n.tv_nsec));
  if (o.name.empty() || o.name.size() > sizeof info.name)
    return Error::invalid("a branch name has 1 to 32 bytes");
  std::memcpy(info.name, o.name.data(), o.name.size());
  info.parent.set(o.parent.v);
  info.branch_flags.set((o.read_only ? disk::kBranchReadOnly : 0) |
                        (o.doomed ? disk::kBranchDoomed : 0));
  PLY_CHECK(t.put(id, ikey(0, ItemType::FsInfo), bytes_of(&info, sizeof info)));
  Rec r;
  r.a.ino = root;
  r.a.mode = S_IFDIR | (o.root_mode & 07777);
  r.a.uid = o.uid;
  r.a.gid = o.gid;
  r.a.nlink = 2;
  r.a.generation = t.gen().v;
  r.a.atime = r.a.mtime = r.a.ctime = r.a.btime = n;
  r.parent = root;
  PLY_CHECK(t.put(id, ikey(root, ItemType::Inode), encode_inode(r)));
  return id;
}

Result<SuperInfo> format_filesystem(BlockDevice& dev, const FormatOptions& f,
                                    const FsCreateOptions& o) {
  (void)PLY_TRY(Volume::format(dev, f));
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.cache_bytes = 8 << 20;
  auto v = PLY_TRY(Volume::open(dev, vo));
  (void)PLY_TRY(Filesystem::create(*v, o));
  PLY_CHECK(v->close());
  return v->super();
}

Result<TreeId> Filesystem::default_tree(Volume& v) {
  auto t = PLY_TRY(v.begin());
  for (const auto& b : PLY_TRY(branches(t)))
    if (!b.doomed) return b.tree;  // by id; a doomed tree is no branch
  return Error::io(ENOENT, "the image holds no filesystem tree");
}

namespace {
Result<disk::FsInfo> read_info(Volume::Txn& t, TreeId tree) {
  auto info = PLY_TRY(t.tree_info(tree));
  if (info.kind != disk::kKindFs)
    return Error::invalid("tree " + std::to_string(tree.v) + " is not a filesystem tree");
  auto val = PLY_TRY(t.get(tree, ikey(0, ItemType::FsInfo)));
  if (!val || val->size() != sizeof(disk::FsInfo))
    return Error::corrupt(Error::kNoBlock, "filesystem tree without a valid info item");
  disk::FsInfo fi;
  std::memcpy(&fi, val->data(), sizeof fi);
  if (fi.magic.get() != disk::kFsMagic)
    return Error::corrupt(Error::kNoBlock, "filesystem info item has a bad magic number");
  if (fi.version.get() < disk::kFsVersionMin || fi.version.get() > disk::kFsVersion)
    return Error::io(EOPNOTSUPP, "filesystem tree version " + std::to_string(fi.version.get()) +
                                     " is not supported");
  return fi;
}

BranchMeta meta_of(TreeId tree, const disk::FsInfo& fi, Generation created) {
  BranchMeta m;
  m.tree = tree;
  m.name.assign(reinterpret_cast<const char*>(fi.name), strnlen(reinterpret_cast<const char*>(fi.name), sizeof fi.name));
  m.parent = TreeId{fi.parent.get()};
  m.read_only = fi.branch_flags.get() & disk::kBranchReadOnly;
  m.doomed = fi.branch_flags.get() & disk::kBranchDoomed;
  m.root = fi.root_ino.get();
  m.created_ns = fi.created_ns.get();
  m.created = created;
  return m;
}
}  // namespace

Result<BranchMeta> Filesystem::branch(Volume& v, TreeId tree) {
  auto t = PLY_TRY(v.begin());
  return branch(t, tree);
}

Result<BranchMeta> Filesystem::branch(Volume::Txn& t, TreeId tree) {
  auto fi = PLY_TRY(read_info(t, tree));
  return meta_of(tree, fi, PLY_TRY(t.tree_info(tree)).created);
}

Result<std::vector<BranchMeta>> Filesystem::branches(Volume& v) {
  auto t = PLY_TRY(v.begin());
  return branches(t);
}

Result<std::vector<BranchMeta>> Filesystem::branches(Volume::Txn& t) {
  std::vector<BranchMeta> out;
  for (const auto& ti : PLY_TRY(t.list_trees()))
    if (ti.kind == disk::kKindFs) out.push_back(meta_of(ti.id, PLY_TRY(read_info(t, ti.id)), ti.created));
  return out;
}

Result<void> Filesystem::set_branch(Volume& v, const BranchMeta& m) {
  auto t = PLY_TRY(v.begin({.reserve_blocks = 2 * kOpBlocks}));
  return set_branch(t, m);
}

Result<void> Filesystem::set_branch(Volume::Txn& t, const BranchMeta& m) {
  if (m.name.empty() || m.name.size() > 32) return Error::invalid("a branch name has 1 to 32 bytes");
  auto fi = PLY_TRY(read_info(t, m.tree));
  std::memset(fi.name, 0, sizeof fi.name);
  std::memcpy(fi.name, m.name.data(), m.name.size());
  fi.parent.set(m.parent.v);
  fi.branch_flags.set((m.read_only ? disk::kBranchReadOnly : 0) | (m.doomed ? disk::kBranchDoomed : 0));
  fi.version.set(disk::kFsVersion);
  return t.put(m.tree, ikey(0, ItemType::FsInfo), bytes_of(&fi, sizeof fi));
}

Filesystem::Filesystem(Volume& v, TreeId tree, uint64_t root)
    : vol_(v), tree_(tree), root_(root), bs_(v.block_size()) {}

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

bool Filesystem::read_only() const { return failed_ || vol_.read_only(); }

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
  f.files = f.blocks;
  f.ffree = f.bavail;
  return f;
}

}  // namespace plyfs
