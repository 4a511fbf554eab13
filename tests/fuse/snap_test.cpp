// Snapshots, merges, rollbacks, clones and diff through the real tools
// (format.md#snapshots): plyctl on a mount point (online) and on the image
// (offline), with files open across the changes, and automatic snapshots.
#include <sys/ioctl.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "../../fuse/control.h"
#include "fuse_util.h"

using namespace plyfs::fusetest;

namespace {

// One request over a mount's control channel (fuse/control.h), raw: the
// ioctl's result, the answer and the daemon's status.
struct Answer {
  int rc, status;
  std::string text;
};
Answer control(const std::string& mnt, const std::string& request) {
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  plyfs::ControlMsg m{};
  m.version = plyfs::kControlVersion;
  std::snprintf(m.request, sizeof m.request, "%s", request.c_str());
  const int rc = ::ioctl(fd, plyfs::kControlIoctl, &m);
  ::close(fd);
  m.answer[sizeof m.answer - 1] = 0;
  return {rc, m.status, m.answer};
}

// plyctl diff --json's output, parsed strictly: one array of flat objects
// whose values are strings (escapes decoded), then a newline. Fails the
// test on anything else.
std::vector<std::map<std::string, std::string>> parse_diff_json(const std::string& s) {
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n')) i++;
  };
  auto expect = [&](char c) {
    ws();
    INFO("JSON byte " << i << ": want '" << c << "'");
    REQUIRE(i < s.size());
    REQUIRE(s[i] == c);
    i++;
  };
  auto str = [&] {
    expect('"');
    std::string o;
    for (;;) {
      REQUIRE(i < s.size());
      char c = s[i++];
      if (c == '"') return o;
      REQUIRE(static_cast<unsigned char>(c) >= 0x20);
      if (c != '\\') {
        o += c;
        continue;
      }
      REQUIRE(i < s.size());
      c = s[i++];
      if (c == 'u') {
        REQUIRE(i + 4 <= s.size());
        o += char(std::stoi(s.substr(i, 4), nullptr, 16));
        i += 4;
      } else {
        REQUIRE((c == '"' || c == '\\' || c == '/'));
        o += c;
      }
    }
  };
  std::vector<std::map<std::string, std::string>> out;
  expect('[');
  ws();
  if (i < s.size() && s[i] == ']') {
    i++;
  } else {
    for (;;) {
      expect('{');
      auto& o = out.emplace_back();
      for (;;) {
        std::string k = str();
        expect(':');
        REQUIRE(o.emplace(k, str()).second);
        ws();
        REQUIRE(i < s.size());
        if (s[i++] == '}') break;
        REQUIRE(s[i - 1] == ',');
      }
      ws();
      REQUIRE(i < s.size());
      if (s[i++] == ']') break;
      REQUIRE(s[i - 1] == ',');
    }
  }
  REQUIRE(s.substr(i) == "\n");
  return out;
}

}  // namespace

TEST_CASE("snapshots: online snapshot with files open for writing, rollback, and a layer merged", "[snap-fuse]") {
  Fixture fx;
  write_file(fx / "f", "one");
  int fd = ::open((fx / "f").c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  pwrite_all(fd, "AAAA", 4, 0);  // before the snapshot: plyctl flushes it first
  const ino_t f_ino = lstat_of(fx / "f").st_ino;
  std::string out;
  REQUIRE(plyctl_status(fx, {"snapshot", fx.root(), "--name", "s1"}, &out) == 0);
  CHECK(out == "snapshot \"s1\" of \"main\" taken\n");
  // The mount's stack does not change: a snapshot is an O(1) clone.
  REQUIRE(plyctl_status(fx, {"branch", "list", fx.root()}, &out) == 0);
  CHECK(out == "main=rw\n");
  // Writes after it land in the live branch, through the descriptor opened
  // before it too; the snapshot keeps the old bytes.
  pwrite_all(fd, "BBBB", 4, 0);
  REQUIRE(::fsync(fd) == 0);
  write_file(fx / "g", "after");
  CHECK(read_file(fx / "f") == "BBBB");
  CHECK(lstat_of(fx / "f").st_ino == f_ino);
  // The control folder shows the snapshot online.
  CHECK(read_file(fx / ".plyfs/layers/s1/data/f") == "AAAA");
  struct stat st;
  CHECK(::lstat((fx / ".plyfs/layers/s1/data/g").c_str(), &st) != 0);
  ::close(fd);
  fx.unmount();

  // The snapshot holds the state at the command, the default mount the live one.
  fx.opts = {"branches=s1=ro"};
  fx.mount();
  CHECK(read_file(fx / "f") == "AAAA");
  CHECK(::lstat((fx / "g").c_str(), &st) != 0);
  CHECK(lstat_of(fx / "f").st_ino == f_ino);  // the same objects, the same numbers
  fx.unmount();
  fx.opts = {};
  fx.mount();
  CHECK(read_file(fx / "f") == "BBBB");
  CHECK(read_file(fx / "g") == "after");

  // Online rollback to the newest snapshot: what came after it goes, the
  // stack and st_ino stay.
  write_file(fx / "h", "kept");
  REQUIRE(plyctl_status(fx, {"snapshot", fx.root(), "--name", "s2"}) == 0);
  write_file(fx / "scratch", "throw away");
  REQUIRE(::unlink((fx / "h").c_str()) == 0);
  REQUIRE(plyctl_status(fx, {"rollback", fx.root(), "main"}, &out) == 0);
  CHECK(out == "rolled back \"main\" to \"s2\"\n");
  CHECK(::lstat((fx / "scratch").c_str(), &st) != 0);
  CHECK(read_file(fx / "h") == "kept");
  CHECK(read_file(fx / "f") == "BBBB");
  CHECK(lstat_of(fx / "f").st_ino == f_ino);
  // And to an older one, named.
  REQUIRE(plyctl_status(fx, {"rollback", fx.root(), "main", "--to", "s1"}) == 0);
  CHECK(read_file(fx / "f") == "AAAA");
  CHECK(::lstat((fx / "g").c_str(), &st) != 0);
  REQUIRE(plyctl_status(fx, {"branch", "list", fx.root()}, &out) == 0);
  CHECK(out == "main=rw\n");

  // A layer to work in, made through the control folder on the mounted
  // branch and stacked over it; merged down online, an open file reading on.
  REQUIRE(::mkdir((fx / ".plyfs/layers/work").c_str(), 0755) == 0);
  REQUIRE(plyctl_status(fx, {"branch", "add", fx.root(), "work"}) == 0);
  REQUIRE(plyctl_status(fx, {"branch", "set", fx.root(), "main", "--ro"}) == 0);
  write_file(fx / "w", "in the layer");
  write_file(fx / "f", "CCCC");
  int rfd = ::open((fx / "w").c_str(), O_RDONLY);
  REQUIRE(rfd >= 0);
  REQUIRE(plyctl_status(fx, {"merge", fx.root(), "work"}) == 0);
  REQUIRE(plyctl_status(fx, {"branch", "list", fx.root()}, &out) == 0);
  CHECK(out == "work=rw\n");  // main, merged into, left the stack
  char buf[16] = {};
  CHECK(::pread(rfd, buf, 12, 0) == 12);
  CHECK(std::string(buf) == "in the layer");
  ::close(rfd);
  CHECK(read_file(fx / "f") == "CCCC");
  CHECK(lstat_of(fx / "f").st_ino == f_ino);

  // Refusals: clear errors, conventional exit codes.
  CHECK(plyctl_status(fx, {"merge", fx.root(), "s2"}) == 1);       // a snapshot is no layer
  CHECK(plyctl_status(fx, {"merge", fx.root(), "nope"}) == 1);     // no such branch
  CHECK(plyctl_status(fx, {"merge", fx.root()}) == 2);             // usage
  CHECK(plyctl_status(fx, {"delete", fx.root(), "work"}) == 1);    // the mount shows it
  CHECK(plyctl_status(fx, {"rollback", fx.root(), "work", "--to", "nope"}) == 1);
  // Names pass whole online (JSON requests): this one is simply unknown.
  CHECK(plyctl_status(fx, {"merge", fx.root(), "two words"}, &out) == 1);
  CHECK(out == "plyctl: no branch named \"two words\"\n");
  // Online clone, and deletion of branches the mount does not show.
  REQUIRE(plyctl_status(fx, {"clone", fx.root(), "work", "c0", "--ro"}, &out) == 0);
  CHECK(out.rfind("cloned \"work\" as \"c0\" (id ", 0) == 0);
  REQUIRE(plyctl_status(fx, {"delete", fx.root(), "c0", "--json"}, &out) == 0);
  // The deleted branch as it was: the Branch object of plyctl(8).
  CHECK(out.rfind("{\"name\":\"c0\",\"id\":", 0) == 0);
  CHECK(out.find("\"writable\":false") != std::string::npos);
  CHECK(::lstat((fx / ".plyfs/layers/c0").c_str(), &st) != 0);
  REQUIRE(plyctl_status(fx, {"delete", fx.root(), "s1"}) == 0);
  CHECK(plyctl_status(fx, {"diff", fx.root(), "s2", "nope"}) == 1);  // no such branch
  CHECK(plyctl_status(fx, {"diff", fx.root(), "s2"}) == 2);          // usage
  fx.unmount();  // fsck clean: what was replaced was dropped

  // Offline: snapshot, diff, clone, delete on the image.
  REQUIRE(plyctl_status(fx, {"branch", "list", fx.img}, &out) == 0);
  CHECK(out.find("s1") == std::string::npos);
  fx.mount();
  write_file(fx / "k", "new");
  REQUIRE(::rename((fx / "f").c_str(), (fx / "f2").c_str()) == 0);
  fx.unmount();
  REQUIRE(plyctl_status(fx, {"snapshot", fx.img, "--branch", "work", "--name", "s3"}) == 0);
  REQUIRE(plyctl_status(fx, {"diff", fx.img, "s3", "work"}, &out) == 0);
  CHECK(out.empty());
  REQUIRE(plyctl_status(fx, {"diff", fx.img, "s2", "work"}, &out) == 0);
  CHECK(out.find("+\t/k\n") != std::string::npos);
  CHECK(out.find("+\t/w\n") != std::string::npos);
  CHECK(out.find("R\t/f -> /f2\n") != std::string::npos);
  REQUIRE(plyctl_status(fx, {"clone", fx.img, "work", "c1", "--ro"}) == 0);
  REQUIRE(plyctl_status(fx, {"delete", fx.img, "c1"}) == 0);
  REQUIRE(plyctl_status(fx, {"snapshot", fx.img, "--json"}, &out) == 0);
  CHECK(out.find("\"snapshot\":{\"name\":\"work@") != std::string::npos);
  CHECK(out.find("\"snapshot\":true") != std::string::npos);
  require_fsck_clean(fx.img, fx.tmp / "fsck.log");
  fx.mount();
  CHECK(read_file(fx / "f2") == "CCCC");
  CHECK(read_file(fx / "k") == "new");
  CHECK(lstat_of(fx / "f2").st_ino == f_ino);
  fx.unmount();
}

// The case that failed before snapshots were clones (a stack held at most 32
// branches, so the 32nd snapshot of a mount was refused): many snapshots in
// a row through plyctl on a mount, each one taken, none deepening the stack,
// each one's content its own.
TEST_CASE("snapshots: hundreds of snapshots of a mount in a row", "[snap-fuse]") {
  Fixture fx;
  const int n = int(300 * scale());
  for (int i = 0; i < n; i++) {
    write_file(fx / "counter", std::to_string(i));
    INFO("snapshot " << i);
    REQUIRE(plyctl_status(fx, {"snapshot", fx.root(), "--name", "n" + std::to_string(i)}) == 0);
  }
  std::string out;
  REQUIRE(plyctl_status(fx, {"branch", "list", fx.root()}, &out) == 0);
  CHECK(out == "main=rw\n");
  for (int i : {0, 1, n / 2, n - 1}) CHECK(read_file(fx / (".plyfs/layers/n" + std::to_string(i) + "/data/counter")) == std::to_string(i));
  write_file(fx / "counter", "live");
  CHECK(read_file(fx / "counter") == "live");
  fx.unmount();
  REQUIRE(plyctl_status(fx, {"branch", "list", fx.img, "--json"}, &out) == 0);
  size_t snaps = 0;
  for (size_t p = 0; (p = out.find("\"name\":\"n", p)) != std::string::npos; p++) snaps++;
  CHECK(snaps == size_t(n));
}

TEST_CASE("snapshots: space comes back when a snapshot is deleted online", "[snap-fuse]") {
  Fixture fx;
  std::mt19937_64 rng(seed("snap-fuse-space"));
  const std::string big = random_bytes(rng, 32 << 20);
  write_file(fx / "big", big);
  fx.remount();
  const uint64_t free0 = free_blocks(fx.root());
  REQUIRE(plyctl_status(fx, {"snapshot", fx.root(), "--name", "snap"}) == 0);
  {
    int fd = ::open((fx / "big").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    const std::string half = random_bytes(rng, 16 << 20);
    pwrite_all(fd, half.data(), half.size(), 0);
    REQUIRE(::fsync(fd) == 0);
    ::close(fd);
  }
  const uint64_t free1 = free_blocks(fx.root());
  CHECK(free1 + 4000 < free0);  // 16 MiB more: 4096 blocks
  // The snapshot holds the old half; deleting it online frees it at once.
  REQUIRE(plyctl_status(fx, {"delete", fx.root(), "snap"}) == 0);
  const uint64_t free2 = free_blocks(fx.root());
  INFO("free before " << free0 << ", with the snapshot " << free1 << ", after deleting it " << free2);
  CHECK(free2 + 64 >= free0);
  CHECK(free2 <= free0 + 64);
  fx.unmount();
}

TEST_CASE("snapshots: automatic snapshots every second, keeping two", "[snap-fuse]") {
  Fixture fx;
  fx.opts = {"snapshot_interval=1", "snapshot_keep=2"};
  fx.remount();
  for (int i = 0; i < 9; i++) {
    write_file(fx / ("f" + std::to_string(i)), std::to_string(i));
    ::usleep(500 * 1000);
  }
  std::string out;
  REQUIRE(plyctl_status(fx, {"branch", "list", fx.root()}, &out) == 0);
  CHECK(out == "main=rw\n");  // snapshots never deepen the mount
  const auto names = list_dir(fx / ".plyfs/layers");
  size_t snaps = 0;
  std::string newest;
  for (const auto& n : names)
    if (n.rfind("main@", 0) == 0) snaps++, newest = std::max(newest, n);
  INFO(snaps << " snapshots");
  CHECK(snaps >= 1);
  CHECK(snaps <= 3);  // two kept; a third may be on its way
  // The newest holds the files written before it.
  CHECK(read_file(fx / (".plyfs/layers/" + newest + "/data/f0")) == "0");
  for (int i = 0; i < 9; i++) CHECK(read_file(fx / ("f" + std::to_string(i))) == std::to_string(i));
  fx.unmount();
}

// The daemon killed (SIGKILL) at a random moment of an online merge: the
// image checks clean, the next mount drops what the merge left, and the view
// is the one the merge kept (the changes were made durable before it), with
// the branches either both there (killed before the swap) or merged.
TEST_CASE("snapshots: SIGKILL of the daemon during an online merge", "[snap-fuse]") {
  std::mt19937_64 rng(seed("snap-kill"));
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "512M", tmp / "mkfs.log");
  std::map<std::string, std::string> view;  // what the mount must show
  std::set<std::string> gone;                 // and what it must not
  int cut = 0, finished = 0;
  auto check = [&](const Mount& m) {
    for (const auto& [p, d] : view) {
      INFO(p);
      REQUIRE(read_file(m / p) == d);
    }
    for (const auto& p : gone) {
      struct stat st;
      INFO(p << " was deleted");
      REQUIRE(::lstat((m / p).c_str(), &st) != 0);
    }
  };
  std::string below = "main";
  for (int round = 0; round < 6; round++) {
    INFO("round " << round);
    // A layer on the branch the last round merged into (it keeps its name
    // either way: a merge keeps the upper branch's tree id and name).
    const std::string layer = "w" + std::to_string(round);
    REQUIRE(run({plyctl_bin(), "layer", "create", img, layer, "--on", below}, tmp / "ctl.log") == 0);
    Mount m(img, tmp / "mnt", {"commit=0", "layer=" + layer});
    m.start();
    check(m);
    const std::string log = tmp / "ctl.log";
    // Changes in the layer: rewrites (copy-ups), new files, deletions.
    ::mkdir((m / ("d" + std::to_string(round))).c_str(), 0755);
    for (int i = 0; i < 250; i++) {
      const std::string p = "d" + std::to_string(round) + "/f" + std::to_string(i);
      const std::string data = random_bytes(rng, rng() % 3 ? 100 + rng() % 3000 : 70000);
      write_file(m / p, data);
      view[p] = data;
      gone.erase(p);
    }
    for (auto it = view.begin(); it != view.end();) {
      const int r = int(rng() % 6);
      if (r == 0) {
        REQUIRE(::unlink((m / it->first).c_str()) == 0);
        gone.insert(it->first);
        it = view.erase(it);
        continue;
      }
      if (r == 1) {
        it->second = random_bytes(rng, 1 + rng() % 5000);
        write_file(m / it->first, it->second);
      }
      ++it;
    }
    {
      // fsync commits the whole generation: every change above is durable.
      int fd = ::open((m / ("d" + std::to_string(round))).c_str(), O_RDONLY | O_DIRECTORY);
      REQUIRE(fd >= 0);
      REQUIRE(::fsync(fd) == 0);
      ::close(fd);
    }
    const pid_t ctl = spawn({plyctl_bin(), "merge", m.path(), layer}, log);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 30000));
    m.kill9();
    int st = 0;
    REQUIRE(waitpid(ctl, &st, 0) == ctl);
    (WIFEXITED(st) && WEXITSTATUS(st) == 0 ? finished : cut)++;
    require_fsck_clean(img, tmp / "fsck.log");
    below = layer;
  }
  Mount m(img, tmp / "mnt", {"layer=" + below});
  m.start();
  check(m);
  REQUIRE(run({plyctl_bin(), "branch", "list", m.path()}, tmp / "list.log") == 0);
  REQUIRE(m.unmount() == 0);
  require_fsck_clean(img, tmp / "fsck.log");
  // Where the kills landed is timing: reported, not asserted (the checks
  // above hold either way).
  WARN(cut << " merges cut by the kill, " << finished << " finished before it");
}

// plyctl diff on a mount point: the daemon pages the text out through the
// control channel (control.h), and it is byte for byte what the offline
// diff of the same trees prints, in both forms.
TEST_CASE("snapshots: an online diff spans many chunks and equals the offline one", "[snap-fuse]") {
  Fixture fx("512M");
  ::mkdir((fx / "lower").c_str(), 0755);
  for (int i = 0; i < 200; i++) write_file(fx / ("lower/f" + std::to_string(i)), "lower " + std::to_string(i));
  REQUIRE(plyctl_status(fx, {"snapshot", fx.root(), "--name", "s1"}) == 0);
  // Enough changes that the text fills many answers (3063 bytes each).
  ::mkdir((fx / "new").c_str(), 0755);
  for (int i = 0; i < 2500; i++) write_file(fx / ("new/file-with-a-longer-name-" + std::to_string(i)), "x");
  for (int i = 0; i < 50; i++) write_file(fx / ("lower/f" + std::to_string(i)), "changed");
  for (int i = 50; i < 100; i++) REQUIRE(::unlink((fx / ("lower/f" + std::to_string(i))).c_str()) == 0);
  write_file(fx / "quote\"and\\back", "json escapes");
  std::string on_text, on_json, off_text, off_json;
  REQUIRE(plyctl_status(fx, {"diff", fx.root(), "s1", "main"}, &on_text) == 0);
  REQUIRE(plyctl_status(fx, {"diff", fx.root(), "s1", "main", "--json"}, &on_json) == 0);
  CHECK(on_text.size() > 20 * 3063);
  CHECK(on_text.find("+\t/new/file-with-a-longer-name-2499\n") != std::string::npos);
  CHECK(on_text.find("M\t/lower/f0\n") != std::string::npos);
  CHECK(on_text.find("-\t/lower/f50\n") != std::string::npos);

  // The daemon pages out its JSON answer, {"result": DIFF}, DIFF being what
  // plyctl --json prints. The pending texts are bounded: a fifth diff pushes
  // out the first, whose reads then fail; the last read frees a text; bad
  // requests are refused.
  const std::string paged = "{\"result\":" + on_json.substr(0, on_json.size() - 1) + "}";
  const std::string diff_req = R"({"command":"diff","from":"s1","to":"main"})";
  auto read_req = [](const std::string& tok, const std::string& off) {
    return R"({"command":"read","token":")" + tok + R"(","offset":)" + off + "}";
  };
  std::vector<std::string> tokens;
  for (int i = 0; i < 5; i++) {
    Answer a = control(fx.root(), diff_req);
    REQUIRE(a.rc == 0);
    REQUIRE(a.status == 0);
    auto j = nlohmann::json::parse(a.text);
    CHECK(j["paged"]["size"] == paged.size());
    tokens.push_back(j["paged"]["token"]);
  }
  CHECK(control(fx.root(), read_req(tokens[0], "0")).status == ENOENT);
  Answer first = control(fx.root(), read_req(tokens[1], "0"));
  CHECK(first.status == 0);
  CHECK(first.text == paged.substr(0, 3063));
  CHECK(control(fx.root(), read_req(tokens[1], "99999999")).status == EINVAL);
  CHECK(control(fx.root(), read_req(tokens[1], "\"x\"")).status == EINVAL);
  CHECK(control(fx.root(), R"({"command":"close","token":")" + tokens[1] + "\"}").status == 0);
  CHECK(control(fx.root(), read_req(tokens[1], "0")).status == ENOENT);
  Answer last = control(fx.root(), read_req(tokens[2], std::to_string(paged.size() - 10)));
  CHECK(last.status == 0);
  CHECK(last.text == paged.substr(paged.size() - 10));
  CHECK(control(fx.root(), read_req(tokens[2], "0")).status == ENOENT);  // the end freed it
  CHECK(control(fx.root(), R"({"command":"diff","from":"s1"})").status == EINVAL);
  CHECK(control(fx.root(), R"({"command":"yaml"})").status == EINVAL);
  CHECK(control(fx.root(), "diff s1 main").status == EINVAL);  // version 1's words: not JSON
  // An empty diff fits one answer: three of them push nothing out.
  for (int i = 0; i < 3; i++) {
    std::string none;
    REQUIRE(plyctl_status(fx, {"diff", fx.root(), "s1", "s1"}, &none) == 0);
    CHECK(none.empty());
  }
  CHECK(control(fx.root(), read_req(tokens[3], "0")).status == 0);
  CHECK(control(fx.root(), R"({"command":"diff","from":"s1","to":"nope"})").status == ENOENT);
  fx.unmount();

  REQUIRE(plyctl_status(fx, {"diff", fx.img, "s1", "main"}, &off_text) == 0);
  REQUIRE(plyctl_status(fx, {"diff", fx.img, "s1", "main", "--json"}, &off_json) == 0);
  REQUIRE_SAME(on_text, off_text);
  REQUIRE_SAME(on_json, off_json);
  auto entries = parse_diff_json(on_json);
  size_t lines = 0;
  for (char c : on_text) lines += c == '\n';
  CHECK(entries.size() == lines);
  CHECK(entries.size() > 2500);
  bool quoted = false;
  for (const auto& e : entries) {
    REQUIRE(e.count("change"));
    REQUIRE(e.count("path"));
    quoted |= e.at("path") == "/quote\"and\\back";
  }
  CHECK(quoted);

  // Another user may not diff: a diff names files in directories that user
  // may not list.
  fx.opts = {"allow_other"};
  fx.mount();
  REQUIRE(::chmod(fx.tmp.path().c_str(), 0755) == 0);  // let the other user reach the mount
  const std::string log = fx.tmp / "other.log";
  CHECK(run({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", plyctl_bin(), "diff",
             fx.root(), "s1", "main"}, log) == 1);
  CHECK(slurp(log).find("only root or the mount's owner may diff") != std::string::npos);
  fx.unmount();
}

// Snapshots of a mount while writers run, through the mount and through the
// control folder's view of the live branch (format.md#snapshots, "Online"):
// every change after a snapshot lands in the live branch, also through a
// descriptor opened before it, the snapshot's nodes shared until changed.
// No call may fail (EROFS, ESTALE, EIO), and afterwards every file holds
// what its writer wrote, after a remount too.
TEST_CASE("snapshots: writers through the mount and a view while snapshots are taken", "[snap-fuse]") {
  Fixture fx;
  const std::vector<std::string> roots = {fx.root() + "/", fx / ".plyfs/layers/main/data/"};
  constexpr int kWriters = 4;  // two through each
  for (int k = 0; k < kWriters; k++) REQUIRE(::mkdir((fx / (std::string("w") + std::to_string(k))).c_str(), 0755) == 0);
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> bad;
  auto fail = [&](const std::string& what, int e) {
    std::lock_guard lk(mu);
    if (bad.size() < 20) bad.push_back(what + ": " + errstr(e));
  };
  // What each writer's directory must hold at the end: name -> bytes.
  std::vector<std::map<std::string, std::string>> model(kWriters);
  std::vector<std::thread> ts;
  JoinOnExit join{ts, stop};  // the threads stop, also when a REQUIRE fails
  for (int k = 0; k < kWriters; k++)
    ts.emplace_back([&, k] {
      const std::string dir = roots[size_t(k % 2)] + "w" + std::to_string(k) + "/";
      auto& m = model[size_t(k)];
      // A log open for the whole run: its appends cross every snapshot.
      const int log = ::open((dir + "log").c_str(), O_CREAT | O_WRONLY, 0644);
      if (log < 0) return fail(dir + "log", errno);
      std::string logged;
      for (int n = 0; !stop; n++) {
        const std::string rec = std::to_string(n) + "\n";
        if (::pwrite(log, rec.data(), rec.size(), off_t(logged.size())) != ssize_t(rec.size()))
          fail(dir + " log append", errno);
        else
          logged += rec;
        const std::string f = std::string("f") + std::to_string(n % 16);
        const std::string body = std::string(size_t(n % 5) * 1000 + 1, char('a' + n % 26));
        const int fd = ::open((dir + f).c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0) {
          fail(dir + " create " + f, errno);
          continue;
        }
        if (::write(fd, body.data(), body.size()) != ssize_t(body.size())) fail(dir + " write " + f, errno);
        if (::close(fd) != 0) fail(dir + " close " + f, errno);
        m[f] = body;
        switch (n % 4) {
          case 0: {  // a rename over an older file
            const std::string to = std::string("f") + std::to_string((n + 7) % 16);
            if (::rename((dir + f).c_str(), (dir + to).c_str()) != 0) fail(dir + " rename " + f, errno);
            m[to] = m[f];
            m.erase(f);
            break;
          }
          case 1:
            if (::truncate((dir + f).c_str(), 1) != 0) fail(dir + " truncate " + f, errno);
            m[f].resize(1);
            break;
          case 2:
            if (::chmod((dir + f).c_str(), 0600) != 0) fail(dir + " chmod " + f, errno);
            if (::setxattr((dir + f).c_str(), "user.n", &n, sizeof n, 0) != 0) fail(dir + " setxattr " + f, errno);
            break;
          case 3:
            if (::unlink((dir + f).c_str()) != 0) fail(dir + " unlink " + f, errno);
            m.erase(f);
            break;
        }
      }
      if (::fsync(log) != 0) fail("fsync log", errno);
      if (::close(log) != 0) fail("close log", errno);
      m["log"] = logged;
    });
  // 50 snapshots (more than a stack could hold when snapshots were layers),
  // for at least 1.5 s.
  const auto end = Clock::now() + std::chrono::milliseconds(1500 * scale());
  int snaps = 0;
  while (snaps < 50 || Clock::now() < end) {
    if (snaps < 50) {
      plyctl(fx, {"snapshot", fx.root(), "--name", std::string("s") + std::to_string(snaps)});
      snaps++;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  stop = true;
  for (auto& t : ts) t.join();
  {
    INFO("plyfs log:\n" << fx.m->log());  // what an EIO was
    CHECK(bad == std::vector<std::string>{});
  }
  auto check = [&] {
    for (int k = 0; k < kWriters; k++) {
      const std::string dir = fx / (std::string("w") + std::to_string(k));
      std::vector<std::string> want;
      for (const auto& [name, body] : model[size_t(k)]) {
        want.push_back(name);
        INFO(dir << "/" << name);
        REQUIRE_SAME(read_file(dir + "/" + name), body);
      }
      CHECK(list_dir(dir) == want);
    }
  };
  check();
  fx.remount();
  check();
  fx.unmount();
}
