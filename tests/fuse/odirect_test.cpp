// plyfs -o odirect (format.md#device-direct): the image opened with O_DIRECT,
// writes queued in the daemon. What a user relies on: nothing of the image
// lands in the host's page cache, every byte comes back, a commit's data is
// durable when the commit says so, and a full host filesystem turns the
// mount read-only with the last commit intact.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <random>

#include "../page_cache.h"
#include "fuse_util.h"

using namespace plyfs::fusetest;
using plyfs::test::resident_pages;
using plyfs::test::seed;

namespace {

// On the real disk: /var/tmp has O_DIRECT; TempDir's default, tmpfs, is
// opened buffered (its page cache is the file itself).
constexpr const char* kDisk = "/var/tmp";

// Drops the image's pages from the host's page cache (mkfs wrote it buffered).
void drop_cached(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(fdatasync(fd) == 0);
  REQUIRE(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  close(fd);
}

// Files of random sizes and bytes, written through the mount.
std::map<std::string, std::string> write_files(const Mount& m, std::mt19937_64& rng, int n,
                                               size_t max_bytes, const std::string& prefix = "f") {
  std::map<std::string, std::string> files;
  for (int i = 0; i < n; i++) {
    const std::string name = prefix + std::to_string(i);
    files[name] = random_bytes(rng, 1 + rng() % max_bytes);
    write_file(m / name, files[name]);
  }
  return files;
}

void require_files(const Mount& m, const std::map<std::string, std::string>& files) {
  for (const auto& [name, data] : files) {
    INFO(name);
    REQUIRE(read_file(m / name) == data);
  }
}

}  // namespace

TEST_CASE("odirect: the image stays out of the host's page cache, and every byte comes back", "[odirect]") {
  TempDir dir(kDisk);
  const std::string img = dir / "image";
  mkfs(img, "1G", dir / "mkfs.log");
  std::mt19937_64 rng(seed("odirect"));
  std::map<std::string, std::string> files;
  uint64_t cached_direct = 0, cached_buffered = 0;
  for (bool direct : {true, false}) {
    drop_cached(img);
    Mount m(img, dir / "mnt", direct ? std::vector<std::string>{"odirect"} : std::vector<std::string>{});
    m.start();
    files.merge(write_files(m, rng, 40, 2 << 20, direct ? "direct" : "buffered"));  // about 40 MiB
    REQUIRE(run({plyctl_bin(), "sync", m.path()}, dir / "sync.log") == 0);
    (direct ? cached_direct : cached_buffered) = resident_pages(img) * uint64_t(sysconf(_SC_PAGESIZE));
    require_files(m, files);
    INFO("plyfs log:\n" << m.log());
    REQUIRE(m.unmount() == 0);
  }
  INFO("cached with -o odirect: " << cached_direct << " bytes; without: " << cached_buffered);
  // The check can fail: without the option the host caches what was written.
  REQUIRE(cached_buffered > (16u << 20));
  REQUIRE(cached_direct < (1u << 20));
  require_fsck_clean(img, dir / "fsck.log");
  Mount m(img, dir / "mnt", {"odirect"});
  m.start();
  require_files(m, files);
  REQUIRE(m.unmount() == 0);
}

TEST_CASE("odirect: a host filesystem that fills up turns the mount read-only, the last commit intact",
          "[odirect]") {
  TempDir tmp;
  TempDir disk(kDisk);
  // A sparse 1 GiB image on a host filesystem of 64 MiB: an ext4 on a loop
  // device (tmpfs would not be opened O_DIRECT: its page cache is the file).
  const std::string host = tmp / "host", fs_img = disk / "host.ext4";
  REQUIRE(::mkdir(host.c_str(), 0755) == 0);
  {
    int fd = ::open(fs_img.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 64 << 20) == 0);
    ::close(fd);
  }
  REQUIRE(run({"/usr/sbin/mkfs.ext4", "-q", "-F", fs_img}, tmp / "mkfs.ext4.log") == 0);
  REQUIRE(run({"/usr/bin/mount", "-o", "loop", fs_img, host}, tmp / "mount.log") == 0);
  struct Unmount {
    std::string d;
    ~Unmount() {
      if (::umount2(d.c_str(), 0) != 0) ::umount2(d.c_str(), MNT_DETACH);
    }
  } um{host};
  const std::string img = host + "/image";
  mkfs(img, "1G", tmp / "mkfs.log");
  std::mt19937_64 rng(seed("odirect-full"));
  Mount m(img, tmp / "mnt", {"odirect"});
  m.start();
  auto files = write_files(m, rng, 8, 1 << 20);
  REQUIRE(run({plyctl_bin(), "sync", m.path()}, tmp / "sync.log") == 0);
  // 96 MiB more than the host can take: a write or the commit after it fails.
  const std::string big = random_bytes(rng, 1 << 20);
  for (int i = 0; i < 96; i++) {
    int fd = ::open((m / ("big" + std::to_string(i))).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) break;
    const bool wrote = ::write(fd, big.data(), big.size()) == static_cast<ssize_t>(big.size());
    if (::close(fd) != 0 || !wrote) break;
  }
  REQUIRE(run({plyctl_bin(), "sync", m.path()}, tmp / "sync2.log") != 0);
  // Read-only from then on: nothing claims durability after the failure (D4).
  const int fd = ::open((m / "after").c_str(), O_WRONLY | O_CREAT, 0644);
  const int e = errno;
  if (fd >= 0) ::close(fd);
  INFO("create after the failure: " << (fd >= 0 ? "done" : std::strerror(e)));
  REQUIRE(fd < 0);
  REQUIRE(run({plyctl_bin(), "sync", m.path()}, tmp / "sync3.log") != 0);
  m.unmount();
  // What the first sync committed is there, whole, and fsck finds nothing wrong.
  require_fsck_clean(img, tmp / "fsck.log");
  Mount again(img, tmp / "mnt", {"ro"});
  again.start();
  require_files(again, files);
  REQUIRE(again.unmount() == 0);
}
