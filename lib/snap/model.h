// The one JSON model of branches, views, stacks and the branch lifecycle
// (plyctl.8, "JSON SCHEMA"; docs/plyctl.schema.json is its machine-readable
// form). plyctl prints these objects offline, the daemon answers with the
// same objects on its control channel (fuse/control.h) and writes them in
// the control folder's info.json, so that one command prints the same thing
// whether it ran on an image or on a mount. Rules:
//  M1 names are bytes: a field holding one ("name", "branch", "path",
//     "label"...) is valid UTF-8 (lossy_utf8), and when the bytes are not
//     UTF-8 the object also carries FIELD_bytes, the exact bytes in base64;
//  M2 a stack is always an array of StackEntry {branch, id, writable};
//  M3 enums are strings; no field holds a sentence;
//  M4 fields come in the documented order (ordered_json).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fs/scrub.h"
#include "fs/send.h"
#include "snap/snap.h"
#include "snap/usage.h"

namespace plyfs::model {

using Json = nlohmann::ordered_json;

// M1: o[key] = lossy text, and o[key + "_bytes"] = base64 when needed.
void put_name(Json& o, const std::string& key, std::string_view bytes);
// The exact bytes back: key_bytes if present, else key (EINVAL when
// neither is a string, or key_bytes is no base64).
Result<std::string> get_name(const Json& o, const std::string& key);
// One line (indent < 0) or indented; never throws.
std::string dump(const Json& j, int indent = -1);
// Parses JSON text; EPROTO for anything else (answers of a daemon).
Result<Json> parse(std::string_view text);

// The live branches of an image, read once, with what the objects need
// (layer flags, names of parents and children).
class Branches {
 public:
  // With `space`, each branch's referenced and exclusive bytes too
  // (snap/usage.h), which branch() then adds as "space".
  static Result<Branches> read(Volume& v, bool space = false);
  const std::vector<BranchMeta>& all() const { return all_; }
  const BranchMeta* find(TreeId t) const;
  bool is_layer(TreeId t) const;
  std::vector<const BranchMeta*> children(TreeId t) const;  // layers made on t, by id

  Json branch(const BranchMeta& b) const;  // Branch
  Json ref(TreeId t) const;                // BranchRef, or null for no live branch
  Json stack(const std::vector<ViewLayer>& s) const;  // [StackEntry]
  Json view(const View& w) const;                      // View
  // "top=rw:base=ro", names shown (text.h), for text output.
  std::string stack_text(const std::vector<ViewLayer>& s) const;

 private:
  std::vector<BranchMeta> all_;
  std::map<uint64_t, bool> layer_;
  std::map<uint64_t, BranchSpace> space_;
};

// Image (plyctl show): the newest durable superblock of `v`, its space and
// its trees; `slot` holds that superblock, `slots` says what each slot
// holds. Offline these come from the volume's recovery; a mount that has
// committed since it opened has written both slots (format.md#commit, C2).
Result<Json> image(Volume& v, int slot, const SlotState (&slots)[2]);
const char* slot_enum(SlotState s);  // the SlotState enum of the schema

Json space_use(const SpaceUse& u);      // SpaceUse {data, metadata, total}
Json branch_space(const BranchSpace& s);  // BranchSpace {referenced, exclusive}
Json quota(const BranchMeta& b);          // Quota {referenced, exclusive}: bytes or null
Json scrub(const ScrubReport& r);         // Scrub
// Du (plyctl du): every live branch's space, or with `branch` that one's,
// with the bytes of it each other branch shares; and the volume's totals.
Result<Json> du(Volume& v, std::optional<TreeId> branch);
// Devices (plyctl device list): the devices of the volume with their class,
// path, size and use; the classes, fastest first, and metadata's.
Result<Json> devices(Volume& v);
// Where (plyctl where): on which devices a file's data extents lie, each
// extent and the bytes per device.
Json where(Volume& v, const std::vector<Filesystem::Placed>& extents);
// Placement rules (plyctl policy list, format.md#placement-rules): the
// volume's classes, fastest first, and its rules in rank order, each with
// its text and what it matches and gives (schema "Policy").
Result<Json> policy(Volume& v);
// plyctl policy apply: the files moved and the bytes they moved (schema
// "PolicyApply").
Json policy_applied(Volume& v, const Filesystem::MigrationStats& st);
// A mount's background migration since it began (plyctl policy list on a
// mount): policy_applied's counts and the files still waiting.
Json policy_migration(Volume& v, const Filesystem::MigrationStats& st);
// One rule as the model shows it (rank from 1).
Json policy_rule(const PlacementRule& r, size_t rank);
// plyctl policy test: the rule a new file at `path` (from the root) of that
// size, owner and mode would fall under, and where its data would go
// (schema "PolicyTest"). `rules` are the ones in force.
Result<Json> policy_test(Volume& v, const std::vector<PlacementRule>& rules, const std::string& path,
                         uint64_t size, uint32_t uid, uint32_t gid, uint32_t mode);

Json snapshot(const Branches& bs, const Snapshot& s);  // Snapshot
Json merge(const Branches& bs, const Merge& m);        // Merge
Json rollback(const Branches& bs, const Rollback& r);  // Rollback
// Send (plyctl send): the branch sent, its parent or null, where the stream
// went, its compression ("zstd:N" or "none") and SendStats' counts.
Json sent(const Branches& bs, const BranchMeta& b, const std::optional<BranchMeta>& parent, const SendStats& s,
          std::string_view output, int zstd_level);
// Receive (plyctl receive): the new branch, the parent it was applied to or
// null, and ReceiveStats' counts.
Json received(const Branches& bs, const Received& r);

const char* change_name(Change c);  // "added", "removed", "modified", "renamed"
const char* type_name(uint8_t dt);  // "file", "directory", "symlink"...
Json diff_entry(const DiffEntry& e);
Json diff(const std::vector<DiffEntry>& d);  // [DiffEntry]
// The entries back from diff()'s JSON (an online diff's answer).
Result<std::vector<DiffEntry>> parse_diff(const Json& j);

// The text forms of a diff (plyctl.8, "diff"): a line "C<TAB>PATH" per entry
// ("R<TAB>OLD -> NEW"), paths shown (text.h); with `nul`, names raw and
// each record ended by NUL instead of a newline, " -> " a NUL too.
std::string diff_text(const std::vector<DiffEntry>& d, bool nul);

}  // namespace plyfs::model
