// The control channel's client (mount_client.h, fuse/control.h).
#include "mount_client.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "blockdev/blockdev.h"
#include "control.h"
#include "util/mountinfo.h"

namespace plyfs::ctl {

using model::Json;

namespace {

// One round trip on `fd`, the mount point opened: the answer's text, or the
// error.
Result<std::string> round_trip_on(int fd, const std::string& mnt, const std::string& text) {
  ControlMsg m{};
  if (text.size() >= sizeof m.request)
    return Error::invalid("the request is too long for the control channel (" + std::to_string(text.size()) + " bytes)");
  m.version = kControlVersion;
  std::memcpy(m.request, text.data(), text.size());
  const int r = ::ioctl(fd, kControlIoctl, &m);
  const int e = errno;
  if (r != 0) {
    if (e == ENOTTY || e == ENOSYS || e == EINVAL)
      return Error::io(e, mnt + " is not the mount point of a plyfs mount");
    if (e == EPROTO)  // a version 1 daemon refuses other versions so
      return Error::io(e, "the plyfs daemon serving " + mnt + " speaks an older control protocol than this plyctl (version " +
                              std::to_string(kControlVersion) + "): use the plyctl of the plyfs release that mounted it");
    return Error::sys(e, mnt);
  }
  m.answer[sizeof m.answer - 1] = 0;
  std::string answer(m.answer);
  if (m.status == 0) return answer;
  if (m.version != kControlVersion) return Error::io(m.status, answer);  // the daemon's own words, as text
  auto j = model::parse(answer);
  if (j && j->is_object() && j->contains("error") && (*j)["error"].is_string())
    return Error::io(m.status, (*j)["error"].get<std::string>());
  return Error::io(m.status, mnt + ": the daemon's answer is not understood");
}

Result<std::string> round_trip(const std::string& mnt, const std::string& text) {
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error::sys(errno, "cannot open " + mnt);
  auto r = round_trip_on(fd, mnt, text);
  ::close(fd);
  return r;
}

// The progress line of a request the daemon works on (request's `work`):
// a thread asks the daemon every 200 ms, on a descriptor opened before the
// request is sent (an open while a merge holds every operation still
// would wait for it), and draws what the daemon says of `command`. The
// line is made by the caller when the request starts, so that its rate and
// ETA count from there.
class Watcher {
 public:
  Watcher(const std::string& mnt, std::string command, Progress& line)
      : mnt_(mnt), command_(std::move(command)), line_(line) {
    fd_ = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ >= 0) thread_ = std::thread([this] { loop(); });
  }
  // Stops asking; the line ends as the request did: finished, or left to
  // its owner to erase.
  void stop(bool done) {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (done && drawn_) line_.finish();
  }
  ~Watcher() {
    stop(false);
    if (fd_ >= 0) ::close(fd_);
  }
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

 private:
  void loop() {
    std::unique_lock lk(mu_);
    while (!cv_.wait_for(lk, std::chrono::milliseconds(200), [&] { return stop_; })) {
      lk.unlock();
      auto text = round_trip_on(fd_, mnt_, R"({"command":"progress"})");
      lk.lock();
      if (!text) return;  // an older daemon: "unknown command"
      auto a = model::parse(*text);
      if (!a || !a->is_object() || !a->contains("result")) return;
      // What a daemon sends is read, not trusted: a member of another
      // type is as good as none.
      const Json& r = (*a)["result"];
      auto member = [&](const char* key) { return r.is_object() && r.contains(key) ? r[key] : Json(); };
      const Json running = member("running"), command = member("command"), done = member("done"),
                 fraction = member("fraction");
      if (running != true || command != command_ || !done.is_number_unsigned() || !fraction.is_number()) continue;
      line_.update(done.get<uint64_t>(), fraction.get<double>());
      drawn_ = true;
    }
  }

  std::string mnt_, command_;
  int fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Progress& line_;      // the thread's until it is joined
  bool drawn_ = false;  // the daemon said how far its command was
  std::thread thread_;
};

}  // namespace

Result<Json> request(const std::string& mnt, const Json& req, Progress* progress, Progress* work) {
  std::optional<Watcher> watcher;
  if (work && work->shown() && req.contains("command") && req["command"].is_string())
    watcher.emplace(mnt, req["command"].get<std::string>(), *work);
  auto first = round_trip(mnt, model::dump(req));
  if (watcher) watcher->stop(bool(first));
  std::string text = PLY_TRY(std::move(first));
  Json a = PLY_TRY(model::parse(text));
  if (a.is_object() && a.contains("paged")) {
    const Json& p = a["paged"];
    if (!p.is_object() || !p.contains("token") || !p["token"].is_string() || !p.contains("size") ||
        !p["size"].is_number_unsigned())
      return Error::io(EPROTO, mnt + ": the daemon's answer is not understood");
    const std::string token = p["token"];
    const uint64_t size = p["size"];
    if (progress) progress->set_total(size);
    text.clear();
    while (text.size() < size) {
      std::string chunk = PLY_TRY(round_trip(mnt, model::dump(Json{{"command", "read"}, {"token", token}, {"offset", text.size()}})));
      if (chunk.empty()) return Error::io(EPROTO, mnt + ": the answer ended early, at byte " + std::to_string(text.size()));
      text += chunk;
      if (progress) progress->update(text.size());
    }
    // Only an answer paged in has a line to end: a short one, or another
    // command's, printed none ("receiving the diff: 0 B" after a merge).
    if (progress && progress->shown()) progress->finish();
    a = PLY_TRY(model::parse(text));
  }
  if (!a.is_object() || !a.contains("result")) return Error::io(EPROTO, mnt + ": the daemon's answer is not understood");
  return std::move(a["result"]);
}

namespace {

// The same image: one block device, or one file.
bool same_image(const struct stat& a, const struct stat& b) {
  if (S_ISBLK(a.st_mode) || S_ISBLK(b.st_mode)) return S_ISBLK(a.st_mode) && S_ISBLK(b.st_mode) && a.st_rdev == b.st_rdev;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

std::optional<std::string> mount_of(const std::string& image) {
  // An NBD URI names no file: the mount given the same URI serves it.
  const bool uri = is_nbd_uri(image);
  struct stat want;
  if (!uri && ::stat(image.c_str(), &want) != 0) return std::nullopt;
  for (const MountEntry& m : read_mountinfo()) {
    if (m.fstype != "fuse.plyfs") continue;
    if (uri) {
      if (m.source == image) return m.mountpoint;
      continue;
    }
    struct stat st;
    if (::stat(m.source.c_str(), &st) == 0 && same_image(st, want)) return m.mountpoint;
  }
  return std::nullopt;
}

Result<void> syncfs_mount(const std::string& mnt) {
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error::sys(errno, "cannot open " + mnt);
  const long r = ::syscall(SYS_syncfs, fd);
  const int e = errno;
  ::close(fd);
  if (r != 0) return Error::sys(e, "syncfs " + mnt);
  return ok();
}

void sync_mount(const std::string& mnt) { (void)syncfs_mount(mnt); }

}  // namespace plyfs::ctl
