// plyctl import and export, mkfs.plyfs -d, as users run them, against the
// tools they are compared with: random trees imported from a directory and
// from GNU tar's archives (every compression), mounted and compared with the
// source; exports unpacked by GNU tar and imported back; OCI images built by
// umoci from random layer changes, whose top layer must show exactly what
// umoci unpack makes; ext4 images made by mkfs.ext4 -d, and damaged ones
// (debugfs -w); an export of a mounted image. (The bad inputs are in
// bad_input_test.cpp, the fault-injected imports in atomic_test.cpp.)
#include <nlohmann/json.hpp>

#include "../fuse/fuse_util.h"
#include "../fuse/json_schema.h"
#include "io_util.h"
#include "tree.h"

namespace plyfs::iotest {
namespace {

using namespace plyfs::fusetest;
using json = nlohmann::json;

TEST_CASE("import: a random directory tree, mounted, equals its source; mkfs -d too", "[io-dir]") {
  const uint64_t s = seed("io-dir");
  TempDir tmp;
  const std::string src = tmp / "src";
  TreeGen(src, s, {.entries = int(200 * scale())}).make();
  const std::string img = tmp / "img";
  mkfs(img, "512M", tmp / "mkfs.log");
  const Out o = plyctl_out({"import", img, "t", src, "--json"});
  const json j = validated("import", o);
  CHECK(j["format"] == "dir");
  CHECK(j["branch"]["name"] == "t");
  {
    Mount m(img, tmp / "mnt", {"branches=t=ro"});
    m.start();
    const std::string d = compare_trees(src, m.path());
    INFO("import of a directory: " << d);
    CHECK(d.empty());
  }
  require_fsck_clean(img, tmp / "fsck.log");

  // mkfs -d: the first branch, mounted by default.
  const std::string img2 = tmp / "img2";
  write_file(img2, "");  // mkfs.plyfs makes no new file under /dev
  const int rc = run({mkfs_bin(), "-q", "-s", "512M", "-d", src, img2}, tmp / "mkfs2.log");
  INFO(slurp(tmp / "mkfs2.log"));
  REQUIRE(rc == 0);
  {
    Mount m(img2, tmp / "mnt2", {"ro"});
    m.start();
    const std::string d = compare_trees(src, m.path());
    INFO("mkfs -d: " << d);
    CHECK(d.empty());
  }
  const Out l = plyctl_out({"branch", "list", img2, "--json"});
  REQUIRE(l.rc == 0);
  const json bl = json::parse(l.out);
  REQUIRE(bl.size() == 1);
  CHECK(bl[0]["name"] == "main");
  require_fsck_clean(img2, tmp / "fsck2.log");
}

TEST_CASE("import: GNU tar archives of a random tree, plain and compressed, equal their source", "[io-tar]") {
  const uint64_t s = seed("io-tar");
  TempDir tmp;
  const std::string src = tmp / "src";
  TreeGen(src, s, {.entries = int(150 * scale())}).make();
  const std::string img = tmp / "img";
  mkfs(img, "1G", tmp / "mkfs.log");
  int n = 0;
  for (const std::string suffix : {".tar", ".tar.gz", ".tar.zst", ".tar.xz"}) {
    const std::string tarball = tmp / ("t" + suffix);
    REQUIRE(gnu_tar_create(tarball, src, tmp / "tar.log") == 0);
    const std::string name = "t" + std::to_string(n++);
    const Out o = plyctl_out({"import", img, name, tarball});
    INFO(o.err);
    REQUIRE(o.rc == 0);
    Mount m(img, tmp / "mnt", {"branches=" + name + "=ro"});
    m.start();
    // GNU tar skips sockets ("socket ignored").
    const std::string d = compare_trees(src, m.path(), {.sockets = false});
    INFO(suffix << ": " << d);
    CHECK(d.empty());
  }
  // From standard input.
  REQUIRE(sh(plyctl_bin() + " import '" + img + "' piped - < '" + tmp / "t.tar.zst" + "'", tmp / "sh.log") == 0);
  {
    Mount m(img, tmp / "mnt", {"branches=piped=ro"});
    m.start();
    const std::string d = compare_trees(src, m.path(), {.sockets = false});
    INFO("standard input: " << d);
    CHECK(d.empty());
  }
  require_fsck_clean(img, tmp / "fsck.log");
}

TEST_CASE("export: GNU tar unpacks what export wrote as the source, and import takes it back", "[io-export]") {
  const uint64_t s = seed("io-export");
  TempDir tmp;
  const std::string src = tmp / "src";
  TreeGen(src, s, {.entries = int(150 * scale())}).make();
  const std::string img = tmp / "img";
  mkfs(img, "1G", tmp / "mkfs.log");
  REQUIRE(plyctl_out({"import", img, "t", src}).rc == 0);
  for (const std::string suffix : {".tar", ".tar.zst", ".tar.gz"}) {
    const std::string tarball = tmp / ("x" + suffix);
    const Out o = plyctl_out({"export", img, "t", "-o", tarball, "--json"});
    const json j = validated("export", o);
    CHECK(j["format"] == "tar");
    CHECK(j["skipped"].get<int>() >= 0);
    const std::string out = tmp / ("out" + suffix);
    REQUIRE(gnu_tar_extract(tarball, out, tmp / "tar.log") == 0);
    // GNU tar sets atimes to the time of extraction, and tar has no sockets.
    const std::string d = compare_trees(src, out, {.atime = false, .sockets = false, .ustar_holes = true});
    INFO("GNU tar -x of export " << suffix << ": " << d);
    CHECK(d.empty());
  }
  // export -> import: everything but sockets, atimes included.
  REQUIRE(plyctl_out({"import", img, "back", tmp / "x.tar.zst"}).rc == 0);
  {
    Mount m(img, tmp / "mnt", {"branches=back=ro"});
    m.start();
    const std::string d = compare_trees(src, m.path(), {.sockets = false, .ustar_holes = true});
    INFO("export then import: " << d);
    CHECK(d.empty());
  }
  // To standard output: the same archive.
  const std::string piped = tmp / "piped.tar";
  REQUIRE(run({"/bin/sh", "-c", plyctl_bin() + " export '" + img + "' t > '" + piped + "'"}, tmp / "sh.log") == 0);
  CHECK(slurp(piped).size() > 10240);
  require_fsck_clean(img, tmp / "fsck.log");
}

TEST_CASE("export: a mounted image, while it is written, from a consistent generation", "[io-export]") {
  const uint64_t s = seed("io-export-online");
  TempDir tmp;
  const std::string src = tmp / "src";
  TreeGen(src, s, {.entries = 80, .sockets = false}).make();
  const std::string img = tmp / "img";
  mkfs(img, "512M", tmp / "mkfs.log");
  REQUIRE(plyctl_out({"import", img, "base", src}).rc == 0);
  REQUIRE(plyctl_out({"layer", "create", img, "top", "--on", "base"}).rc == 0);
  Mount m(img, tmp / "mnt", {"layer=top"});
  m.start();
  write_file(m / "new-in-top", "written through the mount before the export");
  const std::string tarball = tmp / "online.tar";
  const Out o = plyctl_out({"export", m.path(), "top", "-o", tarball, "--json"});
  const json j = validated("export", o);
  const std::string out = tmp / "out";
  REQUIRE(gnu_tar_extract(tarball, out, tmp / "tar.log") == 0);
  CHECK(slurp(out + "/new-in-top") == "written through the mount before the export");
  ::unlink((out + "/new-in-top").c_str());
  // The root's times changed with the new file: compare the rest.
  const std::string d =
      compare_trees(src, out, {.atime = false, .sockets = false, .root_attrs = false, .ustar_holes = true});
  INFO("export of a mount: " << d);
  CHECK(d.empty());
  // The clones it made are gone, and the mount goes on.
  const Out l = plyctl_out({"branch", "list", m.path()});
  CHECK(l.out.find("export-") == std::string::npos);
  write_file(m / "after", "x");
  REQUIRE(m.unmount() == 0);
  // A read-only mount: read from the image as it is.
  {
    Mount ro(img, tmp / "mnt-ro", {"layer=top", "ro"});
    ro.start();
    REQUIRE(plyctl_out({"export", ro.path(), "top", "-o", tmp / "ro.tar"}).rc == 0);
    const Out t = run_out({"/bin/tar", "tf", tmp / "ro.tar"});
    CHECK(t.out.find("./after\n") != std::string::npos);
  }
  const Out bl = plyctl_out({"branch", "list", img});
  CHECK(bl.out.find("export-") == std::string::npos);
  require_fsck_clean(img, tmp / "fsck.log");
}

TEST_CASE("OCI: images umoci builds from random layer changes; the top layer shows what umoci unpack makes", "[io-oci]") {
  if (!have_tool("umoci")) SKIP("umoci is not installed (scripts/install-deps)");
  const uint64_t s = seed("io-oci");
  std::mt19937_64 rng(s);
  TempDir tmp;
  const std::string layout = tmp / "oci", bundle = tmp / "bundle";
  REQUIRE(sh("umoci init --layout '" + layout + "' && umoci new --image '" + layout + ":t' && umoci unpack --image '" +
             layout + ":t' '" + bundle + "'", tmp / "umoci.log") == 0);
  const std::string rootfs = bundle + "/rootfs";
  const int layers = 3;
  for (int i = 0; i < layers; i++) {
    if (i == 0) TreeGen(rootfs + "/base", rng(), {.entries = 100, .sockets = false, .security_xattrs = false}).make();
    else change_tree(rootfs, rng, tmp / "gen");
    // repack adds a layer over the image the bundle was unpacked from:
    // unpack again for the next one.
    REQUIRE(sh("umoci repack --image '" + layout + ":t' '" + bundle + "' && rm -rf '" + bundle +
                   "' && umoci unpack --image '" + layout + ":t' '" + bundle + "'",
               tmp / "umoci.log") == 0);
  }
  const std::string img = tmp / "img";
  mkfs(img, "1G", tmp / "mkfs.log");
  const Out o = plyctl_out({"import", img, "top", layout + ":t", "--json"});
  const json j = validated("import", o);
  CHECK(j["format"] == "oci");
  // umoci new's empty layer-less image, then one layer per repack.
  CHECK(j["layers"].size() == size_t(layers));
  REQUIRE(sh("umoci unpack --image '" + layout + ":t' '" + tmp / "check" + "'", tmp / "umoci.log") == 0);
  {
    Mount m(img, tmp / "mnt", {"layer=top", "ro"});
    m.start();
    const std::string d = compare_trees(tmp / "check/rootfs", m.path(), {.atime = false, .root_attrs = false, .security = false});
    INFO("OCI top layer vs umoci unpack: " << d);
    CHECK(d.empty());
  }
  // Each layer exported as an OCI layer and imported back, in a new image:
  // whiteouts and opaque directories make the same view.
  const std::string img2 = tmp / "img2";
  mkfs(img2, "1G", tmp / "mkfs2.log");
  std::string parent;
  for (size_t i = 0; i < j["layers"].size(); i++) {
    const std::string name = j["layers"][i]["name"];
    const std::string tarball = tmp / ("layer" + std::to_string(i) + ".tar.zst");
    REQUIRE(plyctl_out({"export", img, name, "--format", "oci-layer", "-o", tarball}).rc == 0);
    std::vector<std::string> args = {"import", img2, "l" + std::to_string(i), tarball, "--format", "oci-layer"};
    if (!parent.empty()) args.insert(args.end(), {"--parent", parent});
    const Out r = plyctl_out(args);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    parent = "l" + std::to_string(i);
  }
  {
    Mount a(img, tmp / "mnt", {"layer=top", "ro"});
    a.start();
    Mount b(img2, tmp / "mnt2", {"layer=" + parent, "ro"});
    b.start();
    const std::string d = compare_trees(a.path(), b.path(), {.atime = true});
    INFO("OCI layers exported and imported back: " << d);
    CHECK(d.empty());
  }
  require_fsck_clean(img, tmp / "fsck.log");
  require_fsck_clean(img2, tmp / "fsck2.log");
}

TEST_CASE("ext4: mkfs.ext4 -d of a random tree, imported, equals its source", "[io-ext4]") {
  if (!have_tool("mkfs.ext4")) SKIP("mkfs.ext4 is not installed");
  const uint64_t s = seed("io-ext4");
  TempDir tmp;
  const std::string src = tmp / "src";
  TreeGen(src, s, {.entries = int(150 * scale()), .big_xattrs = false}).make();
  const std::string ext4 = tmp / "ext4.img";
  REQUIRE(sh("mkfs.ext4 -q -F -b 4096 -I 256 -d '" + src + "' '" + ext4 + "' 256M", tmp / "mke2fs.log") == 0);
  const std::string img = tmp / "img";
  mkfs(img, "512M", tmp / "mkfs.log");
  const Out o = plyctl_out({"import", img, "e", ext4, "--json"});
  const json j = validated("import", o);
  CHECK(j["format"] == "ext4");
  {
    Mount m(img, tmp / "mnt", {"branches=e=ro"});
    m.start();
    // mke2fs -d gives the root its own attributes, not the source's, keeps
    // times to the second only (e2fsprogs 1.47.0), and reads the source
    // without O_NOATIME: the source's atimes move under it.
    const std::string d = compare_trees(src, m.path(), {.atime = false, .root_attrs = false, .ns = false});
    INFO("ext4 import: " << d);
    CHECK(d.empty());
  }
  require_fsck_clean(img, tmp / "fsck.log");
}

TEST_CASE("ext4: damaged images are refused or imported with --force, never a crash", "[io-ext4]") {
  if (!have_tool("debugfs")) SKIP("debugfs is not installed");
  const uint64_t s = seed("io-ext4-damaged");
  TempDir tmp;
  const std::string src = tmp / "src";
  TreeGen(src, s, {.entries = 60, .big_xattrs = false}).make();
  const std::string good = tmp / "good.img";
  REQUIRE(sh("mkfs.ext4 -q -F -b 4096 -d '" + src + "' '" + good + "' 64M", tmp / "mke2fs.log") == 0);
  const std::string img = tmp / "img";
  mkfs(img, "256M", tmp / "mkfs.log");

  // An image whose superblock records errors: refused, then --force.
  const std::string errs = tmp / "errors.img";
  REQUIRE(sh("cp '" + good + "' '" + errs + "' && debugfs -w -R 'ssv state 2' '" + errs + "'", tmp / "debugfs.log") == 0);
  const std::string before = branch_list(img);
  Out o = plyctl_out({"import", img, "e", errs});
  CHECK(o.rc == 1);
  CHECK(one_line_error(o.err));
  CHECK(o.err.find("--force") != std::string::npos);
  CHECK(branch_list(img) == before);
  o = plyctl_out({"import", img, "e", errs, "--force"});
  CHECK(o.rc == 0);

  // Damage with debugfs -w, each imported with --force: an error or an
  // import, never a crash or a sanitizer report.
  const std::vector<std::string> damage = {
      "sif / block[2] 0xffffffff", "sif / size 1", "sif / mode 0100644", "sif / links_count 0",
      "clri /", "sif <12> block[0] 4000000000", "sif <12> size 0xffffffffffff", "sif <12> flags 0x10000000",
      "sif <13> block[1] 0", "sif <13> mode 0120777", "sif <14> mode 0060644", "ssv inodes_count 3",
      "ssv blocks_per_group 1", "set_bg 0 inode_table 0", "sif <11> block[0] 1", "ssv first_ino 1",
  };
  int k = 0;
  for (const auto& cmd : damage) {
    const std::string bad = tmp / ("bad" + std::to_string(k) + ".img");
    REQUIRE(sh("cp '" + good + "' '" + bad + "'", tmp / "cp.log") == 0);
    (void)sh("debugfs -w -R '" + cmd + "' '" + bad + "'", tmp / "debugfs.log");
    for (const char* force : {"", "--force"}) {
      std::vector<std::string> args = {"import", img, "d" + std::to_string(k), bad};
      if (*force) args.push_back(force);
      const Out r = plyctl_out(args);
      INFO("debugfs -w -R '" << cmd << "' then import " << force << ": rc " << r.rc << ", " << r.err);
      CHECK((r.rc == 0 || r.rc == 1));
      CHECK(r.err.find("Sanitizer") == std::string::npos);
      CHECK(r.err.find("runtime error") == std::string::npos);
      if (r.rc == 1) CHECK(one_line_error(r.err));
      if (r.rc == 0) break;
    }
    k++;
  }
  require_fsck_clean(img, tmp / "fsck.log");
}

}  // namespace
}  // namespace plyfs::iotest
