// File data (format.md#fs-inline, #fs-extent): read, write, truncate,
// fallocate, lseek and copy_range, with inline data and extents.
#include "fs/fs.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "fs/compress.h"
#include "fs/fs_internal.h"
#include "fs/quota.h"
#include "util/checksum.h"

namespace plyfs {

// --- file data ------------------------------------------------------------------

namespace {
bool all_zero(std::span<const std::byte> s) {
  return std::all_of(s.begin(), s.end(), [](std::byte b) { return b == std::byte{0}; });
}
}  // namespace

Result<size_t> Filesystem::read(uint64_t ino, uint64_t off, std::span<std::byte> out) {
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::vector<Ext> es;
  uint64_t n, fb, lb;
  {
    std::shared_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    if (S_ISDIR(r.a.mode)) return Error::io(EISDIR, "is a directory");
    if (off >= r.a.size || out.empty()) return size_t{0};
    n = std::min<uint64_t>(out.size(), r.a.size - off);
    if (r.is_inline()) {
      auto d = PLY_TRY(c.inline_data(ino, r.a.size));
      std::memcpy(out.data(), d.data() + off, n);
      return size_t(n);
    }
    fb = off / bs_;
    lb = (off + n - 1) / bs_;
    es = PLY_TRY(c.extents(ino, fb, lb + 1));
  }
  // The device reads run without the tree lock; the Txn keeps the blocks
  // from being reused (a block freed now is free only once this generation
  // is durable, and it cannot commit while the Txn is open).
  //
  // Blocks that land whole in `out` are read straight into it and checked
  // there: a large read costs one device read and one checksum pass per
  // byte, no staging copy (export and FUSE reads of large files). Only a
  // partial first or last block goes through `buf`. Holes and preallocated
  // ranges are zeroed, and nothing else is (the extents come in file order).
  const uint64_t end = off + n;
  std::vector<std::byte> buf;
  uint64_t zeroed_to = off;  // out's bytes before this are written
  auto zero_until = [&](uint64_t to) {
    if (to > zeroed_to) std::memset(out.data() + (zeroed_to - off), 0, to - zeroed_to);
    zeroed_to = std::max(zeroed_to, to);
  };
  auto disk = [&](const Ext& e, uint64_t i) { return BlockNo{e.disk_start + e.offset + (i - e.file_blk)}; };
  auto check = [&](const Ext& e, uint64_t i, std::span<const std::byte> blk) -> Result<void> {
    if (xxh3(blk) == e.csums[i - e.file_blk]) return ok();
    Error err = Error::io(EIO, "data checksum mismatch in inode " + std::to_string(ino) + " file block " +
                                   std::to_string(i),
                          disk(e, i).v);
    fail(err);
    return err;
  };
  // Whole blocks of consecutive extents that lie in a row on the device as
  // in the file are read with one device request, then checked extent by
  // extent: a 1 MiB read of a file written in order spans four extents of at
  // most kMaxExtentBlocks, most often adjacent, so one request (one round
  // trip on NBD) instead of four.
  struct Piece {
    const Ext* e;
    uint64_t a, b;  // its file blocks [a, b), whole in out
  };
  std::vector<Piece> run;
  uint64_t run_disk = 0, run_blocks = 0, run_first = 0;  // run_first: the run's first file block
  auto read_run = [&]() -> Result<void> {
    if (run.empty()) return ok();
    const std::span<std::byte> whole = out.subspan(run_first * bs_ - off, run_blocks * bs_);
    PLY_CHECK(vol_.read_data(BlockNo{run_disk}, whole));
    for (const Piece& p : run)
      for (uint64_t i = p.a; i < p.b; i++) PLY_CHECK(check(*p.e, i, whole.subspan((i - run_first) * bs_, bs_)));
    run.clear();
    run_blocks = 0;
    return ok();
  };
  for (const Ext& e : es) {
    if (e.prealloc()) continue;
    const uint64_t a = std::max(fb, e.file_blk), b = std::min(lb + 1, e.end());
    if (a >= b) continue;
    zero_until(std::max(off, a * bs_));
    if (e.compressed()) {  // decoded blocks [e.offset, ...) of the frame
      auto f = PLY_TRY(frame(ino, e));
      const uint64_t lo = std::max(off, a * bs_), hi = std::min(end, b * bs_);
      const uint64_t at = (e.offset + (a - e.file_blk)) * bs_ + (lo - a * bs_);
      std::memcpy(out.data() + (lo - off), f->data() + at, hi - lo);
      zeroed_to = std::max(zeroed_to, hi);
      continue;
    }
    auto staged = [&](uint64_t i) -> Result<void> {
      buf.resize(bs_);
      PLY_CHECK(vol_.read_data(disk(e, i), buf));
      PLY_CHECK(check(e, i, buf));
      // The overlap of block i with [off, end).
      const uint64_t bs0 = i * bs_, lo = std::max(off, bs0), hi = std::min(end, bs0 + bs_);
      std::memcpy(out.data() + (lo - off), buf.data() + (lo - bs0), hi - lo);
      return ok();
    };
    // [whole_a, whole_b): the blocks of [a, b) that lie whole in [off, end).
    const uint64_t whole_a = std::max(a, (off + bs_ - 1) / bs_), whole_b = std::min(b, end / bs_);
    if (whole_a < whole_b) {
      for (uint64_t i = a; i < whole_a; i++) PLY_CHECK(staged(i));
      const bool joins = !run.empty() && run_first + run_blocks == whole_a &&
                         run_disk + run_blocks == disk(e, whole_a).v;
      if (!joins) {
        PLY_CHECK(read_run());
        run_disk = disk(e, whole_a).v;
        run_first = whole_a;
      }
      run.push_back(Piece{&e, whole_a, whole_b});
      run_blocks += whole_b - whole_a;
      for (uint64_t i = whole_b; i < b; i++) PLY_CHECK(staged(i));
    } else {
      for (uint64_t i = a; i < b; i++) PLY_CHECK(staged(i));
    }
    zeroed_to = std::max(zeroed_to, std::min(end, b * bs_));
  }
  PLY_CHECK(read_run());
  zero_until(end);
  return size_t(n);
}

Result<std::shared_ptr<const std::vector<std::byte>>> Filesystem::frame(uint64_t ino, const Ext& e) {
  // The checksums name the stored bytes: a reused block has others, so a
  // cached entry is never stale (format.md#fs-compress, "Cache").
  const uint64_t tag = xxh3(bytes_of(e.csums.data(), 8 * e.csums.size())) ^ (uint64_t(e.frame_bytes) << 8) ^ e.ram_blocks;
  if (auto f = frames_.get(e.disk_start, tag)) return f;
  auto bad = [&](Error err) -> Error {
    fail(err);
    return err;
  };
  const std::string where = "inode " + std::to_string(ino) + " file block " + std::to_string(e.file_blk);
  if (e.csums.size() != e.disk_nblocks || e.frame_bytes > e.disk_nblocks * bs_ ||
      e.frame_bytes <= (e.disk_nblocks - 1) * bs_)
    return bad(Error::io(EIO, "compressed extent of " + where + " has a frame length that does not fit its blocks",
                         e.disk_start));
  std::vector<std::byte> raw(e.disk_nblocks * bs_);
  PLY_CHECK(vol_.read_data(BlockNo{e.disk_start}, raw));
  for (uint64_t i = 0; i < e.disk_nblocks; i++)
    if (xxh3(std::span(raw).subspan(i * bs_, bs_)) != e.csums[i])
      return bad(Error::io(EIO, "data checksum mismatch in the compressed frame of " + where, e.disk_start + i));
  auto out = std::make_shared<std::vector<std::byte>>(uint64_t(e.ram_blocks) * bs_);
  if (auto r = decompress_frame(std::span(raw).first(e.frame_bytes), *out); !r)
    return bad(Error::io(EIO, r.error().message() + " (" + where + ")", e.disk_start));
  frames_.put(e.disk_start, tag, out);
  return std::shared_ptr<const std::vector<std::byte>>(std::move(out));
}

namespace {
// Largest space extent a write allocates at once: 8 MiB at 4 KiB blocks.
// One space extent, one device write and one space item for a large write;
// its Extent items map it 64 blocks at a time (format.md#fs-extent: an item
// may map part of a longer space extent, each holding a reference), as
// btrfs's extents outgrow its items. The cap bounds what a later partial
// overwrite keeps allocated (the extent goes with its last item).
constexpr uint32_t kMaxWriteExtent = 2048;

Result<std::vector<Ext>> put_plain(Volume& vol, Volume::Txn& t, uint64_t fb,
                                   std::span<const std::byte> data, uint32_t bs);

// Allocates blocks for `data` (whole blocks for file blocks from `fb`),
// writes them and returns the extent items to map, each at most
// kMaxExtentBlocks. On error, frees what it allocated.
Result<std::vector<Ext>> put_blocks(Volume& vol, Volume::Txn& t, uint64_t fb,
                                    std::span<const std::byte> data, uint32_t bs,
                                    const std::vector<Filesystem::Frame>* frames = nullptr, bool tail_ok = true) {
  std::vector<Ext> out;
  const uint64_t total = data.size() / bs;
  auto undo = [&](Error e) -> Error {
    for (const Ext& x : out) (void)t.dec_extent(BlockNo{x.disk_start});
    return e;
  };
  // The compressed frames that lie whole in the range, in file order: each
  // its own space extent (format.md#fs-compress); plain runs between them.
  std::vector<const Filesystem::Frame*> zs;
  if (frames)
    for (const auto& f : *frames)
      if (f.z && f.fb >= fb && f.fb + f.nblocks <= fb + total && (tail_ok || !f.tail)) zs.push_back(&f);
  uint64_t pos = 0;
  for (size_t k = 0; k <= zs.size(); k++) {
    const uint64_t stop = k < zs.size() ? zs[k]->fb - fb : total;
    if (stop > pos) {
      auto plain = put_plain(vol, t, fb + pos, data.subspan(pos * bs, (stop - pos) * bs), bs);
      if (!plain) return undo(plain.error());
      for (auto& e : *plain) out.push_back(std::move(e));
    }
    if (k == zs.size()) break;
    const auto& f = *zs[k];
    const uint32_t stored = uint32_t((f.z->size() + bs - 1) / bs);
    auto b = t.alloc_extent(stored);
    if (!b) return undo(b.error());
    std::vector<std::byte> padded(uint64_t(stored) * bs);
    std::memcpy(padded.data(), f.z->data(), f.z->size());
    Ext e;
    e.file_blk = f.fb;
    e.disk_start = b->v;
    e.disk_nblocks = stored;
    e.nblocks = e.ram_blocks = f.nblocks;
    e.compression = disk::kCompressZstd;
    e.frame_bytes = uint32_t(f.z->size());
    for (uint32_t i = 0; i < stored; i++) e.csums.push_back(xxh3(std::span(padded).subspan(uint64_t(i) * bs, bs)));
    out.push_back(std::move(e));
    if (auto w = vol.write_data(*b, padded); !w) return undo(w.error());
    t.add_incompat(kIncompatCompress);  // in the generation that first writes a frame
    pos = stop + f.nblocks;
  }
  return out;
}

Result<std::vector<Ext>> put_plain(Volume& vol, Volume::Txn& t, uint64_t fb,
                                   std::span<const std::byte> data, uint32_t bs) {
  std::vector<Ext> out;
  const uint64_t total = data.size() / bs;
  uint64_t done = 0;
  auto undo = [&](Error e) -> Error {
    for (const Ext& x : out) (void)t.dec_extent(BlockNo{x.disk_start});
    return e;
  };
  uint32_t want = kMaxWriteExtent;
  while (done < total) {
    const uint32_t n = uint32_t(std::min<uint64_t>(want, total - done));
    auto b = t.alloc_extent(n);
    if (!b) {
      if (b.error().code == ENOSPC && n > 1) {  // fragmented: try shorter pieces
        want = std::max<uint32_t>(1, n / 2);
        continue;
      }
      return undo(b.error());
    }
    auto piece = data.subspan(done * bs, uint64_t(n) * bs);
    // Items first, so that undo drops every reference they hold.
    for (uint32_t o = 0; o < n; o += disk::kMaxExtentBlocks) {
      if (o) {  // the allocation holds the first item's reference
        if (auto r = t.inc_extent(*b); !r) return undo(r.error());
      }
      Ext e;
      e.file_blk = fb + done + o;
      e.disk_start = b->v;
      e.disk_nblocks = n;
      e.offset = o;
      e.nblocks = std::min<uint32_t>(disk::kMaxExtentBlocks, n - o);
      e.csums.resize(e.nblocks);
      for (uint32_t i = 0; i < e.nblocks; i++) e.csums[i] = xxh3(piece.subspan(uint64_t(o + i) * bs, bs));
      out.push_back(std::move(e));
    }
    if (auto w = vol.write_data(*b, piece); !w) return undo(w.error());
    done += n;
  }
  return out;
}
}  // namespace

// Moves an inline file's data into a block (format.md#fs-inline).
Result<void> Filesystem::unshare_inline(uint64_t ino, const Placement& place) {
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 8 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  c.t.place(place);
  std::vector<std::byte> data;
  {
    std::shared_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    if (!r.is_inline()) return ok();
    data = PLY_TRY(c.inline_data(ino, r.a.size));
  }
  std::vector<Ext> news;
  if (!data.empty() && !all_zero(data)) {
    data.resize(bs_);
    news = PLY_TRY(put_blocks(vol_, c.t, 0, data, bs_));
  }
  std::unique_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  PLY_CHECK(c.set_inline(ino, {}, r.a.size));
  for (const Ext& e : news) PLY_CHECK(c.put_extent(ino, e));
  r.flags &= ~kInodeInline;
  r.a.blocks = news.size() * (bs_ / 512);
  return c.put_inode(r);
}

Result<size_t> Filesystem::write(uint64_t ino, uint64_t off, std::span<const std::byte> in) {
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  if (in.empty()) return size_t{0};
  if (off + in.size() < off || off + in.size() > (kOffMask >> 1) * uint64_t(bs_))
    return Error::io(EFBIG, "file too large");
  // Every block the write touches may be new (format.md#quotas).
  const QuotaCharge quota = PLY_TRY(charge_quota(vol_, tree_, (off + in.size() - 1) / bs_ * bs_ + bs_ - off / bs_ * bs_));
  // Compression needs only the caller's bytes: it runs before the inode's
  // lock, on several threads, so that writers of one file (the kernel's
  // writeback) compress side by side (format.md#fs-compress).
  const std::vector<Frame> frames = PLY_TRY(precompress(ino, off, in));
  std::lock_guard il(inode_lock(ino));
  auto r = write_locked(ino, off, in, &frames);
  // Out of space while blocks freed by the open generation (a truncate, a
  // deleted snapshot's last references) wait for its commit (A2): one
  // commit, one more try, as a user would expect of space just freed.
  if (!r && r.error().code == ENOSPC && vol_.reclaim()) r = write_locked(ino, off, in, &frames);
  return r;
}

Compression effective_compression(uint32_t inode_flags, const Compression& branch, const Compression& mount) {
  using Mode = Compression::Mode;
  if (inode_flags & disk::kInodeNoCompress) return Compression{Mode::None};
  Compression c = mount;
  if (branch.mode != Mode::Unset) c = Compression{branch.mode, branch.level, mount.force};
  if (inode_flags & disk::kInodeCompress) {
    c.level = c.on() ? c.level : 0;
    c.mode = Mode::Zstd;
  }
  return c;
}

Result<Compression> Filesystem::compression_of(uint64_t ino) {
  const Compression mount = vol_.extension<MountCompression>().get();
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  Compression branch;
  if (auto v = PLY_TRY(c.t.get(tree_, ikey(0, ItemType::FsInfo))); v && v->size() == sizeof(disk::FsInfo))
    branch = branch_compression(*view_as<disk::FsInfo>(std::span<const std::byte>(*v)));
  return effective_compression(r.flags, branch, mount);
}

Result<std::vector<Filesystem::Frame>> Filesystem::precompress(uint64_t ino, uint64_t off,
                                                               std::span<const std::byte> in) {
  std::vector<Frame> out;
  // The whole blocks of the write, cut where file offsets are multiples of
  // the frame size, so that rewriting a file finds the same frames. A
  // partial last block goes into its frame with zeros after the write's
  // end: what it holds when the write ends the file (or the rest of the
  // block is zeros), which write_locked checks before it uses the frame, so
  // that a file's tail is compressed too.
  const uint64_t end = off + in.size();
  const uint64_t wa = (off + bs_ - 1) / bs_, wb = end / bs_, stop_at = wb + (end % bs_ ? 1 : 0);
  if (stop_at < wa + 2 || end <= disk::kInlineMax) return out;
  // An image that never used compression has no flag or branch default
  // that asks for it (they set COMPRESS): without a mount option, plain
  // writes cost no lookup.
  if (!(vol_.incompat() & kIncompatCompress) && !vol_.extension<MountCompression>().get().on()) return out;
  const Compression c = PLY_TRY(compression_of(ino));
  if (!c.on()) return out;
  for (uint64_t f = wa; f < stop_at;) {
    const uint64_t stop = std::min(stop_at, (f / kFrameBlocks + 1) * kFrameBlocks);
    if (stop - f >= 2) out.push_back(Frame{f, uint32_t(stop - f), std::nullopt, stop > wb});
    f = stop;
  }
  parallel_for(out.size(), [&](size_t i) {
    Frame& f = out[i];
    std::vector<std::byte> padded;
    std::span<const std::byte> data;
    if (f.tail) {  // the write's bytes, then zeros to the end of the block
      padded.assign(uint64_t(f.nblocks) * bs_, std::byte{0});
      const auto have = in.subspan(f.fb * bs_ - off);
      std::memcpy(padded.data(), have.data(), have.size());
      data = padded;
    } else {
      data = in.subspan(f.fb * bs_ - off, uint64_t(f.nblocks) * bs_);
    }
    if (!c.force && !looks_compressible(data)) return;  // written plain, cheaply
    f.z = compress_frame(data, c.effective_level(), bs_);
  });
  return out;
}

Result<size_t> Filesystem::write_locked(uint64_t ino, uint64_t off, std::span<const std::byte> in,
                                        const std::vector<Frame>* frames) {
  Attr a = PLY_TRY(getattr(ino));
  if (S_ISDIR(a.mode)) return Error::io(EISDIR, "is a directory");
  if (!S_ISREG(a.mode)) return Error::invalid("not a regular file");
  const uint64_t end = off + in.size();
  {
    auto t = PLY_TRY(vol_.begin({.reserve_blocks = 8 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    if (r.is_inline() && end <= disk::kInlineMax) {
      auto d = PLY_TRY(c.inline_data(ino, r.a.size));
      uint64_t old = r.a.size;
      if (d.size() < end) d.resize(end);
      std::memcpy(d.data() + off, in.data(), in.size());
      PLY_CHECK(c.set_inline(ino, d, old));
      r.a.size = d.size();
      if (!kernel_times_) r.a.mtime = r.a.ctime = now();
      PLY_CHECK(c.put_inode(r));
      return in.size();
    }
  }
  // Where the new blocks go (format.md#placement-rules); a write that takes
  // the file across a size bound of its rules queues it for migration.
  // A staged rule's write goes to its stage and queues the file to move
  // once it is quiet (format.md#staged-writes); one that crosses into a
  // staged rule waits so too, rather than moving at once: the data a file
  // still growing has moves once, when it is quiet.
  bool crossed = false, staged = false;
  const Placement place = PLY_TRY(place_for(ino, a, std::max(a.size, end), &crossed, &staged));
  if (a.size <= disk::kInlineMax) PLY_CHECK(unshare_inline(ino, place));
  a = PLY_TRY(getattr(ino));
  const uint64_t fb = off / bs_, lb = (end - 1) / bs_, nb = lb - fb + 1;
  // Whole blocks go to the device straight from the caller's buffer; only a
  // write with partial first or last blocks is staged, those blocks keeping
  // their other bytes.
  std::vector<std::byte> buf;
  std::span<const std::byte> blocks = in;
  if (off % bs_ || end % bs_) {
    buf.resize(nb * bs_);
    if (off % bs_ && fb * bs_ < a.size)
      (void)PLY_TRY(read(ino, fb * bs_, std::span(buf).first(bs_)));
    if (end % bs_ && lb * bs_ < a.size && (lb != fb || off % bs_ == 0))
      (void)PLY_TRY(read(ino, lb * bs_, std::span(buf).last(bs_)));
    std::memcpy(buf.data() + off % bs_, in.data(), in.size());
    blocks = buf;
  }

  auto t = PLY_TRY(vol_.begin({.reserve_blocks = (nb / disk::kMaxExtentBlocks + 8) * 2 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  c.t.place(place);
  // A frame holding the partial last block assumed zeros after the write's
  // end (precompress): so they must be, in the block as staged.
  const bool tail_ok = end % bs_ == 0 || all_zero(blocks.subspan((lb - fb) * bs_ + end % bs_, bs_ - end % bs_));
  auto news = PLY_TRY(put_blocks(vol_, c.t, fb, blocks, bs_, frames, tail_ok));
  std::unique_lock lk(mu_);
  auto apply = [&]() -> Result<void> {
    Rec r = PLY_TRY(c.inode(ino));
    int64_t delta = 0;
    // Blocks past the old end can hold leftovers of a truncation a crash
    // cut short (format.md#fs-extent); they must read as zeros.
    uint64_t eof_blk = (r.a.size + bs_ - 1) / bs_;
    if (eof_blk < fb) (void)PLY_TRY(c.punch(ino, eof_blk, fb, delta));
    (void)PLY_TRY(c.punch(ino, fb, fb + nb, delta));
    for (const Ext& e : news) {
      PLY_CHECK(c.put_extent(ino, e));
      delta += e.nblocks;
    }
    r.a.size = std::max(r.a.size, end);
    r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
    if (!kernel_times_) r.a.mtime = r.a.ctime = now();
    return c.put_inode(r);
  };
  auto r = apply();
  if (!r) {
    if (!vol_.failure()) for (const Ext& e : news) (void)c.t.dec_extent(BlockNo{e.disk_start});
    return r.error();
  }
  if (staged) placing_staged(ino);
  else if (crossed && a.blocks) placing_queue(ino);
  return in.size();
}

Result<void> Filesystem::truncate_locked(uint64_t ino, uint64_t size) {
  Attr a = PLY_TRY(getattr(ino));
  if (S_ISDIR(a.mode)) return Error::io(EISDIR, "is a directory");
  if (!S_ISREG(a.mode)) return Error::invalid("not a regular file");
  if (size > (kOffMask >> 1) * uint64_t(bs_)) return Error::io(EFBIG, "file too large");
  {
    auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 8 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    if (r.is_inline() && size <= disk::kInlineMax) {
      auto d = PLY_TRY(c.inline_data(ino, r.a.size));
      uint64_t old = r.a.size;
      d.resize(size);
      PLY_CHECK(c.set_inline(ino, d, old));
      r.a.size = size;
      if (!kernel_times_) r.a.mtime = r.a.ctime = now();
      return c.put_inode(r);
    }
  }
  if (a.size <= disk::kInlineMax) PLY_CHECK(unshare_inline(ino));
  a = PLY_TRY(getattr(ino));
  // The block that will hold the new end: its bytes past the end become
  // zeros, in the same generation as the size change.
  std::vector<std::byte> tail;
  const uint64_t keep = (size + bs_ - 1) / bs_;  // blocks that stay
  if (size < a.size && size % bs_) {
    tail.assign(bs_, std::byte{0});
    (void)PLY_TRY(read(ino, (size / bs_) * bs_, std::span(tail).first(size % bs_)));
  }
  bool first = true, done = false;
  while (!done) {
    auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 4 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::vector<Ext> news;
    if (first && !tail.empty()) news = PLY_TRY(put_blocks(vol_, c.t, size / bs_, tail, bs_));
    std::unique_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    int64_t delta = 0;
    if (size >= r.a.size) {
      // Growing: what lies past the old end must read as zeros.
      uint64_t eof_blk = (r.a.size + bs_ - 1) / bs_;
      done = PLY_TRY(c.punch(ino, eof_blk, keep, delta, kPunchBatch));
    } else {
      if (first && !news.empty()) {
        (void)PLY_TRY(c.punch(ino, size / bs_, size / bs_ + 1, delta));
        PLY_CHECK(c.put_extent(ino, news[0]));
        delta += 1;
      }
      done = PLY_TRY(c.punch(ino, keep, kOffMask, delta, kPunchBatch));
    }
    if (first) {
      r.a.size = size;
      if (!kernel_times_) r.a.mtime = r.a.ctime = now();
    }
    r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
    PLY_CHECK(c.put_inode(r));
    first = false;
  }
  return ok();
}

Result<void> Filesystem::fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len) {
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  const int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
  if (mode & ~known) return Error::io(EOPNOTSUPP, "unsupported fallocate mode");
  if ((mode & FALLOC_FL_PUNCH_HOLE) && !(mode & FALLOC_FL_KEEP_SIZE))
    return Error::invalid("PUNCH_HOLE needs KEEP_SIZE");
  if ((mode & FALLOC_FL_PUNCH_HOLE) && (mode & FALLOC_FL_ZERO_RANGE))
    return Error::invalid("PUNCH_HOLE with ZERO_RANGE");
  if (len == 0) return Error::invalid("zero length");
  const uint64_t end = off + len;
  if (end < off || end > (kOffMask >> 1) * uint64_t(bs_)) return Error::io(EFBIG, "file too large");
  // Preallocating may take every block of the range; punching a hole takes
  // none, and is never refused (format.md#quotas).
  std::optional<QuotaCharge> quota;
  if (!(mode & FALLOC_FL_PUNCH_HOLE))
    quota.emplace(PLY_TRY(charge_quota(vol_, tree_, (end - 1) / bs_ * bs_ + bs_ - off / bs_ * bs_)));
  std::lock_guard il(inode_lock(ino));
  Attr a = PLY_TRY(getattr(ino));
  if (S_ISDIR(a.mode)) return Error::io(EISDIR, "is a directory");
  if (!S_ISREG(a.mode)) return Error::io(ENODEV, "not a regular file");
  // Preallocated blocks go where the file's data would (format.md#placement-rules).
  const Placement place = PLY_TRY(place_for(ino, a, (mode & FALLOC_FL_KEEP_SIZE) ? a.size : std::max(a.size, end), nullptr));
  PLY_CHECK(unshare_inline(ino, place));
  a = PLY_TRY(getattr(ino));
  const bool zeroing = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE);
  if (zeroing) {
    // Partial blocks at the edges get zeros written; whole blocks are unmapped.
    const uint64_t wf = (off + bs_ - 1) / bs_, wl = end / bs_;  // whole blocks [wf, wl)
    auto zero_bytes = [&](uint64_t from, uint64_t to) -> Result<void> {
      to = std::min(to, a.size);
      if (from >= to) return ok();
      std::vector<std::byte> z(to - from);
      (void)PLY_TRY(write_locked(ino, from, z));
      return ok();
    };
    if (wf > wl) {
      PLY_CHECK(zero_bytes(off, end));
    } else {
      PLY_CHECK(zero_bytes(off, wf * bs_));
      PLY_CHECK(zero_bytes(wl * bs_, end));
    }
    bool done = wf >= wl;
    while (!done) {
      auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 4 * kOpBlocks}));
      Ctx c{*this, std::move(t)};
      std::unique_lock lk(mu_);
      Rec r = PLY_TRY(c.inode(ino));
      int64_t delta = 0;
      done = PLY_TRY(c.punch(ino, wf, wl, delta, kPunchBatch));
      r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
      if (!kernel_times_) r.a.mtime = r.a.ctime = now();
      PLY_CHECK(c.put_inode(r));
    }
    if (mode & FALLOC_FL_PUNCH_HOLE) return ok();
  }
  // Allocate: holes in [off, end) get preallocated extents.
  const uint64_t fb = off / bs_, lb = (end - 1) / bs_ + 1;
  uint64_t pos = fb;
  while (pos < lb) {
    auto t = PLY_TRY(vol_.begin({.reserve_blocks = 8 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    c.t.place(place);
    uint64_t stop = std::min<uint64_t>(lb, pos + 16 * disk::kMaxExtentBlocks);
    std::vector<Ext> es;
    {
      std::shared_lock lk(mu_);
      es = PLY_TRY(c.extents(ino, pos, stop));
    }
    std::vector<std::pair<uint64_t, uint64_t>> holes;
    uint64_t p = pos;
    for (const Ext& e : es) {
      if (e.file_blk > p) holes.push_back({p, std::min(e.file_blk, stop)});
      p = std::max(p, e.end());
    }
    if (p < stop) holes.push_back({p, stop});
    std::vector<Ext> news;
    for (auto [h0, h1] : holes) {
      for (uint64_t q = h0; q < h1;) {
        uint32_t n = uint32_t(std::min<uint64_t>(disk::kMaxExtentBlocks, h1 - q));
        auto b = c.t.alloc_extent(n);
        if (!b) {
          for (const Ext& x : news) (void)c.t.dec_extent(BlockNo{x.disk_start});
          return b.error();
        }
        Ext e;
        e.file_blk = q;
        e.disk_start = b->v;
        e.disk_nblocks = n;
        e.nblocks = n;
        e.flags = disk::kExtentPrealloc;
        news.push_back(e);
        q += n;
      }
    }
    std::unique_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    int64_t delta = 0;
    for (const Ext& e : news) {
      PLY_CHECK(c.put_extent(ino, e));
      delta += e.nblocks;
    }
    r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
    if (!(mode & FALLOC_FL_KEEP_SIZE) && stop == lb && end > r.a.size) r.a.size = end;
    if (!kernel_times_) r.a.ctime = now();
    if (!kernel_times_ && !(mode & FALLOC_FL_KEEP_SIZE)) r.a.mtime = r.a.ctime;
    PLY_CHECK(c.put_inode(r));
    pos = stop;
  }
  return ok();
}

Result<uint64_t> Filesystem::lseek(uint64_t ino, uint64_t off, int whence) {
  if (whence != SEEK_DATA && whence != SEEK_HOLE) return Error::invalid("lseek whence");
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  if (off >= r.a.size) return Error::io(ENXIO, "offset past the end");
  if (r.is_inline()) return whence == SEEK_DATA ? off : r.a.size;
  uint64_t blk = off / bs_;
  const uint64_t eof_blk = (r.a.size + bs_ - 1) / bs_;
  while (blk < eof_blk) {
    auto es = PLY_TRY(c.extents(ino, blk, eof_blk, 64));
    if (whence == SEEK_DATA) {
      if (es.empty()) return Error::io(ENXIO, "no data past the offset");
      uint64_t d = std::max(off, es[0].file_blk * bs_);
      if (d >= r.a.size) return Error::io(ENXIO, "no data past the offset");
      return d;
    }
    uint64_t p = blk;
    for (const Ext& e : es) {
      if (e.file_blk > p) return std::max(off, std::min(p * bs_, r.a.size));
      p = std::max(p, e.end());
    }
    if (es.size() < 64) return std::max(off, std::min(p * bs_, r.a.size));
    blk = p;
  }
  return whence == SEEK_DATA ? Result<uint64_t>(Error::io(ENXIO, "no data past the offset"))
                             : Result<uint64_t>(r.a.size);
}

Result<std::vector<Filesystem::Placed>> Filesystem::placement(uint64_t ino) {
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  std::vector<Placed> out;
  if (r.is_inline() || r.a.size == 0) return out;
  const uint64_t eof_blk = (r.a.size + bs_ - 1) / bs_;
  for (uint64_t blk = 0; blk < eof_blk;) {
    auto es = PLY_TRY(c.extents(ino, blk, eof_blk, 256));
    if (es.empty()) break;
    for (const Ext& e : es) {
      Placed p;
      p.file_offset = e.file_blk * bs_;
      p.bytes = std::min<uint64_t>(uint64_t(e.nblocks) * bs_, r.a.size - std::min(r.a.size, p.file_offset));
      const bool z = e.compression != disk::kCompressNone;
      p.block = z ? e.disk_start : e.disk_start + e.offset;
      p.nblocks = z ? e.disk_nblocks : e.nblocks;
      out.push_back(p);
      blk = std::max(blk, e.end());
    }
    if (es.size() < 256) break;
  }
  return out;
}

Result<uint64_t> Filesystem::copy_range(uint64_t in, uint64_t off_in, uint64_t out,
                                        uint64_t off_out, uint64_t len) {
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  Attr ai = PLY_TRY(getattr(in));
  Attr ao = PLY_TRY(getattr(out));
  if (S_ISDIR(ai.mode) || S_ISDIR(ao.mode)) return Error::io(EISDIR, "is a directory");
  if (!S_ISREG(ai.mode) || !S_ISREG(ao.mode)) return Error::invalid("not a regular file");
  if (off_in >= ai.size) return uint64_t{0};
  len = std::min(len, ai.size - off_in);
  if (in == out && off_in < off_out + len && off_out < off_in + len)
    return Error::invalid("overlapping ranges in one file");
  const bool aligned = off_in % bs_ == 0 && off_out % bs_ == 0 &&
                       (len % bs_ == 0 || (off_in + len == ai.size && off_out + len >= ao.size));
  if (!aligned || ai.size <= disk::kInlineMax) {
    // Copy through a buffer.
    std::vector<std::byte> buf(1 << 20);
    uint64_t done = 0;
    while (done < len) {
      size_t n = PLY_TRY(read(in, off_in + done, std::span(buf).first(std::min<uint64_t>(buf.size(), len - done))));
      if (n == 0) break;
      (void)PLY_TRY(write(out, off_out + done, std::span(buf).first(n)));
      done += n;
    }
    return done;
  }
  // Sharing blocks this tree already reaches adds none to its figures, only
  // the items that map them (format.md#quotas).
  const QuotaCharge quota = PLY_TRY(charge_quota(vol_, tree_, bs_));
  // Share: lock both files, lower stripe first.
  std::mutex* m1 = &inode_lock(in);
  std::mutex* m2 = &inode_lock(out);
  if (m1 > m2) std::swap(m1, m2);
  std::lock_guard l1(*m1);
  std::unique_lock<std::mutex> l2;
  if (m2 != m1) l2 = std::unique_lock(*m2);
  PLY_CHECK(unshare_inline(in));
  PLY_CHECK(unshare_inline(out));
  const uint64_t sfb = off_in / bs_, dfb = off_out / bs_, nb = (len + bs_ - 1) / bs_;
  for (uint64_t done = 0; done < nb;) {
    uint64_t step = std::min<uint64_t>(nb - done, 64 * disk::kMaxExtentBlocks);
    auto t = PLY_TRY(vol_.begin({.reserve_blocks = (step / disk::kMaxExtentBlocks + 4) * 3 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    auto es = PLY_TRY(c.extents(in, sfb + done, sfb + done + step));
    Rec r = PLY_TRY(c.inode(out));
    int64_t delta = 0;
    (void)PLY_TRY(c.punch(out, dfb + done, dfb + done + step, delta));
    for (const Ext& e : es) {
      uint64_t a = std::max(sfb + done, e.file_blk), b = std::min(sfb + done + step, e.end());
      Ext s = slice(e, a, b);
      s.file_blk = dfb + (a - sfb);
      PLY_CHECK(c.put_extent(out, s));
      PLY_CHECK(c.t.inc_extent(BlockNo{s.disk_start}));
      delta += int64_t(b - a);
    }
    r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
    done += step;
    if (done == nb) r.a.size = std::max(r.a.size, off_out + len);
    if (!kernel_times_) r.a.mtime = r.a.ctime = now();
    PLY_CHECK(c.put_inode(r));
  }
  return len;
}

}  // namespace plyfs
