// A randomized differential test: one random sequence of operations runs on
// a tmpfs directory and on a plyfs mount; every result (success or errno)
// must match, and so must the trees, compared at every remount of plyfs and
// at the end. PLYFS_SEED replays a run; PLYFS_TEST_SCALE multiplies its
// length.
#include <linux/falloc.h>
#include <sys/syscall.h>
#include <sys/xattr.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include <functional>

#include "fuse_util.h"
#include "../nbd_server.h"

using namespace plyfs::fusetest;

namespace {

// The namespace: 8 directory slots (depth up to 3) and 5 leaf names in each,
// 48 paths in all, so that operations collide and fail often.
const std::vector<std::string> kDirs = {"", "A", "B", "A/C", "A/D", "B/E", "A/C/F", "B/G"};
const std::vector<std::string> kLeaves = {"f0", "f1", "f2", "f3", "f4"};

std::vector<std::string> all_paths() {
  std::vector<std::string> out;
  for (const auto& d : kDirs) {
    if (!d.empty()) out.push_back(d);
    for (const auto& l : kLeaves) out.push_back(d.empty() ? l : d + "/" + l);
  }
  return out;
}

// The outcome of an operation: its return value and errno.
struct Outcome {
  long ret = 0;
  int err = 0;
  std::string data;  // what a read returned
  bool operator==(const Outcome&) const = default;
};
std::string describe(const Outcome& o) {
  std::ostringstream s;
  s << "ret " << o.ret << " errno " << (o.err ? errstr(o.err) : "0");
  if (!o.data.empty()) s << " (" << o.data.size() << " bytes read)";
  return s.str();
}

Outcome done(long r) { return Outcome{r, r < 0 ? errno : 0, {}}; }

// One random operation, fully decided before it runs, so that it can be
// applied to both trees.
struct Op {
  enum Kind {
    Create, Write, Truncate, Rename, Link, Unlink, Mkdir, Rmdir, Symlink, SetXattr,
    RemoveXattr, Chmod, Utimens, Fallocate, Read
  } kind;
  std::string a, b;
  uint64_t off = 0, len = 0;
  int flags = 0;
  uint32_t mode = 0;
  std::string data;
  timespec ts[2]{};
};

const char* kind_name(Op::Kind k) {
  static const char* names[] = {"create", "write", "truncate", "rename", "link",
                                "unlink", "mkdir", "rmdir", "symlink", "setxattr",
                                "removexattr", "chmod", "utimens", "fallocate", "read"};
  return names[k];
}

uint64_t rand_off(std::mt19937_64& rng) {
  switch (rng() % 20) {
    case 0: return rng() % (2 << 20);
    case 1: case 2: case 3: case 4: case 5: return rng() % (256 << 10);
    default: return rng() % (16 << 10);
  }
}
// The compressed runs write bytes zstd compresses two thirds of the time
// (runs of a few letters), so that frames are made, overwritten inside,
// truncated and read back (format.md#fs-compress).
bool g_compressible = false;
std::string compressible_bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n;) {
    const size_t run = std::min<size_t>(n - i, 1 + rng() % 48);
    std::fill_n(s.begin() + long(i), run, char('a' + rng() % 5));
    i += run;
  }
  return s;
}

uint64_t rand_len(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0: return 1 + rng() % (128 << 10);
    case 1: case 2: case 3: return 1 + rng() % (8 << 10);
    default: return 1 + rng() % 512;
  }
}

// What exists in the model tree, so that most operations pick names that
// exist (or could be created) rather than fail for a missing parent.
struct Existing {
  std::vector<std::string> all;   // every path
  std::vector<std::string> dirs;  // directories, "" for the root
  std::vector<std::string> files;  // everything else
};

Existing scan_model(const std::string& root) {
  Existing e;
  e.dirs.push_back("");
  std::vector<std::string> todo{""};
  while (!todo.empty()) {
    std::string rel = todo.back();
    todo.pop_back();
    DIR* d = opendir(rel.empty() ? root.c_str() : (root + "/" + rel).c_str());
    if (!d) continue;
    while (dirent* de = readdir(d)) {
      std::string n = de->d_name;
      if (n == "." || n == "..") continue;
      std::string r = rel.empty() ? n : rel + "/" + n;
      e.all.push_back(r);
      if (de->d_type == DT_DIR) {
        e.dirs.push_back(r);
        todo.push_back(r);
      } else {
        e.files.push_back(r);
      }
    }
    closedir(d);
  }
  std::sort(e.all.begin(), e.all.end());  // readdir order is not the seed's
  std::sort(e.dirs.begin(), e.dirs.end());
  std::sort(e.files.begin(), e.files.end());
  return e;
}

Op random_op(std::mt19937_64& rng, const std::vector<std::string>& paths, const Existing& ex,
             bool links = true) {
  // Three ways to pick a name: any of the fixed namespace, an existing
  // path, or a fresh name in an existing directory (bounded: at most 8
  // directories and 48 names in all).
  auto any = [&] { return paths[rng() % paths.size()]; };
  auto existing = [&] { return ex.all.empty() ? any() : ex.all[rng() % ex.all.size()]; };
  auto file = [&] { return ex.files.empty() ? any() : ex.files[rng() % ex.files.size()]; };
  auto fresh = [&](bool dir) {
    if (ex.all.size() >= 48 || (dir && ex.dirs.size() > 8)) return any();
    const std::string& d = ex.dirs[rng() % ex.dirs.size()];
    if (std::count(d.begin(), d.end(), '/') >= 2) return any();  // depth 3 at most
    static const std::vector<std::string> names = {"f0", "f1", "f2", "f3", "f4", "A", "B", "C"};
    const std::string& n = names[rng() % names.size()];
    return d.empty() ? n : d + "/" + n;
  };
  // p_existing and p_fresh in percent; the rest is any().
  auto pick = [&](int p_existing, int p_fresh, bool dir = false) {
    int r = int(rng() % 100);
    if (r < p_existing) return existing();
    if (r < p_existing + p_fresh) return fresh(dir);
    return any();
  };
  Op op{};
  // Weights: writes and creates most, then the namespace operations.
  static const std::vector<std::pair<Op::Kind, int>> weights = {
      {Op::Create, 10}, {Op::Write, 18}, {Op::Truncate, 6}, {Op::Rename, 8},
      {Op::Link, 4},    {Op::Unlink, 7}, {Op::Mkdir, 5},    {Op::Rmdir, 5},
      {Op::Symlink, 3}, {Op::SetXattr, 5}, {Op::RemoveXattr, 2}, {Op::Chmod, 3},
      {Op::Utimens, 3}, {Op::Fallocate, 6}, {Op::Read, 6}};
  int total = 0;
  for (auto& w : weights) total += w.second;
  int r = int(rng() % uint64_t(total));
  for (auto& w : weights) {
    if (r < w.second) {
      op.kind = w.first;
      break;
    }
    r -= w.second;
  }
  if (!links && op.kind == Op::Link) op.kind = Op::Create;
  switch (op.kind) {
    case Op::Create: case Op::Symlink:
      op.a = pick(25, 50);
      break;
    case Op::Mkdir:
      op.a = pick(20, 55, true);
      break;
    case Op::Rename:
      op.a = pick(75, 0);
      op.b = pick(35, 45, true);
      break;
    case Op::Link:
      op.a = pick(80, 0);
      op.b = pick(20, 60);
      break;
    case Op::Write: case Op::Truncate: case Op::Read: case Op::Fallocate:
      op.a = rng() % 100 < 70 ? file() : pick(30, 0);
      break;
    case Op::Rmdir:
      op.a = rng() % 100 < 60 && ex.dirs.size() > 1 ? ex.dirs[1 + rng() % (ex.dirs.size() - 1)]
                                                   : pick(50, 0);
      break;
    default:
      op.a = pick(75, 0);
      break;
  }
  switch (op.kind) {
    case Op::Create:
      op.flags = rng() % 3 == 0 ? O_EXCL : (rng() % 4 == 0 ? O_TRUNC : 0);
      op.mode = std::vector<uint32_t>{0644, 0600, 0755, 0444}[rng() % 4];
      break;
    case Op::Write:
      op.off = rand_off(rng);
      op.data = g_compressible && rng() % 3 ? compressible_bytes(rng, rand_len(rng)) : random_bytes(rng, rand_len(rng));
      op.flags = (rng() % 8 == 0 ? O_APPEND : 0) | (rng() % 3 == 0 ? O_CREAT : 0);
      break;
    case Op::Truncate:
    case Op::Read:
      op.off = rng() % 3 == 0 ? rand_off(rng) + rand_len(rng) : rand_off(rng);
      op.len = rand_len(rng);
      break;
    case Op::Rename:
      op.flags = std::vector<int>{0, 0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE}[rng() % 5];
      break;
    case Op::Mkdir:
      op.mode = std::vector<uint32_t>{0755, 0700, 0775}[rng() % 3];
      // Directory slots sometimes, so that the tree grows deep.
      if (rng() % 5 == 0) op.a = kDirs[1 + rng() % (kDirs.size() - 1)];
      break;

    case Op::Symlink: {
      size_t n = rng() % 10 == 0 ? 1 + rng() % 3000 : 1 + rng() % 40;
      op.data = "target/";
      while (op.data.size() < n) op.data += char('a' + rng() % 26);
      op.data.resize(n);
      break;
    }
    case Op::SetXattr: {
      // Mostly small; one in eight large (out of line in plyfs), up to one
      // byte past XATTR_SIZE_MAX (E2BIG on both sides).
      const size_t large = std::vector<size_t>{1000, 4096, 20000, 65536, 65537}[rng() % 5];
      op.data = random_bytes(rng, rng() % 8 == 0   ? (rng() % 2 ? large : 985 + rng() % 64552)
                                  : rng() % 4 == 0 ? 0
                                                   : rng() % 300);
      op.b = "user.x" + std::to_string(rng() % 4);
      op.flags = std::vector<int>{0, 0, XATTR_CREATE, XATTR_REPLACE}[rng() % 4];
      break;
    }
    case Op::RemoveXattr:
      op.b = "user.x" + std::to_string(rng() % 4);
      break;
    case Op::Chmod:
      op.mode = uint32_t(rng() % 01000) | 0600;  // keep the owner able to open it
      break;
    case Op::Utimens:
      for (auto& t : op.ts) {
        t.tv_sec = time_t(1000000000 + rng() % 1000000000);
        t.tv_nsec = long(rng() % 1000000000);
      }
      if (rng() % 5 == 0) op.ts[0].tv_nsec = UTIME_OMIT;
      break;
    case Op::Fallocate:
      op.flags = std::vector<int>{0, FALLOC_FL_KEEP_SIZE,
                                  FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                  FALLOC_FL_ZERO_RANGE,
                                  FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE}[rng() % 5];
      op.off = rand_off(rng);
      op.len = rand_len(rng);
      break;
    default:
      break;
  }
  return op;
}

std::string describe(const Op& op) {
  std::ostringstream s;
  s << kind_name(op.kind) << " a=" << op.a;
  if (op.kind == Op::Rename || op.kind == Op::Link || op.kind == Op::SetXattr ||
      op.kind == Op::RemoveXattr)
    s << " b=" << op.b;
  s << " off=" << op.off << " len=" << (op.data.empty() ? op.len : op.data.size())
    << " flags=0x" << std::hex << op.flags << " mode=0" << std::oct << op.mode;
  return s.str();
}

// Applies op under root. `tmpfs` says which side: tmpfs has no ZERO_RANGE,
// so it gets the equivalent punch and allocate.
Outcome apply(const Op& op, const std::string& root, bool tmpfs) {
  const std::string a = root + "/" + op.a, b = root + "/" + op.b;
  errno = 0;
  switch (op.kind) {
    case Op::Create: {
      int fd = ::open(a.c_str(), O_CREAT | O_WRONLY | O_NOFOLLOW | op.flags, op.mode);
      if (fd < 0) return done(fd);
      return done(::close(fd));
    }
    case Op::Write: {
      int fd = ::open(a.c_str(), O_WRONLY | O_NOFOLLOW | op.flags, 0644);
      if (fd < 0) return done(fd);
      Outcome o = done(::pwrite(fd, op.data.data(), op.data.size(), off_t(op.off)));
      ::close(fd);
      return o;
    }
    case Op::Truncate: {
      int fd = ::open(a.c_str(), O_WRONLY | O_NOFOLLOW);
      if (fd < 0) return done(fd);
      Outcome o = done(::ftruncate(fd, off_t(op.off)));
      ::close(fd);
      return o;
    }
    case Op::Read: {
      int fd = ::open(a.c_str(), O_RDONLY | O_NOFOLLOW);
      if (fd < 0) return done(fd);
      std::string buf(op.len, '\0');
      ssize_t n = ::pread(fd, buf.data(), buf.size(), off_t(op.off));
      Outcome o = done(n);
      if (n > 0) o.data = buf.substr(0, size_t(n));
      ::close(fd);
      return o;
    }
    case Op::Rename:
      return done(syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), op.flags));
    case Op::Link: return done(::link(a.c_str(), b.c_str()));
    case Op::Unlink: return done(::unlink(a.c_str()));
    case Op::Mkdir: return done(::mkdir(a.c_str(), op.mode));
    case Op::Rmdir: return done(::rmdir(a.c_str()));
    case Op::Symlink: return done(::symlink(op.data.c_str(), a.c_str()));
    case Op::SetXattr:
      return done(::lsetxattr(a.c_str(), op.b.c_str(), op.data.data(), op.data.size(), op.flags));
    case Op::RemoveXattr: return done(::lremovexattr(a.c_str(), op.b.c_str()));
    case Op::Chmod: return done(::fchmodat(AT_FDCWD, a.c_str(), op.mode, AT_SYMLINK_NOFOLLOW));
    case Op::Utimens: return done(::utimensat(AT_FDCWD, a.c_str(), op.ts, AT_SYMLINK_NOFOLLOW));
    case Op::Fallocate: {
      int fd = ::open(a.c_str(), O_WRONLY | O_NOFOLLOW);
      if (fd < 0) return done(fd);
      Outcome o;
      if (tmpfs && (op.flags & FALLOC_FL_ZERO_RANGE)) {
        o = done(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(op.off),
                             off_t(op.len)));
        if (o.ret == 0)
          o = done(::fallocate(fd, op.flags & FALLOC_FL_KEEP_SIZE, off_t(op.off), off_t(op.len)));
      } else {
        o = done(::fallocate(fd, op.flags, off_t(op.off), off_t(op.len)));
      }
      ::close(fd);
      return o;
    }
  }
  return {};
}

// What the comparison looks at, for one name.
struct Node {
  std::string type;
  uint32_t mode = 0;
  uint64_t size = 0, nlink = 0;
  std::string content;  // file data or symlink target
  std::map<std::string, std::string> xattrs;
  std::string first_name;  // the first path of this inode (hard links)
  // Compared only between two looks at plyfs (across a remount): tmpfs
  // differs in blocks and sets its own times.
  timespec mtime{};
  uint64_t blocks = 0;
};

std::map<std::string, std::string> user_xattrs(const std::string& p) {
  std::map<std::string, std::string> out;
  std::string names(65536, '\0');
  ssize_t n = ::llistxattr(p.c_str(), names.data(), names.size());
  INFO("llistxattr " << p << ": " << std::strerror(errno));
  REQUIRE(n >= 0);
  for (size_t i = 0; i < size_t(n);) {
    std::string name(names.c_str() + i);
    i += name.size() + 1;
    if (name.rfind("user.", 0) != 0) continue;
    std::string v(65536, '\0');
    ssize_t m = ::lgetxattr(p.c_str(), name.c_str(), v.data(), v.size());
    INFO("lgetxattr " << p << " " << name << ": " << std::strerror(errno));
    REQUIRE(m >= 0);
    out[name] = v.substr(0, size_t(m));
  }
  return out;
}

void walk(const std::string& root, const std::string& rel, std::map<std::string, Node>& out,
          std::map<ino_t, std::string>& seen) {
  for (const auto& name : list_dir(rel.empty() ? root : root + "/" + rel)) {
    const std::string r = rel.empty() ? name : rel + "/" + name;
    const std::string p = root + "/" + r;
    struct stat st = lstat_of(p);
    Node n;
    n.mode = st.st_mode & 07777;
    n.nlink = st.st_nlink;
    n.mtime = st.st_mtim;
    n.blocks = uint64_t(st.st_blocks);
    auto [it, fresh] = seen.emplace(st.st_ino, r);
    n.first_name = it->second;
    if (S_ISDIR(st.st_mode)) {
      n.type = "dir";
    } else if (S_ISREG(st.st_mode)) {
      n.type = "file";
      n.size = uint64_t(st.st_size);
      n.content = read_file(p);
    } else if (S_ISLNK(st.st_mode)) {
      n.type = "symlink";
      n.size = uint64_t(st.st_size);
      std::vector<char> buf(8192);
      ssize_t k = ::readlink(p.c_str(), buf.data(), buf.size());
      REQUIRE(k >= 0);
      n.content.assign(buf.data(), size_t(k));
    } else {
      n.type = "other";
    }
    if (!S_ISLNK(st.st_mode)) n.xattrs = user_xattrs(p);
    out[r] = n;
    if (S_ISDIR(st.st_mode)) walk(root, r, out, seen);
  }
}

std::map<std::string, Node> snapshot(const std::string& root) {
  std::map<std::string, Node> out;
  std::map<ino_t, std::string> seen;
  walk(root, "", out, seen);
  return out;
}

// Returns the plyfs side's snapshot.
// A union shows a merged directory's link count as 1, "not counted"
// (format.md#fs-union): directories' counts are compared only without one.
bool g_dir_nlink = true;

std::map<std::string, Node> compare_trees(const std::string& model, const std::string& mnt,
                                          const std::string& when) {
  auto a = snapshot(model), b = snapshot(mnt);
  INFO("comparing the trees " << when);
  std::set<std::string> names;
  for (auto& [k, v] : a) names.insert(k);
  for (auto& [k, v] : b) names.insert(k);
  for (const auto& n : names) {
    INFO("path " << n);
    REQUIRE(a.count(n) == 1);
    REQUIRE(b.count(n) == 1);
    const Node &x = a[n], &y = b[n];
    REQUIRE(x.type == y.type);
    REQUIRE(x.mode == y.mode);
    if (g_dir_nlink || x.type != "dir") REQUIRE(x.nlink == y.nlink);
    REQUIRE(x.size == y.size);
    if (x.content != y.content) {
      size_t i = 0;
      while (i < x.content.size() && i < y.content.size() && x.content[i] == y.content[i]) i++;
      FAIL("contents differ from byte " << i << " (sizes " << x.content.size() << " and "
                                        << y.content.size() << ")");
    }
    REQUIRE(x.xattrs == y.xattrs);
    REQUIRE(x.first_name == y.first_name);
  }
  return b;
}

// What plyfs showed before an unmount it shows after the next mount: the
// times and block counts the daemon stored are those the kernel had.
void compare_remount(const std::map<std::string, Node>& before,
                     const std::map<std::string, Node>& after) {
  REQUIRE(before.size() == after.size());
  for (const auto& [path, x] : before) {
    INFO("path " << path << " across a remount");
    REQUIRE(after.count(path) == 1);
    const Node& y = after.at(path);
    REQUIRE(x.blocks == y.blocks);
    // The times a program saw are the ones stored (with the writeback
    // cache the kernel's own mtime of a written file).
    REQUIRE(x.mtime.tv_sec == y.mtime.tv_sec);
    REQUIRE(x.mtime.tv_nsec == y.mtime.tv_nsec);
  }
}


// The union variant: after the first fifth of the operations the image gets
// a layer over its branch and the rest runs through the union (copy-ups,
// whiteouts, opaque directories, renames across branches), with branch
// changes while mounted that keep the view as it is: empty branches added
// anywhere, branches switched between read-only and read-write (the leftmost
// stays writable), and empty read-only branches removed again. Hard links are
// in: a copy-up brings every visible name of the file along.
struct UnionDiff {
  std::vector<std::string> stack;  // the mounted stack, leftmost first ("name=rw")
  std::set<std::string> removable;  // shown, empty, never writable
  int next_empty = 0;
  static constexpr int kEmpty = 8;  // empty branches made before the union starts
};

std::string join_stack(const std::vector<std::string>& s) {
  std::string o;
  for (const auto& x : s) o += (o.empty() ? "" : ":") + x;
  return o;
}

void plyctl_ok(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> a{plyctl_bin()};
  a.insert(a.end(), args.begin(), args.end());
  ::unlink(log.c_str());
  int rc = run(a, log);
  INFO(slurp(log));
  REQUIRE(rc == 0);
}

// One random branch change that leaves the view as it is.
void change_branches(UnionDiff& u, std::mt19937_64& rng, const std::string& mnt,
                     const std::string& log) {
  auto name_of = [](const std::string& l) { return l.substr(0, l.find('=')); };
  const int kind = int(rng() % 3);
  if (kind == 0 && u.next_empty < UnionDiff::kEmpty) {
    const std::string b = "e" + std::to_string(u.next_empty++);
    const size_t pos = rng() % (u.stack.size() + 1);
    const bool rw = pos == 0 || rng() % 2;
    std::vector<std::string> args{"branch", "add", mnt, b, "--at", std::to_string(pos)};
    if (!rw) args.push_back("--ro");
    plyctl_ok(args, log);
    u.stack.insert(u.stack.begin() + long(pos), b + (rw ? "=rw" : "=ro"));
    if (!rw) u.removable.insert(b);
  } else if (kind == 1 && u.stack.size() > 1) {
    const size_t pos = 1 + rng() % (u.stack.size() - 1);  // never the leftmost
    const std::string b = name_of(u.stack[pos]);
    const bool rw = rng() % 2;
    plyctl_ok({"branch", "set", mnt, b, rw ? "--rw" : "--ro"}, log);
    u.stack[pos] = b + (rw ? "=rw" : "=ro");
    if (rw) u.removable.erase(b);
  } else if (!u.removable.empty()) {
    auto it = u.removable.begin();
    std::advance(it, long(rng() % u.removable.size()));
    const std::string b = *it;
    u.removable.erase(it);
    plyctl_ok({"branch", "remove", mnt, b}, log);
    u.stack.erase(std::find_if(u.stack.begin(), u.stack.end(),
                               [&](const std::string& l) { return name_of(l) == b; }));
  }
  std::string out;
  ::unlink(log.c_str());
  REQUIRE(run({plyctl_bin(), "branch", "list", mnt}, log) == 0);
  REQUIRE(slurp(log) == join_stack(u.stack) + "\n");
}

// `extra`: options for every mount of the run. Returns the daemons' log.
// `image`: an NBD URI to run on instead of an image file in the test's
// directory.
std::string run_diff(const char* name, uint64_t nops, bool with_union,
                     const std::vector<std::string>& extra = {}, const std::string& image = "") {
  const uint64_t s = seed(name);
  std::mt19937_64 rng(s);
  g_dir_nlink = !with_union;
  TempDir tmp;
  // The model directory must be tmpfs: TempDir picks /dev/shm when it can.
  const std::string model = tmp / "model";
  REQUIRE(::mkdir(model.c_str(), 0755) == 0);
  ::umask(022);
  const std::string img = image.empty() ? tmp / "image" : image;
  mkfs(img, "2G", tmp / "mkfs.log");
  std::vector<std::string> opts = extra;
  auto with = [&](std::vector<std::string> o) {
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  };
  auto m = std::make_unique<Mount>(img, tmp / "mnt", opts);
  m->start();
  // The roots start alike.
  REQUIRE(::chmod(m->path().c_str(), 0755) == 0);
  UnionDiff ud;
  const uint64_t union_from = with_union ? nops / 5 : ~0ull;
  const std::string ctl_log = tmp / "plyctl.log";

  std::set<uint64_t> remounts;
  while (remounts.size() < 10) remounts.insert(1 + rng() % (nops - 1));
  const auto paths = all_paths();
  std::map<std::string, int> counts, failures;
  uint64_t errors = 0;
  Existing ex;
  bool refresh = true;
  // PLYFS_DIFF_LOG=FILE writes every operation and its outcome there.
  FILE* trace = nullptr;
  if (const char* t = std::getenv("PLYFS_DIFF_LOG")) trace = std::fopen(t, "w");
  struct Closer {
    FILE*& f;
    ~Closer() { if (f) std::fclose(f); }
  } closer{trace};
  // PLYFS_DIFF_CHECK_FROM=N compares the whole trees after every operation
  // from the N-th on (to find the operation that made them differ).
  uint64_t check_from = ~0ull;
  if (const char* c = std::getenv("PLYFS_DIFF_CHECK_FROM")) check_from = std::strtoull(c, nullptr, 10);
  for (uint64_t i = 0; i < nops; i++) {
    if (i >= check_from) (void)compare_trees(model, m->path(), "after op " + std::to_string(i - 1));
    if (i == union_from) {
      auto before = compare_trees(model, m->path(), "before the union starts");
      int rc = m->unmount();
      INFO("plyfs log:\n" << m->log());
      REQUIRE(rc == 0);
      m.reset();
      plyctl_ok({"branch", "create", img, "top", "--parent", "main"}, ctl_log);
      for (int e = 0; e < UnionDiff::kEmpty; e++)
        plyctl_ok({"branch", "create", img, "e" + std::to_string(e)}, ctl_log);
      ud.stack = {"top=rw", "main=ro"};
      opts = with({"branches=" + join_stack(ud.stack)});
      m = std::make_unique<Mount>(img, tmp / "mnt", opts);
      m->start();
      (void)compare_trees(model, m->path(), "through the union");
      (void)before;
    }
    if (i > union_from && i % (nops / 40 + 1) == 0) {
      change_branches(ud, rng, m->path(), ctl_log);
      opts = with({"branches=" + join_stack(ud.stack)});
      if (trace) std::fprintf(trace, "--- branches %s\n", join_stack(ud.stack).c_str());
    }
    if (trace && remounts.count(i)) std::fprintf(trace, "--- remount\n");
    if (remounts.count(i)) {
      auto before = compare_trees(model, m->path(), "before remount at op " + std::to_string(i));
      int rc = m->unmount();
      INFO("plyfs log:\n" << m->log());
      REQUIRE(rc == 0);
      m.reset();
      require_fsck_clean(img, tmp / "fsck.log");
      m = std::make_unique<Mount>(img, tmp / "mnt", opts);
      m->start();
      compare_remount(before, compare_trees(model, m->path(), "after remount at op " + std::to_string(i)));
    }
    if (refresh) {
      ex = scan_model(model);
      refresh = false;
    }
    const Op op = random_op(rng, paths, ex);
    const Outcome want = apply(op, model, true);
    const Outcome got = apply(op, m->path(), false);
    if (trace) {
      std::fprintf(trace, "%llu %s -> %s\n", static_cast<unsigned long long>(i), describe(op).c_str(),
                   describe(got).c_str());
      std::fflush(trace);
    }
    counts[kind_name(op.kind)]++;
    // The namespace changed: pick from the new one.
    if (want.ret >= 0 && op.kind != Op::Read && op.kind != Op::Truncate &&
        op.kind != Op::SetXattr && op.kind != Op::RemoveXattr && op.kind != Op::Chmod &&
        op.kind != Op::Utimens && op.kind != Op::Fallocate)
      refresh = true;
    if (want.ret < 0) {
      failures[kind_name(op.kind)]++;
      errors++;
    }
    if (!(want == got)) {
      FAIL("op " << i << " (" << describe(op) << "): tmpfs " << describe(want) << ", plyfs "
                 << describe(got) << "; seed " << s);
    }
    if (op.kind == Op::Utimens && want.ret == 0) {
      struct stat x = lstat_of(model + "/" + op.a), y = lstat_of(m->path() + "/" + op.a);
      INFO("op " << i << " " << describe(op));
      REQUIRE(x.st_mtim.tv_sec == y.st_mtim.tv_sec);
      REQUIRE(x.st_mtim.tv_nsec == y.st_mtim.tv_nsec);
      if (op.ts[0].tv_nsec != UTIME_OMIT) {
        REQUIRE(x.st_atim.tv_sec == y.st_atim.tv_sec);
        REQUIRE(x.st_atim.tv_nsec == y.st_atim.tv_nsec);
      }
    }
  }
  auto before = compare_trees(model, m->path(), "at the end");
  int rc = m->unmount();
  INFO("plyfs log:\n" << m->log());
  REQUIRE(rc == 0);
  m.reset();
  require_fsck_clean(img, tmp / "fsck.log");
  m = std::make_unique<Mount>(img, tmp / "mnt", opts);
  m->start();
  compare_remount(before, compare_trees(model, m->path(), "after the last remount"));
  rc = m->unmount();
  REQUIRE(rc == 0);
  const std::string daemon_log = m->log();
  m.reset();
  require_fsck_clean(img, tmp / "fsck.log");

  std::printf("[diff] %llu operations, %llu failed alike:", static_cast<unsigned long long>(nops),
              static_cast<unsigned long long>(errors));
  for (auto& [k, n] : counts) std::printf(" %s %d/%d", k.c_str(), failures[k], n);
  std::printf("\n");
  // The namespace is small enough that collisions and errors are common.
  REQUIRE(errors > nops / 10);
  return daemon_log;
}

// The kernel's switch for FUSE over io_uring (Linux 6.14+), set for one
// test and put back after it. Mounts without -o uring never use it.
struct UringSwitch {
  static constexpr const char* kPath = "/sys/module/fuse/parameters/enable_uring";
  std::string old;
  bool present = false;
  UringSwitch() {
    std::ifstream f(kPath);
    present = bool(std::getline(f, old));
  }
  void set(bool on) const {
    std::ofstream f(kPath);
    f << (on ? "Y" : "N") << std::endl;
    REQUIRE(f.good());
  }
  ~UringSwitch() {
    if (present) std::ofstream(kPath) << old << std::endl;
  }
};

}  // namespace

TEST_CASE("differential: random operations on tmpfs and plyfs agree", "[diff]") {
  run_diff("diff", 50000 * scale(), false);
}

// -o uring (fuse/uring.h): the differential test with the requests taken
// from the kernel's io_uring queues, then with the kernel's switch off,
// where the same option must leave the daemon on /dev/fuse.
#ifdef PLYFS_HAVE_NBD
// The image on an NBD server (nbdkit memory on a Unix socket), the union
// included: a shorter run (tests/fuse/nbd_test.cpp has the rest).
TEST_CASE("differential: random operations on tmpfs and plyfs over NBD agree", "[nbd-diff]") {
  REQUIRE(!plyfs::test::nbdkit_path().empty());  // meson runs [nbd-diff] only where it is
  TempDir dir;
  plyfs::test::NbdServer srv(dir.path(), {"memory", "2G"});
  run_diff("nbd-diff", 20000 * scale(), false, {}, srv.uri());
  srv.restart({"memory", "2G"});  // a fresh, empty export
  run_diff("nbd-union-diff", 8000 * scale(), true, {}, srv.uri());
}
#endif

TEST_CASE("differential: random operations over FUSE io_uring, and -o uring without it", "[uring]") {
  const std::string line = "requests go through io_uring";
  UringSwitch sw;
  if (sw.present) {
    sw.set(true);
    const std::string log = run_diff("uring-diff", 10000 * scale(), false, {"uring"});
    INFO("plyfs log:\n" << log);
    REQUIRE(log.find(line) != std::string::npos);
    REQUIRE(log.find("refused") == std::string::npos);
    sw.set(false);
  } else {
    std::printf("[uring] this kernel has no FUSE io_uring: only the fallback is checked\n");
  }
  const std::string log = run_diff("uring-off", 2000 * scale(), false, {"uring"});
  INFO("plyfs log:\n" << log);
  REQUIRE(log.find(line) == std::string::npos);
  REQUIRE(log.find("does not offer FUSE over io_uring") != std::string::npos);
}

TEST_CASE("differential: random operations on tmpfs and a plyfs union agree, with live branch changes",
          "[union-diff]") {
  run_diff("union-diff", 20000 * scale(), true);
}

// The same with compression on: -o compress-force on a plain mount, and a
// union mount with -o compress, whose copy-ups share the frames below.
TEST_CASE("differential: with compression, random operations on tmpfs and plyfs agree", "[diff-compress]") {
  g_compressible = true;
  run_diff("diff-compress", 15000 * scale(), false, {"compress-force=zstd:1"});
  run_diff("union-diff-compress", 6000 * scale(), true, {"compress=zstd:3"});
  g_compressible = false;
}

namespace {

// What a crash may leave of a tree, as text: every path with its type,
// mode, size, content, xattrs and hard-link group; a file's link count too
// (a merged directory's is "not counted" in a union, format.md#fs-union).
std::string state_of(const std::map<std::string, Node>& t) {
  std::ostringstream s;
  for (const auto& [path, n] : t) {
    s << path << ' ' << n.type << ' ' << std::oct << n.mode << std::dec << ' ' << n.size;
    if (n.type != "dir") s << " nlink " << n.nlink;
    s << " first " << n.first_name << " content " << std::hash<std::string>{}(n.content);
    for (const auto& [k, v] : n.xattrs) s << ' ' << k << '=' << std::hash<std::string>{}(v);
    s << '\n';
  }
  return s.str();
}

}  // namespace

// Crash runs of union operations through the daemon (issue 6, "Proof"): the
// random operations of the union differential test on a layer over a
// read-only branch, with a commit every second (so that a periodic commit
// lands in the middle of copy-ups, whiteouts and renames across branches)
// and an fsync of the root directory now and then (a commit of everything);
// at a random point the daemon gets SIGKILL. The image must be clean, and the
// union must show exactly what the model showed after one operation at or
// after the last fsync: never a half-done operation, never less than what
// was synced. The model then restarts from
// what the union shows.
TEST_CASE("differential: a plyfs union killed at random points shows the model at a sync or later",
          "[kill]") {
  const uint64_t s = seed("union-kill");
  std::mt19937_64 rng(s);
  g_dir_nlink = false;
  TempDir tmp;
  const std::string model = tmp / "model";
  REQUIRE(::mkdir(model.c_str(), 0755) == 0);
  ::umask(022);
  const std::string img = tmp / "image";
  mkfs(img, "1G", tmp / "mkfs.log");
  const std::string ctl_log = tmp / "plyctl.log";
  const auto paths = all_paths();
  // Random operations on both sides until `more` says stop.
  auto run_ops = [&](Mount& m, const std::function<bool(uint64_t)>& more) {
    Existing ex = scan_model(model);
    for (uint64_t i = 0; more(i); i++) {
      const Op op = random_op(rng, paths, ex);
      const Outcome want = apply(op, model, true);
      const Outcome got = apply(op, m.path(), false);
      if (!(want == got))
        FAIL("op " << describe(op) << ": tmpfs " << describe(want) << ", plyfs " << describe(got) << "; seed " << s);
      if (want.ret >= 0) ex = scan_model(model);
    }
  };
  // The lower branch: a tree made through a plain mount.
  {
    Mount m(img, tmp / "mnt");
    m.start();
    REQUIRE(::chmod(m.path().c_str(), 0755) == 0);
    run_ops(m, [](uint64_t i) { return i < 300; });
    (void)compare_trees(model, m.path(), "before the layer");
    REQUIRE(m.unmount() == 0);
  }
  plyctl_ok({"branch", "create", img, "top", "--parent", "main"}, ctl_log);
  const std::vector<std::string> opts = {"branches=top=rw:main=ro", "commit=1"};
  const int rounds = 8 * int(scale());
  size_t total_states = 0, matched_later = 0;
  for (int round = 0; round < rounds; round++) {
    INFO("round " << round << ", seed " << s);
    Mount m(img, tmp / "mnt", opts);
    m.start();
    (void)compare_trees(model, m.path(), "after the remount");
    // The states a crash may leave: the one at the last fsync, and each
    // one after it.
    std::vector<std::string> allowed{state_of(snapshot(model))};
    // Operations back to back for 1.5 to 3.5 s: the periodic commits land
    // at random points, often inside an operation.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500 + rng() % 2000);
    run_ops(m, [&](uint64_t i) {
      if (i == 0) return true;
      // After operation i - 1.
      if (rng() % 100 == 0) {
        int fd = ::open(m.path().c_str(), O_RDONLY | O_DIRECTORY);
        REQUIRE(fd >= 0);
        REQUIRE(::fsync(fd) == 0);  // commits the generation (syncfs does not reach a FUSE daemon)
        ::close(fd);
        allowed.clear();
      }
      allowed.push_back(state_of(snapshot(model)));
      return std::chrono::steady_clock::now() < until;
    });
    total_states += allowed.size();
    m.kill9();
    require_fsck_clean(img, tmp / "fsck.log");
    Mount back(img, tmp / "mnt", opts);
    back.start();
    const std::string got = state_of(snapshot(back.path()));
    const auto at = std::find(allowed.begin(), allowed.end(), got);
    if (at == allowed.end()) {
      INFO("after the kill:\n" << got << "at the last sync:\n" << allowed.front() << "at the kill:\n" << allowed.back());
      FAIL("the union after SIGKILL shows no state the model had at or after the last fsync");
    }
    if (at != allowed.begin()) matched_later++;
    // The model goes back to what the union shows, hard links and xattrs included.
    REQUIRE(std::system(("rm -rf '" + model + "' && cp -a '" + back.path() + "' '" + model + "'").c_str()) == 0);
    REQUIRE(::chmod(model.c_str(), 0755) == 0);
    (void)compare_trees(model, back.path(), "after the model was reset");
    REQUIRE(back.unmount() == 0);
  }
  std::printf("[union-kill] %d rounds, %zu states allowed in all, %zu recoveries past the last fsync\n", rounds,
              total_states, matched_later);
}
