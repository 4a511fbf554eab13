// Send and receive streams (send.h; format.md#send-stream).
#include "fs/send.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "commit/devices.h"
#include "fs/check.h"
#include "fs/compress.h"
#include "fs/fs_internal.h"
#include "util/checksum.h"
#include "util/text.h"

namespace plyfs {

namespace disk {

// The stream header (format.md#send-stream), 64 bytes, never compressed.
struct StreamHeader {
  uint8_t magic[8];   // "PLYSEND1"
  le32 version;       // 1
  le32 flags;         // kStreamIncremental | kStreamZstd
  le32 block_size;    // the sender's: items address file blocks
  le32 reserved;
  uint8_t uuid[16];         // the branch sent
  uint8_t parent_uuid[16];  // incremental: the parent snapshot's uuid; else zero
  le64 checksum;            // XXH3-64 of bytes [0, 56)
};
static_assert(sizeof(StreamHeader) == 64);

inline constexpr uint32_t kStreamIncremental = 1;
inline constexpr uint32_t kStreamZstd = 2;
inline constexpr uint32_t kStreamFlagsKnown = kStreamIncremental | kStreamZstd;
inline constexpr uint32_t kStreamVersion = 1;

// Every record: this head, `length` bytes of payload, then le64 XXH3-64 of
// head and payload.
struct RecordHead {
  le32 type;
  le32 length;  // payload bytes, at most kMaxRecord
  le64 seq;     // 0 for the first record after the header, then +1
};
static_assert(sizeof(RecordHead) == 16);
inline constexpr uint32_t kMaxRecord = 16u << 20;

enum class Rec : uint32_t { Branch = 1, Put = 2, Delete = 3, Extent = 4, Shared = 5, End = 6 };

// The BRANCH record: the first, exactly once.
struct BranchRec {
  FsInfo info;          // the sender's FsInfo (128 bytes)
  uint8_t lower_uuid[16];  // a layer: the uuid of the branch it lies on; else zero
  le64 max_ino;         // every inode number in the tree is below it
  le64 items;           // items the stream will put (progress)
  le64 data_bytes;      // extent bytes the stream will carry, at most (progress)
  le64 reserved;
};
static_assert(sizeof(BranchRec) == 176);

// Starts every item record (PUT, DELETE, EXTENT, SHARED).
struct ItemHead {
  le64 key_hi, key_lo;
  le64 old_hash;   // had_old: XXH3-64 of the parent's value at the key
  uint8_t had_old; // 1: the parent holds the key (incremental); 0: it does not
  uint8_t reserved[7];
};
static_assert(sizeof(ItemHead) == 32);

// EXTENT: ItemHead, this, the value (the sender's Extent item), then the
// stored blocks the item's checksums cover.
struct ExtentRec {
  le32 value_len;
  le32 reserved;
};
static_assert(sizeof(ExtentRec) == 8);

// SHARED: ItemHead, this, the value. Source 0: data an earlier EXTENT of
// this stream carried; source 1: the parent's Extent item at `parent_key`,
// `delta` blocks past where it starts mapping.
struct SharedRec {
  le32 value_len;
  uint8_t source;
  uint8_t reserved[3];
  le64 parent_hi, parent_lo;
  le64 delta;
};
static_assert(sizeof(SharedRec) == 32);

struct EndRec {
  le64 records;     // records before END
  le64 items;       // PUT, EXTENT and SHARED records
  le64 deleted;     // DELETE records
  le64 data_bytes;  // payload bytes of extent data
  le64 digest;      // XXH3-64 over the checksums of every record before END, in order
};
static_assert(sizeof(EndRec) == 40);

}  // namespace disk

namespace {

using disk::Rec;

constexpr char kMagic[8] = {'P', 'L', 'Y', 'S', 'E', 'N', 'D', '1'};

bool nil(const uint8_t* u) {
  for (int i = 0; i < 16; i++)
    if (u[i]) return false;
  return true;
}

std::string hex_uuid(const uint8_t* u) {
  std::array<uint8_t, 16> a{};
  std::memcpy(a.data(), u, 16);
  return uuid_text(a);
}

template <class T>
std::span<const std::byte> raw(const T& x) {
  return {reinterpret_cast<const std::byte*>(&x), sizeof x};
}

// ---------------------------------------------------------------- writing

class StreamWriter {
 public:
  StreamWriter(int fd, int level) : fd_(fd), level_(level) {}
  ~StreamWriter() {
    if (z_) ZSTD_freeCStream(z_);
  }

  Result<void> header(const disk::StreamHeader& h) {
    PLY_CHECK(write_fd(raw(h)));
    if (level_ > 0) {
      z_ = ZSTD_createCStream();
      if (!z_) return Error::io(ENOMEM, "cannot start zstd");
      ZSTD_CCtx_setParameter(z_, ZSTD_c_compressionLevel, level_);
      ZSTD_CCtx_setParameter(z_, ZSTD_c_checksumFlag, 1);
    }
    return ok();
  }

  Result<void> record(Rec type, std::initializer_list<std::span<const std::byte>> parts) {
    uint64_t len = 0;
    for (auto p : parts) len += p.size();
    if (len > disk::kMaxRecord) return Error::io(EFBIG, "a stream record would exceed 16 MiB");
    disk::RecordHead h{};
    h.type.set(uint32_t(type));
    h.length.set(uint32_t(len));
    h.seq.set(seq_++);
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, &h, sizeof h);
    for (auto p : parts) XXH3_64bits_update(st, p.data(), p.size());
    const uint64_t sum = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    le64 s;
    s.set(sum);
    PLY_CHECK(body(raw(h)));
    for (auto p : parts) PLY_CHECK(body(p));
    PLY_CHECK(body(raw(s)));
    digest_ = xxh3_chain(digest_, sum);
    return ok();
  }

  Result<void> finish() {
    if (z_) {
      for (;;) {
        ZSTD_inBuffer in{nullptr, 0, 0};
        ZSTD_outBuffer out{zbuf_.data(), zbuf_.size(), 0};
        const size_t left = ZSTD_compressStream2(z_, &out, &in, ZSTD_e_end);
        if (ZSTD_isError(left)) return Error::io(EIO, std::string("zstd: ") + ZSTD_getErrorName(left));
        PLY_CHECK(write_fd({zbuf_.data(), out.pos}));
        if (left == 0) break;
      }
    } else {
      PLY_CHECK(write_fd({buf_.data(), buf_.size()}));
      buf_.clear();
    }
    return ok();
  }

  uint64_t seq() const { return seq_; }
  uint64_t digest() const { return digest_; }
  uint64_t bytes() const { return written_; }

  static uint64_t xxh3_chain(uint64_t acc, uint64_t sum) {
    const uint64_t both[2] = {acc, sum};
    return xxh3(both, sizeof both);
  }

 private:
  Result<void> body(std::span<const std::byte> b) {
    if (!z_) {
      buf_.insert(buf_.end(), b.begin(), b.end());
      if (buf_.size() >= (1u << 20)) {
        PLY_CHECK(write_fd({buf_.data(), buf_.size()}));
        buf_.clear();
      }
      return ok();
    }
    ZSTD_inBuffer in{b.data(), b.size(), 0};
    while (in.pos < in.size) {
      ZSTD_outBuffer out{zbuf_.data(), zbuf_.size(), 0};
      const size_t r = ZSTD_compressStream2(z_, &out, &in, ZSTD_e_continue);
      if (ZSTD_isError(r)) return Error::io(EIO, std::string("zstd: ") + ZSTD_getErrorName(r));
      PLY_CHECK(write_fd({zbuf_.data(), out.pos}));
    }
    return ok();
  }

  Result<void> write_fd(std::span<const std::byte> b) {
    size_t done = 0;
    while (done < b.size()) {
      const ssize_t n = ::write(fd_, b.data() + done, b.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Error::sys(errno, "cannot write the stream");
      }
      done += size_t(n);
    }
    written_ += b.size();
    return ok();
  }

  int fd_;
  int level_;
  ZSTD_CStream* z_ = nullptr;
  std::vector<std::byte> buf_;
  std::vector<std::byte> zbuf_ = std::vector<std::byte>(ZSTD_CStreamOutSize());
  uint64_t seq_ = 0, digest_ = 0, written_ = 0;
};

// ---------------------------------------------------------------- reading

Error bad_stream(const std::string& why) { return Error::io(EBADMSG, "not a valid plyfs stream: " + why); }

class StreamReader {
 public:
  explicit StreamReader(int fd) : fd_(fd) {}
  ~StreamReader() {
    if (z_) ZSTD_freeDStream(z_);
  }

  Result<disk::StreamHeader> header() {
    disk::StreamHeader h;
    auto* p = reinterpret_cast<std::byte*>(&h);
    const size_t n = PLY_TRY(read_fd({p, sizeof h}));
    if (n < sizeof h) return bad_stream(n == 0 ? "it is empty" : "it ends inside its header");
    if (std::memcmp(h.magic, kMagic, 8) != 0) return bad_stream("no PLYSEND1 header");
    if (h.checksum.get() != xxh3(&h, 56)) return bad_stream("the header's checksum does not match");
    if (h.version.get() != disk::kStreamVersion)
      return Error::io(EOPNOTSUPP, "stream version " + std::to_string(h.version.get()) +
                                       " is not supported (this build reads version 1)");
    if (h.flags.get() & ~disk::kStreamFlagsKnown) return bad_stream("unknown header flags");
    if (h.reserved.get()) return bad_stream("reserved header bytes are not zero");
    if (h.flags.get() & disk::kStreamZstd) {
      z_ = ZSTD_createDStream();
      if (!z_) return Error::io(ENOMEM, "cannot start zstd");
      zin_.resize(ZSTD_DStreamInSize());
    }
    return h;
  }

  struct Record {
    Rec type;
    std::vector<std::byte> payload;
    uint64_t sum;
  };

  // The next record; its sequence number and checksum checked.
  Result<Record> next() {
    disk::RecordHead h;
    PLY_CHECK(exact({reinterpret_cast<std::byte*>(&h), sizeof h}, "inside a record"));
    if (h.length.get() > disk::kMaxRecord) return bad_stream("a record is longer than 16 MiB");
    if (h.seq.get() != seq_)
      return bad_stream("record " + std::to_string(h.seq.get()) + " comes where record " +
                        std::to_string(seq_) + " belongs (reordered or lost)");
    Record r;
    r.type = Rec(h.type.get());
    r.payload.resize(h.length.get());
    PLY_CHECK(exact(r.payload, "inside a record"));
    le64 s;
    PLY_CHECK(exact({reinterpret_cast<std::byte*>(&s), sizeof s}, "inside a record"));
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, &h, sizeof h);
    XXH3_64bits_update(st, r.payload.data(), r.payload.size());
    r.sum = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    if (r.sum != s.get()) return bad_stream("record " + std::to_string(seq_) + " fails its checksum");
    seq_++;
    return r;
  }

  // After END: nothing may follow.
  Result<void> at_end() {
    std::byte b;
    const size_t n = PLY_TRY(body({&b, 1}));
    if (n) return bad_stream("bytes follow its END record");
    return ok();
  }

  uint64_t bytes() const { return read_; }

 private:
  Result<void> exact(std::span<std::byte> out, const char* where) {
    const size_t n = PLY_TRY(body(out));
    if (n < out.size()) return bad_stream(std::string("it ends ") + where + " (truncated)");
    return ok();
  }

  // Up to out.size() bytes of the record stream, short only at its end.
  Result<size_t> body(std::span<std::byte> out) {
    if (!z_) return read_fd(out);
    size_t got = 0;
    while (got < out.size()) {
      if (zpos_ == zlen_ && !zeof_) {
        zlen_ = PLY_TRY(read_fd(zin_));
        zpos_ = 0;
        if (zlen_ == 0) zeof_ = true;
      }
      ZSTD_inBuffer in{zin_.data(), zlen_, zpos_};
      ZSTD_outBuffer o{out.data() + got, out.size() - got, 0};
      if (zeof_ && zpos_ == zlen_) {
        // No input left: flush what the decoder holds.
        const size_t r = ZSTD_decompressStream(z_, &o, &in);
        if (ZSTD_isError(r)) return bad_stream(std::string("zstd: ") + ZSTD_getErrorName(r));
        got += o.pos;
        if (o.pos == 0) break;
        continue;
      }
      const size_t r = ZSTD_decompressStream(z_, &o, &in);
      if (ZSTD_isError(r)) return bad_stream(std::string("zstd: ") + ZSTD_getErrorName(r));
      zpos_ = in.pos;
      got += o.pos;
    }
    return got;
  }

  Result<size_t> read_fd(std::span<std::byte> out) {
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::read(fd_, out.data() + done, out.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Error::sys(errno, "cannot read the stream");
      }
      if (n == 0) break;
      done += size_t(n);
    }
    read_ += done;
    return done;
  }

  int fd_;
  ZSTD_DStream* z_ = nullptr;
  std::vector<std::byte> zin_;
  size_t zpos_ = 0, zlen_ = 0;
  bool zeof_ = false;
  uint64_t seq_ = 0, read_ = 0;
};

template <class T>
Result<T> take(std::span<const std::byte>& p, const char* what) {
  if (p.size() < sizeof(T)) return bad_stream(std::string("a short ") + what + " record");
  T x;
  std::memcpy(&x, p.data(), sizeof x);
  p = p.subspan(sizeof x);
  return x;
}

bool extent_key(Key k) { return k.hi != 0 && type_of(k) == ItemType::Extent; }

// What DELETE and replacing records say the parent held at a key
// (ItemHead.old_hash): XXH3-64 of the value, an extent's without what is the
// image's own (where its blocks lie; for a plain or preallocated one, where
// in its space extent it starts), so that sender and receiver agree.
uint64_t item_hash(Key k, std::span<const std::byte> v) {
  if (!extent_key(k)) return xxh3(v);
  auto e = decode_extent(k, v);
  if (!e) return xxh3(v);
  e->disk_start = 0;
  if (!e->compressed()) {
    e->disk_nblocks = 0;
    e->offset = 0;
  }
  auto n = encode_extent(*e);
  return xxh3(std::span<const std::byte>(n));
}

// The blocks an extent item's checksums cover (Ext::stored_first/count).
struct Stored {
  uint64_t first = 0, count = 0;
  bool compressed = false;
};
Stored stored_of(const Ext& e) { return {e.stored_first(), e.stored_count(), e.compressed()}; }

// ---------------------------------------------------------------- send

// A parent's Extent item and how many blocks into its mapping an item
// starts (a SHARED record's parent_key and delta).
using ParentRef = std::optional<std::pair<Key, uint64_t>>;

struct Change {
  Key key;
  std::optional<std::vector<std::byte>> old_v, new_v;
};

class Sender {
 public:
  Sender(Volume& v, TreeId tree, const SendOptions& o, StreamWriter& w)
      : v_(v), tree_(tree), o_(o), w_(w), bs_(v.block_size()) {}

  Result<void> run(const BranchMeta& b, const std::optional<BranchMeta>& parent) {
    // What to send: every item, or the item difference from the parent.
    // An incremental stream is the item difference from the parent, held
    // whole (it is as large as the change). A full one is read in batches
    // after a first pass that counts it, so that memory stays bounded
    // whatever the branch's size.
    std::vector<Change> changes;
    uint64_t max_ino = 0, items = 0, data = 0;
    auto count = [&](Key k, std::span<const std::byte> val) {
      if (k == Key{0, 0}) return;
      items++;
      if (extent_key(k))
        if (auto e = decode_extent(k, val); e && !e->prealloc()) data += e->stored_count() * bs_;
    };
    {
      auto t = PLY_TRY(v_.begin());
      if (parent) {
        PLY_CHECK(t.diff(parent->tree, tree_,
                         [&](Key k, std::optional<std::span<const std::byte>> a,
                             std::optional<std::span<const std::byte>> bb) {
                           Change c{k, {}, {}};
                           if (a) c.old_v.emplace(a->begin(), a->end());
                           if (bb) {
                             c.new_v.emplace(bb->begin(), bb->end());
                             count(k, *bb);
                           }
                           changes.push_back(std::move(c));
                           return true;
                         },
                         nullptr, [&](double f) { report(f * 0.2); }));
      } else {
        PLY_CHECK(t.scan(tree_, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> val) {
          count(k, val);
          return true;
        }));
      }
      // Every inode number of every tree is below the volume's counter:
      // the receiver's must pass it (a received tree keeps its numbers).
      max_ino = t.next_inode_number();
    }
    // BRANCH.
    auto fi = PLY_TRY(info(b.tree));
    disk::BranchRec br{};
    br.info = fi;
    if (lower_) std::memcpy(br.lower_uuid, lower_->uuid.data(), 16);
    br.max_ino.set(max_ino);
    br.items.set(items);
    br.data_bytes.set(data);
    PLY_CHECK(w_.record(Rec::Branch, {raw(br)}));
    const double base = parent ? 0.2 : 0.0, span = parent ? 0.8 : 1.0;
    uint64_t done = 0;
    auto send_all = [&](const std::vector<Change>& cs) -> Result<void> {
      for (const Change& c : cs) {
        if (c.key == Key{0, 0}) continue;  // BRANCH carries FsInfo
        PLY_CHECK(one(c, parent));
        if ((++done & 255) == 0) report(base + span * double(done) / double(std::max<uint64_t>(1, items + st_.deleted)));
      }
      return ok();
    };
    if (parent) {
      PLY_CHECK(send_all(changes));
    } else {
      constexpr size_t kBatch = 4096;
      for (Key from = Key::min();;) {
        std::vector<Change> batch;
        {
          auto t = PLY_TRY(v_.begin());
          PLY_CHECK(t.scan(tree_, from, Key::max(), [&](Key k, std::span<const std::byte> val) {
            batch.push_back(Change{k, {}, std::vector<std::byte>(val.begin(), val.end())});
            return batch.size() < kBatch;
          }));
        }
        PLY_CHECK(send_all(batch));
        if (batch.size() < kBatch) break;
        const Key last = batch.back().key;
        if (last == Key::max()) break;
        from = last.lo == ~0ull ? Key{last.hi + 1, 0} : Key{last.hi, last.lo + 1};
      }
    }
    disk::EndRec end{};
    end.records.set(w_.seq());
    end.items.set(st_.items);
    end.deleted.set(st_.deleted);
    end.data_bytes.set(st_.data_bytes);
    end.digest.set(w_.digest());
    PLY_CHECK(w_.record(Rec::End, {raw(end)}));
    PLY_CHECK(w_.finish());
    st_.records = w_.seq();
    st_.stream_bytes = w_.bytes();
    st_.fraction = 1;
    if (o_.progress) o_.progress(st_);
    return ok();
  }

  void set_lower(std::optional<BranchMeta> l) { lower_ = std::move(l); }
  const SendStats& stats() const { return st_; }

 private:
  Result<disk::FsInfo> info(TreeId t) {
    auto txn = PLY_TRY(v_.begin());
    return read_info(txn, t);
  }

  void report(double f) {
    if (!o_.progress) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(50)) return;
    last_ = now;
    st_.fraction = f;
    st_.stream_bytes = w_.bytes();
    o_.progress(st_);
  }

  static disk::ItemHead head_of(const Change& c) {
    disk::ItemHead h{};
    h.key_hi.set(c.key.hi);
    h.key_lo.set(c.key.lo);
    if (c.old_v) {
      h.had_old = 1;
      h.old_hash.set(item_hash(c.key, *c.old_v));
    }
    return h;
  }

  Result<void> one(const Change& c, const std::optional<BranchMeta>& parent) {
    const disk::ItemHead h = head_of(c);
    if (!c.new_v) {
      st_.deleted++;
      return w_.record(Rec::Delete, {raw(h)});
    }
    st_.items++;
    if (!extent_key(c.key)) return w_.record(Rec::Put, {raw(h), std::span<const std::byte>(*c.new_v)});
    Ext e = PLY_TRY(decode_extent(c.key, *c.new_v));
    if (e.prealloc()) {
      st_.prealloc_bytes += uint64_t(e.nblocks) * bs_;
      return w_.record(Rec::Put, {raw(h), std::span<const std::byte>(*c.new_v)});
    }
    const Stored s = stored_of(e);
    // Sent before in this stream (S3)?
    if (auto it = sent_.upper_bound(s.first); it != sent_.begin()) {
      --it;
      if (it->second.compressed == s.compressed && s.first + s.count <= it->first + it->second.count &&
          (!s.compressed || it->first == s.first))
        return shared(h, *c.new_v, 0, std::nullopt);
    }
    if (parent) {
      // A part of what the parent's item at this file position maps?
      if (auto p = PLY_TRY(parent_item(parent->tree, c.key, e))) return shared(h, *c.new_v, 1, p);
      // Anywhere else in the parent (a reflink of data it holds: cp,
      // copy_file_range, a clone of a range)?
      if (auto q = PLY_TRY(parent_elsewhere(parent->tree, e))) return shared(h, *c.new_v, 2, q);
    }
    // The data itself, checked against the item's checksums first: a
    // stream never carries a block the sender could not vouch for.
    std::vector<std::byte> data(s.count * bs_);
    PLY_CHECK(v_.read_data(BlockNo{s.first}, data));
    for (uint64_t i = 0; i < s.count; i++)
      if (xxh3(std::span<const std::byte>(data).subspan(i * bs_, bs_)) != e.csums[i])
        return Error::io(EIO, "data block " + std::to_string(s.first + i) + " of inode " +
                                  std::to_string(c.key.hi) + " fails its checksum: not sent");
    disk::ExtentRec er{};
    er.value_len.set(uint32_t(c.new_v->size()));
    sent_[s.first] = s;
    st_.extents++;
    st_.data_bytes += data.size();
    return w_.record(Rec::Extent, {raw(h), raw(er), std::span<const std::byte>(*c.new_v),
                                   std::span<const std::byte>(data)});
  }

  // A SHARED record (format.md#send-stream): from this stream (source 0),
  // or from the parent's item `ref` (1: at the same place, 2: anywhere).
  Result<void> shared(const disk::ItemHead& h, const std::vector<std::byte>& value, uint8_t source,
                      const ParentRef& ref) {
    disk::SharedRec sr{};
    sr.value_len.set(uint32_t(value.size()));
    sr.source = source;
    if (ref) {
      sr.parent_hi.set(ref->first.hi);
      sr.parent_lo.set(ref->first.lo);
      sr.delta.set(ref->second);
    }
    st_.shared++;
    st_.shared_elsewhere += source == 2;
    return w_.record(Rec::Shared, {raw(h), raw(sr), std::span<const std::byte>(value)});
  }

  // The parent's Extent item that maps, at the same file block, the blocks
  // `e` maps (a partial overwrite split it): its key and how far into its
  // mapping `e` starts.
  Result<ParentRef> parent_item(TreeId parent, Key k, const Ext& e) {
    const uint64_t b = off_of(k);
    const uint64_t from = b >= disk::kMaxExtentBlocks - 1 ? b - (disk::kMaxExtentBlocks - 1) : 0;
    std::optional<std::pair<Key, uint64_t>> out;
    auto t = PLY_TRY(v_.begin());
    PLY_CHECK(t.scan(parent, ikey(k.hi, ItemType::Extent, from), ikey(k.hi, ItemType::Extent, b),
                     [&](Key pk, std::span<const std::byte> pv) {
                       auto p = decode_extent(pk, pv);
                       if (!p || p->prealloc() || p->compression != e.compression ||
                           p->disk_start != e.disk_start || p->end() <= b)
                         return true;
                       const uint64_t delta = b - p->file_blk;
                       if (e.compressed()) {
                         if (p->disk_nblocks == e.disk_nblocks && p->frame_bytes == e.frame_bytes &&
                             p->csums == e.csums)
                           out = std::make_pair(pk, delta);
                       } else if (p->offset + delta == e.offset && delta + e.nblocks <= p->nblocks) {
                         out = std::make_pair(pk, delta);
                       }
                       return true;
                     }));
    return out;
  }

  // An Extent item of the parent, of any file at any position, that maps
  // all the blocks `e` maps (format.md#send-stream, "Sharing"): its key and
  // how far into its mapping `e` starts. Only an extent referenced more
  // than once can be both the parent's and a changed item's (the changed
  // item's leaf is not the parent's), so the parent's extent items are
  // indexed, by one scan, only when such an extent first comes.
  Result<ParentRef> parent_elsewhere(TreeId parent, const Ext& e) {
    auto t = PLY_TRY(v_.begin());
    if (PLY_TRY(t.extent_refs(BlockNo{e.disk_start})) < 2) return ParentRef();
    if (!parent_index_) {
      parent_index_.emplace();
      PLY_CHECK(t.scan(parent, Key::min(), Key::max(), [&](Key pk, std::span<const std::byte> pv) {
        if (!extent_key(pk)) return true;
        auto p = decode_extent(pk, pv);
        if (p && !p->prealloc()) parent_index_->emplace(p->disk_start, pk);
        return true;
      }));
    }
    auto [lo, hi] = parent_index_->equal_range(e.disk_start);
    for (auto it = lo; it != hi; ++it) {
      auto pv = PLY_TRY(t.get(parent, it->second));
      if (!pv) continue;
      auto p = decode_extent(it->second, *pv);
      if (!p || p->prealloc() || p->compression != e.compression || p->disk_start != e.disk_start) continue;
      if (e.compressed()) {
        if (p->disk_nblocks == e.disk_nblocks && p->frame_bytes == e.frame_bytes && p->csums == e.csums)
          return ParentRef(std::make_pair(it->second, uint64_t{0}));
      } else if (p->offset <= e.offset && e.offset + e.nblocks <= p->offset + p->nblocks) {
        const uint64_t delta = e.offset - p->offset;
        if (std::equal(e.csums.begin(), e.csums.end(), p->csums.begin() + std::ptrdiff_t(delta)))
          return ParentRef(std::make_pair(it->second, delta));
      }
    }
    return ParentRef();
  }

  Volume& v_;
  TreeId tree_;
  const SendOptions& o_;
  StreamWriter& w_;
  uint32_t bs_;
  std::optional<BranchMeta> lower_;
  std::map<uint64_t, Stored> sent_;  // stored ranges sent, by first block
  // The parent's extent items by disk_start, once needed (parent_elsewhere).
  std::optional<std::unordered_multimap<uint64_t, Key>> parent_index_;
  SendStats st_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace

Result<SendStats> send_branch(Volume& v, TreeId tree, int fd, const SendOptions& o) {
  BranchMeta b = PLY_TRY(Filesystem::branch(v, tree));
  if (b.doomed) return Error::io(ENOENT, "the branch is being dropped");
  std::optional<BranchMeta> parent;
  if (o.parent) {
    parent = PLY_TRY(Filesystem::branch(v, *o.parent));
    if (parent->doomed) return Error::io(ENOENT, "the parent is being dropped");
    if (parent->tree == tree) return Error::invalid("a branch cannot be sent against itself");
    if (std::all_of(parent->uuid.begin(), parent->uuid.end(), [](uint8_t x) { return x == 0; }))
      return Error::invalid("\"" + shown(parent->name) +
                            "\" has no uuid (written before uuids): it cannot be a parent");
  }
  std::optional<BranchMeta> lower;
  {
    auto t = PLY_TRY(v.begin());
    TreeInfo ti = PLY_TRY(t.tree_info(tree));
    if (b.parent.v && ti.cloned_from != b.parent) lower = PLY_TRY(Filesystem::branch(t, b.parent));
  }
  disk::StreamHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version.set(disk::kStreamVersion);
  h.flags.set((parent ? disk::kStreamIncremental : 0) | (o.zstd_level > 0 ? disk::kStreamZstd : 0));
  h.block_size.set(v.block_size());
  std::memcpy(h.uuid, b.uuid.data(), 16);
  if (parent) std::memcpy(h.parent_uuid, parent->uuid.data(), 16);
  h.checksum.set(xxh3(&h, 56));
  StreamWriter w(fd, o.zstd_level);
  PLY_CHECK(w.header(h));
  Sender s(v, tree, o, w);
  s.set_lower(lower);
  PLY_CHECK(s.run(b, parent));
  return s.stats();
}

// ---------------------------------------------------------------- receive

namespace {

class Receiver {
 public:
  Receiver(Volume& v, const ReceiveOptions& o, StreamReader& r) : v_(v), o_(o), r_(r), bs_(v.block_size()) {}

  Result<Received> run() {
    const disk::StreamHeader h = PLY_TRY(r_.header());
    if (h.block_size.get() != bs_)
      return Error::invalid("the stream's block size is " + std::to_string(h.block_size.get()) +
                            " bytes, this image's " + std::to_string(bs_) +
                            ": a branch is received by an image of the same block size");
    const bool incremental = h.flags.get() & disk::kStreamIncremental;
    if (incremental == nil(h.parent_uuid)) return bad_stream("the parent uuid does not match the header flags");
    auto first = PLY_TRY(r_.next());
    if (first.type != Rec::Branch || first.payload.size() != sizeof(disk::BranchRec))
      return bad_stream("it does not start with a BRANCH record");
    chain(first.sum);
    disk::BranchRec br;
    std::memcpy(&br, first.payload.data(), sizeof br);
    total_items_ = br.items.get();
    if (std::memcmp(br.info.uuid, h.uuid, 16) != 0) return bad_stream("the BRANCH record names another branch");
    if (br.info.magic.get() != disk::kFsMagic) return bad_stream("the BRANCH record holds no FsInfo");
    max_ino_ = br.max_ino.get();
    // The counter becomes max_ino + 1, which a superblock holds only below
    // 2^63 (format.md, superblock field checks): past it, the next commit
    // wrote a slot that recovery calls bad fields.
    if (max_ino_ >= (1ull << 63) - 1) return bad_stream("an inode number out of range");
    PLY_CHECK(start(h, br, incremental));
    auto r = apply();
    if (!r) {
      abandon();
      return r.error();
    }
    return std::move(out_);
  }

 private:
  void chain(uint64_t sum) { digest_ = StreamWriter::xxh3_chain(digest_, sum); }

  // The branch whose uuid, else received_uuid, is `u`; none for the nil
  // uuid (a tree written before uuids has one, every branch not received
  // has a nil received_uuid: neither identifies anything).
  Result<std::optional<BranchMeta>> by_uuid(Volume::Txn& t, const uint8_t* u) {
    std::optional<BranchMeta> hit;
    if (nil(u)) return hit;
    for (auto& b : PLY_TRY(Filesystem::branches(t))) {
      if (b.doomed) continue;
      if (std::memcmp(b.uuid.data(), u, 16) == 0) return std::optional<BranchMeta>(b);
      if (!hit && std::memcmp(b.received_uuid.data(), u, 16) == 0) hit = b;
    }
    return hit;
  }

  // The doomed tree the stream is applied to: an empty one, or a clone of
  // the parent (S1, S4).
  Result<void> start(const disk::StreamHeader& h, const disk::BranchRec& br, bool incremental) {
    std::string name = o_.name;
    if (name.empty()) {
      const char* n = reinterpret_cast<const char*>(br.info.name);
      name.assign(n, strnlen(n, sizeof br.info.name));
    }
    if (name.empty() || name.size() > 32) return Error::invalid("a branch name has 1 to 32 bytes");
    if (o_.check_name) PLY_CHECK(o_.check_name(name));
    auto t = PLY_TRY(v_.begin({.reserve_blocks = Filesystem::kCloneBlocks + Filesystem::kCreateBlocks}));
    if (PLY_TRY(Filesystem::find(t, name)))
      return Error::io(EEXIST, "a branch named \"" + shown(name) + "\" exists");
    if (auto mine = PLY_TRY(by_uuid(t, h.uuid)))
      return Error::io(EEXIST, "this image already holds the branch the stream carries: \"" +
                                   shown(mine->name) + "\"");
    TreeId lower{0};
    if (!nil(br.lower_uuid)) {
      auto l = PLY_TRY(by_uuid(t, br.lower_uuid));
      if (!l)
        return Error::io(ENOENT, "the stream's branch is a layer on branch " + hex_uuid(br.lower_uuid) +
                                     ", which this image does not hold: receive that branch first");
      lower = l->tree;
    }
    BranchMeta m;
    m.name = name;
    m.parent = lower;
    m.read_only = true;
    m.doomed = true;
    std::memcpy(m.received_uuid.data(), h.uuid, 16);
    if (incremental) {
      auto p = PLY_TRY(by_uuid(t, h.parent_uuid));
      if (!p)
        return Error::io(ENOENT, "the stream's parent " + hex_uuid(h.parent_uuid) +
                                     " is not on this image: send a full stream, or one against a "
                                     "snapshot this image has");
      if (p->tree == lower) return bad_stream("its parent is also the branch it lies on");
      out_.parent = p;
      parent_ = p->tree;
      m = PLY_TRY(Filesystem::clone(t, p->tree, m));
      tree_ = m.tree;
    } else {
      tree_ = PLY_TRY(t.create_tree(disk::kKindFs));
      disk::FsInfo fi{};
      fi.magic.set(disk::kFsMagic);
      fi.version.set(disk::kFsVersion);
      PLY_CHECK(write_info(t, tree_, fi));
      m.tree = tree_;
      PLY_CHECK(Filesystem::set_branch(t, m));
    }
    made_ = true;
    // The sender's own fields: the root, the creation time, the compression
    // default; ours: name, parent, flags, uuid, received uuid, no quota.
    disk::FsInfo fi = PLY_TRY(read_info(t, tree_));
    fi.root_ino = br.info.root_ino;
    fi.created_ns = br.info.created_ns;
    fi.compress = br.info.compress;
    fi.compress_level = br.info.compress_level;
    if (fi.compress) t.add_incompat(kIncompatCompress);
    PLY_CHECK(write_info(t, tree_, fi));
    t.advance_inode_numbers(max_ino_ + 1);
    out_.branch = PLY_TRY(Filesystem::branch(t, tree_));
    return ok();
  }

  // Drops what a failed receive made (S1).
  void abandon() {
    if (!made_) return;
    if (auto t = v_.begin({.for_delete = true, .reserve_blocks = 64}); t) (void)t->drop_tree(tree_);
    (void)v_.commit();
  }

  void report() {
    if (!o_.progress) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(50)) return;
    last_ = now;
    st_.stream_bytes = r_.bytes();
    o_.progress(st_);
  }

  Result<void> apply() {
    uint64_t since_commit = 0;
    for (;;) {
      auto rec = PLY_TRY(r_.next());
      st_.records++;
      if (rec.type == Rec::End) {
        PLY_CHECK(end(rec));
        break;
      }
      chain(rec.sum);
      std::span<const std::byte> p(rec.payload);
      switch (rec.type) {
        case Rec::Put: PLY_CHECK(put(p)); break;
        case Rec::Delete: PLY_CHECK(del(p)); break;
        case Rec::Extent: since_commit += PLY_TRY(extent(p)); break;
        case Rec::Shared: PLY_CHECK(shared(p)); break;
        case Rec::Branch: return bad_stream("a second BRANCH record");
        default: return bad_stream("record type " + std::to_string(uint32_t(rec.type)) + " is unknown");
      }
      // A large stream is built over several generations (S1: the tree is
      // doomed until the end), so that neither the dirty metadata nor the
      // data held for one commit grows without bound.
      if (since_commit >= (64u << 20) || (st_.records & 16383) == 0) {
        (void)PLY_TRY(v_.commit());
        since_commit = 0;
      }
      report();
    }
    PLY_CHECK(verify());
    PLY_CHECK(make_live());
    (void)PLY_TRY(v_.commit());
    out_.branch = PLY_TRY(Filesystem::branch(v_, tree_));
    out_.stats = st_;
    out_.stats.stream_bytes = r_.bytes();
    return ok();
  }

  Result<void> end(const StreamReader::Record& rec) {
    if (rec.payload.size() != sizeof(disk::EndRec)) return bad_stream("a malformed END record");
    disk::EndRec e;
    std::memcpy(&e, rec.payload.data(), sizeof e);
    if (e.records.get() != st_.records || e.items.get() != st_.items ||
        e.deleted.get() != st_.deleted || e.data_bytes.get() != st_.data_bytes || e.digest.get() != digest_)
      return bad_stream("its END record does not match the records before it");
    return r_.at_end();
  }

  Result<disk::ItemHead> head(std::span<const std::byte>& p, Volume::Txn& t,
                              std::optional<std::vector<std::byte>>& old) {
    auto h = PLY_TRY(take<disk::ItemHead>(p, "item"));
    const Key k{h.key_hi.get(), h.key_lo.get()};
    if (k == Key{0, 0}) return bad_stream("an item record for FsInfo");
    if (h.had_old > 1) return bad_stream("a malformed item record");
    // The sender sends each key once, in key order (a scan or a diff). A
    // key sent twice would let a later record replace or delete what an
    // earlier one put, freeing data that got_ still offers to SHARED
    // records (a reference taken on a free extent fails the volume).
    if (last_key_ && !(*last_key_ < k)) return bad_stream("item records out of key order, or a key sent twice");
    last_key_ = k;
    if (k.hi >= max_ino_ && k.hi != 0) return bad_stream("an item of an inode past the stream's range");
    if (k.hi == 0 && type_of(k) == ItemType::Orphan && off_of(k) >= max_ino_)
      return bad_stream("an orphan past the stream's range");
    old = PLY_TRY(t.get(tree_, k));
    // The parent here must hold exactly what the sender's parent held.
    if (bool(old) != bool(h.had_old) || (old && item_hash(k, *old) != h.old_hash.get()))
      return Error::io(ESTALE, "the stream does not apply to \"" +
                                   (out_.parent ? shown(out_.parent->name) : std::string("an empty branch")) +
                                   "\": its item " + std::to_string(k.hi) + "/" + std::to_string(k.lo) +
                                   " differs from the sender's parent (was it changed since it was received?)");
    return h;
  }

  // After a tree change that removed or replaced `old`: its extent
  // reference goes (btree.h, ValueRefs: after the change).
  Result<void> drop_old(Volume::Txn& t, Key k, const std::optional<std::vector<std::byte>>& old) {
    if (!old || !extent_key(k)) return ok();
    auto e = decode_extent(k, *old);
    if (!e) return ok();  // our own tree's item: the checks at the end report it
    if (e->disk_start) PLY_CHECK(t.dec_extent(BlockNo{e->disk_start}));
    return ok();
  }

  void note_features(Volume::Txn& t, Key k, std::span<const std::byte> v) {
    if (k.hi == 0) return;
    const auto ty = type_of(k);
    if (ty == ItemType::XattrValue) t.add_incompat(kIncompatLargeXattr);
    if (ty == ItemType::Xattr) t.add_incompat(kIncompatLargeXattr);  // may hold OUTLINE records
    if (ty == ItemType::Inode && v.size() >= sizeof(disk::Inode)) {
      const auto* d = reinterpret_cast<const disk::Inode*>(v.data());
      if (d->flags.get() & (disk::kInodeCompress | disk::kInodeNoCompress)) t.add_incompat(kIncompatCompress);
    }
  }

  Result<void> put(std::span<const std::byte> p) {
    auto t = PLY_TRY(v_.begin({.reserve_blocks = kOpBlocks}));
    std::optional<std::vector<std::byte>> old;
    auto h = PLY_TRY(head(p, t, old));
    const Key k{h.key_hi.get(), h.key_lo.get()};
    if (extent_key(k)) {
      auto e = decode_extent(k, p);
      if (!e) return bad_stream("an extent item that does not decode: " + e.error().message());
      if (!e->prealloc()) return bad_stream("a PUT record for an extent with data");
      // A preallocated range holds no data: its blocks are ours to allocate.
      Ext x = *e;
      x.disk_start = PLY_TRY(t.alloc_extent(x.nblocks)).v;
      x.disk_nblocks = x.nblocks;
      x.offset = 0;
      PLY_CHECK(put_extent(t, k, x, old));
      st_.prealloc_bytes += uint64_t(x.nblocks) * bs_;
      return ok();
    }
    if (p.size() > BTree::max_value_len(bs_)) return bad_stream("an item value longer than a tree holds");
    note_features(t, k, p);
    PLY_CHECK(t.put(tree_, k, p));
    PLY_CHECK(drop_old(t, k, old));
    st_.items++;
    return ok();
  }

  Result<void> del(std::span<const std::byte> p) {
    auto t = PLY_TRY(v_.begin({.for_delete = true, .reserve_blocks = kOpBlocks}));
    std::optional<std::vector<std::byte>> old;
    auto h = PLY_TRY(head(p, t, old));
    const Key k{h.key_hi.get(), h.key_lo.get()};
    if (!old || !p.empty()) return bad_stream("a DELETE record of a key its parent does not hold");
    PLY_CHECK(t.erase(tree_, k));
    PLY_CHECK(drop_old(t, k, old));
    st_.deleted++;
    return ok();
  }

  // Puts extent item `x` (ours) at `k`, holding one reference it took.
  Result<void> put_extent(Volume::Txn& t, Key k, const Ext& x, const std::optional<std::vector<std::byte>>& old) {
    if (x.compressed()) t.add_incompat(kIncompatCompress);
    auto val = encode_extent(x);
    if (auto r = t.put(tree_, k, val); !r) {
      (void)t.dec_extent(BlockNo{x.disk_start});
      return r.error();
    }
    PLY_CHECK(drop_old(t, k, old));
    st_.items++;
    return ok();
  }

  // The bytes of extent data written.
  Result<uint64_t> extent(std::span<const std::byte> p) {
    auto t = PLY_TRY(v_.begin({.reserve_blocks = kOpBlocks}));
    std::optional<std::vector<std::byte>> old;
    auto h = PLY_TRY(head(p, t, old));
    const Key k{h.key_hi.get(), h.key_lo.get()};
    auto er = PLY_TRY(take<disk::ExtentRec>(p, "extent"));
    if (!extent_key(k) || er.value_len.get() > p.size()) return bad_stream("a malformed EXTENT record");
    auto e = decode_extent(k, p.first(er.value_len.get()));
    if (!e) return bad_stream("an extent item that does not decode: " + e.error().message());
    if (e->prealloc()) return bad_stream("an EXTENT record for a preallocated range");
    auto data = p.subspan(er.value_len.get());
    const Stored s = stored_of(*e);
    if (data.size() != s.count * bs_) return bad_stream("an EXTENT record whose data does not fit its item");
    // S2: the data must be what the item's checksums say.
    for (uint64_t i = 0; i < s.count; i++)
      if (xxh3(data.subspan(i * bs_, bs_)) != e->csums[i])
        return bad_stream("the data of inode " + std::to_string(k.hi) + "'s extent at block " +
                          std::to_string(off_of(k)) + " fails its checksum");
    if (s.compressed) {
      // The frame must decode to what the item says (format.md#fs-compress).
      if (e->frame_bytes > data.size()) return bad_stream("a compressed extent longer than its blocks");
      std::vector<std::byte> ram(uint64_t(e->ram_blocks) * bs_);
      if (auto d = decompress_frame(data.first(e->frame_bytes), ram); !d)
        return bad_stream("a compressed extent that does not decode");
    }
    const BlockNo b = PLY_TRY(t.alloc_extent(s.count));
    if (auto w = v_.write_data(b, data); !w) {
      (void)t.dec_extent(b);
      return w.error();
    }
    Ext x = *e;
    x.disk_start = b.v;
    if (s.compressed) {
      x.disk_nblocks = s.count;  // offset counts decoded blocks: kept
    } else {
      x.disk_nblocks = s.count;
      x.offset = 0;
    }
    PLY_CHECK(put_extent(t, k, x, old));
    got_[s.first] = Got{s.count, s.compressed, b.v, std::vector<uint64_t>(e->csums), e->frame_bytes, e->ram_blocks};
    st_.extents++;
    st_.data_bytes += data.size();
    return data.size();
  }

  Result<void> shared(std::span<const std::byte> p) {
    auto t = PLY_TRY(v_.begin({.reserve_blocks = kOpBlocks}));
    std::optional<std::vector<std::byte>> old;
    auto h = PLY_TRY(head(p, t, old));
    const Key k{h.key_hi.get(), h.key_lo.get()};
    auto sr = PLY_TRY(take<disk::SharedRec>(p, "shared"));
    if (!extent_key(k) || sr.value_len.get() != p.size() || sr.source > 2)
      return bad_stream("a malformed SHARED record");
    auto e = decode_extent(k, p);
    if (!e) return bad_stream("an extent item that does not decode: " + e.error().message());
    if (e->prealloc()) return bad_stream("a SHARED record for a preallocated range");
    const Stored s = stored_of(*e);
    Ext x = *e;
    if (sr.source == 0) {
      // Data an earlier EXTENT record of this stream carried.
      auto it = got_.upper_bound(s.first);
      if (it == got_.begin()) return bad_stream("a SHARED record refers to data the stream never sent");
      --it;
      const Got& g = it->second;
      const uint64_t at = s.first - it->first;
      if (g.compressed != s.compressed || at + s.count > g.count || (s.compressed && at != 0))
        return bad_stream("a SHARED record refers to data the stream never sent");
      // A frame is shared whole, as the EXTENT that carried it said it
      // decodes (S2): its length and size are not the SHARED record's to say.
      if (s.compressed && (s.count != g.count || e->frame_bytes != g.frame_bytes || e->ram_blocks != g.ram_blocks))
        return bad_stream("a SHARED record describes its frame otherwise than the data the stream sent");
      for (uint64_t i = 0; i < s.count; i++)
        if (e->csums[i] != g.csums[at + i]) return bad_stream("a SHARED record's checksums differ from its data");
      x.disk_start = g.local;
      x.disk_nblocks = g.count;
      if (!s.compressed) x.offset = at;
    } else {
      // What the parent here maps: at the same place (source 1), or any
      // Extent item of it (source 2, a reflink of the parent's data) (S3).
      if (!parent_.v) return bad_stream("a SHARED record refers to a parent in a full stream");
      const Key pk{sr.parent_hi.get(), sr.parent_lo.get()};
      if (!extent_key(pk)) return bad_stream("a SHARED record names an item that is not an extent");
      if (sr.source == 1 && pk.hi != k.hi) return bad_stream("a SHARED record names another file's extent");
      auto pv = PLY_TRY(t.get(parent_, pk));
      if (!pv) return Error::io(ESTALE, "the stream refers to an extent its parent here does not hold");
      Ext pe = PLY_TRY(decode_extent(pk, *pv));
      const uint64_t delta = sr.delta.get();
      if (pe.prealloc() || pe.compressed() != s.compressed)
        return Error::io(ESTALE, "the stream refers to an extent its parent here holds otherwise");
      if (s.compressed) {
        if (pe.csums != e->csums || pe.frame_bytes != e->frame_bytes || pe.ram_blocks != e->ram_blocks)
          return Error::io(ESTALE, "the stream refers to a compressed extent its parent here holds otherwise");
        x.disk_start = pe.disk_start;
        x.disk_nblocks = pe.disk_nblocks;
      } else {
        if (delta > pe.nblocks || e->nblocks > pe.nblocks - delta)
          return bad_stream("a SHARED record maps past its parent's extent");
        for (uint32_t i = 0; i < e->nblocks; i++)
          if (pe.csums[delta + i] != e->csums[i])
            return Error::io(ESTALE, "the stream refers to data its parent here does not hold");
        x.disk_start = pe.disk_start;
        x.disk_nblocks = pe.disk_nblocks;
        x.offset = pe.offset + delta;
      }
    }
    PLY_CHECK(t.inc_extent(BlockNo{x.disk_start}));
    PLY_CHECK(put_extent(t, k, x, old));
    st_.shared++;
    return ok();
  }

  // S2: the tree passes fsck's filesystem checks before it is named.
  Result<void> verify() {
    (void)PLY_TRY(v_.commit());
    auto problems = check_filesystem_tree(v_, tree_);
    if (!problems.empty())
      return Error::corrupt(Error::kNoBlock, "the received branch fails fsck's checks (" +
                                                 problems.front().code + ": " + problems.front().message +
                                                 "): nothing was received");
    return ok();
  }

  // The one transaction that names the branch (S1).
  Result<void> make_live() {
    auto t = PLY_TRY(v_.begin({.reserve_blocks = Filesystem::kSetBranchBlocks * 2 + 64}));
    BranchMeta m = PLY_TRY(Filesystem::branch(t, tree_));
    if (PLY_TRY(Filesystem::find(t, m.name)))
      return Error::io(EEXIST, "a branch named \"" + shown(m.name) + "\" exists");
    m.doomed = false;
    return Filesystem::set_branch(t, m);
  }

  struct Got {
    uint64_t count = 0;
    bool compressed = false;
    uint64_t local = 0;
    std::vector<uint64_t> csums;
    uint32_t frame_bytes = 0, ram_blocks = 0;  // compressed: the frame as its EXTENT said it decodes
  };

  Volume& v_;
  const ReceiveOptions& o_;
  StreamReader& r_;
  uint32_t bs_;
  TreeId tree_{0}, parent_{0};
  bool made_ = false;
  uint64_t max_ino_ = 0, total_items_ = 0, digest_ = 0;
  std::optional<Key> last_key_;  // the last item record's key
  std::map<uint64_t, Got> got_;  // sender's stored first block -> ours
  ReceiveStats st_;
  Received out_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace

Result<Received> receive_branch(Volume& v, int fd, const ReceiveOptions& o) {
  if (v.read_only()) return Error::io(EROFS, "the image is open read-only");
  StreamReader r(fd);
  Receiver rc(v, o, r);
  return rc.run();
}

}  // namespace plyfs
