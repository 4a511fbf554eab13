#include "util/memory.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "util/mountinfo.h"

namespace plyfs {

Memory read_meminfo(const char* path) {
  Memory m;
  FILE* f = std::fopen(path, "re");
  if (!f) return m;
  char line[256];
  bool total = false, avail = false;
  while (std::fgets(line, sizeof line, f) && !(total && avail)) {
    unsigned long long kb = 0;
    if (std::sscanf(line, "MemTotal: %llu kB", &kb) == 1) m.total = kb << 10, total = true;
    else if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) m.available = kb << 10, avail = true;
  }
  std::fclose(f);
  if (!total || !avail) m = Memory{};
  return m;
}

namespace {

// v1 writes "no limit" as the largest page-aligned signed number
// (9223372036854771712), v2 as "max"; anything past 2^62 is no limit.
constexpr uint64_t kNoLimit = 1ull << 62;

// The first number of a file, nullopt if it has none ("max", or missing).
std::optional<uint64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  unsigned long long v = 0;
  if (!(in >> v)) return std::nullopt;
  return uint64_t(v);
}

// A key's value in memory.stat ("inactive_file 1234").
std::optional<uint64_t> stat_value(const std::string& path, std::string_view key) {
  std::ifstream in(path);
  std::string k;
  unsigned long long v;
  while (in >> k >> v)
    if (k == key) return uint64_t(v);
  return std::nullopt;
}

bool has_token(std::string_view list, std::string_view tok) {
  while (!list.empty()) {
    const size_t c = list.find(',');
    if (list.substr(0, c) == tok) return true;
    if (c == std::string_view::npos) break;
    list.remove_prefix(c + 1);
  }
  return false;
}

struct Hierarchy {
  bool v2;
  std::string dir;   // the process's cgroup, a directory under `top`
  std::string top;   // the hierarchy's mount point
};

// One level: its limit and what is left under it, if it has a limit.
std::optional<Memory> level(const Hierarchy& h, const std::string& dir) {
  std::optional<uint64_t> limit, usage, inactive;
  if (h.v2) {
    limit = read_number(dir + "/memory.max");
    if (auto high = read_number(dir + "/memory.high"); high && (!limit || *high < *limit)) limit = high;
    usage = read_number(dir + "/memory.current");
    inactive = stat_value(dir + "/memory.stat", "inactive_file");
  } else {
    limit = read_number(dir + "/memory.limit_in_bytes");
    usage = read_number(dir + "/memory.usage_in_bytes");
    inactive = stat_value(dir + "/memory.stat", "total_inactive_file");
    if (!inactive) inactive = stat_value(dir + "/memory.stat", "inactive_file");
  }
  if (!limit || *limit >= kNoLimit || !usage) return std::nullopt;
  const uint64_t used = *usage - std::min(*usage, inactive.value_or(0));
  return Memory{*limit, *limit - std::min(*limit, used)};
}

}  // namespace

std::optional<Memory> read_cgroup_memory(const char* self_cgroup, const char* mountinfo) {
  // cgroup(7): "ID:CONTROLLERS:PATH", v2's line "0::PATH".
  std::vector<Hierarchy> found;
  const auto mounts = read_mountinfo(mountinfo);
  std::ifstream in(self_cgroup);
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string ctl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const bool v2 = line.compare(0, a, "0") == 0 && ctl.empty();
    if (!v2 && !has_token(ctl, "memory")) continue;
    for (const MountEntry& m : mounts) {
      if (v2 ? m.fstype != "cgroup2" : m.fstype != "cgroup" || !has_token(m.options, "memory")) continue;
      // A mount of a subtree (a container's) has that subtree as its root;
      // with a cgroup namespace the path is relative to it already.
      std::string rel = path;
      if (m.root != "/" && rel.compare(0, m.root.size(), m.root) == 0 &&
          (rel.size() == m.root.size() || rel[m.root.size()] == '/'))
        rel = rel.substr(m.root.size());
      if (rel.find("/..") != std::string::npos) continue;
      std::string top = m.mountpoint == "/" ? "" : m.mountpoint;
      found.push_back({v2, top + (rel == "/" ? "" : rel), top});
    }
  }
  std::optional<Memory> out;
  for (const Hierarchy& h : found) {
    // From the process's cgroup up to the hierarchy's root, each level.
    for (std::string dir = h.dir;;) {
      if (auto l = level(h, dir.empty() ? "/" : dir)) {
        if (!out) out = l;
        out->total = std::min(out->total, l->total);
        out->available = std::min(out->available, l->available);
      }
      if (dir.size() <= h.top.size()) break;
      const size_t slash = dir.rfind('/');
      if (slash == std::string::npos || slash < h.top.size()) break;
      dir.resize(slash);
    }
  }
  return out;
}

Memory memory_now() {
  Memory m = read_meminfo();
  if (auto c = read_cgroup_memory()) {
    if (m.total == 0) return *c;
    m.total = std::min(m.total, c->total);
    m.available = std::min(m.available, c->available);
  }
  return m;
}

}  // namespace plyfs
