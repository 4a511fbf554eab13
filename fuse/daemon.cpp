// The daemon's state (daemon.h) and the helpers its parts share: the
// mounted union's inode numbers as FUSE knows them, the one errno mapping,
// the replies that pin what they hand the kernel, and what every restack
// of the mounted stack needs (the branches opened, the kernel's caches
// dropped).
#include "daemon.h"

#include <syslog.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kernel_io.h"

namespace plyfs::daemon {

Daemon* g = nullptr;

namespace {

void vlog(int priority, const char* fmt, va_list ap) {
  if (g && g->daemonized) {
    vsyslog(priority, fmt, ap);
  } else {
    std::fputs("plyfs: ", stderr);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
  }
}

std::atomic<unsigned> g_libfuse_errors{0};

}  // namespace

void log_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(LOG_ERR, fmt, ap);
  va_end(ap);
}

void log_info(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(LOG_INFO, fmt, ap);
  va_end(ap);
}

// libfuse writes one line in pieces ("fuse: unknown option(s): `", then
// each option), so a line is kept per thread until its newline.
void libfuse_log(enum fuse_log_level level, const char* fmt, va_list ap) {
  if (level >= FUSE_LOG_INFO) {
    if (g && g->daemonized) vsyslog(LOG_DEBUG, fmt, ap);
    else std::vfprintf(stderr, fmt, ap);
    return;
  }
  thread_local std::string line;
  char buf[1024];
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  if (n > 0) line.append(buf, std::min<size_t>(size_t(n), sizeof buf - 1));
  for (size_t nl; (nl = line.find('\n')) != std::string::npos; line.erase(0, nl + 1)) {
    std::string_view l(line.data(), nl);
    if (l.rfind("fuse: ", 0) == 0) l.remove_prefix(6);
    if (l.empty()) continue;
    g_libfuse_errors++;
    log_error("%.*s", int(l.size()), l.data());
  }
}

unsigned libfuse_errors() { return g_libfuse_errors.load(); }

Union& fs() { return *g->u; }
uint64_t to_fs(fuse_ino_t i) { return i == FUSE_ROOT_ID ? fs().root() : i; }
fuse_ino_t to_fuse(uint64_t i) { return i == fs().root() ? FUSE_ROOT_ID : i; }

// The single place errors become errno replies. Damage and device errors
// are EIO to the caller, logged, and turn the mount read-only.
int errno_of(const Error& e) {
  if (e.code == EUCLEAN || e.code == EIO) {
    log_error("%s", e.user_message(g->image).c_str());
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
void reply_entry(fuse_req_t req, const Result<Attr>& a, std::initializer_list<ViewChange> cs) {
  if (!a) return reply_err(req, a.error());
  fuse_entry_param e = to_entry(*a);  // the union counted the reference
  changed(cs);
  if (fuse_reply_entry(req, &e) != 0) (void)fs().unpin(a->ino);
}

namespace {
uint32_t umask_of(const fuse_ctx* c) { return g->dont_mask ? c->umask : 0; }
}  // namespace
// The pid lets copyup=current find the caller's umask, which FUSE sends
// only with creations (union.h, Caller).
Caller caller(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  return Caller{c->uid, c->gid, umask_of(c), uint32_t(c->pid)};
}

// A copy-up under copyup=current or const:... gave the file another owner
// or mode, and the reply of the request that caused it (an open, a write,
// an xattr change) carries no attributes: the kernel would show the old
// ones until their timeout, or, for a regular file with the writeback
// cache, whose ctime the kernel keeps, until the file is looked up again.
// The hook runs on the thread of that request, whose object the kernel
// holds (looked up or open): an attributes-only invalidation then waits
// for no lock and no request (the kernel's fuse_reverse_inval_inode only
// marks the attributes stale), so it is sent at once, and the request's
// reply comes after it: the caller's next stat sees the copy's owner and
// mode.
void attributes_changed(uint64_t ino) {
  if (g->se) (void)fuse_lowlevel_notify_inval_inode(g->se, to_fuse(ino), -1, 0);
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

}  // namespace plyfs::daemon
