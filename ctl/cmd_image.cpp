// plyctl show: an image's superblocks, space and trees.
#include "cli.h"

#include <uuid/uuid.h>

#include <cinttypes>
#include <cstdio>

#include "fs/disk_fs.h"
#include "fs/fs.h"
#include "output.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

// The JSON enums of plyctl.8's Image object.
const char* slot_enum(SlotState s) {
  switch (s) {
    case SlotState::Valid: return "valid";
    case SlotState::Empty: return "empty";
    case SlotState::Foreign: return "foreign";
    case SlotState::Torn: return "torn";
    case SlotState::BadChecksum: return "bad_checksum";
    case SlotState::BadFields: return "bad_fields";
    case SlotState::Unsupported: return "unsupported";
    case SlotState::Unreadable: return "unreadable";
  }
  return "unreadable";
}
const char* kind_enum(uint8_t kind) {
  return kind == kKindPlain ? "plain" : kind == disk::kKindFs ? "filesystem" : "unknown";
}

}  // namespace

int cmd_show(const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() != 1) return usage_error("usage: plyctl show IMAGE [--json]");
  const std::string& image = p->pos[0];
  const bool json = p->opt.count("--json") > 0;
  if (is_directory(image)) return need_image("show", image, "df and plyctl branch list MOUNTPOINT tell what it shows");
  auto dev = open_image(image, false);
  if (!dev) return fail(dev.error().message());
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.read_only = true;
  auto vol = Volume::open(**dev, vo);
  if (!vol) return fail_on(image, vol.error());
  const SuperInfo s = (*vol)->super();
  const auto& rec = (*vol)->recovery();
  const auto st = (*vol)->space_stats();
  auto txn = (*vol)->begin();
  if (!txn) return fail_on(image, txn.error());
  auto trees = txn->list_trees();
  if (!trees) return fail_on(image, trees.error());
  char uuid[37];
  uuid_unparse_lower(s.uuid.data(), uuid);
  if (json) {
    Json o = Json::object();
    o["uuid"] = uuid;
    model::put_name(o, "label", s.label);
    o["generation"] = s.generation.v;
    o["slot"] = rec.slot;
    o["slots"] = {slot_enum(rec.reports[0].state), slot_enum(rec.reports[1].state)};
    o["block_size"] = s.block_size;
    o["total_blocks"] = s.total_blocks;
    o["first_block"] = s.first_block;
    o["used_blocks"] = st.used_blocks;
    o["meta_blocks"] = st.meta_blocks;
    o["data_blocks"] = st.data_blocks;
    o["free_blocks"] = st.free_blocks;
    o["reserve_blocks"] = st.reserve_blocks;
    Json ts = Json::array();
    for (const auto& t : *trees) {
      Json x = Json::object();
      x["id"] = t.id.v;
      x["kind"] = kind_enum(t.kind);
      x["root"] = t.root.block.v;
      x["level"] = t.root.level;
      x["created_generation"] = t.created.v;
      x["cloned_from"] = t.cloned_from.v ? Json(t.cloned_from.v) : Json(nullptr);
      ts.push_back(std::move(x));
    }
    o["trees"] = std::move(ts);
    print_json(o);
    return 0;
  }
  std::printf("Filesystem   %s\nUUID         %s\nLabel        %s\n", image.c_str(), uuid,
              s.label.empty() ? "(none)" : shown(s.label).c_str());
  std::printf("Generation   %" PRIu64 " in slot %d (slot 0 %s, slot 1 %s)\n", s.generation.v,
              rec.slot, slot_state_name(rec.reports[0].state), slot_state_name(rec.reports[1].state));
  std::printf("Blocks       %" PRIu64 " of %u bytes, first usable %" PRIu64 "\n", s.total_blocks,
              s.block_size, s.first_block);
  std::printf("Used         %" PRIu64 " blocks (%" PRIu64 " metadata, %" PRIu64 " data), %" PRIu64
              " free, %" PRIu64 " in reserve\n",
              st.used_blocks, st.meta_blocks, st.data_blocks, st.free_blocks, st.reserve_blocks);
  std::printf("Trees        %zu\n\n", trees->size());
  std::fflush(stdout);
  Table t({{"ID", true}, {"KIND"}, {"ROOT", true}, {"LEVEL", true}, {"CREATED", true}, {"CLONED FROM", true}});
  for (const auto& x : *trees)
    t.add({std::to_string(x.id.v), kind_enum(x.kind), std::to_string(x.root.block.v), std::to_string(x.root.level),
           std::to_string(x.created.v), x.cloned_from.v ? std::to_string(x.cloned_from.v) : "-"});
  t.print();
  return 0;
}

}  // namespace plyfs::ctl
