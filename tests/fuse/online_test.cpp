// Online parity and durability (issue 24): plyctl's read-only commands on a
// mounted image (by its path, or another path to the same file) and on its
// mount point print what they print offline after the unmount; view
// create, default and delete through the mount, each one generation, with
// the new default shown by the next plain mount; branch changes --save'd
// into the mounted view across a remount; and what makes data durable on a
// plyfs mount: fsync (sync FILE), fsync of a directory and plyctl sync,
// each followed by SIGKILL of the daemon and a remount.
#include <nlohmann/json.hpp>

#include <functional>
#include <map>

#include "blockdev/blockdev.h"
#include "fuse_util.h"
#include "json_schema.h"

using namespace plyfs::fusetest;
using nlohmann::json;

namespace {

using Out = CtlOut;

// Output of a command that must succeed with nothing on stderr.
std::string ok_out(const TempDir& tmp, std::vector<std::string> args) {
  Out o = ctl(tmp, std::move(args));
  REQUIRE(o.rc == 0);
  CHECK(o.err.empty());
  return o.out;
}

// A command's --json output, valid by the schema of `command`.
json validated(const TempDir& tmp, const std::string& command, std::vector<std::string> args) {
  args.push_back("--json");
  return schema_checked(command, ok_out(tmp, std::move(args)));
}

uint64_t durable_generation(const TempDir& tmp, const std::string& where) {
  return validated(tmp, "sync", {"sync", where})["generation"].get<uint64_t>();
}

// What plyctl show prints, without its first line (the path it was given).
std::string without_first_line(const std::string& s) { return s.substr(s.find('\n') + 1); }

// An image with a base, a layer on it, a clone of the layer, a snapshot and
// a second view; the default view shows the layer over main.
void make_catalog(Fixture& fx) {
  write_file(fx / "base-file", "in main");
  fx.unmount();
  plyctl(fx, {"layer", "create", fx.img, "work", "--on", "main"});
  plyctl(fx, {"branch", "create", fx.img, "other"});
  plyctl(fx, {"clone", fx.img, "main", "copy"});
  plyctl(fx, {"snapshot", fx.img, "--branch", "main", "--name", "main-snap"});
  plyctl(fx, {"view", "create", fx.img, "dev", "work=rw:main=ro", "--default"});
  plyctl(fx, {"view", "create", fx.img, "alt", "other=rw:main=ro"});
  fx.mount();
}

}  // namespace

TEST_CASE("online: show, branch list, layer list and view list on a mounted image print what they print offline",
          "[online]") {
  Fixture fx;
  make_catalog(fx);
  write_file(fx / "new-file", std::string(100000, 'x'));
  REQUIRE(::mkdir((fx / "dir").c_str(), 0755) == 0);
  // Nothing left in the kernel's cache, so that nothing changes from here
  // to the unmount.
  plyctl(fx, {"sync", fx.root()});
  const std::string link = fx.tmp / "same-image";  // another path to the same file
  REQUIRE(::symlink(fx.img.c_str(), link.c_str()) == 0);

  // Each command on the image's path, on another path to it, and on the
  // mount point (branch list MNT shows the stack: --all the image's
  // branches), as JSON and as text.
  struct Cmd {
    std::string schema;
    std::vector<std::string> words;
  };
  const std::vector<Cmd> cmds = {{"show", {"show"}},
                                 {"branch list IMAGE", {"branch", "list"}},
                                 {"layer list", {"layer", "list"}},
                                 {"view list", {"view", "list"}}};
  // show commits first, so that what it shows is a durable generation: the
  // other commands run after it, and nothing changes until the unmount.
  std::map<std::string, std::string> online;
  for (const auto& c : cmds)
    for (const std::string& where : {fx.img, link, fx.root()}) {
      std::vector<std::string> a = c.words;
      if (where == fx.root() && c.schema == "branch list IMAGE") a.push_back("--all");
      a.push_back(where);
      const std::string key = c.schema + " " + (where == fx.root() ? "mnt" : where == link ? "link" : "img");
      online[key + " json"] = validated(fx.tmp, where == fx.root() && c.schema == "branch list IMAGE"
                                                    ? "branch list MOUNTPOINT --all" : c.schema, a).dump();
      online[key + " text"] = ok_out(fx.tmp, a);
    }
  // The mount point's own stack is unchanged.
  CHECK(ok_out(fx.tmp, {"branch", "list", fx.root()}) == "work=rw:main=ro\n");
  const uint64_t gen_online = json::parse(online["show img json"])["generation"].get<uint64_t>();
  fx.unmount();

  for (const auto& c : cmds) {
    std::vector<std::string> a = c.words;
    a.push_back(fx.img);
    const std::string offline_json = validated(fx.tmp, c.schema, a).dump();
    const std::string offline_text = ok_out(fx.tmp, a);
    for (const std::string w : {"img", "link", "mnt"}) {
      const std::string key = c.schema + " " + w;
      INFO(key);
      if (c.schema == "show") {
        // The unmount committed nothing more: the same generation, trees
        // and space, and both superblock slots valid.
        json on = json::parse(online[key + " json"]), off = json::parse(offline_json);
        CHECK(on["generation"].get<uint64_t>() == gen_online);
        CHECK(on == off);
        CHECK(without_first_line(online[key + " text"]) == without_first_line(offline_text));
        const std::string shown_path = w == "img" ? fx.img : w == "link" ? link : fx.tmp / "mnt";
        CHECK(online[key + " text"].rfind("Filesystem   " + shown_path + "\n", 0) == 0);
      } else {
        CHECK(online[key + " json"] == offline_json);
        CHECK(online[key + " text"] == offline_text);
      }
    }
  }
}

TEST_CASE("online: a mounted block device is found by its device number, under any name", "[online]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "128M", tmp / "mkfs.log");
  const std::string log = tmp / "losetup.log";
  REQUIRE(run({"/bin/sh", "-c", "losetup -f --show '" + img + "'"}, log) == 0);
  std::string loop = slurp(log);
  while (!loop.empty() && loop.back() == '\n') loop.pop_back();
  REQUIRE(loop.rfind("/dev/loop", 0) == 0);
  struct Detach {  // after the mount below is gone
    std::string dev;
    ~Detach() {
      if (std::system(("losetup -d '" + dev + "'").c_str()) != 0) std::fprintf(stderr, "cannot detach %s\n", dev.c_str());
    }
  } detach{loop};
  // Another node of the same device: a match by name would miss it.
  struct stat st;
  REQUIRE(::stat(loop.c_str(), &st) == 0);
  const std::string node = tmp / "same-device";
  REQUIRE(::mknod(node.c_str(), S_IFBLK | 0600, st.st_rdev) == 0);
  {
    Mount m(loop, tmp / "mnt");
    m.start();
    write_file(m / "f", "data");
    (void)durable_generation(tmp, m.path());  // nothing left in the kernel's cache
    const json by_mnt = validated(tmp, "show", {"show", m.path()});
    CHECK(validated(tmp, "show", {"show", loop}) == by_mnt);
    CHECK(validated(tmp, "show", {"show", node}) == by_mnt);
    CHECK(validated(tmp, "branch list IMAGE", {"branch", "list", node}) ==
          validated(tmp, "branch list MOUNTPOINT --all", {"branch", "list", m.path(), "--all"}));
    CHECK(durable_generation(tmp, node) == by_mnt["generation"].get<uint64_t>());
    REQUIRE(m.unmount() == 0);
  }
  require_fsck_clean(loop, tmp / "fsck.log");
}

TEST_CASE("online: an image locked by something that is no plyfs mount keeps its error", "[online]") {
  Fixture fx;
  fx.unmount();
  // Holds the image's lock as a plyfs program other than the daemon does.
  auto dev = plyfs::FileDevice::open(fx.img, plyfs::FileOpenOptions{false, true});
  REQUIRE(dev);
  for (const std::vector<std::string>& a :
       {std::vector<std::string>{"branch", "list", fx.img}, {"view", "list", fx.img}, {"layer", "list", fx.img},
        {"view", "create", fx.img, "v", "main"}, {"sync", fx.img}}) {
    Out o = ctl(fx.tmp, a);
    CHECK(o.rc == 1);
    CHECK(o.out.empty());
    CHECK(o.err.find("it is mounted or in use: unmount it first, or give the mount point") != std::string::npos);
  }
  Out o = ctl(fx.tmp, {"show", fx.img});
  CHECK(o.rc == 1);
  CHECK(o.err.find("in use") != std::string::npos);
  dev->reset();
  // Unlocked and unmounted: sync has nothing to do and says which
  // generation is durable.
  const uint64_t g = durable_generation(fx.tmp, fx.img);
  CHECK(g == validated(fx.tmp, "show", {"show", fx.img})["generation"].get<uint64_t>());
  CHECK(ok_out(fx.tmp, {"sync", fx.img}) == "generation " + std::to_string(g) + " is durable\n");
}

TEST_CASE("online: view create, default and delete through a mount, one generation each", "[online]") {
  Fixture fx;
  fx.unmount();
  plyctl(fx, {"layer", "create", fx.img, "work", "--on", "main"});
  fx.mount();  // no views: the mount shows main
  CHECK(ok_out(fx.tmp, {"view", "list", fx.root()}) == "no views; a mount shows main=rw\n");
  CHECK(ok_out(fx.tmp, {"view", "list", fx.img}) == "no views; a mount shows main=rw\n");

  uint64_t g = durable_generation(fx.tmp, fx.root());
  CHECK(ok_out(fx.tmp, {"view", "create", fx.root(), "dev", "work=rw:main=ro", "--default"}) ==
        "created view \"dev\": work=rw:main=ro (the default)\n");
  CHECK(durable_generation(fx.tmp, fx.root()) == g + 1);
  json v = validated(fx.tmp, "view create", {"view", "create", fx.img, "plain", "main"});
  CHECK(v["name"] == "plain");
  CHECK(v["default"] == false);
  REQUIRE(v["stack"].size() == 1);
  CHECK(v["stack"][0]["branch"] == "main");
  CHECK(v["stack"][0]["writable"] == true);
  CHECK(durable_generation(fx.tmp, fx.img) == g + 2);
  CHECK(ok_out(fx.tmp, {"view", "default", fx.img, "plain"}) == "view \"plain\" is the default: main=rw\n");
  CHECK(ok_out(fx.tmp, {"view", "default", fx.root(), "dev"}) == "view \"dev\" is the default: work=rw:main=ro\n");
  CHECK(ok_out(fx.tmp, {"view", "create", fx.root(), "gone", "work"}) == "created view \"gone\": work=rw\n");
  v = validated(fx.tmp, "view delete", {"view", "delete", fx.root(), "gone"});
  CHECK(v["name"] == "gone");
  CHECK(durable_generation(fx.tmp, fx.root()) == g + 6);
  // Refusals come back as offline: a bad stack, a missing view, a bad name.
  Out o = ctl(fx.tmp, {"view", "create", fx.root(), "bad", "nosuch=rw"});
  CHECK(o.rc == 1);
  CHECK(o.err.find("nosuch") != std::string::npos);
  o = ctl(fx.tmp, {"view", "delete", fx.img, "nosuch"});
  CHECK(o.rc == 1);
  CHECK(o.err == "plyctl: no view named \"nosuch\"\n");
  o = ctl(fx.tmp, {"view", "create", fx.root(), "a:b", "main"});
  CHECK(o.rc == 1);
  // The mount keeps the stack it shows until it is remounted.
  CHECK(ok_out(fx.tmp, {"branch", "list", fx.root()}) == "main=rw\n");
  const std::string views_online = validated(fx.tmp, "view list", {"view", "list", fx.root()}).dump();
  const std::string text_online = ok_out(fx.tmp, {"view", "list", fx.img});
  fx.remount();  // without -o view: the new default
  CHECK(ok_out(fx.tmp, {"branch", "list", fx.root()}) == "work=rw:main=ro\n");
  fx.unmount();
  CHECK(validated(fx.tmp, "view list", {"view", "list", fx.img}).dump() == views_online);
  CHECK(ok_out(fx.tmp, {"view", "list", fx.img}) == text_online);
}

TEST_CASE("online: branch add, move, set and remove --save write the mounted view, kept across a remount",
          "[online]") {
  Fixture fx;
  make_catalog(fx);  // the mount shows the default view, dev
  auto stack = [&] { return ok_out(fx.tmp, {"branch", "list", fx.root()}); };
  auto view_stack = [&](const std::string& name) {
    for (const auto& w : validated(fx.tmp, "view list", {"view", "list", fx.img}))
      if (w["name"] == name) {
        std::string s;
        for (const auto& e : w["stack"]) s += (s.empty() ? "" : ":") + e["branch"].get<std::string>() + (e["writable"] == true ? "=rw" : "=ro");
        return s;
      }
    FAIL("no view " << name);
    return std::string();
  };
  // Without --save the view stays.
  plyctl(fx, {"branch", "add", fx.root(), "other", "--at", "2", "--ro"});
  CHECK(stack() == "work=rw:main=ro:other=ro\n");
  CHECK(view_stack("dev") == "work=rw:main=ro");
  plyctl(fx, {"branch", "remove", fx.root(), "other"});
  // With it, each change lands in the view too, and the answer is the same.
  CHECK(ok_out(fx.tmp, {"branch", "add", fx.root(), "other", "--at", "2", "--ro", "--save"}) ==
        "work=rw:main=ro:other=ro\n");
  CHECK(view_stack("dev") == "work=rw:main=ro:other=ro");
  plyctl(fx, {"branch", "move", fx.root(), "other", "1", "--save"});
  CHECK(view_stack("dev") == "work=rw:other=ro:main=ro");
  json j = validated(fx.tmp, "branch set MOUNTPOINT", {"branch", "set", fx.root(), "other", "--rw", "--save"});
  CHECK(j[1]["writable"] == true);
  CHECK(view_stack("dev") == "work=rw:other=rw:main=ro");
  plyctl(fx, {"branch", "remove", fx.root(), "main", "--save"});
  CHECK(view_stack("dev") == "work=rw:other=rw");
  CHECK(view_stack("alt") == "other=rw:main=ro");  // no other view changes
  fx.remount();
  CHECK(stack() == "work=rw:other=rw\n");

  // -o view=alt: --save writes alt, even though dev is the default.
  fx.unmount();
  fx.opts = {"view=alt"};
  fx.mount();
  plyctl(fx, {"branch", "set", fx.root(), "main", "--rw", "--save"});
  CHECK(view_stack("alt") == "other=rw:main=rw");
  CHECK(view_stack("dev") == "work=rw:other=rw");
  // The view deleted under the mount: refused, and the stack is unchanged.
  plyctl(fx, {"view", "delete", fx.root(), "alt"});
  Out o = ctl(fx.tmp, {"branch", "add", fx.root(), "copy", "--ro", "--save"});
  CHECK(o.rc == 1);
  CHECK(o.err.find("view \"alt\", which this mount shows, was deleted") != std::string::npos);
  CHECK(stack() == "other=rw:main=rw\n");

  // -o branches=: no view to save into.
  fx.unmount();
  fx.opts = {"branches=copy=rw"};
  fx.mount();
  o = ctl(fx.tmp, {"branch", "add", fx.root(), "main", "--ro", "--save"});
  CHECK(o.rc == 1);
  CHECK(o.err.find("this mount shows no view") != std::string::npos);
  CHECK(stack() == "copy=rw\n");
  // --save and --all where they do not belong.
  CHECK(ctl(fx.tmp, {"branch", "list", fx.root(), "--save"}).rc == 2);
  CHECK(ctl(fx.tmp, {"branch", "add", fx.root(), "main", "--all"}).rc == 2);
  fx.unmount();
  o = ctl(fx.tmp, {"branch", "set", fx.img, "main", "--ro", "--save"});
  CHECK(o.rc == 2);
  CHECK(o.err.find("--save is for a mount point") != std::string::npos);
}

TEST_CASE("online: show and the lists still answer on a mount a damaged block turned read-only", "[online]") {
  std::mt19937_64 rng(seed("online-eio"));
  Fixture fx("128M");
  const std::string victim = random_bytes(rng, 4096);
  write_file(fx / "victim", victim);
  fx.unmount();
  {  // one bit of the file's block flipped: its checksum fails at the read
    int fd = ::open(fx.img.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    std::string buf(4096, '\0');
    std::vector<off_t> at;
    for (off_t off = 0; ::pread(fd, buf.data(), buf.size(), off) == ssize_t(buf.size()); off += 4096)
      if (buf == victim) at.push_back(off);
    REQUIRE(at.size() == 1);
    char c;
    REQUIRE(::pread(fd, &c, 1, at[0] + 100) == 1);
    c = char(c ^ 0x01);
    REQUIRE(::pwrite(fd, &c, 1, at[0] + 100) == 1);
    ::close(fd);
  }
  fx.mount();
  const json before = validated(fx.tmp, "show", {"show", fx.root()});
  int fd = ::open((fx / "victim").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  char b[4096];
  REQUIRE_ERRNO(::pread(fd, b, sizeof b, 0), EIO);
  ::close(fd);
  // The volume is read-only now: show answers its newest durable
  // generation, the lists answer, and sync says it cannot commit.
  const json after = validated(fx.tmp, "show", {"show", fx.img});
  CHECK(after["generation"] == before["generation"]);
  validated(fx.tmp, "branch list IMAGE", {"branch", "list", fx.img});
  validated(fx.tmp, "view list", {"view", "list", fx.root()});
  Out o = ctl(fx.tmp, {"sync", fx.root()});
  CHECK(o.rc == 1);
  CHECK(o.err.rfind("plyctl: ", 0) == 0);
  CHECK(o.err.find('\n') == o.err.size() - 1);
  REQUIRE(fx.m->unmount() < 128);
  fx.m.reset();
}

namespace {

// Writes `name` (with content) through a mount without periodic commits,
// makes it durable with `sync_it`, SIGKILLs the daemon and remounts: the
// file must be there with its content, and the image fsck-clean.
void durable_after_kill(const std::function<void(Fixture&, const std::string&)>& sync_it) {
  Fixture fx("256M", {"commit=0"});
  std::mt19937_64 rng(seed("online-durable"));
  const std::string data = random_bytes(rng, 3 * 1024 * 1024 + 123);
  write_file(fx / "file", data);  // closed: its pages may still be the kernel's
  sync_it(fx, fx / "file");
  fx.m->kill9();
  fx.mount();
  REQUIRE_SAME(read_file(fx / "file"), data);
  fx.unmount();
}

}  // namespace

TEST_CASE("online: without a sync, SIGKILL of a commit=0 mount loses a new file", "[online]") {
  // The control for the tests below: they would pass vacuously if nothing
  // were ever lost.
  Fixture fx("256M", {"commit=0"});
  write_file(fx / "file", "lost");
  fx.m->kill9();
  fx.mount();
  struct stat st;
  REQUIRE_ERRNO(::lstat((fx / "file").c_str(), &st), ENOENT);
  fx.unmount();
}

TEST_CASE("online: sync FILE (fsync) makes a file durable across SIGKILL of the daemon", "[online]") {
  durable_after_kill([](Fixture& fx, const std::string& file) {
    REQUIRE(run({"/usr/bin/sync", file}, fx.tmp / "sync.log") == 0);
  });
}

TEST_CASE("online: plyctl sync MOUNTPOINT and IMAGE make a file durable across SIGKILL", "[online]") {
  SECTION("the mount point") {
    durable_after_kill([](Fixture& fx, const std::string&) {
      std::string out;
      plyctl(fx, {"sync", fx.root()}, &out);
      CHECK(out.rfind("generation ", 0) == 0);
      CHECK(out.find(" is durable\n") != std::string::npos);
    });
  }
  SECTION("the image") {
    durable_after_kill([](Fixture& fx, const std::string&) { plyctl(fx, {"sync", fx.img, "--json"}); });
  }
}

TEST_CASE("online: fsync of a directory makes new names in it durable across SIGKILL", "[online]") {
  Fixture fx("256M", {"commit=0"});
  REQUIRE(::mkdir((fx / "d").c_str(), 0755) == 0);
  write_file(fx / "d/empty", "");
  REQUIRE(::symlink("target", (fx / "d/link").c_str()) == 0);
  const int fd = ::open((fx / "d").c_str(), O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  REQUIRE(::fsync(fd) == 0);
  ::close(fd);
  fx.m->kill9();
  fx.mount();
  CHECK(list_dir(fx / "d") == std::vector<std::string>{"empty", "link"});
  CHECK(lstat_of(fx / "d/empty").st_size == 0);
  char buf[16] = {};
  CHECK(::readlink((fx / "d/link").c_str(), buf, sizeof buf - 1) == 6);
  fx.unmount();
}
