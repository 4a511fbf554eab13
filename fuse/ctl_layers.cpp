// The control folder's own nodes (ctl_folder.h, C4, C6): layers/, a folder
// for each branch name in it, the folder's info.json and children/. Behind
// them the branch table: a name's branch and folder, and the changes that
// mkdir, rmdir and rename in layers/ (or children/) make to it.
#include "ctl_folder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "ctl_nodes.h"
#include "snap/model.h"
#include "snap/snap.h"
#include "util/text.h"

namespace plyfs {

using namespace ctl;

namespace {

Error no_such(std::string_view name) { return Error::io(ENOENT, "no branch named \"" + shown(name) + "\""); }

}  // namespace

// --- the branch table -------------------------------------------------------------------

Result<BranchMeta> ControlFolder::branch_named(std::string_view name) {
  // By name only: find_branch also takes tree ids, which would give one
  // branch two folders. A name that cannot be a file name has its alias.
  auto bs = PLY_TRY(Filesystem::branches(*h_.vol));
  for (auto& b : bs)
    if (!b.doomed && b.name == name) return b;
  for (auto& b : bs)
    if (!b.doomed && entry_name(b) == name) return b;
  return no_such(name);
}

uint64_t ControlFolder::folder_id(std::string_view name) {
  auto it = folder_ids_.find(name);
  if (it != folder_ids_.end()) return it->second;
  if (folder_names_.size() >= kMaxFolder) return 0;
  folder_names_.emplace_back(name);
  folder_ids_.emplace(std::string(name), folder_names_.size());
  return folder_names_.size();
}

Result<BranchMeta> ControlFolder::folder_branch(fuse_ino_t ino) {
  const uint64_t id = folder_of(ino);
  if (id == 0 || id > folder_names_.size() || folder_names_[id - 1].empty())
    return Error::io(ESTALE, "no such folder");
  auto b = branch_named(folder_names_[id - 1]);
  if (!b && b.error().code == ENOENT) return Error::io(ESTALE, "no branch is named \"" + folder_names_[id - 1] + "\" any more");
  return b;
}

bool ControlFolder::may_change(fuse_req_t req) const {
  const uid_t uid = fuse_req_ctx(req)->uid;
  return uid == 0 || uid == ::getuid();  // as for plyctl on the mount point
}

Result<BranchMeta> ControlFolder::make_layer(std::string_view name, fuse_ino_t children) {
  std::lock_guard cl(*h_.ctl_mu);
  if (h_.read_only) return Error::io(EROFS, "the mount is read-only");
  if (children) return create_layer(*h_.vol, name, PLY_TRY(folder_branch(children)).tree, false);
  auto top = std::find_if(h_.stack->begin(), h_.stack->end(), [](const ViewLayer& l) { return l.writable; });
  if (top == h_.stack->end()) return Error::io(EROFS, "the mount writes to no branch");
  return create_layer(*h_.vol, name, top->tree, false);
}

Result<void> ControlFolder::delete_layer(std::string_view name) {
  std::lock_guard cl(*h_.ctl_mu);
  if (h_.read_only) return Error::io(EROFS, "the mount is read-only");
  BranchMeta b = PLY_TRY(branch_named(name));
  for (const auto& l : *h_.stack)
    if (l.tree == b.tree)
      return Error::io(EBUSY, "the mount shows \"" + shown(b.name) +
                                  "\": take it out of the mount's stack first (plyctl branch remove MOUNTPOINT "
                                  "NAME), or unmount and delete it on the image");
  // Before any view of it closes (delete_branch refuses it too).
  if (b.held) return Error::io(EBUSY, "\"" + shown(b.name) + "\" is held: release it first (plyctl release)");
  for (const auto& c : PLY_TRY(Filesystem::branches(*h_.vol)))
    if (!c.doomed && c.parent == b.tree)
      return Error::io(EBUSY, "branch \"" + shown(c.name) + "\" is made on \"" + shown(b.name) +
                                  "\": delete or merge it first");
  for (const auto& view : PLY_TRY(list_views(*h_.vol)))
    for (const auto& l : view.layers)
      if (l.tree == b.tree)
        return Error::io(EBUSY, "view \"" + shown(view.name) + "\" of the image shows \"" + shown(b.name) +
                                    "\": delete or change that view first (plyctl view delete|create IMAGE, unmounted)");
  // close() returns before the kernel's release reaches the daemon: a
  // release in flight gets a moment before the layer counts as busy.
  auto open_files = [&] {
    std::shared_lock lk(mu_);
    uint64_t n = 0;
    for (auto& v : views_)
      if (v->layer == b.tree) n += v->open_files.load();
    return n;
  };
  for (int i = 0; i < 500 && open_files() > 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::unique_lock lk(mu_);  // C2
  // The views that show it: its own (others would be of layers made on it).
  std::vector<View*> users;
  for (auto& v : views_)
    if (v->u && std::any_of(v->stack.begin(), v->stack.end(), [&](const ViewLayer& l) { return l.tree == b.tree; }))
      users.push_back(v.get());
  for (View* v : users)
    if (v->open_files.load() > 0)
      return Error::io(EBUSY, "a file of \"" + shown(b.name) + "\"'s data/ is open: close it first");
  for (View* v : users) {
    v->u.reset();  // C3
    slot_of_.erase(v->layer.v);
  }
  slot_of_.erase(b.tree.v);  // an idle view of it goes too
  live_views_ = slot_of_.size();
  h_.close_branch(b.tree);
  PLY_CHECK(delete_branch(*h_.vol, b.tree));
  // The kernel kills the folder's inode with the rmdir: a layer made later
  // under the name gets a folder of its own (C6).
  if (auto f = folder_ids_.find(name); f != folder_ids_.end()) {
    folder_names_[f->second - 1].clear();
    folder_ids_.erase(f);
  }
  return ok();
}

Result<void> ControlFolder::rename_layer(std::string_view from, std::string_view to, unsigned flags) {
  std::lock_guard cl(*h_.ctl_mu);
  if (h_.read_only) return Error::io(EROFS, "the mount is read-only");
  if (flags & RENAME_EXCHANGE) return Error::invalid("layers do not exchange names");
  BranchMeta b = PLY_TRY(branch_named(from));
  if (auto t = branch_named(to)) {
    if (t->tree == b.tree) return ok();
    // A layer's folder is never empty (info.json, data): rename(2) cannot
    // replace it.
    if (flags & RENAME_NOREPLACE) return Error::io(EEXIST, "a branch named \"" + std::string(to) + "\" exists");
    return Error::io(ENOTEMPTY, "a branch named \"" + std::string(to) + "\" exists");
  }
  (void)PLY_TRY(rename_branch(*h_.vol, b.tree, to));
  // The kernel moves its entry of `from` to `to`, folder inode and all: the
  // folder is to's from now on (C6); one it held of an older `to` is stale.
  if (auto f = folder_ids_.find(from); f != folder_ids_.end()) {
    const uint64_t id = f->second;
    folder_ids_.erase(f);
    if (auto t = folder_ids_.find(to); t != folder_ids_.end()) folder_names_[t->second - 1].clear();
    folder_ids_[std::string(to)] = id;
    folder_names_[id - 1] = std::string(to);
  }
  std::shared_lock lk(mu_);
  for (auto& v : views_)
    if (v->layer == b.tree) v->name = std::string(to);  // under ctl_mu, like refresh
  return ok();
}

Result<std::string> ControlFolder::info_json(TreeId tree) {
  std::lock_guard cl(*h_.ctl_mu);  // C4
  // The Branch object of plyctl (snap/model.h), and what only a mount knows.
  auto bs = PLY_TRY(model::Branches::read(*h_.vol));
  const BranchMeta* b = bs.find(tree);
  if (!b) return Error::io(ESTALE, "the branch is gone");
  // Its space (snap/usage.h): this branch's only, a read of info.json
  // walks no other branch.
  model::Json space = model::branch_space(PLY_TRY(branch_space(*h_.vol, tree)));
  model::Json o = bs.branch(*b);
  bool mounted = false;
  for (const auto& l : *h_.stack) mounted |= l.tree == b->tree;
  bool view_open = false;
  {
    std::shared_lock lk(mu_);  // after ctl_mu, as in data_view
    if (auto it = slot_of_.find(b->tree.v); it != slot_of_.end()) view_open = views_[it->second - 1]->u != nullptr;
  }
  o["stack"] = bs.stack(PLY_TRY(stack_of(b->tree)));
  o["mounted"] = mounted;
  o["view_open"] = view_open;
  o["space"] = std::move(space);
  return model::dump(o, 2) + "\n";
}

// --- replies ------------------------------------------------------------------------------

struct stat ControlFolder::virtual_stat(fuse_ino_t ino, uint64_t size) const {
  struct stat st{};
  st.st_ino = ino;
  st.st_uid = ::getuid();
  st.st_gid = ::getgid();
  if (is_info(ino) || is_child_link(ino)) {
    st.st_mode = is_info(ino) ? S_IFREG | 0444 : S_IFLNK | 0777;
    st.st_nlink = 1;
    st.st_size = off_t(size);
  } else {
    st.st_mode = S_IFDIR | 0755;
    st.st_nlink = 2;
  }
  st.st_blksize = 4096;
  st.st_atim = st.st_mtim = st.st_ctim = started_;
  // The kernel caches listings (no opendir: FOPEN_CACHE_DIR) until a
  // directory's mtime changes. Branches change under it (plyctl on the
  // mount, a snapshot): the folder's directories are always new.
  if (S_ISDIR(st.st_mode)) clock_gettime(CLOCK_REALTIME, &st.st_mtim);
  return st;
}

Result<struct stat> ControlFolder::virtual_attr(fuse_ino_t ino) {
  if (ino == kRootNode || ino == kLayersNode) return virtual_stat(ino, 0);
  if (!kind_of(ino) || kind_of(ino) == kDataListed) return Error::io(ESTALE, "no such node");
  BranchMeta b;
  {
    std::lock_guard cl(*h_.ctl_mu);  // C4
    b = PLY_TRY(folder_branch(ino));
  }
  if (is_info(ino)) return virtual_stat(ino, PLY_TRY(info_json(b.tree)).size());
  if (is_child_link(ino)) return virtual_stat(ino, child_target(entry_name(b)).size());
  return virtual_stat(ino, 0);
}

void ControlFolder::reply_virtual_entry(fuse_req_t req, fuse_ino_t ino, uint64_t generation) {
  auto st = virtual_attr(ino);
  if (!st) return reply_err(req, st.error());
  fuse_entry_param e{};
  e.ino = ino;
  e.generation = generation;
  e.attr = *st;
  e.attr_timeout = e.entry_timeout = kTimeout;
  fuse_reply_entry(req, &e);  // nothing to count: these nodes live as long as the mount
}

}  // namespace plyfs
