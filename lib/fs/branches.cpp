// The branch table (format.md#fs-info): every filesystem tree of an image is
// a branch, its FsInfo item holds the branch's fields. Creating trees,
// reading and rewriting those fields, cloning, dropping and resetting
// branches, and the index of branch names that keeps finding a branch by
// name O(1) with thousands of snapshots.
#include <sys/random.h>

#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

#include "fs/fs.h"
#include "fs/fs_internal.h"
#include "fs/quota.h"

namespace plyfs {

using namespace fsitems;

namespace {

std::array<uint8_t, 16> random_uuid() {
  std::array<uint8_t, 16> u{};
  // getrandom(2) with no flags only fails before the kernel's pool is
  // seeded or on a signal; the clock keeps uuids distinct regardless.
  if (getrandom(u.data(), u.size(), 0) != 16) {
    timespec n = now();
    std::memcpy(u.data(), &n, std::min(sizeof n, u.size()));
  }
  u[6] = static_cast<uint8_t>((u[6] & 0x0f) | 0x40);  // RFC 4122 version 4
  u[8] = static_cast<uint8_t>((u[8] & 0x3f) | 0x80);
  return u;
}

bool is_nil(const std::array<uint8_t, 16>& u) {
  for (uint8_t b : u)
    if (b) return false;
  return true;
}

std::string name_in(const disk::FsInfo& fi) {
  return std::string(reinterpret_cast<const char*>(fi.name),
                     strnlen(reinterpret_cast<const char*>(fi.name), sizeof fi.name));
}

BranchMeta meta_of(TreeId tree, const disk::FsInfo& fi, const TreeInfo& ti) {
  BranchMeta m;
  m.tree = tree;
  m.name = name_in(fi);
  m.parent = TreeId{fi.parent.get()};
  m.read_only = fi.branch_flags.get() & disk::kBranchReadOnly;
  m.doomed = fi.branch_flags.get() & disk::kBranchDoomed;
  m.snapshot = fi.branch_flags.get() & disk::kBranchSnapshot;
  m.held = fi.branch_flags.get() & disk::kBranchHeld;
  m.root = fi.root_ino.get();
  m.created_ns = fi.created_ns.get();
  m.created = ti.created;
  m.origin = ti.cloned_from;
  std::memcpy(m.uuid.data(), fi.uuid, 16);
  std::memcpy(m.received_uuid.data(), fi.received_uuid, 16);
  m.quota_referenced = fi.quota_referenced.get();
  m.quota_exclusive = fi.quota_exclusive.get();
  m.compress = branch_compression(fi);
  return m;
}

// What find, children and snapshots need of every branch, per volume
// (Volume::extension), so that they need not read every tree's info item:
// with 10,000 snapshots that is 10,000 lookups per name a new snapshot
// tries, per layer a delete looks for. Memory only, and never trusted
// blindly (format.md#fs-info, "Finding a branch by name"):
//  - every write of an info item through this layer updates it (note);
//  - a tree created, cloned, dropped or reset (Volume::tree_epoch) that
//    this layer did not account for makes it stale: the next use builds it
//    again from the info items;
//  - what it names is read from the tree's info item before it is used.
struct BranchTable {
  struct Entry {
    std::string name;
    uint64_t parent = 0, origin = 0;
    bool doomed = false;
  };
  std::mutex mu;
  uint64_t epoch = 0;  // the Volume::tree_epoch() it reflects; 0: not built
  std::unordered_map<uint64_t, Entry> trees;
  std::unordered_map<std::string, uint64_t> tree_of;  // live branches' names
  std::unordered_map<uint64_t, std::set<uint64_t>> children, clones;  // by parent, by origin

  void forget(uint64_t tree) {
    auto it = trees.find(tree);
    if (it == trees.end()) return;
    auto n = tree_of.find(it->second.name);
    if (n != tree_of.end() && n->second == tree) tree_of.erase(n);
    if (auto c = children.find(it->second.parent); c != children.end()) c->second.erase(tree);
    if (auto c = clones.find(it->second.origin); c != clones.end()) c->second.erase(tree);
    trees.erase(it);
  }
  void set(uint64_t tree, Entry e) {
    forget(tree);
    if (!e.doomed && !e.name.empty()) tree_of[e.name] = tree;
    if (e.parent) children[e.parent].insert(tree);
    if (e.origin) clones[e.origin].insert(tree);
    trees[tree] = std::move(e);
  }
  // Current for t's volume: built again if it missed a change.
  Result<void> fresh(Volume::Txn& t, bool force) {
    if (!force && epoch == t.volume().tree_epoch()) return ok();
    // Read before the scan: a change during it leaves the table stale,
    // never wrongly current.
    const uint64_t e = t.volume().tree_epoch();
    epoch = 0;
    trees.clear();
    tree_of.clear();
    children.clear();
    clones.clear();
    for (const auto& b : PLY_TRY(Filesystem::branches(t)))
      set(b.tree.v, Entry{b.name, b.parent.v, b.origin.v, b.doomed});
    epoch = e;
    return ok();
  }
};

// After this Txn's own create, clone, drop or reset of a tree (and the
// note of its info item): the table is current again if it was just
// before that change.
void adopt(Volume::Txn& t) {
  auto& n = t.volume().extension<BranchTable>();
  std::lock_guard lk(n.mu);
  if (n.epoch && n.epoch + 1 == t.tree_change()) n.epoch = t.tree_change();
}

// The branches the table lists under `key` in `which` (children or
// clones), each read afresh; the table is built again once if one of them
// no longer says what it listed.
Result<std::vector<BranchMeta>> related(Volume::Txn& t, uint64_t key, bool by_origin) {
  auto& n = t.volume().extension<BranchTable>();
  std::lock_guard lk(n.mu);
  for (int attempt = 0;; attempt++) {
    PLY_CHECK(n.fresh(t, attempt > 0));
    std::vector<BranchMeta> out;
    bool stale = false;
    auto& m = by_origin ? n.clones : n.children;
    if (auto it = m.find(key); it != m.end())
      for (uint64_t id : it->second) {
        auto b = Filesystem::branch(t, TreeId{id});
        if (!b) {
          if (b.error().code != ENOENT) return b.error();
          stale = true;
          continue;
        }
        if ((by_origin ? b->origin.v : b->parent.v) != key) stale = true;
        else out.push_back(*b);
      }
    if (!stale || attempt) return out;
  }
}

}  // namespace

namespace fsitems {

Result<disk::FsInfo> read_info(Volume::Txn& t, TreeId tree) {
  auto info = PLY_TRY(t.tree_info(tree));
  if (info.kind != disk::kKindFs)
    return Error::invalid("tree " + std::to_string(tree.v) + " is not a filesystem tree");
  auto val = PLY_TRY(t.get(tree, ikey(0, ItemType::FsInfo)));
  disk::FsInfo fi;
  if (!val || !decode_info(*val, fi))
    return Error::corrupt(Error::kNoBlock, "filesystem tree without a valid info item");
  if (fi.magic.get() != disk::kFsMagic)
    return Error::corrupt(Error::kNoBlock, "filesystem info item has a bad magic number");
  if (fi.version.get() < disk::kFsVersionMin || fi.version.get() > disk::kFsVersion)
    return Error::io(EOPNOTSUPP, "filesystem tree version " + std::to_string(fi.version.get()) +
                                     " is not supported");
  return fi;
}

Result<void> write_info(Volume::Txn& t, TreeId tree, disk::FsInfo fi) {
  fi.version.set(disk::kFsVersion);
  std::memset(fi.reserved2, 0, sizeof fi.reserved2);
  // An older build would neither apply nor keep a compression default.
  if (fi.compress) t.add_incompat(kIncompatCompress);
  PLY_CHECK(t.put(tree, ikey(0, ItemType::FsInfo), bytes_of(&fi, sizeof fi)));
  // The superblock that makes this durable tells older readers to stay
  // away (format.md#features).
  t.add_incompat(kIncompatBranchInfoV4);
  // An older build would delete a held branch, and drop HELD when it
  // rewrote the item: from the first hold on it may only read the image.
  if (fi.branch_flags.get() & disk::kBranchHeld) t.add_ro_compat(kRoCompatHeldBranches);
  // Likewise a quota: an older build would neither enforce nor keep it.
  if (fi.quota_referenced.get() || fi.quota_exclusive.get()) t.add_ro_compat(kRoCompatBranchQuotas);
  note_info(t, tree, fi);
  note_quota(t, tree, fi.quota_referenced.get(), fi.quota_exclusive.get());
  return ok();
}

void note_info(Volume::Txn& t, TreeId tree, const disk::FsInfo& fi) {
  auto& n = t.volume().extension<BranchTable>();
  auto ti = t.tree_info(tree);
  std::lock_guard lk(n.mu);
  if (!n.epoch) return;
  if (!ti) {
    n.epoch = 0;  // cannot tell: build it again at the next use
    return;
  }
  n.set(tree.v, BranchTable::Entry{name_in(fi), fi.parent.get(), ti->cloned_from.v,
                                   (fi.branch_flags.get() & disk::kBranchDoomed) != 0});
}

}  // namespace fsitems

Result<TreeId> Filesystem::create(Volume::Txn& t, const FsCreateOptions& o) {
  if (o.name.empty() || o.name.size() > sizeof disk::FsInfo::name)
    return Error::invalid("a branch name has 1 to 32 bytes");
  TreeId id = PLY_TRY(t.create_tree(disk::kKindFs));
  uint64_t root = t.take_inode_number();
  disk::FsInfo info{};
  info.magic.set(disk::kFsMagic);
  info.root_ino.set(root);
  timespec n = now();
  info.created_ns.set(uint64_t(n.tv_sec) * 1000000000ull + uint64_t(n.tv_nsec));
  std::memcpy(info.name, o.name.data(), o.name.size());
  info.parent.set(o.parent.v);
  info.branch_flags.set((o.read_only ? disk::kBranchReadOnly : 0) |
                        (o.doomed ? disk::kBranchDoomed : 0));
  const auto u = random_uuid();
  std::memcpy(info.uuid, u.data(), u.size());
  PLY_CHECK(write_info(t, id, info));
  adopt(t);
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
  vo.movers = fs_movers();
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

Result<BranchMeta> Filesystem::branch(Volume& v, TreeId tree) {
  auto t = PLY_TRY(v.begin());
  return branch(t, tree);
}

Result<BranchMeta> Filesystem::branch(Volume::Txn& t, TreeId tree) {
  auto fi = PLY_TRY(read_info(t, tree));
  return meta_of(tree, fi, PLY_TRY(t.tree_info(tree)));
}

Result<std::vector<BranchMeta>> Filesystem::branches(Volume& v) {
  auto t = PLY_TRY(v.begin());
  return branches(t);
}

Result<std::vector<BranchMeta>> Filesystem::branches(Volume::Txn& t) {
  std::vector<BranchMeta> out;
  for (const auto& ti : PLY_TRY(t.list_trees()))
    if (ti.kind == disk::kKindFs) out.push_back(meta_of(ti.id, PLY_TRY(read_info(t, ti.id)), ti));
  return out;
}

Result<std::optional<BranchMeta>> Filesystem::find(Volume& v, std::string_view name) {
  auto t = PLY_TRY(v.begin());
  return find(t, name);
}

Result<std::optional<BranchMeta>> Filesystem::find(Volume::Txn& t, std::string_view name) {
  auto& n = t.volume().extension<BranchTable>();
  std::lock_guard lk(n.mu);
  for (int attempt = 0; attempt < 2; attempt++) {
    PLY_CHECK(n.fresh(t, attempt > 0));
    auto it = n.tree_of.find(std::string(name));
    if (it == n.tree_of.end()) return std::optional<BranchMeta>{};
    auto b = branch(t, TreeId{it->second});
    if (b && !b->doomed && b->name == name) return std::optional<BranchMeta>(*b);
    if (!b && b.error().code != ENOENT) return b.error();
  }
  return std::optional<BranchMeta>{};
}

Result<std::vector<BranchMeta>> Filesystem::children(Volume::Txn& t, TreeId parent) {
  return related(t, parent.v, false);
}

Result<std::vector<BranchMeta>> Filesystem::clones_of(Volume::Txn& t, TreeId origin) {
  return related(t, origin.v, true);
}

Result<size_t> Filesystem::live_branches(Volume::Txn& t) {
  auto& n = t.volume().extension<BranchTable>();
  std::lock_guard lk(n.mu);
  PLY_CHECK(n.fresh(t, false));
  return n.tree_of.size();
}

Result<void> Filesystem::set_branch(Volume& v, const BranchMeta& m) {
  auto t = PLY_TRY(v.begin({.reserve_blocks = 2 * kOpBlocks}));
  return set_branch(t, m);
}

// The fields of m in an info item; its uuid stays unless it has none.
static void fill(disk::FsInfo& fi, const BranchMeta& m) {
  std::memset(fi.name, 0, sizeof fi.name);
  std::memcpy(fi.name, m.name.data(), m.name.size());
  fi.parent.set(m.parent.v);
  fi.branch_flags.set((m.read_only ? disk::kBranchReadOnly : 0) | (m.doomed ? disk::kBranchDoomed : 0) |
                      (m.snapshot ? disk::kBranchSnapshot : 0) | (m.held ? disk::kBranchHeld : 0));
  std::array<uint8_t, 16> u;
  std::memcpy(u.data(), fi.uuid, 16);
  if (is_nil(u)) {
    u = is_nil(m.uuid) ? random_uuid() : m.uuid;
    std::memcpy(fi.uuid, u.data(), 16);
  }
  std::memcpy(fi.received_uuid, m.received_uuid.data(), 16);
  fi.quota_referenced.set(m.quota_referenced);
  fi.quota_exclusive.set(m.quota_exclusive);
  fi.compress = uint8_t(m.compress.mode);
  fi.compress_level = uint8_t(m.compress.on() ? m.compress.level : 0);
}

Result<void> Filesystem::set_branch(Volume::Txn& t, const BranchMeta& m) {
  if (m.name.empty() || m.name.size() > 32) return Error::invalid("a branch name has 1 to 32 bytes");
  auto fi = PLY_TRY(read_info(t, m.tree));
  fill(fi, m);
  return write_info(t, m.tree, fi);
}

Result<BranchMeta> Filesystem::clone(Volume::Txn& t, TreeId src, BranchMeta m) {
  if (m.name.empty() || m.name.size() > 32) return Error::invalid("a branch name has 1 to 32 bytes");
  m.tree = PLY_TRY(t.clone_tree(src));
  // The clone's info item is its source's until rewritten: it gets its own
  // fields and a new identity.
  auto fi = PLY_TRY(read_info(t, m.tree));
  std::memset(fi.uuid, 0, sizeof fi.uuid);
  m.uuid = random_uuid();
  fill(fi, m);
  // Its own creation time, not its source's: the retention of automatic
  // snapshots sorts and classes them by it (snap/retention.h).
  const timespec n = now();
  fi.created_ns.set(uint64_t(n.tv_sec) * 1000000000ull + uint64_t(n.tv_nsec));
  PLY_CHECK(write_info(t, m.tree, fi));
  adopt(t);
  return branch(t, m.tree);
}

Result<void> Filesystem::drop(Volume::Txn& t, TreeId tree, const BTree::DropProgress& progress) {
  PLY_CHECK(t.drop_tree(tree, progress));
  {
    auto& n = t.volume().extension<BranchTable>();
    std::lock_guard lk(n.mu);
    n.forget(tree.v);
  }
  adopt(t);
  return ok();
}

Result<void> Filesystem::reset(Volume::Txn& t, TreeId dst, TreeId src, const BTree::DropProgress& progress) {
  // dst's fields (and identity) survive; its content becomes src's.
  auto keep = PLY_TRY(read_info(t, dst));
  PLY_CHECK(t.reset_tree(dst, src, progress));
  auto now_info = PLY_TRY(read_info(t, dst));
  keep.root_ino = now_info.root_ino;  // the same in one lineage; src's is the truth
  PLY_CHECK(write_info(t, dst, keep));
  adopt(t);
  return ok();
}

}  // namespace plyfs
