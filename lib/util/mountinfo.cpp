#include "util/mountinfo.h"

#include <fstream>

namespace plyfs {

std::string unescape_mountinfo(std::string_view f) {
  std::string o;
  for (size_t i = 0; i < f.size(); i++) {
    if (f[i] == '\\' && i + 3 < f.size() && f[i + 1] >= '0' && f[i + 1] <= '3' && f[i + 2] >= '0' &&
        f[i + 2] <= '7' && f[i + 3] >= '0' && f[i + 3] <= '7') {
      o += char((f[i + 1] - '0') * 64 + (f[i + 2] - '0') * 8 + (f[i + 3] - '0'));
      i += 3;
    } else {
      o += f[i];
    }
  }
  return o;
}

std::optional<MountEntry> parse_mountinfo_line(std::string_view line) {
  // The kernel separates fields by one space and escapes spaces inside them,
  // so splitting at spaces is exact.
  std::vector<std::string_view> f;
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  // An empty field (a source the kernel prints as nothing) stays a field.
  for (size_t at = 0; at <= line.size();) {
    size_t sp = line.find(' ', at);
    if (sp == std::string_view::npos) sp = line.size();
    f.push_back(line.substr(at, sp - at));
    at = sp + 1;
  }
  size_t dash = 6;  // the optional fields start after OPTIONS, the sixth
  while (dash < f.size() && f[dash] != "-") dash++;
  if (f.size() < 6 || dash + 2 >= f.size()) return std::nullopt;
  MountEntry e;
  e.majmin = std::string(f[2]);
  e.root = unescape_mountinfo(f[3]);
  e.mountpoint = unescape_mountinfo(f[4]);
  e.fstype = unescape_mountinfo(f[dash + 1]);
  e.source = unescape_mountinfo(f[dash + 2]);
  if (dash + 3 < f.size()) e.options = unescape_mountinfo(f[dash + 3]);
  return e;
}

std::vector<MountEntry> read_mountinfo(const char* path) {
  std::vector<MountEntry> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (auto e = parse_mountinfo_line(line)) out.push_back(std::move(*e));
  return out;
}

}  // namespace plyfs
