// plyctl send and receive (format.md#send-stream) end to end: a tree made
// through a mount (text and random files, a sparse file, hard links,
// symlinks, a FIFO, a device node, xattrs, odd modes, owners and times),
// snapshotted and sent from the mount point, whole and then incrementally
// with a compressed stream; received offline into one image and online
// (through the mount point, and through the mounted image's path) into
// another; each received branch equal to its source as stat(2) and read(2)
// see it through the control folder: type, mode, owners, size, link count,
// atime, mtime and ctime to the nanosecond, rdev, content, user xattrs and
// hard-link groups. The --json objects are checked against the schema; a
// truncated stream and a missing parent are refused in one line with
// nothing received; fsck is clean on every image. A file copied with cp
// between snapshots travels as a reference to the parent's data.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/xattr.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "fuse_util.h"
#include "json_schema.h"

using namespace plyfs::fusetest;
using nlohmann::json;

namespace {

// What a received branch must keep of each name.
struct Seen {
  struct stat st;
  std::string content;  // file data or symlink target
  std::map<std::string, std::string> xattrs;
  std::string first;  // the first name of its inode in the walk (hard links)
};

void look(const std::string& root, const std::string& rel, std::map<std::string, Seen>& out,
          std::map<ino_t, std::string>& first) {
  for (const auto& name : list_dir(rel.empty() ? root : root + "/" + rel)) {
    const std::string r = rel.empty() ? name : rel + "/" + name;
    const std::string p = root + "/" + r;
    Seen s;
    s.st = lstat_of(p);
    s.first = first.emplace(s.st.st_ino, r).first->second;
    if (S_ISREG(s.st.st_mode)) s.content = read_file(p);
    if (S_ISLNK(s.st.st_mode)) {
      std::string t(4096, '\0');
      const ssize_t n = ::readlink(p.c_str(), t.data(), t.size());
      REQUIRE(n >= 0);
      s.content = t.substr(0, size_t(n));
    } else {
      std::string names(65536, '\0');
      const ssize_t n = ::llistxattr(p.c_str(), names.data(), names.size());
      REQUIRE(n >= 0);
      for (size_t i = 0; i < size_t(n);) {
        const std::string x(names.c_str() + i);
        i += x.size() + 1;
        std::string v(65536, '\0');
        const ssize_t m = ::lgetxattr(p.c_str(), x.c_str(), v.data(), v.size());
        REQUIRE(m >= 0);
        s.xattrs[x] = v.substr(0, size_t(m));
      }
    }
    out[r] = s;
    if (S_ISDIR(s.st.st_mode)) look(root, r, out, first);
  }
}

std::map<std::string, Seen> look(const std::string& root) {
  std::map<std::string, Seen> out;
  std::map<ino_t, std::string> first;
  look(root, "", out, first);
  return out;
}

// `data` written at `off` of file `p` (made if missing), the rest kept.
void put_at(const std::string& p, const std::string& data, uint64_t off) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, data.data(), data.size(), off_t(off)) == ssize_t(data.size()));
  REQUIRE(::close(fd) == 0);
}

bool same_time(const timespec& a, const timespec& b) { return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec; }

void require_same(const std::string& a, const std::string& b) {
  INFO("comparing " << a << " with " << b);
  auto x = look(a), y = look(b);
  REQUIRE(x.size() > 10);
  REQUIRE(x.size() == y.size());
  for (const auto& [path, s] : x) {
    INFO("path " << path);
    REQUIRE(y.count(path) == 1);
    const Seen& t = y.at(path);
    CHECK(s.st.st_mode == t.st.st_mode);
    CHECK(s.st.st_uid == t.st.st_uid);
    CHECK(s.st.st_gid == t.st.st_gid);
    CHECK(s.st.st_size == t.st.st_size);
    CHECK(s.st.st_nlink == t.st.st_nlink);
    CHECK(s.st.st_rdev == t.st.st_rdev);
    CHECK(s.st.st_blocks == t.st.st_blocks);
    CHECK(same_time(s.st.st_mtim, t.st.st_mtim));
    CHECK(same_time(s.st.st_atim, t.st.st_atim));
    CHECK(same_time(s.st.st_ctim, t.st.st_ctim));
    CHECK(s.content == t.content);
    CHECK(s.xattrs == t.xattrs);
    CHECK(s.first == t.first);
  }
}

json checked(const TempDir& tmp, const std::string& cmd, std::vector<std::string> args) {
  args.push_back("--json");
  CtlOut o = ctl(tmp, std::move(args));
  REQUIRE(o.rc == 0);
  return schema_checked(cmd, o.out);
}

std::string noise(size_t n, std::mt19937_64& r) {
  std::string s(n, '\0');
  for (auto& c : s) c = char(r());
  return s;
}

std::string words(size_t n, std::mt19937_64& r) {
  static const char* w[] = {"send ", "receive ", "stream ", "snapshot ", "plyfs\n"};
  std::string s;
  while (s.size() < n) s += w[r() % 5];
  s.resize(n);
  return s;
}

void set_times(const std::string& p, std::mt19937_64& r) {
  timespec ts[2] = {{time_t(1000000000 + r() % 500000000), long(r() % 1000000000)},
                    {time_t(1000000000 + r() % 500000000), long(r() % 1000000000)}};
  REQUIRE(::utimensat(AT_FDCWD, p.c_str(), ts, AT_SYMLINK_NOFOLLOW) == 0);
}

// A tree with every kind of object the stream must carry.
void populate(const std::string& m, std::mt19937_64& r) {
  REQUIRE(::mkdir((m + "/d").c_str(), 0750) == 0);
  REQUIRE(::mkdir((m + "/d/e").c_str(), 0700) == 0);
  for (int i = 0; i < 20; i++) {
    const std::string p = m + (i % 2 ? "/d/f" : "/f") + std::to_string(i);
    write_file(p, i % 3 ? words(1 + r() % 200000, r) : noise(1 + r() % 100000, r));
    REQUIRE(::chmod(p.c_str(), mode_t(r() % 07777)) == 0);
    REQUIRE(::chown(p.c_str(), uid_t(r() % 3000), gid_t(r() % 3000)) == 0);
    REQUIRE(::lsetxattr(p.c_str(), "user.a", "value", 5, 0) == 0);
    if (i % 4 == 0) {
      const std::string big = noise(3000 + r() % 20000, r);  // out of line
      REQUIRE(::lsetxattr(p.c_str(), "user.big", big.data(), big.size(), 0) == 0);
    }
    set_times(p, r);
  }
  // A sparse file: data at 0, 1 MiB and 64 MiB, holes between.
  const std::string sp = m + "/sparse";
  write_file(sp, "head");
  put_at(sp, noise(8192, r), 1 << 20);
  put_at(sp, "tail", 64ull << 20);
  REQUIRE(::link((m + "/f2").c_str(), (m + "/d/e/link-to-f2").c_str()) == 0);
  REQUIRE(::link((m + "/f2").c_str(), (m + "/another").c_str()) == 0);
  REQUIRE(::symlink("d/f1", (m + "/sym").c_str()) == 0);
  REQUIRE(::symlink(std::string(300, 'x').c_str(), (m + "/d/longsym").c_str()) == 0);
  REQUIRE(::mkfifo((m + "/fifo").c_str(), 0640) == 0);
  REQUIRE(::mknod((m + "/null").c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0);
  set_times(m + "/sym", r);
  set_times(m + "/d/e", r);
}

// Changes for the incremental stream: overwrites inside files, a
// truncate, unlinks, a rename across directories, new files, an xattr
// changed and one removed, a mode changed.
void change(const std::string& m, std::mt19937_64& r) {
  put_at(m + "/f4", noise(5000, r), 4096);
  put_at(m + "/d/f5", words(70000, r), 100);
  REQUIRE(::truncate((m + "/f6").c_str(), 777) == 0);
  REQUIRE(::unlink((m + "/f8").c_str()) == 0);
  REQUIRE(::unlink((m + "/another").c_str()) == 0);
  REQUIRE(::rename((m + "/f10").c_str(), (m + "/d/e/moved").c_str()) == 0);
  write_file(m + "/new", words(300000, r));
  REQUIRE(::lsetxattr((m + "/f12").c_str(), "user.a", "other", 5, 0) == 0);
  REQUIRE(::lremovexattr((m + "/f14").c_str(), "user.a") == 0);
  REQUIRE(::chmod((m + "/d").c_str(), 0755) == 0);
}

}  // namespace

TEST_CASE("send: streams from a mount received offline and online, equal to their sources", "[send-fuse]") {
  TempDir tmp;
  std::mt19937_64 r(42);
  const std::string a = tmp / "a.img", b = tmp / "b.img", c = tmp / "c.img";
  mkfs(a, "256M", tmp / "mkfs.log");
  mkfs(b, "256M", tmp / "mkfs.log");
  mkfs(c, "256M", tmp / "mkfs.log");
  const std::string s1 = tmp / "s1.stream", s2 = tmp / "s2.stream";
  Mount ma(a, tmp / "ma");
  ma.start();
  populate(ma.path(), r);
  REQUIRE(ctl(tmp, {"snapshot", ma.path(), "--name", "s1"}).rc == 0);
  json j1 = checked(tmp, "send", {"send", ma.path(), "s1", "-o", s1});
  CHECK(j1["branch"]["name"] == "s1");
  CHECK(j1["parent"].is_null());
  CHECK(j1["compression"] == "none");
  change(ma.path(), r);
  REQUIRE(ctl(tmp, {"snapshot", ma.path(), "--name", "s2"}).rc == 0);
  json j2 = checked(tmp, "send", {"send", ma.path(), "s2", "--parent", "s1", "--compress", "zstd:1", "-o", s2});
  CHECK(j2["parent"]["name"] == "s1");
  CHECK(j2["compression"] == "zstd:1");
  // The change, not the branch: 5 KiB, 70 KB and 300 KB of new data.
  CHECK(j2["data_bytes"].get<uint64_t>() < j1["data_bytes"].get<uint64_t>() / 2);

  // Offline, into b.
  json r1 = checked(tmp, "receive", {"receive", b, "-f", s1});
  CHECK(r1["branch"]["name"] == "s1");
  CHECK(r1["branch"]["writable"] == false);
  CHECK(r1["branch"]["received_uuid"] == j1["branch"]["uuid"]);
  CHECK(r1["parent"].is_null());
  CHECK(r1["items"] == j1["items"]);
  json r2 = checked(tmp, "receive", {"receive", b, "-f", s2, "--name", "second"});
  CHECK(r2["branch"]["name"] == "second");
  CHECK(r2["parent"]["name"] == "s1");
  // One new file of one extent: the text says "1 extent" ("of data").
  write_file(ma.path() + "/one", noise(65536, r));
  REQUIRE(ctl(tmp, {"snapshot", ma.path(), "--name", "s3"}).rc == 0);
  const std::string s3 = tmp / "s3.stream";
  json j3 = checked(tmp, "send", {"send", ma.path(), "s3", "--parent", "s2", "-o", s3});
  REQUIRE(j3["extents"] == 1);
  CtlOut t3 = ctl(tmp, {"receive", b, "-f", s3, "--name", "third"});
  REQUIRE(t3.rc == 0);
  INFO(t3.out);
  CHECK(t3.out.find(" on \"second\": ") != std::string::npos);
  CHECK(t3.out.find(", 1 extent of data (64.0 KiB)") != std::string::npos);

  // Online, into a mounted c: through the mount point, then the image's path.
  Mount mc(c, tmp / "mc");
  mc.start();
  CtlOut t1 = ctl(tmp, {"receive", mc.path(), "-f", s1});
  REQUIRE(t1.rc == 0);
  CHECK(t1.out.rfind("received \"s1\"", 0) == 0);
  json r3 = checked(tmp, "receive", {"receive", c, "-f", s2});
  CHECK(r3["branch"]["name"] == "s2");
  CHECK(r3["parent"]["name"] == "s1");

  // Through pipes at both ends, both online: send's standard output and
  // receive's standard input are pipes (the daemons take the descriptors).
  const std::string e = tmp / "e.img";
  mkfs(e, "256M", tmp / "mkfs.log");
  Mount me(e, tmp / "me");
  me.start();
  {
    const std::string cmd = "'" + plyctl_bin() + "' send '" + ma.path() + "' s1 | '" + plyctl_bin() +
                            "' receive '" + me.path() + "' --name piped > '" + (tmp / "pipe.out") + "' 2>&1";
    const int rc = std::system(cmd.c_str());
    INFO(read_file(tmp / "pipe.out"));
    REQUIRE(rc == 0);
    CHECK(read_file(tmp / "pipe.out").rfind("received \"piped\"", 0) == 0);
  }

  // A truncated stream and one whose parent is missing: one line, exit 1,
  // nothing received.
  const std::string d = tmp / "d.img";
  mkfs(d, "64M", tmp / "mkfs.log");
  const std::string cut = tmp / "cut.stream";
  write_file(cut, read_file(s1).substr(0, 5000));
  CtlOut bad = ctl(tmp, {"receive", d, "-f", cut, "--name", "cut"});
  CHECK(bad.rc == 1);
  CHECK(bad.err.find("not a valid plyfs stream") != std::string::npos);
  CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
  // The image holds the branch already: refused by its identity.
  CtlOut twice = ctl(tmp, {"receive", b, "-f", s1, "--name", "again"});
  CHECK(twice.rc == 1);
  CHECK(twice.err.find("already holds") != std::string::npos);
  CtlOut orphan = ctl(tmp, {"receive", d, "-f", s2});
  CHECK(orphan.rc == 1);
  CHECK(orphan.err.find("is not on this image") != std::string::npos);
  CtlOut listed = ctl(tmp, {"branch", "list", d});
  CHECK(listed.out.find("s2") == std::string::npos);
  // Usage errors: exit 2.
  CHECK(ctl(tmp, {"send", ma.path(), "s1", "-o", tmp / "x", "--compress", "zstd:99"}).rc == 2);
  CHECK(ctl(tmp, {"receive"}).rc == 2);

  // The received branches, seen through b's and c's control folders, equal
  // the snapshots seen through a's.
  Mount mb(b, tmp / "mb");
  mb.start();
  const std::string L = "/.plyfs/layers/";
  require_same(ma.path() + L + "s1/data", mb.path() + L + "s1/data");
  require_same(ma.path() + L + "s2/data", mb.path() + L + "second/data");
  require_same(ma.path() + L + "s1/data", mc.path() + L + "s1/data");
  require_same(ma.path() + L + "s2/data", mc.path() + L + "s2/data");
  require_same(ma.path() + L + "s1/data", me.path() + L + "piped/data");
  REQUIRE(me.unmount() == 0);
  REQUIRE(ma.unmount() == 0);
  REQUIRE(mb.unmount() == 0);
  REQUIRE(mc.unmount() == 0);
  for (const auto& img : {a, b, c, d, e}) require_fsck_clean(img, tmp / "fsck.log");
}

TEST_CASE("send: a file copied with cp between snapshots travels as a reference, not as data", "[send-fuse]") {
  // GNU cp copies with copy_file_range, which FUSE hands to the daemon and
  // plyfs answers with a reflink: the incremental stream refers to the
  // parent's data (SHARED source 2, format.md#send-stream), and the
  // receiver's copy shares its blocks as the sender's does.
  TempDir tmp;
  std::mt19937_64 r(5);
  const std::string a = tmp / "a.img", b = tmp / "b.img";
  mkfs(a, "256M", tmp / "mkfs.log");
  mkfs(b, "256M", tmp / "mkfs.log");
  const std::string s1 = tmp / "s1.stream", s2 = tmp / "s2.stream";
  Mount ma(a, tmp / "ma");
  ma.start();
  populate(ma.path(), r);
  write_file(ma.path() + "/big", noise(8 << 20, r));
  REQUIRE(ctl(tmp, {"snapshot", ma.path(), "--name", "s1"}).rc == 0);
  const uint64_t before_cp = free_blocks(ma.path());
  const std::string cmd = "cp '" + ma.path() + "/big' '" + ma.path() + "/d/copy' && cp '" + ma.path() +
                          "/big' '" + ma.path() + "/copy2'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  write_file(ma.path() + "/new", noise(40000, r));
  REQUIRE(ctl(tmp, {"snapshot", ma.path(), "--name", "s2"}).rc == 0);
  // The copies share the original's blocks on the sender.
  CHECK(before_cp - free_blocks(ma.path()) < 1024);
  json j1 = checked(tmp, "send", {"send", ma.path(), "s1", "-o", s1});
  json j2 = checked(tmp, "send", {"send", ma.path(), "s2", "--parent", "s1", "-o", s2});
  CHECK(j1["data_bytes"].get<uint64_t>() >= 8u << 20);
  CHECK(j2["data_bytes"].get<uint64_t>() < 64u << 10);  // the 40 KB file, not 16 MiB of copies
  CHECK(j2["shared"].get<uint64_t>() >= 2);

  Mount mb(b, tmp / "mb");
  mb.start();
  (void)checked(tmp, "receive", {"receive", mb.path(), "-f", s1});
  const uint64_t before = free_blocks(mb.path());
  (void)checked(tmp, "receive", {"receive", mb.path(), "-f", s2});
  CHECK(before - free_blocks(mb.path()) < 1024);  // 4 MiB: the new file and metadata, not 16 MiB
  const std::string L = "/.plyfs/layers/";
  require_same(ma.path() + L + "s2/data", mb.path() + L + "s2/data");
  REQUIRE(ma.unmount() == 0);
  REQUIRE(mb.unmount() == 0);
  for (const auto& img : {a, b}) require_fsck_clean(img, tmp / "fsck.log");
}
