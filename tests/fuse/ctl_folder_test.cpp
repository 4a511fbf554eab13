// The control folder (format.md#control-folder) through a real mount: the
// hidden .plyfs at the root, each branch's info.json and data/ online, and
// mkdir, rename and rmdir of layers, checked afterwards offline with plyctl
// and plyfs -o layer= and fsck.
#include <sys/xattr.h>

#include <atomic>
#include <cctype>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "fuse_util.h"

using namespace plyfs::fusetest;

namespace {

// info.json, parsed strictly (nlohmann's parser: the whole text must be
// one JSON object, the Branch object of plyctl(8) with what a mount adds);
// its members as their compact JSON text.
nlohmann::ordered_json info_json(const std::string& path) {
  const std::string text = read_file(path);
  INFO(path << ":\n" << text);
  auto j = nlohmann::ordered_json::parse(text, nullptr, false);
  REQUIRE(!j.is_discarded());
  REQUIRE(j.is_object());
  return j;
}
std::map<std::string, std::string> info(const std::string& path) {
  std::map<std::string, std::string> out;
  const auto j = info_json(path);  // kept: items() refers to it
  for (const auto& [k, v] : j.items()) out[k] = v.dump();
  return out;
}
// info.json's parent's name ("null" for none), its children's names
// ("a,b"), its stack ("c=rw:a=ro"), and whether data/ takes changes (the
// stack's first entry).
std::string parent_of(const std::string& path) {
  auto j = info_json(path);
  return j["parent"].is_null() ? "null" : j["parent"]["branch"].get<std::string>();
}
std::string children_of(const std::string& path) {
  std::string out;
  const auto j = info_json(path);
  for (const auto& c : j["children"]) out += (out.empty() ? "" : ",") + c["branch"].get<std::string>();
  return out;
}
std::string stack_of(const std::string& path) {
  std::string out;
  const auto j = info_json(path);
  for (const auto& e : j["stack"])
    out += (out.empty() ? "" : ":") + e["branch"].get<std::string>() + (e["writable"].get<bool>() ? "=rw" : "=ro");
  return out;
}
bool data_writable(const std::string& path) { return info_json(path)["stack"][0]["writable"].get<bool>(); }

// rmdir of a layer whose files were just closed; 0 or the errno. close()
// returns before the kernel's release reaches the daemon, which waits 0.5 s
// for it and then answers EBUSY; under load the release, queued behind
// other requests, can take longer. The release is asynchronous in the
// kernel: retry EBUSY for up to 10 s.
int rmdir_after_close(const std::string& p) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    if (::rmdir(p.c_str()) == 0) return 0;
    const int e = errno;
    if (e != EBUSY || Clock::now() > deadline) return e;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

ino_t ino_of(const std::string& p) {
  struct stat st{};
  INFO("stat " << p << ": " << std::strerror(errno));
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_ino;
}

// A change through one view (the mount or a data/ folder) reaches what the
// kernel cached of another right after its reply, from the daemon's own
// thread (fuse/notifier.h): checks of it wait, at most 10 s (the kernel's
// own timeouts are 60 s). The readers below fail by value, not REQUIRE, so
// that a stale answer can be retried.
template <class F>
void wait_until(F&& holds) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!holds() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
#define CHECK_SOON(a, b)                    \
  do {                                      \
    wait_until([&] { return (a) == (b); }); \
    CHECK((a) == (b));                      \
  } while (0)

std::string error_text(int e) { return std::string("<") + errstr(e) + ">"; }

// A file's bytes, or "<ERRNO>".
std::string bytes_of(const std::string& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return error_text(errno);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  if (n < 0) out = error_text(errno);
  ::close(fd);
  return out;
}

// Up to n bytes of an open file from offset 0, or "<ERRNO>".
std::string bytes_at(int fd, size_t n) {
  std::string s(n, '\0');
  const ssize_t r = ::pread(fd, s.data(), n, 0);
  if (r < 0) return error_text(errno);
  s.resize(size_t(r));
  return s;
}

// Names in a directory but . and .., sorted, or {"<ERRNO>"}.
std::vector<std::string> names_of(const std::string& p) {
  DIR* d = ::opendir(p.c_str());
  if (!d) return {error_text(errno)};
  std::vector<std::string> out;
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) out.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// lstat's size and mode, fstat's size, or -errno.
long long size_of(const std::string& p) {
  struct stat st{};
  return ::lstat(p.c_str(), &st) == 0 ? st.st_size : -errno;
}
long long mode_of(const std::string& p) {
  struct stat st{};
  return ::lstat(p.c_str(), &st) == 0 ? st.st_mode : -errno;
}
long long fsize_of(int fd) {
  struct stat st{};
  return ::fstat(fd, &st) == 0 ? st.st_size : -errno;
}
int access_errno(const std::string& p) { return ::access(p.c_str(), F_OK) == 0 ? 0 : errno; }

using Names = std::vector<std::string>;

}  // namespace

TEST_CASE("control folder: hidden, info.json, a sibling layer's data online", "[control-folder]") {
  Fixture fx;
  write_file(fx / "m", "main");
  fx.unmount();
  plyctl(fx, {"layer", "create", fx.img, "a", "--on", "main"});
  plyctl(fx, {"layer", "create", fx.img, "b", "--on", "main"});
  fx.opts = {"layer=a"};
  fx.mount();

  // Looked up, never listed, and not a name the mounted view can take.
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"m"});
  struct stat st{};
  REQUIRE(::stat((fx / ".plyfs").c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK(list_dir(fx / ".plyfs") == std::vector<std::string>{"layers"});
  CHECK(list_dir(fx / ".plyfs/layers") == std::vector<std::string>{"a", "b", "main"});
  CHECK(list_dir(fx / ".plyfs/layers/b") == std::vector<std::string>{"children", "data", "info.json"});
  REQUIRE_ERRNO(::mkdir((fx / ".plyfs").c_str(), 0755), EEXIST);
  REQUIRE_ERRNO(::rmdir((fx / ".plyfs").c_str()), EBUSY);
  REQUIRE_ERRNO(::rename((fx / ".plyfs").c_str(), (fx / "x").c_str()), EBUSY);

  // info.json: JSON, the branch table's fields, read-only.
  auto ib = info(fx / ".plyfs/layers/b/info.json");
  CHECK(ib["name"] == "\"b\"");
  CHECK(ib["id"] == "258");
  CHECK(ib["parent"] == R"({"branch":"main","id":256})");
  CHECK(ib["layer"] == "true");
  CHECK(ib["writable"] == "true");  // the branch flag
  CHECK(data_writable(fx / ".plyfs/layers/b/info.json"));
  CHECK(ib["mounted"] == "false");
  CHECK(ib["children"] == "[]");
  CHECK(ib["stack"] == R"([{"branch":"b","id":258,"writable":true},{"branch":"main","id":256,"writable":false}])");
  CHECK(std::stoull(ib["created_generation"]) > 0);
  auto im = info(fx / ".plyfs/layers/main/info.json");
  CHECK(im["parent"] == "null");
  CHECK(im["layer"] == "false");
  CHECK(im["mounted"] == "true");
  CHECK(im["children"] == R"([{"branch":"a","id":257},{"branch":"b","id":258}])");
  CHECK(info(fx / ".plyfs/layers/a/info.json")["mounted"] == "true");
  const std::string ij = fx / ".plyfs/layers/b/info.json";
  REQUIRE_ERRNO(::open(ij.c_str(), O_WRONLY), EACCES);
  REQUIRE_ERRNO(::open(ij.c_str(), O_RDONLY | O_TRUNC), EACCES);
  REQUIRE_ERRNO(::chmod(ij.c_str(), 0666), EPERM);
  REQUIRE_ERRNO(::unlink(ij.c_str()), EPERM);
  REQUIRE_ERRNO(::truncate(ij.c_str(), 0), EPERM);

  // b's data: b over main, read and written while the mount shows a.
  const std::string bd = fx / ".plyfs/layers/b/data";
  CHECK(list_dir(bd) == std::vector<std::string>{"m"});
  CHECK(read_file(bd + "/m") == "main");
  const ino_t main_m = ino_of(fx / "m");
  const ino_t b_m_before = ino_of(bd + "/m");
  write_file(bd + "/m", "changed in b");
  write_file(bd + "/new", "new in b");
  REQUIRE(::mkdir((bd + "/dir").c_str(), 0755) == 0);
  write_file(bd + "/dir/deep", "deep");
  REQUIRE(::rename((bd + "/new").c_str(), (bd + "/dir/new").c_str()) == 0);
  CHECK(read_file(bd + "/dir/new") == "new in b");
  CHECK(list_dir(bd) == std::vector<std::string>{"dir", "m"});
  CHECK(read_file(fx / "m") == "main");  // a's view: main's m, untouched
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"m"});
  // Node ids: the mounted view keeps the inode number; each view numbers its
  // own objects, the same number on every stat, distinct from other views'.
  // A file unlinked while open in the mount lives on when a's folder opens
  // (it shares the mount's open branch, which holds the file).
  const int gone = ::open((fx / "gone").c_str(), O_CREAT | O_RDWR, 0644);
  REQUIRE(gone >= 0);
  REQUIRE(::pwrite(gone, "still here", 10, 0) == 10);
  REQUIRE(::fsync(gone) == 0);
  REQUIRE(::unlink((fx / "gone").c_str()) == 0);
  const ino_t b_m = ino_of(bd + "/m");
  const ino_t a_m = ino_of(fx / ".plyfs/layers/a/data/m");
  CHECK(list_dir(fx / ".plyfs/layers/a/data") == std::vector<std::string>{"m"});
  {
    // The reads go to the daemon, not to the kernel's cached pages.
    char buf[16] = {};
    REQUIRE(::posix_fadvise(gone, 0, 0, POSIX_FADV_DONTNEED) == 0);
    CHECK(::pread(gone, buf, sizeof buf, 0) == 10);
    CHECK(std::string(buf) == "still here");
    write_file(fx / "after-gone", std::string(65536, 'x'));  // would take its freed blocks
    REQUIRE(::posix_fadvise(gone, 0, 0, POSIX_FADV_DONTNEED) == 0);
    CHECK(::pread(gone, buf, sizeof buf, 0) == 10);
    CHECK(std::string(buf) == "still here");
    ::close(gone);
    REQUIRE(::unlink((fx / "after-gone").c_str()) == 0);
  }
  CHECK(ino_of(fx / "m") == main_m);
  CHECK(b_m == b_m_before);  // the copy-up kept the number (format.md#fs-union)
  CHECK(b_m == ino_of(bd + "/m"));
  CHECK(b_m != main_m);
  CHECK(a_m != main_m);
  CHECK(a_m != b_m);
  CHECK(main_m < (ino_t(1) << 63));
  // Across views: a hard link or rename answers EXDEV.
  REQUIRE_ERRNO(::link((bd + "/m").c_str(), (fx / "m2").c_str()), EXDEV);
  REQUIRE_ERRNO(::rename((bd + "/m").c_str(), (fx / ".plyfs/layers/a/data/m3").c_str()), EXDEV);

  // mkdir makes a layer on the branch the mount writes to: a, here. The
  // mounted layer cannot go.
  REQUIRE(::mkdir((fx / ".plyfs/layers/c").c_str(), 0755) == 0);
  CHECK(parent_of(fx / ".plyfs/layers/c/info.json") == "a");
  CHECK(stack_of(fx / ".plyfs/layers/c/info.json") == "c=rw:a=ro:main=ro");
  REQUIRE(::rmdir((fx / ".plyfs/layers/c").c_str()) == 0);
  REQUIRE_ERRNO(::rmdir((fx / ".plyfs/layers/a").c_str()), EBUSY);

  // The mounted layer's own folder shares its branch with the mount: a file
  // made there is in the mounted view at once, and the other way round.
  write_file(fx / ".plyfs/layers/a/data/via-folder", "1");
  CHECK(read_file(fx / "via-folder") == "1");
  write_file(fx / "via-mount", "2");
  CHECK(read_file(fx / ".plyfs/layers/a/data/via-mount") == "2");
  CHECK(data_writable(fx / ".plyfs/layers/main/info.json"));
  // A branch's own .plyfs (made where no control folder is: in a view) is
  // shadowed at the mount root, neither listed nor reached there.
  REQUIRE(::mkdir((fx / ".plyfs/layers/a/data/.plyfs").c_str(), 0755) == 0);
  write_file(fx / ".plyfs/layers/a/data/.plyfs/own", "own");
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"m", "via-folder", "via-mount"});
  CHECK(list_dir(fx / ".plyfs") == std::vector<std::string>{"layers"});
  CHECK(list_dir(fx / ".plyfs/layers/a/data/.plyfs") == std::vector<std::string>{"own"});
  REQUIRE_ERRNO(::rmdir((fx / ".plyfs").c_str()), EBUSY);
  fx.unmount();

  fx.opts = {"layer=b"};
  fx.mount();
  CHECK(read_file(fx / "m") == "changed in b");
  CHECK(read_file(fx / "dir/deep") == "deep");
  CHECK(read_file(fx / "dir/new") == "new in b");
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"dir", "m"});
  fx.unmount();
  fx.opts = {"layer=a"};
  fx.mount();
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"m", "via-folder", "via-mount"});
  CHECK(read_file(fx / ".plyfs/layers/a/data/.plyfs/own") == "own");
  fx.unmount();
}

TEST_CASE("control folder: mkdir, rename and rmdir of layers, and their refusals", "[control-folder]") {
  Fixture fx;
  write_file(fx / "m", "main");
  fx.unmount();
  plyctl(fx, {"layer", "create", fx.img, "p", "--on", "main"});
  plyctl(fx, {"layer", "create", fx.img, "q", "--on", "p"});
  fx.mount();
  const std::string L = fx / ".plyfs/layers/";

  // mkdir: a new layer on the branch the mount writes to.
  REQUIRE(::mkdir((L + "n1").c_str(), 0755) == 0);
  auto i1 = info(L + "n1/info.json");
  CHECK(parent_of(L + "n1/info.json") == "main");
  CHECK(i1["layer"] == "true");
  CHECK(read_file(L + "n1/data/m") == "main");
  REQUIRE_ERRNO(::mkdir((L + "n1").c_str(), 0755), EEXIST);
  REQUIRE_ERRNO(::mkdir((L + "main").c_str(), 0755), EEXIST);
  REQUIRE_ERRNO(::mkdir((L + "a:b").c_str(), 0755), EINVAL);
  REQUIRE_ERRNO(::mkdir((L + "a=rw").c_str(), 0755), EINVAL);
  REQUIRE_ERRNO(::mkdir((L + std::string(33, 'x')).c_str(), 0755), ENAMETOOLONG);
  REQUIRE_ERRNO(::mkdir((fx / ".plyfs/other").c_str(), 0755), EPERM);
  REQUIRE_ERRNO(::mkdir((L + "n1/other").c_str(), 0755), EPERM);
  REQUIRE_ERRNO(::open((L + "file").c_str(), O_CREAT | O_WRONLY, 0644), EPERM);

  // rename: the layer keeps its data and tree; collisions are refused.
  write_file(L + "n1/data/kept", "kept");
  const std::string id = info(L + "n1/info.json")["id"];
  REQUIRE(::rename((L + "n1").c_str(), (L + "n2").c_str()) == 0);
  REQUIRE_ERRNO(::access((L + "n1").c_str(), F_OK), ENOENT);
  CHECK(info(L + "n2/info.json")["id"] == id);
  CHECK(read_file(L + "n2/data/kept") == "kept");
  REQUIRE_ERRNO(::rename((L + "n2").c_str(), (L + "p").c_str()), ENOTEMPTY);
  REQUIRE_ERRNO(::renameat2(AT_FDCWD, (L + "n2").c_str(), AT_FDCWD, (L + "p").c_str(), RENAME_NOREPLACE),
                EEXIST);
  REQUIRE_ERRNO(::rename((L + "n2").c_str(), (L + "bad:name").c_str()), EINVAL);
  REQUIRE_ERRNO(::rename((L + "n2").c_str(), (fx / "n2").c_str()), EXDEV);
  REQUIRE(::rename((L + "n2").c_str(), (L + "n3").c_str()) == 0);

  // rmdir: refused for the mounted branch, one with a layer on it, one with
  // a file open, and the folder's own directories.
  REQUIRE_ERRNO(::rmdir((L + "main").c_str()), EBUSY);
  REQUIRE_ERRNO(::rmdir((L + "p").c_str()), EBUSY);
  CHECK(children_of(L + "p/info.json") == "q");
  REQUIRE_ERRNO(::rmdir((L + "nosuch").c_str()), ENOENT);
  REQUIRE_ERRNO(::rmdir((fx / ".plyfs/layers").c_str()), EBUSY);
  REQUIRE_ERRNO(::rmdir((L + "q/data").c_str()), EBUSY);
  write_file(L + "q/data/open", "open");
  {
    int fd = ::open((L + "q/data/open").c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE_ERRNO(::rmdir((L + "q").c_str()), EBUSY);
    ::close(fd);
  }
  REQUIRE(errstr(rmdir_after_close(L + "q")) == errstr(0));
  REQUIRE_ERRNO(::access((L + "q").c_str(), F_OK), ENOENT);
  REQUIRE(::rmdir((L + "p").c_str()) == 0);  // no layer on it any more
  CHECK(list_dir(fx / ".plyfs/layers") == std::vector<std::string>{"main", "n3"});
  // A new layer may take a deleted one's name.
  REQUIRE(::mkdir((L + "q").c_str(), 0755) == 0);
  CHECK(list_dir(L + "q/data") == std::vector<std::string>{"m"});
  REQUIRE(::rmdir((L + "q").c_str()) == 0);
  fx.unmount();

  std::string out;
  plyctl(fx, {"layer", "list", fx.img}, &out);
  CHECK(out == "NAME  ID KIND  MODE\nmain 256 base  rw\n\u2514\u2500n3 " + id + " layer rw\n");
  fx.opts = {"layer=n3"};
  fx.mount();
  CHECK(read_file(fx / "kept") == "kept");
  CHECK(read_file(fx / "m") == "main");
  fx.unmount();
}

TEST_CASE("control folder: a read-only mount changes nothing", "[control-folder]") {
  Fixture fx;
  write_file(fx / "m", "main");
  fx.unmount();
  plyctl(fx, {"layer", "create", fx.img, "a", "--on", "main"});
  fx.opts = {"ro"};
  fx.mount();
  const std::string L = fx / ".plyfs/layers/";
  CHECK(read_file(L + "a/data/m") == "main");
  CHECK(!data_writable(L + "a/info.json"));
  CHECK(info(L + "a/info.json")["writable"] == "true");  // the branch is not flagged read-only
  REQUIRE_ERRNO(::mkdir((L + "n").c_str(), 0755), EROFS);
  REQUIRE_ERRNO(::rmdir((L + "a").c_str()), EROFS);
  REQUIRE_ERRNO(::rename((L + "a").c_str(), (L + "b").c_str()), EROFS);
  REQUIRE_ERRNO(::open((L + "a/data/m").c_str(), O_WRONLY), EROFS);
  fx.unmount();
}

TEST_CASE("control folder: views follow an online snapshot", "[control-folder]") {
  Fixture fx;
  write_file(fx / "m", "main");
  const std::string L = fx / ".plyfs/layers/";
  CHECK(read_file(L + "main/data/m") == "main");  // main's view is open now
  const int fd = ::open((L + "main/data/m").c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  const ino_t m_ino = ino_of(L + "main/data/m");
  const int data_fd = ::open((L + "main/data").c_str(), O_RDONLY | O_DIRECTORY);
  REQUIRE(data_fd >= 0);
  const int folder_fd = ::open((L + "main").c_str(), O_RDONLY | O_DIRECTORY);
  REQUIRE(folder_fd >= 0);
  // Listed before and after: the kernel must not keep the first listing.
  CHECK(list_dir(fx / ".plyfs/layers") == std::vector<std::string>{"main"});
  plyctl(fx, {"snapshot", fx.root(), "--name", "s1"});
  // The snapshot is a new read-only branch; main stays what it was.
  CHECK(list_dir(fx / ".plyfs/layers") == std::vector<std::string>{"main", "s1"});
  // A file open in main's view writes on, in main, with the same number.
  REQUIRE(::pwrite(fd, "MAIN", 4, 0) == 4);
  REQUIRE(::close(fd) == 0);
  CHECK(read_file(L + "main/data/m") == "MAIN");
  CHECK(ino_of(L + "main/data/m") == m_ino);
  CHECK(read_file(fx / "m") == "MAIN");
  // The snapshot holds the bytes of the moment, read-only.
  CHECK(read_file(L + "s1/data/m") == "main");
  CHECK(!data_writable(L + "s1/info.json"));
  CHECK(info(L + "s1/info.json")["writable"] == "false");
  CHECK(info(L + "s1/info.json")["snapshot"] == "true");
  CHECK(info(L + "s1/info.json")["name"] == "\"s1\"");
  CHECK(info(L + "s1/info.json")["origin"].find("\"main\"") != std::string::npos);
  REQUIRE_ERRNO(::open((L + "s1/data/m").c_str(), O_WRONLY), EROFS);
  CHECK(info(L + "main/info.json")["writable"] == "true");
  CHECK(parent_of(L + "main/info.json") == "null");
  write_file(L + "main/data/after", "after");
  CHECK(read_file(fx / "after") == "after");
  // What the kernel holds of main's view works on.
  CHECK(ino_of(L + "main/data") == ino_of(L + "main/data/."));
  struct stat st{};
  REQUIRE_OK(::fstat(data_fd, &st));
  const int at = ::openat(data_fd, "via-fd", O_CREAT | O_WRONLY, 0644);
  REQUIRE_OK(at);
  ::close(at);
  ::close(data_fd);
  CHECK(read_file(fx / "via-fd").empty());
  const int via = ::openat(folder_fd, "data/via-folder-fd", O_CREAT | O_WRONLY, 0644);
  REQUIRE_OK(via);
  ::close(via);
  struct stat fst{};
  REQUIRE(::fstatat(folder_fd, "info.json", &fst, 0) == 0);
  CHECK(fst.st_ino == ino_of(L + "main/info.json"));
  ::close(folder_fd);
  CHECK(read_file(fx / "via-folder-fd").empty());
  REQUIRE_ERRNO(::access((L + "s1/data/via-folder-fd").c_str(), F_OK), ENOENT);
  CHECK(list_dir(L + "s1/data") == std::vector<std::string>{"m"});
  fx.unmount();
}

TEST_CASE("control folder: views follow an online merge and rollback", "[control-folder]") {
  Fixture fx;
  write_file(fx / "m", "main");
  const std::string L = fx / ".plyfs/layers/";
  // A layer on main, stacked over it, written through its folder.
  REQUIRE(::mkdir((L + "work").c_str(), 0755) == 0);
  plyctl(fx, {"branch", "add", fx.root(), "work"});
  plyctl(fx, {"branch", "set", fx.root(), "main", "--ro"});
  write_file(L + "work/data/x", "x");
  CHECK(read_file(L + "main/data/m") == "main");
  const int main_fd = ::open((L + "main/data/m").c_str(), O_RDONLY);
  REQUIRE(main_fd >= 0);
  const int x_fd = ::open((L + "work/data/x").c_str(), O_RDONLY);
  REQUIRE(x_fd >= 0);
  // The merge folds work into main: main goes (its view ends, ESTALE), and
  // work, with the same tree and name, holds both.
  plyctl(fx, {"merge", fx.root(), "work"});
  struct stat st{};
  REQUIRE_ERRNO(::fstat(main_fd, &st), ESTALE);
  ::close(main_fd);
  // work's view shows the merged branch: its open file reads on.
  char buf[4] = {};
  REQUIRE(::posix_fadvise(x_fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  CHECK(::pread(x_fd, buf, sizeof buf, 0) == 1);
  CHECK(buf[0] == 'x');
  ::close(x_fd);
  CHECK(list_dir(fx / ".plyfs/layers") == std::vector<std::string>{"work"});
  CHECK(list_dir(L + "work/data") == std::vector<std::string>{"m", "x"});
  CHECK(info(L + "work/info.json")["layer"] == "false");
  CHECK(read_file(fx / "x") == "x");
  // A rollback discards what was written through the folder too.
  plyctl(fx, {"snapshot", fx.root(), "--name", "s2"});
  write_file(L + "work/data/y", "y");
  CHECK(read_file(L + "work/data/y") == "y");
  plyctl(fx, {"rollback", fx.root(), "work"});
  CHECK(list_dir(L + "work/data") == std::vector<std::string>{"m", "x"});
  CHECK(list_dir(L + "s2/data") == std::vector<std::string>{"m", "x"});
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"m", "x"});
  fx.unmount();
}

TEST_CASE("control folder: views, layer changes and online snapshots and deletions at once", "[control-folder]") {
  Fixture fx;
  const std::string L = fx / ".plyfs/layers/";
  // The threads run for 1.5 s and until a few snapshots have been taken and
  // deleted meanwhile (at most a minute: under load plyctl alone may take a while).
  const auto end = Clock::now() + std::chrono::milliseconds(1500 * scale());
  const auto last = end + std::chrono::seconds(60);
  std::atomic<bool> stop{false};
  // What a race may answer: a path resolved just before a deletion reaches
  // the branch it dropped (ESTALE, ENOENT for a name gone). Never EROFS: a
  // snapshot changes nothing main's view shows. Anything else is a bug.
  auto tolerated = [](int e) { return e == ESTALE || e == ENOENT; };
  std::mutex mu;
  std::vector<std::string> bad;  // what failed, with its errno
  auto fail = [&](const std::string& what, int e) {
    std::lock_guard lk(mu);
    bad.push_back(what + ": " + errstr(e));
  };
  // The call first, then errno (an argument list has no order).
  auto note = [&](bool ok, const char* what) {
    const int e = errno;
    if (!ok && !tolerated(e)) fail(what, e);
  };
  std::vector<std::thread> ts;
  JoinOnExit join{ts, stop};  // the threads stop, also when a REQUIRE fails
  ts.emplace_back([&] {  // writes and reads through main's folder: never refused
    for (int n = 0; !stop; n++) {
      const std::string p = L + "main/data/v" + std::to_string(n % 5);
      int fd = ::open(p.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
      if (fd < 0) fail("folder create", errno);
      if (fd >= 0) {
        if (::write(fd, "v", 1) != 1) fail("folder write", errno);
        if (::close(fd) != 0) fail("folder close", errno);
      }
      fd = ::open(p.c_str(), O_RDONLY);
      if (fd < 0) fail("folder open", errno);
      if (fd >= 0) ::close(fd);
      if (n % 5 == 3 && ::unlink(p.c_str()) != 0) fail("folder unlink", errno);
    }
  });
  ts.emplace_back([&] {  // the mounted view, the same branch
    for (int n = 0; !stop; n++) {
      const std::string p = fx / ("m" + std::to_string(n % 5));
      int fd = ::open(p.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
      if (fd < 0 || ::write(fd, "m", 1) != 1 || ::close(fd) != 0) fail("mount I/O", errno);
    }
  });
  ts.emplace_back([&] {  // layers made, renamed, written and deleted
    for (int n = 0; !stop; n++) {
      if (::mkdir((L + "t1").c_str(), 0755) != 0) {
        fail("mkdir", errno);
        break;
      }
      int fd = ::open((L + "t1/data/x").c_str(), O_CREAT | O_WRONLY, 0644);
      note(fd >= 0, "layer create");
      if (fd >= 0) ::close(fd);
      if (::rename((L + "t1").c_str(), (L + "t2").c_str()) != 0) fail("rename", errno);
      // The release of x may still be on its way, behind requests a deletion holds up.
      if (const int e = rmdir_after_close(L + "t2")) fail("rmdir", e);
    }
  });
  ts.emplace_back([&] {  // listings, info.json, and reads of the snapshots
    while (!stop) {
      DIR* d = ::opendir((fx / ".plyfs/layers").c_str());
      if (!d) {
        fail("opendir", errno);
        continue;
      }
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') names.emplace_back(e->d_name);
      ::closedir(d);
      for (const auto& n : names) {
        int fd = ::open((L + n + "/info.json").c_str(), O_RDONLY);
        note(fd >= 0, "info.json open");
        if (fd >= 0) ::close(fd);
        DIR* dd = ::opendir((L + n + "/data").c_str());
        note(dd != nullptr, "data opendir");
        if (dd) ::closedir(dd);
      }
    }
  });
  // Snapshots, each deleted again online.
  int snaps = 0;
  const std::string log = fx.tmp / "plyctl.log";
  while (Clock::now() < end || (snaps < 3 && Clock::now() < last)) {
    const std::string name = "s" + std::to_string(snaps);
    ::unlink(log.c_str());
    int rc = run({plyctl_bin(), "snapshot", fx.root(), "--name", name}, log);
    INFO(slurp(log));
    REQUIRE(rc == 0);
    rc = run({plyctl_bin(), "delete", fx.root(), name}, log);
    INFO(slurp(log));
    REQUIRE(rc == 0);
    snaps++;
  }
  stop = true;
  for (auto& t : ts) t.join();
  INFO(snaps << " snapshots taken and deleted");
  INFO("plyfs log:\n" << fx.m->log());
  CHECK(bad == std::vector<std::string>{});
  CHECK(snaps >= 3);
  CHECK(list_dir(fx / ".plyfs/layers") == std::vector<std::string>{"main"});
  fx.unmount();
}

// A change made through a data/ folder to a branch the mount shows reaches
// what the kernel cached of the mount (format.md#control-folder, "Caching"):
// its listings, negative entries, pages and attributes. The kernel keeps
// all of them for the mount's 60 s timeouts, so without the daemon's
// invalidations every check below sees the state before the change.
TEST_CASE("control folder: a change through data/ reaches the mount's caches", "[control-folder]") {
  Fixture fx;
  const std::string D = fx / ".plyfs/layers/main/data/";
  write_file(fx / "f", "aaaa");
  write_file(fx / "g", "gggg");
  REQUIRE(::mkdir((fx / "d").c_str(), 0755) == 0);
  write_file(fx / "d/old", "old");
  // What the kernel caches: listings, a negative entry, pages, attributes.
  CHECK(list_dir(fx.root()) == Names{"d", "f", "g"});
  CHECK(list_dir(fx / "d") == Names{"old"});
  REQUIRE_ERRNO(::access((fx / "new").c_str(), F_OK), ENOENT);
  CHECK(read_file(fx / "f") == "aaaa");
  CHECK(read_file(fx / "g") == "gggg");
  CHECK(lstat_of(fx / "g").st_mode == (S_IFREG | 0644));
  const int open_g = ::open((fx / "g").c_str(), O_RDONLY);
  REQUIRE(open_g >= 0);
  CHECK(pread_n(open_g, 4, 0) == "gggg");

  // Names: a new file, a new directory, a removal, a rename.
  write_file(D + "new", "new");
  REQUIRE(::mkdir((D + "d/sub").c_str(), 0755) == 0);
  REQUIRE(::unlink((D + "d/old").c_str()) == 0);
  CHECK_SOON(names_of(fx.root()), (Names{"d", "f", "g", "new"}));
  CHECK_SOON(bytes_of(fx / "new"), "new");
  CHECK_SOON(names_of(fx / "d"), Names{"sub"});
  CHECK_SOON(access_errno(fx / "d/old"), ENOENT);
  REQUIRE(::rename((D + "new").c_str(), (D + "d/moved").c_str()) == 0);
  CHECK_SOON(access_errno(fx / "new"), ENOENT);
  CHECK_SOON(names_of(fx / "d"), (Names{"moved", "sub"}));
  CHECK_SOON(bytes_of(fx / "d/moved"), "new");

  // Data and attributes: the same size, then longer, then shorter; a mode.
  write_file(D + "f", "bbbb");
  CHECK_SOON(bytes_of(fx / "f"), "bbbb");
  write_file(D + "f", "cc", O_APPEND);
  CHECK_SOON(size_of(fx / "f"), 6);
  CHECK_SOON(bytes_of(fx / "f"), "bbbbcc");
  REQUIRE(::truncate((D + "f").c_str(), 2) == 0);
  CHECK_SOON(size_of(fx / "f"), 2);
  CHECK_SOON(bytes_of(fx / "f"), "bb");
  REQUIRE(::chmod((D + "g").c_str(), 0600) == 0);
  CHECK_SOON(mode_of(fx / "g"), (S_IFREG | 0600));
  // A file the mount holds open reads the new data, and a longer size.
  write_file(D + "g", "hhhh");
  CHECK_SOON(bytes_at(open_g, 8), "hhhh");
  write_file(D + "g", "ii", O_APPEND);
  CHECK_SOON(bytes_at(open_g, 8), "hhhhii");
  CHECK_SOON(fsize_of(open_g), 6);
  ::close(open_g);
  fx.unmount();
}

// With the writeback cache the kernel owns the size of a file it holds open
// and never takes a smaller one from the daemon, so a file open through one
// side and made shorter through the other keeps its longer size there until
// closed (format.md#control-folder, "Caching"). -o nowriteback leaves sizes
// and times to the daemon: the shorter size reaches open files both ways.
TEST_CASE("control folder: with -o nowriteback a shorter size reaches open files", "[control-folder]") {
  Fixture fx("256M", {"nowriteback"});
  const std::string D = fx / ".plyfs/layers/main/data/";
  write_file(fx / "g", "gggggg");
  const int mg = ::open((fx / "g").c_str(), O_RDWR);
  REQUIRE(mg >= 0);
  const int vg = ::open((D + "g").c_str(), O_RDONLY);
  REQUIRE(vg >= 0);
  CHECK(pread_n(mg, 8, 0) == "gggggg");
  CHECK(pread_n(vg, 8, 0) == "gggggg");
  CHECK(fsize_of(mg) == 6);
  // Shorter through the view: the mount's open file.
  REQUIRE(::truncate((D + "g").c_str(), 2) == 0);
  CHECK_SOON(fsize_of(mg), 2);
  CHECK_SOON(bytes_at(mg, 8), "gg");
  // Written through the mount's descriptor: at once in the view.
  REQUIRE(::pwrite(mg, "hhhh", 4, 0) == 4);
  CHECK_SOON(bytes_at(vg, 8), "hhhh");
  // Shorter through the mount: the view's open file.
  REQUIRE(::ftruncate(mg, 1) == 0);
  CHECK_SOON(fsize_of(vg), 1);
  CHECK_SOON(bytes_at(vg, 8), "h");
  // The daemon keeps the times: a write moves mtime.
  struct stat before{};
  REQUIRE(::fstat(mg, &before) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(::pwrite(mg, "x", 1, 0) == 1);
  struct stat after{};
  REQUIRE(::stat((fx / "g").c_str(), &after) == 0);
  CHECK((after.st_mtim.tv_sec > before.st_mtim.tv_sec ||
         (after.st_mtim.tv_sec == before.st_mtim.tv_sec && after.st_mtim.tv_nsec > before.st_mtim.tv_nsec)));
  ::close(vg);
  ::close(mg);
  CHECK(read_file(fx / "g") == "x");
  fx.remount();
  CHECK(read_file(fx / "g") == "x");
  fx.unmount();
}

// The other way: a change through the mount reaches what the kernel cached
// of the views that show the branch it wrote. Under .plyfs nothing has a
// timeout, but the kernel still keeps a listing while the directory's mtime
// stays (a view's is its leftmost part's, which a change below does not
// touch), the pages of a file while it is open, and, with the writeback
// cache, the size of a file it holds.
TEST_CASE("control folder: a change through the mount reaches the views' caches", "[control-folder]") {
  Fixture fx;
  REQUIRE(::mkdir((fx / "d").c_str(), 0755) == 0);
  write_file(fx / "d/f", "aaaa");
  const std::string L = fx / ".plyfs/layers/";
  REQUIRE(::mkdir((L + "c").c_str(), 0755) == 0);  // a layer on main, which the mount writes
  const std::string C = L + "c/data/";
  // c gets its own part of d (a copy-up): d's mtime in c's view is that
  // part's from now on.
  REQUIRE(::chmod((C + "d").c_str(), 0750) == 0);
  CHECK(list_dir(C + "d") == Names{"f"});
  CHECK(list_dir(L + "main/data/d") == Names{"f"});
  const int cf = ::open((C + "d/f").c_str(), O_RDONLY);
  REQUIRE(cf >= 0);
  CHECK(pread_n(cf, 8, 0) == "aaaa");
  const int mf = ::open((L + "main/data/d/f").c_str(), O_RDONLY);
  REQUIRE(mf >= 0);
  CHECK(pread_n(mf, 8, 0) == "aaaa");

  write_file(fx / "d/new", "new");
  CHECK_SOON(names_of(C + "d"), (Names{"f", "new"}));
  CHECK_SOON(names_of(L + "main/data/d"), (Names{"f", "new"}));
  // Open files: the new bytes, then a longer size.
  write_file(fx / "d/f", "bbbb");
  CHECK_SOON(bytes_at(cf, 8), "bbbb");
  CHECK_SOON(bytes_at(mf, 8), "bbbb");
  write_file(fx / "d/f", "cc", O_APPEND);
  CHECK_SOON(bytes_at(cf, 8), "bbbbcc");
  CHECK_SOON(bytes_at(mf, 8), "bbbbcc");
  CHECK_SOON(fsize_of(cf), 6);
  ::close(cf);
  ::close(mf);
  REQUIRE(::unlink((fx / "d/new").c_str()) == 0);
  CHECK_SOON(names_of(C + "d"), Names{"f"});
  fx.unmount();
}

// What the mount's union knows of an object may be stale too, not only the
// kernel's caches: a file it shows from a branch below may get a copy in a
// branch further left through a view, and a directory of it a part in
// another branch (with another inode number: found by its path). A path
// walk would look them up again; a descriptor open before does not.
TEST_CASE("control folder: the mount follows copies and directory parts made through a view", "[control-folder]") {
  Fixture fx;
  write_file(fx / "f", "main's f");
  fx.unmount();
  plyctl(fx, {"layer", "create", fx.img, "a", "--on", "main"});
  fx.opts = {"layer=a"};  // a (writable) over main (read-only)
  fx.mount();
  const std::string A = fx / ".plyfs/layers/a/data/";
  const std::string M = fx / ".plyfs/layers/main/data/";
  const int f = ::open((fx / "f").c_str(), O_RDONLY);  // the mount knows f from main
  REQUIRE(f >= 0);
  CHECK(pread_n(f, 16, 0) == "main's f");
  // The same file written through a's view: a copy-up into a.
  write_file(A + "f", "a's f!!!");
  CHECK_SOON(bytes_at(f, 16), "a's f!!!");
  ::close(f);
  // d made through the mount lives in a alone; then main gets a d of its
  // own through main's view. The mount merges both.
  REQUIRE(::mkdir((fx / "d").c_str(), 0755) == 0);
  write_file(fx / "d/in-a", "1");
  DIR* d = ::opendir((fx / "d").c_str());
  REQUIRE(d);
  auto names = [&] {
    std::vector<std::string> out;
    ::rewinddir(d);
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    std::sort(out.begin(), out.end());
    return out;
  };
  CHECK(names() == std::vector<std::string>{"in-a"});
  REQUIRE(::mkdir((M + "d").c_str(), 0755) == 0);
  write_file(M + "d/in-main", "2");
  CHECK(ino_of(M + "d") != ino_of(A + "d"));
  CHECK_SOON(names(), (Names{"in-a", "in-main"}));
  ::closedir(d);
  CHECK_SOON(bytes_of(fx / "d/in-main"), "2");
  fx.unmount();
}

// Changes through the mount and through a view of its branch at once, each
// sending invalidations into the other: names in one directory seen from
// both, the same file written from both, and renames between the two, which
// the kernel makes holding both directories' locks while it waits for the
// daemon's EXDEV (the knot of fuse/notifier.h). Nothing may hang, and
// afterwards both show the same names and bytes.
TEST_CASE("control folder: changes through the mount and a view at once, both ways", "[control-folder]") {
  Fixture fx;
  const std::string V = fx / ".plyfs/layers/main/data/";
  REQUIRE(::mkdir((fx / "d").c_str(), 0755) == 0);
  write_file(fx / "shared", std::string(8192, 's'));
  CHECK(list_dir(V + "d").empty());
  const auto end = Clock::now() + std::chrono::milliseconds(1500 * scale());
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> bad;
  auto fail = [&](const std::string& what, int e) {
    std::lock_guard lk(mu);
    bad.push_back(what + ": " + errstr(e));
  };
  std::vector<std::thread> ts;
  JoinOnExit join{ts, stop};  // the threads stop, also when a REQUIRE fails
  // Names made and removed in d through each side (each side its own names).
  for (const auto& [dir, prefix] : {std::pair(fx / "d/", "m"), std::pair(V + "d/", "v")})
    ts.emplace_back([&, dir = dir, prefix = prefix] {
      for (int n = 0; !stop; n++) {
        const std::string p = dir + prefix + std::to_string(n % 7);
        const int fd = ::open(p.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0 || ::write(fd, "x", 1) != 1 || ::close(fd) != 0) fail("create " + p, errno);
        if (n % 7 == 6 && ::unlink(p.c_str()) != 0) fail("unlink " + p, errno);
      }
    });
  // Renames between the two, both ways: always EXDEV.
  ts.emplace_back([&] {
    for (int n = 0; !stop; n++) {
      const bool out = n % 2;
      const std::string from = out ? fx / "d/m0" : V + "d/v0";
      const std::string to = out ? V + "d/r" : fx / "d/r";
      if (::rename(from.c_str(), to.c_str()) == 0) fail("rename " + from, 0);
      else if (errno != EXDEV && errno != ENOENT) fail("rename " + from, errno);
      std::vector<std::string> names;
      if (DIR* dir = ::opendir((out ? V + "d" : fx / "d").c_str())) {
        while (dirent* e = ::readdir(dir)) names.emplace_back(e->d_name);
        ::closedir(dir);
      } else {
        fail("opendir", errno);
      }
    }
  });
  // One file written through both, all over its two pages.
  for (const std::string& p : {fx / "shared", V + "shared"})
    ts.emplace_back([&, p] {
      for (int n = 0; !stop; n++) {
        const int fd = ::open(p.c_str(), O_WRONLY);
        if (fd < 0) {
          fail("open " + p, errno);
          continue;
        }
        if (::pwrite(fd, "w", 1, off_t(n) * 4093 % 8192) != 1) fail("pwrite " + p, errno);
        if (::close(fd) != 0) fail("close " + p, errno);
      }
    });
  while (Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop = true;
  for (auto& t : ts) t.join();
  CHECK(bad == std::vector<std::string>{});
  CHECK_SOON(names_of(fx / "d"), names_of(V + "d"));
  CHECK_SOON(bytes_of(fx / "shared"), bytes_of(V + "shared"));
  CHECK(bytes_of(fx / "shared").size() == 8192);
  fx.unmount();
}

// A view lives while the kernel holds something of it (format.md#control-
// folder): once it forgot every node of it and no file of it is open, the
// daemon frees it (info.json's view_open), and the next lookup of data makes
// it again with the same inode numbers, following its branch's name across
// a snapshot meanwhile. Only dropping the kernel's unused dentries and
// inodes makes it send the forgets now: drop_caches 3, clean pages too,
// because reclaim outside kswapd keeps an inode whose mapping still holds
// pages (inode_lru_isolate), and a file of the view that was just read
// holds some (a CI run under ASan kept the view 10 s with 2 alone).
TEST_CASE("control folder: a view the kernel no longer holds is freed, and made again", "[control-folder]") {
  Fixture fx;
  write_file(fx / "m", "main");
  const std::string L = fx / ".plyfs/layers/";
  auto open_view = [&] { return info(L + "main/info.json")["view_open"]; };
  auto forget_all = [] {
    std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
  };
  // Frees it, at most 20 s: the forgets come asynchronously.
  auto wait_freed = [&] {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    do {
      forget_all();
      if (open_view() == "false") return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } while (Clock::now() < deadline);
  };
  CHECK(open_view() == "false");
  CHECK(list_dir(L + "main/data") == Names{"m"});
  const ino_t m_ino = ino_of(L + "main/data/m");
  CHECK(open_view() == "true");
  {
    // An open file keeps it, whatever the kernel drops.
    const int fd = ::open((L + "main/data/m").c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    forget_all();
    CHECK(open_view() == "true");
    CHECK(pread_n(fd, 8, 0) == "main");
    ::close(fd);
  }
  {
    // So does a directory held open deeper down, which works on.
    REQUIRE(::mkdir((L + "main/data/sub").c_str(), 0755) == 0);
    const int dfd = ::open((L + "main/data/sub").c_str(), O_RDONLY | O_DIRECTORY);
    REQUIRE(dfd >= 0);
    forget_all();
    CHECK(open_view() == "true");
    const int at = ::openat(dfd, "in-sub", O_CREAT | O_WRONLY, 0644);
    REQUIRE_OK(at);
    ::close(at);
    ::close(dfd);
    CHECK(list_dir(fx / "sub") == Names{"in-sub"});
  }
  wait_freed();
  CHECK(open_view() == "false");
  // Made again: the same numbers, the same files.
  CHECK(ino_of(L + "main/data/m") == m_ino);
  CHECK(read_file(L + "main/data/m") == "main");
  CHECK(open_view() == "true");
  // Freed, it still follows main across a snapshot: the new live layer.
  wait_freed();
  CHECK(open_view() == "false");
  plyctl(fx, {"snapshot", fx.root(), "--name", "s1"});
  write_file(L + "main/data/m", "MAIN");
  CHECK(ino_of(L + "main/data/m") == m_ino);
  CHECK(read_file(fx / "m") == "MAIN");
  CHECK(read_file(L + "s1/data/m") == "main");
  // A view that a change through the mount does not concern any more
  // (freed) costs it nothing, and one made later sees the change.
  wait_freed();
  write_file(fx / "m", "mount");
  CHECK(read_file(L + "main/data/m") == "mount");
  fx.unmount();
}

// A layer's parent is chosen by where it is made (format.md#control-folder):
// layers/P/children/ lists the layers made on P, each a link to its folder,
// and mkdir there makes a new layer on P, any branch (a read-only snapshot
// too), as plyctl layer create --on P does. mkdir in layers/ itself keeps
// making it on the branch the mount writes to.
TEST_CASE("control folder: children/ shows the layers made on a branch, and mkdir there makes one", "[control-folder]") {
  Fixture fx;
  write_file(fx / "m", "main");
  fx.unmount();
  plyctl(fx, {"layer", "create", fx.img, "a", "--on", "main"});
  fx.mount();  // main
  const std::string L = fx / ".plyfs/layers/";
  CHECK(list_dir(L + "main") == Names{"children", "data", "info.json"});
  CHECK(list_dir(L + "main/children") == Names{"a"});
  CHECK(list_dir(L + "a/children").empty());
  char target[64] = {};
  REQUIRE(::readlink((L + "main/children/a").c_str(), target, sizeof target - 1) > 0);
  CHECK(std::string(target) == "../../a");
  CHECK(S_ISLNK(lstat_of(L + "main/children/a").st_mode));
  CHECK(ino_of(L + "main/children/a") == ino_of(L + "a"));  // stat follows the link

  // A layer on a, which the mount does not show.
  REQUIRE(::mkdir((L + "a/children/b").c_str(), 0755) == 0);
  auto ib = info(L + "b/info.json");
  CHECK(parent_of(L + "b/info.json") == "a");
  CHECK(ib["layer"] == "true");
  CHECK(stack_of(L + "b/info.json") == "b=rw:a=ro:main=ro");
  CHECK(children_of(L + "a/info.json") == "b");
  CHECK(list_dir(L + "a/children") == Names{"b"});
  CHECK(list_dir(L + "main/children") == Names{"a"});
  CHECK(read_file(L + "a/children/b/data/m") == "main");  // through the link
  write_file(L + "a/children/b/data/in-b", "b");
  CHECK(read_file(L + "b/data/in-b") == "b");
  REQUIRE_ERRNO(::access((fx / "in-b").c_str(), F_OK), ENOENT);
  // mkdir in layers/ still makes it on the mounted branch.
  REQUIRE(::mkdir((L + "c").c_str(), 0755) == 0);
  CHECK(parent_of(L + "c/info.json") == "main");
  CHECK(list_dir(L + "main/children") == (Names{"a", "c"}));
  // On a read-only snapshot: the new layer is writable over it.
  plyctl(fx, {"snapshot", fx.root(), "--name", "s1"});
  CHECK(list_dir(L + "s1/children").empty());  // a clone of main, no layer
  REQUIRE(::mkdir((L + "s1/children/d").c_str(), 0755) == 0);
  auto id = info(L + "d/info.json");
  CHECK(parent_of(L + "d/info.json") == "s1");
  CHECK(id["writable"] == "true");
  CHECK(data_writable(L + "d/info.json"));
  write_file(L + "d/data/in-d", "d");
  CHECK(read_file(L + "d/data/m") == "main");
  CHECK(list_dir(L + "s1/children") == (Names{"d"}));
  CHECK(list_dir(L + "main/children") == (Names{"a", "c"}));
  // Refusals: a name taken, a bad name, anything but mkdir there.
  REQUIRE_ERRNO(::mkdir((L + "a/children/c").c_str(), 0755), EEXIST);
  REQUIRE_ERRNO(::mkdir((L + "a/children/x:y").c_str(), 0755), EINVAL);
  REQUIRE_ERRNO(::unlink((L + "a/children/b").c_str()), EPERM);
  REQUIRE_ERRNO(::open((L + "a/children/f").c_str(), O_CREAT | O_WRONLY, 0644), EPERM);
  REQUIRE_ERRNO(::symlink("../../c", (L + "a/children/c2").c_str()), EPERM);
  REQUIRE_ERRNO(::rmdir((L + "a/children").c_str()), EBUSY);
  // rmdir of a layer empties its parent's children/.
  REQUIRE(::rmdir((L + "b").c_str()) == 0);
  CHECK(list_dir(L + "a/children").empty());
  REQUIRE_ERRNO(::access((L + "a/children/b").c_str(), F_OK), ENOENT);
  fx.unmount();

  std::string out;
  plyctl(fx, {"layer", "list", fx.img}, &out);
  INFO(out);
  // A table (NAME drawn as the layer tree, ID, KIND, MODE): rows of d and a.
  auto has_layer = [&](const std::string& name) {
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find_first_not_of(" \u2502\u2514\u251c\u2500");
      if (at != std::string::npos && line.compare(at, name.size() + 1, name + " ") == 0 &&
          line.find(" layer ") != std::string::npos)
        return true;
    }
    return false;
  };
  CHECK(has_layer("d"));
  CHECK(has_layer("a"));
  fx.opts = {"layer=d"};
  fx.mount();
  CHECK(read_file(fx / "in-d") == "d");
  CHECK(read_file(fx / "m") == "main");
  fx.unmount();
}

TEST_CASE("control folder: a read-only mount makes no layer through children/", "[control-folder]") {
  Fixture fx;
  fx.unmount();
  fx.opts = {"ro"};
  fx.mount();
  REQUIRE_ERRNO(::mkdir((fx / ".plyfs/layers/main/children/n").c_str(), 0755), EROFS);
  fx.unmount();
}
