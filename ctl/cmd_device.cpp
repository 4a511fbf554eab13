// plyctl device list (plyctl.8): the devices of a volume
// (format.md#multi-device), offline or through a mount's daemon.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "cli.h"
#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "util/parse.h"
#include "blockdev/device_set.h"
#include "commit/devices.h"

namespace plyfs::ctl {

namespace {

void print_devices(const Json& r) {
  std::printf("%-5s %-10s %-10s %10s %10s %10s  %s\n", "INDEX", "CLASS", "ROLE", "SIZE", "USED", "META", "PATH");
  for (const auto& d : r["devices"]) {
    const std::string cls = d["class"].is_string() ? d["class"].get<std::string>() : "-";
    const std::string path = d["path"].is_string() ? d["path"].get<std::string>() : "-";
    std::printf("%-5llu %-10s %-10s %10s %10s %10s  %s\n", (unsigned long long)d["index"].get<uint64_t>(), cls.c_str(),
                d["metadata"].get<bool>() ? "meta+data" : "data", format_size(d["size_bytes"].get<uint64_t>()).c_str(),
                format_size(d["used_bytes"].get<uint64_t>()).c_str(),
                format_size(d["metadata_bytes"].get<uint64_t>()).c_str(), path.c_str());
  }
}

// plyctl device add IMAGE DEVICE [--class CLASS] [--force]: offline, the
// volume's devices named by IMAGE and --device (format.md#device-add).
int device_add(const std::vector<std::string>& args) {
  auto p = parse(args, {"--class"}, {"--json", "--force"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() != 2)
    return usage_error("usage: plyctl [--device PATH]... device add IMAGE NEWDEVICE [--class CLASS] [--force] [--json]");
  const std::string& image = p->pos[0];
  const std::string& added = p->pos[1];
  if (is_directory(image))
    return fail(image + ": devices are added to a volume that is not mounted: unmount it, then give one of its devices");
  auto o = open_volume(image, true);
  if (!o) return fail_on(image, o.error());
  const SuperInfo sb = o->vol->super();
  if (sb.classes.empty())
    return usage_error(image + ": a volume of one device takes no other (make it with mkfs.plyfs --class)");
  const std::string cls = p->opt.count("--class") ? p->opt["--class"] : sb.classes.back();
  if (auto c = o->vol->close(); !c) return fail_on(image, c.error());
  o->vol.reset();
  DeviceSet* ds = o->dev->device_set();
  if (!ds || static_cast<BlockDevice*>(ds) != o->dev.get()) return fail(image + ": not a volume of several devices");
  // Named twice (it is open, and locked, as a member already).
  if (char* rp = ::realpath(added.c_str(), nullptr)) {
    const std::string full = rp;
    std::free(rp);
    for (size_t i = 0; i < ds->member_count(); i++)
      if (ds->member_info(i).name == full)
        return usage_error(added + " is a device of the volume already (device " + std::to_string(i) + ")");
  }
  std::unique_ptr<DeviceSet> set(static_cast<DeviceSet*>(o->dev.release()));
  auto dev = open_device(added, FileOpenOptions{false, true});
  if (!dev) return fail_on(added, dev.error());
  auto grown = add_device(std::move(set), std::move(*dev), added, cls, p->opt.count("--force") > 0);
  if (!grown) {
    const int code = grown.error().code;
    return code == EINVAL || code == EOPNOTSUPP ? usage_error(added + ": " + grown.error().message())
                                                : fail_on(added, grown.error());
  }
  VolumeOptions vo;
  vo.read_only = true;
  auto vol = Volume::open(**grown, vo);
  if (!vol) return fail_on(image, vol.error());
  auto r = model::devices(**vol);
  if (!r) return fail_on(image, r.error());
  if (p->opt.count("--json")) {
    print_json(*r);
  } else {
    const auto& last = (*r)["devices"].back();
    std::printf("%s: added %s as device %llu, class %s, %s\n", image.c_str(), added.c_str(),
                (unsigned long long)last["index"].get<uint64_t>(), last["class"].get<std::string>().c_str(),
                format_size(last["size_bytes"].get<uint64_t>()).c_str());
  }
  return 0;
}

}  // namespace

int cmd_device(const std::string& sub, const std::vector<std::string>& args) {
  if (sub == "add") return device_add(args);
  if (sub != "list") return usage_error("unknown device subcommand '" + sub + "' (list, add)");
  auto p = parse(args, {}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() != 1) return usage_error("usage: plyctl [--device PATH]... device list IMAGE|MOUNTPOINT [--json]");
  const std::string& path = p->pos[0];
  auto t = open_target(path, false);
  if (!t) return fail_on(path, t.error());
  Result<Json> r = Error::invalid("");
  if (!t->mnt.empty()) {
    r = request(t->mnt, Json{{"command", "devices"}});
    if (!r) return fail(path + ": " + r.error().message());
  } else {
    r = model::devices(*t->o.vol);
    if (!r) return fail_on(path, r.error());
  }
  if (p->opt.count("--json")) print_json(*r);
  else print_devices(*r);
  return 0;
}

// plyctl where PATH: the mount PATH lies in (the topmost directory above it
// on the same device), asked where the file's data is.
int cmd_where(const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() != 1) return usage_error("usage: plyctl where PATH [--json]");
  const std::string& path = p->pos[0];
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return fail_on(path, Error::sys(errno, "cannot stat it"));
  if (!S_ISREG(st.st_mode)) return fail(path + ": not a regular file");
  char* rp = ::realpath(path.c_str(), nullptr);
  if (!rp) return fail_on(path, Error::sys(errno, "cannot resolve it"));
  const std::string mnt = mount_root(rp, st.st_dev);
  std::free(rp);
  // Data still in the kernel's cache has no place yet: written back and
  // committed first, as fsync(1) would.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
  auto r = request(mnt, Json{{"command", "where"}, {"ino", uint64_t(st.st_ino)}});
  if (!r) return fail(path + ": " + r.error().message());
  if (p->opt.count("--json")) {
    print_json(*r);
    return 0;
  }
  std::printf("%s: %zu extents\n", path.c_str(), (*r)["extents"].size());
  for (const auto& d : (*r)["devices"]) {
    const std::string cls = d["class"].is_string() ? d["class"].get<std::string>() : "-";
    const std::string dev = d["path"].is_string() ? d["path"].get<std::string>() : "-";
    std::printf("  device %llu (%s): %s  %s\n", (unsigned long long)d["device"].get<uint64_t>(), cls.c_str(),
                format_size(d["stored_bytes"].get<uint64_t>()).c_str(), dev.c_str());
  }
  if ((*r)["extents"].empty()) std::printf("  no extents: the data is inline, with the metadata, or there is none\n");
  return 0;
}

}  // namespace plyfs::ctl
