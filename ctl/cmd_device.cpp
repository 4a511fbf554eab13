// plyctl device list|add|remove|replace (plyctl.8): the devices of a volume
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
#include "util/progress.h"
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

// DEVICE as `device list` shows it: its index, its path, or its uuid.
Result<size_t> find_device(const Json& list, const std::string& spec) {
  const auto& devs = list["devices"];
  const std::string full = device_display_name(spec);
  for (const auto& d : devs) {
    const size_t i = d["index"].get<size_t>();
    if (spec == std::to_string(i) || (d["uuid"].is_string() && d["uuid"].get<std::string>() == spec) ||
        (d["path"].is_string() && (d["path"].get<std::string>() == spec || d["path"].get<std::string>() == full)))
      return i;
  }
  return Error::invalid(spec + " is not a device of the volume (give its index, path or uuid as `plyctl device list` shows it)");
}

// Usage errors (exit 2) for what the user got wrong, failures (1) else.
int device_error(const std::string& what, const Error& e, bool online) {
  if (e.code == EINVAL || e.code == EOPNOTSUPP) return usage_error(what + ": " + e.message());
  return online ? fail(what + ": " + e.message()) : fail_on(what, e);
}

void print_change(const std::string& path, const std::string& verb, const Json& before, size_t index,
                  const std::string& added, const Json& after) {
  const auto& old = before["devices"][index];
  const std::string cls = old["class"].is_string() ? old["class"].get<std::string>() : "-";
  const std::string name = old["path"].is_string() ? old["path"].get<std::string>() : std::to_string(index);
  const uint64_t moved = after.value("moved_bytes", uint64_t(0));
  if (verb == "removed")
    std::printf("%s: removed %s (device %zu, class %s), moved %s\n", path.c_str(), name.c_str(), index, cls.c_str(),
                format_size(moved).c_str());
  else
    std::printf("%s: replaced %s (device %zu, class %s) by %s, moved %s\n", path.c_str(), name.c_str(), index,
                cls.c_str(), added.c_str(), format_size(moved).c_str());
}

void print_added(const std::string& path, const std::string& added, const Json& after) {
  const auto& last = after["devices"].back();
  std::printf("%s: added %s as device %llu, class %s, %s\n", path.c_str(), added.c_str(),
              (unsigned long long)last["index"].get<uint64_t>(), last["class"].get<std::string>().c_str(),
              format_size(last["size_bytes"].get<uint64_t>()).c_str());
}

// plyctl device add|remove|replace (format.md#device-add,
// format.md#device-remove), on a volume named by one of its devices (with
// --device for the others) or on a mount point or mounted image, whose
// daemon then does it while the files stay in use.
int device_change(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, sub == "add" ? std::set<std::string>{"--class", "--first-class"} : std::set<std::string>{},
                 sub == "remove" ? std::set<std::string>{"--json"} : std::set<std::string>{"--json", "--force"});
  if (!p) return usage_error(p.error().message());
  const size_t want = sub == "replace" ? 3 : 2;
  if (p->pos.size() != want)
    return usage_error(sub == "add"      ? "usage: plyctl [--device PATH]... device add IMAGE|MOUNTPOINT NEWDEVICE [--class CLASS] [--first-class CLASS] [--force] [--json]"
                       : sub == "remove" ? "usage: plyctl [--device PATH]... device remove IMAGE|MOUNTPOINT DEVICE [--json]"
                                         : "usage: plyctl [--device PATH]... device replace IMAGE|MOUNTPOINT DEVICE NEWDEVICE [--force] [--json]");
  const std::string& path = p->pos[0];
  const std::string added = sub == "remove" ? "" : p->pos[want - 1];
  const bool force = p->opt.count("--force") > 0;
  auto t = open_target(path, true);
  if (!t) return fail_on(path, t.error());
  const bool online = !t->mnt.empty();
  Result<Json> before = online ? request(t->mnt, Json{{"command", "devices"}}) : model::devices(*t->o.vol);
  if (!before) return online ? fail(path + ": " + before.error().message()) : fail_on(path, before.error());
  if ((*before)["classes"].empty()) {
    if (sub == "remove") return usage_error(path + ": the only device of a volume cannot be removed");
    if (sub == "replace" && p->pos[1] != "0" && device_display_name(p->pos[1]) != device_display_name(path) && !find_device(*before, p->pos[1]))
      return usage_error(path + ": " + p->pos[1] + " is not a device of the volume (its one device is 0)");
    // A volume of one device becomes one of several (format.md#device-convert):
    // its device first, of class --first-class, then the add (or the
    // replace: an add, then the removal of device 0) as on any. On a
    // mount the daemon does both.
    const std::string first = p->opt.count("--first-class") ? p->opt["--first-class"] : "main";
    if (!valid_class_name(first)) return usage_error("--first-class " + first + ": a class name has 1 to 15 bytes of a-z 0-9 _ -");
    const std::string cls = p->opt.count("--class") ? p->opt["--class"] : first;
    if (online && sub == "add") {
      Json req{{"command", "device-add"}, {"path", device_display_name(added)}, {"force", force}, {"class", cls},
               {"first_class", first}};
      auto after = request(t->mnt, req);
      if (!after) return device_error(path, after.error(), true);
      if (p->opt.count("--json")) {
        print_json(*after);
      } else {
        print_added(path, added, *after);
      }
      return 0;
    }
    // Offline: what the add would refuse is refused before the volume
    // changes; then the conversion, and the volume opened again as one of
    // several devices. (A replace on a mount is the daemon's, below.)
    if (!online) {
      SuperInfo conv = t->o.vol->super();
      conv.incompat |= kIncompatMultiDevice;
      conv.classes = {first};
      conv.meta_class = 0;
      conv.devices = {DeviceInfo{}};
      conv.devices[0].nblocks = conv.total_blocks;
      if (device_display_name(added) == device_display_name(path)) return usage_error(added + " is the volume's device already");
      auto nd = open_device(added, FileOpenOptions{true, false});
      if (!nd) return fail_on(added, nd.error());
      if (auto r = plan_device_add(conv, **nd, added, cls, force); !r) return device_error(added, r.error(), false);
      nd->reset();
      if (auto c = t->o.vol->close(); !c) return fail_on(path, c.error());
      t->o.vol.reset();
      auto set = make_multi_device(std::move(t->o.dev), path, first);
      if (!set) return fail_on(path, set.error());
      set->reset();  // its lock goes: the volume opens again as one of several devices
      auto o = open_volume(path, true);
      if (!o) return fail_on(path, o.error());
      t->o = std::move(*o);
      before = model::devices(*t->o.vol);
      if (!before) return fail_on(path, before.error());
    }
  } else if (p->opt.count("--first-class")) {
    return usage_error("--first-class: " + path + " has several devices already (it names the first device's class "
                       "when a volume of one device takes a second)");
  }
  size_t index = 0;
  if (sub != "add" && !(*before)["classes"].empty()) {  // a volume of one device: 0, checked above
    auto i = find_device(*before, p->pos[1]);
    if (!i) return usage_error(path + ": " + i.error().message());
    index = *i;
  }
  // Named twice: a device open as a member already (and locked).
  if (!added.empty())
    for (const auto& d : (*before)["devices"])
      if (d["path"].is_string() && d["path"].get<std::string>() == device_display_name(added))
        return usage_error(added + " is a device of the volume already (device " +
                           std::to_string(d["index"].get<size_t>()) + ")");
  const std::string cls = p->opt.count("--class") ? p->opt["--class"]
                          : sub == "replace"      ? (*before)["devices"][index]["class"].is_string()
                                                        ? (*before)["devices"][index]["class"].get<std::string>()
                                                        : std::string("main")
                                                  : (*before)["classes"].back().get<std::string>();
  Result<Json> after = Error::invalid("");
  if (online) {
    Json req{{"command", "device-" + sub}};
    if (!added.empty()) req["path"] = device_display_name(added), req["force"] = force;
    if (sub == "add") req["class"] = cls;
    else req["device"] = index;
    Progress work("moving blocks off the device", 0, Progress::Unit::Bytes);
    after = request(t->mnt, req, nullptr, sub == "add" ? nullptr : &work);
    if (!after) return device_error(path, after.error(), true);
  } else {
    Volume& vol = *t->o.vol;
    const uint64_t bs = vol.block_size();
    uint64_t moved = 0;
    if (!added.empty()) {
      auto dev = open_device(added, FileOpenOptions{false, true});
      if (!dev) return fail_on(added, dev.error());
      if (auto r = vol.add_device(std::move(*dev), device_display_name(added), cls, force); !r)
        return device_error(added, r.error(), false);
    }
    if (sub != "add") {
      Progress prog("moving blocks off the device", 0, Progress::Unit::Bytes);
      auto r = vol.remove_device(index, [&](uint64_t done, uint64_t total) {
        prog.set_total(total * bs);
        prog.update(done * bs);
        moved = done * bs;
      });
      if (prog.shown()) prog.finish();
      if (!r) return device_error(path, r.error(), false);
    }
    after = model::devices(vol);
    if (!after) return fail_on(path, after.error());
    if (sub != "add") (*after)["moved_bytes"] = moved;
    if (auto c = vol.close(); !c) return fail_on(path, c.error());
  }
  if (p->opt.count("--json")) {
    print_json(*after);
  } else if (sub == "add") {
    print_added(path, added, *after);
  } else {
    print_change(path, sub == "remove" ? "removed" : "replaced", *before, index, added, *after);
  }
  return 0;
}

}  // namespace

int cmd_device(const std::string& sub, const std::vector<std::string>& args) {
  if (sub == "add" || sub == "remove" || sub == "replace") return device_change(sub, args);
  if (sub != "list") return usage_error("unknown device subcommand '" + sub + "' (list, add, remove, replace)");
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
