// A damaged data block: reading it is EIO, the mount turns read-only, and
// the daemon neither crashes nor hangs.
#include <sys/xattr.h>

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
