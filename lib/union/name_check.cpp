// U5: branch and view names against the name rule (name_check.h,
// format.md#catalog). The rule itself is check_branch_name's (view.cpp):
// this file only asks it, so that fsck follows the rule wherever it is
// tightened.
#include "union/name_check.h"

#include <cstdio>
#include <set>

#include "fs/check.h"
#include "fs/fs.h"
#include "union/view.h"

namespace plyfs {

std::string printable_name(std::string_view name) {
  std::string out;
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

namespace {

bool valid(std::string_view name) { return bool(check_branch_name(name)); }

// A byte the rule refuses wherever it stands (tried between two letters,
// so that a rule on whole names, such as ".." or a length, does not count).
bool refused_byte(char c) {
  const char s[3] = {'a', c, 'a'};
  return !valid(std::string_view(s, 3));
}

// The name with its refused bytes replaced by '_': the ASCII ones first
// (a rule on byte sequences, such as UTF-8, may accept the others
// together), then every refused one.
std::string replace_refused(std::string_view name) {
  std::string ascii(name), all(name);
  for (size_t i = 0; i < name.size(); i++)
    if (refused_byte(name[i])) {
      all[i] = '_';
      if (static_cast<unsigned char>(name[i]) < 0x80) ascii[i] = '_';
    }
  return valid(ascii) ? ascii : all;
}

}  // namespace

std::string repaired_name(std::string_view name, const std::string& fallback, uint64_t id,
                          const std::function<bool(const std::string&)>& taken) {
  std::string n = replace_refused(name);
  if (!valid(n)) n = fallback;
  if (!taken(n)) return n;
  const std::string tail = "~" + std::to_string(id);
  if (tail.size() < 32) {
    std::string t = n.substr(0, 32 - tail.size());
    t += tail;
    if (valid(t) && !taken(t)) return t;
  }
  if (!taken(fallback)) return fallback;
  for (uint64_t i = 2;; i++) {
    std::string t = fallback.substr(0, 20);
    t += "." + std::to_string(i);
    if (!taken(t)) return t;
  }
}

std::vector<Problem> check_names(Volume& v) {
  std::vector<Problem> out;
  // Unreadable branches and catalogs are U3's and U4's.
  if (auto bs = Filesystem::branches(v))
    for (const auto& b : *bs) {
      if (b.doomed || b.name.empty()) continue;  // a doomed tree has no name; no name is U3
      if (auto r = check_branch_name(b.name); !r)
        out.push_back(Problem{"U5-name", Error::kNoBlock,
                              "branch \"" + printable_name(b.name) + "\" breaks the name rule: " + r.error().reason,
                              b.tree.v, Problem::Repair::Lossy});
    }
  if (auto views = list_views(v))
    for (const auto& view : *views)
      if (auto r = check_branch_name(view.name); !r)
        out.push_back(Problem{"U5-name", Error::kNoBlock,
                              "view \"" + printable_name(view.name) + "\" breaks the name rule: " + r.error().reason,
                              0, Problem::Repair::Lossy});
  return out;
}

std::vector<Problem> check_names(BlockDevice& dev) {
  auto vol = open_to_check(dev);
  if (!vol) return {};  // the other checks of the pass say why
  return check_names(**vol);
}

Result<std::vector<std::string>> repair_names(Volume& v) {
  std::vector<std::string> done;
  {
    auto bs = PLY_TRY(Filesystem::branches(v));
    std::set<std::string> names;
    for (const auto& b : bs)
      if (!b.doomed) names.insert(b.name);
    for (const auto& b : bs) {
      if (b.doomed || b.name.empty() || valid(b.name)) continue;
      const std::string n = repaired_name(b.name, "branch~" + std::to_string(b.tree.v), b.tree.v,
                                          [&](const std::string& s) { return names.count(s) > 0; });
      PLY_CHECK(rename_branch(v, b.tree, n));
      names.insert(n);
      done.push_back("renamed branch \"" + printable_name(b.name) + "\" (tree " + std::to_string(b.tree.v) +
                     ") to \"" + n + "\"");
    }
  }
  auto views = PLY_TRY(list_views(v));
  std::set<std::string> names;
  for (const auto& view : views) names.insert(view.name);
  auto t = PLY_TRY(v.begin({.reserve_blocks = kViewBlocks * (views.size() + 1)}));
  uint64_t nth = 0;
  PLY_CHECK(rewrite_views(t, [&](View& view) {
    nth++;
    if (valid(view.name)) return false;
    const std::string n = repaired_name(view.name, "view~" + std::to_string(nth), nth,
                                        [&](const std::string& s) { return names.count(s) > 0; });
    done.push_back("renamed view \"" + printable_name(view.name) + "\" to \"" + n + "\"");
    names.insert(n);
    view.name = n;
    return true;
  }));
  return done;
}

}  // namespace plyfs
