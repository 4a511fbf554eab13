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
// The daemon checks no permission itself: when other users reach the mount
// (allow_other, allow_root) it has the kernel check them (default_permissions,
// plyfs.8 "Permissions").
//
// This file holds main and its steps: the options' checks (before anything
// is claimed: a bad option mounts nothing), the mount point's, the image and
// the union opened, the daemon started and, at unmount, stopped. The rest: options.h (the
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
#include <cerrno>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "blockdev/blockdev.h"
#include "blockdev/device_set.h"
#include "blockdev/log_device.h"
#include "commit/devices.h"
#include "commit/disk_superblock.h"
#include "fs/fs.h"
#include "union/union.h"
#include "union/view.h"
#include "kernel_io.h"
#include "uring.h"
#include "ctl_folder.h"
#include "daemon.h"
#include "options.h"
#include "snap/snap.h"
#include "util/mountinfo.h"

using namespace plyfs;
using namespace plyfs::daemon;

namespace {

// The kernel gives a FUSE mount the readahead of its backing device info
// (read_ahead_kb, 128 KiB by default) and only ever lowers it to what INIT's
// max_readahead asks; so a large file's reads reached the daemon in 128 KiB
// requests, eight for each 1 MiB read (docs/benchmarks.md, "Readahead").
// Root may raise it for this mount's bdi alone, which goes with the mount;
// a lower value set by hand before is raised, a higher one kept.
void raise_readahead(const char* mountpoint) {
  char* rp = ::realpath(mountpoint, nullptr);
  if (!rp) return;
  const std::string want = rp;
  ::free(rp);
  std::string bdi;  // the last mount there is the one just made
  for (const MountEntry& m : read_mountinfo())
    if (m.fstype == "fuse.plyfs" && m.mountpoint == want) bdi = m.majmin;
  if (bdi.empty()) return;
  const std::string path = "/sys/class/bdi/" + bdi + "/read_ahead_kb";
  unsigned long now = 0;
  if (FILE* r = std::fopen(path.c_str(), "r")) {
    if (std::fscanf(r, "%lu", &now) != 1) now = 0;
    std::fclose(r);
  }
  if (now >= kMaxReadahead / 1024) return;
  // Not root, or no sysfs: the kernel's default stays, which costs large
  // reads; said once, as a notice (the mount works as it is).
  FILE* w = std::fopen(path.c_str(), "w");
  bool ok = w != nullptr;
  if (w) {
    ok = std::fprintf(w, "%u\n", kMaxReadahead / 1024) > 0;
    ok = std::fclose(w) == 0 && ok;
  }
  if (!ok)
    log_info("cannot raise %s from %lu to %u (%s): large reads reach the daemon %lu KiB at a time", path.c_str(),
             now, kMaxReadahead / 1024, std::strerror(errno), now);
}

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

// One line, "plyfs: MESSAGE", and the exit code for the waiting parent.
int refuse(int status_fd, int code, const std::string& msg) {
  log_error("%s", msg.c_str());
  report(status_fd, (unsigned char)code);
  return code;
}

// mount(8)'s checks of the mount point, with its words and its exit status
// (32): libfuse mounts on a regular file too, which then answers EIO.
Result<void> check_mountpoint(const char* mp) {
  struct stat st;
  std::string m = "mount point ";
  m += mp;
  if (::stat(mp, &st) != 0) {
    if (errno == ENOENT) return Error::io(ENOENT, m += " does not exist");
    return Error::sys(errno, std::string("cannot access ") += m);
  }
  if (!S_ISDIR(st.st_mode)) return Error::io(ENOTDIR, m += " is not a directory");
  return ok();
}

// Opens the image's volume, the stack the options name and its branches,
// and makes the union and the control folder: 0, or the exit code (told to
// the waiting parent).
int open_union(Daemon& d, const Config& cfg, int status_fd) {
  if (cfg.crashlog) {  // the test suite's crash harness (docs/testing.md)
    auto ld = LogDevice::create(std::move(d.dev), cfg.crashlog);
    if (!ld) return refuse(status_fd, 1, ld.error().message());
    d.dev = std::move(*ld);
  }
  VolumeOptions vo;
  vo.read_only = cfg.ro;
  vo.kinds = fs_kinds();
  vo.movers = fs_movers();
  vo.cache_bytes = cfg.cache_bytes;
  vo.commit_interval_ms = cfg.commit * 1000;
  vo.dirty_limit_bytes = cfg.cache_bytes / 4;
  vo.discard = cfg.discard;
  if (cfg.commit_stats) vo.on_commit = [](const CommitStats& st) { g_commits.add(st); };
  const std::string img = cfg.image;
  auto vol = Volume::open(*d.dev, vo);
  if (!vol) return refuse(status_fd, 32, "cannot open " + img + ": " + vol.error().user_message(img));
  d.vol = std::move(*vol);
  d.vol->extension<MountCompression>().set(cfg.compress);
  d.vol->extension<MountStageDelay>().ms = int64_t(cfg.stage_delay) * 1000;
  // The placement rules of a multi-device volume (format.md#placement-rules):
  // a damaged rule leaves data where the volume puts it by default, and
  // fsck reports it.
  if (!cfg.ro)
    if (auto r = load_placement_rules(*d.vol); !r)
      std::fprintf(stderr, "plyfs: %s: placement rules not in force: %s\n", img.c_str(), r.error().message().c_str());
  // What an interrupted merge or rollback left goes first (format.md#snapshots).
  if (auto r = drop_doomed(*d.vol); !r) return refuse(status_fd, 32, img + ": " + r.error().user_message(img));
  auto stack = cfg.branches ? parse_stack(*d.vol, cfg.branches)
               : cfg.view   ? view_stack(*d.vol, cfg.view)
               : cfg.layer  ? layer_stack(*d.vol, cfg.layer)
                            : default_stack(*d.vol);
  if (!stack) return refuse(status_fd, 32, img + ": " + stack.error().user_message(img));
  if (cfg.view) d.view = cfg.view;
  else if (!cfg.branches && !cfg.layer)
    if (auto views = list_views(*d.vol))
      for (const auto& w : *views)
        if (w.is_default) d.view = w.name;
  std::vector<UnionBranch> ub;
  for (const auto& l : *stack) {
    auto fsr = Filesystem::open(*d.vol, l.tree);
    if (!fsr)
      return refuse(status_fd, 32, "cannot open branch " + std::to_string(l.tree.v) + " of " + img + ": " +
                                       fsr.error().user_message(img));
    ub.push_back({fsr->get(), l.writable && !cfg.ro});
    d.stack.push_back(ViewLayer{l.tree, l.writable && !cfg.ro});
    d.branches[l.tree.v] = std::move(*fsr);
  }
  d.read_only = cfg.ro;
  d.u = std::make_unique<Union>(std::move(ub), cfg.copyup, cfg.del);
  d.u->set_copyup_hook(attributes_changed);
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
  host.copyup = cfg.copyup;
  host.del = cfg.del;
  d.ctl = std::make_unique<ControlFolder>(std::move(host));
  return 0;
}

// Serves requests until the unmount, then stops the threads and lets the
// session go; the session loop's result.
int serve(Daemon& d, const Config& cfg, fuse_session* se) {
  d.writeback = !cfg.nowriteback;
  d.odirect = cfg.odirect;
  d.nbd_cache = cfg.nbd_cache_bytes;
  d.snap_interval = cfg.snapshot_interval;
  d.snap_keep = cfg.snapshot_keep;
  d.timeout = cfg.timeout;
  if (d.snap_interval && !cfg.ro) d.snapper = std::thread(snapper_loop);
  if (!cfg.ro) d.cleaner = std::thread(cleaner_loop);
  if (d.nbd_cache) d.memwatch = std::thread(memory_loop);
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
  if (d.memwatch.joinable()) {
    {
      std::lock_guard ml(d.mem_mu);
      d.mem_stop = true;
    }
    d.mem_cv.notify_all();
    d.memwatch.join();
  }
  d.notifier.stop();  // as the snapshot thread: after the unmount
  d.seeker.stop();
  fuse_remove_signal_handlers(se);
  return ret;
}

// After the unmount: whatever the kernel still held is gone, so the orphans
// are freed, and the last generation is committed. The exit status.
int finish(Daemon& d, const Config& cfg, int ret) {
  // The session loop returns the number of the signal that ended it: a
  // SIGTERM, SIGINT or SIGHUP is a requested, clean unmount. -ECONNABORTED
  // is an unmount too: a thread took a request off the queue just as the
  // unmount shut the connection (a release of a file closed right before
  // it, say), and the kernel answers that read so instead of with ENODEV,
  // which libfuse counts as the clean end.
  int rc = (ret == 0 || ret == -ECONNABORTED || ret == SIGTERM || ret == SIGINT || ret == SIGHUP) ? 0 : 1;
  const std::string img = cfg.image;
  if (!d.vol->read_only() && !d.vol->failure()) {
    auto r = d.u->release_all();
    if (r) r = d.ctl->release_all();
    if (!r) {
      log_error("freeing unlinked files failed: %s", r.error().user_message(img).c_str());
      rc = 1;
    }
  }
  d.ctl.reset();
  d.u.reset();
  d.branches.clear();
  if (!d.vol->read_only() && !d.vol->failure())
    if (auto r = drop_doomed(*d.vol); !r) {
      log_error("dropping merged branches failed: %s", r.error().user_message(img).c_str());
      rc = 1;
    }
  auto c = d.vol->close();
  if (!c) {
    log_error("final commit failed: %s", c.error().user_message(img).c_str());
    rc = 1;
  }
  if (cfg.commit_stats) g_commits.report();
  return rc;
}

// Leaves the foreground: the parent waits for the mount's outcome (a byte
// on a pipe, report()) and exits with it. Before any thread starts. The
// child's end of the pipe, or -1 and the parent's exit code in *code.
int daemonize(int* code) {
  int p[2];
  if (pipe(p) != 0) {
    *code = refuse(-1, 1, Error::sys(errno, "pipe").message());
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    *code = refuse(-1, 1, Error::sys(errno, "fork").message());
    return -1;
  }
  if (pid > 0) {
    ::close(p[1]);
    unsigned char c = 1;
    if (::read(p[0], &c, 1) != 1) c = 1;
    *code = c;
    return -1;
  }
  ::close(p[0]);
  setsid();
  return p[1];
}

}  // namespace

int main(int argc, char** argv) {
  fuse_args args = FUSE_ARGS_INIT(argc, argv);
  // What the option parser allocated is freed on every way out of main
  // (LeakSanitizer builds fail on the early returns otherwise); the
  // Config frees its own strings.
  struct ArgsGuard {
    fuse_args& a;
    ~ArgsGuard() { fuse_opt_free_args(&a); }
  } args_guard{args};
  fuse_set_log_func(libfuse_log);  // libfuse's messages as the daemon's own
  Config cfg;
  if (fuse_opt_parse(&args, &cfg, kOpts, opt_proc) != 0) return 1;
  if (cfg.help) {
    usage();
    return 0;
  }
  if (cfg.version) {
    std::printf("plyfs %s (libfuse %s)\n", PLYFS_VERSION, fuse_pkgversion());
    return 0;
  }
  if (!cfg.image || !cfg.mountpoint) return refuse(-1, 1, "IMAGE and MOUNTPOINT are required (plyfs -h for help)");
  if (auto r = check_options(cfg); !r) return refuse(-1, 1, r.error().message());
  // The daemon checks no permission itself: whoever may reach the mount
  // besides its owner, the kernel must check for (plyfs.8, "Permissions").
  const bool perms_added = others_reach(cfg) && !cfg.default_permissions;
  if (perms_added) {
    fuse_opt_add_arg(&args, "-odefault_permissions");
    cfg.default_permissions = 1;
  }
  fuse_opt_add_arg(&args, "-osubtype=plyfs");
  std::string fsname = "-ofsname=";
  fsname += cfg.image;
  fuse_opt_add_arg(&args, fsname.c_str());
  // libfuse's options are checked before anything is claimed: an unknown
  // one is one line (libfuse_log) and exit 1, nothing mounted.
  fuse_lowlevel_ops ops = make_ops();
  std::unique_ptr<fuse_session, void (*)(fuse_session*)> session(
      fuse_session_new(&args, &ops, sizeof ops, nullptr), fuse_session_destroy);
  if (!session) return 1;
  fuse_session* se = session.get();
  if (auto r = check_mountpoint(cfg.mountpoint); !r) return refuse(-1, 32, r.error().message());

  // Claim the image before anything else: a second mount fails here, with
  // the terminal still attached.
  FileOpenOptions fo;
  fo.read_only = cfg.ro;
  fo.direct = cfg.odirect;
  fo.nbd_cache_bytes = cfg.nbd_cache_bytes;
  auto dev = open_volume(cfg.image, cfg.devices, fo);
  if (!dev) {
    // The image itself in use: a second mount. Another device of its volume
    // in use: the device layer's message names that one. Which it is, the
    // image alone tells: opened by itself, it is busy or it is not.
    if (dev.error().code == EBUSY) {
      auto self = open_device(cfg.image, fo);
      if (!self && self.error().code == EBUSY)
        return refuse(-1, 32, std::string(cfg.image) += " is already mounted or in use by another plyfs program");
    }
    return refuse(-1, 32, dev.error().user_message(cfg.image));
  }

  // Daemonize before any thread starts; the parent waits for the mount.
  int status_fd = -1;
  if (!cfg.foreground) {
    // An NBD connection must not outlive the fork in two processes: the
    // parent's exit would end it (NBD_CMD_DISC). It was made to refuse
    // here, on the terminal; the daemon makes its own (NBD takes no lock
    // that the gap could lose).
    const bool nbd = is_nbd_uri(cfg.image);
    if (nbd) dev->reset();
    int code = 0;
    status_fd = daemonize(&code);
    if (status_fd < 0) return code;
    if (nbd) {
      auto again = open_volume(cfg.image, cfg.devices, fo);
      if (!again) return refuse(status_fd, 32, again.error().user_message(cfg.image));
      *dev = std::move(*again);
    }
  }

  // A volume of one device, mounted read-write, is held as a set of that
  // device alone: it can then take a second one while mounted
  // (format.md#device-convert); the set grows and is cut with the device.
  if (!cfg.ro && !(*dev)->device_set()) {
    auto set = one_device_set(std::move(*dev), cfg.image);
    if (!set) return refuse(status_fd, 32, set.error().user_message(cfg.image));
    *dev = std::move(*set);
  }

  Daemon d;
  g = &d;
  d.image = cfg.image;
  d.acl = cfg.default_permissions;
  d.dev = std::move(*dev);
  if (int code = open_union(d, cfg, status_fd)) return code;
  d.se = se;
  if (fuse_set_signal_handlers(se) != 0) return refuse(status_fd, 1, "cannot set the signal handlers");
  const unsigned said = libfuse_errors();
  if (fuse_session_mount(se, cfg.mountpoint) != 0) {
    // libfuse said why, as one line, unless a helper (fusermount3) did.
    if (libfuse_errors() == said) log_error("cannot mount on %s", cfg.mountpoint);
    fuse_remove_signal_handlers(se);
    report(status_fd, 32);
    return 32;
  }
  raise_readahead(cfg.mountpoint);
  // Before the first request (INIT) is read: see kernel_io.h.
  uring::set_logger(log_error);
  want_uring(cfg.uring != 0, 8);
  set_spin(cfg.spin);
  if (!install_kernel_io(se)) log_error("cannot take the session's I/O: writes will cost a GETXATTR each");
  d.notifier.start(se);
  d.seeker.start(se);
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
  if (perms_added)
    log_info("%s: other users reach the mount: default_permissions is on, the kernel checks "
             "permissions",
             cfg.allow_other ? "allow_other" : "allow_root");

  const int ret = serve(d, cfg, se);
  session.reset();
  return finish(d, cfg, ret);
}
