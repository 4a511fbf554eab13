// export's own fast paths (lib/io/exporter.cpp), each with a file that
// would show it wrong: the sparse map skipped when the first hole lies at
// the end (files with holes at the start, in the middle, at the end, wholly
// a hole, and one whose long path takes it whole), and the sink that
// gathers small pieces and sends large ones from libarchive's pointer (an
// empty file, small files around the gather limit, files of exactly and
// just over the direct limit, a file of several MiB, between and after
// them); plus xattrs, an ACL, a name that is not UTF-8. GNU tar must unpack
// the archive as the source (hole maps included), import (libarchive) must
// take it back, and the archive on a pipe must be the same bytes.
#include <sys/stat.h>

#include <random>

#include "../fuse/fuse_util.h"
#include "io_util.h"
#include "tree.h"

namespace plyfs::iotest {
namespace {

using namespace plyfs::fusetest;

std::string bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = char(rng());
  return s;
}

// `data` at each offset of `pieces` in a file of `size` bytes: the gaps are holes.
void sparse_file(const std::string& p, uint64_t size, const std::vector<std::pair<uint64_t, std::string>>& pieces) {
  write_file(p, "");
  REQUIRE(::truncate(p.c_str(), off_t(size)) == 0);
  int fd = ::open(p.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  for (const auto& [off, data] : pieces) REQUIRE(::pwrite(fd, data.data(), data.size(), off_t(off)) == ssize_t(data.size()));
  REQUIRE(::close(fd) == 0);
}

TEST_CASE("export: holes, sizes around its write limits, xattrs and odd names round-trip through GNU tar and import",
          "[io-export]") {
  const uint64_t s = seed("io-export-paths");
  std::mt19937_64 rng(s);
  TempDir tmp;
  const std::string src = tmp / "src";
  REQUIRE(::mkdir(src.c_str(), 0755) == 0);
  // Holes where the first hole is not at the end: each must stay a sparse member.
  sparse_file(src + "/hole-first", 1 << 20, {{512 << 10, bytes(rng, 8192)}});
  sparse_file(src + "/hole-middle", 1 << 20, {{0, bytes(rng, 4096)}, {768 << 10, bytes(rng, 4096)}});
  sparse_file(src + "/hole-last", 1 << 20, {{0, bytes(rng, 65536)}});
  sparse_file(src + "/all-hole", 3 << 20, {});
  const std::string deep = src + "/" + std::string(120, 'd');
  REQUIRE(::mkdir(deep.c_str(), 0755) == 0);
  sparse_file(deep + "/" + std::string(90, 's'), 1 << 20, {{4096, bytes(rng, 4096)}});  // no ustar fit: whole
  // Sizes around the sink's limits (64 KiB direct, 1 MiB gathered), mixed.
  write_file(src + "/empty", "");
  for (size_t n : {size_t(1), size_t(511), size_t(65535), size_t(65536), size_t(65537), size_t(1 << 20),
                   size_t((1 << 20) + 1), size_t(9 << 20) + 123})
    write_file(src + "/size-" + std::to_string(n), bytes(rng, n));
  const std::string many = src + "/many";
  REQUIRE(::mkdir(many.c_str(), 0755) == 0);
  for (int i = 0; i < 120; i++) write_file(many + "/f" + std::to_string(i), bytes(rng, rng() % 70000));
  // xattrs, an ACL and a name that is not UTF-8 on a file without holes.
  const std::string odd = src + "/caf\xe9-\xff";
  write_file(odd, bytes(rng, 300000));
  REQUIRE(::setxattr(odd.c_str(), "user.note", "v\0w", 3, 0) == 0);
  REQUIRE(sh("setfacl -m u:1234:rw- '" + odd + "'", tmp / "acl.log") == 0);

  const std::string img = tmp / "img";
  mkfs(img, "256M", tmp / "mkfs.log");
  REQUIRE(plyctl_out({"import", img, "t", src}).rc == 0);
  const std::string tarball = tmp / "x.tar";
  REQUIRE(plyctl_out({"export", img, "t", "-o", tarball}).rc == 0);
  {
    const std::string out = tmp / "out";
    REQUIRE(gnu_tar_extract(tarball, out, tmp / "tar.log") == 0);
    const std::string d = compare_trees(src, out, {.atime = false, .sockets = false, .ustar_holes = true});
    INFO("GNU tar -x of export: " << d);
    CHECK(d.empty());
  }
  REQUIRE(plyctl_out({"import", img, "back", tarball}).rc == 0);
  {
    Mount m(img, tmp / "mnt", {"branches=back=ro"});
    m.start();
    const std::string d = compare_trees(src, m.path(), {.sockets = false, .ustar_holes = true});
    INFO("export then import: " << d);
    CHECK(d.empty());
  }
  // Through a pipe read in small pieces (the writer blocks on it, the
  // gathered pieces and the direct ones interleave): the same bytes.
  const std::string piped = tmp / "piped.tar";
  REQUIRE(run({"/bin/sh", "-c", plyctl_bin() + " export '" + img + "' t | dd bs=4096 status=none of='" + piped + "'"},
              tmp / "sh.log") == 0);
  CHECK(slurp(piped) == slurp(tarball));
}

}  // namespace
}  // namespace plyfs::iotest
