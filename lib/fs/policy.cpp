// Placement rules: parsing, canonical text and evaluation (policy.h,
// format.md#placement-rules).
#include "fs/policy.h"

#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>

#include "util/parse.h"

namespace plyfs {

namespace {

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (char& ch : out)
    if (ch >= 'A' && ch <= 'Z') ch = char(ch - 'A' + 'a');
  return out;
}

std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  size_t a = 0;
  for (;;) {
    const size_t b = s.find(',', a);
    out.emplace_back(s.substr(a, b == std::string_view::npos ? std::string_view::npos : b - a));
    if (b == std::string_view::npos) break;
    a = b + 1;
  }
  return out;
}

// Sizes print back in the largest binary unit that divides them, so that
// "size<1M" lists as written.
std::string size_text(uint64_t n) {
  static constexpr const char* kUnits[] = {"", "K", "M", "G", "T", "P"};
  size_t u = 0;
  while (u + 1 < std::size(kUnits) && n >= 1024 && n % 1024 == 0) {
    n /= 1024;
    u++;
  }
  return std::to_string(n) + kUnits[u];
}

Error bad_rule(std::string_view tok, const std::string& why) {
  return Error::invalid("placement rule: '" + std::string(tok) + "': " + why);
}

}  // namespace

Result<PlacementRule> parse_rule(std::string_view text) {
  if (text.size() > kMaxRuleBytes)
    return Error::invalid("placement rule: longer than " + std::to_string(kMaxRuleBytes) + " bytes");
  PlacementRule r;
  bool have_to = false, have_below = false, have_min = false;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == '\t') {
      i++;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\t') j++;
    const std::string_view tok = text.substr(i, j - i);
    i = j;
    if (tok == "strict") {
      r.strict = true;
      continue;
    }
    if (tok.substr(0, 4) == "size") {
      std::string_view rest = tok.substr(4);
      std::string_view op;
      for (std::string_view o : {"<=", ">=", "<", ">"})
        if (rest.substr(0, o.size()) == o) {
          op = o;
          break;
        }
      if (op.empty()) return bad_rule(tok, "expected size<N, size<=N, size>N or size>=N");
      auto n = parse_size(rest.substr(op.size()), "size");
      if (!n) return bad_rule(tok, n.error().message());
      const bool upper = op[0] == '<';
      if (upper ? have_below : have_min) return bad_rule(tok, "a second bound on the same side");
      if (upper) {
        have_below = true;
        if (op == "<=" && *n == ~uint64_t{0}) return bad_rule(tok, "too large");
        r.size_below = op == "<=" ? *n + 1 : *n;
      } else {
        have_min = true;
        if (op == ">" && *n == ~uint64_t{0}) return bad_rule(tok, "no size is larger");
        r.size_min = op == ">" ? *n + 1 : *n;
      }
      continue;
    }
    const size_t eq = tok.find('=');
    if (eq == std::string_view::npos || eq == 0)
      return bad_rule(tok, "expected KEY=VALUE (name, ext, size, uid, gid, under, access, to, stage) or 'strict'");
    const std::string_view key = tok.substr(0, eq), val = tok.substr(eq + 1);
    if (val.empty()) return bad_rule(tok, "empty value");
    auto once = [&](bool seen) -> Result<void> {
      if (seen) return bad_rule(tok, "'" + std::string(key) + "' given twice");
      return ok();
    };
    if (key == "name") {
      PLY_CHECK(once(!r.name_glob.empty()));
      if (val.find('/') != std::string_view::npos) return bad_rule(tok, "a name has no '/' (use under=)");
      r.name_glob = val;
    } else if (key == "ext") {
      PLY_CHECK(once(!r.exts.empty()));
      for (auto& e : split_commas(val)) {
        if (e.empty() || e.find('/') != std::string::npos || e.find('.') != std::string::npos)
          return bad_rule(tok, "extensions are given without dots, separated by commas");
        r.exts.push_back(lower_ascii(e));
      }
    } else if (key == "uid" || key == "gid") {
      auto& f = key == "uid" ? r.uid : r.gid;
      PLY_CHECK(once(f.has_value()));
      auto n = parse_uint(val, key, 0, 0xffffffffu);
      if (!n) return bad_rule(tok, n.error().message());
      f = uint32_t(*n);
    } else if (key == "under") {
      PLY_CHECK(once(!r.under.empty()));
      if (val[0] != '/') return bad_rule(tok, "a directory is given from the root, as /dir");
      std::string u(val);
      while (u.size() > 1 && u.back() == '/') u.pop_back();
      if (u.find("//") != std::string::npos || u.find("/./") != std::string::npos ||
          u.find("/../") != std::string::npos || u.ends_with("/.") || u.ends_with("/.."))
        return bad_rule(tok, "the directory must be a plain path (no '.', '..' or '//')");
      r.under = u;
    } else if (key == "access") {
      PLY_CHECK(once(r.access != PlacementRule::Access::Any));
      if (val == "ro" || val == "read-only") r.access = PlacementRule::Access::ReadOnly;
      else if (val == "rw" || val == "written") r.access = PlacementRule::Access::Written;
      else return bad_rule(tok, "access is ro (no write permission) or rw");
    } else if (key == "to") {
      PLY_CHECK(once(have_to));
      have_to = true;
      for (auto& c : split_commas(val)) {
        if (c.empty()) return bad_rule(tok, "an empty class name");
        if (std::find(r.to.begin(), r.to.end(), c) != r.to.end()) return bad_rule(tok, "class '" + c + "' twice");
        r.to.push_back(c);
      }
      if (r.to.size() > 8) return bad_rule(tok, "at most 8 classes");
    } else if (key == "stage") {
      PLY_CHECK(once(!r.stage.empty()));
      if (val.find(',') != std::string_view::npos) return bad_rule(tok, "one class to stage on");
      r.stage = val;
    } else {
      return bad_rule(tok, "unknown key (name, ext, size, uid, gid, under, access, to, stage)");
    }
  }
  if (!have_to) return Error::invalid("placement rule: no 'to=CLASS[,CLASS...]': where do its files go?");
  // A staged write falls back to the rule's classes when the stage is full;
  // strict would have it fail instead, which is no staging.
  if (!r.stage.empty() && r.strict) return Error::invalid("placement rule: 'stage=' and 'strict' exclude each other");
  if (!r.stage.empty() && r.stage == r.to[0])
    return Error::invalid("placement rule: 'stage=" + r.stage + "' is the class its data goes to anyway");
  if (r.size_below && *r.size_below <= r.size_min)
    return Error::invalid("placement rule: its size bounds leave no size");
  return r;
}

std::string format_rule(const PlacementRule& r) {
  std::string out;
  auto add = [&](const std::string& s) {
    if (!out.empty()) out += ' ';
    out += s;
  };
  if (!r.name_glob.empty()) add("name=" + r.name_glob);
  if (!r.exts.empty()) {
    std::string e;
    for (const auto& x : r.exts) e += (e.empty() ? "" : ",") + x;
    add("ext=" + e);
  }
  if (r.size_min > 0) add("size>=" + size_text(r.size_min));
  if (r.size_below) add("size<" + size_text(*r.size_below));
  if (r.uid) add("uid=" + std::to_string(*r.uid));
  if (r.gid) add("gid=" + std::to_string(*r.gid));
  if (!r.under.empty()) add("under=" + r.under);
  if (r.access == PlacementRule::Access::ReadOnly) add("access=ro");
  if (r.access == PlacementRule::Access::Written) add("access=rw");
  std::string to;
  for (const auto& c : r.to) to += (to.empty() ? "" : ",") + c;
  add("to=" + to);
  if (!r.stage.empty()) add("stage=" + r.stage);
  if (r.strict) add("strict");
  return out;
}

Result<PlacementPolicy> PlacementPolicy::compile(std::vector<PlacementRule> rules,
                                                 const std::vector<std::string>& classes) {
  if (rules.size() > kMaxPlacementRules)
    return Error::invalid("at most " + std::to_string(kMaxPlacementRules) + " placement rules");
  if (!rules.empty() && classes.empty())
    return Error::io(EOPNOTSUPP, "placement rules need a volume of several devices (mkfs.plyfs --class)");
  PlacementPolicy p;
  for (size_t i = 0; i < rules.size(); i++) {
    Placement pl;
    pl.strict = rules[i].strict;
    if (rules[i].to.empty() || rules[i].to.size() > 8)
      return Error::invalid("rule " + std::to_string(i + 1) + " names no class or more than 8");
    auto class_id = [&](const std::string& c) -> Result<uint8_t> {
      auto it = std::find(classes.begin(), classes.end(), c);
      if (it == classes.end()) {
        std::string known;
        for (const auto& k : classes) known += (known.empty() ? "" : ", ") + k;
        return Error::invalid("rule " + std::to_string(i + 1) + " names class '" + c +
                              "', which the volume does not have (its classes: " + known + ")");
      }
      return uint8_t(it - classes.begin());
    };
    for (const auto& c : rules[i].to) pl.classes[pl.n++] = PLY_TRY(class_id(c));
    // A staged rule writes to its stage first, then its classes in order
    // (the stage left out there if the rule names it too).
    Placement st = pl;
    if (!rules[i].stage.empty()) {
      st.n = 0;
      st.classes[st.n++] = PLY_TRY(class_id(rules[i].stage));
      for (uint8_t k = 0; k < pl.n && st.n < 8; k++)  // a stage and 8 classes: the last in the default order
        if (pl.classes[k] != st.classes[0]) st.classes[st.n++] = pl.classes[k];
      p.stage_mask_ |= uint32_t{1} << st.classes[0];
    }
    p.staged_places_.push_back(st);
    p.places_.push_back(pl);
  }
  p.rules_ = std::move(rules);
  return p;
}

uint64_t PlacementPolicy::candidates(std::string_view path, uint32_t uid, uint32_t gid, uint32_t mode) const {
  const size_t slash = path.rfind('/');
  const std::string name(slash == std::string_view::npos ? path : path.substr(slash + 1));
  const size_t dot = name.rfind('.');
  // A leading dot starts a hidden name, not an extension (".bashrc").
  const std::string ext = dot == std::string::npos || dot == 0 ? std::string() : lower_ascii(name.substr(dot + 1));
  uint64_t out = 0;
  for (size_t i = 0; i < rules_.size(); i++) {
    const PlacementRule& r = rules_[i];
    if (r.uid && *r.uid != uid) continue;
    if (r.gid && *r.gid != gid) continue;
    if (r.access == PlacementRule::Access::ReadOnly && (mode & 0222)) continue;
    if (r.access == PlacementRule::Access::Written && !(mode & 0222)) continue;
    if (!r.exts.empty() && std::find(r.exts.begin(), r.exts.end(), ext) == r.exts.end()) continue;
    if (!r.name_glob.empty() && ::fnmatch(r.name_glob.c_str(), name.c_str(), FNM_PERIOD) != 0) continue;
    if (!r.under.empty() && r.under != "/") {
      if (path.size() <= r.under.size() || path.substr(0, r.under.size()) != r.under || path[r.under.size()] != '/')
        continue;
    }
    out |= uint64_t{1} << i;
  }
  return out;
}

int PlacementPolicy::choose(uint64_t cand, uint64_t size) const {
  for (size_t i = 0; i < rules_.size(); i++) {
    if (!(cand >> i & 1)) continue;
    const PlacementRule& r = rules_[i];
    if (size < r.size_min) continue;
    if (r.size_below && size >= *r.size_below) continue;
    return int(i);
  }
  return -1;
}

Placement PlacementPolicy::placement(int i) const {
  if (i < 0 || size_t(i) >= places_.size()) return Placement{};
  return places_[size_t(i)];
}

Placement PlacementPolicy::write_placement(int i) const {
  if (i < 0 || size_t(i) >= staged_places_.size()) return Placement{};
  return staged_places_[size_t(i)];
}

bool PlacementPolicy::staged(int i) const {
  return i >= 0 && size_t(i) < rules_.size() && !rules_[size_t(i)].stage.empty();
}

}  // namespace plyfs
