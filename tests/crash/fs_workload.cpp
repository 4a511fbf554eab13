#include "fs_workload.h"
#include "util/checksum.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <utility>

#include "fs/check.h"
#include "fs/compress.h"
#include "fs/fs.h"
#include "fs/items.h"
#include "fs/send.h"
#include "../received_items.h"
#include "fsck/fsck.h"
#include "snap/snap.h"
#include "union/union.h"
#include "union/view.h"

namespace plyfs::crash {

namespace {

const Caller kRoot{0, 0, 0};

std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<std::byte>((seed * 131 + i * 7 + (i >> 9)) & 0xff);
  return v;
}
// Compressible data: words of a small vocabulary (about 4 bits of entropy a
// byte, so that the compression test lets it through and zstd saves most
// blocks), different for each seed.
std::vector<std::byte> words(size_t n, uint64_t seed) {
  static const char* const vocab[] = {"copy ", "on ", "write ", "union ", "branch ", "frame ", "zstd ",
                                      "block ", "extent ", "crash ", "state ", "the ", "of ", "a ",
                                      "generation\n", "checksum "};
  std::vector<std::byte> v;
  v.reserve(n + 16);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  while (v.size() < n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    for (const char* c = vocab[(x >> 59) & 15]; *c; c++) v.push_back(std::byte(*c));
  }
  v.resize(n);
  return v;
}
std::vector<std::byte> text(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

std::string parent_of(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "" : p.substr(0, s);
}
std::string base_of(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// An open image as a mount sees it: the default view's stack as a union.
struct Mount {
  explicit Mount(Volume& v) : vol(v) {}
  Volume& vol;
  std::vector<ViewLayer> stack;
  std::vector<std::unique_ptr<Filesystem>> fs;
  std::unique_ptr<Union> u;

  Result<void> open() {
    stack = PLY_TRY(default_stack(vol));
    auto o = PLY_TRY(open_union(vol, stack, false));
    fs = std::move(o.fs);
    u = std::move(o.u);
    return ok();
  }
  Result<void> close() {
    u.reset();
    for (auto& f : fs) PLY_CHECK(f->release_all());
    fs.clear();
    return ok();
  }
  Result<void> reopen() {
    PLY_CHECK(close());
    return open();
  }
  int writable() const {
    for (size_t i = 0; i < stack.size(); i++)
      if (stack[i].writable) return int(i);
    return -1;
  }

  Result<uint64_t> resolve(const std::string& path) {
    uint64_t ino = u->root();
    size_t pos = 0;
    while (pos < path.size()) {
      size_t next = path.find('/', pos);
      if (next == std::string::npos) next = path.size();
      ino = PLY_TRY(u->lookup(ino, std::string_view(path).substr(pos, next - pos))).ino;
      pos = next + 1;
    }
    return ino;
  }

  // One operation; index seeds its data.
  Result<void> run(size_t index, const FsOp& op) {
    const std::string& p = op.path;
    switch (op.kind) {
      case FsOpKind::Create: {
        const uint64_t d = PLY_TRY(resolve(parent_of(p)));
        (void)PLY_TRY(u->mknod(d, base_of(p), S_IFREG | 0644, 0, kRoot));
        return ok();
      }
      case FsOpKind::Write: {
        const uint64_t ino = PLY_TRY(resolve(p));
        (void)PLY_TRY(u->write(ino, op.off, pattern(op.arg, index), kRoot));
        return ok();
      }
      case FsOpKind::WriteText: {
        const uint64_t ino = PLY_TRY(resolve(p));
        (void)PLY_TRY(u->write(ino, op.off, words(op.arg, index), kRoot));
        return ok();
      }
      case FsOpKind::Chattr: {
        const uint64_t ino = PLY_TRY(resolve(p));
        const uint32_t now = PLY_TRY(u->get_fsflags(ino));
        return u->set_fsflags(ino, now | uint32_t(op.arg), kRoot);
      }
      case FsOpKind::CopyRange: {
        const uint64_t in = PLY_TRY(resolve(p)), out = PLY_TRY(resolve(op.path2));
        (void)PLY_TRY(u->copy_range(in, op.off, out, op.off, op.arg, kRoot));
        return ok();
      }
      case FsOpKind::Truncate: {
        SetAttr s;
        s.size = op.arg;
        (void)PLY_TRY(u->setattr(PLY_TRY(resolve(p)), s, kRoot));
        return ok();
      }
      case FsOpKind::Rename:
        return u->rename(PLY_TRY(resolve(parent_of(p))), base_of(p), PLY_TRY(resolve(parent_of(op.path2))),
                         base_of(op.path2), 0, kRoot);
      case FsOpKind::Link: {
        const uint64_t ino = PLY_TRY(resolve(p));
        (void)PLY_TRY(u->link(ino, PLY_TRY(resolve(parent_of(op.path2))), base_of(op.path2), kRoot));
        return ok();
      }
      case FsOpKind::Unlink:
        return u->unlink(PLY_TRY(resolve(parent_of(p))), base_of(p));
      case FsOpKind::Mkdir:
        (void)PLY_TRY(u->mkdir(PLY_TRY(resolve(parent_of(p))), base_of(p), 0755, kRoot));
        return ok();
      case FsOpKind::Rmdir:
        return u->rmdir(PLY_TRY(resolve(parent_of(p))), base_of(p));
      case FsOpKind::Setxattr:
        return u->setxattr(PLY_TRY(resolve(p)), "user.crash", pattern(op.arg, index), 0, kRoot);
      case FsOpKind::Fallocate:
        return u->fallocate(PLY_TRY(resolve(p)), 0, op.off, op.arg, kRoot);
      case FsOpKind::CopyUp:
        return u->open(PLY_TRY(resolve(p)), true, kRoot);
      case FsOpKind::Snapshot: {
        // An O(1) clone: the mount's stack does not change (snap.h).
        (void)PLY_TRY(snapshot(vol, PLY_TRY(snapshot_target(stack)), p));
        return ok();
      }
      case FsOpKind::Clone: {
        const int w = writable();
        if (w < 0) return Error::io(EROFS, "no writable branch");
        (void)PLY_TRY(clone_branch(vol, stack[w].tree, p, false));
        return ok();
      }
      case FsOpKind::Merge: {
        const int w = writable();
        if (w < 0) return Error::io(EROFS, "no writable branch");
        u.reset();  // the union holds the branches' instances; the merge takes the upper one
        auto m = merge(vol, stack[w].tree, fs[w].get());
        if (m) fs[w]->retire();  // its content was replaced: the next open serves it
        PLY_CHECK(close());
        if (m) PLY_CHECK(drop_doomed(vol));
        PLY_CHECK(open());
        if (!m) return m.error();
        return ok();
      }
      case FsOpKind::Rollback: {
        const int w = writable();
        if (w < 0) return Error::io(EROFS, "no writable branch");
        u.reset();
        auto r = rollback(vol, stack[w].tree);
        if (r) fs[w]->retire();
        PLY_CHECK(close());
        if (r) PLY_CHECK(drop_doomed(vol));
        PLY_CHECK(open());
        if (!r) return r.error();
        return ok();
      }
      case FsOpKind::AddBranch: {
        // As plyctl branch create: Filesystem::create leaves names to its caller.
        if (find_branch(vol, p)) return Error::io(EEXIST, "a branch named " + p + " exists");
        FsCreateOptions o;
        o.name = p;
        (void)PLY_TRY(Filesystem::create(vol, o));
        return ok();
      }
      case FsOpKind::DelBranch: {
        const BranchMeta b = PLY_TRY(find_branch(vol, p));
        PLY_CHECK(delete_branch(vol, b.tree));
        (void)PLY_TRY(drop_doomed(vol));
        return ok();
      }
      case FsOpKind::Fill: {
        uint64_t ino;
        if (auto r = resolve(p)) ino = *r;
        else ino = PLY_TRY(u->mknod(PLY_TRY(resolve(parent_of(p))), base_of(p), S_IFREG | 0644, 0, kRoot)).ino;
        for (uint64_t off = 0;; off += 65536) {
          auto r = u->write(ino, off, pattern(65536, index + off), kRoot);
          if (!r) return r.error();
        }
      }
      case FsOpKind::SplitRename: {
        // The planted bug: a rename that is two operations with a commit
        // between them, so a crash can show both names.
        const uint64_t ino = PLY_TRY(resolve(p));
        (void)PLY_TRY(u->link(ino, PLY_TRY(resolve(parent_of(op.path2))), base_of(op.path2), kRoot));
        (void)PLY_TRY(vol.commit());
        return u->unlink(PLY_TRY(resolve(parent_of(p))), base_of(p));
      }
      case FsOpKind::RenameBranch: {
        // As plyctl branch rename, and mkdir/rename in the control folder's
        // layers/: one generation; the mounted stack names trees, not names.
        const BranchMeta b = PLY_TRY(find_branch(vol, p));
        (void)PLY_TRY(rename_branch(vol, b.tree, op.path2));
        return ok();
      }
      case FsOpKind::Quota: {
        // As plyctl branch set --quota and plyctl hold/release: each one
        // generation, the feature bit (BRANCH_QUOTAS, HELD_BRANCHES) in it.
        const BranchMeta b = PLY_TRY(find_branch(vol, p));
        (void)PLY_TRY(set_quota(vol, b.tree, QuotaChange{op.arg, std::nullopt}));
        if (op.off) (void)PLY_TRY(set_held(vol, b.tree, op.off == 1));
        return ok();
      }
      case FsOpKind::Shrink:
        // Online, as the daemon's resize: the union and its filesystems
        // stay open while blocks move under them (format.md#relocation).
        (void)PLY_TRY(vol.resize(op.arg));
        return ok();
      case FsOpKind::Receive: {
        // As plyctl receive: the stream from a file descriptor, the branch
        // built doomed over its own generations and named in the last.
        const RecvStream& st = recv_stream(p);
        const int fd = memfd_create("stream", 0);
        if (fd < 0) return Error::sys(errno, "memfd_create");
        const bool put = ::write(fd, st.bytes.data(), st.bytes.size()) == ssize_t(st.bytes.size()) &&
                         lseek(fd, 0, SEEK_SET) == 0;
        auto r = put ? receive_branch(vol, fd, ReceiveOptions{}) : Result<Received>(Error::sys(errno, "memfd"));
        ::close(fd);
        if (!r) return r.error();
        return ok();
      }
      case FsOpKind::Commit:
        return ok();
    }
    return ok();
  }
};

std::map<uint8_t, ValueRefs> all_kinds() { return kinds(); }

VolumeOptions rw_options(PlantedBug bug = PlantedBug::None, bool discard = false) {
  VolumeOptions vo;
  vo.cache_bytes = 4 << 20;
  vo.kinds = all_kinds();
  vo.movers = movers();
  vo.planted_bug = bug;
  vo.discard = discard;
  return vo;
}

#define SETUP(expr)                                                                  \
  do {                                                                               \
    auto&& r_ = (expr);                                                              \
    if (!r_) {                                                                       \
      std::fprintf(stderr, "crash_tests: fs image setup: %s: %s\n", #expr,           \
                   r_.error().message().c_str());                                   \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

// The starting images, built once. "base": branch "main" (read-only in the
// view, the lower branch) holds files a, big (three blocks), dir/x, dir/y,
// the empty directory empty, and gone; branch "top", a layer on it
// (writable), holds up, the whiteout of gone, and odir, an opaque directory
// over the lower odir; the default view shows top over main. A third branch "spare" is in no
// view. "full": the same on a small device whose free space a file in main
// took up to ENOSPC. "zbase": "base" whose main also holds compressed data
// (chattr +c): z, 50 blocks and 100 bytes of text (frames of file blocks
// 0-31 and 32-49, the partial last block plain), and zdir, a directory whose
// flag new files inherit.
std::unique_ptr<MemDevice> build_image(const std::string& name) {
  const bool full = name == "full", zbase = name == "zbase";
  auto dev = std::make_unique<MemDevice>(full ? (5ull << 20) : (12ull << 20));
  FormatOptions fo;
  fo.uuid = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  fo.time_ns = 1;
  SETUP(format_filesystem(*dev, fo, FsCreateOptions{}));
  auto vol = Volume::open(*dev, rw_options());
  SETUP(vol);
  Volume& v = **vol;
  {
    auto tree = Filesystem::default_tree(v);
    SETUP(tree);
    auto fs = Filesystem::open(v, *tree);
    SETUP(fs);
    Filesystem& f = **fs;
    const uint64_t root = f.root();
    auto file = [&](uint64_t dir, const char* n, std::vector<std::byte> data) {
      auto a = f.mknod(dir, n, S_IFREG | 0644, 0, 0, 0);
      SETUP(a);
      SETUP(f.write(a->ino, 0, data));
    };
    file(root, "a", text("lower a"));
    file(root, "big", pattern(3 * 4096, 1));
    {
      // "frag": 150 one-block extents (every other block): their 8,400 bytes
      // of items fill three leaves or more, so that a copy-up or merge of it
      // grafts at least one whole leaf (format.md#btree-graft), not just the
      // items at the ends.
      // Preallocated but for a few written blocks: the checks that read
      // every file of every crash state then verify little data.
      auto a = f.mknod(root, "frag", S_IFREG | 0644, 0, 0, 0);
      SETUP(a);
      for (uint64_t i = 0; i < 150; i++)
        if (i % 50 == 0) SETUP(f.write(a->ino, 2 * i * 4096, pattern(4096, i)));
        else SETUP(f.fallocate(a->ino, 0, 2 * i * 4096, 4096));
    }
    auto d = f.mkdir(root, "dir", 0755, 0, 0);
    SETUP(d);
    file(d->ino, "x", text("lower x"));
    file(d->ino, "y", pattern(5000, 2));
    SETUP(f.mkdir(root, "empty", 0755, 0, 0));
    auto od = f.mkdir(root, "odir", 0755, 0, 0);
    SETUP(od);
    file(od->ino, "z", text("hidden by the opaque odir"));
    file(root, "gone", text("whited out"));
    if (zbase) {
      auto z = f.mknod(root, "z", S_IFREG | 0644, 0, 0, 0);
      SETUP(z);
      SETUP(f.set_fsflags(z->ino, FS_COMPR_FL));
      SETUP(f.write(z->ino, 0, words(50 * 4096 + 100, 1)));
      auto zd = f.mkdir(root, "zdir", 0755, 0, 0);
      SETUP(zd);
      SETUP(f.set_fsflags(zd->ino, FS_COMPR_FL));
    }
    SETUP(f.release_all());
  }
  FsCreateOptions spare;
  spare.name = "spare";
  SETUP(Filesystem::create(v, spare));
  auto main_tree = Filesystem::default_tree(v);
  SETUP(main_tree);
  // A layer "top" on main, mounted over it by a default view: the union's
  // whiteouts and copy-ups go there.
  auto top = create_layer(v, "top", *main_tree, false);
  SETUP(top);
  SETUP(put_view(v, View{"default", true, {{top->tree, true}, {*main_tree, false}}}));
  {
    Mount m(v);
    SETUP(m.open());
    const uint64_t root = m.u->root();
    SETUP(m.u->unlink(root, "gone"));
    auto od = m.resolve("odir");
    SETUP(od);
    SETUP(m.u->unlink(*od, "z"));
    SETUP(m.u->rmdir(root, "odir"));
    SETUP(m.u->mkdir(root, "odir", 0755, kRoot));
    auto up = m.u->mknod(root, "up", S_IFREG | 0644, 0, kRoot);
    SETUP(up);
    SETUP(m.u->write(up->ino, 0, text("upper data"), kRoot));
    if (full) {
      auto fill = m.u->mknod(root, "fill", S_IFREG | 0644, 0, kRoot);
      SETUP(fill);
      for (uint64_t off = 0;; off += 65536)
        if (auto r = m.u->write(fill->ino, off, pattern(65536, off), kRoot); !r) {
          if (r.error().code != ENOSPC) SETUP(r);
          break;
        }
    }
    SETUP(m.close());
  }
  SETUP(v.close());
  return dev;
}

const MemDevice& image(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<MemDevice>> cache;
  std::lock_guard lk(mu);
  auto& d = cache[name];
  if (!d) d = build_image(name);
  return *d;
}

Result<Items> received_items(Volume& v, TreeId tree) { return test::received_items(v, tree); }

std::map<std::string, RecvStream> build_streams() {
  auto dev = image("base").clone();
  auto vol = Volume::open(*dev, rw_options());
  SETUP(vol);
  Volume& v = **vol;
  auto main_tree = Filesystem::default_tree(v);
  SETUP(main_tree);
  uint64_t four = 0;
  {
    auto fs = Filesystem::open(v, *main_tree);
    SETUP(fs);
    Filesystem& f = **fs;
    const uint64_t root = f.root();
    auto file = [&](uint64_t dir, const char* n) {
      auto a = f.mknod(dir, n, S_IFREG | 0644, 0, 0, 0);
      SETUP(a);
      return a->ino;
    };
    auto d = f.mkdir(root, "rd", 0755, 0, 0);
    SETUP(d);
    four = file(d->ino, "four");
    SETUP(f.write(four, 0, pattern(4 * 4096, 41)));
    const uint64_t holes = file(root, "holes");
    SETUP(f.write(holes, 0, pattern(3000, 42)));
    SETUP(f.write(holes, 3 * 4096, pattern(4096, 43)));  // blocks 1-2 a hole
    SETUP(f.fallocate(holes, FALLOC_FL_KEEP_SIZE, 5 * 4096, 2 * 4096));
    SETUP(f.link(holes, d->ino, "hard"));
    SETUP(f.setxattr(holes, "user.r", pattern(30, 44), 0));
    SETUP(f.setxattr(d->ino, "user.big", pattern(5000, 45), 0));  // out of line
    const uint64_t z = file(root, "rz");
    SETUP(f.set_fsflags(z, FS_COMPR_FL));
    SETUP(f.write(z, 0, words(10 * 4096 + 7, 46)));
    SETUP(f.release_all());
  }
  auto r1 = snapshot(v, *main_tree, "r1");
  SETUP(r1);
  {
    auto fs = Filesystem::open(v, *main_tree);
    SETUP(fs);
    Filesystem& f = **fs;
    const uint64_t root = f.root();
    SETUP(f.write(four, 4096 + 5, pattern(200, 47)));  // splits four's extent: shared from r1
    auto c = f.mknod(root, "rcopy", S_IFREG | 0644, 0, 0, 0);
    SETUP(c);
    // A reflink: block 1 shared in the stream, the rest from r1's four
    // (SHARED sources 0 and 2).
    SETUP(f.copy_range(four, 0, c->ino, 0, 4 * 4096));
    // A compressed file r1 holds, copied whole: its frames shared from r1
    // (source 2), none sent.
    auto zl = f.lookup(root, "rz");
    SETUP(zl);
    auto zc = f.mknod(root, "rzcopy", S_IFREG | 0644, 0, 0, 0);
    SETUP(zc);
    SETUP(f.copy_range(zl->ino, 0, zc->ino, 0, 10 * 4096 + 7));
    SETUP(f.unlink(root, "a"));
    SETUP(f.release_all());
  }
  auto r2 = snapshot(v, *main_tree, "r2");
  SETUP(r2);
  SETUP(v.commit());
  auto send = [&](const BranchMeta& b, std::optional<TreeId> parent) {
    RecvStream s;
    s.branch = b.name;
    SendOptions so;
    so.parent = parent;
    const int fd = memfd_create("stream", 0);
    if (fd < 0) std::abort();
    auto sent = send_branch(v, b.tree, fd, so);
    SETUP(sent);
    // The incremental one refers to data r1 holds elsewhere (rcopy, rzcopy).
    if (parent && sent->shared_elsewhere < 2) {
      std::fprintf(stderr, "crash_tests: the incremental stream shares %llu items from elsewhere in r1\n",
                   (unsigned long long)sent->shared_elsewhere);
      std::abort();
    }
    const off_t n = lseek(fd, 0, SEEK_END);
    s.bytes.resize(size_t(n));
    if (pread(fd, s.bytes.data(), s.bytes.size(), 0) != ssize_t(n)) std::abort();
    ::close(fd);
    auto items = received_items(v, b.tree);
    SETUP(items);
    s.items = std::move(*items);
    return s;
  };
  std::map<std::string, RecvStream> out;
  out["full"] = send(r1->frozen, std::nullopt);
  out["incremental"] = send(r2->frozen, r1->frozen.tree);
  return out;
}

// "prefix" + n (GCC 12 warns wrongly about "literal" + std::to_string at -O2).
std::string numbered(const char* prefix, uint64_t n) {
  char b[64];
  std::snprintf(b, sizeof b, "%s%llu", prefix, (unsigned long long)n);
  return b;
}

bool clean_error(int code) { return code != EIO && code != EROFS && code != EUCLEAN && code != EFAULT; }

// A digest of file content for the listings compared per crash state: XXH3,
// whose speed matters here (every state reads every file).
uint64_t digest(std::span<const std::byte> b) { return xxh3(b); }

}  // namespace

std::string FsOp::str() const {
  static const char* names[] = {"create",   "write",    "truncate", "rename",  "link",
                                "unlink",   "mkdir",    "rmdir",    "setxattr", "fallocate",
                                "copy-up",  "snapshot", "clone",    "merge",   "rollback",
                                "add-branch", "delete-branch", "fill", "commit", "split-rename",
                                "rename-branch", "quota", "shrink", "chattr",
                                "write-text", "copy-range", "receive"};
  std::string s = names[int(kind)];
  if (!path.empty()) s += " " + path;
  if (!path2.empty()) s += " " + path2;
  if (off || arg) s += " " + std::to_string(off) + "+" + std::to_string(arg);
  return s;
}

Result<std::string> list_view(Volume& v) {
  auto o = PLY_TRY(open_union(v, PLY_TRY(default_stack(v)), true));
  Union& u = *o.u;
  std::string out;
  std::function<Result<void>(uint64_t, const std::string&)> walk =
      [&](uint64_t dir, const std::string& prefix) -> Result<void> {
    std::vector<std::string> names;
    PLY_CHECK(u.readdir(dir, 0, [&](const DirEntry& e) {
      if (e.name != "." && e.name != "..") names.emplace_back(e.name);
      return true;
    }));
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
      const Attr a = PLY_TRY(u.lookup(dir, n));
      const std::string path = prefix + "/" + n;
      char line[160];
      std::snprintf(line, sizeof line, " %o %llu %u", a.mode, (unsigned long long)a.size, a.nlink);
      out += path + line;
      if (S_ISREG(a.mode)) {
        std::vector<std::byte> buf(a.size);
        const size_t got = PLY_TRY(u.read(a.ino, 0, buf));
        if (got != a.size) return Error::io(EIO, path + ": short read");
        out += " data " + std::to_string(digest(buf));
      } else if (S_ISLNK(a.mode)) {
        out += " -> " + PLY_TRY(u.readlink(a.ino));
      }
      for (const auto& x : PLY_TRY(u.listxattr(a.ino)))
        out += " " + x + "=" + std::to_string(digest(PLY_TRY(u.getxattr(a.ino, x))));
      out += "\n";
      if (S_ISDIR(a.mode)) PLY_CHECK(walk(a.ino, path));
    }
    return ok();
  };
  PLY_CHECK(walk(u.root(), ""));
  return out;
}

const RecvStream& recv_stream(const std::string& name) {
  static const std::map<std::string, RecvStream> streams = build_streams();
  auto it = streams.find(name);
  if (it == streams.end()) {
    std::fprintf(stderr, "crash_tests: no stream named %s\n", name.c_str());
    std::abort();
  }
  return it->second;
}

std::string check_received(Volume& v, const RecvStream& s) {
  auto b = Filesystem::find(v, s.branch);
  if (!b) return "cannot look up branch " + s.branch + ": " + b.error().message();
  if (!*b) return "";  // none of it (a doomed tree is no branch; the next read-write open drops it)
  auto got = received_items(v, (*b)->tree);
  if (!got) return "cannot read branch " + s.branch + ": " + got.error().message();
  if (*got == s.items) return "";
  for (auto i = s.items.cbegin(), j = std::as_const(*got).begin();; ++i, ++j) {
    if (i == s.items.end() || j == got->end() || i->first != j->first || i->second != j->second) {
      const Key k = i != s.items.end() ? i->first : j->first;
      return "branch " + s.branch + " (" + std::to_string(got->size()) + " items, its source " +
             std::to_string(s.items.size()) + ") differs from its source at item " + std::to_string(k.hi) + "/" +
             std::to_string(k.lo);
    }
  }
}

namespace {

// The device a fault run's volume sees: the recorder through the fault
// device while armed (the workload's operations and commits), the recorder
// alone otherwise (the open, the harness's listings and dumps), so that the
// k-th call counts only the workload's own.
class GateDevice final : public BlockDevice {
 public:
  GateDevice(BlockDevice& plain, BlockDevice* faulty) : plain_(plain), faulty_(faulty) {}
  bool armed = false;
  Result<void> read(uint64_t o, std::span<std::byte> out) override { return dev().read(o, out); }
  Result<void> write(uint64_t o, std::span<const std::byte> in) override { return dev().write(o, in); }
  Result<void> flush() override { return dev().flush(); }
  Result<void> discard(uint64_t o, uint64_t n) override { return dev().discard(o, n); }
  uint64_t size_bytes() const override { return plain_.size_bytes(); }
  uint32_t logical_sector_size() const override { return plain_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return plain_.physical_sector_size(); }

 private:
  BlockDevice& dev() { return armed && faulty_ ? *faulty_ : plain_; }
  BlockDevice& plain_;
  BlockDevice* faulty_;
};

// Arms the gate for one scope.
struct Armed {
  explicit Armed(GateDevice& g) : gate(g) { gate.armed = true; }
  ~Armed() { gate.armed = false; }
  GateDevice& gate;
};

bool fault_code(int code) { return code == EIO || code == ENOSPC || code == EROFS; }

// plyfs -o compress-force=zstd:1: every write of two whole blocks or more
// of a frame is compressed (when that saves a block), whatever the data.
void mount_compression(Volume& v, bool on) {
  if (on) v.extension<MountCompression>().set(Compression{Compression::Mode::Zstd, 1, /*force*/ true});
}

// Counts the compressed extent items of the filesystem trees of `m`, and
// those that map only part of their frame.
void count_compressed(const Model& m, size_t& items, size_t& partial) {
  for (const auto& [id, its] : m.trees) {
    if (auto k = m.kind.find(id); k == m.kind.end() || k->second != disk::kKindFs) continue;
    for (const auto& [key, v] : its) {
      if (fsitems::type_of(key) != disk::ItemType::Extent) continue;
      auto e = fsitems::decode_extent(key, v);
      if (!e || !e->compressed()) continue;
      items++;
      if (e->offset || e->nblocks < e->ram_blocks) partial++;
    }
  }
}

// The first line where two listings differ, for a failure message.
std::string first_difference(const std::string& want, const std::string& got) {
  size_t a = 0, b = 0;
  while (a < want.size() || b < got.size()) {
    auto line = [](const std::string& s, size_t at, size_t& end) {
      if (at >= s.size()) return end = s.size(), std::string_view();
      end = std::min(s.find('\n', at), s.size());
      return std::string_view(s.data() + at, end - at);
    };
    size_t ea, eb;
    const std::string_view la = line(want, a, ea), lb = line(got, b, eb);
    if (la != lb)
      return "want \"" + std::string(la) + "\", got \"" + std::string(lb) + "\"";
    a = ea + 1, b = eb + 1;
  }
  return "no difference";
}

}  // namespace

FsRun record_fs(const FsWorkload& w, const FaultDevice::Rule* fault) {
  FsRun fr;
  Run& run = fr.run;
  auto dev = image(w.image.empty() ? "base" : w.image).clone();
  run.log.base = dev->clone();
  run.log.sector = dev->logical_sector_size();
  run.log.block_size = 4096;
  if (auto ch = read_superblocks(*dev)) run.base_gen = ch->info.generation.v;
  RecordingDevice rec(*dev);
  std::unique_ptr<FaultDevice> faulty;
  if (fault) {
    faulty = std::make_unique<FaultDevice>(rec);
    faulty->add(*fault);
  }
  GateDevice gate(rec, faulty.get());
  // An error the injected fault explains: it fired, and the error is clean.
  auto from_fault = [&](int code) { return faulty && faulty->fired() && fault_code(code); };
  auto vol = Volume::open(gate, rw_options(w.bug, w.discard));
  auto finish = [&] {
    run.log.entries = rec.log();
    run.log.index();
  };
  if (!vol) {
    run.error = "open: " + vol.error().message();
    finish();
    return fr;
  }
  Volume& v = **vol;
  mount_compression(v, w.compress);
  run.base_gen = v.durable_generation().v;
  {
    auto m0 = dump(v);
    if (!m0) run.error = "dump: " + m0.error().message();
    else run.model_at[run.base_gen] = *m0;
  }
  Mount m(v);
  if (auto r = m.open(); !r) run.error = "mount: " + r.error().message();
  for (size_t i = 0; i < w.ops.size() && run.error.empty(); i++) {
    const FsOp& op = w.ops[i];
    const uint64_t durable = v.durable_generation().v;
    auto before = list_view(v);
    if (!before) {
      run.error = "list before " + op.str() + ": " + before.error().message();
      break;
    }
    fr.view_before.push_back(*before);
    if (i == 0) fr.view_at[run.base_gen] = *before;
    rec.mark("op-begin", i);
    auto r = [&] {
      Armed a(gate);
      return m.run(i, op);
    }();
    rec.mark("op-end", i);
    fr.results.push_back(r ? "ok" : r.error().message());
    bool stop = false;
    uint64_t acked = 0;
    if (!r) {
      if (from_fault(r.error().code)) {
        if (fr.fault_error.empty()) fr.fault_error = op.str() + ": " + r.error().message();
        fr.fault_ops++;
      } else if (!clean_error(r.error().code) || v.failure()) {
        run.error = op.str() + ": " + r.error().message();
        run.error_code = r.error().code;
      }
      fr.failed_ops++;
    }
    if (op.kind == FsOpKind::Commit && run.error.empty() && !v.failure()) {
      uint64_t predumped = 0;  // the generation dumped before the commit (fault runs)
      if (faulty) {
        // The model of the generation this commit tries to write: after a
        // failed flush it may be durable anyway (D4).
        auto d = dump(v);
        if (!d) {
          run.error = "dump: " + d.error().message();
          break;
        }
        predumped = v.open_generation().v;
        run.model_at[predumped] = std::move(*d);
        auto l = list_view(v);
        if (!l) {
          run.error = "list before commit: " + l.error().message();
          break;
        }
        fr.view_at[predumped] = std::move(*l);
      }
      auto g = [&] {
        Armed a(gate);
        return v.commit();
      }();
      if (!g && from_fault(g.error().code)) {
        // A failed commit: the volume must be read-only now (C5).
        if (fr.fault_error.empty()) fr.fault_error = "commit: " + g.error().message();
        fr.fault_ops++;
        fr.failed_ops++;
        if (!v.failure()) run.failed_writable = true;
        stop = true;
      } else if (!g) {
        run.error = "commit: " + g.error().message();
        run.error_code = g.error().code;
        break;
      } else {
        acked = g->v;
        // A commit with nothing to write (after an operation that committed
        // its own work, as a receive does) writes no generation: the one
        // dumped for it is the next operation's, which may write it inside
        // itself (an inner generation, its content from the log).
        if (predumped && acked != predumped) {
          run.model_at.erase(predumped);
          fr.view_at.erase(predumped);
        }
      }
    }
    if (acked) {
      auto d = dump(v);
      if (!d) {
        run.error = "dump: " + d.error().message();
        break;
      }
      run.model_at[acked] = std::move(*d);
      run.acked.push_back(acked);
      rec.mark("ack", acked);
    }
    auto after = list_view(v);
    if (!after && run.error.empty() && !(faulty && faulty->fired() && v.failure()))
      run.error = "list after " + op.str() + ": " + after.error().message();
    fr.view_after.push_back(after ? *after : "");
    if (acked && after) fr.view_at[acked] = *after;
    // Generations the volume wrote inside the operation (not the one the
    // driver's commit acknowledged).
    for (uint64_t g = durable + 1; g <= v.durable_generation().v; g++)
      if (!run.model_at.count(g)) fr.inner_gen[g] = i;
    // A failed commit or a failed volume ends a fault run: the power goes out.
    if (stop || v.failure()) break;
  }
  (void)m.close();
  if (faulty) run.fault_fired = faulty->fired() > 0;
  vol->reset();  // the power goes out
  finish();
  for (const auto& [g, model] : run.model_at) count_compressed(model, fr.compressed_items, fr.partial_frames);
  if (w.expect_compressed && !fault && run.error.empty() && fr.compressed_items == 0)
    run.error = "no committed generation holds a compressed extent: the workload tests no compression";
  // A commit inside an operation that the fault made fail may have written
  // its superblock (and, after a failed flush, be durable anyway: D4): it
  // belongs to the last operation, and its content comes from the log.
  if (faulty && !fr.view_after.empty())
    for (const auto& s : run.log.supers)
      if (s.gen > run.base_gen && !run.model_at.count(s.gen) && !fr.inner_gen.count(s.gen))
        fr.inner_gen[s.gen] = fr.view_after.size() - 1;
  // Inner generations: their content is what the log holds when they
  // became durable (the flush after their superblock).
  for (const auto& [g, i] : fr.inner_gen) {
    for (const auto& s : run.log.supers) {
      if (s.gen != g) continue;
      auto f = std::upper_bound(run.log.flushes.begin(), run.log.flushes.end(), s.pos);
      if (f == run.log.flushes.end() && !faulty) break;
      Spec spec{f == run.log.flushes.end() ? 0 : *f + 1, {}, std::nullopt, Lost::Old, "ref"};
      if (f == run.log.flushes.end()) {  // no flush after it: every write since the last one landed
        spec.crash_at = run.log.entries.size();
        const long last = run.log.last_flush_before(spec.crash_at);
        for (size_t p : run.log.writes)
          if (long(p) > last) spec.kept.push_back(p);
      }
      StateDevice sd(run.log, spec, 0);
      VolumeOptions ro;
      ro.read_only = true;
      ro.kinds = all_kinds();
      auto rv = Volume::open(sd, ro);
      auto d = rv ? dump(**rv) : Result<Model>(rv.error());
      if (!d) {
        if (run.error.empty()) run.error = "generation " + std::to_string(g) + " unreadable: " + d.error().message();
      } else {
        run.model_at[g] = std::move(*d);
      }
      break;
    }
  }
  return fr;
}

std::string check_fs_state(const FsWorkload& w, const FsRun& r, const Spec& spec, bool write_check,
                           FsOracleCache& cache) {
  // Opens, generation bounds, exact content, recovery writes nothing, fsck -n.
  if (auto err = check_state(r.run, spec, false, w.bug); !err.empty()) return err;
  StateDevice dev(r.run.log, spec, std::hash<std::string>{}(spec.id()));
  VolumeOptions ro;
  ro.read_only = true;
  ro.kinds = all_kinds();
  ro.cache_bytes = 2 << 20;
  uint64_t gen;
  {
    auto vol = Volume::open(dev, ro);
    if (!vol) return "UNMOUNTABLE: " + vol.error().message();
    gen = (*vol)->durable_generation().v;
    auto hit = cache.by_gen.find(gen);
    if (hit == cache.by_gen.end()) {
      std::string err;
      for (const auto& p : check_filesystems(**vol)) {
        err = "FS_CHECK at generation " + std::to_string(gen) + ": " + p.code + ": " + p.message;
        break;
      }
      if (err.empty())
        for (const auto& p : check_views(**vol)) {
          err = "VIEW_CHECK at generation " + std::to_string(gen) + ": " + p.code + ": " + p.message;
          break;
        }
      for (const auto& op : w.ops)
        if (err.empty() && op.kind == FsOpKind::Receive)
          if (auto e = check_received(**vol, recv_stream(op.path)); !e.empty())
            err = "RECEIVED at generation " + std::to_string(gen) + ": " + e;
      if (err.empty()) {
        auto l = list_view(**vol);
        if (!l) {
          err = "VIEW_UNLISTABLE at generation " + std::to_string(gen) + ": " + l.error().message();
        } else if (auto at = r.view_at.find(gen); at != r.view_at.end() && *l != at->second) {
          // Every name, attribute and byte (compressed or not, through the
          // frame decoder) as the workload saw it when the commit returned.
          err = "CONTENT: generation " + std::to_string(gen) + " lists other files or bytes than it held " +
                "when committed: " + first_difference(at->second, *l);
        } else if (auto in = r.inner_gen.find(gen); in != r.inner_gen.end()) {
          // A generation written inside operation i shows the view from
          // before it or after it, never a mixture.
          const size_t i = in->second;
          if (*l != r.view_before[i] && *l != r.view_after[i])
            err = "NOT_ATOMIC: generation " + std::to_string(gen) + ", written inside " +
                  w.ops[i].str() + ", shows a view that is neither before nor after it:\n" + *l +
                  "before:\n" + r.view_before[i] + "after:\n" + r.view_after[i];
        }
      }
      hit = cache.by_gen.emplace(gen, err).first;
    }
    if (!hit->second.empty()) return hit->second;
  }
  if (dev.overlay_writes()) return "RECOVERY_WROTE: the filesystem checks wrote to the image (C6)";
  if (!write_check) return "";

  // The write checks: a read-write open (which drops what an unfinished
  // merge left), new files, a directory, a rename and a commit through the
  // union; fsck and the object checks are clean after it.
  // A superblock copy torn into unreadable sectors needs fsck -y first (as
  // fsck_after_crash did on its own device).
  if (spec.tear && spec.lost == Lost::Unreadable)
    if (auto err = fsck_after_crash(dev); !err.empty()) return err;
  {
    auto vol = Volume::open(dev, rw_options());
    if (!vol) return "WRITE_CHECK: reopen read-write: " + vol.error().message();
    if (auto d = drop_doomed(**vol); !d) return "WRITE_CHECK: drop_doomed: " + d.error().message();
    mount_compression(**vol, w.compress);
    Mount m(**vol);
    if (auto o = m.open(); !o) return "WRITE_CHECK: mount: " + o.error().message();
    const FsOp ops[] = {
        {FsOpKind::Mkdir, "wc-dir"},
        {FsOpKind::Create, "wc-dir/f"},
        {FsOpKind::Write, "wc-dir/f", "", 0, 9000},
        {FsOpKind::Create, "wc-small"},
        {FsOpKind::Write, "wc-small", "", 0, 30},
        {FsOpKind::Rename, "wc-small", "wc-dir/g"},
    };
    // Near a full device, ENOSPC is a clean answer; the volume stays writable.
    for (const auto& op : ops)
      if (auto x = m.run(99, op); !x) {
        if (x.error().code != ENOSPC || (*vol)->failure())
          return "WRITE_CHECK: " + op.str() + ": " + x.error().message();
        break;
      }
    if (auto c = m.close(); !c) return "WRITE_CHECK: release: " + c.error().message();
    if (auto c = (*vol)->close(); !c) return "WRITE_CHECK: commit: " + c.error().message();
  }
  FsckOptions fo;
  fo.kinds = all_kinds();
  auto f2 = fsck_run(dev, fo);
  if (!f2 || f2->errors()) return "WRITE_CHECK: fsck after new work reports errors";
  for (const auto& p : check_filesystems(dev))
    return "WRITE_CHECK: object check after new work: " + p.code + ": " + p.message;
  return "";
}

// The instances: each operation once per argument class, on the base image.
std::vector<FsOp> fs_instances() {
  using K = FsOpKind;
  return {
      {K::Create, "new"},                      //  0 a new file in the upper branch
      {K::Write, "up", "", 0, 40},             //  1 inline-small write of an upper file
      {K::Write, "up", "", 4096, 9000},        //  2 extent-sized write (blocks allocated)
      {K::Write, "dir/x", "", 2, 6000},        //  3 write of a lower file: copy-up, then write
      {K::Truncate, "big", "", 0, 5000},       //  4 truncate a lower file (copy-up, shorter)
      {K::Rename, "up", "up2"},                //  5 rename inside the upper branch
      {K::Rename, "up", "gone"},               //  6 rename over a whiteout
      {K::Rename, "dir/y", "y2"},              //  7 rename a lower file: copy-up + whiteout
      {K::Link, "up", "dir/l"},                //  8 link into a lower directory
      {K::Unlink, "a"},                        //  9 unlink a lower file: a whiteout
      {K::Unlink, "up"},                       // 10 unlink an upper file
      {K::Mkdir, "nd"},                        // 11 a new directory
      {K::Mkdir, "gone"},                      // 12 mkdir over a whiteout: opaque
      {K::Rmdir, "empty"},                     // 13 rmdir of a lower directory: a whiteout
      {K::Rmdir, "odir"},                      // 14 rmdir of an opaque directory
      {K::Setxattr, "dir/x", "", 0, 100},      // 15 setxattr on a lower file (copy-up)
      {K::Fallocate, "up", "", 0, 20000},      // 16 fallocate
      {K::CopyUp, "big"},                      // 17 copy-up alone (open for writing)
      {K::Snapshot, "snap1"},                  // 18 snapshot of the writable layer (a clone)
      {K::Clone, "c1"},                        // 19 clone of the writable branch
      {K::Merge},                              // 20 merge top into main
      {K::Rollback},                           // 21 rollback top (empty: no snapshot)
      {K::AddBranch, "b2"},                    // 22 a new branch
      {K::DelBranch, "spare"},                 // 23 delete a branch
      {K::Setxattr, "up", "", 0, 65536},       // 24 a 64 KiB xattr: out of line, its chunks and
                                               //    the LARGE_XATTR bit in one generation
      {K::RenameBranch, "top", "live"},        // 25 rename the mounted writable branch
      {K::CopyUp, "frag"},                     // 26 copy-up grafting whole leaves
      {K::Write, "frag", "", 200 * 4096 + 7, 9000},  // 27 copy-up, then a write that copies
                                               //    a shared leaf
      {K::Quota, "top", "", 0, 64 << 20},      // 28 a quota on the mounted writable branch
                                               //    (BRANCH_QUOTAS with it); later writes charge it
  };
}

std::vector<FsWorkload> fs_ace(size_t length, uint64_t seed, size_t sample) {
  const auto inst = fs_instances();
  const size_t n = inst.size();
  std::vector<FsWorkload> out;
  auto make = [&](const std::vector<size_t>& ops, const std::vector<bool>& persist) {
    FsWorkload w;
    w.id = "fs-ace" + std::to_string(length) + "/";
    w.image = "base";
    for (size_t i = 0; i < ops.size(); i++) {
      if (i) w.id += '.';
      w.id += std::to_string(ops[i]);
      if (persist[i]) w.id += 'c';
      w.ops.push_back(inst[ops[i]]);
      if (persist[i]) w.ops.push_back(FsOp{FsOpKind::Commit});
    }
    out.push_back(std::move(w));
  };
  if (length == 1) {
    for (size_t a = 0; a < n; a++) make({a}, {true});
    return out;
  }
  std::mt19937_64 rng(seed);
  std::set<std::string> seen;
  for (size_t tries = 0; out.size() < sample && tries < sample * 20; tries++) {
    std::vector<size_t> ops(length);
    std::vector<bool> persist(length);
    for (size_t i = 0; i < length; i++) ops[i] = rng() % n, persist[i] = rng() & 1;
    persist.back() = true;
    std::string key;
    for (size_t i = 0; i < length; i++) key += std::to_string(ops[i]) + (persist[i] ? "c." : ".");
    if (seen.insert(key).second) make(ops, persist);
  }
  return out;
}

std::vector<FsWorkload> fs_scenarios() {
  using K = FsOpKind;
  std::vector<FsWorkload> out;
  {  // A full device: a write fails with ENOSPC, cleanly; freeing makes room.
    FsWorkload w;
    w.id = "fs-scenario/enospc-write";
    w.image = "full";
    w.ops = {{K::Create, "more"},   {K::Write, "more", "", 0, 256 << 10}, {K::Commit},
             {K::Unlink, "fill"},   {K::Commit},
             {K::Write, "more", "", 0, 64 << 10}, {K::Commit}};
    out.push_back(w);
  }
  {  // A quota: a write past it is refused (EDQUOT) with nothing changed,
     // removing makes room; a hold and a release beside it.
    FsWorkload w;
    w.id = "fs-scenario/quota";
    w.image = "base";
    w.ops = {{K::Create, "q"},         {K::Write, "q", "", 0, 64 << 10},   {K::Quota, "top", "", 1, 200 << 10},
             {K::Commit},              {K::Write, "q", "", 64 << 10, 256 << 10}, {K::Commit},
             {K::Unlink, "q"},         {K::Create, "q2"},                  {K::Write, "q2", "", 0, 96 << 10},
             {K::Quota, "top", "", 2, 0}, {K::Commit}};
    out.push_back(w);
  }
  {  // A shrink of the mounted image (format.md#relocation): files written
     // past where it will end, a snapshot sharing them, the first ones
     // deleted; the blocks past the end move over several generations, each
     // crash state shows the files whole; work goes on after.
    FsWorkload w;
    w.id = "fs-scenario/shrink";
    w.image = "base";
    w.ops = {{K::Create, "s1"}, {K::Write, "s1", "", 0, 5 << 19}, {K::Create, "s2"},
             {K::Write, "s2", "", 0, 512 << 10}, {K::Create, "s3"}, {K::Write, "s3", "", 0, 320 << 10},
             {K::Commit},       {K::Unlink, "s1"}, {K::Snapshot, "snap1"},
             {K::Commit},       {K::Shrink, "", "", 0, 7 << 19},
             {K::Write, "s2", "", 4096, 64 << 10}, {K::Commit}};
    out.push_back(w);
  }
  {  // Branch operations on a full device: refused cleanly or done.
    FsWorkload w;
    w.id = "fs-scenario/enospc-branches";
    w.image = "full";
    w.ops = {{K::Fill, "fill2"}, {K::Snapshot, "snap1"}, {K::Commit},
             {K::Merge}, {K::Commit},
             {K::Clone, "c1"}, {K::Write, "dir/y", "", 0, 64 << 10}, {K::Commit},
             {K::DelBranch, "c1"}, {K::Unlink, "fill"}, {K::Commit},
             {K::Write, "dir/y", "", 0, 64 << 10}, {K::Commit}};
    out.push_back(w);
  }
  {  // Enough changes in one generation that begin() commits on its own
     // (the change budget): generations written inside operations.
    FsWorkload w;
    w.id = "fs-scenario/change-budget";
    w.image = "base";
    for (int i = 0; i < 300; i++) {
      const std::string n = numbered("dir/m", i);
      w.ops.push_back({K::Create, n});
      w.ops.push_back({K::Write, n, "", 0, uint64_t(4000 + i % 7)});
    }
    for (int i = 0; i < 300; i += 2) {
      w.ops.push_back({K::Unlink, numbered("dir/m", i)});
      if (i % 10 == 0) w.ops.push_back({K::Rename, numbered("dir/m", i + 1), numbered("r", i)});
    }
    w.ops.push_back({K::Commit});
    out.push_back(w);
  }
  {  // Send streams received (fs/send.h, S1): a full one, then an
     // incremental one against the branch it made, each built doomed over
     // its own generations and named in one final commit; a file written
     // between them. Every crash state holds none of each received branch
     // or all of it, equal to its source (check_received), and a read-write
     // open drops what an unfinished receive left.
    FsWorkload w;
    w.id = "fs-scenario/receive";
    w.image = "base";
    w.ops = {{K::Receive, "full"},  {K::Commit}, {K::Create, "after"}, {K::Write, "after", "", 0, 6000},
             {K::Receive, "incremental"}, {K::Commit}};
    out.push_back(w);
  }
  for (auto& w : fs_compress_scenarios()) out.push_back(std::move(w));
  return out;
}

std::vector<FsWorkload> fs_compress_scenarios() {
  using K = FsOpKind;
  std::vector<FsWorkload> out;
  {  // Compressed data by file and directory flags (chattr +c) on "zbase":
     // a lower compressed file copied up (its items, frames shared) and
     // overwritten inside a frame, truncated inside one; a new frame in a
     // new file of a +c directory, a smaller one rewritten in its middle;
     // frames shared with a plain file (copy_range, aligned) and decoded
     // into one (unaligned), plain blocks shared into a +c file; the last
     // name of shared frames unlinked. Every crash state lists every file's
     // bytes as at its generation's commit (view_at).
    FsWorkload w;
    w.id = "fs-scenario/compress";
    w.image = "zbase";
    w.expect_compressed = true;
    w.ops = {{K::Write, "z", "", 5 * 4096 + 100, 3000},    // copy-up, then blocks 5-6 of frame 0 plain
             {K::Commit},
             {K::Truncate, "z", "", 0, 40 * 4096 + 123},    // inside frame 1: its item maps 32-39
             {K::Create, "zdir/n"},                        // zdir copied up with +c; n inherits it
             {K::WriteText, "zdir/n", "", 0, 96 << 10},     // a 24-block frame
             {K::Commit},
             {K::WriteText, "zdir/n", "", 8192, 16 << 10},  // blocks 2-5: a frame inside the frame
             {K::Create, "c"},
             {K::CopyRange, "z", "c", 0, 64 << 10},         // c shares parts of z's frames
             {K::CopyRange, "zdir/n", "up", 100, 40000},    // decoded, written plain
             {K::CopyRange, "big", "zdir/n", 0, 3 * 4096},  // plain blocks shared into a +c file
             {K::Chattr, "dir/y", "", 0, FS_COMPR_FL},      // copy-up, +c in the same generation
             {K::WriteText, "dir/y", "", 4096, 48 << 10},   // then a frame over its plain blocks
             {K::Commit},
             {K::Truncate, "zdir/n", "", 0, 3 * 4096 + 5},  // cuts the inner frame
             {K::Unlink, "z"},                             // c keeps the frames
             {K::Commit}};
    out.push_back(w);
  }
  {  // The mount's compress-force on "base": plain lower files, byte
     // patterns; a partial overwrite inside a frame (one whole block: plain)
     // and a smaller frame written inside another; a copied-up plain file
     // overwritten with compressed data; truncation inside a frame; frames
     // shared into an inline file (copy_range).
    FsWorkload w;
    w.id = "fs-scenario/compress-force";
    w.image = "base";
    w.compress = true;
    w.expect_compressed = true;
    w.ops = {{K::Create, "f"},
             {K::Write, "f", "", 0, 200 << 10},             // frames 0-31, 32-49
             {K::Commit},
             {K::Write, "f", "", 10 * 4096 + 5, 8192},       // one whole block: plain in frame 0
             {K::Write, "f", "", 33 * 4096, 4 * 4096},       // a 4-block frame inside frame 1
             {K::Write, "big", "", 4096, 64 << 10},          // copy-up, then a frame over plain blocks
             {K::Commit},
             {K::Truncate, "f", "", 0, 20 * 4096 + 7},
             {K::CopyRange, "f", "up", 0, 16 << 10},         // shared into the inline "up"
             {K::Create, "m"},
             {K::Chattr, "m", "", 0, FS_NOCOMP_FL},          // +m: never compressed, whatever the mount
             {K::Write, "m", "", 0, 64 << 10},
             {K::Commit},
             {K::Unlink, "f"},
             {K::Commit}};
    out.push_back(w);
  }
  return out;
}

FsWorkload fs_random_workload(uint64_t seed, size_t nops) {
  using K = FsOpKind;
  std::mt19937_64 rng(seed);
  FsWorkload w;
  w.id = "fs-random/" + std::to_string(seed);
  w.image = "base";
  w.discard = seed % 2;  // every other seed with discard on (A6)
  const char* names[] = {"a", "big", "frag", "up", "gone", "dir/x", "dir/y", "dir/n", "odir/w", "empty/e", "n1", "n2", "dir"};
  auto name = [&] { return std::string(names[rng() % std::size(names)]); };
  size_t since = 0, every = 1 + rng() % 8, branches = 0;
  for (size_t i = 0; i < nops; i++) {
    const uint32_t r = rng() % 100;
    if (r < 14) w.ops.push_back({K::Create, name()});
    else if (r < 34) w.ops.push_back({K::Write, name(), "", rng() % 3 ? rng() % 200 : rng() % 20000,
                                      rng() % 2 ? 1 + rng() % 100 : 1 + rng() % 12000});
    else if (r < 40) w.ops.push_back({K::Truncate, name(), "", 0, rng() % 9000});
    else if (r < 50) w.ops.push_back({K::Rename, name(), name()});
    else if (r < 54) w.ops.push_back({K::Link, name(), name()});
    else if (r < 64) w.ops.push_back({K::Unlink, name()});
    else if (r < 68) w.ops.push_back({K::Mkdir, name()});
    else if (r < 72) w.ops.push_back({K::Rmdir, name()});
    else if (r < 76) w.ops.push_back({K::Setxattr, name(), "", 0, rng() % 4 ? 1 + rng() % 300 : 1 + rng() % 65536});
    else if (r < 80) w.ops.push_back({K::Fallocate, name(), "", rng() % 8192, 1 + rng() % 16384});
    else if (r < 83) w.ops.push_back({K::CopyUp, name()});
    else if (r < 86) w.ops.push_back({K::Snapshot, numbered("rs", branches++)});
    else if (r < 88) w.ops.push_back({K::Clone, numbered("rc", branches++)});
    else if (r < 91) w.ops.push_back({K::Merge});
    else if (r < 93) w.ops.push_back({K::Rollback});
    else if (r < 95) w.ops.push_back({K::AddBranch, numbered("rb", branches++)});
    else if (r < 97 && branches)
      w.ops.push_back({K::DelBranch, numbered(rng() % 2 ? "rc" : "rs", rng() % branches)});
    else if (r < 99 && branches) {
      const std::string from = numbered("rb", rng() % branches);
      w.ops.push_back({K::RenameBranch, from, numbered("rn", branches++)});
    }
    if (++since >= every) {
      w.ops.push_back({K::Commit});
      since = 0;
      every = 1 + rng() % 8;
    }
  }
  w.ops.push_back({K::Commit});
  return w;
}

}  // namespace plyfs::crash

namespace plyfs::crash {

std::vector<FsWorkload> fs_fault_workloads() {
  using K = FsOpKind;
  const auto inst = fs_instances();
  // A copy-up write, a rename over a whiteout, an unlink (whiteout), a
  // snapshot, a merge, a delete_branch; each committed, then more work (a
  // new file written, a rename) and a second commit, so that a fault the
  // first part survived (a failed read, a refused operation) is followed by
  // commits that must not carry half an operation.
  std::vector<FsWorkload> out;
  for (size_t i : {3, 6, 9, 18, 20, 23}) {
    FsWorkload w;
    w.id = numbered("fs-fault/", i);
    w.image = "base";
    w.ops = {inst[i],
             {K::Commit},
             {K::Create, "after"},
             {K::Write, "after", "", 0, 6000},
             {K::Rename, "dir/x", "x-moved"},
             {K::Commit}};
    out.push_back(std::move(w));
  }
  // A fault while a shrink moves blocks (issue 24): the same scenario.
  for (FsWorkload w : fs_scenarios())
    if (w.id == "fs-scenario/shrink") {
      w.id = "fs-fault/shrink";
      out.push_back(std::move(w));
    }
  {  // A fault while compressed data is read, written and freed (issue 25):
     // a copy-up of a compressed lower file and a partial overwrite inside
     // its frame (the old block decoded from the frame), a new compressed
     // file (compress-force too), a truncation inside a frame.
    FsWorkload w;
    w.id = "fs-fault/compress";
    w.image = "zbase";
    w.compress = true;
    w.ops = {{K::Write, "z", "", 5 * 4096 + 100, 3000},
             {K::Commit},
             {K::Create, "zdir/after"},
             {K::WriteText, "zdir/after", "", 0, 64 << 10},
             {K::Write, "up", "", 4096, 32 << 10},
             {K::Truncate, "z", "", 0, 40 * 4096 + 123},
             {K::Commit}};
    out.push_back(std::move(w));
  }
  // A fault while a stream is received (fs/send.h, S1): it must fail with a
  // clean error, name nothing, and leave no block behind once the next
  // read-write open drops its doomed tree (the write checks).
  for (FsWorkload w : fs_scenarios())
    if (w.id == "fs-scenario/receive") {
      w.id = "fs-fault/receive";
      out.push_back(std::move(w));
    }
  return out;
}

}  // namespace plyfs::crash
