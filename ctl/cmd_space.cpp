// plyctl trim and resize, on an image or a mount point; either way the same
// result object (plyctl.schema.json: Trim, Resize) and the same text.
// trim: fstrim(8)'s job (format.md#discard): every free block is discarded
// on the device (punched out of an image file, BLKDISCARD on a block
// device); the text is fstrim -v's: "PATH: 1.2 GiB (1288490188 bytes) trimmed".
// resize: grows the filesystem to a size or to its device's (format.md#resize),
// or shrinks it, moving what lies past the new end first (format.md#relocation).
// du: each branch's referenced and exclusive bytes (format.md#accounting),
// or one branch's in detail with what it shares with each other branch.
#include "cli.h"

#include <cstdio>
#include <optional>

#include "mount_client.h"
#include "output.h"
#include "util/parse.h"
#include "util/progress.h"
#include "union/view.h"

namespace plyfs::ctl {

namespace {

Result<Json> offline_trim(Opened o, uint64_t min_bytes) {
  Progress prog("trimming free space", 0, Progress::Unit::Bytes);
  const uint64_t n = PLY_TRY(o.vol->trim(0, UINT64_MAX, min_bytes, [&](uint64_t done, double f) { prog.update(done, f); }));
  prog.finish();
  PLY_CHECK(o.vol->close());
  return Json{{"trimmed_bytes", n}, {"minimum_bytes", min_bytes}};
}

Result<Json> mounted_trim(const std::string& mnt, uint64_t min_bytes) {
  Progress work("trimming free space", 0, Progress::Unit::Bytes);
  return request(mnt, Json{{"command", "trim"}, {"minimum", min_bytes}}, nullptr, &work);
}

Result<Json> offline_resize(Opened o, std::optional<uint64_t> bytes) {
  const uint64_t bs = o.vol->block_size();
  const uint64_t old = o.vol->total_blocks() * bs;
  // A shrink moves what lies past the new end first (format.md#relocation).
  Progress prog("moving blocks below the new end", 0, Progress::Unit::Bytes);
  uint64_t moved = 0;
  const Generation gen = PLY_TRY(o.vol->resize(bytes, [&](uint64_t done, uint64_t total) {
    prog.set_total(total * bs);
    prog.update(done * bs);
    moved = done * bs;
  }));
  if (prog.shown()) prog.finish();
  const uint64_t now = o.vol->total_blocks() * bs;
  PLY_CHECK(o.vol->close());
  return Json{{"old_bytes", old}, {"size_bytes", now}, {"generation", gen.v}, {"moved_bytes", moved}};
}

}  // namespace

int cmd_du(const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.empty() || p->pos.size() > 2) return usage_error("usage: plyctl du IMAGE|MOUNTPOINT [BRANCH] [--json]");
  const std::string& path = p->pos[0];
  auto t = open_target(path, false);
  if (!t) return fail_on(path, t.error());
  Result<Json> r = Error::invalid("");
  if (!t->mnt.empty()) {
    Json req{{"command", "du"}};
    if (p->pos.size() == 2) model::put_name(req, "branch", p->pos[1]);
    r = request(t->mnt, req);
    if (!r) return fail(path + ": " + r.error().message());
  } else {
    std::optional<TreeId> b;
    if (p->pos.size() == 2) {
      auto m = find_branch(*t->o.vol, p->pos[1]);
      if (!m) return fail(m.error().message());
      b = m->tree;
    }
    r = model::du(*t->o.vol, b);
    if (!r) return fail_on(path, r.error());
  }
  if (p->opt.count("--json")) print_json(*r);
  else print_du(*r, p->pos.size() == 2);
  return 0;
}

int cmd_resize(const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() != 2) return usage_error("usage: plyctl resize IMAGE|MOUNTPOINT SIZE|max [--json]");
  std::optional<uint64_t> bytes;
  if (p->pos[1] != "max") {
    auto v = parse_size(p->pos[1]);
    if (!v) return usage_error(v.error().message());
    bytes = *v;
  }
  const std::string& path = p->pos[0];
  // A mount point, or an image a mount serves: its daemon resizes.
  auto t = open_target(path, true);
  if (!t) return fail_on(path, t.error());
  Result<Json> r = Error::invalid("");
  if (!t->mnt.empty()) {
    Json req{{"command", "resize"}};
    req["size"] = bytes ? Json(*bytes) : Json("max");
    Progress work("moving blocks below the new end", 0, Progress::Unit::Bytes);
    r = request(t->mnt, req, nullptr, &work);
  } else {
    r = offline_resize(std::move(t->o), bytes);
  }
  if (!r) return t->mnt.empty() ? fail_on(path, r.error()) : fail(path + ": " + r.error().message());
  if (p->opt.count("--json")) {
    print_json(*r);
    return 0;
  }
  const uint64_t old = r->value("old_bytes", uint64_t(0)), now = r->value("size_bytes", uint64_t(0));
  if (old == now) std::printf("%s: already %s (%llu bytes)\n", path.c_str(), format_size(now).c_str(), (unsigned long long)now);
  else {
    const uint64_t moved = r->value("moved_bytes", uint64_t(0));
    std::printf("%s: resized from %s to %s (%llu bytes), generation %llu%s\n", path.c_str(), format_size(old).c_str(),
                format_size(now).c_str(), (unsigned long long)now, (unsigned long long)r->value("generation", uint64_t(0)),
                now < old ? ("; " + format_size(moved) + " moved").c_str() : "");
  }
  return 0;
}

int cmd_trim(const std::vector<std::string>& args) {
  auto p = parse(args, {"--minimum", "-m"}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() != 1 || (p->opt.count("--minimum") && p->opt.count("-m")))
    return usage_error("usage: plyctl trim IMAGE|MOUNTPOINT [--minimum SIZE] [--json]");
  uint64_t min_bytes = 0;
  const std::string m = p->opt.count("-m") ? p->opt.at("-m") : p->opt.count("--minimum") ? p->opt.at("--minimum") : "";
  if (!m.empty()) {
    auto v = parse_size(m, "minimum");
    if (!v) return usage_error(v.error().message());
    min_bytes = *v;
  }
  const std::string& path = p->pos[0];
  auto t = open_target(path, true);
  if (!t) return fail_on(path, t.error());
  Result<Json> r = t->mnt.empty() ? offline_trim(std::move(t->o), min_bytes) : mounted_trim(t->mnt, min_bytes);
  if (!r) return t->mnt.empty() ? fail_on(path, r.error()) : fail(path + ": " + r.error().message());
  if (p->opt.count("--json")) {
    print_json(*r);
    return 0;
  }
  const uint64_t n = r->is_object() ? r->value("trimmed_bytes", uint64_t(0)) : 0;
  std::printf("%s: %s (%llu bytes) trimmed\n", path.c_str(), format_size(n).c_str(), (unsigned long long)n);
  return 0;
}

}  // namespace plyfs::ctl
