// The control folder (ctl_folder.h; format.md#control-folder).
#include "ctl_folder.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <thread>

#include "ctl_nodes.h"
#include "snap/snap.h"

namespace plyfs {

using namespace ctl;

namespace {

constexpr const char* kLayersDir = "layers";
constexpr const char* kInfoFile = "info.json";
constexpr const char* kDataDir = "data";
constexpr const char* kChildrenDir = "children";

// A link of children/: to the child's folder.
std::string child_target(std::string_view name) { return "../../" + std::string(name); }

// Names and numbers here change under the kernel's feet (another view,
// plyctl on the mount): nothing is cached (format.md#control-folder).
constexpr double kTimeout = 0.0;

std::string json_str(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
      o += b;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

Error no_such(std::string_view name) { return Error::io(ENOENT, "no branch named \"" + std::string(name) + "\""); }

}  // namespace

// --- views -------------------------------------------------------------------------------

Result<ControlFolder::InView> ControlFolder::in_view(fuse_ino_t ino) {
  const size_t slot = slot_of(ino);
  if (slot == 0) return Error::io(EPERM, "not a node of a layer's data");
  std::shared_lock lk(mu_);
  if (slot > views_.size() || !views_[slot - 1]->u)
    return Error::io(ESTALE, "the layer of this node is gone");
  View* v = views_[slot - 1].get();
  drain_unholds(*v);
  uint64_t n = num_of(ino);
  return InView{std::move(lk), v, slot, n};
}

void ControlFolder::drain_unholds(View& v) {
  std::vector<uint64_t> inos;
  {
    std::lock_guard lk(v.unhold_mu);
    inos.swap(v.unholds);
  }
  if (v.u)
    for (uint64_t i : inos) (void)v.u->unhold(i);
}

Result<BranchMeta> ControlFolder::branch_named(std::string_view name) {
  // By name only: find_branch also takes tree ids, which would give one
  // branch two folders.
  for (auto& b : PLY_TRY(Filesystem::branches(*h_.vol)))
    if (!b.doomed && b.name == name) return b;
  return no_such(name);
}

Result<std::vector<ViewLayer>> ControlFolder::stack_of(TreeId tree) {
  // A folder a merge or rollback dropped, reached through a name the
  // kernel resolved just before: ESTALE makes it walk the path again.
  auto b = Filesystem::branch(*h_.vol, tree);
  if (!b || b->doomed) return Error::io(ESTALE, "the branch is gone");
  auto s = PLY_TRY(layer_stack(*h_.vol, b->name));
  if (s.empty() || s[0].tree != tree) return Error::io(ESTALE, "the branch is gone");
  if (h_.read_only)
    for (auto& l : s) l.writable = false;
  return s;
}

Result<std::vector<UnionBranch>> ControlFolder::branches_of(const std::vector<ViewLayer>& s) {
  std::vector<UnionBranch> ub;
  for (const auto& l : s) ub.push_back(UnionBranch{PLY_TRY(h_.open_branch(l.tree)), l.writable});
  return ub;
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

Result<size_t> ControlFolder::data_view(fuse_ino_t folder) {
  // The name, its branch and the view bound to it, in one piece: a
  // snapshot in between would leave the frozen branch (C4, C6).
  std::lock_guard cl(*h_.ctl_mu);
  const TreeId tree = PLY_TRY(folder_branch(folder)).tree;
  {
    std::shared_lock lk(mu_);  // retire_if_idle takes it exclusive
    if (auto it = slot_of_.find(tree.v); it != slot_of_.end() && views_[it->second - 1]->u) {
      views_[it->second - 1]->kernel_refs++;
      return it->second;
    }
  }
  auto s = PLY_TRY(stack_of(tree));
  auto ub = PLY_TRY(branches_of(s));
  std::unique_lock lk(mu_);
  auto make = [&](View& v) {
    v.stack = std::move(s);
    v.u = std::make_unique<Union>(std::move(ub), h_.copyup, h_.del);
    v.u->set_kernel_times(kernel_times_);
    v.kernel_refs++;
  };
  if (auto it = slot_of_.find(tree.v); it != slot_of_.end()) {
    View& v = *views_[it->second - 1];
    if (!v.u) make(v);  // idle until now: the same slot, the same node ids (C3)
    else v.kernel_refs++;
    return it->second;
  }
  if (views_.size() + 1 >= (size_t(1) << (63 - kSlotShift)))
    return Error::io(ENOSPC, "this mount has shown too many layers");
  auto v = std::make_unique<View>();
  v->layer = tree;
  v->name = PLY_TRY(Filesystem::branch(*h_.vol, tree)).name;
  make(*v);
  views_.push_back(std::move(v));
  slot_of_[tree.v] = views_.size();
  live_views_ = slot_of_.size();
  return views_.size();
}

void ControlFolder::unref(size_t slot, uint64_t n) {
  std::atomic<uint64_t>& r = views_[slot - 1]->kernel_refs;
  uint64_t cur = r.load();
  while (!r.compare_exchange_weak(cur, cur - std::min(cur, n))) {
  }
}

bool ControlFolder::bound(size_t slot) const {
  auto it = slot_of_.find(views_[slot - 1]->layer.v);
  return it != slot_of_.end() && it->second == slot;
}

void ControlFolder::retire_if_idle(size_t slot) {
  // Never waits: forget and release must not queue behind a snapshot that
  // holds mu_ (release takes no lock at all otherwise).
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock() || slot > views_.size()) return;
  View& v = *views_[slot - 1];
  // Idle, the union has no node but its root and pins nothing: nothing to
  // release.
  if (v.u && v.idle() && bound(slot)) v.u.reset();
}

void ControlFolder::refresh() {
  struct Count {  // however the loop ends
    ControlFolder& f;
    ~Count() { f.live_views_ = f.slot_of_.size(); }
  } count{*this};
  auto bs = Filesystem::branches(*h_.vol);
  for (size_t i = 0; i < views_.size(); i++) {
    View& v = *views_[i];
    if (!bound(i + 1)) continue;  // gone (C3)
    if (v.u && v.idle()) v.u.reset();  // idle: no restack, made anew on use
    // A view follows its branch's name, as the catalog's views and the mount
    // follow the branch they write to: after a snapshot the name is the new
    // live layer's (on the frozen branch), after a merge the result's, after
    // a rollback the fresh layer's. Files open in the view stay open.
    TreeId now{0};
    if (bs)
      for (const auto& b : *bs)
        if (!b.doomed && b.name == v.name) now = b.tree;
    if (now != v.layer) {
      slot_of_.erase(v.layer.v);
      if (!now.v || slot_of_.count(now.v)) {  // gone, or another view shows it already
        v.u.reset();  // C3: its nodes answer ESTALE from now on
        continue;
      }
      v.layer = now;
      slot_of_[now.v] = i + 1;
    }
    if (!v.u) continue;  // idle: it follows the name, its stack is read when made
    auto s = stack_of(v.layer);
    bool same = s && s->size() == v.stack.size() &&
                std::equal(s->begin(), s->end(), v.stack.begin(), [](const ViewLayer& a, const ViewLayer& b) {
                  return a.tree == b.tree && a.writable == b.writable;
                });
    if (same) continue;
    Result<void> r = s ? Result<void>(ok()) : Result<void>(s.error());
    if (r) {
      auto ub = branches_of(*s);
      r = ub ? v.u->restack(std::move(*ub)) : Result<void>(ub.error());
    }
    if (r) {
      v.stack = std::move(*s);
    } else {
      v.u.reset();  // C3: its nodes answer ESTALE from now on
      slot_of_.erase(v.layer.v);
    }
  }
}

Result<void> ControlFolder::release_all() {
  std::shared_lock lk(mu_);
  Result<void> r = ok();
  for (auto& v : views_)
    if (v->u)
      if (auto e = v->u->release_all(); !e && r) r = e;
  return r;
}

// --- the branch table -------------------------------------------------------------------

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
    if (l.tree == b.tree) return Error::io(EBUSY, "the mount shows \"" + b.name + "\"");
  for (const auto& c : PLY_TRY(Filesystem::branches(*h_.vol)))
    if (!c.doomed && c.parent == b.tree)
      return Error::io(EBUSY, "\"" + c.name + "\" is made on \"" + b.name + "\"");
  for (const auto& view : PLY_TRY(list_views(*h_.vol)))
    for (const auto& l : view.layers)
      if (l.tree == b.tree) return Error::io(EBUSY, "view \"" + view.name + "\" shows \"" + b.name + "\"");
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
    if (v->open_files.load() > 0) return Error::io(EBUSY, "a file of \"" + b.name + "\" is open");
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
  auto bs = PLY_TRY(Filesystem::branches(*h_.vol));
  std::erase_if(bs, [](const BranchMeta& b) { return b.doomed; });
  auto name_of = [&](TreeId t) -> std::string {
    for (const auto& b : bs)
      if (b.tree == t) return json_str(b.name);
    return "null";
  };
  auto it = std::find_if(bs.begin(), bs.end(), [&](const BranchMeta& b) { return b.tree == tree; });
  if (it == bs.end()) return Error::io(ESTALE, "the branch is gone");
  const BranchMeta b = *it;
  std::string children;
  for (const auto& c : bs)
    if (c.parent == b.tree && PLY_TRY(is_layer(*h_.vol, c))) {
      if (!children.empty()) children += ", ";
      children += json_str(c.name);
    }
  bool mounted = false;
  for (const auto& l : *h_.stack) mounted |= l.tree == b.tree;
  bool view_open = false;
  {
    std::shared_lock lk(mu_);  // after ctl_mu, as in data_view
    if (auto it = slot_of_.find(b.tree.v); it != slot_of_.end()) view_open = views_[it->second - 1]->u != nullptr;
  }
  auto stack = PLY_TRY(stack_of(b.tree));
  std::string st;
  for (const auto& l : stack) {
    if (!st.empty()) st += ", ";
    st += name_of(l.tree);
  }
  std::string o = "{\n  \"name\": ";
  o += json_str(b.name);
  o += ",\n  \"id\": ";
  o += std::to_string(b.tree.v);
  o += ",\n  \"parent\": ";
  o += b.parent.v ? name_of(b.parent) : std::string("null");
  o += ",\n  \"layer\": ";
  o += PLY_TRY(is_layer(*h_.vol, b)) ? "true" : "false";
  o += ",\n  \"read_only\": ";
  o += b.read_only ? "true" : "false";
  o += ",\n  \"writable\": ";
  o += stack[0].writable ? "true" : "false";
  o += ",\n  \"mounted\": ";
  o += mounted ? "true" : "false";
  o += ",\n  \"view_open\": ";
  o += view_open ? "true" : "false";
  o += ",\n  \"created_generation\": ";
  o += std::to_string(b.created.v);
  o += ",\n  \"children\": [";
  o += children;
  o += "],\n  \"stack\": [";
  o += st;
  o += "]\n}\n";
  return o;
}

// --- replies ------------------------------------------------------------------------------

struct stat ControlFolder::view_stat(const View& v, size_t slot, const Attr& a) const {
  return stat_of(a, node(slot, a.ino), v.u->block_size());
}

void ControlFolder::reply_view_entry(fuse_req_t req, InView& w, const Result<Attr>& a,
                                     const std::vector<ViewChange>& cs, bool counted) {
  if (!a) {
    if (counted) unref(w.slot, 1);
    return reply_err(req, a.error());
  }
  if (a->ino > kNumMask) {
    (void)w.v->u->unpin(a->ino);
    if (counted) unref(w.slot, 1);
    view_changed(w, cs);
    return (void)fuse_reply_err(req, EOVERFLOW);
  }
  fuse_entry_param e{};
  e.ino = node(w.slot, a->ino);
  e.generation = a->generation;
  e.attr = view_stat(*w.v, w.slot, *a);
  e.attr_timeout = e.entry_timeout = kTimeout;
  view_changed(w, cs);
  // Before the reply: its forget may come before fuse_reply_entry returns.
  if (!counted) w.v->kernel_refs++;
  if (fuse_reply_entry(req, &e) != 0) {
    (void)w.v->u->unpin(a->ino);
    unref(w.slot, 1);
  }
}

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
  if (is_child_link(ino)) return virtual_stat(ino, child_target(b.name).size());
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

// --- operations ---------------------------------------------------------------------------

void ControlFolder::lookup_root(fuse_req_t req) { reply_virtual_entry(req, kRootNode, 0); }

void ControlFolder::lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  const std::string_view n = name;
  if (parent == kRootNode) {
    if (n == kLayersDir) return reply_virtual_entry(req, kLayersNode, 0);
    return (void)fuse_reply_err(req, ENOENT);
  }
  if (parent == kLayersNode) {
    uint64_t id = 0;
    {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto b = branch_named(n);
      if (!b) return reply_err(req, b.error());
      id = folder_id(n);
    }
    if (!id) return (void)fuse_reply_err(req, EOVERFLOW);
    // Generation 0: the folder is its name's, whichever branch has the name (C6).
    return reply_virtual_entry(req, folder_node(id), 0);
  }
  if (is_children(parent)) {
    // A layer made on the folder's branch: a link to its own folder.
    uint64_t id = 0;
    {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto p = folder_branch(parent);
      if (!p) return reply_err(req, p.error());
      auto c = branch_named(n);
      if (!c) return reply_err(req, c.error());
      auto layer = is_layer(*h_.vol, *c);
      if (!layer) return reply_err(req, layer.error());
      if (c->parent != p->tree || !*layer) return (void)fuse_reply_err(req, ENOENT);
      id = folder_id(n);
    }
    if (!id) return (void)fuse_reply_err(req, EOVERFLOW);
    return reply_virtual_entry(req, named_node(id, kChildLink), 0);
  }
  if (is_folder(parent)) {
    if (n == kInfoFile) return reply_virtual_entry(req, info_node(folder_of(parent)), 0);
    if (n == kChildrenDir) return reply_virtual_entry(req, named_node(folder_of(parent), kChildren), 0);
    if (n != kDataDir) return (void)fuse_reply_err(req, ENOENT);
    auto slot = data_view(parent);  // counts the reference to data
    if (!slot) return reply_err(req, slot.error());
    auto w = in_view(node(*slot, 0));
    if (!w) {
      std::shared_lock lk(mu_);
      unref(*slot, 1);
      return reply_err(req, w.error());
    }
    auto a = w->v->u->getattr(w->v->u->root());  // the root counts no reference
    // data stays the view's root while the branch root it shows changes: a
    // snapshot's new layer, a merge's result, a rollback's fresh layer each
    // bring a root with another generation. A new generation would make
    // the kernel retire the inode it holds (EIO on it, as for an open
    // directory or a path walk that found it just before).
    if (a) a->generation = 0;
    return reply_view_entry(req, *w, a, {}, true);
  }
  if (is_info(parent)) return (void)fuse_reply_err(req, ENOTDIR);
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->lookup(w->ino, name));
}

void ControlFolder::forget(fuse_ino_t ino, uint64_t n) {
  if (slot_of(ino) == 0) return;
  auto w = in_view(ino);
  if (!w) return;  // its layer is gone, and the references with it
  if (auto r = w->v->u->unpin(w->ino, n); !r) (void)h_.errno_of(r.error());
  unref(w->slot, n);
  if (!w->v->idle()) return;
  w->lk.unlock();
  retire_if_idle(w->slot);
}

void ControlFolder::getattr(fuse_req_t req, fuse_ino_t ino) {
  if (slot_of(ino) == 0) {
    auto st = virtual_attr(ino);
    if (!st) return reply_err(req, st.error());
    return (void)fuse_reply_attr(req, &*st, kTimeout);
  }
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto a = w->v->u->getattr(w->ino);
  if (!a) return reply_err(req, a.error());
  struct stat st = view_stat(*w->v, w->slot, *a);
  fuse_reply_attr(req, &st, kTimeout);
}

void ControlFolder::setattr(fuse_req_t req, fuse_ino_t ino, struct stat* st, int valid) {
  auto w = in_view(ino);  // the folder's own nodes: EPERM
  if (!w) return reply_err(req, w.error());
  auto a = w->v->u->setattr(w->ino, setattr_of(st, valid), h_.caller(req));
  if (!a) return reply_err(req, a.error());
  struct stat out = view_stat(*w->v, w->slot, *a);
  view_changed(*w, {(valid & FUSE_SET_ATTR_SIZE) ? ViewChange::data(w->ino, uint64_t(st->st_size), 0)
                                                 : ViewChange::attr(w->ino)});
  fuse_reply_attr(req, &out, kTimeout);
}

void ControlFolder::readlink(fuse_req_t req, fuse_ino_t ino) {
  if (is_child_link(ino)) {
    std::string target;
    {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto c = folder_branch(ino);
      if (!c) return reply_err(req, c.error());
      target = child_target(c->name);
    }
    return (void)fuse_reply_readlink(req, target.c_str());
  }
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, EINVAL);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto t = w->v->u->readlink(w->ino);
  if (!t) return reply_err(req, t.error());
  fuse_reply_readlink(req, t->c_str());
}

void ControlFolder::mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->mknod(w->ino, name, mode, rdev, h_.caller(req)), {ViewChange::entry(w->ino, name)});
}

void ControlFolder::mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  if (parent == kLayersNode || is_children(parent)) {
    if (!may_change(req)) return (void)fuse_reply_err(req, EPERM);
    auto b = make_layer(name, parent == kLayersNode ? 0 : parent);
    if (!b) return reply_err(req, b.error());
    uint64_t id = 0;
    {
      std::lock_guard cl(*h_.ctl_mu);
      id = folder_id(b->name);
    }
    if (!id) return (void)fuse_reply_err(req, EOVERFLOW);
    return reply_virtual_entry(req, folder_node(id), 0);
  }
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->mkdir(w->ino, name, mode, h_.caller(req)), {ViewChange::entry(w->ino, name)});
}

void ControlFolder::symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->symlink(w->ino, name, target, h_.caller(req)), {ViewChange::entry(w->ino, name)});
}

void ControlFolder::link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char* name) {
  if (!is_ctl(ino) || !is_ctl(parent) || slot_of(ino) != slot_of(parent))
    return (void)fuse_reply_err(req, EXDEV);
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->link(num_of(ino), w->ino, name, h_.caller(req)),
                   {ViewChange::entry(w->ino, name), ViewChange::attr(num_of(ino))});
}

void ControlFolder::unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->unlink(w->ino, name);
  if (r) view_changed(*w, {ViewChange::entry(w->ino, name)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (parent == kLayersNode) {
    if (!may_change(req)) return (void)fuse_reply_err(req, EPERM);
    auto r = delete_layer(name);
    return (void)fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
  }
  if (slot_of(parent) == 0) return (void)fuse_reply_err(req, EBUSY);  // layers, data
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->rmdir(w->ino, name);
  if (r) view_changed(*w, {ViewChange::entry(w->ino, name)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
                           const char* newname, unsigned flags) {
  if (parent == kLayersNode && newparent == kLayersNode) {
    if (!may_change(req)) return (void)fuse_reply_err(req, EPERM);
    auto r = rename_layer(name, newname, flags);
    return (void)fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
  }
  if (!is_ctl(parent) || !is_ctl(newparent) || slot_of(parent) != slot_of(newparent))
    return (void)fuse_reply_err(req, EXDEV);
  if (slot_of(parent) == 0) return (void)fuse_reply_err(req, EPERM);
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->rename(w->ino, name, num_of(newparent), newname, flags, h_.caller(req));
  if (r) view_changed(*w, {ViewChange::entry(w->ino, name), ViewChange::entry(num_of(newparent), newname)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  const bool for_write = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
  if (is_info(ino)) {
    if (for_write) return (void)fuse_reply_err(req, EACCES);  // read-only, whoever asks
    Result<TreeId> tree = Error::io(ESTALE, "");
    {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto b = folder_branch(ino);
      tree = b ? Result<TreeId>(b->tree) : Result<TreeId>(b.error());
    }
    if (!tree) return reply_err(req, tree.error());
    auto text = info_json(*tree);
    if (!text) return reply_err(req, text.error());
    auto* s = new std::string(std::move(*text));
    fi->fh = reinterpret_cast<uint64_t>(s);
    fi->direct_io = 1;  // its size may differ from the last getattr's
    if (fuse_reply_open(req, fi) != 0) delete s;
    return;
  }
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, EISDIR);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  Union& u = *w->v->u;
  auto a = u.getattr(w->ino);
  if (!a) return reply_err(req, a.error());
  if (S_ISDIR(a->mode)) return (void)fuse_reply_err(req, EISDIR);
  if (for_write && u.read_only()) return (void)fuse_reply_err(req, EROFS);
  // Held until release, as in the mount (ops_files.cpp, op_open).
  if (auto h = u.hold(w->ino); !h) return reply_err(req, h.error());
  auto fail = [&](const Error& e) {
    (void)u.unhold(w->ino);
    reply_err(req, e);
  };
  if (for_write)
    if (auto o = u.open(w->ino, true, h_.caller(req)); !o) return fail(o.error());
  if ((fi->flags & O_TRUNC) && S_ISREG(a->mode)) {
    SetAttr s;
    s.size = 0;
    if (auto k = kill_setid_before_change(u, w->ino, request_kills_setid(), h_.caller(req)); !k)
      return fail(k.error());
    if (auto t = u.setattr(w->ino, s, h_.caller(req)); !t) return fail(t.error());
    view_changed(*w, {ViewChange::data(w->ino, 0, 0)});
  }
  // Another view may have changed the file since the kernel cached it.
  fi->keep_cache = 0;
  fi->fh = reinterpret_cast<uint64_t>(w->v);  // for release, which takes no lock
  w->v->open_files++;
  if (fuse_reply_open(req, fi) != 0) {
    (void)u.unhold(w->ino);
    w->v->open_files--;
  }
}

void ControlFolder::create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                           fuse_file_info* fi) {
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  auto a = w->v->u->mknod(w->ino, name, S_IFREG | (mode & 07777), 0, h_.caller(req));
  if (!a) return reply_err(req, a.error());
  if (a->ino > kNumMask) {
    (void)w->v->u->unpin(a->ino);
    view_changed(*w, {ViewChange::entry(w->ino, name)});
    return (void)fuse_reply_err(req, EOVERFLOW);
  }
  view_changed(*w, {ViewChange::entry(w->ino, name)});
  if (auto h = w->v->u->hold(a->ino); !h) {
    (void)w->v->u->unpin(a->ino);
    return reply_err(req, h.error());
  }
  fuse_entry_param e{};
  e.ino = node(w->slot, a->ino);
  e.generation = a->generation;
  e.attr = view_stat(*w->v, w->slot, *a);
  e.attr_timeout = e.entry_timeout = kTimeout;
  fi->keep_cache = 0;
  fi->fh = reinterpret_cast<uint64_t>(w->v);
  w->v->open_files++;
  w->v->kernel_refs++;
  if (fuse_reply_create(req, &e, fi) != 0) {
    (void)w->v->u->unhold(a->ino);
    w->v->open_files--;
    unref(w->slot, 1);
    (void)w->v->u->unpin(a->ino);
  }
}

void ControlFolder::read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  if (is_info(ino)) {
    // A copy: once the reply is written the kernel may send the release,
    // which frees the text, before fuse_reply_buf has returned.
    const auto* s = reinterpret_cast<const std::string*>(fi->fh);
    const size_t at = std::min(size_t(off), s->size());
    const std::string part = s->substr(at, std::min(size, s->size() - at));
    return (void)fuse_reply_buf(req, part.data(), part.size());
  }
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  std::vector<std::byte> buf(size);
  auto n = w->v->u->read(w->ino, uint64_t(off), buf);
  if (!n) return reply_err(req, n.error());
  fuse_reply_buf(req, reinterpret_cast<const char*>(buf.data()), *n);
}

void ControlFolder::write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off) {
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  if (auto k = kill_setid_before_change(*w->v->u, w->ino, request_kills_setid(), h_.caller(req)); !k)
    return reply_err(req, k.error());
  auto n = w->v->u->write(w->ino, uint64_t(off), std::span(reinterpret_cast<const std::byte*>(data), size),
                          h_.caller(req));
  if (!n) return reply_err(req, n.error());
  view_changed(*w, {ViewChange::data(w->ino, uint64_t(off), *n)});
  fuse_reply_write(req, *n);
}

void ControlFolder::release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (is_info(ino)) {
    delete reinterpret_cast<std::string*>(fi->fh);
  } else if (fi->fh) {
    // Without waiting for mu_, which a snapshot or merge holds for a while:
    // rmdir waits for this. A View is never freed (C3), only its union.
    View* v = reinterpret_cast<View*>(fi->fh);
    // Before open_files drops, which may let the view's union go.
    std::shared_lock lk(mu_, std::try_to_lock);
    if (lk.owns_lock() && v->u) {
      (void)v->u->unhold(num_of(ino));
    } else if (!lk.owns_lock()) {
      std::lock_guard ul(v->unhold_mu);
      v->unholds.push_back(num_of(ino));
    }
    if (lk.owns_lock()) lk.unlock();
    v->open_files--;
    if (v->idle()) retire_if_idle(slot_of(ino));
  }
  fuse_reply_err(req, 0);
}

void ControlFolder::fsync(fuse_req_t req, fuse_ino_t ino) {
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, 0);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->sync();
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (slot_of(ino) == 0) {
    if (is_info(ino) || is_child_link(ino)) return (void)fuse_reply_err(req, ENOTDIR);
  } else {
    auto w = in_view(ino);
    if (!w) return reply_err(req, w.error());
    auto a = w->v->u->getattr(w->ino);
    if (!a) return reply_err(req, a.error());
    if (!S_ISDIR(a->mode)) return (void)fuse_reply_err(req, ENOTDIR);
  }
  fi->cache_readdir = 0;
  fuse_reply_open(req, fi);
}

void ControlFolder::readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  std::vector<char> buf(size);
  size_t used = 0;
  // One listed entry; false when the buffer is full.
  auto add = [&](const char* name, fuse_ino_t id, mode_t type, uint64_t next, const fuse_entry_param* ep) {
    fuse_entry_param e{};
    if (ep) e = *ep;
    e.attr.st_ino = id;
    if (!ep) e.attr.st_mode = type;
    size_t need = plus ? fuse_add_direntry_plus(req, buf.data() + used, size - used, name, &e, off_t(next))
                       : fuse_add_direntry(req, buf.data() + used, size - used, name, &e.attr, off_t(next));
    if (need > size - used) return false;
    used += need;
    return true;
  };
  if (slot_of(ino) == 0) {
    // The folder's own directories list their names with cookies 1, 2... (a
    // branch: its tree id, so that a listing survives new and deleted layers).
    // Entries come without attributes (node id 0): nothing to count.
    std::vector<std::tuple<std::string, fuse_ino_t, mode_t, uint64_t>> ents;
    ents.emplace_back(".", ino, S_IFDIR, 1);
    ents.emplace_back("..", ino == kRootNode ? FUSE_ROOT_ID : ino == kLayersNode ? kRootNode : kLayersNode, S_IFDIR, 2);
    if (ino == kRootNode) {
      ents.emplace_back(kLayersDir, kLayersNode, S_IFDIR, 3);
    } else if (ino == kLayersNode) {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto bs = Filesystem::branches(*h_.vol);
      if (!bs) return reply_err(req, bs.error());
      std::sort(bs->begin(), bs->end(), [](const BranchMeta& a, const BranchMeta& b) { return a.tree.v < b.tree.v; });
      // Listed with their folders' numbers (C6), which stat shows too.
      for (const auto& b : *bs)
        if (!b.doomed)
          if (const uint64_t id = folder_id(b.name)) ents.emplace_back(b.name, folder_node(id), S_IFDIR, 2 + b.tree.v);
    } else if (is_folder(ino)) {
      // data's node id is its view's root, made on lookup; the listing
      // gives a number of the folder's own instead.
      ents.emplace_back(kDataDir, named_node(folder_of(ino), kDataListed), S_IFDIR, 3);
      ents.emplace_back(kInfoFile, info_node(folder_of(ino)), S_IFREG, 4);
      ents.emplace_back(kChildrenDir, named_node(folder_of(ino), kChildren), S_IFDIR, 5);
    } else if (is_children(ino)) {
      // The layers made on the folder's branch, as info.json's children,
      // cookies by tree id as in layers/.
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto p = folder_branch(ino);
      if (!p) return reply_err(req, p.error());
      auto bs = Filesystem::branches(*h_.vol);
      if (!bs) return reply_err(req, bs.error());
      std::sort(bs->begin(), bs->end(), [](const BranchMeta& a, const BranchMeta& b) { return a.tree.v < b.tree.v; });
      for (const auto& b : *bs) {
        if (b.doomed || b.parent != p->tree) continue;
        auto layer = is_layer(*h_.vol, b);
        if (!layer) return reply_err(req, layer.error());
        if (*layer)
          if (const uint64_t id = folder_id(b.name)) ents.emplace_back(b.name, named_node(id, kChildLink), S_IFLNK, 2 + b.tree.v);
      }
    } else {
      return (void)fuse_reply_err(req, ENOTDIR);
    }
    for (const auto& [name, id, type, next] : ents)
      if (next > uint64_t(off) && !add(name.c_str(), id, type, next, nullptr)) break;
    return (void)fuse_reply_buf(req, buf.data(), used);
  }
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  Union& u = *w->v->u;
  Result<void> r = ok();
  if (!plus) {
    r = u.readdir(w->ino, uint64_t(off), [&](const DirEntry& d) {
      return add(std::string(d.name).c_str(), node(w->slot, d.ino & kNumMask), mode_t(DTTOIF(d.type)), d.next, nullptr);
    });
  } else {
    r = u.readdirplus(w->ino, uint64_t(off), [&](const DirEntry& d, const Attr* a) {
      if (!a) return add(std::string(d.name).c_str(), node(w->slot, d.ino & kNumMask), S_IFDIR, d.next, nullptr);
      fuse_entry_param e{};
      e.ino = a->ino > kNumMask ? 0 : node(w->slot, a->ino);
      e.generation = a->generation;
      e.attr = view_stat(*w->v, w->slot, *a);
      e.attr_timeout = e.entry_timeout = kTimeout;
      if (e.ino) w->v->kernel_refs++;  // before the reply, as in reply_view_entry
      const bool fits = add(std::string(d.name).c_str(), e.ino, 0, d.next, &e);
      if (!fits && e.ino) unref(w->slot, 1);
      if (fits && !e.ino) (void)u.unpin(a->ino);  // listed, but not handed out
      return fits;
    });
  }
  if (!r && used == 0) return reply_err(req, r.error());
  fuse_reply_buf(req, buf.data(), used);
}

void ControlFolder::setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value,
                             size_t size, int flags) {
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->setxattr(w->ino, name, std::span(reinterpret_cast<const std::byte*>(value), size),
                             flags, h_.caller(req));
  if (r) view_changed(*w, {ViewChange::attr(w->ino)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, ENODATA);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto v = w->v->u->getxattr(w->ino, name);
  if (!v) return reply_err(req, v.error());
  if (size == 0) return (void)fuse_reply_xattr(req, v->size());
  if (size < v->size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, reinterpret_cast<const char*>(v->data()), v->size());
}

void ControlFolder::listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  if (slot_of(ino) == 0) return reply_xattr_names(req, {}, size);  // the folder's own: none
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto names = w->v->u->listxattr(w->ino);
  if (!names) return reply_err(req, names.error());
  reply_xattr_names(req, *names, size);
}

void ControlFolder::removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->removexattr(w->ino, name, h_.caller(req));
  if (r) view_changed(*w, {ViewChange::attr(w->ino)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len) {
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  if (auto k = kill_setid_before_change(*w->v->u, w->ino, unprivileged(req), h_.caller(req)); !k)
    return reply_err(req, k.error());
  auto r = w->v->u->fallocate(w->ino, mode, uint64_t(off), uint64_t(len), h_.caller(req));
  if (r) view_changed(*w, {ViewChange::data(w->ino, uint64_t(off), uint64_t(len))});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence) {
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, ENXIO);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->lseek(w->ino, uint64_t(off), whence);
  if (!r) return reply_err(req, r.error());
  fuse_reply_lseek(req, off_t(*r));
}

void ControlFolder::copy_file_range(fuse_req_t req, fuse_ino_t in, off_t off_in, fuse_ino_t out,
                                    off_t off_out, size_t len) {
  if (!is_ctl(in) || !is_ctl(out) || slot_of(in) != slot_of(out) || slot_of(in) == 0)
    return (void)fuse_reply_err(req, EXDEV);
  auto w = in_view(in);
  if (!w) return reply_err(req, w.error());
  if (auto k = kill_setid_before_change(*w->v->u, num_of(out), unprivileged(req), h_.caller(req)); !k)
    return reply_err(req, k.error());
  auto r = w->v->u->copy_range(w->ino, uint64_t(off_in), num_of(out), uint64_t(off_out), len, h_.caller(req));
  if (!r) return reply_err(req, r.error());
  view_changed(*w, {ViewChange::data(num_of(out), uint64_t(off_out), *r)});
  fuse_reply_write(req, size_t(*r));
}

}  // namespace plyfs
