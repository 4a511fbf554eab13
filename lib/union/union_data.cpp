// Attributes, data and extended attributes through the union (union.h):
// reads go to the visible part, changes to a writable one, copied up first
// (union_copyup.cpp).
#include "union/union.h"

#include <algorithm>
#include <vector>

#include "union/union_internal.h"

namespace plyfs {

using namespace union_internal;

// --- attributes and data --------------------------------------------------------------------

Result<Attr> Union::getattr(uint64_t ino) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  return attr_of(ino);
}

Result<Attr> Union::attr_of(uint64_t ino) {
  size_t parts;
  Part p;
  {
    std::shared_lock lk(nodes_mu_);
    auto it = nodes_.find(ino);
    if (it == nodes_.end() || it->second.inst.empty())
      return Error::io(ESTALE, "inode " + std::to_string(ino) + " is not known to this mount");
    auto [b, i] = it->second.inst.front();
    if (b + shift_ < 0 || size_t(b + shift_) >= br_.size()) return stray(ino);
    p = Part{br_[b + shift_].fs, i};
    parts = it->second.inst.size();
  }
  Attr a = PLY_TRY(p.first->getattr(p.second));
  a.ino = ino;
  merged_nlink(a, parts);
  return a;
}

Result<std::string> Union::readlink(uint64_t ino) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->readlink(i);
}

Result<Attr> Union::setattr(uint64_t ino, const SetAttr& s, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  Attr a = PLY_TRY(fs->setattr(i, s));
  a.ino = ino;
  return a;
}

Result<uint32_t> Union::get_fsflags(uint64_t ino) {
  std::shared_lock landing(io_mu_);
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->get_fsflags(i);
}

Result<void> Union::set_fsflags(uint64_t ino, uint32_t fs_flags, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  return fs->set_fsflags(i, fs_flags);
}

Result<size_t> Union::read(uint64_t ino, uint64_t off, std::span<std::byte> out) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->read(i, off, out);
}

Result<size_t> Union::write(uint64_t ino, uint64_t off, std::span<const std::byte> in,
                            const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  return fs->write(i, off, in);
}

Result<void> Union::fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  return fs->fallocate(i, mode, off, len);
}

Result<uint64_t> Union::lseek(uint64_t ino, uint64_t off, int whence) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->lseek(i, off, whence);
}

Result<std::vector<Filesystem::Placed>> Union::placement(uint64_t ino) {
  std::shared_lock landing(io_mu_);
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->placement(i);
}

Result<uint64_t> Union::copy_range(uint64_t in, uint64_t off_in, uint64_t out, uint64_t off_out,
                                   uint64_t len, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fo, io] = PLY_TRY(writable_instance(out, c));
  auto [fi, ii] = PLY_TRY(part(in));
  if (fi == fo) return fo->copy_range(ii, off_in, io, off_out, len);
  // Another branch: the same volume, but extents are shared only inside one
  // tree's operation, so the bytes are copied.
  std::vector<std::byte> buf(std::min<uint64_t>(len, 1 << 20));
  uint64_t done = 0;
  while (done < len) {
    auto chunk = std::span(buf).first(std::min<uint64_t>(buf.size(), len - done));
    size_t n = PLY_TRY(fi->read(ii, off_in + done, chunk));
    if (n == 0) break;
    size_t w = PLY_TRY(fo->write(io, off_out + done, chunk.first(n)));
    done += w;
    if (w < n) break;
  }
  return done;
}

Result<void> Union::setxattr(uint64_t ino, std::string_view name, std::span<const std::byte> value,
                             int flags, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  return fs->setxattr(i, name, value, flags);
}

Result<std::vector<std::byte>> Union::getxattr(uint64_t ino, std::string_view name) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->getxattr(i, name);
}

Result<std::vector<std::string>> Union::listxattr(uint64_t ino) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->listxattr(i);
}

Result<void> Union::removexattr(uint64_t ino, std::string_view name, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  return fs->removexattr(i, name);
}

Filesystem::StatFs Union::statfs() {
  std::shared_lock lk(mu_);
  return br_[0].fs->statfs();
}

}  // namespace plyfs
