// Views in the catalog tree (view.h; items in format.md#catalog).
#include "union/view.h"

#include "fs/check.h"
#include "fsck/fsck.h"

#include <cstring>
#include <set>

#include "btree/btree.h"
#include "fs/check.h"
#include "union/name_check.h"
#include "util/endian.h"
#include "util/text.h"

namespace plyfs {

namespace disk {
inline constexpr uint32_t kCatalogMagic = 0x54434c50;  // "PLCT"
inline constexpr uint32_t kCatalogVersion = 1;
inline constexpr uint64_t kCatalogHeader = 0;  // key hi of the header (lo 0)
inline constexpr uint64_t kCatalogView = 1;    // key hi of a view (lo: view id)
inline constexpr uint64_t kCatalogRule = 2;    // key hi of a placement rule (lo: its rank, from 1)

struct CatalogHeader {
  le32 magic;
  le32 version;
  le64 reserved;
};
static_assert(sizeof(CatalogHeader) == 16);

inline constexpr uint32_t kViewDefault = 1;
inline constexpr uint32_t kLayerWritable = 1;

struct ViewRecord {
  uint8_t name[32];  // NUL-padded
  le32 flags;        // kViewDefault
  le32 count;        // layers that follow, 1..32
};
static_assert(sizeof(ViewRecord) == 40);

struct ViewLayerRecord {
  le64 tree;   // a filesystem tree (branch)
  le32 flags;  // kLayerWritable
  le32 reserved;
};
static_assert(sizeof(ViewLayerRecord) == 16);
}  // namespace disk

namespace {

Result<std::optional<TreeId>> find_catalog(Volume::Txn& t) {
  for (const auto& ti : PLY_TRY(t.list_trees())) {
    if (ti.kind != kKindPlain) continue;
    auto h = PLY_TRY(t.get(ti.id, Key{disk::kCatalogHeader, 0}));
    if (h && h->size() == sizeof(disk::CatalogHeader) &&
        view_as<disk::CatalogHeader>(std::span<const std::byte>(*h))->magic.get() == disk::kCatalogMagic)
      return std::optional<TreeId>(ti.id);
  }
  return std::optional<TreeId>{};
}

Result<View> decode_view(std::span<const std::byte> v) {
  auto bad = [] { return Error::corrupt(Error::kNoBlock, "malformed view record in the catalog"); };
  if (v.size() < sizeof(disk::ViewRecord)) return bad();
  const auto* r = view_as<disk::ViewRecord>(v);
  const uint32_t n = r->count.get();
  if (n == 0 || n > kMaxViewLayers || v.size() != sizeof(disk::ViewRecord) + n * sizeof(disk::ViewLayerRecord))
    return bad();
  View out;
  out.name.assign(reinterpret_cast<const char*>(r->name), strnlen(reinterpret_cast<const char*>(r->name), 32));
  out.is_default = r->flags.get() & disk::kViewDefault;
  for (uint32_t i = 0; i < n; i++) {
    const auto* l = view_as<disk::ViewLayerRecord>(v, sizeof(disk::ViewRecord) + i * sizeof(disk::ViewLayerRecord));
    out.layers.push_back({TreeId{l->tree.get()}, bool(l->flags.get() & disk::kLayerWritable)});
  }
  return out;
}

std::vector<std::byte> encode_view(const View& view) {
  std::vector<std::byte> v(sizeof(disk::ViewRecord) + view.layers.size() * sizeof(disk::ViewLayerRecord));
  auto* r = view_as<disk::ViewRecord>(std::span(v));
  std::memcpy(r->name, view.name.data(), view.name.size());
  r->flags.set(view.is_default ? disk::kViewDefault : 0);
  r->count.set(uint32_t(view.layers.size()));
  for (size_t i = 0; i < view.layers.size(); i++) {
    auto* l = view_as<disk::ViewLayerRecord>(std::span(v), sizeof(disk::ViewRecord) + i * sizeof(disk::ViewLayerRecord));
    l->tree.set(view.layers[i].tree.v);
    l->flags.set(view.layers[i].writable ? disk::kLayerWritable : 0);
    l->reserved.set(0);
  }
  return v;
}

// Every view with its key, in id order.
Result<std::vector<std::pair<uint64_t, View>>> read_views(Volume::Txn& t, TreeId cat) {
  std::vector<std::pair<uint64_t, View>> out;
  std::optional<Error> err;
  PLY_CHECK(t.scan(cat, Key{disk::kCatalogView, 0}, Key{disk::kCatalogView, ~0ull},
                   [&](Key k, std::span<const std::byte> v) {
                     auto view = decode_view(v);
                     if (!view) {
                       err = view.error();
                       return false;
                     }
                     out.emplace_back(k.lo, std::move(*view));
                     return true;
                   }));
  if (err) return *err;
  return out;
}

}  // namespace

Result<std::vector<View>> list_views(Volume& v) {
  auto t = PLY_TRY(v.begin());
  return list_views(t);
}

Result<void> rewrite_views(Volume::Txn& t, const std::function<bool(View&)>& fn) {
  auto cat = PLY_TRY(find_catalog(t));
  if (!cat) return ok();
  for (auto& [k, view] : PLY_TRY(read_views(t, *cat))) {
    if (!fn(view)) continue;
    if (view.layers.empty()) (void)PLY_TRY(t.erase(*cat, Key{disk::kCatalogView, k}));
    else PLY_CHECK(t.put(*cat, Key{disk::kCatalogView, k}, encode_view(view)));
  }
  return ok();
}

Result<std::vector<View>> list_views(Volume::Txn& t) {
  auto cat = PLY_TRY(find_catalog(t));
  std::vector<View> out;
  if (!cat) return out;
  for (auto& [id, view] : PLY_TRY(read_views(t, *cat))) out.push_back(std::move(view));
  return out;
}

Result<void> check_stack(Volume& v, const std::vector<ViewLayer>& s) {
  if (s.empty()) return Error::invalid("a view needs at least one branch");
  if (s.size() > kMaxViewLayers) return Error::invalid("a view holds at most 32 branches");
  auto bs = PLY_TRY(Filesystem::branches(v));
  for (size_t i = 0; i < s.size(); i++) {
    auto it = std::find_if(bs.begin(), bs.end(), [&](auto& b) { return b.tree == s[i].tree; });
    if (it == bs.end() || it->doomed)
      return Error::io(ENOENT, "no branch with tree id " + std::to_string(s[i].tree.v));
    if (s[i].writable && it->read_only)
      return Error::io(EROFS, "branch \"" + it->name + "\" is read-only and cannot be writable in a view");
    for (size_t j = 0; j < i; j++)
      if (s[j].tree == s[i].tree) return Error::invalid("branch \"" + it->name + "\" is in the stack twice");
  }
  return ok();
}

Result<void> put_view(Volume& v, const View& view) {
  // A new view's name follows the rule; an old image's view keeps its own.
  const auto views = PLY_TRY(list_views(v));
  if (std::none_of(views.begin(), views.end(), [&](const View& w) { return w.name == view.name; }))
    PLY_CHECK(check_branch_name(view.name, "view"));
  PLY_CHECK(check_stack(v, view.layers));
  if (encode_view(view).size() > BTree::max_value_len(v.block_size()))
    return Error::invalid("too many branches for one view");
  auto t = PLY_TRY(v.begin({.reserve_blocks = 64}));
  return put_view(t, view);
}

Result<void> put_view(Volume::Txn& t, const View& view) {
  auto enc = encode_view(view);
  auto cat = PLY_TRY(find_catalog(t));
  if (!cat) {
    cat = PLY_TRY(t.create_tree(kKindPlain));
    disk::CatalogHeader h{};
    h.magic.set(disk::kCatalogMagic);
    h.version.set(disk::kCatalogVersion);
    PLY_CHECK(t.put(*cat, Key{disk::kCatalogHeader, 0},
                    std::span(reinterpret_cast<const std::byte*>(&h), sizeof h)));
  }
  auto views = PLY_TRY(read_views(t, *cat));
  uint64_t id = 1;
  for (auto& [k, old] : views) {
    if (old.name == view.name) id = k;
    else if (id <= k) id = k + 1;
    if (view.is_default && old.is_default && old.name != view.name) {
      old.is_default = false;
      PLY_CHECK(t.put(*cat, Key{disk::kCatalogView, k}, encode_view(old)));
    }
  }
  for (auto& [k, old] : views)
    if (old.name == view.name) id = k;
  return t.put(*cat, Key{disk::kCatalogView, id}, enc);
}

// --- placement rules (format.md#placement-rules) ------------------------------

namespace {
// Every rule item of the catalog with what is wrong with it ("" when
// nothing): U6 (format.md#placement-rules).
Result<std::vector<std::pair<uint64_t, std::string>>> rule_problems(Volume::Txn& t, TreeId cat,
                                                                   const std::vector<std::string>& classes) {
  std::vector<std::pair<uint64_t, std::string>> out;
  size_t n = 0;
  PLY_CHECK(t.scan(cat, Key{disk::kCatalogRule, 0}, Key{disk::kCatalogRule, ~0ull},
                   [&](Key k, std::span<const std::byte> v) {
                     std::string why;
                     auto r = parse_rule(std::string_view(reinterpret_cast<const char*>(v.data()), v.size()));
                     if (!r) why = "does not parse: " + r.error().message();
                     else if (auto c = PlacementPolicy::compile({*r}, classes); !c) why = c.error().message();
                     else if (++n > kMaxPlacementRules) why = "is past the most rules a volume has";
                     out.emplace_back(k.lo, why);
                     return true;
                   }));
  return out;
}
}  // namespace

Result<std::vector<PlacementRule>> list_placement_rules(Volume::Txn& t) {
  std::vector<PlacementRule> out;
  auto cat = PLY_TRY(find_catalog(t));
  if (!cat) return out;
  std::optional<Error> err;
  PLY_CHECK(t.scan(*cat, Key{disk::kCatalogRule, 0}, Key{disk::kCatalogRule, ~0ull},
                   [&](Key k, std::span<const std::byte> v) {
                     auto r = parse_rule(std::string_view(reinterpret_cast<const char*>(v.data()), v.size()));
                     if (!r) {
                       err = Error::corrupt(Error::kNoBlock, "placement rule " + std::to_string(k.lo) +
                                                                 " of the catalog does not parse: " +
                                                                 r.error().message());
                       return false;
                     }
                     out.push_back(std::move(*r));
                     return true;
                   }));
  if (err) return *err;
  return out;
}

Result<std::vector<PlacementRule>> list_placement_rules(Volume& v) {
  auto t = PLY_TRY(v.begin());
  return list_placement_rules(t);
}

Result<void> set_placement_rules(Volume& v, std::vector<PlacementRule> rules) {
  auto compiled = PLY_TRY(PlacementPolicy::compile(rules, v.super().classes));
  {
    auto t = PLY_TRY(v.begin({.reserve_blocks = 64 + 2 * rules.size()}));
    auto cat = PLY_TRY(find_catalog(t));
    if (!cat && rules.empty()) return ok();
    if (!cat) {
      cat = PLY_TRY(t.create_tree(kKindPlain));
      disk::CatalogHeader h{};
      h.magic.set(disk::kCatalogMagic);
      h.version.set(disk::kCatalogVersion);
      PLY_CHECK(t.put(*cat, Key{disk::kCatalogHeader, 0}, std::span(reinterpret_cast<const std::byte*>(&h), sizeof h)));
    }
    std::vector<uint64_t> old;
    PLY_CHECK(t.scan(*cat, Key{disk::kCatalogRule, 0}, Key{disk::kCatalogRule, ~0ull},
                     [&](Key k, std::span<const std::byte>) {
                       old.push_back(k.lo);
                       return true;
                     }));
    for (uint64_t k : old) (void)PLY_TRY(t.erase(*cat, Key{disk::kCatalogRule, k}));
    for (size_t i = 0; i < rules.size(); i++) {
      const std::string text = format_rule(rules[i]);
      PLY_CHECK(t.put(*cat, Key{disk::kCatalogRule, i + 1},
                      std::span(reinterpret_cast<const std::byte*>(text.data()), text.size())));
    }
  }
  v.extension<PolicyState>().set(std::make_shared<const PlacementPolicy>(std::move(compiled)));
  return ok();
}

Result<void> load_placement_rules(Volume& v) {
  if (v.super().classes.empty()) return ok();
  auto rules = PLY_TRY(list_placement_rules(v));
  auto compiled = PLY_TRY(PlacementPolicy::compile(std::move(rules), v.super().classes));
  v.extension<PolicyState>().set(std::make_shared<const PlacementPolicy>(std::move(compiled)));
  return ok();
}

Result<void> delete_view(Volume& v, std::string_view name) {
  auto t = PLY_TRY(v.begin({.for_delete = true, .reserve_blocks = 32}));
  auto cat = PLY_TRY(find_catalog(t));
  if (cat)
    for (auto& [k, view] : PLY_TRY(read_views(t, *cat)))
      if (view.name == name) {
        (void)PLY_TRY(t.erase(*cat, Key{disk::kCatalogView, k}));
        return ok();
      }
  return Error::io(ENOENT, "no view named \"" + std::string(name) + "\"");
}

Result<BranchMeta> find_branch(Volume& v, std::string_view name) {
  // By name through the filesystem layer's index (O(1) with any number of
  // snapshots), else a tree id written as a number.
  if (auto b = PLY_TRY(Filesystem::find(v, name))) return *b;
  char* end = nullptr;
  std::string s(name);
  unsigned long long id = std::strtoull(s.c_str(), &end, 10);
  if (!s.empty() && end && *end == '\0' && s[0] != '-')
    if (auto b = Filesystem::branch(v, TreeId{id}); b && !b->doomed) return *b;
  return Error::io(ENOENT, "no branch named \"" + s + "\"");
}

Result<std::vector<ViewLayer>> parse_stack(Volume& v, std::string_view spec) {
  std::vector<ViewLayer> out;
  size_t p = 0;
  while (p <= spec.size()) {
    size_t q = spec.find(':', p);
    if (q == std::string_view::npos) q = spec.size();
    std::string_view item = spec.substr(p, q - p);
    if (item.empty()) return Error::invalid("empty branch in \"" + std::string(spec) + "\"");
    bool writable = out.empty();
    if (auto eq = item.rfind('='); eq != std::string_view::npos) {
      auto mode = item.substr(eq + 1);
      if (mode == "rw") writable = true;
      else if (mode == "ro") writable = false;
      else return Error::invalid("branch mode must be rw or ro, not \"" + std::string(mode) + "\"");
      item = item.substr(0, eq);
    }
    auto b = PLY_TRY(find_branch(v, item));
    out.push_back({b.tree, writable});
    p = q + 1;
  }
  PLY_CHECK(check_stack(v, out));
  return out;
}

Result<std::vector<ViewLayer>> view_stack(Volume& v, std::string_view name) {
  for (auto& view : PLY_TRY(list_views(v)))
    if (view.name == name) return view.layers;
  return Error::io(ENOENT, "no view named \"" + std::string(name) + "\"");
}

Result<std::vector<ViewLayer>> default_stack(Volume& v) {
  for (auto& view : PLY_TRY(list_views(v)))
    if (view.is_default) return view.layers;
  TreeId t = PLY_TRY(Filesystem::default_tree(v));
  auto b = PLY_TRY(Filesystem::branch(v, t));
  return std::vector<ViewLayer>{{t, !b.read_only}};
}

Result<bool> is_layer(Volume& v, const BranchMeta& b) {
  if (!b.parent.v) return false;
  // A clone's tree records the tree it was cloned from (format.md#root-record).
  auto txn = PLY_TRY(v.begin({}));
  TreeInfo t = PLY_TRY(txn.tree_info(b.tree));
  return t.cloned_from != b.parent;
}

Result<std::vector<ViewLayer>> layer_stack(Volume& v, std::string_view name) {
  BranchMeta b = PLY_TRY(find_branch(v, name));
  std::vector<ViewLayer> s{{b.tree, !b.read_only}};
  while (PLY_TRY(is_layer(v, b))) {
    if (s.size() >= kMaxViewLayers)
      return Error::invalid("layer \"" + std::string(name) + "\" has more than " +
                            std::to_string(kMaxViewLayers) + " ancestors");
    b = PLY_TRY(Filesystem::branch(v, b.parent));
    s.push_back({b.tree, false});
  }
  return s;
}

Result<void> check_branch_name(std::string_view name, std::string_view what) {
  // The name is shown escaped: it may hold the very characters refused.
  auto bad = [&](int code, const std::string& why) {
    std::string m = "invalid ";
    m += what;
    m += " name \"";
    m += shown(name);
    m += "\": ";
    m += why;
    m += " (see NAMES in plyctl(8))";
    return Error::io(code, m);
  };
  if (name.empty()) return bad(EINVAL, "a name has 1 to 32 bytes");
  if (name.size() > kMaxNameBytes) return bad(ENAMETOOLONG, "a name has 1 to 32 bytes, not " + std::to_string(name.size()));
  if (!valid_utf8(name)) return bad(EINVAL, "a name is UTF-8 text");
  if (name == "." || name == "..") return bad(EINVAL, "a name is not . or ..");
  if (name.front() == '-') return bad(EINVAL, "a name does not start with - (it would read as an option)");
  if (name.front() == ' ' || name.back() == ' ') return bad(EINVAL, "a name does not start or end with a space");
  std::string why;
  for_each_char(name, [&](long cp, std::string_view) {
    if (!why.empty()) return;
    if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f)) why = "a name holds no control character";
    else if (kNameForbidden.find(char(cp)) != std::string_view::npos && cp < 0x80)
      why = std::string("a name holds none of / \\ : = , ('") + char(cp) + "' is used by paths, stacks or option lists)";
  });
  if (!why.empty()) return bad(EINVAL, why);
  return ok();
}

namespace {
// Whether a live branch other than `except` has the name (doomed trees have none).
Result<bool> name_taken(Volume::Txn& t, std::string_view name, TreeId except = TreeId{0}) {
  for (const auto& b : PLY_TRY(Filesystem::branches(t)))
    if (!b.doomed && b.name == name && b.tree != except) return true;
  return false;
}
}  // namespace

Result<BranchMeta> create_layer(Volume& v, std::string_view name, TreeId parent, bool read_only) {
  PLY_CHECK(check_branch_name(name));
  FsCreateOptions fo;
  fo.name = std::string(name);
  fo.parent = parent;
  fo.read_only = read_only;
  {
    // A reader: a mount may hold the parent open with files pinned.
    auto pfs = PLY_TRY(Filesystem::open(v, parent, true));
    Attr ra = PLY_TRY(pfs->getattr(pfs->root()));
    fo.root_mode = ra.mode & 07777, fo.uid = ra.uid, fo.gid = ra.gid;
  }
  auto t = PLY_TRY(v.begin({.reserve_blocks = Filesystem::kCreateBlocks}));
  if (PLY_TRY(Filesystem::branch(t, parent)).doomed) return Error::io(ENOENT, "the parent is being dropped");
  if (PLY_TRY(name_taken(t, name))) return Error::io(EEXIST, "a branch named \"" + fo.name + "\" exists");
  TreeId id = PLY_TRY(Filesystem::create(t, fo));
  return Filesystem::branch(t, id);
}

Result<BranchMeta> create_branch(Volume& v, std::string_view name, bool read_only) {
  PLY_CHECK(check_branch_name(name));
  FsCreateOptions fo;
  fo.name = std::string(name);
  fo.read_only = read_only;
  auto t = PLY_TRY(v.begin({.reserve_blocks = Filesystem::kCreateBlocks}));
  if (PLY_TRY(name_taken(t, name))) return Error::io(EEXIST, "a branch named \"" + shown(name) + "\" exists");
  TreeId id = PLY_TRY(Filesystem::create(t, fo));
  return Filesystem::branch(t, id);
}

Result<BranchMeta> rename_branch(Volume& v, TreeId tree, std::string_view name) {
  PLY_CHECK(check_branch_name(name));
  auto t = PLY_TRY(v.begin({.reserve_blocks = Filesystem::kSetBranchBlocks}));
  BranchMeta b = PLY_TRY(Filesystem::branch(t, tree));
  if (b.doomed) return Error::io(ENOENT, "no such branch");
  if (b.name == name) return b;
  if (PLY_TRY(name_taken(t, name, tree))) return Error::io(EEXIST, "a branch named \"" + std::string(name) + "\" exists");
  b.name = std::string(name);
  PLY_CHECK(Filesystem::set_branch(t, b));
  return b;
}

std::vector<Problem> check_views(Volume& v) {
  std::vector<Problem> out;
  // repair_views can mend every problem but an unreadable catalog.
  auto problem = [&](const std::string& what) {
    out.push_back(Problem{"U4-view", Error::kNoBlock, what, 0, Problem::Repair::Lossy});
  };
  auto views = list_views(v);
  if (!views) {
    out.push_back(Problem{"U4-view", Error::kNoBlock, "the catalog does not read back: " + views.error().message(), 0,
                          views.error().is_corruption() ? Problem::Repair::Lossy : Problem::Repair::None});
    return out;
  }
  size_t defaults = 0;
  for (const auto& view : *views) {
    defaults += view.is_default;
    if (view.layers.empty() || view.layers.size() > kMaxViewLayers)
      problem("view \"" + view.name + "\" has " + std::to_string(view.layers.size()) + " layers");
    std::set<uint64_t> seen;
    for (const auto& l : view.layers) {
      auto b = Filesystem::branch(v, l.tree);
      if (!b) {
        problem("view \"" + view.name + "\" names tree " + std::to_string(l.tree.v) + ", which is no branch");
        continue;
      }
      if (b->doomed)
        problem("view \"" + view.name + "\" shows tree " + std::to_string(l.tree.v) +
                ", which an unfinished merge or rollback doomed");
      if (!seen.insert(l.tree.v).second)
        problem("view \"" + view.name + "\" names branch \"" + b->name + "\" twice");
      if (l.writable && b->read_only)
        problem("view \"" + view.name + "\" writes to read-only branch \"" + b->name + "\"");
    }
  }
  if (defaults > 1) problem(std::to_string(defaults) + " views are the default");
  // U6: every placement rule parses and names classes the volume has.
  auto t = v.begin();
  if (!t) return out;
  auto cat = find_catalog(*t);
  if (!cat || !*cat) return out;
  auto rp = rule_problems(*t, **cat, v.super().classes);
  if (!rp) {
    out.push_back(Problem{"U6-rule", Error::kNoBlock, "the placement rules do not read back: " + rp.error().message(), 0});
    return out;
  }
  for (const auto& [rank, why] : *rp)
    if (!why.empty())
      out.push_back(Problem{"U6-rule", Error::kNoBlock, "placement rule " + std::to_string(rank) + " " + why, 0,
                            Problem::Repair::Lossy});
  return out;
}

Result<std::vector<std::string>> repair_views(Volume& v) {
  std::vector<std::string> done;
  {
    // View records that do not decode go: the views they held are lost,
    // the others stay.
    auto t = PLY_TRY(v.begin({.reserve_blocks = 4 * kViewBlocks}));
    if (auto cat = PLY_TRY(find_catalog(t))) {
      std::vector<Key> bad;
      PLY_CHECK(t.scan(*cat, Key{disk::kCatalogView, 0}, Key{disk::kCatalogView, ~0ull},
                       [&](Key k, std::span<const std::byte> val) {
                         if (!decode_view(val)) bad.push_back(k);
                         return true;
                       }));
      for (Key k : bad) {
        (void)PLY_TRY(t.erase(*cat, k));
        done.push_back("removed view record " + std::to_string(k.lo) + ", which did not decode");
      }
      // Placement rules that do not parse or name a class the volume lacks
      // go (U6): the others keep their ranks and order.
      for (const auto& [rank, why] : PLY_TRY(rule_problems(t, *cat, v.super().classes)))
        if (!why.empty()) {
          (void)PLY_TRY(t.erase(*cat, Key{disk::kCatalogRule, rank}));
          done.push_back("removed placement rule " + std::to_string(rank) + ", which " + why);
        }
    }
  }
  auto views = list_views(v);
  if (!views || views->empty()) return done;  // no catalog, or one that cannot be read
  auto t = PLY_TRY(v.begin({.reserve_blocks = kViewBlocks * (views->size() + 1)}));
  bool seen_default = false;
  PLY_CHECK(rewrite_views(t, [&](View& view) {
    bool changed = false;
    std::set<uint64_t> seen;
    std::vector<ViewLayer> keep;
    for (ViewLayer l : view.layers) {
      auto b = Filesystem::branch(t, l.tree);
      if (!b || b->doomed || !seen.insert(l.tree.v).second || keep.size() == kMaxViewLayers) {
        done.push_back("view \"" + view.name + "\": removed tree " + std::to_string(l.tree.v));
        changed = true;
        continue;
      }
      if (l.writable && b->read_only) {
        l.writable = false;
        done.push_back("view \"" + view.name + "\": shows read-only branch \"" + b->name + "\" read-only");
        changed = true;
      }
      keep.push_back(l);
    }
    if (view.is_default && seen_default) {
      view.is_default = false;
      done.push_back("view \"" + view.name + "\" is no longer a default view");
      changed = true;
    }
    seen_default |= view.is_default;
    if (keep.empty()) done.push_back("view \"" + view.name + "\" showed no branch left: deleted");
    view.layers = std::move(keep);
    return changed;
  }));
  return done;
}

namespace {

// The filesystem checks fed by fsck's walk, then the views (pass 6).
class FedWithViews : public ObjectChecker {
 public:
  FedWithViews(BlockDevice& d, std::unique_ptr<ObjectChecker> fs) : d_(d), fs_(std::move(fs)) {}
  bool begin_tree(const TreeInfo& t) override { return fs_->begin_tree(t); }
  void item(Key k, std::span<const std::byte> v) override { fs_->item(k, v); }
  void end_tree(bool complete) override { fs_->end_tree(complete); }
  std::vector<Problem> finish() override {
    auto ps = fs_->finish();
    auto vs = check_views(d_);
    ps.insert(ps.end(), vs.begin(), vs.end());
    auto ns = check_names(d_);  // U5, name_check.h
    ps.insert(ps.end(), ns.begin(), ns.end());
    return ps;
  }

 private:
  BlockDevice& d_;
  std::unique_ptr<ObjectChecker> fs_;
};

}  // namespace

void set_object_passes(FsckOptions& fo, bool data) {
  fo.kinds = fs_kinds();
  fo.object_feed = [data](BlockDevice& d) -> std::unique_ptr<ObjectChecker> {
    auto fs = feed_filesystems(d, data);
    if (!fs) return nullptr;  // object_checks reports why
    return std::make_unique<FedWithViews>(d, std::move(fs));
  };
  fo.object_checks = [data](BlockDevice& d) {
    auto vol = open_to_check(d);
    if (!vol) return std::vector<Problem>{Problem{"F-item", Error::kNoBlock, "cannot open: " + vol.error().message(), 0}};
    auto ps = check_filesystems(**vol, data);
    auto vs = check_views(**vol);
    ps.insert(ps.end(), vs.begin(), vs.end());
    auto ns = check_names(**vol);
    ps.insert(ps.end(), ns.begin(), ns.end());
    return ps;
  };
  // One generation for both layers: a crash during the repair leaves the
  // image as it was (fsck.h R1).
  fo.object_repair = [data](BlockDevice& d, bool lossy) -> Result<FsckOptions::ObjectRepair> {
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    vo.movers = fs_movers();
    vo.cache_bytes = 256ull << 20;
    auto vol = PLY_TRY(Volume::open(d, vo));
    FsckOptions::ObjectRepair r;
    r.actions = PLY_TRY(repair_filesystems(*vol, lossy, data));
    if (lossy) {
      for (auto& a : PLY_TRY(repair_views(*vol))) r.actions.push_back(std::move(a));
      for (auto& a : PLY_TRY(repair_names(*vol))) r.actions.push_back(std::move(a));
    }
    r.written = PLY_TRY(vol->commit());
    return r;
  };
}

std::vector<Problem> check_views(BlockDevice& dev) {
  auto vol = open_to_check(dev);
  if (!vol) return {Problem{"U4-view", Error::kNoBlock, "cannot open: " + vol.error().message(), 0}};
  return check_views(**vol);
}

Result<OpenUnion> open_union(Volume& v, const std::vector<ViewLayer>& stack, bool reader, bool read_only) {
  OpenUnion o;
  std::vector<UnionBranch> br;
  for (const auto& l : stack) {
    o.fs.push_back(PLY_TRY(Filesystem::open(v, l.tree, reader)));
    br.push_back(UnionBranch{o.fs.back().get(), l.writable && !read_only});
  }
  o.u = std::make_unique<Union>(std::move(br));
  return o;
}

std::string format_stack(Volume& v, const std::vector<ViewLayer>& s) {
  std::string out;
  for (const auto& l : s) {
    if (!out.empty()) out += ':';
    auto b = Filesystem::branch(v, l.tree);
    out += b ? shown(b->name) : std::to_string(l.tree.v);
    out += l.writable ? "=rw" : "=ro";
  }
  return out;
}

}  // namespace plyfs
