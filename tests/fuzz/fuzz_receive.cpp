// The receive fuzzer: its input is a send stream (format.md#send-stream,
// fs/send.h), applied with receive_branch to a small image that already
// holds a received branch, "s1" (so that incremental streams against s1
// apply, and layers on it). Nothing may crash, hang or leak, and after every
// input (S1, S2):
//   - a stream cannot fail the volume (turn it read-only): a forged stream
//     is refused, the image stays writable;
//   - a refused stream leaves the branches and the blocks in use as they
//     were; an accepted one adds one branch;
//   - the image is clean: verify_image (every tree, the space tree's
//     reference counts: no leaked or doubly referenced block) and the
//     filesystem checks with data (check_filesystems(dev, true): every data
//     block against its checksum, every frame decoded), so that a received
//     branch never holds data its items do not vouch for.
// PLYFS_RECV_VERBOSE=1 prints what became of each input.
// The receiver's base stream is tests/fuzz/corpus-recv/base.hex (a full
// stream of "s1"); it and the seeds come from one source image
// (recv_corpus(), written by struct_fuzz_tests "[.corpus-recv]"), since
// branch uuids and times differ on every build of it.
//
// The mutator (recv_mutate) takes a stream apart into its header and
// records (decompressing a zstd stream), changes records (a field of an
// item head, an extent value or a SHARED reference set to an edge value, a
// record duplicated, dropped, moved or retyped, a payload byte-mutated, a
// key sent twice with the right old_hash), then puts it back together with
// fresh sequence numbers, record checksums, END counts and digest chain
// (and compresses it again), so that mutations reach the receiver's
// checks behind the checksums instead of dying on them.
#include <sys/mman.h>
#include <unistd.h>
#include <zstd.h>

#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "blockdev/test_devices.h"
#include "commit/verify.h"
#include "fs/check.h"
#include "fs/fs.h"
#include "fs/items.h"
#include "fs/send.h"
#include "fuzz_image.h"
#include "snap/snap.h"
#include "union/view.h"
#include "util/checksum.h"

#ifndef PLYFS_RECV_BASE
#define PLYFS_RECV_BASE "tests/fuzz/corpus-recv/base.hex"
#endif

namespace plyfs::fuzz {

namespace {

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "fuzz_receive: %s\n", why.c_str());
  __builtin_trap();
}

// The value of a setup step that cannot fail.
template <class T>
T setup(Result<T> r, const char* what) {
  if (!r) fail(std::string(what) + ": " + r.error().message());
  return std::move(*r);
}
inline void setup(Result<void> r, const char* what) {
  if (!r) fail(std::string(what) + ": " + r.error().message());
}
#define RECV_SETUP(expr) setup((expr), #expr)
#define RECV_CHECK(expr) setup((expr), #expr)

VolumeOptions rw_options() {
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.movers = fs_movers();
  vo.cache_bytes = 2 << 20;
  return vo;
}

int memfd_of(std::span<const uint8_t> b) {
  const int fd = memfd_create("stream", 0);
  if (fd < 0) fail("memfd_create");
  size_t done = 0;
  while (done < b.size()) {
    const ssize_t n = ::write(fd, b.data() + done, b.size() - done);
    if (n <= 0) fail("write to memfd");
    done += size_t(n);
  }
  if (lseek(fd, 0, SEEK_SET) != 0) fail("lseek");
  return fd;
}

std::vector<uint8_t> bytes_of_fd(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) fail("fstat");
  std::vector<uint8_t> b(size_t(st.st_size));
  if (pread(fd, b.data(), b.size(), 0) != ssize_t(b.size())) fail("pread");
  return b;
}

std::vector<uint8_t> load_hex(const char* path) {
  std::ifstream in(path);
  if (!in) fail(std::string("cannot read the base stream ") + path);
  std::string line, hex;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    for (char c : line)
      if (std::isxdigit(static_cast<unsigned char>(c))) hex += c;
  }
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(uint8_t(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

Result<void> name_rule(const std::string& n) { return check_branch_name(n); }

ReceiveOptions recv_options() {
  ReceiveOptions o;
  o.check_name = name_rule;  // as plyctl receive: the names fsck accepts
  return o;
}

std::unique_ptr<MemDevice> build_recv_base() {
  const char* path = std::getenv("PLYFS_RECV_BASE");
  const auto stream = load_hex(path ? path : PLYFS_RECV_BASE);
  auto dev = std::make_unique<MemDevice>(8ull << 20);
  FormatOptions fo;
  fo.uuid = {0x52, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
  fo.time_ns = 1;
  RECV_CHECK(format_filesystem(*dev, fo, FsCreateOptions{}));
  {
    auto vol = RECV_SETUP(Volume::open(*dev, rw_options()));
    const int fd = memfd_of(stream);
    (void)RECV_SETUP(receive_branch(*vol, fd, recv_options()));
    ::close(fd);
    RECV_CHECK(vol->close());
  }
  return dev;
}

// ---------------------------------------------------------------- streams

// The record types of send.cpp (format.md#send-stream).
enum : uint32_t { kBranch = 1, kPut = 2, kDelete = 3, kExtent = 4, kShared = 5, kEnd = 6 };
constexpr uint32_t kFlagZstd = 2;

uint64_t chain(uint64_t acc, uint64_t sum) {
  const uint64_t both[2] = {acc, sum};
  return xxh3(both, sizeof both);
}

template <class T>
T get(const std::vector<uint8_t>& p, size_t at) {
  T x{};
  if (at + sizeof x <= p.size()) std::memcpy(&x, p.data() + at, sizeof x);
  return x;
}
template <class T>
void set(std::vector<uint8_t>& p, size_t at, T x) {
  if (at + sizeof x <= p.size()) std::memcpy(p.data() + at, &x, sizeof x);
}

// A stream taken apart: header, records (END left out: build() makes it).
struct Stream {
  std::vector<uint8_t> header;
  std::vector<std::pair<uint32_t, std::vector<uint8_t>>> recs;
  bool end_kept = false;            // END as it was, not recomputed
  std::vector<uint8_t> end_payload;

  bool zstd() const { return header.size() >= 16 && (get<uint32_t>(header, 12) & kFlagZstd); }

  static std::optional<std::vector<uint8_t>> unzstd(std::span<const uint8_t> in) {
    ZSTD_DStream* z = ZSTD_createDStream();
    std::vector<uint8_t> out;
    std::vector<uint8_t> buf(ZSTD_DStreamOutSize());
    ZSTD_inBuffer i{in.data(), in.size(), 0};
    bool ok = true;
    while (i.pos < i.size) {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      const size_t r = ZSTD_decompressStream(z, &o, &i);
      if (ZSTD_isError(r)) {
        ok = false;
        break;
      }
      out.insert(out.end(), buf.begin(), buf.begin() + long(o.pos));
      if (out.size() > (4u << 20)) {
        ok = false;
        break;
      }
      if (o.pos == 0 && r == 0) break;
    }
    ZSTD_freeDStream(z);
    if (!ok) return std::nullopt;
    return out;
  }

  static std::vector<uint8_t> zstd_of(const std::vector<uint8_t>& in) {
    std::vector<uint8_t> out(ZSTD_compressBound(in.size()));
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    const size_t n = ZSTD_compress2(c, out.data(), out.size(), in.data(), in.size());
    ZSTD_freeCCtx(c);
    if (ZSTD_isError(n)) return {};
    out.resize(n);
    return out;
  }

  // Whether `in` parses as a header and whole records.
  bool parse(std::span<const uint8_t> in) {
    if (in.size() < 64) return false;
    header.assign(in.begin(), in.begin() + 64);
    std::vector<uint8_t> body;
    if (zstd()) {
      auto b = unzstd(in.subspan(64));
      if (!b) return false;
      body = std::move(*b);
    } else {
      body.assign(in.begin() + 64, in.end());
    }
    size_t at = 0;
    while (at + 16 <= body.size()) {
      const uint32_t type = get<uint32_t>(body, at), len = get<uint32_t>(body, at + 4);
      if (len > body.size() || at + 16 + len + 8 > body.size()) return false;
      std::vector<uint8_t> p(body.begin() + long(at) + 16, body.begin() + long(at) + 16 + len);
      at += 16 + len + 8;
      if (type == kEnd) end_payload = std::move(p);
      else recs.emplace_back(type, std::move(p));
    }
    return at == body.size() && !recs.empty();
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> body;
    uint64_t seq = 0, digest = 0, items = 0, deleted = 0, data = 0;
    auto put = [&](uint32_t type, const std::vector<uint8_t>& p) {
      const size_t at = body.size();
      body.resize(at + 16 + p.size() + 8);
      const uint32_t len = uint32_t(p.size());
      std::memcpy(body.data() + at, &type, 4);
      std::memcpy(body.data() + at + 4, &len, 4);
      std::memcpy(body.data() + at + 8, &seq, 8);
      if (!p.empty()) std::memcpy(body.data() + at + 16, p.data(), p.size());
      const uint64_t sum = xxh3(body.data() + at, 16 + p.size());
      std::memcpy(body.data() + at + 16 + p.size(), &sum, 8);
      seq++;
      return sum;
    };
    for (const auto& [type, p] : recs) {
      digest = chain(digest, put(type, p));
      if (type == kPut || type == kExtent || type == kShared) items++;
      if (type == kDelete) deleted++;
      if (type == kExtent && p.size() >= 40) {
        const uint32_t vlen = get<uint32_t>(p, 32);
        if (p.size() >= 40 + uint64_t(vlen)) data += p.size() - 40 - vlen;
      }
    }
    if (end_kept) {
      put(kEnd, end_payload);
    } else {
      std::vector<uint8_t> end(40);
      const uint64_t f[5] = {seq, items, deleted, data, digest};
      std::memcpy(end.data(), f, 40);
      put(kEnd, end);
    }
    std::vector<uint8_t> out = header;
    if (zstd()) {
      auto z = zstd_of(body);
      out.insert(out.end(), z.begin(), z.end());
    } else {
      out.insert(out.end(), body.begin(), body.end());
    }
    return out;
  }
};

void seal_header(std::vector<uint8_t>& h) {
  if (h.size() < 64) return;
  const uint64_t sum = xxh3(h.data(), 56);
  std::memcpy(h.data() + 56, &sum, 8);
}

uint64_t pick(std::mt19937_64& r, uint64_t was) {
  static const uint64_t edges[] = {0, 1, 2, 3, 4, 7, 8, 31, 32, 33, 64, 255, 256, 4095, 4096, 4097, 65535,
                                   1ull << 31, 1ull << 32, (1ull << 32) - 1, 1ull << 56, 1ull << 63,
                                   ~0ull, ~0ull - 1, ~0ull >> 1};
  switch (r() % 6) {
    case 0: return edges[r() % std::size(edges)];
    case 1: return was + 1;
    case 2: return was - 1;
    case 3: return was ^ (1ull << (r() % 64));
    case 4: return was * 2;
    default: return r();
  }
}

// Key and value of an item record (PUT: the rest; EXTENT: value_len bytes
// after ExtentRec; SHARED: after SharedRec), as offsets into the payload.
bool value_span(uint32_t type, const std::vector<uint8_t>& p, size_t& at, size_t& len) {
  if (p.size() < 32) return false;
  if (type == kPut) {
    at = 32, len = p.size() - 32;
    return true;
  }
  if (type == kExtent && p.size() >= 40) {
    at = 40, len = std::min<size_t>(get<uint32_t>(p, 32), p.size() - 40);
    return true;
  }
  if (type == kShared && p.size() >= 64) {
    at = 64, len = p.size() - 64;
    return true;
  }
  return false;
}

// ItemHead.old_hash as the sender computes it (send.cpp, item_hash).
uint64_t old_hash(Key k, std::span<const std::byte> v) {
  if (k.hi != 0 && fsitems::type_of(k) == disk::ItemType::Extent) {
    if (auto e = fsitems::decode_extent(k, v)) {
      e->disk_start = 0;
      if (!e->compressed()) {
        e->disk_nblocks = 0;
        e->offset = 0;
      }
      const auto n = fsitems::encode_extent(*e);
      return xxh3(std::span<const std::byte>(n));
    }
  }
  return xxh3(v);
}

// One structured change; false if none applied.
bool mutate_once(Stream& s, std::mt19937_64& r, size_t (*byte_mutate)(uint8_t*, size_t, size_t)) {
  auto& recs = s.recs;
  const size_t n = recs.size();
  if (n == 0) return false;
  const size_t i = r() % n;
  auto& [type, p] = recs[i];
  switch (r() % 12) {
    case 0: {  // a field of the item head: key, old_hash, had_old
      if (p.size() < 32) return false;
      const int f = int(r() % 4);
      if (f == 0) set<uint64_t>(p, 0, pick(r, get<uint64_t>(p, 0)));
      if (f == 1) set<uint64_t>(p, 8, pick(r, get<uint64_t>(p, 8)));
      if (f == 2) set<uint64_t>(p, 16, pick(r, get<uint64_t>(p, 16)));
      if (f == 3) p[24] = uint8_t(r() % 3);
      return true;
    }
    case 1:
    case 2: {  // a field of an extent value (send.cpp's records carry disk::Extent)
      size_t at, len;
      if (!value_span(type, p, at, len) || len < sizeof(disk::Extent)) return false;
      // disk::Extent: disk_start, disk_nblocks, offset (le64), nblocks (le32),
      // compression, flags, reserved; then a frame head (frame_bytes,
      // ram_blocks) when compressed, then the checksums.
      static const std::pair<size_t, size_t> fields[] = {{0, 8}, {8, 8}, {16, 8}, {24, 4}, {28, 1},
                                                         {29, 1}, {32, 4}, {36, 4}, {40, 8}};
      const auto [off, w] = fields[r() % std::size(fields)];
      if (at + off + w > at + len) return false;
      if (w == 8) set<uint64_t>(p, at + off, pick(r, get<uint64_t>(p, at + off)));
      if (w == 4) set<uint32_t>(p, at + off, uint32_t(pick(r, get<uint32_t>(p, at + off))));
      if (w == 1) p[at + off] = uint8_t(pick(r, p[at + off]));
      return true;
    }
    case 3: {  // a SHARED reference: source, parent key, delta
      if (type != kShared || p.size() < 64) return false;
      const int f = int(r() % 4);
      if (f == 0) p[36] = uint8_t(r() % 3);
      if (f == 1) set<uint64_t>(p, 40, pick(r, get<uint64_t>(p, 40)));
      if (f == 2) set<uint64_t>(p, 48, pick(r, get<uint64_t>(p, 48)));
      if (f == 3) set<uint64_t>(p, 56, pick(r, get<uint64_t>(p, 56)));
      return true;
    }
    case 4: {  // EXTENT data changed, its checksums made right again
      if (type != kExtent || p.size() < 40) return false;
      const uint32_t vlen = get<uint32_t>(p, 32);
      if (p.size() < 40 + uint64_t(vlen)) return false;
      const size_t data = 40 + vlen, nblocks = (p.size() - data) / 4096;
      if (!nblocks) return false;
      const size_t b = r() % nblocks;
      p[data + b * 4096 + r() % 4096] ^= uint8_t(1 + r() % 255);
      // Checksums: the last nblocks le64s of the value, one per block.
      if (vlen >= 8 * nblocks) {
        const uint64_t sum = xxh3(p.data() + data + b * 4096, 4096);
        set<uint64_t>(p, 40 + vlen - 8 * (nblocks - b), sum);
      }
      return true;
    }
    case 5: {  // a record twice
      if (type == kBranch) return false;
      const size_t to = 1 + r() % n;
      auto copy = recs[i];
      recs.insert(recs.begin() + long(to), std::move(copy));
      return true;
    }
    case 6:  // a record dropped
      if (n < 2) return false;
      recs.erase(recs.begin() + long(i));
      return true;
    case 7: {  // two records swapped
      const size_t j = r() % n;
      std::swap(recs[i], recs[j]);
      return true;
    }
    case 8:  // another type
      type = uint32_t(1 + r() % 6);
      return true;
    case 9: {  // the payload byte-mutated by libFuzzer (a short one whole)
      if (p.empty() || !byte_mutate) return false;
      const size_t at = p.size() > 256 ? r() % (p.size() - 128) : 0;
      const size_t len = std::min<size_t>(p.size() - at, 256);
      std::vector<uint8_t> piece(p.begin() + long(at), p.begin() + long(at + len));
      piece.resize(len + 32);
      const size_t got = byte_mutate(piece.data(), len, piece.size());
      piece.resize(got);
      p.erase(p.begin() + long(at), p.begin() + long(at + len));
      p.insert(p.begin() + long(at), piece.begin(), piece.end());
      return true;
    }
    case 10: {  // the same key again, as a replacement or a DELETE with the right old_hash
      size_t at, len;
      if (type == kBranch || !value_span(type, p, at, len)) return false;
      Key k{get<uint64_t>(p, 0), get<uint64_t>(p, 8)};
      const uint64_t h = old_hash(k, {reinterpret_cast<const std::byte*>(p.data() + at), len});
      std::vector<uint8_t> again;
      uint32_t t;
      if (r() % 2) {
        again.assign(p.begin(), p.begin() + 32);
        t = kDelete;
      } else {
        const size_t j = r() % n;
        if (recs[j].first == kBranch || recs[j].second.size() < 32) return false;
        again = recs[j].second;
        std::memcpy(again.data(), p.data(), 16);  // its key
        t = recs[j].first;
      }
      set<uint64_t>(again, 16, h);
      again[24] = 1;
      recs.insert(recs.begin() + long(i) + 1, {t, std::move(again)});
      return true;
    }
    default: {  // the header or BRANCH: flags, parent uuid, block size, max_ino
      if (r() % 2) {
        const int f = int(r() % 4);
        if (f == 0) set<uint32_t>(s.header, 12, get<uint32_t>(s.header, 12) ^ uint32_t(1 + r() % 3));
        if (f == 1) s.header[40 + r() % 16] ^= uint8_t(1 + r() % 255);
        if (f == 2) std::memset(s.header.data() + 40, 0, 16);
        if (f == 3) set<uint32_t>(s.header, 16, uint32_t(pick(r, get<uint32_t>(s.header, 16))));
        seal_header(s.header);
        return true;
      }
      if (recs[0].first != kBranch || recs[0].second.size() < 176) return false;
      auto& b = recs[0].second;
      // BranchRec: FsInfo (128), lower_uuid (16), max_ino, items, data_bytes.
      const int f = int(r() % 3);
      if (f == 0) set<uint64_t>(b, 144, pick(r, get<uint64_t>(b, 144)));
      if (f == 1) b[128 + r() % 16] ^= uint8_t(1 + r() % 255);
      if (f == 2) b[r() % 128] ^= uint8_t(1 + r() % 255);
      return true;
    }
  }
}

}  // namespace

const MemDevice& recv_base() {
  static const std::unique_ptr<MemDevice> base = build_recv_base();
  return *base;
}

void run_one_recv(const uint8_t* data, size_t size) {
  auto dev = recv_base().clone();
  size_t nb;
  uint64_t used;
  bool got = false;
  {
    auto vol = RECV_SETUP(Volume::open(*dev, rw_options()));
    nb = RECV_SETUP(Filesystem::branches(*vol)).size();
    used = vol->space_stats().used_blocks;
    const int fd = memfd_of({data, size});
    auto r = receive_branch(*vol, fd, recv_options());
    ::close(fd);
    if (vol->failure()) fail("the stream failed the volume: " + vol->failure()->message());
    if (!r) {
      static const int clean[] = {EBADMSG, ESTALE, ENOENT, EEXIST, EINVAL, EUCLEAN, ENOSPC, EOPNOTSUPP, EFBIG};
      if (std::find(std::begin(clean), std::end(clean), r.error().code) == std::end(clean))
        fail("a refusal with errno " + std::to_string(r.error().code) + ": " + r.error().message());
    }
    got = bool(r);
    static const bool verbose = std::getenv("PLYFS_RECV_VERBOSE");
    if (verbose)
      std::fprintf(stderr, "fuzz_receive: %s\n",
                   r ? ("received " + r->branch.name + (r->parent ? " on " + r->parent->name : "")).c_str()
                     : ("refused: " + r.error().message()).c_str());
    (void)RECV_SETUP(vol->commit());
    const size_t now = RECV_SETUP(Filesystem::branches(*vol)).size();
    if (now != nb + (got ? 1 : 0))
      fail("branches: " + std::to_string(nb) + " before, " + std::to_string(now) + " after");
    if (!got && vol->space_stats().used_blocks != used)
      fail("a refused stream left " + std::to_string(vol->space_stats().used_blocks - used) + " blocks in use");
    if (got) read_all_fs(*vol);
    RECV_CHECK(vol->close());
  }
  VerifyOptions vo;
  vo.kinds = fs_kinds();
  vo.cache_bytes = 2 << 20;
  auto rep = RECV_SETUP(verify_image(*dev, vo));
  if (!rep.clean()) fail("the image is not clean after the input: " + rep.summary());
  for (const auto& p : check_filesystems(*dev, true))
    fail(std::string(got ? "the received branch" : "the image") + " fails the filesystem checks: " + p.code +
         ": " + p.message);
}

size_t recv_mutate(uint8_t* data, size_t size, size_t max_size, unsigned seed,
                   size_t (*byte_mutate)(uint8_t*, size_t, size_t)) {
  std::mt19937_64 r(seed);
  Stream s;
  if (r() % 4 == 0 || !s.parse({data, size})) return byte_mutate(data, size, max_size);
  const int k = 1 + int(r() % 3);
  bool any = false;
  for (int i = 0; i < k; i++) any |= mutate_once(s, r, byte_mutate);
  if (!any) return byte_mutate(data, size, max_size);
  s.end_kept = r() % 16 == 0 && !s.end_payload.empty();
  const auto out = s.build();
  if (out.size() > max_size) return byte_mutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

// ---------------------------------------------------------------- seeds

namespace {

std::vector<std::byte> fill(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i++) v[i] = std::byte((i * 13 + size_t(seed) * 7 + (i >> 8)) & 0xff);
  return v;
}

std::vector<std::byte> text(size_t n, int seed) {
  static const char* const vocab[] = {"plyfs ", "stream ", "receive ", "extent ", "the ", "of ", "a\n", "zstd "};
  std::vector<std::byte> v;
  uint64_t x = uint64_t(seed) * 0x9e3779b97f4a7c15ull + 1;
  while (v.size() < n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    for (const char* c = vocab[x >> 61]; *c; c++) v.push_back(std::byte(*c));
  }
  v.resize(n);
  return v;
}

}  // namespace

// A source image and its streams: s1 (files with holes, a preallocated
// range, hard links, a symlink, a FIFO, a device, xattrs small and out of
// line, a compressed file), s2 (partial overwrites of s1's extents, a
// reflinked copy, an unlink, xattr changes), a layer "top" on s1.
std::vector<RecvSeed> recv_corpus() {
  MemDevice dev(32ull << 20);
  RECV_CHECK(format_filesystem(dev, FormatOptions{}, FsCreateOptions{}));
  auto vol = RECV_SETUP(Volume::open(dev, rw_options()));
  const TreeId main = RECV_SETUP(Filesystem::default_tree(*vol));
  uint64_t four, z, small;
  {
    auto fs = RECV_SETUP(Filesystem::open(*vol, main));
    const uint64_t root = fs->root();
    const uint64_t d = RECV_SETUP(fs->mkdir(root, "d", 0755, 1, 2)).ino;
    small = RECV_SETUP(fs->mknod(root, "small", S_IFREG | 0640, 0, 3, 4)).ino;
    RECV_CHECK(fs->write(small, 0, fill(300, 1)));
    RECV_CHECK(fs->setxattr(small, "user.a", fill(20, 2), 0));
    const uint64_t holes = RECV_SETUP(fs->mknod(root, "holes", S_IFREG | 0644, 0, 0, 0)).ino;
    RECV_CHECK(fs->write(holes, 0, fill(4096, 3)));
    RECV_CHECK(fs->write(holes, 3 * 4096, fill(100, 4)));  // blocks 1-2 a hole
    RECV_CHECK(fs->fallocate(holes, FALLOC_FL_KEEP_SIZE, 6 * 4096, 2 * 4096));
    RECV_CHECK(fs->link(holes, d, "hard"));
    four = RECV_SETUP(fs->mknod(d, "four", S_IFREG | 0644, 0, 0, 0)).ino;
    RECV_CHECK(fs->write(four, 0, fill(4 * 4096, 5)));
    RECV_CHECK(fs->setxattr(d, "user.big", fill(4500, 6), 0));  // out of line
    z = RECV_SETUP(fs->mknod(root, "z", S_IFREG | 0644, 0, 0, 0)).ino;
    RECV_CHECK(fs->set_fsflags(z, FS_COMPR_FL));
    RECV_CHECK(fs->write(z, 0, text(12 * 4096 + 50, 7)));
    (void)RECV_SETUP(fs->symlink(d, "sym", "../small", 0, 0));
    (void)RECV_SETUP(fs->mknod(d, "fifo", S_IFIFO | 0600, 0, 0, 0));
    (void)RECV_SETUP(fs->mknod(d, "null", S_IFCHR | 0666, makedev(1, 3), 0, 0));
    RECV_CHECK(fs->release_all());
  }
  const auto s1 = RECV_SETUP(snapshot(*vol, main, "s1"));
  {
    auto fs = RECV_SETUP(Filesystem::open(*vol, main));
    const uint64_t root = fs->root();
    RECV_CHECK(fs->write(four, 4096 + 10, fill(100, 8)));  // splits four's extent: SHARED from s1
    RECV_CHECK(fs->write(z, 2 * 4096, fill(64, 9)));       // inside z's frame
    const uint64_t copy = RECV_SETUP(fs->mknod(root, "copy", S_IFREG | 0644, 0, 0, 0)).ino;
    (void)RECV_SETUP(fs->copy_range(four, 0, copy, 0, 4 * 4096));  // reflinks: SHARED in the stream and from s1
    const uint64_t holes = RECV_SETUP(fs->lookup(root, "holes")).ino;
    const uint64_t copy2 = RECV_SETUP(fs->mknod(root, "copy2", S_IFREG | 0644, 0, 0, 0)).ino;
    (void)RECV_SETUP(fs->copy_range(holes, 0, copy2, 4096, 4096));  // s1's data elsewhere: SHARED source 2
    RECV_CHECK(fs->unlink(root, "small"));
    RECV_CHECK(fs->setxattr(four, "user.new", fill(30, 10), 0));
    (void)RECV_SETUP(fs->mkdir(root, "e", 0700, 0, 0));
    RECV_CHECK(fs->release_all());
  }
  const auto s2 = RECV_SETUP(snapshot(*vol, main, "s2"));
  FsCreateOptions lo;
  lo.name = "top";
  lo.parent = s1.frozen.tree;
  const TreeId top = RECV_SETUP(Filesystem::create(*vol, lo));
  {
    auto fs = RECV_SETUP(Filesystem::open(*vol, top));
    const uint64_t f = RECV_SETUP(fs->mknod(fs->root(), "above", S_IFREG | 0644, 0, 0, 0)).ino;
    RECV_CHECK(fs->write(f, 0, fill(5000, 11)));
    RECV_CHECK(fs->whiteout(fs->root(), "small"));
    RECV_CHECK(fs->release_all());
  }
  RECV_CHECK(vol->commit());
  auto send = [&](TreeId t, std::optional<TreeId> parent, int zstd) {
    SendOptions so;
    so.parent = parent;
    so.zstd_level = zstd;
    const int fd = memfd_create("stream", 0);
    (void)RECV_SETUP(send_branch(*vol, t, fd, so));
    auto b = bytes_of_fd(fd);
    ::close(fd);
    return b;
  };
  const std::string from = "seed (struct_fuzz_tests \"[.corpus-recv]\", fuzz_receive.cpp): ";
  return {
      {"base.hex", from + "a full stream of s1, which the receiver's base image holds (fuzz_receive.cpp loads it)",
       send(s1.frozen.tree, std::nullopt, 0)},
      {"full.hex", from + "a full stream of s2 (holes, preallocation, hard links, xattrs, a compressed file)",
       send(s2.frozen.tree, std::nullopt, 0)},
      {"incremental.hex", from + "s2 against s1: partial overwrites shared from s1, reflinks shared in the stream and from s1's other files",
       send(s2.frozen.tree, s1.frozen.tree, 0)},
      {"incremental-zstd.hex", from + "s2 against s1, the stream zstd-compressed", send(s2.frozen.tree, s1.frozen.tree, 3)},
      {"full-zstd.hex", from + "a full stream of s2, zstd-compressed", send(s2.frozen.tree, std::nullopt, 1)},
      {"layer.hex", from + "the layer top on s1: received as a layer on the base's s1", send(top, std::nullopt, 0)},
  };
}

}  // namespace plyfs::fuzz

#ifdef PLYFS_LIBFUZZER_RECV
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plyfs::fuzz::run_one_recv(data, size);
  return 0;
}
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return plyfs::fuzz::recv_mutate(data, size, max_size, seed, LLVMFuzzerMutate);
}
#endif
