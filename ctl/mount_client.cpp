// The control channel's client (mount_client.h, fuse/control.h).
#include "mount_client.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "control.h"

namespace plyfs::ctl {

using model::Json;

namespace {

// One round trip: the answer's text, or the error.
Result<std::string> round_trip(const std::string& mnt, const std::string& text) {
  ControlMsg m{};
  if (text.size() >= sizeof m.request)
    return Error::invalid("the request is too long for the control channel (" + std::to_string(text.size()) + " bytes)");
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error::sys(errno, "cannot open " + mnt);
  m.version = kControlVersion;
  std::memcpy(m.request, text.data(), text.size());
  const int r = ::ioctl(fd, kControlIoctl, &m);
  const int e = errno;
  ::close(fd);
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

}  // namespace

Result<Json> request(const std::string& mnt, const Json& req, Progress* progress) {
  std::string text = PLY_TRY(round_trip(mnt, model::dump(req)));
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
    a = PLY_TRY(model::parse(text));
  }
  if (!a.is_object() || !a.contains("result")) return Error::io(EPROTO, mnt + ": the daemon's answer is not understood");
  return std::move(a["result"]);
}

void sync_mount(const std::string& mnt) {
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::syscall(SYS_syncfs, fd);
  ::close(fd);
}

}  // namespace plyfs::ctl
