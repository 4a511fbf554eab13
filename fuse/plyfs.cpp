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
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "blockdev/blockdev.h"
#include "blockdev/log_device.h"
#include "fs/fs.h"
#include "union/union.h"
#include "union/view.h"
#include "control.h"
#include "kernel_io.h"
#include "uring.h"
#include "ctl_folder.h"
#include "notifier.h"
#include "snap/snap.h"

using namespace plyfs;

namespace {

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
  // max_idle_threads of them waiting for requests (0: the default, below).
  unsigned max_threads = 16, max_idle_threads = 0;
  unsigned spin = 100;  // -o spin=MICROSECONDS (kernel_io.h)
};

enum { KEY_HELP, KEY_VERSION, KEY_FG, KEY_DEBUG, KEY_RO };

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

// --- the daemon's state -------------------------------------------------------

struct Daemon {
  std::unique_ptr<BlockDevice> dev;
  std::unique_ptr<Volume> vol;
  // Every branch opened since the mount, by tree id: kept until unmount,
  // because an operation that began before a restack may still use one.
  std::map<uint64_t, std::unique_ptr<Filesystem>> branches;
  std::unique_ptr<Union> u;
  std::unique_ptr<ControlFolder> ctl;  // every branch's view, under .plyfs
  Notifier notifier;                   // the invalidations for those views' caches (notifier.h)
  fuse_session* se = nullptr;
  std::mutex ctl_mu;                // one branch change at a time
  std::vector<ViewLayer> stack;     // what the union shows, under ctl_mu
  // Automatic snapshots (-o snapshot_interval, snapshot_keep).
  unsigned snap_interval = 0, snap_keep = 0;
  std::thread snapper;
  std::mutex snap_mu;
  std::condition_variable snap_cv;
  bool snap_stop = false;
  // The cleaner: drops the branches a merge or rollback doomed, after the
  // command that doomed them returned (format.md#snapshots, "Online").
  std::thread cleaner;
  std::mutex clean_mu;
  std::condition_variable clean_cv;
  bool clean_pending = false, clean_stop = false;
  bool read_only = false;
  bool daemonized = false;
  bool acl = false;
  bool dont_mask = false;  // the kernel leaves the umask to us (ACLs on)
  bool no_opendir = false; // the kernel can do without opendir
  bool writeback = true;    // ask for the kernel's writeback cache
  double timeout = 60.0;  // every change goes through this daemon
};
Daemon* g = nullptr;

void log_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (g && g->daemonized) {
    vsyslog(LOG_ERR, fmt, ap);
  } else {
    std::fputs("plyfs: ", stderr);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
  }
  va_end(ap);
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

Union& fs() { return *g->u; }
uint64_t to_fs(fuse_ino_t i) { return i == FUSE_ROOT_ID ? fs().root() : i; }
fuse_ino_t to_fuse(uint64_t i) { return i == fs().root() ? FUSE_ROOT_ID : i; }

// The single place errors become errno replies. Damage and device errors
// are EIO to the caller, logged, and turn the mount read-only.
int errno_of(const Error& e) {
  if (e.code == EUCLEAN || e.code == EIO) {
    log_error("%s", e.message().c_str());
    g->u->fail(e);
    return EIO;
  }
  return e.code;
}
void reply_err(fuse_req_t req, const Error& e) { fuse_reply_err(req, errno_of(e)); }

// A change through the mount, before its reply: the views of .plyfs that
// show a branch the mount writes to drop what the kernel holds stale of
// them (format.md#control-folder, "Caching"). Nothing to do, and no lock
// taken, while no view is open.
void changed(std::initializer_list<ViewChange> cs) {
  if (cs.size() && g->ctl->has_views()) g->ctl->mount_changed(std::vector<ViewChange>(cs));
}

struct stat to_stat(const Attr& a) { return stat_of(a, to_fuse(a.ino), fs().block_size()); }

fuse_entry_param to_entry(const Attr& a) {
  fuse_entry_param e{};
  e.ino = to_fuse(a.ino);
  e.generation = a.generation;
  e.attr = to_stat(a);
  e.attr_timeout = g->timeout;
  e.entry_timeout = g->timeout;
  return e;
}

// `cs`: what a successful operation changed (none for a lookup).
void reply_entry(fuse_req_t req, const Result<Attr>& a, std::initializer_list<ViewChange> cs = {}) {
  if (!a) return reply_err(req, a.error());
  fuse_entry_param e = to_entry(*a);  // the union counted the reference
  changed(cs);
  if (fuse_reply_entry(req, &e) != 0) (void)fs().unpin(a->ino);
}

uint32_t umask_of(const fuse_ctx* c) { return g->dont_mask ? c->umask : 0; }
Caller caller(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  return Caller{c->uid, c->gid, umask_of(c)};
}

// Clears setuid/setgid before a change when `kill` (kernel_io.h), and then
// drops the kernel's cached attributes of the file: a write's or open's
// reply carries none, and the kernel would show the old mode until its
// attribute timeout. An attributes-only invalidation takes no lock the
// request holds, so it is safe from inside the request.
Result<void> kill_setid(fuse_req_t req, fuse_ino_t ino, bool kill) {
  if (PLY_TRY(kill_setid_before_change(fs(), to_fs(ino), kill, caller(req))))
    fuse_lowlevel_notify_inval_inode(g->se, ino, -1, 0);
  return ok();
}

// --- operations ---------------------------------------------------------------------

void op_init(void*, fuse_conn_info* conn) {
  // The writeback cache makes the kernel the owner of an open file's size
  // and times (format.md#control-folder, "Caching"); -o nowriteback leaves
  // them to the daemon.
  if (g->writeback && (conn->capable & FUSE_CAP_WRITEBACK_CACHE)) {
    conn->want |= FUSE_CAP_WRITEBACK_CACHE;
    g->u->set_kernel_times(true);  // the kernel owns mtime/ctime of written files
    g->ctl->set_kernel_times(true);
  }
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  // With ACLs the filesystem applies the umask itself, because a default
  // ACL replaces it (lib/fs/acl.h).
  if (g->acl && (conn->capable & FUSE_CAP_POSIX_ACL) && (conn->capable & FUSE_CAP_DONT_MASK)) {
    conn->want |= FUSE_CAP_POSIX_ACL | FUSE_CAP_DONT_MASK;
    g->dont_mask = true;
  }
  if (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) g->no_opendir = true;
  conn->max_write = 1u << 20;
  conn->max_readahead = 1u << 20;
  // No splice (FUSE_CAP_SPLICE_READ/WRITE/MOVE): every data block is
  // checksummed on its way in and verified on its way out (format.md#fs-extent),
  // so the bytes pass through the daemon's memory anyway; splicing from
  // /dev/fuse into a pipe would add a copy out of the pipe, not save one.
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (is_ctl(parent)) return g->ctl->lookup(req, parent, name);
  if (is_ctl_name(parent, name)) return g->ctl->lookup_root(req);  // shadows a branch's .plyfs
  auto a = fs().lookup(to_fs(parent), name);
  if (!a && a.error().code == ENOENT) {
    fuse_entry_param e{};  // a negative entry, cached like a positive one
    e.entry_timeout = g->timeout;
    fuse_reply_entry(req, &e);
    return;
  }
  reply_entry(req, a);
}

void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  if (is_ctl(ino)) {
    g->ctl->forget(ino, n);
    return fuse_reply_none(req);
  }
  auto r = fs().unpin(to_fs(ino), n);
  if (!r) (void)errno_of(r.error());
  fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, size_t count, fuse_forget_data* list) {
  for (size_t i = 0; i < count; i++) {
    if (is_ctl(list[i].ino)) {
      g->ctl->forget(list[i].ino, list[i].nlookup);
      continue;
    }
    auto r = fs().unpin(to_fs(list[i].ino), list[i].nlookup);
    if (!r) (void)errno_of(r.error());
  }
  fuse_reply_none(req);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (is_ctl(ino)) return g->ctl->getattr(req, ino);
  auto a = fs().getattr(to_fs(ino));
  if (!a) return reply_err(req, a.error());
  struct stat st = to_stat(*a);
  fuse_reply_attr(req, &st, g->timeout);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* st, int valid, fuse_file_info*) {
  if (is_ctl(ino)) return g->ctl->setattr(req, ino, st, valid);
  auto a = fs().setattr(to_fs(ino), setattr_of(st, valid), caller(req));
  if (!a) return reply_err(req, a.error());
  struct stat out = to_stat(*a);
  changed({(valid & FUSE_SET_ATTR_SIZE) ? ViewChange::data(to_fs(ino), uint64_t(st->st_size), 0) : ViewChange::attr(to_fs(ino))});
  fuse_reply_attr(req, &out, g->timeout);
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  if (is_ctl(ino)) return g->ctl->readlink(req, ino);
  auto t = fs().readlink(to_fs(ino));
  if (!t) return reply_err(req, t.error());
  fuse_reply_readlink(req, t->c_str());
}

void op_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  if (is_ctl(parent)) return g->ctl->mknod(req, parent, name, mode, rdev);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  reply_entry(req, fs().mknod(to_fs(parent), name, mode, rdev, caller(req)), {ViewChange::entry(to_fs(parent), name)});
}

void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  if (is_ctl(parent)) return g->ctl->mkdir(req, parent, name, mode);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  reply_entry(req, fs().mkdir(to_fs(parent), name, mode, caller(req)), {ViewChange::entry(to_fs(parent), name)});
}

void op_symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  if (is_ctl(parent)) return g->ctl->symlink(req, target, parent, name);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  reply_entry(req, fs().symlink(to_fs(parent), name, target, caller(req)), {ViewChange::entry(to_fs(parent), name)});
}

void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char* name) {
  if (is_ctl(ino) || is_ctl(parent)) return g->ctl->link(req, ino, parent, name);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  reply_entry(req, fs().link(to_fs(ino), to_fs(parent), name, caller(req)),
              {ViewChange::entry(to_fs(parent), name), ViewChange::attr(to_fs(ino))});
}

void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (is_ctl(parent)) return g->ctl->unlink(req, parent, name);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EBUSY);
  auto r = fs().unlink(to_fs(parent), name);
  if (r) changed({ViewChange::entry(to_fs(parent), name)});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (is_ctl(parent)) return g->ctl->rmdir(req, parent, name);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EBUSY);
  auto r = fs().rmdir(to_fs(parent), name);
  if (r) changed({ViewChange::entry(to_fs(parent), name)});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
               const char* newname, unsigned flags) {
  if (is_ctl(parent) || is_ctl(newparent))
    return g->ctl->rename(req, parent, name, newparent, newname, flags);
  if (is_ctl_name(parent, name) || is_ctl_name(newparent, newname))
    return (void)fuse_reply_err(req, EBUSY);
  auto r = fs().rename(to_fs(parent), name, to_fs(newparent), newname, flags, caller(req));
  if (r) changed({ViewChange::entry(to_fs(parent), name), ViewChange::entry(to_fs(newparent), newname)});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (is_ctl(ino)) return g->ctl->open(req, ino, fi);
  auto a = fs().getattr(to_fs(ino));
  if (!a) return reply_err(req, a.error());
  if (S_ISDIR(a->mode)) return (void)fuse_reply_err(req, EISDIR);
  const bool for_write = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
  if (for_write && fs().read_only()) return (void)fuse_reply_err(req, EROFS);
  // Held until release: the file outlives its last name meanwhile. A file
  // deleted since the kernel looked it up gives ESTALE, and the kernel
  // looks the name up again (union.h, hold).
  if (auto h = fs().hold(to_fs(ino)); !h) return reply_err(req, h.error());
  auto fail = [&](const Error& e) {
    (void)fs().unhold(to_fs(ino));
    reply_err(req, e);
  };
  // A file of a read-only branch is copied up now, so that the writes of
  // this handle land in a writable branch.
  if (for_write) {
    auto o = fs().open(to_fs(ino), true, caller(req));
    if (!o) return fail(o.error());
  }
  // libfuse turns on FUSE_CAP_ATOMIC_O_TRUNC by default: the kernel then
  // sends O_TRUNC here instead of a SETATTR, and trusts the open to truncate.
  if ((fi->flags & O_TRUNC) && S_ISREG(a->mode)) {
    if (auto k = kill_setid(req, ino, request_kills_setid()); !k) return fail(k.error());
    SetAttr s;
    s.size = 0;
    auto t = fs().setattr(to_fs(ino), s, caller(req));
    if (!t) return fail(t.error());
    changed({ViewChange::data(to_fs(ino), 0, 0)});
  }
  fi->keep_cache = 1;  // only this daemon changes the files
  if (fuse_reply_open(req, fi) != 0) (void)fs().unhold(to_fs(ino));
}

void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
               fuse_file_info* fi) {
  if (is_ctl(parent)) return g->ctl->create(req, parent, name, mode, fi);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  auto a = fs().mknod(to_fs(parent), name, S_IFREG | (mode & 07777), 0, caller(req));
  if (!a) return reply_err(req, a.error());
  changed({ViewChange::entry(to_fs(parent), name)});
  // Held as op_open holds (another thread may have deleted it already).
  if (auto h = fs().hold(a->ino); !h) {
    (void)fs().unpin(a->ino);
    return reply_err(req, h.error());
  }
  fuse_entry_param e = to_entry(*a);
  fi->keep_cache = 1;
  if (fuse_reply_create(req, &e, fi) != 0) {
    (void)fs().unhold(a->ino);
    (void)fs().unpin(a->ino);
  }
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  if (is_ctl(ino)) return g->ctl->read(req, ino, size, off, fi);
  thread_local std::vector<std::byte> buf;
  buf.resize(size);
  auto n = fs().read(to_fs(ino), uint64_t(off), buf);
  if (!n) return reply_err(req, n.error());
  fuse_reply_buf(req, reinterpret_cast<const char*>(buf.data()), *n);
}

void op_write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off,
              fuse_file_info*) {
  if (is_ctl(ino)) return g->ctl->write(req, ino, data, size, off);
  if (auto k = kill_setid(req, ino, request_kills_setid()); !k) return reply_err(req, k.error());
  auto n = fs().write(to_fs(ino), uint64_t(off),
                      std::span(reinterpret_cast<const std::byte*>(data), size), caller(req));
  if (!n) return reply_err(req, n.error());
  changed({ViewChange::data(to_fs(ino), uint64_t(off), *n)});
  fuse_reply_write(req, *n);
}

// No flush: the daemon holds no state per handle and no POSIX locks (the
// kernel keeps those), and the kernel writes a file's cached pages back
// before it would send FLUSH, reporting their errors at close, with or
// without it. Unimplemented, libfuse answers ENOSYS once and the kernel
// stops sending FLUSH: one round trip fewer per close(2).
void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (is_ctl(ino)) return g->ctl->release(req, ino, fi);
  auto r = fs().unhold(to_fs(ino));
  if (!r) (void)errno_of(r.error());  // logged; the handle is gone regardless
  fuse_reply_err(req, 0);
}

void op_fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  if (is_ctl(ino)) return g->ctl->fsync(req, ino);
  auto r = fs().sync();
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

// Directories need no open state (readdir takes the inode and a cookie).
// Answering ENOSYS once turns on the kernel's zero-message opendir
// (FUSE_CAP_NO_OPENDIR_SUPPORT): later opendir and releasedir calls are not
// sent at all, two round trips fewer per directory listing.
void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (g->no_opendir) return (void)fuse_reply_err(req, ENOSYS);
  if (is_ctl(ino)) return g->ctl->opendir(req, ino, fi);
  auto a = fs().getattr(to_fs(ino));
  if (!a) return reply_err(req, a.error());
  if (!S_ISDIR(a->mode)) return (void)fuse_reply_err(req, ENOTDIR);
  fi->cache_readdir = 0;
  fuse_reply_open(req, fi);
}

void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  if (is_ctl(ino)) return g->ctl->readdir(req, ino, size, off, plus);
  // The root does not list the control folder (nor a branch's entry of that name).
  const bool root = ino == FUSE_ROOT_ID;
  std::vector<char> buf(size);
  size_t used = 0;
  Result<void> r = ok();
  if (!plus) {
    r = fs().readdir(to_fs(ino), uint64_t(off), [&](const DirEntry& d) {
      if (root && d.name == kControlFolder) return true;
      std::string name(d.name);
      struct stat st{};
      st.st_ino = to_fuse(d.ino);
      st.st_mode = mode_t(DTTOIF(d.type));
      size_t need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st,
                                      off_t(d.next));
      if (need > size - used) return false;
      used += need;
      return true;
    });
  } else {
    // The union resolves each entry from what the listing read, and counts
    // a reference for each one accepted here: the kernel counts a lookup
    // for every entry it links.
    r = fs().readdirplus(to_fs(ino), uint64_t(off), [&](const DirEntry& d, const Attr* a) {
      if (root && d.name == kControlFolder) {
        if (a) (void)fs().unpin(a->ino);  // counted, not handed out
        return true;
      }
      std::string name(d.name);
      fuse_entry_param e{};
      if (a) {
        e = to_entry(*a);
      } else {
        e.attr.st_ino = to_fuse(d.ino);
        e.attr.st_mode = S_IFDIR;
      }
      size_t need = fuse_add_direntry_plus(req, buf.data() + used, size - used, name.c_str(), &e,
                                           off_t(d.next));
      if (need > size - used) return false;
      used += need;
      return true;
    });
  }
  if (!r && used == 0) return reply_err(req, r.error());
  fuse_reply_buf(req, buf.data(), used);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_common(req, ino, size, off, false);
}
void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_common(req, ino, size, off, true);
}
void op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void op_statfs(fuse_req_t req, fuse_ino_t) {
  auto s = fs().statfs();
  struct statvfs v{};
  v.f_bsize = s.bsize;
  v.f_frsize = s.bsize;
  v.f_blocks = s.blocks;
  v.f_bfree = s.bfree;
  v.f_bavail = s.bavail;
  v.f_files = s.files;
  v.f_ffree = s.ffree;
  v.f_favail = s.ffree;
  v.f_namemax = s.namemax;
  fuse_reply_statfs(req, &v);
}

void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value,
                 size_t size, int flags) {
  if (is_ctl(ino)) return g->ctl->setxattr(req, ino, name, value, size, flags);
  auto r = fs().setxattr(to_fs(ino), name,
                         std::span(reinterpret_cast<const std::byte*>(value), size), flags,
                         caller(req));
  if (r) changed({ViewChange::attr(to_fs(ino))});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  if (is_ctl(ino)) return g->ctl->getxattr(req, ino, name, size);
  auto v = fs().getxattr(to_fs(ino), name);
  if (!v) return reply_err(req, v.error());
  if (size == 0) return (void)fuse_reply_xattr(req, v->size());
  if (size < v->size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, reinterpret_cast<const char*>(v->data()), v->size());
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  if (is_ctl(ino)) return g->ctl->listxattr(req, ino, size);
  auto names = fs().listxattr(to_fs(ino));
  if (!names) return reply_err(req, names.error());
  reply_xattr_names(req, *names, size);
}

void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  if (is_ctl(ino)) return g->ctl->removexattr(req, ino, name);
  auto r = fs().removexattr(to_fs(ino), name, caller(req));
  if (r) changed({ViewChange::attr(to_fs(ino))});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
                  fuse_file_info*) {
  if (off < 0 || len <= 0) return (void)fuse_reply_err(req, EINVAL);
  if (is_ctl(ino)) return g->ctl->fallocate(req, ino, mode, off, len);
  if (auto k = kill_setid(req, ino, unprivileged(req)); !k) return reply_err(req, k.error());
  auto r = fs().fallocate(to_fs(ino), mode, uint64_t(off), uint64_t(len), caller(req));
  if (r) changed({ViewChange::data(to_fs(ino), uint64_t(off), uint64_t(len))});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, fuse_file_info*) {
  if (off < 0) return (void)fuse_reply_err(req, ENXIO);
  if (is_ctl(ino)) return g->ctl->lseek(req, ino, off, whence);
  auto r = fs().lseek(to_fs(ino), uint64_t(off), whence);
  if (!r) return reply_err(req, r.error());
  fuse_reply_lseek(req, off_t(*r));
}

void op_copy_file_range(fuse_req_t req, fuse_ino_t in, off_t off_in, fuse_file_info*,
                        fuse_ino_t out, off_t off_out, fuse_file_info*, size_t len, int flags) {
  if (flags) return (void)fuse_reply_err(req, EINVAL);
  if (is_ctl(in) || is_ctl(out)) return g->ctl->copy_file_range(req, in, off_in, out, off_out, len);
  if (auto k = kill_setid(req, out, unprivileged(req)); !k) return reply_err(req, k.error());
  auto r = fs().copy_range(to_fs(in), uint64_t(off_in), to_fs(out), uint64_t(off_out), len,
                           caller(req));
  if (!r) return reply_err(req, r.error());
  changed({ViewChange::data(to_fs(out), uint64_t(off_out), *r)});
  fuse_reply_write(req, size_t(*r));
}

// --- live branch changes (fuse/control.h) -------------------------------------------------

// Drops what the kernel cached of names and attributes after a restack:
// every object the union knows, and every name the new stack shows in a
// known directory (the kernel may hold a negative entry for it).
void invalidate_all() {
  std::set<uint64_t> dirs{g->u->root()};
  for (const auto& k : g->u->known()) {
    dirs.insert(k.parent);
    (void)fuse_lowlevel_notify_inval_entry(g->se, to_fuse(k.parent), k.name.c_str(), k.name.size());
    (void)fuse_lowlevel_notify_inval_inode(g->se, to_fuse(k.ino), 0, 0);
  }
  for (uint64_t d : dirs) {
    std::vector<std::string> names;
    (void)g->u->readdir(d, 2, [&](const DirEntry& e) {
      names.emplace_back(e.name);
      return true;
    });
    for (const auto& n : names)
      (void)fuse_lowlevel_notify_inval_entry(g->se, to_fuse(d), n.c_str(), n.size());
  }
  (void)fuse_lowlevel_notify_inval_inode(g->se, FUSE_ROOT_ID, 0, 0);
}

Result<std::string> control(const std::string& request, bool may_change);

// The union's branches for a stack, opening those not open yet.
Result<std::vector<UnionBranch>> union_branches(const std::vector<ViewLayer>& s) {
  std::vector<UnionBranch> ub;
  for (const auto& l : s) {
    auto& f = g->branches[l.tree.v];
    if (!f) f = PLY_TRY(Filesystem::open(*g->vol, l.tree));
    ub.push_back({f.get(), l.writable});
  }
  return ub;
}

// Snapshot, merge or rollback of the mounted stack (format.md#snapshots,
// "Online"), under ctl_mu. Each runs inside Union::restack's prepare step,
// while no operation runs and no data change is landing, so that a snapshot
// holds every write that finished before it and none after, and a merge
// sees the upper branch hold still. When the restack returns nothing uses
// the replaced (doomed) branches: they are closed and dropped at once (or
// at the next mount, after a crash).
Result<std::string> lifecycle(const std::string& cmd, const std::string& name) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  // No operation of the control folder's views runs meanwhile (ctl_folder.h C2).
  auto views_held = g->ctl->hold();
  // The mounted stack is checked like a view before anything changes (snap.h):
  // a merge needs the lower branch right below the upper one, a rollback
  // the branch in the stack.
  if (cmd != "snapshot") {
    BranchMeta b = PLY_TRY(find_branch(*g->vol, name));
    auto at = std::find_if(g->stack.begin(), g->stack.end(), [&](const ViewLayer& l) { return l.tree == b.tree; });
    if (at == g->stack.end()) return Error::io(ENOENT, "branch \"" + b.name + "\" is not in the mounted stack");
    if (cmd == "merge" && (at + 1 == g->stack.end() || (at + 1)->tree != b.parent))
      return Error::io(EBUSY, "the mount does not show \"" + b.name + "\" right above the branch it is on");
  }
  std::vector<ViewLayer> next;
  std::vector<TreeId> replaced;  // branches a merge or rollback doomed
  bool changed = false;  // the image changed: the mount must follow or stop
  auto r = g->u->restack([&]() -> Result<std::vector<UnionBranch>> {
    if (cmd == "snapshot") {
      auto top = std::find_if(g->stack.begin(), g->stack.end(), [](const ViewLayer& l) { return l.writable; });
      if (top == g->stack.end()) return Error::io(EROFS, "the stack has no writable branch");
      std::string snap = name;
      if (snap.empty()) snap = PLY_TRY(snapshot_name(*g->vol, PLY_TRY(Filesystem::branch(*g->vol, top->tree)).name));
      next = PLY_TRY(snapshot(*g->vol, g->stack, snap)).stack;
      changed = true;
    } else {
      BranchMeta b = PLY_TRY(find_branch(*g->vol, name));
      next = g->stack;
      if (cmd == "merge") {
        auto it = g->branches.find(b.tree.v);
        Merge m = PLY_TRY(merge(*g->vol, b.tree, it == g->branches.end() ? nullptr : it->second.get()));
        changed = true;
        replaced = {m.upper, m.lower};
        for (auto& l : next)
          if (l.tree == m.upper) l.tree = m.merged.tree;
        std::erase_if(next, [&](const ViewLayer& l) { return l.tree == m.lower; });
      } else {
        BranchMeta fresh = PLY_TRY(rollback(*g->vol, b.tree));
        changed = true;
        replaced = {b.tree};
        for (auto& l : next)
          if (l.tree == b.tree) l.tree = fresh.tree;
      }
    }
    return union_branches(next);
  });
  if (!r) {
    // The branches changed but the union could not follow: writing on into
    // a branch that is now doomed would lose the writes at unmount.
    if (changed) g->vol->fail(r.error());
    return r.error();
  }
  g->stack = next;
  g->ctl->refresh();  // before the replaced branches close
  // Once the restack returned, nothing uses the replaced branches: they
  // close now, and the cleaner drops them once the command has returned,
  // so that what the freeing costs (it follows the data the merge
  // replaced) is not the command's. Their DOOMED flags are durable with
  // the swap: after a crash the next mount drops them.
  for (TreeId t : replaced) g->branches.erase(t.v);
  // Durable when the command returns, as btrfs's snapshots are.
  PLY_CHECK(g->vol->commit());
  if (!replaced.empty()) {
    std::lock_guard cl(g->clean_mu);
    g->clean_pending = true;
    g->clean_cv.notify_all();
  }
  // A snapshot or a merge shows the same view, with the same inode numbers
  // and attributes: what the kernel cached stays true. A rollback does not.
  if (cmd == "rollback") invalidate_all();
  return format_stack(*g->vol, g->stack);
}

// Drops doomed branches whenever a merge or rollback made some, as btrfs's
// cleaner frees deleted subvolumes: under ctl_mu, like the branch changes,
// so that no view of the control folder opens a branch meanwhile. At
// unmount it finishes what is pending before it stops.
void cleaner_loop() {
  std::unique_lock lk(g->clean_mu);
  for (;;) {
    g->clean_cv.wait(lk, [] { return g->clean_pending || g->clean_stop; });
    if (!g->clean_pending) return;
    g->clean_pending = false;
    lk.unlock();
    {
      std::lock_guard cl(g->ctl_mu);
      auto views_held = g->ctl->hold();
      auto d = drop_doomed(*g->vol);
      if (!d) log_error("dropping replaced branches: %s", d.error().message().c_str());
      else if (*d)
        if (auto c = g->vol->commit(); !c) log_error("commit after dropping branches: %s", c.error().message().c_str());
    }
    lk.lock();
  }
}

// Automatic snapshots: every interval, a snapshot of the stack; beyond
// `keep` snapshots of the live branch (the read-only branches named
// LIVE@... right below it), the oldest goes by merging the next one into it.
void snapper_loop() {
  std::unique_lock lk(g->snap_mu);
  for (;;) {
    if (g->snap_cv.wait_for(lk, std::chrono::seconds(g->snap_interval), [] { return g->snap_stop; })) return;
    lk.unlock();
    auto r = control("snapshot", true);
    if (!r) log_error("automatic snapshot failed: %s", r.error().message().c_str());
    while (r && g->snap_keep) {
      std::vector<std::string> snaps;  // newest first
      {
        std::lock_guard cl(g->ctl_mu);
        auto top = std::find_if(g->stack.begin(), g->stack.end(), [](const ViewLayer& l) { return l.writable; });
        auto live = top == g->stack.end() ? Result<BranchMeta>(Error::io(ENOENT, "")) : Filesystem::branch(*g->vol, top->tree);
        if (!live) break;
        for (auto it = top + 1; it != g->stack.end() && !it->writable; ++it) {
          auto b = Filesystem::branch(*g->vol, it->tree);
          if (!b || b->name.rfind(snapshot_prefix(live->name), 0) != 0) break;
          snaps.push_back(b->name);
        }
      }
      if (snaps.size() <= g->snap_keep || snaps.size() < 2) break;
      auto m = control("merge " + snaps[snaps.size() - 2], true);
      if (!m) {
        log_error("dropping snapshot %s failed: %s", snaps.back().c_str(), m.error().message().c_str());
        break;
      }
    }
    lk.lock();
  }
}

// Diffs of the mount's branches, paged out through the control channel
// (control.h): a diff's whole text waits under a random token until its
// last chunk is read or it is closed. A client that dies leaves its text
// behind, so at most kMax texts wait, of at most kMaxBytes in all: a new
// diff pushes out the oldest, whose reader then gets ENOENT. Under ctl_mu.
struct PendingDiffs {
  static constexpr size_t kMax = 4;
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  static constexpr size_t kChunk = sizeof(ControlMsg::answer) - 1;
  struct Text {
    std::string token, text;
  };
  std::deque<Text> q;  // oldest first
  std::mt19937_64 rng{std::random_device{}()};
};
PendingDiffs pending;

// `diff FROM TO [json]`: the text plyctl prints offline (format_diff), of
// a durable generation: the commit and the diff run while no operation
// does, so the diff holds every change that finished before it.
Result<std::string> start_diff(const std::string& from, const std::string& to, const std::string& json) {
  if (!json.empty() && json != "json") return Error::invalid("diff takes json or nothing, not \"" + json + "\"");
  const BranchMeta a = PLY_TRY(find_branch(*g->vol, from));
  const BranchMeta b = PLY_TRY(find_branch(*g->vol, to));
  std::string text;
  PLY_CHECK(g->u->hold_still([&]() -> Result<void> {
    if (!g->read_only) PLY_CHECK(g->vol->commit());
    text = format_diff(PLY_TRY(diff(*g->vol, a.tree, b.tree)), !json.empty());
    return ok();
  }));
  if (text.size() > PendingDiffs::kMaxBytes)
    return Error::io(EFBIG, "the diff is too large to send from the mount (" + std::to_string(text.size()) +
                                " bytes): diff the image unmounted");
  size_t held = text.size();
  for (const auto& t : pending.q) held += t.text.size();
  while (!pending.q.empty() && (pending.q.size() >= PendingDiffs::kMax || held > PendingDiffs::kMaxBytes)) {
    held -= pending.q.front().text.size();
    pending.q.pop_front();
  }
  char token[17];
  std::snprintf(token, sizeof token, "%016llx", (unsigned long long)pending.rng());
  const std::string answer = std::string(token) + " " + std::to_string(text.size());
  if (!text.empty()) pending.q.push_back({token, std::move(text)});  // no read would free it
  return answer;
}

// `read TOKEN OFFSET` and `close TOKEN`; the read that reaches the end frees the text.
Result<std::string> page_diff(const std::string& cmd, const std::string& token, const std::string& offset) {
  auto it = std::find_if(pending.q.begin(), pending.q.end(), [&](const auto& t) { return t.token == token; });
  if (it == pending.q.end())
    return Error::io(ENOENT, "no diff waits under \"" + token + "\" (read to its end, closed, or pushed out by newer ones)");
  if (cmd == "close") {
    pending.q.erase(it);
    return std::string("closed");
  }
  char* end = nullptr;
  const unsigned long long off = std::strtoull(offset.c_str(), &end, 10);
  if (offset.empty() || *end || off > it->text.size())
    return Error::invalid("offset must be 0 to " + std::to_string(it->text.size()) + ", not \"" + offset + "\"");
  std::string chunk = it->text.substr(size_t(off), PendingDiffs::kChunk);
  if (off + chunk.size() >= it->text.size()) pending.q.erase(it);
  return chunk;
}

// Runs one control request; the answer is the stack afterwards.
Result<std::string> control(const std::string& request, bool may_change) {
  std::istringstream in(request);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  static const std::map<std::string, std::pair<size_t, size_t>> kArity = {
      {"list", {1, 1}}, {"add", {3, 4}},      {"remove", {2, 2}}, {"set", {3, 3}},
      {"move", {3, 3}}, {"snapshot", {1, 2}}, {"merge", {2, 2}},  {"rollback", {2, 2}},
      {"clone", {3, 4}}, {"delete", {2, 2}},  {"diff", {3, 4}},     {"read", {3, 3}},
      {"close", {2, 2}}};
  auto ar = kArity.find(w.empty() ? "" : w[0]);
  if (ar == kArity.end())
    return Error::invalid("unknown command \"" + request +
                          "\" (list, add, remove, set, move, snapshot, merge, rollback, clone, delete, diff, read, close)");
  if (w.size() < ar->second.first || w.size() > ar->second.second)
    return Error::invalid("wrong number of words in \"" + request + "\"");
  w.resize(4);
  const std::string &cmd = w[0], &name = w[1], &arg = w[2];
  std::lock_guard lk(g->ctl_mu);
  if (cmd == "list") return format_stack(*g->vol, g->stack);
  // A diff names files in directories the caller may not be allowed to
  // list, and pauses every operation while it runs: root or the owner only.
  if (!may_change)
    return Error::io(EPERM, cmd == "diff" || cmd == "read" || cmd == "close"
                                ? "only root or the mount's owner may diff branches"
                                : "only root or the mount's owner may change branches");
  if (cmd == "diff") return start_diff(name, arg, w[3]);
  if (cmd == "read" || cmd == "close") return page_diff(cmd, name, arg);
  if (cmd == "snapshot" || cmd == "merge" || cmd == "rollback") return lifecycle(cmd, name);
  if (cmd == "clone" || cmd == "delete") {
    if (g->read_only) return Error::io(EROFS, "the mount is read-only");
    BranchMeta b = PLY_TRY(find_branch(*g->vol, name));
    if (cmd == "clone") {
      // Each operation is one transaction: a clone between two is whole.
      if (!w[3].empty() && w[3] != "ro") return Error::invalid("clone mode must be ro, not \"" + w[3] + "\"");
      BranchMeta c = PLY_TRY(clone_branch(*g->vol, b.tree, arg, w[3] == "ro"));
      return "cloned \"" + b.name + "\" as \"" + c.name + "\"";
    }
    // A branch this mount has shown may still be in use by an operation
    // that began before it left the stack: it goes after the unmount.
    if (g->branches.count(b.tree.v))
      return Error::io(EBUSY, "this mount has shown \"" + b.name + "\"; delete it after unmounting");
    PLY_CHECK(delete_branch(*g->vol, b.tree));
    return "deleted \"" + b.name + "\"";
  }
  auto mode = [&](const std::string& m) -> Result<bool> {
    if (m == "rw" || m == "ro") return m == "rw";
    return Error::invalid("mode must be rw or ro, not \"" + m + "\"");
  };
  auto position = [](const std::string& p, size_t max) -> Result<size_t> {
    char* end = nullptr;
    unsigned long v = std::strtoul(p.c_str(), &end, 10);
    if (p.empty() || *end || v > max)
      return Error::invalid("position must be 0 to " + std::to_string(max) + ", not \"" + p + "\"");
    return size_t(v);
  };
  BranchMeta b = PLY_TRY(find_branch(*g->vol, name));
  std::vector<ViewLayer> next = g->stack;
  auto at = std::find_if(next.begin(), next.end(), [&](const ViewLayer& l) { return l.tree == b.tree; });
  const bool in_stack = at != next.end();
  if (cmd == "add") {
    if (in_stack) return Error::io(EEXIST, "branch \"" + b.name + "\" is in the stack already");
    const size_t p = PLY_TRY(position(arg, next.size()));
    next.insert(next.begin() + long(p), ViewLayer{b.tree, PLY_TRY(mode(w[3].empty() ? "rw" : w[3]))});
  } else if (cmd == "remove") {
    if (!in_stack) return Error::io(ENOENT, "branch \"" + b.name + "\" is not in the stack");
    if (next.size() == 1) return Error::io(EBUSY, "the stack's last branch cannot go");
    next.erase(at);
  } else if (cmd == "set") {
    if (!in_stack) return Error::io(ENOENT, "branch \"" + b.name + "\" is not in the stack");
    at->writable = PLY_TRY(mode(arg));
  } else if (cmd == "move") {
    if (!in_stack) return Error::io(ENOENT, "branch \"" + b.name + "\" is not in the stack");
    const size_t p = PLY_TRY(position(arg, next.size() - 1));
    ViewLayer l = *at;
    next.erase(at);
    next.insert(next.begin() + long(p), l);
  } else {
    return Error::invalid("unknown command \"" + cmd + "\" (list, add, remove, set, move)");
  }
  if (g->read_only)
    for (const auto& l : next)
      if (l.writable) return Error::io(EROFS, "the mount is read-only");
  PLY_CHECK(check_stack(*g->vol, next));
  PLY_CHECK(g->u->restack(PLY_TRY(union_branches(next))));
  g->stack = next;
  invalidate_all();
  return format_stack(*g->vol, g->stack);
}

void op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void*, fuse_file_info*,
              unsigned flags, const void* in_buf, size_t in_size, size_t out_size) {
  if (cmd != kControlIoctl) return (void)fuse_reply_err(req, ENOTTY);
  if (flags & FUSE_IOCTL_COMPAT) return (void)fuse_reply_err(req, ENOSYS);
  if (ino != FUSE_ROOT_ID) return (void)fuse_reply_err(req, ENOTTY);  // the mount point only
  if (in_size < sizeof(ControlMsg) || out_size < sizeof(ControlMsg))
    return (void)fuse_reply_err(req, EINVAL);
  ControlMsg m;
  std::memcpy(&m, in_buf, sizeof m);
  if (m.version != kControlVersion) return (void)fuse_reply_err(req, EPROTO);
  m.request[sizeof m.request - 1] = 0;
  const uid_t uid = fuse_req_ctx(req)->uid;
  auto r = control(m.request, uid == 0 || uid == ::getuid());
  const std::string text = r ? *r : r.error().reason;  // plyctl adds strerror
  m.status = r ? 0 : errno_of(r.error());
  std::snprintf(m.answer, sizeof m.answer, "%s", text.c_str());
  fuse_reply_ioctl(req, 0, &m, sizeof m);
}

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops o{};
  o.init = op_init;
  o.lookup = op_lookup;
  o.forget = op_forget;
  o.forget_multi = op_forget_multi;
  o.getattr = op_getattr;
  o.setattr = op_setattr;
  o.readlink = op_readlink;
  o.mknod = op_mknod;
  o.mkdir = op_mkdir;
  o.symlink = op_symlink;
  o.link = op_link;
  o.unlink = op_unlink;
  o.rmdir = op_rmdir;
  o.rename = op_rename;
  o.open = op_open;
  o.create = op_create;
  o.read = op_read;
  o.write = op_write;
  o.release = op_release;
  o.fsync = op_fsync;
  o.opendir = op_opendir;
  o.readdir = op_readdir;
  o.readdirplus = op_readdirplus;
  o.releasedir = op_releasedir;
  o.fsyncdir = op_fsync;
  o.statfs = op_statfs;
  o.setxattr = op_setxattr;
  o.getxattr = op_getxattr;
  o.listxattr = op_listxattr;
  o.removexattr = op_removexattr;
  o.fallocate = op_fallocate;
  o.ioctl = op_ioctl;
  o.lseek = op_lseek;
  o.copy_file_range = op_copy_file_range;
  return o;
}

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
