// The mount options (options.h): libfuse's table of them, the help text and
// the values that need more than fuse_opt to read.
#include "options.h"

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string>
#include <string_view>

#include "util/memory.h"
#include "util/parse.h"

namespace plyfs::daemon {

namespace {

enum { KEY_HELP, KEY_VERSION, KEY_FG, KEY_DEBUG, KEY_RO, KEY_ALLOW_OTHER, KEY_ALLOW_ROOT, KEY_DEFAULT_PERMISSIONS, KEY_DEVICE };

}  // namespace

const struct fuse_opt kOpts[] = {
    {"commit=%s", offsetof(Config, commit_s), 0},
    {"cache=%s", offsetof(Config, cache_s), 0},
    {"nbd_cache=%s", offsetof(Config, nbd_cache_s), 0},
    {"stage_delay=%s", offsetof(Config, stage_delay_s), 0},
    {"view=%s", offsetof(Config, view), 0},
    {"branches=%s", offsetof(Config, branches), 0},
    {"dirs=%s", offsetof(Config, branches), 0},
    {"layer=%s", offsetof(Config, layer), 0},
    {"copyup=%s", offsetof(Config, copyup_s), 0},
    {"delete=%s", offsetof(Config, del_s), 0},
    {"crashlog=%s", offsetof(Config, crashlog), 0},
    {"snapshot_interval=%s", offsetof(Config, snapshot_interval_s), 0},
    {"snapshot_keep=%s", offsetof(Config, snapshot_keep_s), 0},
    {"nowriteback", offsetof(Config, nowriteback), 1},
    {"writeback", offsetof(Config, nowriteback), 0},
    {"uring", offsetof(Config, uring), 1},
    {"nouring", offsetof(Config, uring), 0},
    {"commit_stats", offsetof(Config, commit_stats), 1},
    {"odirect", offsetof(Config, odirect), 1},
    {"noodirect", offsetof(Config, odirect), 0},
    {"discard", offsetof(Config, discard), 1},
    {"nodiscard", offsetof(Config, discard), 0},
    {"max_threads=%s", offsetof(Config, max_threads_s), 0},
    {"max_idle_threads=%s", offsetof(Config, max_idle_threads_s), 0},
    {"spin=%s", offsetof(Config, spin_s), 0},
    {"timeout=%s", offsetof(Config, timeout_s), 0},
    {"compress=%s", offsetof(Config, compress_s), 0},
    {"compress-force=%s", offsetof(Config, compress_force_s), 0},
    {"compress_force=%s", offsetof(Config, compress_force_s), 0},
    {"compress", offsetof(Config, compress_bare), 1},
    {"compress-force", offsetof(Config, compress_force_bare), 1},
    {"compress_force", offsetof(Config, compress_force_bare), 1},
    FUSE_OPT_KEY("-h", KEY_HELP),
    FUSE_OPT_KEY("--help", KEY_HELP),
    FUSE_OPT_KEY("-V", KEY_VERSION),
    FUSE_OPT_KEY("--version", KEY_VERSION),
    FUSE_OPT_KEY("-f", KEY_FG),
    FUSE_OPT_KEY("-d", KEY_DEBUG),
    FUSE_OPT_KEY("debug", KEY_DEBUG),
    FUSE_OPT_KEY("ro", KEY_RO),
    FUSE_OPT_KEY("allow_other", KEY_ALLOW_OTHER),
    FUSE_OPT_KEY("allow_root", KEY_ALLOW_ROOT),
    FUSE_OPT_KEY("default_permissions", KEY_DEFAULT_PERMISSIONS),
    FUSE_OPT_KEY("device=", KEY_DEVICE),
    FUSE_OPT_END};

Config::~Config() {
  for (const char* s : {image, mountpoint, commit_s, cache_s, nbd_cache_s, stage_delay_s, view, branches, layer, copyup_s, del_s,
                        crashlog, snapshot_interval_s, snapshot_keep_s, max_threads_s,
                        max_idle_threads_s, spin_s, timeout_s, compress_s, compress_force_s})
    std::free(const_cast<char*>(s));
}

int opt_proc(void* data, const char* arg, int key, struct fuse_args*) {
  auto* c = static_cast<Config*>(data);
  switch (key) {
    case KEY_HELP: c->help = 1; return 0;
    case KEY_VERSION: c->version = 1; return 0;
    case KEY_FG: c->foreground = 1; return 0;
    case KEY_DEBUG: c->debug = c->foreground = 1; return 1;  // libfuse prints requests
    case KEY_RO: c->ro = 1; return 1;                        // libfuse mounts read-only
    // libfuse's own: kept for it, noted for check_options and main.
    case KEY_ALLOW_OTHER: c->allow_other = 1; return 1;
    case KEY_ALLOW_ROOT: c->allow_root = 1; return 1;
    case KEY_DEFAULT_PERMISSIONS: c->default_permissions = 1; return 1;
    // -o device=PATH, any number of times: the other devices of a
    // multi-device volume, or directories to scan for them (devices.h).
    case KEY_DEVICE: c->devices.emplace_back(arg + 7); return 0;
    case FUSE_OPT_KEY_NONOPT:
      // A second string given as IMAGE or MOUNTPOINT (fuse_opt keeps the
      // last of an option given twice) would leak the first.
      if (!c->image) { c->image = strdup(arg); return 0; }
      if (!c->mountpoint) { c->mountpoint = strdup(arg); return 0; }
      std::fprintf(stderr, "plyfs: unexpected argument '%s'\n", arg);
      return -1;
    default: return 1;
  }
}

namespace {

// "bad NAME 'VALUE': why": parse_uint's and parse_size's reasons ("invalid
// NAME 'VALUE': why") as the daemon's refusals of options begin.
Error bad(Error e) {
  if (e.reason.rfind("invalid ", 0) == 0) e.reason.replace(0, 7, "bad");
  return e;
}

Result<unsigned> number(const char* s, const char* what, unsigned min, unsigned max, unsigned dflt) {
  if (!s) return dflt;
  auto v = parse_uint(s, what, min, max);
  if (!v) return bad(v.error());
  return unsigned(*v);
}

// MODE of copyup=const:UID:GID:MODE: octal, as chmod(1) takes it.
Result<uint32_t> octal_mode(std::string_view s) {
  uint32_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '7' || v > 07777) return Error::invalid("");
    v = v * 8 + uint32_t(ch - '0');
  }
  if (s.empty() || v > 07777) return Error::invalid("");
  return v;
}

Result<CopyUpMode> copyup_mode(std::string_view m) {
  if (m == "owner") return CopyUpMode{};
  if (m == "current") return CopyUpMode{CopyUpMode::Current};
  const std::string usage = "bad copyup mode '" + std::string(m) +
                            "' (owner, current or const:UID:GID:MODE, MODE in octal)";
  if (m.rfind("const:", 0) != 0) return Error::invalid(usage);
  const std::string_view rest = m.substr(6);
  const size_t c1 = rest.find(':');
  const size_t c2 = c1 == rest.npos ? rest.npos : rest.find(':', c1 + 1);
  if (c2 == rest.npos) return Error::invalid(usage);
  // A uid or gid of 2^32 - 1 is (uid_t)-1, "no change" to chown(2).
  auto uid = parse_uint(rest.substr(0, c1), "copyup uid", 0, 0xfffffffe);
  auto gid = parse_uint(rest.substr(c1 + 1, c2 - c1 - 1), "copyup gid", 0, 0xfffffffe);
  auto mode = octal_mode(rest.substr(c2 + 1));
  if (!uid) return bad(uid.error());
  if (!gid) return bad(gid.error());
  if (!mode) return Error::invalid(usage);
  return CopyUpMode{CopyUpMode::Const, uint32_t(*uid), uint32_t(*gid), *mode};
}

}  // namespace

uint64_t default_nbd_cache() {
  // The cgroup's limit where the daemon runs in one (a container's): an
  // eighth of a host's memory could be past it (util/memory.h).
  if (const Memory m = memory_now(); m.total > 0) return m.total / 8;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 256ull << 20;
  return uint64_t(pages) * uint64_t(page) / 8;
}

Result<void> check_options(Config& c) {
  c.commit = PLY_TRY(number(c.commit_s, "commit", 0, kMaxCommit, c.commit));
  if (c.cache_s) {
    auto v = parse_size(c.cache_s, "cache size");
    if (!v) return bad(v.error());
    if (*v < kMinCache || *v > kMaxCache)
      return Error::invalid("bad cache size '" + std::string(c.cache_s) + "': must be 1M to 16T");
    c.cache_bytes = *v;
  }
  if (c.nbd_cache_s) {
    auto v = parse_size(c.nbd_cache_s, "nbd_cache size");
    if (!v) return bad(v.error());
    if (*v > kMaxCache)
      return Error::invalid("bad nbd_cache size '" + std::string(c.nbd_cache_s) + "': must be 0 to 16T");
    c.nbd_cache_bytes = *v;
  } else {
    c.nbd_cache_bytes = default_nbd_cache();
  }
  c.stage_delay = PLY_TRY(number(c.stage_delay_s, "stage_delay", 0, kMaxStageDelay, c.stage_delay));
  c.snapshot_interval =
      PLY_TRY(number(c.snapshot_interval_s, "snapshot_interval", 0, kMaxSnapshotInterval, 0));
  if (c.snapshot_keep_s) {
    auto r = parse_retention(c.snapshot_keep_s);
    if (!r) return bad(r.error());
    c.snapshot_keep = *r;
  }
  c.max_threads = PLY_TRY(number(c.max_threads_s, "max_threads", 1, kMaxThreads, c.max_threads));
  c.max_idle_threads =
      PLY_TRY(number(c.max_idle_threads_s, "max_idle_threads", 0, kMaxThreads, c.max_idle_threads));
  c.spin = PLY_TRY(number(c.spin_s, "spin", 0, kMaxSpin, c.spin));
  c.timeout = PLY_TRY(number(c.timeout_s, "timeout", 0, kMaxTimeout, c.timeout));
  if (c.copyup_s) c.copyup = PLY_TRY(copyup_mode(c.copyup_s));
  if (c.del_s) {
    if (std::strcmp(c.del_s, "all") == 0) c.del = DeleteMode::All;
    else if (std::strcmp(c.del_s, "whiteout") != 0)
      return Error::invalid("bad delete mode '" + std::string(c.del_s) + "' (whiteout or all)");
  }
  // compress-force wins over compress when both are given.
  if (c.compress_bare && !c.compress_s) c.compress_s = strdup("zstd");
  if (c.compress_force_bare && !c.compress_force_s) c.compress_force_s = strdup("zstd");
  for (const char* s : {c.compress_s, c.compress_force_s}) {
    if (!s) continue;
    auto z = parse_compression(s);
    if (!z) return Error::invalid("bad option " + std::string(s == c.compress_s ? "compress" : "compress-force") +
                                  ": " + z.error().message());
    if (z->mode == Compression::Mode::None && s == c.compress_force_s)
      return Error::invalid("bad option compress-force=none: use compress=none");
    c.compress = *z;
    c.compress.force = s == c.compress_force_s;
  }
  if ((c.view != nullptr) + (c.branches != nullptr) + (c.layer != nullptr) > 1)
    return Error::invalid("bad options: view=, branches= and layer= exclude each other");
  if (c.uring && !uring_built())
    return Error::invalid(
        "bad option uring: this build of plyfs has no io_uring support (built without liburing)");
  return ok();
}

bool uring_built() {
#ifdef PLYFS_HAVE_URING
  return true;
#else
  return false;
#endif
}

void usage() {
  std::printf(
      "usage: plyfs IMAGE MOUNTPOINT [-f] [-d] [-o opt[,opt...]]\n"
      "\n"
      "Mounts the plyfs image (a file or a block device) at MOUNTPOINT.\n"
      "\n"
      "  -f                 stay in the foreground\n"
      "  -d                 foreground, and print every FUSE request\n"
      "  -h, --help         this help\n"
      "  -V, --version      the version\n"
      "\n"
      "plyfs options:\n"
      "  -o commit=SECONDS  commit a generation every SECONDS (default 5; 0: only on\n"
      "                     fsync, sync and unmount; at most 86400)\n"
      "  -o cache=SIZE      metadata cache size, 1M to 16T: 256M, 1g, 1GiB, 1.5G\n"
      "                     (K, M, G, T: powers of 1024; KB, MB, GB: of 1000;\n"
      "                     default 256M)\n"
      "  -o nbd_cache=SIZE  for an image on an NBD server: keep up to SIZE of its\n"
      "                     blocks in the daemon, as the host's page cache does for\n"
      "                     an image file (default: an eighth of the memory; 0: none)\n"
      "  -o stage_delay=SECONDS  a staged file (plyctl policy, stage=) moves once it\n"
      "                     has had no write for SECONDS (default 5; at most 86400)\n"
      "  -o ro              read-only\n"
      "  -o device=PATH     another device of a multi-device volume, or a directory\n"
      "                     to scan for them; give it once per device\n"
      "  -o view=NAME       show the view NAME (plyctl view list); default: the\n"
      "                     default view, or the default branch read-write\n"
      "  -o branches=A=rw:B=ro:...\n"
      "                     show this stack of branches, leftmost first (dirs= works too)\n"
      "  -o layer=NAME      show layer NAME over its ancestors (plyctl layer list);\n"
      "                     every layer is also reachable in MOUNTPOINT/.plyfs/layers/\n"
      "  -o copyup=MODE     owner of copied-up files: owner (default), current (the\n"
      "                     caller, its umask applied), or const:UID:GID:MODE (octal)\n"
      "  -o snapshot_interval=SECONDS  snapshot the stack's writable branch every\n"
      "                     SECONDS (0, the default: never; at most a year)\n"
      "  -o snapshot_keep=N|CLASS=N[:CLASS=N...]  keep the N newest automatic\n"
      "                     snapshots (0: all), or by class: last=N, hourly=N,\n"
      "                     daily=N, weekly=N, monthly=N (the newest of each of the\n"
      "                     N latest periods, UTC), deleting\n"
      "                     the older ones\n"
      "  -o delete=MODE     whiteout (default: hide lower names) or all (also delete\n"
      "                     them from the writable branches that hold them)\n"
      "  -o nowriteback     no writeback cache: every write reaches the daemon at\n"
      "                     once, and a file open here sees a shorter size made\n"
      "                     through .plyfs (slower small writes; default: writeback)\n"
      "  -o uring           take requests through FUSE over io_uring, one queue per\n"
      "                     CPU, when the kernel offers it (Linux 6.14+, with\n"
      "                     fuse.enable_uring=1); default: /dev/fuse only\n"
      "  -o odirect         open the image and every device with O_DIRECT: no host\n"
      "                     page cache under the daemon; writes are queued and\n"
      "                     written by the daemon's own threads, flushed at every\n"
      "                     commit (default: noodirect, the host's page cache)\n"
      "  -o discard         give freed blocks back: once the generation that freed\n"
      "                     them is durable, punch them out of an image file or\n"
      "                     discard them on a block device (default: nodiscard;\n"
      "                     plyctl trim MOUNTPOINT, or fstrim, does it on demand)\n"
      "  -o commit_stats    at unmount, say how many commits were made, why, and how\n"
      "                     long operations waited for them\n"
      "  -o max_threads=N   at most N threads serve requests (1 to 1024, default 16)\n"
      "  -o max_idle_threads=N  at most N of them wait for requests (default: the\n"
      "                     number of CPUs, at least 2)\n"
      "  -o spin=MICROSECONDS  before sleeping, one thread polls for the next\n"
      "                     request this long (0 to 100000, default 100; 0: never)\n"
      "  -o timeout=SECONDS how long the kernel keeps names and attributes without\n"
      "                     asking (0 to 86400, default 60)\n"
      "  -o compress[=zstd[:LEVEL]]  compress new data with zstd at LEVEL (1 to 19,\n"
      "                     default 3) where it pays; compress=none: plain (default)\n"
      "  -o compress-force[=zstd[:LEVEL]]  the same without the quick test that\n"
      "                     skips data that looks incompressible (a branch default\n"
      "                     and chattr +c/+m are more specific and win)\n"
      "  -o crashlog=PATH   testing only: log every device write and flush to PATH\n"
      "FUSE options: allow_other (turns default_permissions on: the kernel checks\n"
      "  permissions), default_permissions (also enables POSIX ACLs), and the other\n"
      "  options of mount.fuse3(8).\n"
      "\n"
      "With mount(8): mount -t fuse.plyfs IMAGE MOUNTPOINT\n");
}

// The kernel hands each request to the waiting thread that has waited
// longest, so with more waiting threads than CPUs a request that could run
// at once lands on a thread whose caches went cold meanwhile: on 2 CPUs,
// 8 idle threads made the deletion of 100,000 files ~15 % slower than 2
// (docs/benchmarks.md, "Worker threads"). Fewer than 2 makes libfuse start
// and end a thread around nearly every request.
unsigned idle_threads(unsigned asked, unsigned max_threads) {
  if (asked) return std::min(asked, max_threads);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return std::min<unsigned>(std::max<long>(n, 2), max_threads);
}

}  // namespace plyfs::daemon
