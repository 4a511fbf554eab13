// The JSON model (model.h; plyctl.8, "JSON SCHEMA").
#include "snap/model.h"

#include <dirent.h>

#include <algorithm>

#include "blockdev/device_set.h"
#include "commit/devices.h"
#include "fs/disk_fs.h"
#include "union/view.h"
#include "util/text.h"

namespace plyfs::model {

void put_name(Json& o, const std::string& key, std::string_view bytes) {
  o[key] = lossy_utf8(bytes);
  if (!valid_utf8(bytes)) o[key + "_bytes"] = base64(bytes);
}

Result<std::string> get_name(const Json& o, const std::string& key) {
  if (!o.is_object()) return Error::invalid("a JSON object was expected");
  if (auto b = o.find(key + "_bytes"); b != o.end()) {
    if (!b->is_string()) return Error::invalid("\"" + key + "_bytes\" is not a string");
    auto raw = unbase64(b->get<std::string>());
    if (!raw) return Error::invalid("\"" + key + "_bytes\" is not base64");
    return *raw;
  }
  auto t = o.find(key);
  if (t == o.end() || !t->is_string()) return Error::invalid("\"" + key + "\" is missing or not a string");
  return t->get<std::string>();
}

std::string dump(const Json& j, int indent) {
  // M1 makes every string UTF-8; replace keeps a slip from throwing.
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<Json> parse(std::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return Error::io(EPROTO, "the answer is not JSON");
  return j;
}

// --- branches -----------------------------------------------------------------------------

Result<Branches> Branches::read(Volume& v, bool space) {
  Branches out;
  out.all_ = PLY_TRY(Filesystem::branches(v));
  std::erase_if(out.all_, [](const BranchMeta& b) { return b.doomed; });
  std::sort(out.all_.begin(), out.all_.end(), [](const BranchMeta& a, const BranchMeta& b) { return a.tree.v < b.tree.v; });
  for (const auto& b : out.all_) out.layer_[b.tree.v] = PLY_TRY(plyfs::is_layer(v, b));
  if (space) {
    std::vector<TreeId> trees;
    for (const auto& b : out.all_) trees.push_back(b.tree);
    out.space_ = PLY_TRY(plyfs::branch_spaces(v, trees));
  }
  return out;
}

const BranchMeta* Branches::find(TreeId t) const {
  for (const auto& b : all_)
    if (b.tree == t) return &b;
  return nullptr;
}

bool Branches::is_layer(TreeId t) const {
  auto it = layer_.find(t.v);
  return it != layer_.end() && it->second;
}

std::vector<const BranchMeta*> Branches::children(TreeId t) const {
  std::vector<const BranchMeta*> out;
  for (const auto& b : all_)
    if (b.parent == t && b.tree != t && is_layer(b.tree)) out.push_back(&b);
  return out;
}

Json Branches::ref(TreeId t) const {
  const BranchMeta* b = find(t);
  if (!b) return nullptr;
  Json o = Json::object();
  put_name(o, "branch", b->name);
  o["id"] = b->tree.v;
  return o;
}

// A uuid as text, or null for none (a tree written before FsInfo version 4).
static Json uuid_text(const std::array<uint8_t, 16>& u) {
  if (std::all_of(u.begin(), u.end(), [](uint8_t x) { return x == 0; })) return nullptr;
  return ::plyfs::uuid_text(u);
}

// A branch's limits (format.md#quotas): bytes, or null for none.
Json quota(const BranchMeta& b) {
  Json o = Json::object();
  o["referenced"] = b.quota_referenced ? Json(b.quota_referenced) : Json(nullptr);
  o["exclusive"] = b.quota_exclusive ? Json(b.quota_exclusive) : Json(nullptr);
  return o;
}

Json scrub(const ScrubReport& r) {
  Json o = Json::object();
  o["metadata_blocks"] = r.metadata_blocks;
  o["data_blocks"] = r.data_blocks;
  o["bytes"] = r.bytes;
  o["seconds"] = r.seconds;
  o["cancelled"] = r.cancelled;
  Json list = Json::array();
  for (const auto& d : r.damage) {
    Json e = Json::object();
    e["block"] = d.block;
    e["type"] = d.metadata ? "metadata" : "data";
    e["reason"] = d.reason == ScrubDamage::Reason::Checksum  ? "checksum"
                  : d.reason == ScrubDamage::Reason::Corrupt ? "corrupt"
                                                             : "unreadable";
    Json refs = Json::array();
    for (const auto& ref : d.refs) {
      Json x = Json::object();
      put_name(x, "branch", ref.branch);
      if (d.metadata) x["path"] = nullptr;
      else put_name(x, "path", ref.path);
      refs.push_back(std::move(x));
    }
    e["references"] = std::move(refs);
    list.push_back(std::move(e));
  }
  o["damage"] = std::move(list);
  return o;
}

Json Branches::branch(const BranchMeta& b) const {
  Json o = Json::object();
  put_name(o, "name", b.name);
  o["id"] = b.tree.v;
  o["parent"] = b.parent.v ? ref(b.parent) : Json(nullptr);
  o["layer"] = is_layer(b.tree);
  o["writable"] = !b.read_only;
  o["snapshot"] = b.snapshot;
  o["held"] = b.held;  // plyctl hold: no delete or retention takes it
  o["quota"] = quota(b);
  o["compress"] = b.compress.mode == Compression::Mode::Unset ? Json(nullptr) : Json(compression_name(b.compress));
  // A snapshot's or clone's origin: the branch it was taken of (null once
  // that branch is gone, or for a branch made empty).
  o["origin"] = b.origin.v ? ref(b.origin) : Json(nullptr);
  o["uuid"] = uuid_text(b.uuid);
  // Received (plyctl receive): the uuid of the branch it copies.
  o["received_uuid"] = uuid_text(b.received_uuid);
  o["created_generation"] = b.created.v;
  Json kids = Json::array();
  for (const BranchMeta* c : children(b.tree)) kids.push_back(ref(c->tree));
  o["children"] = std::move(kids);
  if (auto it = space_.find(b.tree.v); it != space_.end()) o["space"] = branch_space(it->second);
  return o;
}

Json space_use(const SpaceUse& u) {
  Json o = Json::object();
  o["data"] = u.data;
  o["metadata"] = u.metadata;
  o["total"] = u.total();
  return o;
}

Result<Json> devices(Volume& v) {
  const SuperInfo sb = v.super();
  const auto use = PLY_TRY(v.device_usage());
  const uint64_t bs = sb.block_size;
  auto* set = v.device().device_set();
  Json list = Json::array();
  const size_t n = std::max<size_t>(1, sb.devices.size());
  // Where metadata goes, as the space manager allocates it: the metadata
  // class, or the next class with a device once the last device of that
  // class was removed (format.md#placement, format.md#device-remove).
  const int meta_to = v.metadata_class();
  for (size_t i = 0; i < n; i++) {
    Json d;
    d["index"] = i;
    const bool multi = !sb.devices.empty();
    d["uuid"] = multi ? uuid_text(sb.devices[i].uuid) : Json(nullptr);
    d["class"] = multi ? Json(sb.classes[sb.devices[i].class_id]) : Json(nullptr);
    // A volume of one device held as itself (offline) is named as the
    // daemon's one-member set names it (format.md#device-convert).
    const std::string lone = set ? std::string() : v.device().display_name();
    d["path"] = set && i < set->member_count() ? Json(set->member_info(i).name)
                : !lone.empty()                  ? Json(lone)
                                                 : Json(nullptr);
    const uint64_t blocks = multi ? sb.devices[i].nblocks : sb.total_blocks;
    d["size_bytes"] = blocks * bs;
    d["used_bytes"] = use[i].used_blocks * bs;
    d["metadata_bytes"] = use[i].meta_blocks * bs;
    d["data_bytes"] = use[i].data_blocks * bs;
    d["metadata"] = !multi || int(sb.devices[i].class_id) == meta_to;
    list.push_back(std::move(d));
  }
  Json classes = Json::array();
  for (const auto& c : sb.classes) classes.push_back(c);
  return Json{{"devices", std::move(list)},
              {"classes", std::move(classes)},
              {"metadata_class", sb.classes.empty() ? Json(nullptr) : Json(sb.classes[sb.meta_class])}};
}

Json where(Volume& v, const std::vector<Filesystem::Placed>& extents) {
  const SuperInfo sb = v.super();
  const uint64_t bs = sb.block_size;
  auto* set = v.device().device_set();
  auto device_of = [&](uint64_t b) {
    size_t i = 0;
    while (i + 1 < sb.devices.size() && sb.devices[i + 1].first_block <= b) i++;
    return i;
  };
  auto describe = [&](size_t i, Json& o) {
    o["device"] = i;
    o["class"] = sb.devices.empty() ? Json(nullptr) : Json(sb.classes[sb.devices[i].class_id]);
  };
  std::map<size_t, uint64_t> per;
  Json list = Json::array();
  for (const auto& e : extents) {
    const size_t i = device_of(e.block);
    Json o{{"offset", e.file_offset}, {"bytes", e.bytes}, {"stored_bytes", e.nblocks * bs}};
    describe(i, o);
    list.push_back(std::move(o));
    per[i] += e.nblocks * bs;
  }
  Json devs = Json::array();
  for (const auto& [i, bytes] : per) {
    Json o;
    describe(i, o);
    o["path"] = set && i < set->member_count() ? Json(set->member_info(i).name) : Json(nullptr);
    o["stored_bytes"] = bytes;
    devs.push_back(std::move(o));
  }
  return Json{{"extents", std::move(list)}, {"devices", std::move(devs)}};
}

Result<Json> du(Volume& v, std::optional<TreeId> branch) {
  const Branches bs = PLY_TRY(Branches::read(v));
  Json list = Json::array();
  uint64_t exclusive = 0;
  std::vector<TreeId> all;
  for (const auto& b : bs.all()) all.push_back(b.tree);
  std::map<uint64_t, BranchSpace> spaces;
  if (!branch) spaces = PLY_TRY(branch_spaces(v, all));
  for (const auto& b : bs.all()) {
    if (branch && b.tree != *branch) continue;
    Json o = bs.ref(b.tree);
    BranchDu d;
    if (branch) d = PLY_TRY(branch_du(v, b.tree, all));
    else d.space = spaces[b.tree.v];
    o["referenced"] = space_use(d.space.referenced);
    o["exclusive"] = space_use(d.space.exclusive);
    exclusive += d.space.exclusive.total();
    if (branch) {
      Json sh = Json::array();
      for (const auto& [t, bytes] : d.shared) {
        Json e = bs.ref(t);
        e["bytes"] = bytes;
        sh.push_back(std::move(e));
      }
      o["shared"] = std::move(sh);
    }
    list.push_back(std::move(o));
  }
  if (branch && list.empty()) return Error::io(ENOENT, "no such branch");
  // The volume: what the space map counts (its own trees, the catalog and
  // every branch), and, for the whole list, what only sharing holds.
  const auto st = v.space_stats();
  const uint64_t bsz = v.block_size();
  Json vol = Json::object();
  vol["size"] = st.usable_blocks * bsz;
  vol["used"] = st.used_blocks * bsz;
  vol["free"] = st.free_blocks * bsz;
  vol["data"] = st.data_blocks * bsz;
  vol["metadata"] = st.meta_blocks * bsz;
  vol["exclusive"] = branch ? Json(nullptr) : Json(exclusive);
  Json o = Json::object();
  o["branches"] = std::move(list);
  o["volume"] = std::move(vol);
  return o;
}

Json branch_space(const BranchSpace& s) {
  Json o = Json::object();
  o["referenced"] = space_use(s.referenced);
  o["exclusive"] = space_use(s.exclusive);
  return o;
}

Json Branches::stack(const std::vector<ViewLayer>& s) const {
  Json a = Json::array();
  for (const auto& l : s) {
    Json e = Json::object();
    const BranchMeta* b = find(l.tree);
    // A stack names live branches (check_stack); a tree id stands in for a
    // name only if the catalog is damaged.
    put_name(e, "branch", b ? b->name : std::to_string(l.tree.v));
    e["id"] = l.tree.v;
    e["writable"] = l.writable;
    a.push_back(std::move(e));
  }
  return a;
}

std::string Branches::stack_text(const std::vector<ViewLayer>& s) const {
  std::string out;
  for (const auto& l : s) {
    if (!out.empty()) out += ':';
    const BranchMeta* b = find(l.tree);
    out += b ? shown(b->name) : std::to_string(l.tree.v);
    out += l.writable ? "=rw" : "=ro";
  }
  return out;
}

Json Branches::view(const View& w) const {
  Json o = Json::object();
  put_name(o, "name", w.name);
  o["default"] = w.is_default;
  o["stack"] = stack(w.layers);
  return o;
}

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

Result<Json> image(Volume& v, int slot, const SlotState (&slots)[2]) {
  const SuperInfo s = v.super();
  const auto st = v.space_stats();
  auto txn = PLY_TRY(v.begin());
  auto trees = PLY_TRY(txn.list_trees());
  const Json u = uuid_text(s.uuid);
  Json o = Json::object();
  o["uuid"] = u.is_null() ? "00000000-0000-0000-0000-000000000000" : u;
  put_name(o, "label", s.label);
  o["generation"] = s.generation.v;
  o["slot"] = slot;
  o["slots"] = {slot_enum(slots[0]), slot_enum(slots[1])};
  o["block_size"] = s.block_size;
  o["total_blocks"] = s.total_blocks;
  o["first_block"] = s.first_block;
  o["used_blocks"] = st.used_blocks;
  o["meta_blocks"] = st.meta_blocks;
  o["data_blocks"] = st.data_blocks;
  o["free_blocks"] = st.free_blocks;
  o["reserve_blocks"] = st.reserve_blocks;
  Json ts = Json::array();
  for (const auto& t : trees) {
    Json x = Json::object();
    x["id"] = t.id.v;
    x["kind"] = t.kind == kKindPlain ? "plain" : t.kind == disk::kKindFs ? "filesystem" : "unknown";
    x["root"] = t.root.block.v;
    x["level"] = t.root.level;
    x["created_generation"] = t.created.v;
    x["cloned_from"] = t.cloned_from.v ? Json(t.cloned_from.v) : Json(nullptr);
    ts.push_back(std::move(x));
  }
  o["trees"] = std::move(ts);
  return o;
}

Json snapshot(const Branches& bs, const Snapshot& s) {
  Json o = Json::object();
  const BranchMeta* frozen = bs.find(s.frozen.tree);
  const BranchMeta* live = bs.find(s.live.tree);
  o["snapshot"] = bs.branch(frozen ? *frozen : s.frozen);
  o["live"] = bs.branch(live ? *live : s.live);
  return o;
}

// The counts send and receive both report, in the order of their objects.
template <class Stats>
static void put_stream_counts(Json& o, const Stats& s) {
  o["records"] = s.records;
  o["items"] = s.items;
  o["deleted"] = s.deleted;
  o["extents"] = s.extents;
  o["shared"] = s.shared;
  o["data_bytes"] = s.data_bytes;
  o["prealloc_bytes"] = s.prealloc_bytes;
  o["stream_bytes"] = s.stream_bytes;
}

Json sent(const Branches& bs, const BranchMeta& b, const std::optional<BranchMeta>& parent, const SendStats& s,
          std::string_view output, int zstd_level) {
  Json o = Json::object();
  const BranchMeta* x = bs.find(b.tree);
  o["branch"] = bs.branch(x ? *x : b);
  if (parent) {
    const BranchMeta* p = bs.find(parent->tree);
    o["parent"] = bs.branch(p ? *p : *parent);
  } else {
    o["parent"] = nullptr;
  }
  put_name(o, "output", output);
  o["compression"] = zstd_level > 0 ? "zstd:" + std::to_string(zstd_level) : std::string("none");
  put_stream_counts(o, s);
  return o;
}

Json received(const Branches& bs, const Received& r) {
  Json o = Json::object();
  const BranchMeta* x = bs.find(r.branch.tree);
  o["branch"] = bs.branch(x ? *x : r.branch);
  if (r.parent) {
    const BranchMeta* p = bs.find(r.parent->tree);
    o["parent"] = bs.branch(p ? *p : *r.parent);
  } else {
    o["parent"] = nullptr;
  }
  put_stream_counts(o, r.stats);
  return o;
}

Json rollback(const Branches& bs, const Rollback& r) {
  Json o = Json::object();
  const BranchMeta* b = bs.find(r.branch.tree);
  o["branch"] = bs.branch(b ? *b : r.branch);
  o["to"] = r.to ? bs.ref(r.to->tree) : Json(nullptr);
  return o;
}

Json merge(const Branches& bs, const Merge& m) {
  Json o = Json::object();
  const BranchMeta* merged = bs.find(m.merged.tree);
  o["merged"] = bs.branch(merged ? *merged : m.merged);
  o["entries"] = m.stats.entries;
  o["objects"] = m.stats.objects;
  o["removed"] = m.stats.removed;
  return o;
}

// --- diff ---------------------------------------------------------------------------------

namespace {
constexpr std::pair<Change, const char*> kChanges[] = {
    {Change::Added, "added"}, {Change::Removed, "removed"}, {Change::Modified, "modified"}, {Change::Renamed, "renamed"}};
constexpr std::pair<uint8_t, const char*> kTypes[] = {
    {DT_REG, "file"},         {DT_DIR, "directory"},        {DT_LNK, "symlink"}, {DT_FIFO, "fifo"},
    {DT_SOCK, "socket"},      {DT_CHR, "char_device"},      {DT_BLK, "block_device"}};
}  // namespace

const char* change_name(Change c) {
  for (auto [k, n] : kChanges)
    if (k == c) return n;
  return "modified";
}

const char* type_name(uint8_t dt) {
  for (auto [k, n] : kTypes)
    if (k == dt) return n;
  return "unknown";
}

Json diff_entry(const DiffEntry& e) {
  Json o = Json::object();
  o["change"] = change_name(e.change);
  o["type"] = type_name(e.type);
  put_name(o, "path", e.path);
  if (e.change == Change::Renamed) put_name(o, "new_path", e.new_path);
  return o;
}

Json diff(const std::vector<DiffEntry>& d) {
  Json a = Json::array();
  for (const auto& e : d) a.push_back(diff_entry(e));
  return a;
}

Result<std::vector<DiffEntry>> parse_diff(const Json& j) {
  if (!j.is_array()) return Error::io(EPROTO, "a diff is a JSON array");
  std::vector<DiffEntry> out;
  for (const auto& o : j) {
    DiffEntry e{};
    const std::string c = o.is_object() && o.contains("change") && o["change"].is_string() ? o["change"].get<std::string>() : "";
    auto ck = std::find_if(std::begin(kChanges), std::end(kChanges), [&](auto& p) { return c == p.second; });
    if (ck == std::end(kChanges)) return Error::io(EPROTO, "a diff entry has no known change");
    e.change = ck->first;
    const std::string t = o.contains("type") && o["type"].is_string() ? o["type"].get<std::string>() : "";
    auto tk = std::find_if(std::begin(kTypes), std::end(kTypes), [&](auto& p) { return t == p.second; });
    e.type = tk == std::end(kTypes) ? uint8_t(DT_UNKNOWN) : tk->first;
    e.path = PLY_TRY(get_name(o, "path"));
    if (e.change == Change::Renamed) e.new_path = PLY_TRY(get_name(o, "new_path"));
    out.push_back(std::move(e));
  }
  return out;
}

std::string diff_text(const std::vector<DiffEntry>& d, bool nul) {
  std::string out;
  for (const auto& e : d) {
    out += char(e.change);
    out += '\t';
    out += nul ? e.path : shown(e.path);
    if (e.change == Change::Renamed) {
      out += nul ? std::string(1, '\0') : std::string(" -> ");
      out += nul ? e.new_path : shown(e.new_path);
    }
    out += nul ? '\0' : '\n';
  }
  return out;
}

}  // namespace plyfs::model

namespace plyfs::model {

Json policy_rule(const PlacementRule& r, size_t rank) {
  Json m = Json::object();
  if (!r.name_glob.empty()) m["name"] = r.name_glob;
  if (!r.exts.empty()) m["ext"] = r.exts;
  if (r.size_min) m["size_min"] = r.size_min;
  if (r.size_below) m["size_below"] = *r.size_below;
  if (r.uid) m["uid"] = *r.uid;
  if (r.gid) m["gid"] = *r.gid;
  if (!r.under.empty()) m["under"] = r.under;
  if (r.access != PlacementRule::Access::Any)
    m["access"] = r.access == PlacementRule::Access::ReadOnly ? "ro" : "rw";
  Json out{{"rank", rank}, {"rule", format_rule(r)}, {"match", std::move(m)}, {"to", r.to}, {"strict", r.strict}};
  if (!r.stage.empty()) out["stage"] = r.stage;
  return out;
}

Json policy_applied(Volume& v, const Filesystem::MigrationStats& st) {
  return Json{{"files_moved", st.files}, {"moved_bytes", st.blocks * v.block_size()}, {"files_failed", st.failed}};
}

Json policy_migration(Volume& v, const Filesystem::MigrationStats& st) {
  Json j = policy_applied(v, st);
  j["queued"] = st.queued;
  return j;
}

Result<Json> policy(Volume& v) {
  const auto rules = PLY_TRY(list_placement_rules(v));
  Json list = Json::array();
  for (size_t i = 0; i < rules.size(); i++) list.push_back(policy_rule(rules[i], i + 1));
  return Json{{"classes", v.super().classes}, {"rules", std::move(list)}};
}

Result<Json> policy_test(Volume& v, const std::vector<PlacementRule>& rules, const std::string& path,
                         uint64_t size, uint32_t uid, uint32_t gid, uint32_t mode) {
  const auto& classes = v.super().classes;
  auto pol = PLY_TRY(PlacementPolicy::compile(rules, classes));
  const int i = pol.choose(pol.candidates(path, uid, gid, mode), size);
  Json out{{"path", path}, {"size", size}, {"uid", uid}, {"gid", gid}, {"mode", mode & 07777}};
  out["rule"] = i < 0 ? Json(nullptr) : policy_rule(rules[size_t(i)], size_t(i) + 1);
  // Without a rule: the default data order, the slowest class first
  // (format.md#placement).
  // A rule's classes come first; unless strict (its first class only), the
  // others follow in that order (format.md#placement-rules).
  std::vector<std::string> order;
  if (i >= 0) {
    const auto& r = rules[size_t(i)];
    order.assign(r.to.begin(), r.strict ? r.to.begin() + 1 : r.to.end());
  }
  if (i < 0 || !rules[size_t(i)].strict)
    for (size_t c = classes.size(); c-- > 0;)
      if (std::find(order.begin(), order.end(), classes[c]) == order.end()) order.push_back(classes[c]);
  // A staged rule's writes try its stage before all of them
  // (format.md#staged-writes); its data is kept on its first class.
  if (i >= 0 && !rules[size_t(i)].stage.empty()) {
    const std::string& st = rules[size_t(i)].stage;
    order.erase(std::remove(order.begin(), order.end(), st), order.end());
    order.insert(order.begin(), st);
    out["stage"] = st;
  }
  out["classes"] = std::move(order);
  out["strict"] = i >= 0 && rules[size_t(i)].strict;
  return out;
}

}  // namespace plyfs::model
