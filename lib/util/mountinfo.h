// The mounts of this mount namespace, from /proc/self/mountinfo
// (proc_pid_mountinfo(5)): the one reader of that file for every tool, so
// that its escapes and its optional fields are handled once.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace plyfs {

// One line of mountinfo, its fields' escapes undone:
// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPEROPTIONS
struct MountEntry {
  std::string majmin;      // "0:52": the device number, the mount's bdi for FUSE
  std::string root;        // the mount's root within its file system
  std::string mountpoint;  // as the kernel spells it (canonical, absolute)
  std::string fstype;      // "fuse.plyfs"
  std::string source;      // what was mounted: for plyfs, the image as given to it
  std::string options;     // the super block's options: "rw,memory" for cgroup v1's memory hierarchy
};

// A field with the kernel's octal escapes (\ooo for space, tab, newline and
// backslash) undone; any other backslash stays as it is.
std::string unescape_mountinfo(std::string_view field);

// One line; nullopt if it lacks a field or the " - " separator.
std::optional<MountEntry> parse_mountinfo_line(std::string_view line);

// Every mount, in the file's order (a later mount over the same point comes
// later); empty if the file cannot be read.
std::vector<MountEntry> read_mountinfo(const char* path = "/proc/self/mountinfo");

}  // namespace plyfs
