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

namespace plyfs::daemon {

namespace {

enum { KEY_HELP, KEY_VERSION, KEY_FG, KEY_DEBUG, KEY_RO };

}  // namespace

#define PLYFS_OPT(t, p) {t, offsetof(Config, p), 1}
const struct fuse_opt kOpts[] = {
    {"commit=%u", offsetof(Config, commit), 0},
    {"cache=%s", offsetof(Config, cache), 0},
    {"view=%s", offsetof(Config, view), 0},
    {"branches=%s", offsetof(Config, branches), 0},
    {"dirs=%s", offsetof(Config, branches), 0},
    {"layer=%s", offsetof(Config, layer), 0},
    {"copyup=%s", offsetof(Config, copyup), 0},
    {"delete=%s", offsetof(Config, del), 0},
    {"crashlog=%s", offsetof(Config, crashlog), 0},
    {"snapshot_interval=%u", offsetof(Config, snapshot_interval), 0},
    {"snapshot_keep=%u", offsetof(Config, snapshot_keep), 0},
    {"nowriteback", offsetof(Config, nowriteback), 1},
    {"writeback", offsetof(Config, nowriteback), 0},
    {"uring", offsetof(Config, uring), 1},
    {"nouring", offsetof(Config, uring), 0},
    {"commit_stats", offsetof(Config, commit_stats), 1},
    {"max_threads=%u", offsetof(Config, max_threads), 0},
    {"max_idle_threads=%u", offsetof(Config, max_idle_threads), 0},
    {"spin=%u", offsetof(Config, spin), 0},
    FUSE_OPT_KEY("-h", KEY_HELP),
    FUSE_OPT_KEY("--help", KEY_HELP),
    FUSE_OPT_KEY("-V", KEY_VERSION),
    FUSE_OPT_KEY("--version", KEY_VERSION),
    FUSE_OPT_KEY("-f", KEY_FG),
    FUSE_OPT_KEY("-d", KEY_DEBUG),
    FUSE_OPT_KEY("debug", KEY_DEBUG),
    FUSE_OPT_KEY("ro", KEY_RO),
    FUSE_OPT_END};

int opt_proc(void* data, const char* arg, int key, struct fuse_args*) {
  auto* c = static_cast<Config*>(data);
  switch (key) {
    case KEY_HELP: c->help = 1; return 0;
    case KEY_VERSION: c->version = 1; return 0;
    case KEY_FG: c->foreground = 1; return 0;
    case KEY_DEBUG: c->debug = c->foreground = 1; return 1;  // libfuse prints requests
    case KEY_RO: c->ro = 1; return 1;                        // libfuse mounts read-only
    case FUSE_OPT_KEY_NONOPT:
      if (!c->image) { c->image = strdup(arg); return 0; }
      if (!c->mountpoint) { c->mountpoint = strdup(arg); return 0; }
      std::fprintf(stderr, "plyfs: unexpected argument '%s'\n", arg);
      return -1;
    default: return 1;
  }
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
      "                     fsync, sync and unmount)\n"
      "  -o cache=SIZE      metadata cache size, e.g. 256M (default 256M)\n"
      "  -o ro              read-only\n"
      "  -o view=NAME       show the view NAME (plyctl view list); default: the\n"
      "                     default view, or the default branch read-write\n"
      "  -o branches=A=rw:B=ro:...\n"
      "                     show this stack of branches, leftmost first (dirs= works too)\n"
      "  -o layer=NAME      show layer NAME over its ancestors (plyctl layer list);\n"
      "                     every layer is also reachable in MOUNTPOINT/.plyfs/layers/\n"
      "  -o copyup=MODE     owner of copied-up files: owner (default), current, or\n"
      "                     const:UID:GID:MODE (octal mode)\n"
      "  -o snapshot_interval=SECONDS  snapshot the stack's writable branch every\n"
      "                     SECONDS (0, the default: never)\n"
      "  -o snapshot_keep=N keep the N newest automatic snapshots (0: all), merging\n"
      "                     the oldest into the next\n"
      "  -o delete=MODE     whiteout (default: hide lower names) or all (also delete\n"
      "                     them from the writable branches that hold them)\n"
      "  -o nowriteback     no writeback cache: every write reaches the daemon at\n"
      "                     once, and a file open here sees a shorter size made\n"
      "                     through .plyfs (slower small writes; default: writeback)\n"
      "  -o uring           take requests through FUSE over io_uring, one queue per\n"
      "                     CPU, when the kernel offers it (Linux 6.14+, with\n"
      "                     fuse.enable_uring=1); default: /dev/fuse only\n"
      "  -o commit_stats    at unmount, say how many commits were made, why, and how\n"
      "                     long operations waited for them\n"
      "  -o max_threads=N   at most N threads serve requests (default 16)\n"
      "  -o max_idle_threads=N  at most N of them wait for requests (default: the\n"
      "                     number of CPUs, at least 2)\n"
      "  -o spin=MICROSECONDS  before sleeping, one thread polls for the next\n"
      "                     request this long (default 100; 0: never)\n"
      "  -o crashlog=PATH   testing only: log every device write and flush to PATH\n"
      "FUSE options: allow_other, default_permissions (also enables POSIX ACLs),\n"
      "  and the other options of mount.fuse3(8).\n"
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

bool parse_size(const char* s, uint64_t& out) {
  char* end;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno || end == s) return false;
  uint64_t mul = 1;
  switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    case '\0': break;
    default: return false;
  }
  if (*end) return false;
  out = v * mul;
  return out >= (1ull << 20);
}

}  // namespace plyfs::daemon
