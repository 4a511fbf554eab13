// What the union layer asks of a branch (format.md#fs-union): entries and
// whiteouts as they are, copy-up (copy_in, replace_from), compare for diff,
// and the way back from an inode to its names (path, names_of).
#include "fs/fs.h"

#include <algorithm>
#include <set>

#include "fs/fs_internal.h"
#include "fs/quota.h"

namespace plyfs {

// --- union support (format.md#fs-union) ---------------------------------------

Result<std::optional<Entry>> Filesystem::entry(uint64_t dir, std::string_view name) {
  PLY_CHECK(check_name(name));
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  (void)PLY_TRY(c.dir(dir));
  auto e = PLY_TRY(c.find(dir, name));
  if (!e) return std::optional<Entry>{};
  return std::optional<Entry>(Entry{e->ino, e->type});
}

Result<void> Filesystem::whiteout(uint64_t dir, std::string_view name) {
  PLY_CHECK(check_name(name));
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 4 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::unique_lock lk(mu_);
  Rec d = PLY_TRY(c.dir(dir));
  if (d.a.nlink == 0) return Error::io(ENOENT, "directory was removed");
  auto e = PLY_TRY(c.find(dir, name));
  if (e) return e->type == kDtWhiteout ? ok() : Result<void>(Error::io(EEXIST, "a whiteout cannot replace a file"));
  PLY_CHECK(c.add_entry(dir, name, 0, kDtWhiteout));
  d.a.mtime = d.a.ctime = now();
  return c.put_inode(d);
}

Result<Attr> Filesystem::copy_in(Filesystem& src, uint64_t ino, uint64_t dir,
                                 std::string_view name) {
  PLY_CHECK(check_name(name));
  if (&src == this || &src.vol_ != &vol_) return Error::invalid("copy_in from the same tree or another volume");
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  // A copy-up takes the file's blocks by reference: this tree reaches
  // them from now on (format.md#quotas).
  const auto sa = src.getattr(ino);
  const QuotaCharge quota = PLY_TRY(charge_quota(vol_, tree_, (sa ? sa->blocks * 512 : 0) + bs_, true));
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 16 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  // Two tree locks: taken in tree-id order, so two copies in opposite
  // directions cannot deadlock.
  std::shared_lock<std::shared_mutex> ls(src.mu_, std::defer_lock);
  std::unique_lock<std::shared_mutex> lu(mu_, std::defer_lock);
  if (src.tree_.v < tree_.v) ls.lock(), lu.lock();
  else lu.lock(), ls.lock();
  Rec d = PLY_TRY(c.dir(dir));
  if (d.a.nlink == 0) return Error::io(ENOENT, "directory was removed");
  if (PLY_TRY(c.find_live(dir, name))) return Error::io(EEXIST, "name exists in the copy's branch");
  auto sv = PLY_TRY(c.t.get(src.tree_, ikey(ino, ItemType::Inode)));
  if (!sv) return Error::io(ENOENT, "no inode " + std::to_string(ino) + " to copy");
  Rec r = PLY_TRY(decode_inode(ino, *sv));
  const bool is_dir = S_ISDIR(r.a.mode);
  if (auto mine = PLY_TRY(c.t.get(tree_, ikey(ino, ItemType::Inode)))) {
    // Copied up before under another name: one more link to it.
    Rec m = PLY_TRY(decode_inode(ino, *mine));
    if (S_ISDIR(m.a.mode) || m.a.nlink == 0) return Error::io(EEXIST, "object already in this branch");
    if (m.a.nlink >= kMaxLinks) return Error::io(EMLINK, "too many links");
    (void)PLY_TRY(c.add_over_whiteout(dir, name, ino, dt_of(m.a.mode)));
    m.a.nlink++;
    PLY_CHECK(c.put_inode(m));
    d.a.size++;  // a copy-up changes nothing the user sees: times stay
    PLY_CHECK(c.put_inode(d));
    return m.a;
  }
  // Every item of the object except a directory's entries: xattrs, inline
  // data and extents, whose space extents gain a reference. A file's items
  // are grafted: the leaves holding only them are shared, not copied, so a
  // large file costs its leaves at the two ends (format.md#btree-graft).
  if (is_dir) PLY_CHECK(c.take_items(PLY_TRY(c.object_items(src.tree_, ino))));
  else (void)PLY_TRY(c.t.graft(tree_, src.tree_, Key{ino, 0}, Key{ino, ~0ull}));
  if (is_dir) {
    r.a.nlink = 2;
    r.a.size = 0;
    r.parent = dir;
    r.a.opaque = false;
  } else {
    r.a.nlink = 1;
    r.parent = dir;
  }
  PLY_CHECK(c.put_inode(r));
  (void)PLY_TRY(c.add_over_whiteout(dir, name, ino, dt_of(r.a.mode)));
  d.a.size++;
  if (is_dir) d.a.nlink++;
  PLY_CHECK(c.put_inode(d));
  return r.a;
}

Result<Filesystem::Changes> Filesystem::compare(Volume& v, TreeId from, TreeId to,
                                                 const BTree::DiffProgress& progress) {
  Changes out;
  auto t = PLY_TRY(v.begin());
  std::set<uint64_t> touched;  // objects with a differing item other than entries
  std::optional<Error> err;
  PLY_CHECK(t.diff(from, to, [&](Key k, std::optional<std::span<const std::byte>> a,
                                 std::optional<std::span<const std::byte>> b) {
    if (k.hi == 0) return true;  // FsInfo, orphans: not objects
    if (type_of(k) == ItemType::Inode && a && b) {
      // A rename or link changes only ctime and the parent hint: not a
      // change of the object (zfs diff reports the rename alone).
      auto ra = decode_inode(k.hi, *a), rb = decode_inode(k.hi, *b);
      if (ra && rb) {
        Rec x = *ra, y = *rb;
        y.a.ctime = x.a.ctime;
        y.parent = x.parent;
        if (encode_inode(x) == encode_inode(y)) return true;
      }
    }
    if (type_of(k) != ItemType::Dirent) {
      touched.insert(k.hi);
      return true;
    }
    std::vector<DirentRec> ea, eb;
    if (a) {
      auto r = decode_dirents(k, *a);
      if (!r) return err = r.error(), false;
      ea = std::move(*r);
    }
    if (b) {
      auto r = decode_dirents(k, *b);
      if (!r) return err = r.error(), false;
      eb = std::move(*r);
    }
    auto same = [](const DirentRec& x, const DirentRec& y) {
      return x.name == y.name && x.ino == y.ino && x.type == y.type;
    };
    for (const auto& x : ea)
      if (std::none_of(eb.begin(), eb.end(), [&](auto& y) { return same(x, y); }))
        out.removed.push_back({k.hi, x.name, x.ino, x.type});
    for (const auto& y : eb)
      if (std::none_of(ea.begin(), ea.end(), [&](auto& x) { return same(x, y); }))
        out.added.push_back({k.hi, y.name, y.ino, y.type});
    return true;
  }, &out.nodes_read, progress));
  if (err) return *err;
  for (uint64_t ino : touched)
    if (PLY_TRY(t.get(from, ikey(ino, ItemType::Inode))) && PLY_TRY(t.get(to, ikey(ino, ItemType::Inode))))
      out.modified.push_back(ino);
  return out;
}

Result<std::optional<std::string>> Filesystem::path(uint64_t ino) {
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  std::string out;
  for (int depth = 0; ino != root_; depth++) {
    if (depth > 4096) return Error::corrupt(Error::kNoBlock, "directory parent chain loops");
    auto r = c.inode(ino);
    if (!r) return r.error().code == ENOENT ? std::optional<std::string>{} : Result<std::optional<std::string>>(r.error());
    const uint64_t dir = r->parent;
    if (!dir || dir == ino) return std::optional<std::string>{};
    std::optional<std::string> name;
    std::optional<Error> err;
    PLY_CHECK(c.t.scan(tree_, ikey(dir, ItemType::Dirent, 0), ikey(dir, ItemType::Dirent, kOffMask),
                       [&](Key k, std::span<const std::byte> v) {
                         auto es = decode_dirents(k, v);
                         if (!es) return err = es.error(), false;
                         for (auto& e : *es)
                           if (e.ino == ino && e.type != kDtWhiteout) return name = e.name, false;
                         return true;
                       }));
    if (err) return *err;
    if (!name) return std::optional<std::string>{};
    out = "/" + *name + out;
    ino = dir;
  }
  return std::optional<std::string>(out.empty() ? "/" : out);
}

Result<std::vector<std::pair<uint64_t, std::string>>> Filesystem::names_of(uint64_t ino, size_t limit) {
  auto t = PLY_TRY(vol_.begin());
  std::shared_lock lk(mu_);
  std::vector<std::pair<uint64_t, std::string>> out;
  std::optional<Error> err;
  PLY_CHECK(t.scan(tree_, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
    if (type_of(k) != ItemType::Dirent) return true;
    auto es = decode_dirents(k, v);
    if (!es) return err = es.error(), false;
    for (auto& e : *es)
      if (e.ino == ino && e.type != kDtWhiteout) out.emplace_back(k.hi, std::move(e.name));
    return out.size() < limit;
  }));
  if (err) return *err;
  return out;
}

Result<Attr> Filesystem::replace_from(Filesystem& src, uint64_t ino) {
  if (&src == this || &src.vol_ != &vol_) return Error::invalid("replace_from the same tree or another volume");
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 16 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::shared_lock<std::shared_mutex> ls(src.mu_, std::defer_lock);
  std::unique_lock<std::shared_mutex> lu(mu_, std::defer_lock);
  if (src.tree_.v < tree_.v) ls.lock(), lu.lock();
  else lu.lock(), ls.lock();
  Rec mine = PLY_TRY(c.inode(ino));
  auto sv = PLY_TRY(c.t.get(src.tree_, ikey(ino, ItemType::Inode)));
  if (!sv) return Error::io(ENOENT, "no inode " + std::to_string(ino) + " to copy");
  Rec r = PLY_TRY(decode_inode(ino, *sv));
  if ((r.a.mode & S_IFMT) != (mine.a.mode & S_IFMT))
    return Error::corrupt(Error::kNoBlock, "inode " + std::to_string(ino) + " has two types");
  // Everything but the inode and a directory's entries goes, then comes
  // over from src; extents move their references (copy_in's rule).
  const bool is_dir = S_ISDIR(r.a.mode);
  const auto drop = PLY_TRY(c.object_items(tree_, ino));
  const auto take = is_dir ? PLY_TRY(c.object_items(src.tree_, ino)) : decltype(drop){};
  for (const auto& [k, v] : drop) {
    (void)PLY_TRY(c.t.erase(tree_, k));
    if (type_of(k) == ItemType::Extent) {
      Ext e = PLY_TRY(decode_extent(k, v));
      if (e.disk_start) PLY_CHECK(c.t.dec_extent(BlockNo{e.disk_start}));
    }
  }
  if (is_dir) {
    PLY_CHECK(c.take_items(take));
  } else {
    // A file's inode goes too, so that the graft finds its range empty;
    // put_inode below writes the merged one.
    (void)PLY_TRY(c.t.erase(tree_, ikey(ino, ItemType::Inode)));
    (void)PLY_TRY(c.t.graft(tree_, src.tree_, Key{ino, 0}, Key{ino, ~0ull}));
  }
  r.a.nlink = mine.a.nlink;
  r.parent = mine.parent;
  if (S_ISDIR(r.a.mode)) {
    r.a.size = mine.a.size;
    r.a.opaque = mine.a.opaque;
  }
  PLY_CHECK(c.put_inode(r));
  return r.a;
}

}  // namespace plyfs
