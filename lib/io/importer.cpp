// The builder of one new branch from a stream of entries (source.h): a tree
// flagged DOOMED (io.h, I1) filled through the filesystem layer, every path
// resolved in that tree (I2), every attribute kept that an interface can set
// (I3). Directories get their attributes and xattrs last: creating their
// entries would change their times, and a default ACL set first would be
// inherited by entries that the source gives none.
#include <dirent.h>
#include <fcntl.h>
#include <sys/xattr.h>

#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

#include "fs/acl.h"
#include "io/source.h"
#include "union/view.h"
#include "util/text.h"

namespace plyfs::io {

namespace {

// The filesystem layer takes writes of any size and maps each into one
// space extent of up to 8 MiB: data goes in pieces that large.
constexpr size_t kChunkBytes = 8u << 20;

std::string entry_name(const std::string& raw) {
  std::string s = "entry \"";
  s += shown(raw.empty() ? "." : raw);
  s += '"';
  return s;
}

Error entry_error(const std::string& raw, const Error& e) {
  Error out = e;
  std::string why = entry_name(raw);
  why += ": ";
  why += e.reason;
  out.reason = why;
  return out;
}

bool keeps_xattr(std::string_view name) {
  for (std::string_view p : {"user.", "trusted.", "security."})
    if (name.size() > p.size() && name.substr(0, p.size()) == p) return true;
  return name == kAclAccess || name == kAclDefault;
}

struct Deferred {  // a directory's attributes, set after its entries
  SetAttr attr;
  std::vector<Xattr> xattrs;
};

class Builder {
 public:
  Builder(Volume& v, EntrySource& src, ImportStats& st, const ImportOptions& o)
      : v_(v), src_(src), st_(st), o_(o) {}

  Result<BranchMeta> run(const BuildTarget& target);
  TreeId tree() const { return tree_; }

 private:
  Result<void> take(const SourceEntry& e);
  Result<std::string> normalize(const std::string& raw);
  Result<uint64_t> dir_for(const std::string& path, const std::string& raw);
  Result<void> make_object(const SourceEntry& e, const std::string& path, uint64_t dir,
                           std::string_view name);
  Result<void> write_data(uint64_t ino, const SourceEntry& e);
  Result<void> flush_chunk(uint64_t ino, uint64_t off, size_t len);
  Result<void> set_xattrs(uint64_t ino, const std::vector<Xattr>& xs, const std::string& raw);
  Result<void> remove(uint64_t dir, std::string_view name, const Entry& what, const std::string& path);
  Result<void> remove_dir_contents(uint64_t dir);
  Result<void> finish_dirs();
  struct Like {
    Attr attr;
    std::vector<Xattr> xattrs;
  };
  Result<std::optional<Like>> parent_dir(const std::string& path);
  void forget_under(const std::string& path);
  bool under_non_dir(const std::string& path) const;  // a prefix of it is no directory here
  void report(bool force = false);
  static SetAttr attr_of(const SourceEntry& e, bool with_mode);

  Volume& v_;
  TreeId tree_{0};  // the doomed tree being built
  EntrySource& src_;
  ImportStats& st_;
  const ImportOptions& o_;
  std::unique_ptr<Filesystem> fs_;
  TreeId parent_{0};
  OpenUnion parent_view_;  // the parent's view, for directories a layer makes implicitly
  bool parent_open_ = false;
  std::map<std::string, uint64_t> dirs_;    // path -> directory inode ("" is the root)
  std::map<std::string, uint64_t> others_;  // path -> inode of everything else
  std::set<std::string> symlinks_;          // paths of symlinks (a path through one is refused)
  std::unordered_map<uint64_t, uint64_t> keys_;  // SourceEntry::link_key -> inode
  std::map<uint64_t, Deferred> deferred_;   // directory inode -> its attributes
  std::set<std::string> xattr_noted_;
  std::vector<std::byte> buf_;
  bool slash_noted_ = false;
  std::chrono::steady_clock::time_point last_report_{};
};

SetAttr Builder::attr_of(const SourceEntry& e, bool with_mode) {
  SetAttr s;
  if (with_mode) s.mode = e.mode & 07777;
  s.uid = e.uid;
  s.gid = e.gid;
  s.atime = e.atime;
  s.mtime = e.mtime;
  return s;
}

void Builder::report(bool force) {
  if (!o_.progress) return;
  auto now = std::chrono::steady_clock::now();
  if (!force && now - last_report_ < std::chrono::milliseconds(50)) return;
  last_report_ = now;
  st_.read_bytes = src_.read_bytes();
  st_.total_bytes = src_.total_bytes();
  o_.progress(st_);
}

// "a/b/c" from what the source says: '.' and empty components go, a leading
// '/' goes with a note where tar's rule allows (I2), '..' and long names are
// refused.
Result<std::string> Builder::normalize(const std::string& raw) {
  std::string_view p = raw;
  if (!p.empty() && p[0] == '/') {
    if (!src_.strips_leading_slash())
      return Error::invalid(entry_name(raw) + ": an absolute path");
    while (!p.empty() && p[0] == '/') p.remove_prefix(1);
    if (!slash_noted_ && o_.note) o_.note("removing leading '/' from member names");
    slash_noted_ = true;
  }
  std::string out;
  while (!p.empty()) {
    const size_t cut = p.find('/');
    std::string_view c = p.substr(0, cut);
    p = cut == std::string_view::npos ? std::string_view{} : p.substr(cut + 1);
    if (c.empty() || c == ".") continue;
    if (c == "..") return Error::invalid(entry_name(raw) + ": a path with a '..' component");
    if (c.size() > 255) return Error::io(ENAMETOOLONG, entry_name(raw) + ": a name longer than 255 bytes");
    if (!out.empty()) out += '/';
    out += c;
  }
  return out;
}

// The parent view's directory at `path`, for a directory that a layer's
// source implies without giving it (an OCI layer holding a changed file but
// not its directory, as umoci writes them): the layer's directory takes the
// attributes and xattrs the view shows there, as a copy-up would.
Result<std::optional<Builder::Like>> Builder::parent_dir(const std::string& path) {
  if (!parent_.v) return std::optional<Like>{};
  if (!parent_open_) {
    auto stack = PLY_TRY(export_stack(v_, parent_));
    parent_view_ = PLY_TRY(open_union(v_, stack, true, true));
    parent_open_ = true;
  }
  Union& u = *parent_view_.u;
  uint64_t ino = u.root();
  std::vector<uint64_t> pinned;
  std::optional<Like> found;
  std::string_view p = path;
  while (!p.empty()) {
    const size_t cut = p.find('/');
    auto a = u.lookup(ino, p.substr(0, cut));
    if (!a) {
      found.reset();
      break;
    }
    pinned.push_back(a->ino);
    if (!S_ISDIR(a->mode)) {
      found.reset();
      break;
    }
    ino = a->ino;
    found = Like{*a, {}};
    p = cut == std::string_view::npos ? std::string_view{} : p.substr(cut + 1);
  }
  if (found)
    if (auto names = u.listxattr(ino))
      for (const auto& n : *names)
        if (auto v = u.getxattr(ino, n)) found->xattrs.push_back({n, std::move(*v)});
  for (uint64_t i : pinned) (void)u.unpin(i);
  return found;
}

// The directory at `path` in the new tree, made (with its parents) if the
// source has not given it yet. A path through a symlink or a file is
// refused (I2).
Result<uint64_t> Builder::dir_for(const std::string& path, const std::string& raw) {
  if (auto it = dirs_.find(path); it != dirs_.end()) return it->second;
  if (symlinks_.count(path))
    return Error::invalid(entry_name(raw) + ": its path goes through the symbolic link \"" + shown(path) + "\"");
  if (others_.count(path))
    return Error::io(ENOTDIR, entry_name(raw) + ": its path goes through \"" + shown(path) + "\", which is not a directory");
  const size_t cut = path.rfind('/');
  const std::string up = cut == std::string::npos ? "" : path.substr(0, cut);
  const std::string name = cut == std::string::npos ? path : path.substr(cut + 1);
  const uint64_t pdir = PLY_TRY(dir_for(up, raw));
  auto like = PLY_TRY(parent_dir(path));
  const uint32_t mode = like ? like->attr.mode & 07777 : 0755;
  Attr a = PLY_TRY(fs_->mkdir(pdir, name, mode, like ? like->attr.uid : 0, like ? like->attr.gid : 0));
  if (like) {
    Deferred d;
    d.attr.mode = mode;
    // Set again at the end: mkdir in a setgid directory takes its group.
    d.attr.uid = like->attr.uid;
    d.attr.gid = like->attr.gid;
    d.attr.atime = like->attr.atime;
    d.attr.mtime = like->attr.mtime;
    d.xattrs = std::move(like->xattrs);
    deferred_[a.ino] = d;
  }
  st_.dirs++;
  dirs_[path] = a.ino;
  return a.ino;
}

bool Builder::under_non_dir(const std::string& path) const {
  if (path.empty()) return false;
  for (size_t cut = 0;; cut++) {
    cut = path.find('/', cut);
    const std::string p = path.substr(0, cut);
    if (others_.count(p) || symlinks_.count(p)) return true;
    if (cut == std::string::npos) return false;
  }
}

void Builder::forget_under(const std::string& path) {
  const std::string pre = path + "/";
  for (auto* m : {&dirs_, &others_}) {
    m->erase(path);
    m->erase(m->lower_bound(pre), m->lower_bound(path + "0"));  // '0' follows '/'
  }
  symlinks_.erase(path);
  symlinks_.erase(symlinks_.lower_bound(pre), symlinks_.lower_bound(path + "0"));
}

Result<void> Builder::remove_dir_contents(uint64_t dir) {
  std::vector<std::pair<std::string, Entry>> names;
  PLY_CHECK(fs_->readdir(dir, 0, [&](const DirEntry& d) {
    if (d.name != "." && d.name != "..") names.push_back({std::string(d.name), Entry{d.ino, d.type}});
    return true;
  }));
  for (auto& [n, e] : names) {
    if (e.type == DT_WHT) continue;  // rmdir takes whiteouts along
    if (e.type == DT_DIR) {
      PLY_CHECK(remove_dir_contents(e.ino));
      deferred_.erase(e.ino);
      PLY_CHECK(fs_->rmdir(dir, n));
    } else {
      PLY_CHECK(fs_->unlink(dir, n));
    }
  }
  return ok();
}

// A later entry of the same name wins (tar's rule): what was there goes,
// a directory with everything in it.
Result<void> Builder::remove(uint64_t dir, std::string_view name, const Entry& what, const std::string& path) {
  if (what.type == DT_DIR) {
    PLY_CHECK(remove_dir_contents(what.ino));
    deferred_.erase(what.ino);
    PLY_CHECK(fs_->rmdir(dir, name));
  } else {
    PLY_CHECK(fs_->unlink(dir, name));
  }
  forget_under(path);
  return ok();
}

Result<void> Builder::set_xattrs(uint64_t ino, const std::vector<Xattr>& xs, const std::string& raw) {
  for (const auto& x : xs) {
    if (!keeps_xattr(x.name)) {
      if (o_.note && xattr_noted_.insert(x.name).second)
        o_.note("xattr \"" + shown(x.name) + "\" (first of " + entry_name(raw) +
                ") not kept: plyfs stores user., trusted. and security. xattrs and POSIX ACLs");
      continue;
    }
    if ((x.name == kAclAccess || x.name == kAclDefault) && !decode_acl(x.value))
      return Error::invalid(entry_name(raw) + ": xattr " + x.name + " is not a POSIX ACL in the kernel's encoding");
    auto r = fs_->setxattr(ino, x.name, x.value, 0);
    if (!r) return entry_error(raw, r.error());
    st_.xattrs++;
  }
  return ok();
}

Result<void> Builder::flush_chunk(uint64_t ino, uint64_t off, size_t len) {
  (void)PLY_TRY(fs_->write(ino, off, std::span<const std::byte>(buf_).first(len)));
  st_.bytes += len;
  return ok();
}

// The file's data in pieces of up to 8 MiB, each contiguous: a gap between
// the source's pieces stays a hole.
Result<void> Builder::write_data(uint64_t ino, const SourceEntry& e) {
  uint64_t start = 0;
  size_t used = 0;
  while (auto piece = PLY_TRY(src_.data())) {
    auto bytes = piece->bytes;
    uint64_t off = piece->offset;
    if (used && off != start + used) {
      PLY_CHECK(flush_chunk(ino, start, used));
      used = 0;
    }
    while (!bytes.empty()) {
      if (!used) start = off;
      const size_t n = std::min(bytes.size(), kChunkBytes - used);
      std::memcpy(buf_.data() + used, bytes.data(), n);
      used += n;
      off += n;
      bytes = bytes.subspan(n);
      if (used == kChunkBytes) {
        PLY_CHECK(flush_chunk(ino, start, used));
        used = 0;
      }
    }
    report();
  }
  if (used) PLY_CHECK(flush_chunk(ino, start, used));
  // A file that ends in a hole: the size alone.
  if (PLY_TRY(fs_->getattr(ino)).size < e.size) {
    SetAttr s;
    s.size = e.size;
    (void)PLY_TRY(fs_->setattr(ino, s));
  }
  return ok();
}

Result<void> Builder::make_object(const SourceEntry& e, const std::string& path, uint64_t dir,
                                  std::string_view name) {
  const uint32_t type = e.mode & S_IFMT;
  // A hard link: to an earlier entry's object.
  std::optional<uint64_t> target;
  if (e.link_path) {
    auto norm = normalize(*e.link_path);
    if (!norm) {  // the message names the link's own entry
      Error err = norm.error();
      const std::string own = entry_name(*e.link_path) + ": ";
      std::string why = entry_name(e.path);
      why += ": a hard link to \"";
      why += shown(*e.link_path);
      why += "\": ";
      why += err.reason.rfind(own, 0) == 0 ? err.reason.substr(own.size()) : err.reason;
      err.reason = why;
      return err;
    }
    const std::string tp = *norm;
    if (dirs_.count(tp)) return Error::invalid(entry_name(e.path) + ": a hard link to a directory");
    auto it = others_.find(tp);
    if (it == others_.end())
      return Error::io(ENOENT, entry_name(e.path) + ": a hard link to \"" + shown(*e.link_path) +
                                   "\", which the source does not hold before it");
    target = it->second;
  } else if (e.link_key && type != S_IFDIR) {
    if (auto it = keys_.find(e.link_key); it != keys_.end()) target = it->second;
  }
  if (target) {
    (void)PLY_TRY(fs_->link(*target, dir, name));
    others_[path] = *target;
    st_.hardlinks++;
    return ok();
  }
  Attr a;
  switch (type) {
    case S_IFDIR:
      a = PLY_TRY(fs_->mkdir(dir, name, e.mode & 07777, e.uid, e.gid));
      dirs_[path] = a.ino;
      deferred_[a.ino] = Deferred{attr_of(e, true), e.xattrs};
      if (e.opaque) deferred_[a.ino].attr.opaque = true;
      st_.dirs++;
      return ok();
    case S_IFLNK:
      a = PLY_TRY(fs_->symlink(dir, name, e.target, e.uid, e.gid));
      symlinks_.insert(path);
      st_.symlinks++;
      break;
    case S_IFREG:
      a = PLY_TRY(fs_->mknod(dir, name, S_IFREG | (e.mode & 07777), 0, e.uid, e.gid));
      PLY_CHECK(write_data(a.ino, e));
      st_.files++;
      break;
    case S_IFCHR:
    case S_IFBLK:
    case S_IFIFO:
    case S_IFSOCK:
      a = PLY_TRY(fs_->mknod(dir, name, e.mode, e.rdev, e.uid, e.gid));
      st_.specials++;
      break;
    default:
      return Error::invalid(entry_name(e.path) + ": a file of unknown type");
  }
  others_[path] = a.ino;
  if (e.link_key) keys_[e.link_key] = a.ino;
  PLY_CHECK(set_xattrs(a.ino, e.xattrs, e.path));
  (void)PLY_TRY(fs_->setattr(a.ino, attr_of(e, type != S_IFLNK)));
  return ok();
}

Result<void> Builder::take(const SourceEntry& e) {
  const std::string path = PLY_TRY(normalize(e.path));
  st_.entries++;
  if (path.empty()) {  // the root itself
    if (e.whiteout) return Error::invalid(entry_name(e.path) + ": a whiteout of the root");
    if (!e.opaque && (e.mode & S_IFMT) != S_IFDIR)
      return Error::invalid(entry_name(e.path) + ": the root is not a directory");
    Deferred& d = deferred_[fs_->root()];
    if (e.opaque) {
      d.attr.opaque = true;
      st_.opaque++;
    } else {
      const bool opaque = d.attr.opaque.value_or(false);
      d = Deferred{attr_of(e, true), e.xattrs};
      if (opaque) d.attr.opaque = true;
    }
    return ok();
  }
  const size_t cut = path.rfind('/');
  const std::string up = cut == std::string::npos ? "" : path.substr(0, cut);
  const std::string name = cut == std::string::npos ? path : path.substr(cut + 1);
  // An OCI marker below a file of this layer: the file hides it all anyway.
  if ((e.whiteout || e.opaque) && under_non_dir(up)) return ok();
  const uint64_t dir = PLY_TRY(dir_for(up, e.path));
  if (e.opaque) {  // `path` is the opaque directory
    const uint64_t d = PLY_TRY(dir_for(path, e.path));
    deferred_[d].attr.opaque = true;
    st_.opaque++;
    return ok();
  }
  auto have = PLY_TRY(fs_->entry(dir, name));
  if (have && have->type == DT_WHT) have.reset();  // a new name replaces a whiteout
  if (e.whiteout) {
    // A whiteout hides the layers below; a name this layer holds itself
    // stays (the OCI rule: a whiteout applies to lower layers only).
    if (!have) {
      PLY_CHECK(fs_->whiteout(dir, name));
      st_.whiteouts++;
    }
    return ok();
  }
  if (have) {
    if (have->type == DT_DIR && (e.mode & S_IFMT) == S_IFDIR && !e.link_path) {
      Deferred& d = deferred_[have->ino];
      const bool opaque = d.attr.opaque.value_or(false);
      d = Deferred{attr_of(e, true), e.xattrs};
      if (opaque || e.opaque) d.attr.opaque = true;
      return ok();
    }
    PLY_CHECK(remove(dir, name, *have, path));
  }
  return make_object(e, path, dir, name);
}

Result<void> Builder::finish_dirs() {
  for (auto& [ino, d] : deferred_) {
    PLY_CHECK(set_xattrs(ino, d.xattrs, "directory"));
    (void)PLY_TRY(fs_->setattr(ino, d.attr));
  }
  return ok();
}

Result<BranchMeta> Builder::run(const BuildTarget& target) {
  parent_ = target.parent;
  FsCreateOptions co;
  co.name = target.name;
  co.parent = target.parent;
  co.read_only = target.read_only;
  co.doomed = true;
  if (target.parent.v) {  // a layer's root starts as its parent's (snap.cpp root_like)
    auto pfs = PLY_TRY(Filesystem::open(v_, target.parent, true));
    Attr a = PLY_TRY(pfs->getattr(pfs->root()));
    co.root_mode = a.mode & 07777;
    co.uid = a.uid;
    co.gid = a.gid;
  }
  tree_ = PLY_TRY(Filesystem::create(v_, co));
  const TreeId tree = tree_;
  // Imported files go where the volume's placement rules say
  // (format.md#placement-rules), as they would written through a mount.
  // A damaged rule (U6) leaves them all out of force, as at mount.
  (void)load_placement_rules(v_);
  fs_ = PLY_TRY(Filesystem::open(v_, tree));
  dirs_[""] = fs_->root();
  buf_.resize(kChunkBytes);
  while (auto e = PLY_TRY(src_.next())) {
    auto r = take(*e);
    if (!r) {
      Error err = r.error();
      // Errors of the filesystem layer say what failed, not where.
      if (err.reason.rfind("entry \"", 0) != 0) err = entry_error(e->path, err);
      return err;
    }
    report();
  }
  PLY_CHECK(src_.finish());
  PLY_CHECK(finish_dirs());
  report(true);
  fs_.reset();
  parent_view_ = OpenUnion{};
  return Filesystem::branch(v_, tree);
}

}  // namespace

Result<BranchMeta> build_branch(Volume& v, const BuildTarget& target, EntrySource& src,
                                ImportStats& stats, const ImportOptions& o) {
  TreeId made{0};
  auto r = [&] {  // the builder and its open tree go before a drop
    Builder b(v, src, stats, o);
    auto out = b.run(target);
    made = b.tree();
    return out;
  }();
  if (!r && made.v) {
    // At once, for the space; if this fails too (the volume turned
    // read-only on an I/O error), the next read-write open drops it.
    if (auto t = v.begin({.for_delete = true, .reserve_blocks = 64})) (void)t->drop_tree(made);
  }
  return r;
}

}  // namespace plyfs::io
