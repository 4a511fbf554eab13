// plyctl show: an image's superblocks, space and trees.
#include "cli.h"

#include <uuid/uuid.h>

#include <cinttypes>
#include <cstdio>

#include "fs/fs.h"

namespace plyfs::ctl {

int cmd_show(const std::vector<std::string>& args) {
  if (args.empty() || args.size() > 2 || (args.size() == 2 && args[1] != "--json"))
    return usage_error("usage: plyctl show IMAGE [--json]");
  const bool json = args.size() == 2;
  auto dev = open_image(args[0], false);
  if (!dev) return fail(dev.error().message());
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.read_only = true;
  auto vol = Volume::open(**dev, vo);
  if (!vol) return fail(args[0] + ": " + vol.error().message());
  const SuperInfo s = (*vol)->super();
  const auto& rec = (*vol)->recovery();
  const auto st = (*vol)->space_stats();
  auto txn = (*vol)->begin();
  if (!txn) return fail(txn.error().message());
  auto trees = txn->list_trees();
  if (!trees) return fail(trees.error().message());
  char uuid[37];
  uuid_unparse_lower(s.uuid.data(), uuid);
  if (json) {
    std::printf("{\"uuid\": \"%s\", \"label\": \"%s\", \"generation\": %" PRIu64
                ", \"slot\": %d, \"block_size\": %u, \"total_blocks\": %" PRIu64
                ", \"used_blocks\": %" PRIu64 ", \"meta_blocks\": %" PRIu64
                ", \"data_blocks\": %" PRIu64 ", \"reserve_blocks\": %" PRIu64
                ", \"slots\": [\"%s\", \"%s\"], \"trees\": [",
                uuid, s.label.c_str(), s.generation.v, rec.slot, s.block_size, s.total_blocks,
                s.used_blocks, s.meta_blocks, s.data_blocks, s.reserve_blocks,
                slot_state_name(rec.reports[0].state), slot_state_name(rec.reports[1].state));
    for (size_t i = 0; i < trees->size(); i++) {
      const auto& t = (*trees)[i];
      std::printf("%s{\"id\": %" PRIu64 ", \"kind\": %u, \"root\": %" PRIu64 ", \"level\": %u, "
                  "\"created\": %" PRIu64 ", \"cloned_from\": %" PRIu64 "}",
                  i ? ", " : "", t.id.v, t.kind, t.root.block.v, t.root.level, t.created.v,
                  t.cloned_from.v);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("Filesystem   %s\nUUID         %s\nLabel        %s\n", args[0].c_str(), uuid,
              s.label.empty() ? "(none)" : s.label.c_str());
  std::printf("Generation   %" PRIu64 " in slot %d (slot 0 %s, slot 1 %s)\n", s.generation.v,
              rec.slot, slot_state_name(rec.reports[0].state), slot_state_name(rec.reports[1].state));
  std::printf("Blocks       %" PRIu64 " of %u bytes, first usable %" PRIu64 "\n", s.total_blocks,
              s.block_size, s.first_block);
  std::printf("Used         %" PRIu64 " blocks (%" PRIu64 " metadata, %" PRIu64 " data), %" PRIu64
              " free, %" PRIu64 " in reserve\n",
              st.used_blocks, st.meta_blocks, st.data_blocks, st.free_blocks, st.reserve_blocks);
  std::printf("Trees        %zu\n", trees->size());
  for (const auto& t : *trees)
    std::printf("  tree %" PRIu64 ": kind %u, root block %" PRIu64 " level %u, created in %" PRIu64
                "%s\n",
                t.id.v, t.kind, t.root.block.v, t.root.level, t.created.v,
                t.cloned_from.v ? (", clone of " + std::to_string(t.cloned_from.v)).c_str() : "");
  return 0;
}

}  // namespace plyfs::ctl
