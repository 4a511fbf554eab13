// Space on a mount: trim (format.md#discard) -- `plyctl trim MOUNTPOINT` (the
// control request "trim") and fstrim(8)'s FITRIM ioctl on the mount point,
// both telling the device that every free block is unused (Volume::trim,
// A6) -- and `plyctl resize MOUNTPOINT` (the request "resize",
// format.md#resize; a shrink relocates first, format.md#relocation).
#include <linux/fs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "blockdev/blockdev.h"

#include "daemon.h"
#include "snap/model.h"

namespace plyfs::daemon {

Result<nlohmann::ordered_json> trim_online(uint64_t start, uint64_t len, uint64_t min_bytes) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  RunningOp op("trim", "trimming free space", "bytes");
  const uint64_t trimmed = PLY_TRY(g->vol->trim(start, len, min_bytes, [&](uint64_t done, double fraction) {
    op.update(done, fraction);
  }));
  return nlohmann::ordered_json{{"trimmed_bytes", trimmed}, {"minimum_bytes", min_bytes}};
}

Result<nlohmann::ordered_json> resize_online(std::optional<uint64_t> bytes) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  const uint64_t bs = g->vol->block_size();
  const uint64_t old = g->vol->total_blocks() * bs;
  // A shrink moves blocks first (format.md#relocation): `plyctl status`
  // and the waiting plyctl see how far it got.
  RunningOp op("resize", "moving blocks below the new end", "bytes");
  uint64_t moved = 0;
  const Generation gen = PLY_TRY(g->vol->resize(bytes, [&](uint64_t done, uint64_t total) {
    op.update(done * bs, total ? double(done) / double(total) : 1.0);
    moved = done * bs;
  }));
  return nlohmann::ordered_json{{"old_bytes", old},
                                {"size_bytes", g->vol->total_blocks() * bs},
                                {"generation", gen.v},
                                {"moved_bytes", moved}};
}

// Devices joining and leaving the mounted volume (format.md#device-add,
// format.md#device-remove): `device-add` {"path", "class", "force",
// "first_class"},
// `device-remove` {"device": index}, `device-replace` {"device", "path",
// "force"}; each answers the device list after it (the schema's Devices),
// with "moved_bytes" for a removal. Files stay in use meanwhile: the moves
// hold operations only batch by batch.
namespace {

Result<std::unique_ptr<BlockDevice>> open_new_device(const std::string& path) {
  if (path.empty()) return Error::invalid("\"path\" must name the new device");
  auto dev = PLY_TRY(open_device(path, FileOpenOptions{.read_only = false, .lock = true, .direct = g->odirect, .nbd_cache_bytes = g->nbd_cache}));
  return dev;
}

Result<size_t> arg_device(const nlohmann::ordered_json& req) {
  if (!req.contains("device") || !req["device"].is_number_unsigned())
    return Error::invalid("\"device\" must be a device's index");
  return req["device"].get<size_t>();
}

Result<uint64_t> remove_with_progress(size_t index) {
  const uint64_t bs = g->vol->block_size();
  RunningOp op("device-remove", "moving blocks off the device", "bytes");
  uint64_t moved = 0;
  (void)PLY_TRY(g->vol->remove_device(index, [&](uint64_t done, uint64_t total) {
    op.update(done * bs, total ? double(done) / double(total) : 1.0);
    moved = done * bs;
  }));
  return moved;
}

}  // namespace

Result<nlohmann::ordered_json> device_online(const std::string& cmd, const nlohmann::ordered_json& req) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  const std::string path = req.contains("path") && req["path"].is_string() ? req["path"].get<std::string>() : "";
  const bool force = req.contains("force") && req["force"].is_boolean() && req["force"].get<bool>();
  uint64_t moved = 0;
  if (cmd == "device-add") {
    // A volume of one device becomes one of several first, its device of
    // class "first_class" (format.md#device-convert); the new device's
    // class defaults to the slowest, or to that one.
    std::string first = "main";
    if (req.contains("first_class")) {
      if (!req["first_class"].is_string()) return Error::invalid("\"first_class\" must be a class name");
      first = req["first_class"].get<std::string>();
    }
    const SuperInfo sb = g->vol->super();
    std::string cls = sb.classes.empty() ? first : sb.classes.back();
    if (req.contains("class")) {
      if (!req["class"].is_string()) return Error::invalid("\"class\" must be a class name");
      cls = req["class"].get<std::string>();
    }
    auto dev = PLY_TRY(open_new_device(path));
    (void)PLY_TRY(g->vol->add_device(std::move(dev), device_display_name(path), cls, force, first));
  } else if (cmd == "device-remove") {
    moved = PLY_TRY(remove_with_progress(PLY_TRY(arg_device(req))));
  } else {  // device-replace: the new device with the old one's class, then the old one out
    // A volume of one device becomes one of several first, its device and
    // the new one of class main (format.md#device-convert).
    const size_t index = PLY_TRY(arg_device(req));
    const SuperInfo sb = g->vol->super();
    const bool one = sb.devices.empty();
    if (one ? index != 0 : index >= sb.devices.size())
      return Error::invalid("the volume has no device " + std::to_string(index));
    const std::string cls = one ? "main" : sb.classes[sb.devices[index].class_id];
    auto dev = PLY_TRY(open_new_device(path));
    (void)PLY_TRY(g->vol->add_device(std::move(dev), device_display_name(path), cls, force, cls));
    moved = PLY_TRY(remove_with_progress(index));
  }
  (void)PLY_TRY(g->vol->commit());
  auto out = PLY_TRY(model::devices(*g->vol));
  if (cmd != "device-add") out["moved_bytes"] = moved;
  return out;
}

// FITRIM: struct fstrim_range in and out; on return `len` holds the bytes
// discarded, as fstrim -v prints them. Like the kernel's (CAP_SYS_ADMIN),
// only root or the mount's owner may trim.
void op_fitrim(fuse_req_t req, const void* in_buf, size_t in_size, size_t out_size) {
  fstrim_range r;
  if (in_size < sizeof r || out_size < sizeof r) return (void)fuse_reply_err(req, EINVAL);
  const uid_t uid = fuse_req_ctx(req)->uid;
  if (uid != 0 && uid != ::getuid()) return (void)fuse_reply_err(req, EPERM);
  std::memcpy(&r, in_buf, sizeof r);
  Result<nlohmann::ordered_json> a = Error::io(EIO, "");
  try {
    std::lock_guard lk(g->ctl_mu);
    a = trim_online(r.start, r.len, r.minlen);
  } catch (const std::exception& e) {  // nothing may cross the C callback
    a = Error::io(EIO, e.what());
  }
  if (!a) {
    log_error("FITRIM: %s", a.error().message().c_str());
    return (void)fuse_reply_err(req, errno_of(a.error()));
  }
  r.len = (*a)["trimmed_bytes"].get<uint64_t>();
  fuse_reply_ioctl(req, 0, &r, sizeof r);
}

}  // namespace plyfs::daemon
