// What plyctl's parts share (plyctl.8): the error and usage exits, the
// argument parser, opening an image, and the commands main.cpp dispatches.
// Exit status: 0 success, 1 failure, 2 usage error.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "blockdev/blockdev.h"
#include "commit/volume.h"
#include "util/result.h"

namespace plyfs::ctl {

inline constexpr const char* kProg = "plyctl";

// "plyctl: MSG" on stderr; returns 1.
int fail(const std::string& msg);
// "plyctl: IMAGE: MSG" for an error about an image (a damaged one: and
// the advice to run fsck.plyfs); returns 1.
int fail_on(const std::string& image, const Error& e);
// "plyctl: MSG" and where to find help; returns 2.
int usage_error(const std::string& msg);
// The usage errors of a command given an image where it needs a mount point
// (or the reverse): one line saying so, and `instead`, what to do there.
int need_mount(const std::string& what, const std::string& path, const std::string& instead);
int need_image(const std::string& what, const std::string& path, const std::string& instead);
void usage(FILE* out);

Result<uint64_t> number(const std::string& s, const char* what);
Result<std::unique_ptr<BlockDevice>> open_image(const std::string& path, bool write);
// What --device gave: the other devices of a multi-device volume, or
// directories to scan for them (format.md#multi-device).
std::vector<std::string>& extra_devices();
bool is_directory(const std::string& p);
// The mount `resolved` (an absolute path without links, on filesystem
// `dev`) lies in: the topmost directory above it on the same filesystem.
std::string mount_root(const std::string& resolved, dev_t dev);

// An image opened for the branch commands (offline: it must not be mounted).
struct Opened {
  std::unique_ptr<BlockDevice> dev;
  std::unique_ptr<Volume> vol;
};
Result<Opened> open_volume(const std::string& image, bool write);

// Where a command on an image's catalog runs (issue 24): through the daemon
// (`mnt`) when `path` is a mount point, or an image that a plyfs mount
// serves (its lock is taken, and mount_of finds the mount); else on the
// image, opened here. plyctl never reads a mounted image's blocks. An NBD
// URI has no lock: a mount given the same URI counts as its holder.
struct Target {
  std::string mnt;  // non-empty: this mount point's daemon answers
  Opened o;
};
Result<Target> open_target(const std::string& path, bool write);

// Splits options (--x [value]) from positional arguments.
struct Parsed {
  std::vector<std::string> pos;
  std::map<std::string, std::string> opt;
};
Result<Parsed> parse(const std::vector<std::string>& args, const std::set<std::string>& with_value,
                     const std::set<std::string>& flags);

// The commands (args: what follows the command and subcommand words).
int cmd_show(const std::vector<std::string>& args);
int cmd_branch(const std::string& sub, const std::vector<std::string>& args);
int cmd_layer(const std::string& sub, const std::vector<std::string>& args);
int cmd_view(const std::string& sub, const std::vector<std::string>& args);
int cmd_lifecycle(const std::string& cmd, const std::vector<std::string>& args);
int cmd_sync(const std::vector<std::string>& args);
int cmd_hold(const std::string& cmd, const std::vector<std::string>& args);  // hold, release
// Deletes branch `name` of `image` (branch remove, layer delete, delete).
int remove_branch(const std::string& image, const std::string& name, bool json);
int cmd_import(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_send(const std::vector<std::string>& args);
int cmd_receive(const std::vector<std::string>& args);
int cmd_trim(const std::vector<std::string>& args);
int cmd_du(const std::vector<std::string>& args);
int cmd_resize(const std::vector<std::string>& args);
int cmd_scrub(const std::vector<std::string>& args);
int cmd_device(const std::string& sub, const std::vector<std::string>& args);
int cmd_where(const std::vector<std::string>& args);
int cmd_policy(const std::string& sub, const std::vector<std::string>& args);
int cmd_tree(std::vector<std::string> args);
int cmd_fields(std::vector<std::string> args);
int cmd_corrupt(std::vector<std::string> args);

}  // namespace plyfs::ctl
