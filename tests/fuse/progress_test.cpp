// The progress of long operations on a mount point (control.h's
// "progress" command): the daemon answers it at once while a merge or a
// delete it runs holds every other branch change, and plyctl draws from it
// the same progress line as offline.
#include <sys/ioctl.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "../../fuse/control.h"
#include "fuse_util.h"

using namespace plyfs::fusetest;
using Json = nlohmann::json;

namespace {

// One request on an open descriptor of the mount point: the answer's JSON
// (null when the ioctl or the daemon refused).
Json ask(int fd, const std::string& request) {
  plyfs::ControlMsg m{};
  m.version = plyfs::kControlVersion;
  std::snprintf(m.request, sizeof m.request, "%s", request.c_str());
  if (::ioctl(fd, plyfs::kControlIoctl, &m) != 0 || m.status != 0) return Json();
  m.answer[sizeof m.answer - 1] = 0;
  return Json::parse(m.answer, nullptr, false);
}

// A source tree of `dirs` directories of `files` files of `data` each.
void make_tree(const std::string& dir, int dirs, int files, const std::string& data = "x") {
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  size_t failed = 0;
  for (int d = 0; d < dirs; d++) {
    const std::string sub = dir + "/d" + std::to_string(d);
    REQUIRE(::mkdir(sub.c_str(), 0755) == 0);
    for (int f = 0; f < files; f++) {
      const int fd = ::open((sub + "/f" + std::to_string(f)).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      failed += fd < 0 || ::write(fd, data.data(), data.size()) != ssize_t(data.size());
      if (fd >= 0) ::close(fd);
    }
  }
  REQUIRE(failed == 0);
}

// An image whose branch `work`, a layer on main of `dirs` x `files` files,
// is imported offline (much faster than through a mount).
struct LayerImage {
  TempDir tmp;
  std::string img = tmp / "image";
  LayerImage(int dirs, int files) {
    mkfs(img, "1G", tmp / "mkfs.log");
    make_tree(tmp / "src", dirs, files);
    const int rc = run({plyctl_bin(), "import", img, "work", tmp / "src", "--parent", "main"}, tmp / "import.log");
    INFO(slurp(tmp / "import.log"));
    REQUIRE(rc == 0);
  }
};

// Polls the progress command on `mnt` from a thread until stopped, keeping
// every answer.
struct Poller {
  int fd;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<Json> answers;
  std::thread t;
  explicit Poller(const std::string& mnt) : fd(::open(mnt.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    REQUIRE(fd >= 0);
    t = std::thread([this] {
      while (!stop) {
        Json a = ask(fd, R"({"command":"progress"})");
        {
          std::lock_guard lk(mu);
          answers.push_back(std::move(a));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  ~Poller() {
    stop = true;
    if (t.joinable()) t.join();
    ::close(fd);
  }
  // Answers that showed `command` partly done; every answer must have been
  // one of the protocol's two forms.
  std::vector<double> midway(const std::string& command) {
    stop = true;
    if (t.joinable()) t.join();
    std::vector<double> out;
    for (const auto& a : answers) {
      INFO(a.dump());
      REQUIRE(a.is_object());
      const Json& r = a["result"];
      REQUIRE(r["running"].is_boolean());
      if (!r["running"].get<bool>()) continue;
      REQUIRE(r["what"].is_string());
      REQUIRE(r["done"].is_number_unsigned());
      REQUIRE(r["fraction"].is_number());
      if (r["command"] == command && r["fraction"] > 0.0 && r["fraction"] < 1.0) out.push_back(r["fraction"]);
    }
    return out;
  }
};

size_t count_files(const std::string& dir) {
  size_t n = 0;
  for (const auto& d : list_dir(dir)) n += list_dir(dir + "/" + d).size();
  return n;
}

}  // namespace

TEST_CASE("progress: an online merge answers the progress command as it goes", "[progress]") {
  LayerImage li(40, 500);
  Mount m(li.img, li.tmp / "mnt", {"branches=work=rw:main=ro"});
  m.start();
  // Nothing runs: the answer says so, and is anyone's to ask.
  {
    const int fd = ::open(m.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const Json idle = ask(fd, R"({"command":"progress"})");
    ::close(fd);
    INFO(idle.dump());
    CHECK(idle == Json{{"result", {{"running", false}}}});
  }
  std::vector<double> seen;
  {
    Poller p(m.path());
    const int rc = run({plyctl_bin(), "merge", m.path(), "work"}, li.tmp / "merge.log");
    INFO(slurp(li.tmp / "merge.log"));
    REQUIRE(rc == 0);
    seen = p.midway("merge");
    INFO(p.answers.size() << " answers");
    CHECK(!seen.empty());
  }
  for (size_t i = 1; i < seen.size(); i++) CHECK(seen[i] >= seen[i - 1]);
  // The merge did what it does: the stack is work alone, with every file.
  CHECK(count_files(m.path()) == 40 * 500);
  REQUIRE(run({plyctl_bin(), "branch", "list", m.path(), "--json"}, li.tmp / "list.log") == 0);
  CHECK(slurp(li.tmp / "list.log").find("\"main\"") == std::string::npos);
  REQUIRE(m.unmount() == 0);
  require_fsck_clean(li.img, li.tmp / "fsck.log");
}

TEST_CASE("progress: an online delete answers the progress command as it goes", "[progress]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "1G", tmp / "mkfs.log");
  // A branch of its own, with data in every file: the drop frees nodes
  // and extents.
  make_tree(tmp / "src", 80, 500, std::string(5000, 'y'));  // 200 MB: a drop that lasts past several polls even in a release build
  REQUIRE(run({plyctl_bin(), "import", img, "big", tmp / "src"}, tmp / "import.log") == 0);
  Mount m(img, tmp / "mnt", {"branches=main=rw"});
  m.start();
  std::vector<double> seen;
  {
    Poller p(m.path());
    const int rc = run({plyctl_bin(), "delete", m.path(), "big"}, tmp / "delete.log");
    INFO(slurp(tmp / "delete.log"));
    REQUIRE(rc == 0);
    seen = p.midway("delete");
    INFO(p.answers.size() << " answers");
    CHECK(!seen.empty());
  }
  REQUIRE(run({plyctl_bin(), "branch", "list", m.path(), "--json"}, tmp / "list.log") == 0);
  CHECK(slurp(tmp / "list.log").find("\"big\"") == std::string::npos);
  REQUIRE(m.unmount() == 0);
  require_fsck_clean(img, tmp / "fsck.log");
}

// plyctl on a terminal (script(1) gives it one) draws the daemon's progress
// as the offline merge draws its own: "merging work: N entries (P%)".
TEST_CASE("progress: plyctl merge on a mount point draws a percentage on a terminal", "[progress]") {
  // script(1) is in bsdutils, an Essential package of Debian: always there.
  REQUIRE(::access("/usr/bin/script", X_OK) == 0);
  LayerImage li(240, 500);  // 120,000 entries: a merge that outlasts the first poll (200 ms) even in a release build
  Mount m(li.img, li.tmp / "mnt", {"branches=work=rw:main=ro"});
  m.start();
  const std::string cmd = plyctl_bin() + " merge '" + m.path() + "' work";
  const int rc = run({"/usr/bin/script", "-qec", cmd, "/dev/null"}, li.tmp / "tty.log");
  const std::string tty = slurp(li.tmp / "tty.log");
  INFO(tty);
  REQUIRE(rc == 0);
  CHECK(tty.find("merging work: ") != std::string::npos);
  // A line of the running merge: a count, then its percentage.
  const size_t at = tty.find(" entries (");
  REQUIRE(at != std::string::npos);
  CHECK(tty.find("%)", at) != std::string::npos);
  CHECK(tty.find("merged \"work\" into the branch below it") != std::string::npos);
  // No other command's line: the diff's bytes received are the diff's.
  CHECK(tty.find("receiving the diff") == std::string::npos);
  CHECK(count_files(m.path()) == 240 * 500);
  REQUIRE(m.unmount() == 0);
  require_fsck_clean(li.img, li.tmp / "fsck.log");
}
