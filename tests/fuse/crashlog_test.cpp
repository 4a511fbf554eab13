// Crash states of a run through the real FUSE daemon (docs/testing.md,
// "Daemon runs"): the daemon records every device write, flush and discard
// (-o crashlog=PATH, lib/blockdev/log_device.h) while a shell-level workload
// runs through the mount; the log is then loaded into the crash harness
// (tests/crash), which enumerates crash states (T0-T3) and checks each: the
// image opens read-only, fsck with the object passes is clean, and every
// file fsync'd before the newest superblock the state holds reads back
// through the default view with exactly its fsync'd content.
#include <sys/stat.h>

#include <cstdint>
#include <limits>
#include <map>

#include "../crash/harness.h"
#include "commit/superblock.h"
#include "fs/fs.h"
#include "fsck/fsck.h"
#include "fuse_util.h"
#include "union/union.h"
#include "union/view.h"

using namespace plyfs::fusetest;
namespace cr = plyfs::crash;

namespace {

// An fsync'd content of `path`, required in every state whose newest
// superblock write is at a log position in [from, until).
struct Expect {
  std::string path, data;
  uint64_t from_bytes = 0, until_bytes = std::numeric_limits<uint64_t>::max();
  size_t from = 0, until = 0;  // log positions, from the byte offsets
};

uint64_t file_size(const std::string& p) {
  struct stat st;
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return uint64_t(st.st_size);
}

// The image file as a sparse MemDevice (only its non-zero pages).
std::unique_ptr<plyfs::MemDevice> load_image(const std::string& path, uint32_t sector) {
  const uint64_t size = file_size(path);
  auto dev = std::make_unique<plyfs::MemDevice>(size, sector);
  int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::vector<std::byte> buf(1 << 20);
  for (uint64_t off = 0; off < size; off += buf.size()) {
    const size_t n = size_t(std::min<uint64_t>(buf.size(), size - off));
    REQUIRE(::pread(fd, buf.data(), n, off_t(off)) == ssize_t(n));
    for (size_t p = 0; p < n; p += 4096) {
      const size_t len = std::min<size_t>(4096, n - p);
      bool zero = true;
      for (size_t i = 0; i < len && zero; i++) zero = buf[p + i] == std::byte{0};
      if (!zero) dev->poke(off + p, std::span<const std::byte>(buf.data() + p, len));
    }
  }
  ::close(fd);
  return dev;
}

// `path` read through the default view of the volume, or why it cannot be.
plyfs::Result<std::string> read_in_view(plyfs::Volume& v, const std::string& path) {
  using namespace plyfs;
  auto o = PLY_TRY(open_union(v, PLY_TRY(default_stack(v)), true));
  Union& u = *o.u;
  uint64_t ino = u.root();
  for (size_t at = 0; at < path.size();) {
    size_t slash = path.find('/', at);
    if (slash == std::string::npos) slash = path.size();
    ino = PLY_TRY(u.lookup(ino, std::string_view(path).substr(at, slash - at))).ino;
    at = slash + 1;
  }
  const Attr a = PLY_TRY(u.getattr(ino));
  std::string out(a.size, '\0');
  const size_t got = PLY_TRY(u.read(ino, 0, std::as_writable_bytes(std::span<char>(out.data(), out.size()))));
  out.resize(got);
  return out;
}

}  // namespace

TEST_CASE("crash states of a run through the FUSE daemon", "[crashlog]") {
  const uint64_t s = seed("crashlog");
  std::mt19937_64 rng(s);
  const auto t0 = Clock::now();
  TempDir tmp;
  const std::string img = tmp / "image", clog = tmp / "crash.log";
  mkfs(img, "64M", tmp / "mkfs.log");
  const std::string base_copy = tmp / "base";
  REQUIRE(run({"/bin/cp", "--sparse=always", img, base_copy}, tmp / "cp.log") == 0);

  // commit=0: generations commit only on fsync, sync, snapshots and unmount,
  // so no commit falls between a change and the fsync after it.
  std::vector<Expect> expects;
  std::map<std::string, std::string> cur;  // what each file holds now
  {
    Mount m(img, tmp / "mnt", {"commit=0", "crashlog=" + clog});
    m.start();
    auto fsync_path = [&](const std::string& p) {
      int fd = ::open((m / p).c_str(), O_RDONLY);
      REQUIRE(fd >= 0);
      REQUIRE(::fsync(fd) == 0);
      ::close(fd);
      // The log in the file now holds the fsync's commit (the daemon hands
      // it to the kernel at each flush): states whose newest superblock
      // write comes later must show the content.
      Expect e;
      e.path = p;
      e.data = cur.at(p);
      e.from_bytes = file_size(clog);
      expects.push_back(e);
    };
    // Before a change to `p`: its fsync'd content is required only of
    // states whose newest superblock write came before this point.
    auto changing = [&](const std::string& p) {
      const uint64_t now = file_size(clog);
      for (auto& e : expects)
        if ((e.path == p || e.path.rfind(p + "/", 0) == 0) &&
            e.until_bytes == std::numeric_limits<uint64_t>::max())
          e.until_bytes = now;
    };
    auto create = [&](const std::string& p, size_t size) {
      cur[p] = random_bytes(rng, size);
      write_file(m / p, cur[p]);
    };
    auto size = [&] { return rng() % 3 == 0 ? size_t(rng() % 3000) : size_t(rng() % 150000); };
    std::vector<std::string> synced;  // fsync'd files still there
    for (int round = 0; round < 10; round++) {
      const std::string dir = "d" + std::to_string(round);
      REQUIRE(::mkdir((m / dir).c_str(), 0755) == 0);
      for (int i = 0; i < 4; i++) {
        const std::string p = dir + "/f" + std::to_string(i);
        create(p, size());
        if (i % 2 == 0) {
          fsync_path(p);
          synced.push_back(p);
        }
      }
      if (synced.size() > 2) {
        // Overwrite part of an fsync'd file, then fsync it again.
        const std::string p = synced[rng() % synced.size()];
        changing(p);
        std::string patch = random_bytes(rng, 1 + rng() % 9000);
        const size_t off = cur[p].empty() ? 0 : rng() % cur[p].size();
        int fd = ::open((m / p).c_str(), O_WRONLY);
        REQUIRE(fd >= 0);
        pwrite_all(fd, patch.data(), patch.size(), off_t(off));
        REQUIRE(::close(fd) == 0);
        if (off + patch.size() > cur[p].size()) cur[p].resize(off + patch.size());
        cur[p].replace(off, patch.size(), patch);
        fsync_path(p);
        // Rename one into this round's directory, then fsync it there.
        const size_t k = rng() % synced.size();
        const std::string from = synced[k], to = dir + "/moved" + std::to_string(round);
        changing(from);
        REQUIRE(::rename((m / from).c_str(), (m / to).c_str()) == 0);
        cur[to] = cur[from];
        cur.erase(from);
        synced[k] = to;
        fsync_path(to);
        // Unlink one.
        const size_t u = rng() % synced.size();
        changing(synced[u]);
        REQUIRE(::unlink((m / synced[u]).c_str()) == 0);
        cur.erase(synced[u]);
        synced.erase(synced.begin() + long(u));
      }
      if (round % 3 == 2 && !synced.empty()) {
        // Truncate an fsync'd file, shorter or longer, then fsync it.
        const std::string p = synced[rng() % synced.size()];
        changing(p);
        const size_t n = rng() % 2 ? cur[p].size() / 2 : cur[p].size() + 5000;
        REQUIRE(::truncate((m / p).c_str(), off_t(n)) == 0);
        cur[p].resize(n);
        fsync_path(p);
      }
      if (round % 4 == 3) {
        // Rename the previous round's directory, then fsync what moved.
        const std::string from = "d" + std::to_string(round - 1), to = "r" + std::to_string(round - 1);
        changing(from);
        REQUIRE(::rename((m / from).c_str(), (m / to).c_str()) == 0);
        for (auto& p : synced)
          if (p.rfind(from + "/", 0) == 0) {
            const std::string q = to + p.substr(from.size());
            cur[q] = cur[p];
            cur.erase(p);
            p = q;
            fsync_path(q);
          }
        for (auto it = cur.begin(); it != cur.end();)  // moved, not fsync'd
          it = it->first.rfind(from + "/", 0) == 0 ? cur.erase(it) : std::next(it);
      }
      if (round % 3 == 1) {
        const std::string log = tmp / "plyctl.log";
        INFO(slurp(log));
        REQUIRE(run({plyctl_bin(), "snapshot", m.path(), "--name", "s" + std::to_string(round)}, log) == 0);
      }
      // More writes after the snapshot, the last one fsync'd.
      const std::string p = dir + "/late";
      create(p, size());
      fsync_path(p);
      synced.push_back(p);
    }
    const int rc = m.unmount();
    INFO("plyfs log:\n" << m.log());
    REQUIRE(rc == 0);
  }
  require_fsck_clean(img, tmp / "fsck.log");
  const double workload_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // The log, and the image as it was before the mount.
  cr::Run r;
  std::vector<uint64_t> ends;
  const std::string err = cr::load_log(clog, r.log, &ends);
  INFO(err);
  REQUIRE(err.empty());
  r.log.base = load_image(base_copy, r.log.sector);
  {
    auto ch = plyfs::read_superblocks(*r.log.base);
    REQUIRE(ch);
    r.base_gen = ch->info.generation.v;
  }
  // Byte offsets to log positions: the entries the file held then.
  auto pos_of = [&](uint64_t bytes) {
    return size_t(std::upper_bound(ends.begin(), ends.end(), bytes) - ends.begin());
  };
  for (auto& e : expects) {
    e.from = pos_of(e.from_bytes);
    e.until = e.until_bytes == std::numeric_limits<uint64_t>::max() ? r.log.entries.size() + 1
                                                                     : pos_of(e.until_bytes);
  }
  // Sanity: the final image is the log applied to the base.
  {
    cr::Spec all{r.log.entries.size(), {}, std::nullopt, cr::Lost::Old, "end"};
    REQUIRE(!r.log.flushes.empty());
    REQUIRE(r.log.flushes.back() + 1 == r.log.entries.size());
    cr::StateDevice sd(r.log, all, 0);
    auto real = plyfs::FileDevice::open(img, {.read_only = true, .lock = false});
    REQUIRE(real);
    // Discarded blocks are holes in the image (D7: old or zero).
    auto discarded = [&](uint64_t off) {
      for (const auto& e : r.log.entries)
        if (e.kind == cr::Kind::Discard && e.offset <= off && off < e.offset + e.length) return true;
      return false;
    };
    std::vector<std::byte> a(4096), b(4096), zero(4096);
    for (uint64_t off = 0; off < sd.size_bytes(); off += a.size()) {
      REQUIRE(sd.read(off, a));
      REQUIRE((*real)->read(off, b));
      if (a == b || (b == zero && discarded(off))) continue;
      FAIL("the log replayed differs from the image at byte " << off);
    }
  }

  uint64_t checked_files = 0;
  auto oracle = [&](const cr::Spec& spec, bool) -> std::string {
    cr::StateDevice dev(r.log, spec, std::hash<std::string>{}(spec.id()));
    // The newest superblock write the state holds whole: durable, or kept
    // in the open set and not torn.
    const size_t open_start = size_t(r.log.last_flush_before(spec.crash_at) + 1);
    long newest = -1;
    for (const auto& sw : r.log.supers) {
      if (sw.pos >= spec.crash_at) break;
      bool in = sw.pos < open_start;
      if (!in)
        for (size_t k = 0; k < spec.kept.size(); k++)
          if (spec.kept[k] == sw.pos && !(spec.tear && k + 1 == spec.kept.size())) in = true;
      if (in) newest = long(sw.pos);
    }
    plyfs::VolumeOptions ro;
    ro.read_only = true;
    ro.kinds = plyfs::fs_kinds();
    ro.cache_bytes = 4 << 20;
    {
      auto vol = plyfs::Volume::open(dev, ro);
      if (!vol) return "UNMOUNTABLE: " + vol.error().message();
      for (const auto& e : expects) {
        if (newest < 0 || size_t(newest) < e.from || size_t(newest) >= e.until) continue;
        auto got = read_in_view(**vol, e.path);
        if (!got) return "FSYNC_LOST: " + e.path + ": " + got.error().message();
        if (*got != e.data)
          return "FSYNC_CONTENT: " + e.path + ": " + first_difference(*got, e.data);
        checked_files++;
      }
    }
    if (dev.overlay_writes()) return "RECOVERY_WROTE: opening a crash state wrote to it (C6)";
    plyfs::FsckOptions fo;
    fo.kinds = plyfs::fs_kinds();
    plyfs::set_object_passes(fo, false);
    auto f = plyfs::fsck_run(dev, fo);
    if (!f) return "FSCK_FAILED: " + f.error().message();
    if (dev.overlay_writes()) return "FSCK_WROTE: fsck -n wrote to the image";
    for (const auto& p : f->problems) {
      if (p.fix == plyfs::FixClass::Info) continue;
      if (p.code == "S-unreadable" && spec.lost == cr::Lost::Unreadable) continue;
      return "FSCK_ERRORS: " + p.code + ": " + p.message;
    }
    return "";
  };

  cr::Workload w;
  w.id = "daemon";
  cr::Sampling sampling;
  sampling.write_checks = 0;  // the oracle above does not write
  sampling.tears_per_write = 3;
  cr::Totals totals;
  cr::check_run(w, r, sampling, s, totals, "", false, oracle, true);
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("crashlog: %zu log entries (%zu writes, %zu flushes, %zu superblocks), %llu states "
              "(T0 %llu, T1 %llu, T2 %llu, T3 %llu), %llu fsync'd contents checked, workload "
              "%.1f s, total %.1f s\n",
              r.log.entries.size(), r.log.writes.size(), r.log.flushes.size(), r.log.supers.size(),
              (unsigned long long)totals.states, (unsigned long long)totals.by_tier[0],
              (unsigned long long)totals.by_tier[1], (unsigned long long)totals.by_tier[2],
              (unsigned long long)totals.by_tier[3], (unsigned long long)checked_files, workload_s,
              total_s);
  std::string failures;
  for (const auto& line : totals.reproducers) failures += line + "\n";
  INFO("seed " << s << "; failures:\n" << failures);
  CHECK(totals.violations == 0);
  CHECK(totals.failed == 0);
  CHECK(totals.states >= 300);
  CHECK(checked_files >= 100);
}
