// What plyctl import, export, send and receive share (cmd_import.cpp,
// cmd_export.cpp, cmd_send.cpp):
// their argument parsing and the counts of entries their JSON objects
// report (plyctl.8; docs/plyctl.schema.json, Import and Export).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "output.h"

namespace plyfs::ctl {

// The arguments of import or export, parsed.
struct IoArgs {
  Parsed p;
  bool has(const char* o) const { return p.opt.count(o) > 0; }
  const std::string& pos(size_t i) const { return p.pos[i]; }
  // Option `name`, when given, through `parse_fn` (io.h's parse_format and
  // the like) into `out`; false after printing its usage error (exit `rc`).
  template <class T>
  bool value(const char* name, Result<T> (*parse_fn)(std::string_view), T& out, int& rc) const {
    if (!has(name)) return true;
    auto v = parse_fn(p.opt.at(name));
    if (!v) {
      rc = usage_error(v.error().message());
      return false;
    }
    out = *v;
    return true;
  }
};

// `args` with exactly `npos` positional arguments, or nullopt after
// printing the usage error (`usage` for a wrong count; exit `rc`).
inline std::optional<IoArgs> parse_io_args(const std::vector<std::string>& args, size_t npos, const char* usage,
                                           const std::set<std::string>& with_value,
                                           const std::set<std::string>& flags, int& rc) {
  auto p = parse(args, with_value, flags);
  if (!p) {
    rc = usage_error(p.error().message());
    return std::nullopt;
  }
  if (p->pos.size() != npos) {
    rc = usage_error(usage);
    return std::nullopt;
  }
  return IoArgs{std::move(*p)};
}

// The counts import (io::ImportStats) and export (io::ExportStats) both
// report, in the order of their JSON objects.
template <class Stats>
void put_counts(Json& j, const Stats& s) {
  j["entries"] = s.entries;
  j["files"] = s.files;
  j["directories"] = s.dirs;
  j["symlinks"] = s.symlinks;
  j["specials"] = s.specials;
  j["hardlinks"] = s.hardlinks;
  j["whiteouts"] = s.whiteouts;
  j["opaque"] = s.opaque;
}

// The output: stdout, or FILE written beside itself under a temporary name
// and renamed over FILE once whole, so that a failed export leaves no
// partial archive.
struct OutputFile {
  std::string path, tmp;
  int fd = -1;
  ~OutputFile() {
    if (!tmp.empty()) ::unlink(tmp.c_str());
    if (fd > 1) ::close(fd);
  }
  Result<void> open(const std::string& p) {
    path = p;
    if (p == "-") {
      fd = 1;
      return ok();
    }
    const size_t slash = p.rfind('/');
    std::string t = slash == std::string::npos ? "" : p.substr(0, slash + 1);
    t += ".";
    t += slash == std::string::npos ? p : p.substr(slash + 1);
    t += ".XXXXXX";
    fd = ::mkstemp(t.data());
    if (fd < 0) return Error::sys(errno, "cannot create " + p);
    tmp = t;
    const mode_t um = ::umask(0);
    ::umask(um);
    (void)::fchmod(fd, 0666 & ~um);
    return ok();
  }
  Result<void> commit() {
    if (fd == 1) return ok();
    if (::fsync(fd) != 0) return Error::sys(errno, "cannot write " + path);
    if (::rename(tmp.c_str(), path.c_str()) != 0) return Error::sys(errno, "cannot write " + path);
    tmp.clear();
    return ok();
  }
};

}  // namespace plyfs::ctl
