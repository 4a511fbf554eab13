// plyctl as users and scripts run it (plyctl.8): every command's --json
// output, offline on the image and online through a real mount, validated
// against docs/plyctl.schema.json; names that are not UTF-8, with spaces or
// non-ASCII letters; diff -z and escaped names; the name rule at plyctl,
// the daemon's control requests and the control folder; old images that
// hold bad names; the usage errors and EBUSY explanations; the control
// channel's version check.
#include <sys/ioctl.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "../../fuse/control.h"
#include "blockdev/blockdev.h"
#include "commit/volume.h"
#include "fs/fs.h"
#include "fuse_util.h"
#include "json_schema.h"
#include "util/text.h"

using namespace plyfs::fusetest;
using nlohmann::json;

namespace {

using Out = CtlOut;

// M1 of snap/model.h, everywhere in `j`: a FIELD_bytes member holds base64
// of bytes that are not UTF-8, and FIELD holds them decoded lossily.
void check_bytes_fields(const json& j, const std::string& path = "$") {
  if (j.is_array())
    for (size_t i = 0; i < j.size(); i++) check_bytes_fields(j[i], path + "[" + std::to_string(i) + "]");
  if (!j.is_object()) return;
  for (const auto& [k, v] : j.items()) {
    check_bytes_fields(v, path + "." + k);
    if (k.size() < 7 || k.compare(k.size() - 6, 6, "_bytes") != 0) continue;
    INFO(path << "." << k);
    const std::string field = k.substr(0, k.size() - 6);
    REQUIRE(j.contains(field));
    auto raw = plyfs::unbase64(v.get<std::string>());
    REQUIRE(raw);
    CHECK(!plyfs::valid_utf8(*raw));
    CHECK(j[field].get<std::string>() == plyfs::lossy_utf8(*raw));
  }
}

// A command's --json output: exit 0, nothing on stderr, one line of JSON
// that the command's schema accepts.
json validated(const std::string& command, const Out& o) {
  INFO("plyctl " << command << " --json:\n" << o.out << "\nstderr: " << o.err);
  REQUIRE(o.rc == 0);
  CHECK(o.err.empty());
  REQUIRE(!o.out.empty());
  REQUIRE(o.out.back() == '\n');
  CHECK(o.out.find('\n') == o.out.size() - 1);
  json j = json::parse(o.out, nullptr, false);
  REQUIRE(!j.is_discarded());
  const auto problems = schema().validate(j, schema().command(command));
  std::string all;
  for (const auto& p : problems) all += p + "\n";
  INFO("schema problems:\n" << all);
  CHECK(problems.empty());
  check_bytes_fields(j);
  return j;
}

json info_json(const std::string& path) {
  const std::string text = read_file(path);
  json j = json::parse(text, nullptr, false);
  INFO(path << ":\n" << text);
  REQUIRE(!j.is_discarded());
  const auto problems = schema().validate(j, schema().command("info.json"));
  CHECK(problems.empty());
  check_bytes_fields(j);
  return j;
}

// Gives branch `id` of an unmounted image the name `name`, as an old image
// (or a damaged one) may hold it: straight through the library, with no
// name rule on the way.
void set_raw_name(const std::string& img, uint64_t id, const std::string& name) {
  auto dev = plyfs::FileDevice::open(img, plyfs::FileOpenOptions{false, true});
  REQUIRE(dev);
  plyfs::VolumeOptions vo;
  vo.kinds = plyfs::fs_kinds();
  auto vol = plyfs::Volume::open(**dev, vo);
  REQUIRE(vol);
  auto b = plyfs::Filesystem::branch(**vol, plyfs::TreeId{id});
  REQUIRE(b);
  b->name = name;
  REQUIRE(plyfs::Filesystem::set_branch(**vol, *b));
  REQUIRE((*vol)->close());
}

// One raw request over the control channel (fuse/control.h).
struct Answer {
  int rc, status;
  uint32_t version;
  std::string text;
};
Answer raw_control(const std::string& mnt, const std::string& request, uint32_t version = plyfs::kControlVersion) {
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  plyfs::ControlMsg m{};
  m.version = version;
  std::snprintf(m.request, sizeof m.request, "%s", request.c_str());
  const int rc = ::ioctl(fd, plyfs::kControlIoctl, &m);
  ::close(fd);
  m.answer[sizeof m.answer - 1] = 0;
  return {rc, m.status, m.version, m.answer};
}

// Names a diff reports, as files of the mount: not UTF-8, a tab, a newline,
// a backslash, spaces and letters beyond ASCII, a control character.
const std::vector<std::string> kOddNames = {"bad\xff\xfe", "tab\there", "new\nline", "back\\slash",
                                            "sp ace \xc3\xbc", "ctl\x01x"};

}  // namespace

TEST_CASE("plyctl: every command's --json output, offline and online, matches the schema", "[plyctl]") {
  Fixture fx;
  write_file(fx / "plain", "plain");
  fx.unmount();
  const std::string other = "other \xc3\xbc branch";  // spaces and a letter beyond ASCII
  validated("branch create", ctl(fx.tmp, {"branch", "create", fx.img, other, "--json"}));
  fx.mount();

  // --- online: every command on the mount point.
  validated("branch list MOUNTPOINT", ctl(fx.tmp, {"branch", "list", fx.root(), "--json"}));
  auto s = validated("snapshot", ctl(fx.tmp, {"snapshot", fx.root(), "--name", "s1", "--json"}));
  CHECK(s["snapshot"]["name"] == "s1");
  CHECK(s["snapshot"]["snapshot"] == true);
  CHECK(s["snapshot"]["origin"]["branch"] == "main");
  CHECK(s["live"]["name"] == "main");
  for (const auto& n : kOddNames) write_file(fx / n, n);
  ::mkdir((fx / "dir \xe2\x82\xac").c_str(), 0755);
  REQUIRE(::rename((fx / "plain").c_str(), (fx / "renamed\xff").c_str()) == 0);
  auto d = validated("diff", ctl(fx.tmp, {"diff", fx.root(), "s1", "main", "--json"}));
  std::set<std::string> paths;
  for (const auto& e : d) {
    auto p = plyfs::unbase64(e.value("path_bytes", plyfs::base64(e["path"].get<std::string>())));
    REQUIRE(p);
    paths.insert(*p);
    if (e["change"] == "renamed") {
      auto np = plyfs::unbase64(e["new_path_bytes"].get<std::string>());
      REQUIRE(np);
      CHECK(*np == "/renamed\xff");
    }
  }
  for (const auto& n : kOddNames) CHECK(paths.count("/" + n));  // the exact bytes, through the JSON
  CHECK(paths.count("/plain"));
  auto c = validated("clone", ctl(fx.tmp, {"clone", fx.root(), "s1", "my clone \xc3\xa9", "--ro", "--json"}));
  CHECK(c["name"] == "my clone \xc3\xa9");
  CHECK(c["writable"] == false);
  auto st = validated("branch add", ctl(fx.tmp, {"branch", "add", fx.root(), other, "--at", "1", "--ro", "--json"}));
  CHECK(st[1]["branch"] == other);
  validated("branch set MOUNTPOINT", ctl(fx.tmp, {"branch", "set", fx.root(), other, "--rw", "--json"}));
  st = validated("branch move", ctl(fx.tmp, {"branch", "move", fx.root(), other, "0", "--json"}));
  CHECK(st[0]["branch"] == other);
  CHECK(st[0]["writable"] == true);
  auto info = info_json(fx / (".plyfs/layers/" + other + "/info.json"));
  CHECK(info["name"] == other);
  CHECK(info["mounted"] == true);
  info_json(fx / ".plyfs/layers/main/info.json");
  validated("branch remove MOUNTPOINT", ctl(fx.tmp, {"branch", "remove", fx.root(), other, "--json"}));
  // A layer on main, stacked over it online, merged down.
  REQUIRE(::mkdir((fx / ".plyfs/layers/work").c_str(), 0755) == 0);
  plyctl(fx, {"branch", "add", fx.root(), "work"});
  plyctl(fx, {"branch", "set", fx.root(), "main", "--ro"});
  write_file(fx / "in-work", "w");
  auto m = validated("merge", ctl(fx.tmp, {"merge", fx.root(), "work", "--json"}));
  CHECK(m["merged"]["name"] == "work");
  CHECK(m["entries"].get<uint64_t>() > 0);
  validated("snapshot", ctl(fx.tmp, {"snapshot", fx.root(), "--name", "s2", "--json"}));
  write_file(fx / "scratch", "x");
  auto r = validated("rollback", ctl(fx.tmp, {"rollback", fx.root(), "work", "--json"}));
  CHECK(r["branch"]["name"] == "work");
  CHECK(r["to"]["branch"] == "s2");
  auto del = validated("delete", ctl(fx.tmp, {"delete", fx.root(), "my clone \xc3\xa9", "--json"}));
  CHECK(del["name"] == "my clone \xc3\xa9");
  // A diff of the same trees online and offline: the same bytes in all forms.
  for (const auto& n : kOddNames) write_file(fx / ("again-" + n), n);
  const std::string on_json = ctl(fx.tmp, {"diff", fx.root(), "s2", "work", "--json"}).out;
  const std::string on_text = ctl(fx.tmp, {"diff", fx.root(), "s2", "work"}).out;
  const std::string on_z = ctl(fx.tmp, {"diff", fx.root(), "s2", "work", "-z"}).out;
  fx.unmount();
  auto off = validated("diff", ctl(fx.tmp, {"diff", fx.img, "s2", "work", "--json"}));
  CHECK(off.size() == kOddNames.size() + 1);  // and the root directory, modified
  CHECK(off[0]["change"] == "modified");
  CHECK(off[0]["path"] == "/");
  REQUIRE_SAME(on_json, ctl(fx.tmp, {"diff", fx.img, "s2", "work", "--json"}).out);
  REQUIRE_SAME(on_text, ctl(fx.tmp, {"diff", fx.img, "s2", "work"}).out);
  REQUIRE_SAME(on_z, ctl(fx.tmp, {"diff", fx.img, "s2", "work", "-z"}).out);

  // --- offline: every command on the image.
  auto img = validated("show", ctl(fx.tmp, {"show", fx.img, "--json"}));
  CHECK(img["slots"][0] == "valid");
  auto bl = validated("branch list IMAGE", ctl(fx.tmp, {"branch", "list", fx.img, "--json"}));
  CHECK(bl.size() == 4);  // work (main merged into it), other, s1, s2
  validated("branch create", ctl(fx.tmp, {"branch", "create", fx.img, "new one", "--json"}));
  auto set = validated("branch set IMAGE", ctl(fx.tmp, {"branch", "set", fx.img, "new one", "--name", "renamed \xc3\xa5", "--ro", "--json"}));
  CHECK(set["name"] == "renamed \xc3\xa5");
  CHECK(set["writable"] == false);
  auto lc = validated("layer create", ctl(fx.tmp, {"layer", "create", fx.img, "lay", "--on", "work", "--json"}));
  CHECK(lc["layer"] == true);
  CHECK(lc["parent"]["branch"] == "work");
  auto ll = validated("layer list", ctl(fx.tmp, {"layer", "list", fx.img, "--json"}));
  bool work_has_child = false;
  for (const auto& b : ll)
    if (b["name"] == "work") work_has_child = b["children"].size() == 1 && b["children"][0]["branch"] == "lay";
  CHECK(work_has_child);
  validated("layer delete", ctl(fx.tmp, {"layer", "delete", fx.img, "lay", "--json"}));
  auto v = validated("view create", ctl(fx.tmp, {"view", "create", fx.img, "my view", "work=rw:" + other + "=ro", "--json"}));
  CHECK(v["stack"][1]["branch"] == other);
  validated("view list", ctl(fx.tmp, {"view", "list", fx.img, "--json"}));
  CHECK(validated("view default", ctl(fx.tmp, {"view", "default", fx.img, "my view", "--json"}))["default"] == true);
  plyctl(fx, {"view", "default", fx.img, "default"});  // the one the online merge made, again
  validated("view delete", ctl(fx.tmp, {"view", "delete", fx.img, "my view", "--json"}));
  validated("snapshot", ctl(fx.tmp, {"snapshot", fx.img, "--name", "s3", "--json"}));
  validated("clone", ctl(fx.tmp, {"clone", fx.img, "s3", "c \xc3\xbc", "--json"}));
  plyctl(fx, {"layer", "create", fx.img, "lay2", "--on", "work"});
  plyctl(fx, {"view", "create", fx.img, "default", "lay2=rw:work=ro", "--default"});
  validated("merge", ctl(fx.tmp, {"merge", fx.img, "lay2", "--json"}));
  validated("snapshot", ctl(fx.tmp, {"snapshot", fx.img, "--branch", "lay2", "--name", "s4", "--json"}));
  validated("rollback", ctl(fx.tmp, {"rollback", fx.img, "lay2", "--json"}));
  validated("delete", ctl(fx.tmp, {"delete", fx.img, "c \xc3\xbc", "--json"}));
  validated("branch remove IMAGE", ctl(fx.tmp, {"branch", "remove", fx.img, "renamed \xc3\xa5", "--json"}));
  validated("diff", ctl(fx.tmp, {"diff", fx.img, "s4", "lay2", "--json"}));
  validated("debug tree", ctl(fx.tmp, {"debug", "tree", fx.img, "root", "--json"}));
  validated("debug fields", ctl(fx.tmp, {"debug", "fields", "node", "--json"}));
  require_fsck_clean(fx.img, fx.tmp / "fsck.log");
  validated("debug corrupt", ctl(fx.tmp, {"debug", "corrupt", fx.img, "superblock", "0", "mkfs_time_ns", "--add", "1", "--json"}));
}

TEST_CASE("plyctl: diff -z gives names raw; text escapes them as ls --quoting-style=escape", "[plyctl]") {
  Fixture fx;
  plyctl(fx, {"snapshot", fx.root(), "--name", "s1"});
  for (const auto& n : kOddNames) write_file(fx / n, n);
  const Out z = ctl(fx.tmp, {"diff", fx.root(), "s1", "main", "-z"});
  REQUIRE(z.rc == 0);
  // NUL-terminated records "+<TAB>/NAME", sorted by path, names as they are.
  std::vector<std::string> names = kOddNames;
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) { return "/" + a < "/" + b; });
  std::string want = "M\t/" + std::string(1, '\0');  // the root directory, whose entries changed
  for (const auto& n : names) want += "+\t/" + n + std::string(1, '\0');
  REQUIRE_SAME(z.out, want);

  // Without -z, one line per entry: the names that hold control characters,
  // backslashes or bytes that are not UTF-8 as ls prints them in the escape
  // style (in a UTF-8 locale), the others as they are.
  const Out text = ctl(fx.tmp, {"diff", fx.root(), "s1", "main"});
  REQUIRE(text.rc == 0);
  const std::string dir = fx.tmp / "lsdir";
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  for (const auto& n : kOddNames) write_file(dir + "/" + n, "");
  REQUIRE(::setenv("LC_ALL", "C.UTF-8", 1) == 0);
  const int rc = run({"/bin/sh", "-c", "cd '" + dir + "' && ls -1 --quoting-style=escape"}, fx.tmp / "ls.out");
  REQUIRE(rc == 0);
  std::map<std::string, std::string> ls_of;  // name -> how ls shows it (ls sorts by its own collation)
  {
    std::istringstream in(slurp(fx.tmp / "ls.out"));
    std::vector<std::string> shown;
    for (std::string line; std::getline(in, line);) shown.push_back(line);
    REQUIRE(shown.size() == kOddNames.size());
    for (const auto& n : kOddNames)
      for (const auto& sh : shown)
        if (plyfs::escape(n) == sh) ls_of[n] = sh;
    for (const auto& n : kOddNames) {
      INFO("ls shows none of its lines as escape() shows " << plyfs::escape(n));
      CHECK(ls_of.count(n));
    }
  }
  std::string want_text = "M\t/\n";
  for (const auto& n : names) want_text += "+\t/" + (plyfs::needs_escape(n) ? ls_of[n] : n) + "\n";
  REQUIRE_SAME(text.out, want_text);
  CHECK(text.out.find("+\t/sp ace \xc3\xbc\n") != std::string::npos);  // nothing to escape: as it is
  CHECK(text.out.find("+\t/tab\\there\n") != std::string::npos);
  CHECK(text.out.find("+\t/bad\\377\\376\n") != std::string::npos);
  CHECK(ctl(fx.tmp, {"diff", fx.root(), "s1", "main", "-z", "--json"}).rc == 2);
}

TEST_CASE("plyctl: the name rule at plyctl, the daemon's requests and the control folder", "[plyctl]") {
  Fixture fx;
  const std::vector<std::string> bad = {"a/b", "..", ".", "a:b", "a=b", "a,b", "a\\b", "-a", " a", "a ", "a\nb",
                                        "a\tb", "a\x7f", "a\xc2\x85", "a\xff", "", std::string(33, 'x')};
  const std::vector<std::string> good = {"a b", "\xc3\xbc\xc3\xb1\xc3\xad", "a@1", "a.b", "a-", "#a", std::string(32, 'y')};
  // Online: plyctl checks first; the daemon checks what any client sends.
  for (const auto& n : bad) {
    INFO("name \"" << plyfs::escape(n) << "\"");
    Out o = ctl(fx.tmp, {"clone", fx.root(), "--", "main", n});  // -- : "-a" is a name here
    CHECK(o.rc == 1);
    CHECK(o.out.empty());
    CHECK(o.err.rfind("plyctl: invalid branch name", 0) == 0);
    CHECK(o.err.find('\n') == o.err.size() - 1);  // one line, whatever the name holds
    CHECK(ctl(fx.tmp, {"snapshot", fx.root(), "--name", n}).rc == 1);
    json req = {{"command", "clone"}, {"source", "main"}};
    req["name"] = plyfs::lossy_utf8(n);
    if (!plyfs::valid_utf8(n)) req["name_bytes"] = plyfs::base64(n);
    Answer a = raw_control(fx.root(), req.dump());
    CHECK(a.rc == 0);
    CHECK(a.status == (n.size() > 32 ? ENAMETOOLONG : EINVAL));
    CHECK(json::parse(a.text)["error"].get<std::string>().find("invalid branch name") != std::string::npos);
    json snap = {{"command", "snapshot"}, {"name", req["name"]}};
    if (req.contains("name_bytes")) snap["name_bytes"] = req["name_bytes"];
    CHECK(raw_control(fx.root(), snap.dump()).status == (n.size() > 32 ? ENAMETOOLONG : EINVAL));
    // The control folder: mkdir and rename in layers/ (names the kernel
    // itself takes apart or refuses are not the daemon's to see).
    if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos) continue;
    const std::string L = fx / ".plyfs/layers/";
    REQUIRE_ERRNO(::mkdir((L + n).c_str(), 0755), n.size() > 32 ? ENAMETOOLONG : EINVAL);
    REQUIRE_ERRNO(::mkdir((L + "main/children/" + n).c_str(), 0755), n.size() > 32 ? ENAMETOOLONG : EINVAL);
  }
  const std::string L = fx / ".plyfs/layers/";
  REQUIRE(::mkdir((L + "ok").c_str(), 0755) == 0);
  for (const auto& n : bad) {
    if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos) continue;
    INFO("rename to \"" << plyfs::escape(n) << "\"");
    REQUIRE_ERRNO(::rename((L + "ok").c_str(), (L + n).c_str()), n.size() > 32 ? ENAMETOOLONG : EINVAL);
  }
  for (const auto& n : good) {
    INFO("name \"" << n << "\"");
    REQUIRE(::rename((L + "ok").c_str(), (L + n).c_str()) == 0);
    REQUIRE(::rename((L + n).c_str(), (L + "ok").c_str()) == 0);
  }
  plyctl(fx, {"clone", fx.root(), "main", "online b"});  // a space passes online
  fx.unmount();

  // Offline: every command that gives a name refuses a bad one, changing nothing.
  const std::string before = slurp(fx.img);
  for (const auto& n : bad) {
    INFO("name \"" << plyfs::escape(n) << "\"");
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"branch", "create", fx.img, "--", n},
             {"branch", "create", fx.img, "--parent", "main", "--", n},
             {"branch", "create", fx.img, "--clone", "main", "--", n},
             {"branch", "set", fx.img, "main", "--name", n},
             {"layer", "create", fx.img, "--on", "main", "--", n},
             {"clone", fx.img, "main", "--", n},
             {"snapshot", fx.img, "--name", n},
             {"view", "create", fx.img, "--", n, "main"}}) {
      Out o = ctl(fx.tmp, args);
      CHECK(o.rc == 1);
      CHECK(o.err.find("invalid ") == 8);
      CHECK(o.err.find('\n') == o.err.size() - 1);
    }
  }
  CHECK(slurp(fx.img) == before);
  for (const auto& n : good) {
    INFO("name \"" << n << "\"");
    plyctl(fx, {"branch", "create", fx.img, n, "--parent", "main"});
    plyctl(fx, {"view", "create", fx.img, n, n + "=rw:main=ro"});
    plyctl(fx, {"view", "delete", fx.img, n});
    plyctl(fx, {"delete", fx.img, n});
  }
}

TEST_CASE("plyctl: an old image's bad branch names are listed safely, renamed and deleted", "[plyctl]") {
  Fixture fx;
  fx.unmount();
  plyctl(fx, {"branch", "create", fx.img, "x1"});  // 257
  plyctl(fx, {"branch", "create", fx.img, "x2"});  // 258
  plyctl(fx, {"branch", "create", fx.img, "x3"});  // 259
  set_raw_name(fx.img, 257, "a/b");
  set_raw_name(fx.img, 258, "bad\xff\nname");
  set_raw_name(fx.img, 259, "..");
  // Listed: one line per branch in text, valid JSON with the exact bytes.
  Out t = ctl(fx.tmp, {"branch", "list", fx.img});
  REQUIRE(t.rc == 0);
  CHECK(std::count(t.out.begin(), t.out.end(), '\n') == 5);  // the header and 4 branches
  CHECK(t.out.find("bad\\377\\nname") != std::string::npos);
  auto bl = validated("branch list IMAGE", ctl(fx.tmp, {"branch", "list", fx.img, "--json"}));
  CHECK(plyfs::unbase64(bl[2]["name_bytes"].get<std::string>()) == std::string("bad\xff\nname"));
  CHECK(bl[1]["name"] == "a/b");

  // Through a mount: layers/ lists (no EIO), a name no directory entry can
  // hold under its alias =ID; each can be renamed and removed.
  fx.mount();
  const std::string L = fx / ".plyfs/layers/";
  CHECK(list_dir(fx / ".plyfs/layers") ==
        (std::vector<std::string>{"=257", "=259", "bad\xff\nname", "main"}));
  auto ia = info_json(L + "=257/info.json");
  CHECK(ia["name"] == "a/b");
  CHECK(ia["id"] == 257);
  auto ib = info_json(L + "bad\xff\nname/info.json");
  CHECK(plyfs::unbase64(ib["name_bytes"].get<std::string>()) == std::string("bad\xff\nname"));
  REQUIRE(::rename((L + "=257").c_str(), (L + "fixed").c_str()) == 0);
  CHECK(info_json(L + "fixed/info.json")["id"] == 257);
  REQUIRE(::rmdir((L + "bad\xff\nname").c_str()) == 0);
  // The daemon takes ids (and the exact bytes, as name_bytes).
  REQUIRE(::rename((L + "=259").c_str(), (L + "back").c_str()) == 0);
  Answer a = raw_control(fx.root(), R"({"command":"clone","source":259,"name":"copy"})");
  CHECK(a.status == 0);
  CHECK(json::parse(a.text)["result"]["name"] == "copy");
  a = raw_control(fx.root(), R"({"command":"delete","branch":"c","branch_bytes":")" + plyfs::base64("copy") + "\"}");
  CHECK(a.status == 0);
  REQUIRE(::rename((L + "back").c_str(), (L + "..x").c_str()) == 0);
  REQUIRE(fx.m->unmount() == 0);  // no fsck yet: main, fixed and ..x are left
  fx.m.reset();
  set_raw_name(fx.img, 259, "..");
  // Offline: by id, or by name after --.
  plyctl(fx, {"branch", "set", fx.img, "259", "--name", "dots"});
  plyctl(fx, {"delete", fx.img, "dots"});
  set_raw_name(fx.img, 257, "-dash");
  plyctl(fx, {"branch", "set", fx.img, "--name", "nodash", "--", "-dash"});
  auto after = validated("branch list IMAGE", ctl(fx.tmp, {"branch", "list", fx.img, "--json"}));
  REQUIRE(after.size() == 2);
  CHECK(after[1]["name"] == "nodash");
  require_fsck_clean(fx.img, fx.tmp / "fsck.log");
}

TEST_CASE("plyctl: a command given an image for a mount point (or the reverse) says so; EBUSY says why",
          "[plyctl]") {
  Fixture fx;
  auto usage = [&](std::vector<std::string> args, const std::string& says) {
    Out o = ctl(fx.tmp, std::move(args));
    CHECK(o.rc == 2);
    CHECK(o.out.empty());
    CHECK(o.err.find(says) != std::string::npos);
    CHECK(o.err.find("\nTry 'plyctl --help'") == o.err.find('\n'));  // the message is one line
  };
  usage({"branch", "add", fx.img, "x"}, "branch add needs a mount point, and " + fx.img + " is not a directory");
  usage({"branch", "add", fx.img, "x"}, "plyctl view create");
  usage({"branch", "move", fx.img, "x", "1"}, "needs a mount point");
  usage({"branch", "create", fx.root(), "x"}, "branch create needs an image");
  usage({"branch", "create", fx.root(), "x"}, ".plyfs/layers/NAME");
  // show, view and layer list work on a mount point (issue 24,
  // online_test.cpp); layer create and delete need the image.
  usage({"layer", "create", fx.root(), "x", "--on", "main"}, "layer create needs an image");
  usage({"layer", "delete", fx.root(), "x"}, "layer delete needs an image");
  usage({"branch", "set", fx.img, "main", "--ro", "--save"}, "--save is for a mount point");
  usage({"snapshot", fx.root(), "--view", "v"}, "--view is for an image");
  fx.unmount();

  // An offline snapshot changes no view (it is a clone); a delete that a
  // view blocks says which view and what to do; one a layer blocks, which
  // layer.
  plyctl(fx, {"snapshot", fx.img, "--name", "s1"});
  CHECK(ctl(fx.tmp, {"view", "list", fx.img}).out.rfind("no views", 0) == 0);
  plyctl(fx, {"view", "create", fx.img, "default", "main", "--default"});
  Out o = ctl(fx.tmp, {"delete", fx.img, "main"});
  CHECK(o.rc == 1);
  CHECK(o.err.find("view \"default\" shows \"main\"") != std::string::npos);
  CHECK(o.err.find("plyctl view delete") != std::string::npos);
  CHECK(o.err.find("the default view") != std::string::npos);
  plyctl(fx, {"layer", "create", fx.img, "on-s1", "--on", "s1"});
  o = ctl(fx.tmp, {"delete", fx.img, "s1"});
  CHECK(o.rc == 1);
  CHECK(o.err.find("layer \"on-s1\" is made on \"s1\": merge or delete that layer first") != std::string::npos);
  plyctl(fx, {"delete", fx.img, "on-s1"});
  fx.mount();
  o = ctl(fx.tmp, {"branch", "remove", fx.root(), "main"});
  CHECK(o.rc == 1);
  CHECK(o.err.find("add another first, or unmount") != std::string::npos);
  // A branch the mount shows is refused online; one it does not, deleted.
  plyctl(fx, {"branch", "add", fx.root(), "s1", "--at", "1", "--ro"});
  o = ctl(fx.tmp, {"delete", fx.root(), "s1"});
  CHECK(o.rc == 1);
  CHECK(o.err.find("the mount shows \"s1\"") != std::string::npos);
  CHECK(o.err.find("plyctl branch remove") != std::string::npos);
  plyctl(fx, {"branch", "remove", fx.root(), "s1"});
  plyctl(fx, {"delete", fx.root(), "s1"});
}

TEST_CASE("plyctl: the control channel refuses another protocol version with a clear message", "[plyctl]") {
  Fixture fx;
  // A version 1 client: words, not JSON. The answer is text it can print.
  Answer a = raw_control(fx.root(), "list", 1);
  CHECK(a.rc == 0);
  CHECK(a.status == EPROTO);
  CHECK(a.version == plyfs::kControlVersion);
  CHECK(a.text == "this mount's plyfs speaks control protocol version 2, plyctl version 1: use the plyctl of the "
                  "same plyfs release");
  CHECK(fx.m->log().find("refused a control request of protocol version 1") != std::string::npos);
  // Version 2 but not JSON: refused, with a JSON error.
  a = raw_control(fx.root(), "list");
  CHECK(a.status == EINVAL);
  CHECK(json::parse(a.text)["error"] == "the request is not a JSON object");
  a = raw_control(fx.root(), R"({"command":"list"})");
  CHECK(a.status == 0);
  CHECK(json::parse(a.text)["result"][0]["branch"] == "main");
}
