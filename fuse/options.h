// The daemon's command line: the mount options (plyfs -h, plyfs.8), their
// parsing with libfuse's fuse_opt, and their checks (check_options). Every
// value is taken as a string first: fuse_opt's %u is sscanf's, which reads
// "-1" as 4294967295 and "5s" as 5. Numbers then go through parse_uint and
// sizes through parse_size (util/parse.h), one rule for every tool.
#pragma once

#include "snap/retention.h"

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

#include <cstdint>
#include <string>

#include "union/union.h"
#include "util/result.h"

#include <string>
#include <vector>

namespace plyfs::daemon {

struct Config {
  // What the command line gave (fuse_opt's strdup copies, freed with the
  // Config), null when not given.
  const char* image = nullptr;
  const char* mountpoint = nullptr;
  const char* commit_s = nullptr;
  const char* cache_s = nullptr;
  const char* view = nullptr;
  const char* branches = nullptr;
  const char* layer = nullptr;
  const char* copyup_s = nullptr;
  const char* del_s = nullptr;
  const char* crashlog = nullptr;  // testing: log every device write and flush
  const char* snapshot_interval_s = nullptr;
  const char* snapshot_keep_s = nullptr;
  const char* max_threads_s = nullptr;
  const char* max_idle_threads_s = nullptr;
  const char* spin_s = nullptr;
  const char* timeout_s = nullptr;
  const char* nbd_cache_s = nullptr;       // -o nbd_cache=SIZE (blockdev/read_cache.h)
  const char* stage_delay_s = nullptr;     // -o stage_delay=SECONDS (format.md#staged-writes)
  const char* compress_s = nullptr;        // -o compress=zstd[:N]|none
  const char* compress_force_s = nullptr;  // -o compress-force=zstd[:N]
  std::vector<std::string> devices;  // -o device=PATH, each time given (format.md#multi-device)
  int ro = 0, foreground = 0, debug = 0, help = 0, version = 0;
  int nowriteback = 0;  // -o nowriteback: the kernel's cache writes through
  int uring = 0;        // -o uring: FUSE over io_uring when the kernel offers it
  int commit_stats = 0; // -o commit_stats: what the commits cost, said at unmount
  int odirect = 0;      // -o odirect: the devices opened with O_DIRECT (format.md#device-direct)
  int discard = 0;      // -o discard: freed blocks discarded once durable (format.md#discard)
  int compress_bare = 0, compress_force_bare = 0;  // -o compress, -o compress-force: zstd
  // libfuse's options that decide who may use the mount (kept for libfuse).
  int allow_other = 0, allow_root = 0, default_permissions = 0;

  // The checked values (check_options), with their defaults.
  unsigned commit = 5;                   // seconds, 0 to kMaxCommit
  uint64_t cache_bytes = 256ull << 20;   // kMinCache to kMaxCache
  uint64_t nbd_cache_bytes = 0;          // -o nbd_cache=SIZE, 0 to kMaxCache (default_nbd_cache)
  unsigned stage_delay = 5;              // seconds, 0 to kMaxStageDelay
  unsigned snapshot_interval = 0;        // seconds, 0: never
  Retention snapshot_keep;               // keeps all by default (snap/retention.h)
  // libfuse's session loop: at most max_threads workers, and at most
  // max_idle_threads of them waiting for requests (0: the default, idle_threads).
  unsigned max_threads = 16, max_idle_threads = 0;
  unsigned spin = 100;  // -o spin=MICROSECONDS (kernel_io.h)
  unsigned timeout = 60;  // -o timeout=SECONDS: the kernel's entry and attribute caches
  CopyUpMode copyup;
  DeleteMode del = DeleteMode::Whiteout;
  Compression compress;  // Unset: none, unless a branch or file asks (format.md#fs-compress)

  Config() = default;
  ~Config();
  Config(const Config&) = delete;
  Config& operator=(const Config&) = delete;
};

// The ranges of the numeric options (plyfs.8 documents them).
inline constexpr unsigned kMaxCommit = 86400;              // a day
inline constexpr unsigned kMaxStageDelay = 86400;         // a day
inline constexpr unsigned kMaxSnapshotInterval = 31536000;  // a year
inline constexpr unsigned kMaxThreads = 1024;
inline constexpr unsigned kMaxSpin = 100000;                // 0.1 s
inline constexpr unsigned kMaxTimeout = 86400;             // a day
inline constexpr uint64_t kMinCache = 1ull << 20;
inline constexpr uint64_t kMaxCache = 1ull << 44;           // 16 TiB

// What fuse_opt_parse reads into a Config, and the callback for the rest:
// IMAGE, MOUNTPOINT and the keys libfuse passes on or keeps.
extern const struct fuse_opt kOpts[];
int opt_proc(void* data, const char* arg, int key, struct fuse_args*);

// Checks and converts every value the command line gave; the first bad one
// is the error, whose reason begins with "bad" and names the option.
Result<void> check_options(Config& c);

// Whether users other than the mount's owner reach the mount: then the
// kernel must check permissions (default_permissions), since the daemon
// checks none (plyfs.8, "Permissions").
inline bool others_reach(const Config& c) { return c.allow_other || c.allow_root; }

// Whether this build has FUSE over io_uring (liburing; meson option uring).
bool uring_built();

void usage();  // plyfs -h
// -o nbd_cache's default: an eighth of the machine's memory, or of the memory
// cgroup's limit if the daemon runs in one with less (as ZFS sizes
// its ARC from it; the host's page cache, which an image file has, takes
// whatever is free).
uint64_t default_nbd_cache();
// The workers that may wait for requests: -o max_idle_threads, or the default.
unsigned idle_threads(unsigned asked, unsigned max_threads);

}  // namespace plyfs::daemon
