// The daemon's command line: the mount options (plyfs -h, plyfs.8) and
// their parsing with libfuse's fuse_opt. main (plyfs.cpp) checks the values.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

#include <cstdint>

namespace plyfs::daemon {

struct Config {
  const char* image = nullptr;
  const char* mountpoint = nullptr;
  unsigned commit = 5;
  const char* cache = nullptr;
  const char* view = nullptr;
  const char* branches = nullptr;
  const char* layer = nullptr;
  const char* copyup = nullptr;
  const char* del = nullptr;
  const char* crashlog = nullptr;  // testing: log every device write and flush
  unsigned snapshot_interval = 0, snapshot_keep = 0;
  int ro = 0, foreground = 0, debug = 0, help = 0, version = 0;
  int nowriteback = 0;  // -o nowriteback: the kernel's cache writes through
  int uring = 0;        // -o uring: FUSE over io_uring when the kernel offers it
  int commit_stats = 0; // -o commit_stats: what the commits cost, said at unmount
  // libfuse's session loop: at most max_threads workers, and at most
  // max_idle_threads of them waiting for requests (0: the default, idle_threads).
  unsigned max_threads = 16, max_idle_threads = 0;
  unsigned spin = 100;  // -o spin=MICROSECONDS (kernel_io.h)
};

// What fuse_opt_parse reads into a Config, and the callback for the rest:
// IMAGE, MOUNTPOINT and the keys libfuse passes on or keeps.
extern const struct fuse_opt kOpts[];
int opt_proc(void* data, const char* arg, int key, struct fuse_args*);

void usage();  // plyfs -h
// The workers that may wait for requests: -o max_idle_threads, or the default.
unsigned idle_threads(unsigned asked, unsigned max_threads);
// -o cache=SIZE: "256M" and the like, at least 1M.
bool parse_size(const char* s, uint64_t& out);

}  // namespace plyfs::daemon
