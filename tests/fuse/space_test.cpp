// Freed space back to the host (format.md#discard): -o discard punches what
// each generation frees out of the image file once it is durable; without
// it, `plyctl trim` (on the mount point or the unmounted image) and fstrim(8)
// on the mount point do it on demand. The image lives on a tmpfs, whose
// st_blocks counts the pages a file really holds, as a thin device would.
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/statvfs.h>

#include <set>

#include <nlohmann/json.hpp>

#include "fuse_util.h"
#include "json_schema.h"

using namespace plyfs::fusetest;
using Json = nlohmann::json;

namespace {

constexpr uint64_t kMiB = 1 << 20;

uint64_t allocated(const std::string& path) {
  struct stat st{};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return uint64_t(st.st_blocks) * 512;
}

// `mib` MiB of data that no block layer could mistake for zeros.
void write_big(const std::string& path, uint64_t mib, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::string chunk = random_bytes(rng, kMiB);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  for (uint64_t i = 0; i < mib; i++) pwrite_all(fd, chunk.data(), chunk.size(), off_t(i * kMiB));
  REQUIRE(::fsync(fd) == 0);
  ::close(fd);
}

// Deletes `path` and makes the deletion durable (fsync of its directory
// commits a generation).
void remove_durably(const std::string& path) {
  REQUIRE(::unlink(path.c_str()) == 0);
  const std::string dir = path.substr(0, path.rfind('/'));
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::fsync(fd) == 0);
  ::close(fd);
}

}  // namespace

TEST_CASE("space: -o discard gives a deleted file's blocks back to the image file within a commit",
          "[space]") {
  Fixture fx("512M", {"discard", "commit=1"});
  std::mt19937_64 rng(7);
  const std::string keep = random_bytes(rng, 3 * kMiB + 123);
  write_file(fx / "keep", keep);
  write_big(fx / "big", 128, 1);
  const uint64_t full = allocated(fx.img);
  REQUIRE(full >= 128 * kMiB);
  remove_durably(fx / "big");
  // The generation that freed the blocks is durable once fsync returned;
  // its commit discards them. Allow one more commit interval for the
  // kernel's release to reach the daemon.
  uint64_t now = allocated(fx.img);
  for (int i = 0; i < 40 && full - std::min(full, now) < 128 * kMiB * 99 / 100; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    now = allocated(fx.img);
  }
  INFO("allocated " << full << " -> " << now);
  REQUIRE(full - std::min(full, now) >= 128 * kMiB * 99 / 100);
  REQUIRE(read_file(fx / "keep") == keep);
  // The blocks are handed out again: the same amount fits once more.
  write_big(fx / "big2", 128, 2);
  REQUIRE(read_file(fx / "keep") == keep);
  fx.unmount();  // fsck -fn clean
}

TEST_CASE("space: without -o discard, plyctl trim and fstrim give free space back, online and offline",
          "[space]") {
  Fixture fx("512M", {"commit=1"});
  std::mt19937_64 rng(8);
  const std::string keep = random_bytes(rng, 5 * kMiB + 7);
  write_file(fx / "keep", keep);
  write_big(fx / "big", 64, 3);
  const uint64_t full = allocated(fx.img);
  remove_durably(fx / "big");
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two commit intervals
  // Nothing is discarded without the option.
  REQUIRE(allocated(fx.img) + 4 * kMiB >= full);

  // plyctl trim on the mount point: JSON of the schema's Trim, and the
  // image file shrinks by what was freed.
  std::string out;
  plyctl(fx, {"trim", fx.root(), "--json"}, &out);
  const Json j = Json::parse(out);
  REQUIRE(j["trimmed_bytes"].get<uint64_t>() >= 64 * kMiB);
  REQUIRE(j["minimum_bytes"].get<uint64_t>() == 0);
  const uint64_t trimmed = allocated(fx.img);
  INFO("allocated " << full << " -> " << trimmed);
  REQUIRE(full - std::min(full, trimmed) >= 64 * kMiB * 99 / 100);
  REQUIRE(read_file(fx / "keep") == keep);

  // fstrim(8) on the mount point: the FITRIM ioctl, with fstrim's report.
  write_big(fx / "big", 32, 4);
  const uint64_t full2 = allocated(fx.img);
  remove_durably(fx / "big");
  {
    const int fd = ::open(fx.root().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    fstrim_range r{0, UINT64_MAX, 0};
    const int rc = ::ioctl(fd, FITRIM, &r);
    const int e = errno;
    ::close(fd);
    INFO("FITRIM: " << errstr(rc ? e : 0));
    REQUIRE(rc == 0);
    REQUIRE(r.len >= 32 * kMiB);
  }
  REQUIRE(full2 - std::min(full2, allocated(fx.img)) >= 32 * kMiB * 99 / 100);
  const std::string log = fx.tmp / "fstrim.log";
  write_big(fx / "big", 16, 5);
  remove_durably(fx / "big");
  REQUIRE(run({"/sbin/fstrim", "-v", fx.root()}, log) == 0);
  INFO(slurp(log));
  REQUIRE(slurp(log).find("trimmed") != std::string::npos);
  REQUIRE(read_file(fx / "keep") == keep);
  // The image path of a mounted image: its daemon trims.
  write_big(fx / "big", 16, 7);
  const uint64_t full4 = allocated(fx.img);
  remove_durably(fx / "big");
  plyctl(fx, {"trim", fx.img}, &out);
  REQUIRE(out.find("bytes) trimmed") != std::string::npos);
  REQUIRE(full4 - std::min(full4, allocated(fx.img)) >= 16 * kMiB * 99 / 100);

  // Offline, on the image.
  write_big(fx / "big", 32, 6);
  remove_durably(fx / "big");
  fx.unmount();
  const uint64_t full3 = allocated(fx.img);
  plyctl(fx, {"trim", fx.img}, &out);
  REQUIRE(out.find("bytes) trimmed") != std::string::npos);
  REQUIRE(full3 - std::min(full3, allocated(fx.img)) >= 32 * kMiB * 99 / 100);
  require_fsck_clean(fx.img, fx.tmp / "fsck2.log");
  fx.mount();
  REQUIRE(read_file(fx / "keep") == keep);

  // Bad input: a one-line usage error (2); a read-only mount refuses.
  REQUIRE(plyctl_status(fx, {"trim"}) == 2);
  REQUIRE(plyctl_status(fx, {"trim", fx.root(), "--minimum", "lots"}) == 2);
  fx.unmount();
  fx.opts = {"ro"};
  fx.mount();
  REQUIRE(plyctl_status(fx, {"trim", fx.root()}) == 1);
  fx.unmount();
}

// Issue 24's sequence: a snapshot holds the old data, so rewriting it runs
// out of space; deleting the snapshot online (it is not in the mount's
// stack) frees its exclusive blocks at once, and the write that failed
// succeeds right after, without an unmount.
TEST_CASE("space: deleting a snapshot online gets a full mount out of ENOSPC", "[space]") {
  Fixture fx("64M");
  std::mt19937_64 rng(9);
  const std::string data = random_bytes(rng, 40 * kMiB);
  write_file(fx / "f", data);
  plyctl(fx, {"snapshot", fx.root(), "--name", "s1"});
  remove_durably(fx / "f");
  // 40 MiB more cannot fit beside the 40 MiB the snapshot holds.
  auto write_all = [&](const std::string& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    int err = 0;
    for (size_t off = 0; off < data.size() && !err; off += kMiB)
      if (::pwrite(fd, data.data() + off, kMiB, off_t(off)) != off_t(kMiB)) err = errno;
    if (!err && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    return err;
  };
  const int first = write_all(fx / "g");
  INFO("first write: " << errstr(first));
  REQUIRE(first == ENOSPC);
  std::string out;
  plyctl(fx, {"delete", fx.root(), "s1"}, &out);
  REQUIRE(out.find("deleted branch \"s1\"") != std::string::npos);
  const int second = write_all(fx / "g");
  INFO("after the delete: " << errstr(second));
  REQUIRE(second == 0);
  REQUIRE(read_file(fx / "g") == data);
  // The snapshot is gone from the image, not just from the stack.
  struct stat st{};
  REQUIRE(::lstat((fx / ".plyfs/layers/s1").c_str(), &st) != 0);
  REQUIRE(errno == ENOENT);
  fx.unmount();
  plyctl(fx, {"branch", "list", fx.img}, &out);
  REQUIRE(out.find("s1") == std::string::npos);
}

// An image file that was enlarged shows its new size only after plyctl
// resize: online (max: the file's size) and offline (a size: the file is
// extended), each in one generation; a shrink below what is used is
// refused and changes nothing.
TEST_CASE("space: plyctl resize grows a mounted image and an unmounted one", "[space]") {
  Fixture fx("64M");
  std::mt19937_64 rng(10);
  const std::string a = random_bytes(rng, 40 * kMiB);
  write_file(fx / "a", a);
  struct statvfs v{};
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);
  const uint64_t small = uint64_t(v.f_blocks) * v.f_frsize;
  REQUIRE(small <= 64 * kMiB);
  REQUIRE(::truncate(fx.img.c_str(), off_t(256 * kMiB)) == 0);  // the host file grew
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);
  REQUIRE(uint64_t(v.f_blocks) * v.f_frsize == small);  // not yet inside
  std::string out;
  plyctl(fx, {"resize", fx.root(), "max", "--json"}, &out);
  const Json j = Json::parse(out);
  REQUIRE(j["old_bytes"].get<uint64_t>() == 64 * kMiB);
  REQUIRE(j["size_bytes"].get<uint64_t>() == 256 * kMiB);
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);
  REQUIRE(uint64_t(v.f_blocks) * v.f_frsize > 250 * kMiB);
  const std::string b = random_bytes(rng, 150 * kMiB);
  write_file(fx / "b", b);  // more than the old size could hold
  // The image path of a mounted image: its daemon grows it.
  plyctl(fx, {"resize", fx.img, "300M"}, &out);
  REQUIRE(out.find("resized from 256 MiB to 300 MiB") != std::string::npos);
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);
  REQUIRE(uint64_t(v.f_blocks) * v.f_frsize > 290 * kMiB);
  fx.unmount();  // fsck -fn clean

  // Offline: to a size, extending the file.
  plyctl(fx, {"resize", fx.img, "1G"}, &out);
  REQUIRE(out.find("resized from 300 MiB to 1.00 GiB") != std::string::npos);
  struct stat st{};
  REQUIRE(::stat(fx.img.c_str(), &st) == 0);
  REQUIRE(uint64_t(st.st_size) == 1024 * kMiB);
  // A shrink below what is used: refused, nothing changed.
  REQUIRE(plyctl_status(fx, {"resize", fx.img, "128M"}, &out) == 1);
  REQUIRE(out.find("in use") != std::string::npos);
  REQUIRE(::stat(fx.img.c_str(), &st) == 0);
  REQUIRE(uint64_t(st.st_size) == 1024 * kMiB);
  REQUIRE(plyctl_status(fx, {"resize", fx.img, "lots"}) == 2);
  REQUIRE(plyctl_status(fx, {"resize", fx.img}) == 2);
  require_fsck_clean(fx.img, fx.tmp / "fsck2.log");
  fx.mount();
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);
  REQUIRE(uint64_t(v.f_blocks) * v.f_frsize > 1000 * kMiB);
  REQUIRE(read_file(fx / "a") == a);
  REQUIRE(read_file(fx / "b") == b);
  fx.unmount();
}

// Shrinking (format.md#relocation), as a user would: files written in
// order, the first deleted, a snapshot holding the rest, one more written
// past where the image will end; `plyctl resize MOUNTPOINT SIZE` moves it
// below the new end while the mount goes on, the image file is cut, every
// file and the snapshot read back, fsck is clean; then offline again.
TEST_CASE("space: plyctl resize shrinks a mounted image and an unmounted one, moving what lies past the end",
          "[space]") {
  Fixture fx("512M", {"commit=1"});
  std::mt19937_64 rng(12);
  const std::string a = random_bytes(rng, 40 * kMiB), b = random_bytes(rng, 100 * kMiB),
                    c = random_bytes(rng, 100 * kMiB) + "tail", d = random_bytes(rng, 30 * kMiB + 7);
  write_file(fx / "a", a);
  write_file(fx / "b", b);
  write_file(fx / "c", c);
  remove_durably(fx / "a");
  plyctl(fx, {"snapshot", fx.root(), "--name", "s1"});
  write_file(fx / "d", d);  // past 240 MiB: where the image will end
  ::sync();
  std::string out;
  plyctl(fx, {"resize", fx.root(), "250M", "--json"}, &out);
  const Json j = Json::parse(out);
  CHECK(j["old_bytes"].get<uint64_t>() == 512 * kMiB);
  REQUIRE(j["size_bytes"].get<uint64_t>() == 250 * kMiB);
  // d's part past 250 MiB, at least, moved below.
  CHECK(j["moved_bytes"].get<uint64_t>() >= 15 * kMiB);
  CHECK(j["moved_bytes"].get<uint64_t>() < 200 * kMiB);
  struct stat st{};
  REQUIRE(::stat(fx.img.c_str(), &st) == 0);
  CHECK(uint64_t(st.st_size) == 250 * kMiB);  // the image file was cut
  struct statvfs v{};
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);
  CHECK(uint64_t(v.f_blocks) * v.f_frsize <= 250 * kMiB);
  REQUIRE(read_file(fx / "b") == b);
  REQUIRE(read_file(fx / "c") == c);
  REQUIRE(read_file(fx / "d") == d);
  REQUIRE(read_file(fx / ".plyfs/layers/s1/data/c") == c);
  // The mount goes on: a write after the shrink, then its deletion.
  write_file(fx / "e", "after");
  REQUIRE(read_file(fx / "e") == "after");
  // Below what is used: refused, the size kept.
  REQUIRE(plyctl_status(fx, {"resize", fx.root(), "100M"}, &out) == 1);
  REQUIRE(::stat(fx.img.c_str(), &st) == 0);
  CHECK(uint64_t(st.st_size) == 250 * kMiB);
  fx.unmount();  // fsck -fn clean

  // Offline, with a progress line on a terminal-less stderr, to 240 MiB.
  plyctl(fx, {"resize", fx.img, "240M"}, &out);
  REQUIRE(out.find("resized from 250 MiB to 240 MiB") != std::string::npos);
  REQUIRE(::stat(fx.img.c_str(), &st) == 0);
  CHECK(uint64_t(st.st_size) == 240 * kMiB);
  require_fsck_clean(fx.img, fx.tmp / "fsck-shrunk.log");
  fx.mount();
  REQUIRE(read_file(fx / "b") == b);
  REQUIRE(read_file(fx / "c") == c);
  REQUIRE(read_file(fx / "d") == d);
  REQUIRE(read_file(fx / ".plyfs/layers/s1/data/b") == b);
  fx.unmount();
}

// Space accounting (format.md#accounting): plyctl du, branch list --json and
// info.json agree, on a mount and offline; a snapshot that alone holds a
// deleted file reports exactly its data as exclusive; deleting it online
// gives back those bytes (statfs), and the live branch's figures follow.
TEST_CASE("space: du, branch list and info.json report referenced and exclusive bytes", "[space]") {
  Fixture fx("256M", {"commit=1"});
  const SchemaValidator schema(Json::parse(slurp(tool("PLYFS_SCHEMA"))));
  auto json_of = [&](std::vector<std::string> args, const std::string& command) {
    std::string out;
    args.push_back("--json");
    plyctl(fx, args, &out);
    INFO(out);
    Json j = Json::parse(out);
    auto problems = schema.validate(j, schema.command(command));
    for (const auto& p : problems) UNSCOPED_INFO(p);
    CHECK(problems.empty());
    return j;
  };
  write_big(fx / "f", 16, 11);
  plyctl(fx, {"snapshot", fx.root(), "--name", "s1"});
  // 4 MiB of f rewritten, a new file, then f deleted: s1 alone reaches f's
  // old 16 MiB; main reaches its 8 MiB of g.
  {
    std::mt19937_64 rng(12);
    const std::string chunk = random_bytes(rng, 4 * kMiB);
    const int fd = ::open((fx / "f").c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    pwrite_all(fd, chunk.data(), chunk.size(), 0);
    REQUIRE(::fsync(fd) == 0);
    ::close(fd);
  }
  write_big(fx / "g", 8, 13);
  remove_durably(fx / "f");

  Json one = json_of({"du", fx.root(), "s1"}, "du");
  REQUIRE(one["branches"].size() == 1);
  const Json s1 = one["branches"][0];
  CHECK(s1["branch"] == "s1");
  CHECK(s1["referenced"]["data"].get<uint64_t>() == 16 * kMiB);
  CHECK(s1["exclusive"]["data"].get<uint64_t>() == 16 * kMiB);
  CHECK(s1["exclusive"]["metadata"].get<uint64_t>() > 0);
  CHECK(s1["referenced"]["total"].get<uint64_t>() ==
        s1["referenced"]["data"].get<uint64_t>() + s1["referenced"]["metadata"].get<uint64_t>());
  CHECK(one["volume"]["exclusive"].is_null());

  Json all = json_of({"du", fx.root()}, "du");
  Json main_du;
  for (const auto& b : all["branches"])
    if (b["branch"] == "main") main_du = b;
  REQUIRE(main_du.is_object());
  CHECK(main_du["referenced"]["data"].get<uint64_t>() == 8 * kMiB);
  CHECK(main_du["exclusive"]["data"].get<uint64_t>() == 8 * kMiB);
  CHECK(all["volume"]["exclusive"].get<uint64_t>() >=
        main_du["exclusive"]["total"].get<uint64_t>() + s1["exclusive"]["total"].get<uint64_t>());
  CHECK(all["volume"]["used"].get<uint64_t>() >= 24 * kMiB);

  // branch list --json and info.json carry the same figures.
  Json list = json_of({"branch", "list", fx.root(), "--all"}, "branch list IMAGE");
  bool seen = false;
  for (const auto& b : list)
    if (b["name"] == "s1") {
      seen = true;
      CHECK(b["space"]["exclusive"] == s1["exclusive"]);
      CHECK(b["space"]["referenced"] == s1["referenced"]);
    }
  CHECK(seen);
  const Json info = Json::parse(slurp(fx / ".plyfs/layers/s1/info.json"));
  CHECK(info["space"]["exclusive"] == s1["exclusive"]);

  // The text forms.
  std::string out;
  plyctl(fx, {"du", fx.root()}, &out);
  CHECK(out.find("REFERENCED") != std::string::npos);
  CHECK(out.find("held by one branch alone") != std::string::npos);
  plyctl(fx, {"du", fx.root(), "s1"}, &out);
  INFO(out);
  CHECK(out.find("what deleting it frees") != std::string::npos);
  CHECK(out.find("exclusive:  16.") != std::string::npos);
  CHECK(out.find("(data 16.0 MiB") != std::string::npos);

  // Deleting s1 online frees its exclusive bytes: statfs's free blocks
  // grow by them, give or take the catalog's and root tree's own nodes.
  plyctl(fx, {"sync", fx.root()});
  plyctl(fx, {"sync", fx.root()});
  const uint64_t before = free_blocks(fx.root());
  plyctl(fx, {"delete", fx.root(), "s1"});
  plyctl(fx, {"sync", fx.root()});
  plyctl(fx, {"sync", fx.root()});
  const uint64_t after = free_blocks(fx.root());
  const uint64_t excl = s1["exclusive"]["total"].get<uint64_t>() / 4096;
  INFO("free blocks " << before << " -> " << after << ", exclusive blocks " << excl);
  CHECK(after >= before + excl - 16);
  CHECK(after <= before + excl + 16);

  // Offline, the same figures for main; bad input is refused.
  fx.unmount();
  Json off = json_of({"du", fx.img, "main"}, "du");
  CHECK(off["branches"][0]["referenced"]["data"].get<uint64_t>() == 8 * kMiB);
  CHECK(off["branches"][0]["exclusive"]["data"].get<uint64_t>() == 8 * kMiB);
  CHECK(plyctl_status(fx, {"du"}) == 2);
  CHECK(plyctl_status(fx, {"du", fx.img, "main", "extra"}) == 2);
  CHECK(plyctl_status(fx, {"du", fx.img, "nosuch"}) == 1);
}

// Quotas (format.md#quotas) through a mount: set online on the mount
// point, a write past the limit fails with EDQUOT (at the write, or at the
// fsync that flushes the kernel's cache), the branch stays under it,
// deleting gets it going again, a copy-up of a lower file is charged, and
// the limit survives an unmount and is lifted offline.
TEST_CASE("space: a branch quota refuses writes past it with EDQUOT, and deleting always works", "[space]") {
  Fixture fx("256M");
  std::mt19937_64 rng(11);
  const std::string data = random_bytes(rng, 16 * kMiB);
  auto write_all = [&](const std::string& path, size_t n) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    int err = 0;
    for (size_t off = 0; off < n && !err; off += kMiB)
      if (::pwrite(fd, data.data() + off, kMiB, off_t(off)) != off_t(kMiB)) err = errno;
    if (!err && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    return err;
  };
  auto referenced = [&]() {
    std::string out;
    plyctl(fx, {"du", fx.root(), "main", "--json"}, &out);
    return Json::parse(out)["branches"][0]["referenced"]["total"].get<uint64_t>();
  };
  write_file(fx / "lower-file", data.substr(0, 6 * kMiB));
  std::string out;
  plyctl(fx, {"branch", "set", fx.root(), "main", "--quota", "8M", "--json"}, &out);
  Json b = Json::parse(out);
  REQUIRE(b["quota"]["referenced"].get<uint64_t>() == 8 * kMiB);
  REQUIRE(b["quota"]["exclusive"].is_null());
  // df shows the quota as ZFS shows a refquota: the size is the limit, the
  // room what is left under it.
  struct statvfs v{};
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);
  CHECK(uint64_t(v.f_blocks) * v.f_frsize == 8 * kMiB);
  CHECK(uint64_t(v.f_bavail) * v.f_frsize <= 2 * kMiB);
  CHECK(uint64_t(v.f_bavail) * v.f_frsize >= 2 * kMiB - 256 * 1024);
  const int first = write_all(fx / "f", 16 * kMiB);
  INFO("first write: " << errstr(first));
  REQUIRE(first == EDQUOT);
  CHECK(referenced() <= 8 * kMiB);
  // The room left fills 4 KiB at a time to within a few blocks of the
  // limit; then a new name fails too, and removing still works.
  {
    const int fd = ::open((fx / "small").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    int err = 0;
    for (int i = 0; i < 400 && !err; i++)
      if (::pwrite(fd, data.data(), 4096, off_t(i) * 4096) != 4096 || ::fsync(fd) != 0) err = errno;
    ::close(fd);
    INFO("small writes: " << errstr(err));
    CHECK(err == EDQUOT);
  }
  const uint64_t full = referenced();
  CHECK(full <= 8 * kMiB);
  CHECK(full >= 8 * kMiB - 64 * 1024);
  REQUIRE(::mkdir((fx / "d").c_str(), 0755) != 0);
  CHECK(errno == EDQUOT);
  remove_durably(fx / "small");
  remove_durably(fx / "f");
  remove_durably(fx / "lower-file");
  REQUIRE(write_all(fx / "f", 4 * kMiB) == 0);
  REQUIRE(read_file(fx / "f") == data.substr(0, 4 * kMiB));
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);  // df follows what the branch holds
  CHECK(uint64_t(v.f_bavail) * v.f_frsize <= 4 * kMiB);
  CHECK(uint64_t(v.f_bavail) * v.f_frsize >= 4 * kMiB - 256 * 1024);
  fx.unmount();

  // The limit is the branch's, on disk: listed offline, kept by a remount.
  plyctl(fx, {"branch", "list", fx.img, "--json"}, &out);
  REQUIRE(Json::parse(out)[0]["quota"]["referenced"].get<uint64_t>() == 8 * kMiB);
  require_fsck_clean(fx.img, fx.tmp / "fsck-quota.log");
  // A copy-up from a lower branch is charged to the branch it lands in.
  plyctl(fx, {"branch", "create", fx.img, "up"});
  plyctl(fx, {"branch", "set", fx.img, "up", "--quota", "5M"});
  plyctl(fx, {"view", "create", fx.img, "v", "up=rw:main=ro"});
  fx.opts = {"view=v"};
  fx.mount();
  {
    const int fd = ::open((fx / "f").c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);  // 4 MiB below
    REQUIRE(fd >= 0);
    int err = 0;
    if (::write(fd, data.data(), 2 * kMiB) != off_t(2 * kMiB)) err = errno;
    if (!err && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    INFO("append: " << errstr(err));
    CHECK(err == EDQUOT);
  }
  // Lifted on the image path of the mounted image: its daemon does it.
  plyctl(fx, {"branch", "set", fx.img, "up", "--quota", "none"}, &out);
  REQUIRE(out.find("changed branch \"up\"") != std::string::npos);
  REQUIRE(write_all(fx / "g", 16 * kMiB) == 0);
  fx.unmount();
  // Bad input: a one-line usage error (2), nothing changed.
  REQUIRE(plyctl_status(fx, {"branch", "set", fx.img, "main", "--quota", "lots"}) == 2);
  REQUIRE(plyctl_status(fx, {"branch", "create", fx.img, "x", "--quota", "1M"}) == 2);
  plyctl(fx, {"branch", "list", fx.img, "--json"}, &out);
  for (const auto& e : Json::parse(out)) {
    INFO(e.dump());
    CHECK(e["quota"]["referenced"] == (e["name"] == "main" ? Json(8 * kMiB) : Json(nullptr)));
  }
}

// Scrub (format.md#scrub) as a user runs it: clean, then one data block of
// a file that a snapshot shares damaged in the image file behind the
// mount's back; `plyctl scrub` finds it on the mount and offline, names the
// file in both branches, exits 4, and its JSON is the schema's Scrub.
TEST_CASE("space: plyctl scrub finds a damaged block online and offline and names it in every branch",
          "[space]") {
  Fixture fx("64M", {"commit=1"});
  const SchemaValidator schema(Json::parse(slurp(tool("PLYFS_SCHEMA"))));
  std::mt19937_64 rng(14);
  REQUIRE(::mkdir((fx / "dir").c_str(), 0755) == 0);
  const std::string data = random_bytes(rng, 10 * 4096);
  write_file(fx / "dir/f", data);
  for (int i = 0; i < 20; i++) write_file(fx / ("g" + std::to_string(i)), random_bytes(rng, 3000 + 500 * i));
  plyctl(fx, {"snapshot", fx.root(), "--name", "s1"});
  std::string out;
  REQUIRE(plyctl_status(fx, {"scrub", fx.root(), "--json"}, &out) == 0);
  {
    const Json j = Json::parse(out);
    auto problems = schema.validate(j, schema.command("scrub"));
    for (const auto& p : problems) UNSCOPED_INFO(p);
    CHECK(problems.empty());
    CHECK(j["damage"].empty());
    CHECK(j["data_blocks"].get<uint64_t>() >= 10);
  }
  // Block 3 of dir/f, found in the image by its bytes, one byte flipped.
  const std::string img = slurp(fx.img);
  const std::string blk = data.substr(3 * 4096, 4096);
  const size_t at = img.find(blk);
  REQUIRE(at != std::string::npos);
  REQUIRE(at % 4096 == 0);
  REQUIRE(img.find(blk, at + 1) == std::string::npos);
  {
    const int fd = ::open(fx.img.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const char c = char(blk[7] ^ 0x20);
    REQUIRE(::pwrite(fd, &c, 1, off_t(at + 7)) == 1);
    ::close(fd);
  }
  REQUIRE(plyctl_status(fx, {"scrub", fx.root()}, &out) == 4);
  INFO(out);
  CHECK(out.find("block " + std::to_string(at / 4096) + " (data, checksum)") != std::string::npos);
  CHECK(out.find("main:/dir/f") != std::string::npos);
  CHECK(out.find("s1:/dir/f") != std::string::npos);
  CHECK(out.find("1 damaged block") != std::string::npos);
  REQUIRE(plyctl_status(fx, {"scrub", fx.root(), "status"}, &out) == 0);
  CHECK(out.find("no scrub running") != std::string::npos);
  REQUIRE(plyctl_status(fx, {"scrub", fx.root(), "--rate", "0"}) == 2);
  fx.unmount();
  // An unmounted image: nothing scrubs it in the background.
  REQUIRE(plyctl_status(fx, {"scrub", fx.img, "status"}) == 2);

  // Offline, limited to 64 MiB/s: the same block, the same names.
  REQUIRE(plyctl_status(fx, {"scrub", fx.img, "--rate", "64M", "--json"}, &out) == 4);
  const Json j = Json::parse(out);
  auto problems = schema.validate(j, schema.command("scrub"));
  for (const auto& p : problems) UNSCOPED_INFO(p);
  CHECK(problems.empty());
  REQUIRE(j["damage"].size() == 1);
  CHECK(j["damage"][0]["block"].get<uint64_t>() == at / 4096);
  CHECK(j["damage"][0]["type"] == "data");
  CHECK(j["damage"][0]["reason"] == "checksum");
  std::set<std::string> refs;
  for (const auto& r : j["damage"][0]["references"])
    refs.insert(r["branch"].get<std::string>() + ":" + r["path"].get<std::string>());
  CHECK(refs == std::set<std::string>{"main:/dir/f", "s1:/dir/f"});
}

namespace {
// Text zstd takes to a quarter or less: words from a small vocabulary.
std::string words(std::mt19937_64& rng, size_t n) {
  static const char* w[] = {"frame ", "extent ", "branch ", "zstd ", "plyfs\n", "the ", "of "};
  std::string s;
  while (s.size() < n) s += w[rng() % 7];
  s.resize(n);
  return s;
}
uint64_t used_bytes(const std::string& path) {
  struct statvfs v{};
  REQUIRE(::statvfs(path.c_str(), &v) == 0);
  return (v.f_blocks - v.f_bfree) * v.f_frsize;
}
uint32_t get_flags(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  int f = 0;
  REQUIRE(::ioctl(fd, FS_IOC_GETFLAGS, &f) == 0);
  ::close(fd);
  return uint32_t(f);
}
int set_flags(const std::string& path, uint32_t flags) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  int f = int(flags);
  const int r = ::ioctl(fd, FS_IOC_SETFLAGS, &f) == 0 ? 0 : errno;
  ::close(fd);
  return r;
}
}  // namespace

// Compression through the kernel (format.md#fs-compress): -o compress, the
// branch default through the mount's daemon, chattr +c/+m on a directory
// passed to what is made in it, lsattr; the data reads back, before and
// after a remount, and fsck -c decodes every frame.
TEST_CASE("space: -o compress, plyctl branch set --compress and chattr +c/+m decide how data is stored",
          "[space][compress-fuse]") {
  Fixture fx("512M", {"compress=zstd:1"});
  std::mt19937_64 rng(25);
  auto durable_used = [&] {
    const int fd = ::open(fx.root().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::syncfs(fd) == 0);
    ::close(fd);
    return used_bytes(fx.root());
  };
  const std::string t1 = words(rng, 32 * kMiB);
  uint64_t u0 = durable_used();
  write_file(fx / "t1", t1);
  uint64_t u1 = durable_used();
  CHECK(u1 - u0 < 8 * kMiB);  // text under -o compress: at most a quarter
  // Incompressible data costs its size.
  const std::string noise = random_bytes(rng, 16 * kMiB);
  write_file(fx / "noise", noise);
  uint64_t u2 = durable_used();
  CHECK(u2 - u1 >= 16 * kMiB);
  // The branch says none: it wins over the mount option.
  plyctl(fx, {"branch", "set", fx.root(), "main", "--compress", "none"});
  write_file(fx / "t2", t1);
  uint64_t u3 = durable_used();
  CHECK(u3 - u2 >= 32 * kMiB);
  // ... and a directory's +c over the branch, passed to new files and
  // directories; +m on one of them over that.
  REQUIRE(::mkdir((fx / "c").c_str(), 0755) == 0);
  CHECK(get_flags(fx / "c") == 0u);
  REQUIRE(set_flags(fx / "c", FS_COMPR_FL) == 0);
  CHECK(get_flags(fx / "c") == uint32_t(FS_COMPR_FL));
  CHECK(set_flags(fx / "c", FS_IMMUTABLE_FL) == EOPNOTSUPP);
  REQUIRE(::mkdir((fx / "c/sub").c_str(), 0755) == 0);
  CHECK(get_flags(fx / "c/sub") == uint32_t(FS_COMPR_FL));
  write_file(fx / "c/sub/t3", t1);
  uint64_t u4 = durable_used();
  CHECK(u4 - u3 < 8 * kMiB);
  write_file(fx / "c/m", "");
  REQUIRE(set_flags(fx / "c/m", FS_NOCOMP_FL) == 0);
  write_file(fx / "c/m", t1);
  CHECK(durable_used() - u4 >= 32 * kMiB);
  // lsattr(1) shows them as e2fsprogs names them.
  std::string out;
  REQUIRE(run({"/usr/bin/lsattr", "-d", fx / "c", fx / "c/m"}, fx.tmp / "lsattr.log") == 0);
  out = slurp(fx.tmp / "lsattr.log");
  INFO(out);
  CHECK(out.find("c----") != std::string::npos);
  CHECK(out.find("-m ") != std::string::npos);
  fx.remount();  // fsck.plyfs -fn checks the image on the way
  CHECK(slurp(fx / "t1") == t1);
  CHECK(slurp(fx / "noise") == noise);
  CHECK(slurp(fx / "t2") == t1);
  CHECK(slurp(fx / "c/sub/t3") == t1);
  CHECK(slurp(fx / "c/m") == t1);
  CHECK(get_flags(fx / "c/sub/t3") == uint32_t(FS_COMPR_FL));
  CHECK(get_flags(fx / "c/m") == uint32_t(FS_NOCOMP_FL));
  std::string bl;
  REQUIRE(plyctl_status(fx, {"branch", "list", fx.root(), "--all", "--json"}, &bl) == 0);
  CHECK(Json::parse(bl)[0]["compress"] == "none");
  fx.unmount();
  REQUIRE(run({tool("PLYFS_FSCK"), "-fn", "-c", fx.img}, fx.tmp / "fsck-c.log") == 0);
}
