// plyctl import of bad input (tests/io/badtar.py writes the tarballs): each
// refusal is one line "plyctl: ..." naming the entry, exit status 1, and the
// image as it was (its branch list, and fsck clean); what tar's rules allow
// (a leading '/' stripped, later duplicates winning, whiteouts of names the
// parent lacks) is imported. Also an OCI blob whose digest does not match,
// and a source larger than the image (ENOSPC midway, space given back).
#include <nlohmann/json.hpp>

#include "io_util.h"

namespace plyfs::iotest {
namespace {

using json = nlohmann::json;

struct BadFixture {
  TempDir tmp;
  std::string img = tmp / "img", tars = tmp / "tars";
  BadFixture() {
    ::mkdir(tars.c_str(), 0755);
    REQUIRE(sh("python3 '" + std::string(tool("PLYFS_BADTAR")) + "' '" + tars + "'", tmp / "py.log") == 0);
    mkfs(img, "256M", tmp / "mkfs.log");
  }
  std::string tar(const std::string& name) const { return tars + "/" + name; }
  // A refused import: one line naming what, exit 1, nothing changed.
  void refused(const std::string& tarball, const std::string& what, std::vector<std::string> extra = {}) {
    const std::string before = branch_list(img);
    std::vector<std::string> args = {"import", img, "t", tarball};
    args.insert(args.end(), extra.begin(), extra.end());
    const Out o = plyctl_out(args);
    INFO("import " << tarball << ": " << o.err);
    CHECK(o.rc == 1);
    CHECK(one_line_error(o.err));
    CHECK(o.err.find(what) != std::string::npos);
    CHECK(o.out.empty());
    CHECK(branch_list(img) == before);
    require_fsck_clean(img, tmp / "fsck.log");
  }
};

TEST_CASE("import refuses what could escape the new branch, naming the entry", "[io-bad]") {
  BadFixture fx;
  fx.refused(fx.tar("dotdot.tar"), "entry \"a/../../escape\": a path with a '..' component");
  fx.refused(fx.tar("dotdot-start.tar"), "entry \"../escape\": a path with a '..' component");
  fx.refused(fx.tar("symlink-escape.tar"), "entry \"link/passwd\": its path goes through the symbolic link \"link\"");
  fx.refused(fx.tar("symlink-escape-rel.tar"), "entry \"d/up/escape\": its path goes through the symbolic link");
  fx.refused(fx.tar("hardlink-escape.tar"), "entry \"h\": a hard link to \"../../etc/passwd\": a path with a '..'");
  fx.refused(fx.tar("hardlink-missing.tar"), "entry \"h\": a hard link to \"not-there\", which the source does not hold");
  fx.refused(fx.tar("file-as-dir.tar"), "entry \"f/g\": its path goes through \"f\", which is not a directory");
  fx.refused(fx.tar("long-name.tar"), "a name longer than 255 bytes");
  // tar's rule: the leading '/' goes, and the target is looked for inside.
  fx.refused(fx.tar("hardlink-absolute.tar"), "entry \"h\": a hard link to \"/etc/passwd\"");
}

TEST_CASE("import refuses damaged and truncated archives, and what is no archive", "[io-bad]") {
  BadFixture fx;
  fx.refused(fx.tar("truncated.tar"), "Truncated tar archive");
  fx.refused(fx.tar("damaged.tar"), "Damaged tar archive");
  fx.refused(fx.tar("not-a-tar"), "not a tarball");
  fx.refused(fx.tmp / "does-not-exist.tar", "does-not-exist.tar");
  // Cut in the middle of its compressed stream.
  REQUIRE(sh("zstd -q -f '" + fx.tar("whole.tar") + "' -o '" + fx.tmp / "w.tar.zst" + "' && head -c 20000 '" +
                 fx.tmp / "w.tar.zst" + "' > '" + fx.tmp / "cut.tar.zst" + "'",
             fx.tmp / "zstd.log") == 0);
  fx.refused(fx.tmp / "cut.tar.zst", "cut.tar.zst");
  // A usage error is exit 2.
  CHECK(plyctl_out({"import", fx.img, "t", fx.tar("whole.tar"), "--format", "zip"}).rc == 2);
  CHECK(plyctl_out({"import", fx.img, "t"}).rc == 2);
  // An existing name, and a bad one.
  REQUIRE(plyctl_out({"import", fx.img, "t", fx.tar("whole.tar")}).rc == 0);
  fx.refused(fx.tar("whole.tar"), "a branch named \"t\" exists");
  const Out o = plyctl_out({"import", fx.img, "a:b", fx.tar("whole.tar")});
  CHECK(o.rc == 1);
  CHECK(one_line_error(o.err));
}

TEST_CASE("import follows tar's rules: a leading '/' stripped, the later duplicate wins; whiteouts kept", "[io-bad]") {
  BadFixture fx;
  Out o = plyctl_out({"import", fx.img, "abs", fx.tar("absolute.tar")});
  REQUIRE(o.rc == 0);
  CHECK(o.err == "plyctl: removing leading '/' from member names\n");
  o = plyctl_out({"import", fx.img, "dup", fx.tar("duplicates.tar")});
  REQUIRE(o.rc == 0);
  o = plyctl_out({"import", fx.img, "wh", fx.tar("whiteout-missing.tar"), "--format", "oci-layer", "--parent", "dup"});
  REQUIRE(o.rc == 0);
  {
    Mount m(fx.img, fx.tmp / "mnt", {"branches=abs=ro:dup=ro"});
    m.start();
    CHECK(slurp(m / "abs/file") == "absolute");
    CHECK(slurp(m / "d/f") == "second, later wins");
    struct stat st;
    REQUIRE(::lstat((m / "e").c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK(slurp(m / "e") == "a file replaces the directory");
    REQUIRE(::lstat((m / "e2").c_str(), &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
    CHECK((st.st_mode & 07777) == 0750);
  }
  {
    // The layer: d is opaque (dup's d/f hidden), its own d/kept shows.
    Mount m(fx.img, fx.tmp / "mnt2", {"layer=wh", "ro"});
    m.start();
    CHECK(slurp(m / "d/kept") == "kept");
    struct stat st;
    CHECK(::lstat((m / "d/f").c_str(), &st) != 0);
    CHECK(slurp(m / "e") == "a file replaces the directory");
  }
  // The whiteouts of names the parent lacks are kept: the layer's export
  // holds them.
  const std::string layer = fx.tmp / "wh.tar";
  REQUIRE(plyctl_out({"export", fx.img, "wh", "--format", "oci-layer", "-o", layer}).rc == 0);
  const Out t = run_out({"/bin/tar", "tf", layer});
  CHECK(t.out.find("./.wh.ghost\n") != std::string::npos);
  CHECK(t.out.find("./d/.wh.nothing\n") != std::string::npos);
  CHECK(t.out.find("./d/.wh..wh..opq\n") != std::string::npos);
  require_fsck_clean(fx.img, fx.tmp / "fsck.log");
}

TEST_CASE("import of an OCI image whose blob does not match its digest commits nothing", "[io-bad]") {
  if (!have_tool("umoci")) SKIP("umoci is not installed (scripts/install-deps)");
  BadFixture fx;
  const std::string layout = fx.tmp / "oci", bundle = fx.tmp / "bundle";
  REQUIRE(sh("umoci init --layout '" + layout + "' && umoci new --image '" + layout + ":t' && umoci unpack --image '" +
                 layout + ":t' '" + bundle + "' && echo one > '" + bundle + "/rootfs/one' && umoci repack --image '" +
                 layout + ":t' '" + bundle + "' && echo two > '" + bundle + "/rootfs/two' && umoci repack --image '" +
                 layout + ":t' '" + bundle + "'",
             fx.tmp / "umoci.log") == 0);
  // The first layer of the image the tag names (index -> manifest -> layers).
  const Out ls = run_out({"/usr/bin/python3", "-c",
                          "import json,sys; d=sys.argv[1]; b=lambda x: d+'/blobs/sha256/'+x.split(':')[1]; "
                          "i=json.load(open(d+'/index.json')); m=json.load(open(b(i['manifests'][0]['digest']))); "
                          "print(b(m['layers'][0]['digest']))",
                          layout});
  INFO("layer blob: " << ls.out << ls.err);
  REQUIRE(ls.rc == 0);
  const std::string blob = ls.out.substr(0, ls.out.find('\n'));
  const std::string good = slurp(blob);
  // Same size, one byte of gzip's trailer (its CRC) changed: the archive
  // may even read, the digest does not match.
  std::string bad = good;
  bad[bad.size() - 6] = char(bad[bad.size() - 6] ^ 0x55);
  ::chmod(blob.c_str(), 0644);
  write_file(blob, bad);
  fx.refused(layout + ":t", "does not match its digest");
  write_file(blob, good);
  REQUIRE(plyctl_out({"import", fx.img, "t", layout + ":t"}).rc == 0);
}

TEST_CASE("import of more than the image holds fails with ENOSPC and gives the space back", "[io-bad]") {
  TempDir tmp;
  const std::string img = tmp / "img", src = tmp / "src";
  mkfs(img, "48M", tmp / "mkfs.log");
  ::mkdir(src.c_str(), 0755);
  std::mt19937_64 rng(seed("io-enospc"));
  std::string data(8u << 20, '\0');
  for (auto& c : data) c = char(rng());
  for (int i = 0; i < 8; i++) write_file(src + "/f" + std::to_string(i), data);
  const std::string before = branch_list(img);
  const Out show0 = plyctl_out({"show", img, "--json"});
  const Out o = plyctl_out({"import", img, "big", src});
  INFO(o.err);
  CHECK(o.rc == 1);
  CHECK(one_line_error(o.err));
  CHECK(o.err.find("space") != std::string::npos);
  CHECK(branch_list(img) == before);
  require_fsck_clean(img, tmp / "fsck.log");
  // Every block back: the same free blocks as before.
  const json a = json::parse(show0.out), b = json::parse(plyctl_out({"show", img, "--json"}).out);
  CHECK(a["free_blocks"] == b["free_blocks"]);
  // And a smaller import fits afterwards.
  ::unlink((src + "/f0").c_str());
  for (int i = 2; i < 8; i++) ::unlink((src + "/f" + std::to_string(i)).c_str());
  CHECK(plyctl_out({"import", img, "small", src}).rc == 0);
  require_fsck_clean(img, tmp / "fsck.log");
}

}  // namespace
}  // namespace plyfs::iotest
