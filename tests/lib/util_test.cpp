// lib/util: the one size and number parser every tool uses, the error
// message rule, the progress line, the mountinfo reader, and what memory
// the process may use (the machine's, its cgroup's).
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "util/memory.h"
#include "util/mountinfo.h"
#include "util/parse.h"
#include "util/progress.h"

using namespace plyfs;

TEST_CASE("sizes follow util-linux's units, case-insensitive", "[util]") {
  struct Case { const char* s; uint64_t v; };
  for (auto c : {Case{"0", 0}, Case{"4096", 4096}, Case{"1k", 1024}, Case{"1K", 1024},
                 Case{"1KiB", 1024}, Case{"1kib", 1024}, Case{"1KB", 1000}, Case{"1kb", 1000},
                 Case{"1g", 1ull << 30}, Case{"1G", 1ull << 30}, Case{"2GiB", 2ull << 30},
                 Case{"1GB", 1000000000}, Case{"1.5M", 1572864}, Case{"0.5k", 512},
                 Case{"3T", 3ull << 40}, Case{"1P", 1ull << 50}, Case{"15E", 15ull << 60},
                 Case{"512B", 512}, Case{"512b", 512},
                 Case{"18446744073709551615", ~uint64_t{0}}}) {
    INFO(c.s);
    auto r = parse_size(c.s);
    REQUIRE(r);
    CHECK(*r == c.v);
  }
  for (const char* s : {"", "-1", "+1", "-1G", "1x", "1 G", "G", "1GiBs", "1.", ".5", "16E",
                        "18446744073709551616", "1e3", "0x10", "1,5G"}) {
    INFO(s);
    auto r = parse_size(s, "cache size");
    REQUIRE_FALSE(r);
    CHECK(r.error().code == EINVAL);
    CHECK(r.error().message().find("invalid cache size '") == 0);
    CHECK(r.error().message().find("Invalid argument") == std::string::npos);
  }
}

TEST_CASE("whole numbers refuse signs, junk and values out of range", "[util]") {
  CHECK(*parse_uint("0", "n") == 0);
  CHECK(*parse_uint("18446744073709551615", "n") == ~uint64_t{0});
  CHECK(*parse_uint("0x1f", "n", 0, 100, true) == 31);
  CHECK_FALSE(parse_uint("0x1f", "n"));
  CHECK_FALSE(parse_uint("18446744073709551616", "n"));
  CHECK_FALSE(parse_uint("-1", "commit interval"));
  CHECK(parse_uint("-1", "commit interval").error().reason ==
        "invalid commit interval '-1': must not be negative");
  CHECK_FALSE(parse_uint(" 1", "n"));
  CHECK_FALSE(parse_uint("1 ", "n"));
  CHECK_FALSE(parse_uint("", "n"));
  CHECK_FALSE(parse_uint("5", "n", 10, 20));
  CHECK_FALSE(parse_uint("25", "n", 10, 20));
  CHECK(*parse_uint("20", "n", 10, 20) == 20);
}

TEST_CASE("only system errors end in strerror; damage points at fsck", "[util]") {
  CHECK(Error::invalid("no branch named x").message() == "no branch named x");
  CHECK(Error::io(EBUSY, "x is busy").message() == "x is busy");
  CHECK(Error::sys(ENOENT, "cannot open /y").message() == "cannot open /y: No such file or directory");
  CHECK(Error::corrupt(77, "keys out of order").message() == "keys out of order (block 77)");
  CHECK(Error::corrupt(77, "keys out of order").user_message("a.img") ==
        "keys out of order (block 77); the image is damaged: run fsck.plyfs a.img");
  CHECK(Error::invalid("bad").user_message("a.img") == "bad");
}

TEST_CASE("sizes and times print the way the progress line shows them", "[util]") {
  CHECK(format_size(0) == "0 B");
  CHECK(format_size(1023) == "1023 B");
  CHECK(format_size(1024) == "1.00 KiB");
  CHECK(format_size(1536ull << 20) == "1.50 GiB");
  CHECK(format_size(200ull << 20) == "200 MiB");
  CHECK(Progress::eta(0) == "0:00:00");
  CHECK(Progress::eta(3725) == "1:02:05");
  CHECK(Progress::eta(-1) == "--:--:--");
  CHECK(Progress::count(1234567) == "1,234,567");
  CHECK(Progress::count(999) == "999");
}

TEST_CASE("a progress line shows totals, percentage and the final summary", "[util]") {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  {
    Progress p("merging", 400, Progress::Unit::Count, "entries", f, true);
    p.update(100);
    p.finish();
  }
  std::fclose(f);
  const std::string out(buf, len);
  std::free(buf);
  CHECK(out.find("merging: 100 / 400 entries (25%)") != std::string::npos);
  CHECK(out.find("\rmerging: 100 entries in 0:00:00\033[K\n") != std::string::npos);
  // Without a total, the share done gives the percentage.
  buf = nullptr;
  f = open_memstream(&buf, &len);
  {
    Progress p("deleting old", 0, Progress::Unit::Count, "nodes", f, true);
    p.update(300, 0.25);
  }
  std::fclose(f);
  CHECK(std::string(buf, len).find("deleting old: 300 nodes (25%)") != std::string::npos);
  std::free(buf);
  // Not a terminal and not forced: nothing at all.
  buf = nullptr;
  f = open_memstream(&buf, &len);
  {
    Progress p("x", 10, Progress::Unit::Count, "", f);
    p.update(5);
    p.finish();
  }
  std::fclose(f);
  CHECK(len == 0);
  std::free(buf);
}

TEST_CASE("mountinfo lines: escapes undone, optional fields skipped, bad lines refused", "[util]") {
  // Optional fields (shared:, master:) before the separator, and a mount
  // point and source with a space, a tab, a newline and a backslash.
  auto e = parse_mountinfo_line(
      "36 35 0:52 / /mnt/a\\040b\\011c rw,nosuid shared:1 master:2 - fuse.plyfs /tmp/x\\134y\\012z.img "
      "rw,user_id=0\n");
  REQUIRE(e);
  CHECK(e->majmin == "0:52");
  CHECK(e->root == "/");
  CHECK(e->mountpoint == "/mnt/a b\tc");
  CHECK(e->fstype == "fuse.plyfs");
  CHECK(e->source == "/tmp/x\\y\nz.img");
  CHECK(e->options == "rw,user_id=0");
  // No optional field; "-" as a mount option is not the separator.
  e = parse_mountinfo_line("1 0 8:1 / / rw - ext4 /dev/sda1 rw");
  REQUIRE(e);
  CHECK(e->mountpoint == "/");
  CHECK(e->source == "/dev/sda1");
  // A mount point named "-" is not the separator either: it is the fifth field.
  e = parse_mountinfo_line("2 1 0:30 / - rw - tmpfs tmpfs rw");
  REQUIRE(e);
  CHECK(e->mountpoint == "-");
  CHECK(e->fstype == "tmpfs");
  // An empty source stays a field: the super options do not take its place.
  e = parse_mountinfo_line("3 1 0:31 / /x rw - fuse.plyfs  rw");
  REQUIRE(e);
  CHECK(e->source.empty());
  CHECK(e->options == "rw");
  // A backslash not followed by three octal digits stays.
  CHECK(unescape_mountinfo("a\\9bc\\04") == "a\\9bc\\04");
  CHECK(unescape_mountinfo("\\400") == "\\400");
  for (const char* bad : {"", "1 0 8:1 / / rw", "1 0 8:1 / / rw - ext4", "1 0 8:1 / / - ext4 /dev/sda1"}) {
    INFO(bad);
    CHECK_FALSE(parse_mountinfo_line(bad));
  }
  // This process's own file: / is mounted, and every entry has a type.
  auto all = read_mountinfo();
  REQUIRE_FALSE(all.empty());
  CHECK(std::any_of(all.begin(), all.end(), [](const MountEntry& m) { return m.mountpoint == "/"; }));
  for (const auto& m : all) CHECK_FALSE(m.fstype.empty());
  CHECK(read_mountinfo("/nonexistent/mountinfo").empty());
}

namespace {
void put(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}
}  // namespace

TEST_CASE("memory: /proc/meminfo, and a cgroup's limit (v1 and v2, every level up) narrowing it", "[util]") {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/plyfs-memory-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const fs::path t = tmpl;
  constexpr uint64_t M = 1ull << 20;
  const std::string cg = (t / "cgroup").string(), mi = (t / "mountinfo").string();

  put(t / "meminfo", "MemTotal:       16384 kB\nMemFree:         1024 kB\nMemAvailable:    4096 kB\nBuffers: 1 kB\n");
  auto m = read_meminfo((t / "meminfo").c_str());
  CHECK(m.total == 16384u << 10);
  CHECK(m.available == 4096u << 10);
  put(t / "meminfo", "MemTotal:       16384 kB\nMemFree:         1024 kB\n");  // no MemAvailable
  CHECK(read_meminfo((t / "meminfo").c_str()).total == 0);
  CHECK(read_meminfo((t / "none").c_str()).total == 0);

  // cgroup v1's memory hierarchy (beside a cpu one, which has none of its
  // files): the process's cgroup /a/b with 1 GiB, its parent /a with 512
  // MiB nearly used, the root without a limit. The parent's limit is the
  // total, and what is left under it the available (inactive file pages
  // counted as free).
  const fs::path v1 = t / "v1", cpu = t / "cpu", v2 = t / "v2";
  put(mi, "30 25 0:26 / " + cpu.string() + " rw - cgroup cgroup rw,cpu\n" +
              "31 25 0:27 / " + v1.string() + " rw shared:9 - cgroup cgroup rw,memory\n" +
              "32 25 0:28 / " + v2.string() + " rw - cgroup2 cgroup2 rw,nsdelegate\n");
  put(cg, "5:cpu:/a/b\n4:memory:/a/b\n0::/\n");
  put(v1 / "memory.limit_in_bytes", "9223372036854771712\n");
  put(v1 / "memory.usage_in_bytes", std::to_string(8000 * M) + "\n");
  put(v1 / "a/memory.limit_in_bytes", std::to_string(512 * M) + "\n");
  put(v1 / "a/memory.usage_in_bytes", std::to_string(500 * M) + "\n");
  put(v1 / "a/memory.stat", "cache 1\ninactive_file 1\ntotal_inactive_file " + std::to_string(20 * M) + "\n");
  put(v1 / "a/b/memory.limit_in_bytes", std::to_string(1024 * M) + "\n");
  put(v1 / "a/b/memory.usage_in_bytes", std::to_string(300 * M) + "\n");
  put(v1 / "a/b/memory.stat", "inactive_file " + std::to_string(100 * M) + "\n");
  auto c = read_cgroup_memory(cg.c_str(), mi.c_str());
  REQUIRE(c);
  CHECK(c->total == 512 * M);
  CHECK(c->available == 32 * M);
  // Only the process's own level limited: its numbers.
  put(v1 / "a/memory.limit_in_bytes", "9223372036854771712\n");
  c = read_cgroup_memory(cg.c_str(), mi.c_str());
  REQUIRE(c);
  CHECK(c->total == 1024 * M);
  CHECK(c->available == 824 * M);
  // No limit anywhere: nothing to narrow.
  put(v1 / "a/b/memory.limit_in_bytes", "9223372036854771712\n");
  CHECK_FALSE(read_cgroup_memory(cg.c_str(), mi.c_str()));

  // cgroup v2: memory.high below memory.max is the limit; "max" is none.
  put(cg, "0::/c\n");
  put(v2 / "c/memory.max", "max\n");
  put(v2 / "c/memory.high", std::to_string(256 * M) + "\n");
  put(v2 / "c/memory.current", std::to_string(200 * M) + "\n");
  put(v2 / "c/memory.stat", "anon 1\ninactive_file " + std::to_string(50 * M) + "\nactive_file 7\n");
  c = read_cgroup_memory(cg.c_str(), mi.c_str());
  REQUIRE(c);
  CHECK(c->total == 256 * M);
  CHECK(c->available == 106 * M);
  // Usage past the limit: nothing available, not a wrapped number.
  put(v2 / "c/memory.current", std::to_string(400 * M) + "\n");
  c = read_cgroup_memory(cg.c_str(), mi.c_str());
  REQUIRE(c);
  CHECK(c->available == 0);

  // A container's mount of a subtree: its root is the container's cgroup,
  // and the process's path (outside a cgroup namespace) starts with it.
  put(mi, "31 25 0:27 /docker/x " + v1.string() + " rw - cgroup cgroup rw,memory\n");
  put(cg, "4:memory:/docker/x/y\n");
  put(v1 / "y/memory.limit_in_bytes", std::to_string(2048 * M) + "\n");
  put(v1 / "y/memory.usage_in_bytes", std::to_string(48 * M) + "\n");
  c = read_cgroup_memory(cg.c_str(), mi.c_str());
  REQUIRE(c);
  CHECK(c->total == 2048 * M);
  CHECK(c->available == 2000 * M);
  // Files that cannot be read, or a path that climbs out: none.
  put(cg, "4:memory:/docker/x/../../etc\n");
  CHECK_FALSE(read_cgroup_memory(cg.c_str(), mi.c_str()));
  CHECK_FALSE(read_cgroup_memory((t / "none").c_str(), mi.c_str()));
  CHECK_FALSE(read_cgroup_memory(cg.c_str(), (t / "none").c_str()));
  fs::remove_all(t);

  // This process: the machine's memory, never more.
  const Memory host = read_meminfo(), now = memory_now();
  REQUIRE(host.total > 0);
  REQUIRE(host.available <= host.total);
  CHECK(now.total > 0);
  CHECK(now.total <= host.total);
  CHECK(now.available <= host.available);
}
