// The control folder (format.md#control-folder): a hidden directory
// ".plyfs" at the root of every mount that reaches every branch of the
// image online, OLFS-style, with no API but the filesystem's own:
//
//   .plyfs/layers/NAME/info.json  what the branch is (read-only JSON)
//   .plyfs/layers/NAME/data/      the layer's view: NAME over its ancestor
//                                 chain, as plyfs -o layer=NAME shows it
//   .plyfs/layers/NAME/children/  the layers made on NAME: links ../../CHILD
//   mkdir  .plyfs/layers/NEW      a new layer on the branch the mount writes to
//   mkdir  .plyfs/layers/P/children/NEW   a new layer on P
//   rmdir  .plyfs/layers/NAME     deletes the branch
//   rename .plyfs/layers/A -> B   renames it
// New names follow the name rule (create_layer, rename_branch). An old
// image's branch whose name no directory entry can hold is listed as =ID
// (ctl_nodes.h, entry_name), so that it can be renamed or removed.
//
// Node ids. The mounted view keeps node id == union inode number (the fast
// path; inode numbers stay below 2^63, format.md#fs-keys). Everything here
// has bit 63 set: bits 40-62 are a slot, bits 0-39 a number. Slot 0 holds
// the folder's own entries (1: .plyfs, 2: layers, id << 3 | kind: a branch
// name's folder, its info.json, data as listed, children/, and the link to
// it in its parent's children/, C6); slot s > 0 is one layer's
// view, and the number the union inode number in it. So a node id never
// changes while the mount lasts, and st_ino (the node id) is unique within
// the mount: the same object seen in two views has two numbers.
//
// Invariants:
//  C1 every view's union shares the daemon's one Filesystem per branch
//     (Host::open_branch), so the views and the mounted union write one tree
//     each, never two instances of it;
//  C2 an operation in a view holds mu_ shared from start to reply (but
//     release, which only counts open files down); whatever
//     changes the branches a view uses (a view's creation, a layer's
//     deletion, a snapshot, merge or rollback of the mount) holds the
//     daemon's ctl_mu and then mu_ exclusive, so it never overlaps one;
//  C3 a slot is never reused: once its layer is gone, its nodes answer
//     ESTALE, and a new branch with the same tree id gets a new slot. A
//     view the kernel holds nothing of (no reference, no open file) is
//     idle: its union is freed, but its slot stays bound to its branch and
//     follows its name, and the next lookup of data makes the union again
//     there, with the same node ids;
//  C4 the branch table is read under the daemon's ctl_mu, like every change
//     to it: a layer being made, or a tree a merge or rollback is dropping,
//     is not a branch yet or any more (a half-made one reads as damage).
//  C5 a change through one union (the mount or a view) to a branch another
//     one shows brings what that one knows of it up to date before the
//     reply (Union::refresh_path), and queues the invalidations of what the
//     kernel holds stale of it, sent after the reply by the daemon's
//     notifier thread (notifier.h): no request waits for them;
//  C6 a folder of layers/ is its name's (numbered in the order the kernel
//     first meets the names), not a branch's: a snapshot, merge or rollback
//     gives a name to another branch, as the views follow it, while the
//     kernel may still hold the folder (an entry is valid for up to a
//     jiffy even with timeout 0, and a path walk goes on with what it
//     found). So a path resolved by a name means whatever branch has the
//     name when the next component is looked up: never the frozen or
//     doomed branch that had it.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

#include <time.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "kernel_io.h"
#include "notifier.h"
#include "union/union.h"
#include "union/view.h"

namespace plyfs {

inline constexpr const char* kControlFolder = ".plyfs";
inline constexpr fuse_ino_t kCtlBit = fuse_ino_t(1) << 63;
inline bool is_ctl(fuse_ino_t ino) { return (ino & kCtlBit) != 0; }
// Whether (parent, name) is the control folder's own name at the mount root.
inline bool is_ctl_name(fuse_ino_t parent, const char* name) {
  return parent == FUSE_ROOT_ID && std::string_view(name) == kControlFolder;
}

// A FUSE setattr request as the union takes it (the mounted view's too).
inline SetAttr setattr_of(const struct stat* st, int valid) {
  SetAttr s;
  if (valid & FUSE_SET_ATTR_MODE) s.mode = st->st_mode;
  if (valid & FUSE_SET_ATTR_UID) s.uid = st->st_uid;
  if (valid & FUSE_SET_ATTR_GID) s.gid = st->st_gid;
  if (valid & FUSE_SET_ATTR_SIZE) s.size = uint64_t(st->st_size);
  if (valid & FUSE_SET_ATTR_ATIME_NOW) s.atime = timespec{0, UTIME_NOW};
  else if (valid & FUSE_SET_ATTR_ATIME) s.atime = st->st_atim;
  if (valid & FUSE_SET_ATTR_MTIME_NOW) s.mtime = timespec{0, UTIME_NOW};
  else if (valid & FUSE_SET_ATTR_MTIME) s.mtime = st->st_mtim;
  if (valid & FUSE_SET_ATTR_CTIME) s.ctime = st->st_ctim;
  // A chown clears setuid/setgid (the kernel sends the new mode itself
  // unless FUSE_HANDLE_KILLPRIV_V2 leaves it to us), and so does a truncate
  // the kernel flags (kernel_io.h).
  if (((valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) && !(valid & FUSE_SET_ATTR_MODE)) ||
      request_kills_setid())
    s.kill_setid = true;
  return s;
}

// fallocate and copy_file_range carry no such flag, and under KILLPRIV_V2
// the kernel drops the clearing it would otherwise send: the daemon decides
// alone, taking any caller but root to lack CAP_FSETID.
inline bool unprivileged(fuse_req_t req) { return killpriv_v2() && fuse_req_ctx(req)->uid != 0; }

// Before a write, fallocate, copy or O_TRUNC open of `ino` that must clear
// its setuid/setgid bits (`kill`: the request's flag, kernel_io.h): clear
// them first, as the kernel does for a local filesystem. True if the mode
// changed: the kernel's cached attributes then need dropping, since these
// replies carry none. Files without the bits cost one getattr.
inline Result<bool> kill_setid_before_change(Union& u, uint64_t ino, bool kill, const Caller& c) {
  if (!kill) return false;
  Attr a = PLY_TRY(u.getattr(ino));
  const bool setid = (a.mode & S_ISUID) || (a.mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP);
  if (!S_ISREG(a.mode) || !setid) return false;
  SetAttr s;
  s.kill_setid = true;
  (void)PLY_TRY(u.setattr(ino, s, c));
  return true;
}

// A union object's attributes as FUSE reports them (the mounted view's
// too), under the number the kernel knows it by.
inline struct stat stat_of(const Attr& a, fuse_ino_t ino, uint32_t block_size) {
  struct stat st{};
  st.st_ino = ino;
  st.st_mode = a.mode;
  st.st_nlink = a.nlink;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  st.st_rdev = a.rdev;
  st.st_size = off_t(a.size);
  st.st_blocks = blkcnt_t(a.blocks);
  st.st_blksize = blksize_t(block_size);
  st.st_atim = a.atime;
  st.st_mtim = a.mtime;
  st.st_ctim = a.ctime;
  return st;
}

// A listxattr reply (the mounted view's too): the names, each ended by a
// NUL; its size when asked with size 0; ERANGE when the buffer is short.
inline void reply_xattr_names(fuse_req_t req, const std::vector<std::string>& names, size_t size) {
  std::string all;
  for (const auto& n : names) {
    all += n;
    all.push_back('\0');
  }
  if (size == 0) return (void)fuse_reply_xattr(req, all.size());
  if (size < all.size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, all.data(), all.size());
}

// A change made through one of the daemon's unions (the mounted view, or a
// view of the control folder), in that union's numbers: what the kernel may
// hold stale of the others that show the branch it changed
// (format.md#control-folder, "Caching").
struct ViewChange {
  enum Kind { Entry, Attr, Data } kind = Attr;
  uint64_t ino = 0;      // Entry: the directory; Attr, Data: the object
  std::string name;      // Entry: the name in it that changed
  uint64_t off = 0;      // Data: the bytes changed,
  uint64_t len = 0;      // 0: up to the end
  static ViewChange entry(uint64_t dir, std::string_view name) {
    ViewChange c;
    c.kind = Entry;
    c.ino = dir;
    c.name = std::string(name);
    return c;
  }
  static ViewChange attr(uint64_t ino) {
    ViewChange c;
    c.ino = ino;
    return c;
  }
  static ViewChange data(uint64_t ino, uint64_t off, uint64_t len) {
    ViewChange c;
    c.kind = Data;
    c.ino = ino;
    c.off = off;
    c.len = len;
    return c;
  }
};

class ControlFolder {
 public:
  // What the daemon lends the folder.
  struct Host {
    Volume* vol = nullptr;
    std::mutex* ctl_mu = nullptr;                            // the daemon's branch-change lock
    std::function<Result<Filesystem*>(TreeId)> open_branch;  // under ctl_mu (C1)
    const std::vector<ViewLayer>* stack = nullptr;           // the mounted stack, under ctl_mu
    std::function<void(TreeId)> close_branch;                // under ctl_mu: nothing uses it
    std::function<int(const Error&)> errno_of;               // the one error mapping
    std::function<Caller(fuse_req_t)> caller;
    Union* mount = nullptr;        // the mounted view's union
    Notifier* notifier = nullptr;  // sends the invalidations of the kernel's caches
    bool read_only = false;
    CopyUpMode copyup;
    DeleteMode del = DeleteMode::Whiteout;
  };
  explicit ControlFolder(Host h) : h_(std::move(h)) { clock_gettime(CLOCK_REALTIME, &started_); }

  void set_kernel_times(bool on) { kernel_times_ = on; }
  // The mount root's ".plyfs" (the daemon's lookup of that name).
  void lookup_root(fuse_req_t req);

  // FUSE operations on the folder's nodes (is_ctl). Two nodes of different
  // views (or of a view and the mounted one) answer EXDEV.
  void lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
  void forget(fuse_ino_t ino, uint64_t n);
  void getattr(fuse_req_t req, fuse_ino_t ino);
  void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* st, int valid);
  void readlink(fuse_req_t req, fuse_ino_t ino);
  void mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev);
  void mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode);
  void symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name);
  void link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char* name);
  void unlink(fuse_req_t req, fuse_ino_t parent, const char* name);
  void rmdir(fuse_req_t req, fuse_ino_t parent, const char* name);
  void rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
              const char* newname, unsigned flags);
  void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
  void read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
  void write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off);
  void release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void fsync(fuse_req_t req, fuse_ino_t ino);
  void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus);
  void setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags);
  void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
  void listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
  void removexattr(fuse_req_t req, fuse_ino_t ino, const char* name);
  void fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len);
  void lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence);
  void copy_file_range(fuse_req_t req, fuse_ino_t in, off_t off_in, fuse_ino_t out,
                       off_t off_out, size_t len);

  // A snapshot, merge or rollback of the mount changes branches the views
  // may use (C2): the daemon holds the returned lock, under ctl_mu, from
  // before the change until after refresh(), which moves every view to the
  // branch that has its branch's name now, with that branch's stack (or
  // ends it, ESTALE, if no branch has the name). It runs before the daemon
  // closes the branches the change replaced.
  std::unique_lock<std::shared_mutex> hold() { return std::unique_lock(mu_); }
  // `replaced`: branches whose Filesystem the daemon replaced (their content
  // changed under the same tree id, or they went): a view using one moves
  // to the new object, or answers ESTALE.
  void refresh(const std::vector<TreeId>& replaced = {});
  // At unmount: frees the files unlinked while open in the views.
  Result<void> release_all();
  // After a change through the mounted view: the same for the views that
  // show a branch the mount writes to (format.md#control-folder, "Caching").
  void mount_changed(const std::vector<ViewChange>& cs);
  bool has_views() const { return live_views_.load(std::memory_order_relaxed) > 0; }

 private:
  struct View {
    TreeId layer;
    std::string name;                   // the branch's name (under ctl_mu): refresh follows it
    std::vector<ViewLayer> stack;
    std::unique_ptr<Union> u;           // null once the layer is gone, or while idle (C3)
    std::atomic<uint64_t> open_files{0};  // open handles (fh: this View): rmdir refuses while any
    // The kernel's references to the view's nodes (its lookup counts, the
    // root's included): counted before each reply that hands one out,
    // dropped by forget. With open_files, what keeps the union (C3).
    std::atomic<uint64_t> kernel_refs{0};
    bool idle() const { return kernel_refs.load() == 0 && open_files.load() == 0; }
    // The holds (Union::hold) of handles released while mu_ was taken
    // exclusive: release never waits for it, so the next user of the view
    // drops them (drain_unholds).
    std::mutex unhold_mu;  // a leaf
    std::vector<uint64_t> unholds;
  };
  void drain_unholds(View& v);  // mu_ held (either way)
  // An operation's view and the union inode number it names, mu_ held shared.
  struct InView {
    std::shared_lock<std::shared_mutex> lk;
    View* v;
    size_t slot;
    uint64_t ino;
  };
  Result<InView> in_view(fuse_ino_t ino);
  // A name's folder id, given on first sight (C6; ctl_mu). 0: no more ids.
  uint64_t folder_id(std::string_view name);
  // The branch that has folder (or info.json) node `ino`'s name now, or
  // ESTALE (ctl_mu).
  Result<BranchMeta> folder_branch(fuse_ino_t ino);
  // The live view data in `folder` means (that branch's), made on first
  // use or again after it was idle (takes ctl_mu and mu_), with one kernel
  // reference counted for the entry of data the caller hands out (or
  // drops: unref).
  Result<size_t> data_view(fuse_ino_t folder);
  void unref(size_t slot, uint64_t n);  // mu_ held shared
  // Frees the union of view `slot` if it is idle, unless mu_ is busy: then
  // refresh() or the next use of the view does.
  void retire_if_idle(size_t slot);
  bool bound(size_t slot) const;  // slot_of_ maps its layer to it (mu_)
  Result<std::vector<ViewLayer>> stack_of(TreeId tree);  // its layer stack, as this mount may write it (ctl_mu)
  Result<std::vector<UnionBranch>> branches_of(const std::vector<ViewLayer>& s);  // under ctl_mu
  Result<BranchMeta> branch_named(std::string_view name);  // under ctl_mu (C4)
  Result<std::string> info_json(TreeId tree);

  // After a change through view w: brings what the mount and the other
  // views that show the branch w writes to know of it up to date, and
  // queues the invalidations of what the kernel holds stale of them
  // (notifier.h), sent after the reply.
  void view_changed(InView& w, const std::vector<ViewChange>& cs);
  // The invalidations in union `to` (slot: 0 for the mount) for changes
  // made through union `from` (mu_ held shared).
  void invals_for(Union& from, const std::vector<ViewChange>& cs, Union& to, size_t slot,
                  std::vector<Notifier::Inval>& out);

  void reply_err(fuse_req_t req, const Error& e) { fuse_reply_err(req, h_.errno_of(e)); }
  // An entry the change `cs` made (none: a lookup), or its error.
  // `counted`: the reference it hands out is counted already (data_view).
  void reply_view_entry(fuse_req_t req, InView& w, const Result<Attr>& a, const std::vector<ViewChange>& cs = {},
                        bool counted = false);
  struct stat view_stat(const View& v, size_t slot, const Attr& a) const;
  struct stat virtual_stat(fuse_ino_t ino, uint64_t size) const;
  Result<struct stat> virtual_attr(fuse_ino_t ino);
  void reply_virtual_entry(fuse_req_t req, fuse_ino_t ino, uint64_t generation);
  bool may_change(fuse_req_t req) const;

  // Changes to the branch table (mkdir, rmdir, rename in .plyfs/layers).
  // On the branch the mount writes to, or (`children`: a children/ node)
  // on that folder's branch.
  Result<BranchMeta> make_layer(std::string_view name, fuse_ino_t children);
  Result<void> delete_layer(std::string_view name);
  Result<void> rename_layer(std::string_view from, std::string_view to, unsigned flags);

  Host h_;
  timespec started_{};  // the times of the folder's own nodes
  std::atomic<bool> kernel_times_{false};
  std::shared_mutex mu_;                   // C2
  std::vector<std::unique_ptr<View>> views_;  // slot s is views_[s - 1]
  std::map<uint64_t, size_t> slot_of_;     // live views by tree id
  // Folders by name and names by folder id (id - 1; "" for a folder whose
  // name went to another by a rename), under ctl_mu (C6).
  std::map<std::string, uint64_t, std::less<>> folder_ids_;
  std::vector<std::string> folder_names_;
  std::atomic<size_t> live_views_{0};      // slot_of_.size(), read without mu_
};

}  // namespace plyfs
