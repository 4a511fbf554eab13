// plyfs: serves a plyfs image through FUSE (libfuse3 low-level API).
//
//   plyfs IMAGE MOUNTPOINT [-f] [-d] [-o opts]
//
// The daemon is a thin translation from FUSE requests to the union layer
// (lib/union), which shows a view of one or more branches: inode numbers
// pass through unchanged except the root, which FUSE calls 1. Every reply
// that hands the kernel an inode (lookup, create, readdirplus...) pins it,
// and forget unpins it, so that a file unlinked while open stays readable
// until the kernel lets it go. The control folder (.plyfs at the root,
// ctl_folder.h) serves node ids with bit 63 set: every branch's view beside
// the mounted one.
//
// This file holds main: the options' checks, the image and the union opened,
// the daemon started and, at unmount, stopped. The rest: options.h (the
// mount options), daemon.h (the state the parts share), ops_names.cpp and
// ops_files.cpp (the operations), control.cpp (the control requests) and
// lifecycle.cpp (snapshot, merge, rollback and their threads).
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <fcntl.h>
#include <signal.h>
#include <syslog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "blockdev/blockdev.h"
#include "blockdev/log_device.h"
#include "fs/fs.h"
#include "union/union.h"
#include "union/view.h"
#include "kernel_io.h"
#include "uring.h"
#include "ctl_folder.h"
#include "daemon.h"
#include "options.h"
#include "snap/snap.h"

using namespace plyfs;
using namespace plyfs::daemon;

namespace {

// -o commit_stats: the commits of the mount by cause, and what they cost the
// operations (docs/benchmarks.md, "What a commit costs").
struct CommitTally {
  struct Sum {
    uint64_t n = 0, wait_us = 0, frozen_us = 0, write_us = 0, blocks = 0, max_frozen_us = 0;
  };
  std::mutex mu;
  Sum by[4];
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  void add(const CommitStats& st) {
    std::lock_guard lk(mu);
    Sum& s = by[size_t(st.cause)];
    s.n++;
    s.wait_us += st.wait_us;
    s.frozen_us += st.frozen_us;
    s.write_us += st.write_us;
    s.blocks += st.blocks;
    s.max_frozen_us = std::max(s.max_frozen_us, st.frozen_us);
  }
  void report() {
    std::lock_guard lk(mu);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    static const char* const kNames[] = {"requested", "periodic", "dirty", "budget"};
    log_error("commit_stats: %.1f s mounted", secs);
    for (size_t i = 0; i < 4; i++) {
      const Sum& s = by[i];
      if (!s.n) continue;
      log_error("commit_stats: %s: %llu commits, %llu blocks; gate closing %.1f ms, closed %.1f ms "
                "(longest %.1f ms), writing %.1f ms",
                kNames[i], (unsigned long long)s.n, (unsigned long long)s.blocks, s.wait_us / 1e3,
                s.frozen_us / 1e3, s.max_frozen_us / 1e3, s.write_us / 1e3);
    }
  }
};
CommitTally g_commits;

// Tells the waiting parent how the mount went (a byte: the exit code).
void report(int fd, unsigned char code) {
  if (fd < 0) return;
  ssize_t w = ::write(fd, &code, 1);
  (void)w;
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  fuse_args args = FUSE_ARGS_INIT(argc, argv);
  Config cfg;
  // What the option parser allocated is freed on every way out of main
  // (LeakSanitizer builds fail on the early returns otherwise).
  struct ArgsGuard {
    fuse_args& a;
    Config& c;
    ~ArgsGuard() {
      fuse_opt_free_args(&a);
      std::free(const_cast<char*>(c.image));
      std::free(const_cast<char*>(c.mountpoint));
      std::free(const_cast<char*>(c.cache));
      std::free(const_cast<char*>(c.view));
      std::free(const_cast<char*>(c.branches));
      std::free(const_cast<char*>(c.layer));
      std::free(const_cast<char*>(c.copyup));
      std::free(const_cast<char*>(c.del));
      std::free(const_cast<char*>(c.crashlog));
    }
  } args_guard{args, cfg};
  if (fuse_opt_parse(&args, &cfg, kOpts, opt_proc) != 0) return 1;
  if (cfg.help) {
    usage();
    return 0;
  }
  if (cfg.version) {
    std::printf("plyfs %s (libfuse %s)\n", PLYFS_VERSION, fuse_pkgversion());
    return 0;
  }
  if (!cfg.image || !cfg.mountpoint) {
    std::fprintf(stderr, "plyfs: IMAGE and MOUNTPOINT are required (plyfs -h for help)\n");
    return 1;
  }
  uint64_t cache = 256ull << 20;
  if (cfg.cache && !parse_size(cfg.cache, cache)) {
    std::fprintf(stderr, "plyfs: bad cache size '%s' (e.g. 256M, at least 1M)\n", cfg.cache);
    return 1;
  }
  if (cfg.spin > 100000) {
    std::fprintf(stderr, "plyfs: bad spin %u (0 to 100000 microseconds)\n", cfg.spin);
    return 1;
  }
  if (cfg.max_threads < 1 || cfg.max_threads > 1024) {
    std::fprintf(stderr, "plyfs: bad max_threads %u (1 to 1024)\n", cfg.max_threads);
    return 1;
  }
  CopyUpMode copyup;
  if (cfg.copyup) {
    std::string m = cfg.copyup;
    unsigned uid, gid, mode;
    if (m == "owner") copyup.kind = CopyUpMode::Owner;
    else if (m == "current") copyup.kind = CopyUpMode::Current;
    else if (std::sscanf(m.c_str(), "const:%u:%u:%o", &uid, &gid, &mode) == 3 && mode <= 07777)
      copyup = CopyUpMode{CopyUpMode::Const, uid, gid, mode};
    else {
      std::fprintf(stderr, "plyfs: bad copyup mode '%s' (owner, current or const:UID:GID:MODE)\n",
                   cfg.copyup);
      return 1;
    }
  }
  DeleteMode del = DeleteMode::Whiteout;
  if (cfg.del) {
    if (std::strcmp(cfg.del, "all") == 0) del = DeleteMode::All;
    else if (std::strcmp(cfg.del, "whiteout") != 0) {
      std::fprintf(stderr, "plyfs: bad delete mode '%s' (whiteout or all)\n", cfg.del);
      return 1;
    }
  }
  if ((cfg.view != nullptr) + (cfg.branches != nullptr) + (cfg.layer != nullptr) > 1) {
    std::fprintf(stderr, "plyfs: view=, branches= and layer= exclude each other\n");
    return 1;
  }
  bool acl = false;
  for (int i = 0; i < args.argc; i++)
    if (std::strstr(args.argv[i], "default_permissions")) acl = true;

  // Claim the image before anything else: a second mount fails here, with
  // the terminal still attached.
  FileOpenOptions fo;
  fo.read_only = cfg.ro;
  auto dev = FileDevice::open(cfg.image, fo);
  if (!dev) {
    if (dev.error().code == EBUSY)
      std::fprintf(stderr, "plyfs: %s is already mounted or in use by another plyfs program\n",
                   cfg.image);
    else std::fprintf(stderr, "plyfs: %s\n", dev.error().message().c_str());
    return 32;
  }

  // Daemonize before any thread starts; the parent waits for the mount.
  int status_fd = -1;
  if (!cfg.foreground) {
    int p[2];
    if (pipe(p) != 0) {
      std::perror("plyfs: pipe");
      return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("plyfs: fork");
      return 1;
    }
    if (pid > 0) {
      ::close(p[1]);
      unsigned char code = 1;
      if (::read(p[0], &code, 1) != 1) code = 1;
      return code;
    }
    ::close(p[0]);
    status_fd = p[1];
    setsid();
  }

  Daemon d;
  g = &d;
  d.acl = acl;
  d.dev = std::move(*dev);
  if (cfg.crashlog) {  // the test suite's crash harness (docs/testing.md)
    auto ld = LogDevice::create(std::move(d.dev), cfg.crashlog);
    if (!ld) {
      std::fprintf(stderr, "plyfs: %s\n", ld.error().message().c_str());
      report(status_fd, 1);
      return 1;
    }
    d.dev = std::move(*ld);
  }
  VolumeOptions vo;
  vo.read_only = cfg.ro;
  vo.kinds = fs_kinds();
  vo.cache_bytes = cache;
  vo.commit_interval_ms = cfg.commit * 1000;
  vo.dirty_limit_bytes = cache / 4;
  if (cfg.commit_stats) vo.on_commit = [](const CommitStats& st) { g_commits.add(st); };
  auto vol = Volume::open(*d.dev, vo);
  if (!vol) {
    std::fprintf(stderr, "plyfs: cannot open %s: %s\n", cfg.image, vol.error().message().c_str());
    report(status_fd, 32);
    return 32;
  }
  d.vol = std::move(*vol);
  // What an interrupted merge or rollback left goes first (format.md#snapshots).
  if (auto r = drop_doomed(*d.vol); !r) {
    std::fprintf(stderr, "plyfs: %s: %s\n", cfg.image, r.error().message().c_str());
    report(status_fd, 32);
    return 32;
  }
  auto stack = cfg.branches ? parse_stack(*d.vol, cfg.branches)
               : cfg.view   ? view_stack(*d.vol, cfg.view)
               : cfg.layer  ? layer_stack(*d.vol, cfg.layer)
                            : default_stack(*d.vol);
  if (!stack) {
    std::fprintf(stderr, "plyfs: %s: %s\n", cfg.image, stack.error().message().c_str());
    report(status_fd, 32);
    return 32;
  }
  std::vector<UnionBranch> ub;
  for (const auto& l : *stack) {
    auto fsr = Filesystem::open(*d.vol, l.tree);
    if (!fsr) {
      std::fprintf(stderr, "plyfs: cannot open branch %llu of %s: %s\n",
                   (unsigned long long)l.tree.v, cfg.image, fsr.error().message().c_str());
      report(status_fd, 32);
      return 32;
    }
    ub.push_back({fsr->get(), l.writable && !cfg.ro});
    d.stack.push_back(ViewLayer{l.tree, l.writable && !cfg.ro});
    d.branches[l.tree.v] = std::move(*fsr);
  }
  d.read_only = cfg.ro;
  d.u = std::make_unique<Union>(std::move(ub), copyup, del);
  ControlFolder::Host host;
  host.vol = d.vol.get();
  host.ctl_mu = &d.ctl_mu;
  host.open_branch = [](TreeId t) -> Result<Filesystem*> {
    auto& f = g->branches[t.v];
    if (!f) f = PLY_TRY(Filesystem::open(*g->vol, t));
    return f.get();
  };
  host.close_branch = [](TreeId t) { g->branches.erase(t.v); };
  host.stack = &d.stack;
  host.errno_of = errno_of;
  host.caller = caller;
  host.mount = d.u.get();
  host.notifier = &d.notifier;
  host.read_only = cfg.ro;
  host.copyup = copyup;
  host.del = del;
  d.ctl = std::make_unique<ControlFolder>(std::move(host));

  fuse_opt_add_arg(&args, "-osubtype=plyfs");
  std::string fsname = std::string("-ofsname=") + cfg.image;
  fuse_opt_add_arg(&args, fsname.c_str());
  fuse_lowlevel_ops ops = make_ops();
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  d.se = se;
  if (!se) {
    report(status_fd, 1);
    return 1;
  }
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, cfg.mountpoint) != 0) {
    std::fprintf(stderr, "plyfs: cannot mount on %s\n", cfg.mountpoint);
    fuse_session_destroy(se);
    report(status_fd, 32);
    return 32;
  }
  // Before the first request (INIT) is read: see kernel_io.h.
  uring::set_logger(log_error);
  want_uring(cfg.uring != 0, 8);
  set_spin(cfg.spin);
  if (!install_kernel_io(se)) log_error("cannot take the session's I/O: writes will cost a GETXATTR each");
  d.notifier.start(se);
  if (!cfg.foreground) {
    openlog("plyfs", LOG_PID, LOG_DAEMON);
    d.daemonized = true;
    int nul = ::open("/dev/null", O_RDWR);
    if (nul >= 0) {
      dup2(nul, 0);
      dup2(nul, 1);
      dup2(nul, 2);
      if (nul > 2) ::close(nul);
    }
    if (chdir("/") != 0) {}
    report(status_fd, 0);
  }

  d.writeback = !cfg.nowriteback;
  d.snap_interval = cfg.snapshot_interval;
  d.snap_keep = cfg.snapshot_keep;
  if (d.snap_interval && !cfg.ro) d.snapper = std::thread(snapper_loop);
  if (!cfg.ro) d.cleaner = std::thread(cleaner_loop);
  fuse_loop_config* lc = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(lc, cfg.max_threads);
  fuse_loop_cfg_set_idle_threads(lc, idle_threads(cfg.max_idle_threads, cfg.max_threads));
  int ret = cfg.debug ? fuse_session_loop(se) : fuse_session_loop_mt(se, lc);
  fuse_loop_cfg_destroy(lc);
  // The snapshot thread stops after the unmount: a snapshot it is taking
  // may be sending the kernel invalidations, which return at once once the
  // connection is gone (and could wait on a lock the kernel holds before).
  fuse_session_unmount(se);
  uring::stop();  // its threads handle requests: before anything below
  if (d.snapper.joinable()) {
    {
      std::lock_guard sl(d.snap_mu);
      d.snap_stop = true;
    }
    d.snap_cv.notify_all();
    d.snapper.join();
  }
  if (d.cleaner.joinable()) {  // after the snapshot thread, whose merges feed it
    {
      std::lock_guard cl(d.clean_mu);
      d.clean_stop = true;
    }
    d.clean_cv.notify_all();
    d.cleaner.join();
  }
  d.notifier.stop();  // as the snapshot thread: after the unmount
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);

  // Whatever the kernel still held is gone now: free the orphans and commit.
  // The session loop returns the number of the signal that ended it: a
  // SIGTERM, SIGINT or SIGHUP is a requested, clean unmount. -ECONNABORTED
  // is an unmount too: a thread took a request off the queue just as the
  // unmount shut the connection (a release of a file closed right before
  // it, say), and the kernel answers that read so instead of with ENODEV,
  // which libfuse counts as the clean end.
  int rc = (ret == 0 || ret == -ECONNABORTED || ret == SIGTERM || ret == SIGINT || ret == SIGHUP) ? 0 : 1;
  if (!d.vol->read_only() && !d.vol->failure()) {
    auto r = d.u->release_all();
    if (r) r = d.ctl->release_all();
    if (!r) {
      log_error("freeing unlinked files failed: %s", r.error().message().c_str());
      rc = 1;
    }
  }
  d.ctl.reset();
  d.u.reset();
  d.branches.clear();
  if (!d.vol->read_only() && !d.vol->failure())
    if (auto r = drop_doomed(*d.vol); !r) {
      log_error("dropping merged branches failed: %s", r.error().message().c_str());
      rc = 1;
    }
  auto c = d.vol->close();
  if (!c) {
    log_error("final commit failed: %s", c.error().message().c_str());
    rc = 1;
  }
  if (cfg.commit_stats) g_commits.report();
  fuse_opt_free_args(&args);
  return rc;
}
