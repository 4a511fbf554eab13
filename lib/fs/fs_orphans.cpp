// Orphans, pins and ghosts (pins.h, format.md#fs-orphan): the references
// from above that keep an inode whose last name went, and its freeing once
// nothing holds it.
#include "fs/fs.h"

#include "fs/fs_internal.h"

namespace plyfs {

// --- orphans ----------------------------------------------------------------

Result<void> Filesystem::for_each_orphan(const std::function<void(uint64_t)>& fn) {
  auto t = PLY_TRY(vol_.begin());
  return t.scan(tree_, ikey(0, ItemType::Orphan, 0), ikey(0, ItemType::Orphan, kOffMask),
                [&](Key k, std::span<const std::byte>) {
                  fn(off_of(k));
                  return true;
                });
}

Result<void> Filesystem::free_orphans() {
  std::vector<uint64_t> inos;
  PLY_CHECK(for_each_orphan([&](uint64_t ino) { inos.push_back(ino); }));
  for (uint64_t ino : inos) PLY_CHECK(free_inode(ino));
  return ok();
}

size_t Filesystem::orphan_count() {
  size_t n = 0;
  (void)for_each_orphan([&](uint64_t) { n++; });
  return n;
}

// Frees an unlinked inode's items in batches; the orphan item goes last, so
// a crash halfway leaves it to be finished at the next mount.
Result<void> Filesystem::free_inode(uint64_t ino) {
  for (;;) {
    auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 4 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    std::vector<std::pair<Key, std::optional<uint64_t>>> items;
    // A batch ends after kPunchBatch items or, for large values (xattr
    // chunks), after as many bytes as the reservation can shadow leaves of.
    uint64_t bytes = 0;
    bool more = false;
    PLY_CHECK(c.t.scan(tree_, Key{ino, 0}, Key{ino, ~0ull}, [&](Key k, std::span<const std::byte> v) {
      std::optional<uint64_t> ext;
      if (type_of(k) == ItemType::Extent && v.size() >= sizeof(disk::Extent))
        ext = view_as<disk::Extent>(v)->disk_start.get();
      items.push_back({k, ext});
      bytes += v.size();
      more = items.size() >= kPunchBatch || bytes >= 16ull * bs_;
      return !more;
    }));
    for (auto& [k, ext] : items) {
      (void)PLY_TRY(c.t.erase(tree_, k));
      if (ext && *ext) PLY_CHECK(c.t.dec_extent(BlockNo{*ext}));
    }
    if (!more) {
      (void)PLY_TRY(c.t.erase(tree_, ikey(0, ItemType::Orphan, ino)));
      lk.unlock();
      placing_gone(ino);
      return ok();
    }
  }
}

void Filesystem::pin(uint64_t ino, uint64_t n) { pins_.pin(ino, n); }

Result<void> Filesystem::unpin(uint64_t ino, uint64_t n) {
  if (!pins_.pinned(ino) || !pins_.unpin(ino, n)) return ok();
  return release(ino);
}

bool Filesystem::pinned(uint64_t ino) {
  if (pins_.pinned(ino)) return true;
  std::lock_guard lk(pin_mu_);
  for (const auto& t : shared_pins_)
    if (t->pinned(ino)) return true;
  return false;
}

// This filesystem's own pins are strong (a library user that pins an inode
// keeps it readable); a shared table's only by its holds (pins.h).
bool Filesystem::held(uint64_t ino) {
  if (pins_.pinned(ino)) return true;
  std::lock_guard lk(pin_mu_);
  for (const auto& t : shared_pins_)
    if (t->held(ino)) return true;
  return false;
}

Result<void> Filesystem::hold(uint64_t ino, PinTable& t) {
  if (retired_) return Error::io(ESTALE, "the branch's content was replaced");
  auto tx = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(tx)};
  // Shared: remove_name decides under the exclusive lock whether anything
  // holds the inode, so a hold is either seen there or sees the result.
  std::shared_lock lk(mu_);
  auto r = c.inode(ino);
  if (!r) return r.error().code == ENOENT ? Error::io(ESTALE, "the file was deleted") : r.error();
  // An orphan nothing holds is being freed; it can only be held again by a
  // holder's second open.
  if (r->a.nlink == 0 && !S_ISDIR(r->a.mode) && !held(ino))
    return Error::io(ESTALE, "the file was deleted");
  t.hold(ino);
  return ok();
}

void Filesystem::add_ghost(const Attr& a) {
  std::lock_guard lk(ghost_mu_);
  ghosts_[a.ino] = a;
}

std::optional<Attr> Filesystem::ghost(uint64_t ino) {
  std::lock_guard lk(ghost_mu_);
  auto it = ghosts_.find(ino);
  if (it == ghosts_.end()) return std::nullopt;
  return it->second;
}

bool Filesystem::drop_ghost(uint64_t ino) {
  std::lock_guard lk(ghost_mu_);
  return ghosts_.erase(ino) != 0;
}

void Filesystem::drop_unpinned_ghosts() {
  std::vector<uint64_t> inos;
  {
    std::lock_guard lk(ghost_mu_);
    for (const auto& [ino, a] : ghosts_) inos.push_back(ino);
  }
  for (uint64_t ino : inos)
    if (!pinned(ino)) drop_ghost(ino);
}

void Filesystem::attach_pins(std::shared_ptr<const PinTable> t) {
  std::lock_guard lk(pin_mu_);
  shared_pins_.push_back(std::move(t));
}

Result<void> Filesystem::detach_pins(const PinTable* t) {
  {
    std::lock_guard lk(pin_mu_);
    std::erase_if(shared_pins_, [&](const auto& p) { return p.get() == t; });
  }
  return t->empty() ? ok() : release_orphans();
}

Result<void> Filesystem::release_orphans() {
  drop_unpinned_ghosts();
  if (read_only()) return ok();
  // The orphans are few (the files unlinked while open), and listed.
  std::vector<uint64_t> inos;
  PLY_CHECK(for_each_orphan([&](uint64_t ino) { inos.push_back(ino); }));
  for (uint64_t ino : inos) PLY_CHECK(release(ino));
  return ok();
}

Result<void> Filesystem::release(uint64_t ino) {
  if (pinned(ino)) return ok();
  if (drop_ghost(ino) || read_only()) return ok();
  auto a = getattr(ino);
  if (!a) return a.error().code == ENOENT ? ok() : Result<void>(a.error());
  if (a->nlink == 0) {
    std::lock_guard il(inode_lock(ino));
    return free_inode(ino);
  }
  return ok();
}

// An inode whose last name just went: freed now unless something above
// still holds it (then at its last unpin, or at the next mount).
Result<void> Filesystem::free_if_unpinned(uint64_t ino) {
  if (retired_) return ok();
  // Not held now, never again (hold refuses an orphan nothing holds): it
  // goes, and lives on as a ghost while the kernel still knows it.
  if (held(ino)) return ok();
  std::lock_guard il(inode_lock(ino));
  std::optional<Attr> a;
  if (pinned(ino))
    if (auto g = getattr(ino)) a = *g;
  PLY_CHECK(free_inode(ino));
  if (a && pinned(ino)) add_ghost(*a);
  return ok();
}

Result<void> Filesystem::release_all() {
  if (retired_) return ok();
  // The orphans pinned here go; one that nothing here pins (another
  // filesystem object of the same tree may) stays for the next mount.
  bool any = !pins_.empty();
  {
    std::lock_guard lk(pin_mu_);
    for (const auto& t : shared_pins_) any = any || !t->empty();
  }
  std::vector<uint64_t> inos;
  if (any && !read_only()) PLY_CHECK(for_each_orphan([&](uint64_t ino) {
    if (pinned(ino)) inos.push_back(ino);
  }));
  pins_.clear();
  {
    std::lock_guard lk(pin_mu_);
    shared_pins_.clear();
  }
  {
    std::lock_guard lk(ghost_mu_);
    ghosts_.clear();
  }
  for (uint64_t ino : inos) PLY_CHECK(release(ino));
  return ok();
}

}  // namespace plyfs
