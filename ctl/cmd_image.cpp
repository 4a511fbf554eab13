// plyctl show: an image's superblocks, space and trees; offline, or from
// the daemon of the mount serving it (its `show` command, control.h).
#include "cli.h"

#include <cinttypes>
#include <cstdio>

#include "fs/fs.h"
#include "mount_client.h"
#include "output.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

// The Image object of an image opened here: its recovery says what each
// superblock slot holds.
Result<Json> offline_image(BlockDevice& dev) {
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.movers = fs_movers();
  vo.read_only = true;
  auto vol = PLY_TRY(Volume::open(dev, vo));
  const auto& rec = vol->recovery();
  const SlotState slots[2] = {rec.reports[0].state, rec.reports[1].state};
  return model::image(*vol, rec.slot, slots);
}

// slot_state_name of a SlotState enum (model::slot_enum).
const char* slot_text(const Json& e) {
  for (SlotState s : {SlotState::Valid, SlotState::Empty, SlotState::Foreign, SlotState::Torn, SlotState::BadChecksum,
                      SlotState::BadFields, SlotState::Unsupported, SlotState::Unreadable})
    if (e == model::slot_enum(s)) return slot_state_name(s);
  return "?";
}

// A count of the object (built here, a signed number may hold it; parsed
// from the daemon's text, an unsigned one), or 0.
uint64_t u64(const Json& o, const char* key) {
  const Json& v = o.contains(key) ? o[key] : Json();
  return v.is_number_integer() && v >= 0 ? v.get<uint64_t>() : 0;
}

// The text of an Image object, the same from either side.
void print_image(const std::string& image, const Json& o) {
  auto label = model::get_name(o, "label");
  const Json slots = o.value("slots", Json::array());
  std::printf("Filesystem   %s\nUUID         %s\nLabel        %s\n", image.c_str(),
              o.value("uuid", std::string("?")).c_str(), !label || label->empty() ? "(none)" : shown(*label).c_str());
  std::printf("Generation   %" PRIu64 " in slot %d (slot 0 %s, slot 1 %s)\n", u64(o, "generation"),
              int(u64(o, "slot")), slot_text(slots.size() == 2 ? slots[0] : Json()),
              slot_text(slots.size() == 2 ? slots[1] : Json()));
  std::printf("Blocks       %" PRIu64 " of %" PRIu64 " bytes, first usable %" PRIu64 "\n", u64(o, "total_blocks"),
              u64(o, "block_size"), u64(o, "first_block"));
  std::printf("Used         %" PRIu64 " blocks (%" PRIu64 " metadata, %" PRIu64 " data), %" PRIu64
              " free, %" PRIu64 " in reserve\n",
              u64(o, "used_blocks"), u64(o, "meta_blocks"), u64(o, "data_blocks"), u64(o, "free_blocks"),
              u64(o, "reserve_blocks"));
  const Json trees = o.value("trees", Json::array());
  std::printf("Trees        %zu\n\n", trees.size());
  std::fflush(stdout);
  Table t({{"ID", true}, {"KIND"}, {"ROOT", true}, {"LEVEL", true}, {"CREATED", true}, {"CLONED FROM", true}});
  for (const auto& x : trees)
    t.add({std::to_string(u64(x, "id")), x.value("kind", std::string("?")), std::to_string(u64(x, "root")),
           std::to_string(u64(x, "level")), std::to_string(u64(x, "created_generation")),
           x.contains("cloned_from") && x["cloned_from"].is_number_integer() ? std::to_string(u64(x, "cloned_from"))
                                                                              : "-"});
  t.print();
}

}  // namespace

int cmd_show(const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() != 1) return usage_error("usage: plyctl show IMAGE|MOUNTPOINT [--json]");
  const std::string& image = p->pos[0];
  // A mount point, or an image a plyfs mount serves: its daemon answers.
  std::string mnt = is_directory(image) ? image : "";
  Result<Json> o = Error::invalid("");
  if (mnt.empty()) {
    auto dev = open_image(image, false);
    if (!dev && dev.error().code == EBUSY)
      if (auto m = mount_of(image)) mnt = *m;
    if (!dev && mnt.empty()) return fail(dev.error().message());
    if (dev) {
      o = offline_image(**dev);
      if (!o) return fail_on(image, o.error());
    }
  }
  if (!mnt.empty()) {
    o = request(mnt, Json{{"command", "show"}});
    if (!o) return fail(o.error().message());
  }
  if (p->opt.count("--json")) print_json(*o);
  else print_image(image, *o);
  return 0;
}

}  // namespace plyfs::ctl
