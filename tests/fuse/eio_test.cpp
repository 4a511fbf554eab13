// A damaged data block: reading it is EIO, the mount turns read-only, and
// the daemon neither crashes nor hangs.
#include <sys/xattr.h>

#include <set>

#include "fuse_util.h"

using namespace plyfs::fusetest;

namespace {

// The offsets in the image file of the 4 KiB blocks equal to `blk`.
std::vector<uint64_t> find_block(const std::string& img, const std::string& blk) {
  std::vector<uint64_t> out;
  int fd = ::open(img.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::string buf(8 << 20, '\0');
  for (uint64_t off = 0;; off += buf.size()) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), off_t(off));
    REQUIRE(n >= 0);
    if (n == 0) break;
    for (size_t p = 0; p + blk.size() <= size_t(n); p += 4096)
      if (std::memcmp(buf.data() + p, blk.data(), blk.size()) == 0) out.push_back(off + p);
  }
  ::close(fd);
  return out;
}

}  // namespace

TEST_CASE("a corrupt data block reads as EIO and turns the mount read-only", "[eio]") {
  const uint64_t s = seed("eio");
  std::mt19937_64 rng(s);
  Fixture fx("128M");
  // Three blocks of random data: the middle one gets damaged.
  std::vector<std::string> blocks;
  for (int i = 0; i < 3; i++) blocks.push_back(random_bytes(rng, 4096));
  write_file(fx / "victim", blocks[0] + blocks[1] + blocks[2]);
  const std::string other = random_bytes(rng, 100000);
  write_file(fx / "other", other);
  REQUIRE(::mkdir((fx / "dir").c_str(), 0755) == 0);
  fx.unmount();

  auto at = find_block(fx.img, blocks[1]);
  REQUIRE(at.size() == 1);
  {
    int fd = ::open(fx.img.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    char c;
    REQUIRE(::pread(fd, &c, 1, off_t(at[0] + 1234)) == 1);
    c = char(c ^ 0x20);
    REQUIRE(::pwrite(fd, &c, 1, off_t(at[0] + 1234)) == 1);
    ::close(fd);
  }

  fx.mount();
  // Other files read fine before and after the damage is found.
  REQUIRE_SAME(read_file(fx / "other"), other);
  int fd = ::open((fx / "victim").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::string buf(4096, '\0');
  REQUIRE_ERRNO(::pread(fd, buf.data(), buf.size(), 4096), EIO);
  ::close(fd);
  // The mount is read-only now: changes fail with EROFS.
  struct stat st;
  REQUIRE_ERRNO(::open((fx / "new").c_str(), O_CREAT | O_WRONLY, 0644), EROFS);
  REQUIRE_ERRNO(::lstat((fx / "new").c_str(), &st), ENOENT);
  REQUIRE_ERRNO(::mkdir((fx / "dir2").c_str(), 0755), EROFS);
  REQUIRE_ERRNO(::open((fx / "other").c_str(), O_WRONLY), EROFS);
  REQUIRE_ERRNO(::truncate((fx / "other").c_str(), 10), EROFS);
  REQUIRE_ERRNO(::unlink((fx / "other").c_str()), EROFS);
  REQUIRE_ERRNO(::rmdir((fx / "dir").c_str()), EROFS);
  REQUIRE_ERRNO(::rename((fx / "other").c_str(), (fx / "o2").c_str()), EROFS);
  REQUIRE_ERRNO(::symlink("x", (fx / "sl").c_str()), EROFS);
  REQUIRE_ERRNO(::chmod((fx / "other").c_str(), 0600), EROFS);
  REQUIRE_ERRNO(::setxattr((fx / "other").c_str(), "user.x", "1", 1, 0), EROFS);
  // Reads still work.
  REQUIRE_SAME(read_file(fx / "other"), other);
  REQUIRE(list_dir(fx.root()) == std::vector<std::string>{"dir", "other", "victim"});
  struct statvfs v;
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);

  // The daemon exits by itself at the unmount, without a crash.
  int rc = fx.m->unmount();
  const std::string log = fx.m->log();
  INFO("plyfs exit status " << rc << ", log:\n" << log);
  REQUIRE(rc < 128);
  REQUIRE(log.find("checksum") != std::string::npos);
  REQUIRE(log.find("Sanitizer") == std::string::npos);
  REQUIRE(log.find("runtime error") == std::string::npos);
  fx.m.reset();

  // The image still mounts; the damage is still found, the rest is intact.
  fx.mount();
  REQUIRE_SAME(read_file(fx / "other"), other);
  fd = ::open((fx / "victim").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE_ERRNO(::pread(fd, buf.data(), buf.size(), 4096), EIO);
  ::close(fd);
  rc = fx.m->unmount();
  REQUIRE(rc < 128);
  fx.m.reset();
}

namespace {

// Everything under `dir`, read the way a user would (stat, readdir,
// read, readlink, listxattr, getxattr): returns how many calls failed, and
// the errnos they failed with.
int walk(const std::string& dir, std::set<int>& errs, int depth = 0) {
  int failed = 0;
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    errs.insert(errno);
    return 1;
  }
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.push_back(e->d_name);
  if (errno) errs.insert(errno), failed++;
  ::closedir(d);
  for (const auto& n : names) {
    const std::string p = dir + "/" + n;
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) {
      errs.insert(errno);
      failed++;
      continue;
    }
    char buf[65536];
    const ssize_t nl = ::llistxattr(p.c_str(), buf, sizeof buf);
    if (nl < 0) errs.insert(errno), failed++;
    std::vector<std::string> xnames;
    for (ssize_t i = 0; i < nl; i += ssize_t(std::strlen(buf + i)) + 1) xnames.emplace_back(buf + i);
    for (const auto& x : xnames)
      if (::lgetxattr(p.c_str(), x.c_str(), buf, sizeof buf) < 0) errs.insert(errno), failed++;
    if (S_ISDIR(st.st_mode) && depth < 8) {
      failed += walk(p, errs, depth + 1);
    } else if (S_ISLNK(st.st_mode)) {
      if (::readlink(p.c_str(), buf, sizeof buf) < 0) errs.insert(errno), failed++;
    } else if (S_ISREG(st.st_mode)) {
      int fd = ::open(p.c_str(), O_RDONLY);
      if (fd < 0) {
        errs.insert(errno);
        failed++;
        continue;
      }
      for (int n = 0; n < 16; n++) {  // the first MiB: a damaged size may be a terabyte
        ssize_t r = ::read(fd, buf, sizeof buf);
        if (r < 0) errs.insert(errno), failed++;
        if (r <= 0) break;
      }
      ::close(fd);
    }
  }
  return failed;
}

}  // namespace

TEST_CASE("a mount of an image with damaged filesystem items answers EIO and does not crash", "[eio]") {
  // Damage made with plyctl debug corrupt (named fields, checksums right):
  // only the filesystem layer's decoding stands between it and the daemon.
  Fixture fx("64M");
  REQUIRE(::mkdir((fx / "d").c_str(), 0755) == 0);
  write_file(fx / "d/small", "inline data");
  std::mt19937_64 rng(seed("eio-items"));
  write_file(fx / "d/big", random_bytes(rng, 300000));
  REQUIRE(::symlink("d/small", (fx / "sym").c_str()) == 0);
  REQUIRE(::setxattr((fx / "d/big").c_str(), "user.k", "v", 1, 0) == 0);
  const std::string large = random_bytes(rng, 20000);  // out of line, 21 chunks
  REQUIRE(::setxattr((fx / "d/big").c_str(), "user.L", large.data(), large.size(), 0) == 0);
  const uint64_t d = lstat_of(fx / "d").st_ino, small = lstat_of(fx / "d/small").st_ino,
                 big = lstat_of(fx / "d/big").st_ino, sym = lstat_of(fx / "sym").st_ino;
  fx.unmount();
  const std::string pristine = fx.tmp / "pristine";
  REQUIRE(run({"/bin/cp", "--sparse=always", fx.img, pristine}, fx.tmp / "cp.log") == 0);

  const std::vector<std::vector<std::string>> damages{
      {"inode", "main", std::to_string(small), "size", "--set", "1000000000"},
      {"inode", "main", std::to_string(big), "size", "--set", "1099511627776"},
      {"inode", "main", std::to_string(d), "mode", "--zero"},
      {"inode", "main", std::to_string(sym), "size", "--set", "70000"},
      {"dirent", "main", std::to_string(d), "big", "ino", "--set", "99999"},
      {"dirent", "main", std::to_string(d), "small", "name_len", "--set", "255"},
      {"xattr", "main", std::to_string(big), "user.k", "value_len", "--set", "65535"},
      {"xattr", "main", std::to_string(big), "user.L", "outline.length", "--set", "70000"},
      {"xattr", "main", std::to_string(big), "user.L", "outline.value_id", "--add", "1"},
      {"xattr-chunk", "main", std::to_string(big), "user.L", "984", "length", "--set", "100"},
      {"extent", "main", std::to_string(big), "0", "nblocks", "--set", "4000000000"},
      {"extent", "main", std::to_string(big), "0", "disk_start", "--set", "1152921504606846976"},
      {"inline", "main", std::to_string(small), "0", "length", "--set", "600"},
      {"fsinfo", "main", "root_ino", "--set", "12345"},
      {"inode", "main", std::to_string(d), "key.hi", "--set", "1000000"},
  };
  for (const auto& dmg : damages) {
    std::string label;
    for (const auto& a : dmg) label += a + " ";
    INFO(label);
    REQUIRE(run({"/bin/cp", "--sparse=always", pristine, fx.img}, fx.tmp / "cp.log") == 0);
    std::vector<std::string> argv{plyctl_bin(), "debug", "corrupt", fx.img};
    argv.insert(argv.end(), dmg.begin(), dmg.end());
    REQUIRE(run(argv, fx.tmp / "corrupt.log") == 0);
    for (const char* log : {"mnt.log", "fsck.log"}) ::unlink((fx.tmp / log).c_str());
    // The daemon either refuses to mount the image with a clear error, or
    // serves it: damaged objects answer an error, the daemon stays up, and
    // an unmount is clean (the damage was not made worse).
    std::vector<std::string> args{plyfs_bin(), fx.img, fx.tmp / "mnt", "-f"};
    const pid_t pid = spawn(args, fx.tmp / "mnt.log");
    bool mounted = false;
    const dev_t before = dev_of(fx.tmp / "");
    for (int i = 0; i < 3000; i++) {
      int st;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        // Refused: it must have said why, and exited non-zero.
        CHECK((WIFEXITED(st) && WEXITSTATUS(st) != 0));
        CHECK(slurp(fx.tmp / "mnt.log").find("plyfs") != std::string::npos);
        break;
      }
      const dev_t now = dev_of(fx.tmp / "mnt");
      if (now != dev_t(-1) && now != before) {
        mounted = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!mounted) continue;
    std::set<int> errs;
    const int failed = walk(fx.tmp / "mnt", errs);
    UNSCOPED_INFO(label << ": " << failed << " calls failed");
    for (int e : errs) CHECK((e == EIO || e == ENOENT || e == ESTALE || e == ENODATA));
    CHECK(::kill(pid, 0) == 0);  // still serving
    // Still answers after the errors.
    struct statvfs sv;
    CHECK(::statvfs((fx.tmp / "mnt").c_str(), &sv) == 0);
    REQUIRE(umount2((fx.tmp / "mnt").c_str(), 0) == 0);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    INFO("plyfs log:\n" << slurp(fx.tmp / "mnt.log"));
    // fsck -y then repairs it (a clean image after) or cleanly refuses
    // (the same verdict after).
    const int y = run({fsck_bin(), "-y", fx.img}, fx.tmp / "fsck.log");
    INFO("fsck:\n" << slurp(fx.tmp / "fsck.log"));
    CHECK((y == 0 || y == 1 || y == 4));  // 0: a value a program could have written
    CHECK(run({fsck_bin(), "-n", fx.img}, fx.tmp / "fsck.log") == (y == 4 ? 4 : 0));
  }
}
