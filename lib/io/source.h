// The importer's input: a stream of entries (lib/io internal). Each source
// (a directory walker, a libarchive reader, an ext4 reader) hands out its
// entries one at a time, parents before children, with the current entry's
// file data as pieces at increasing offsets: the gaps are holes.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "io/io.h"

namespace plyfs::io {

struct Xattr {
  std::string name;
  std::vector<std::byte> value;
};

struct SourceEntry {
  // Relative to the source's root, '/'-separated, as the source has it:
  // the importer normalizes it and refuses what could escape (io.h, I2).
  // Empty (or ".") for the root directory itself.
  std::string path;
  uint32_t mode = 0;              // st_mode: type and permission bits
  uint32_t uid = 0, gid = 0;
  timespec atime{}, mtime{};
  uint64_t rdev = 0;
  uint64_t size = 0;              // a regular file's length
  std::string target;             // a symlink's target
  // A hard link: by the path of an earlier entry (tar), or by an identity
  // the source gives every name of one object (a directory walker's
  // st_dev/st_ino, ext4's inode number; 0: none).
  std::optional<std::string> link_path;
  uint64_t link_key = 0;
  std::vector<Xattr> xattrs;      // later ones of the same name win
  bool whiteout = false;          // OCI ".wh.NAME": `path` is NAME's path
  bool opaque = false;            // OCI ".wh..wh..opq": `path` is the directory's

  // An entry with what every source reads first: its path, mode, owners
  // and times (the rest by type, as each source finds it).
  static SourceEntry of(std::string path, uint32_t mode, uint32_t uid, uint32_t gid, timespec atime,
                        timespec mtime) {
    SourceEntry e;
    e.path = std::move(path);
    e.mode = mode;
    e.uid = uid;
    e.gid = gid;
    e.atime = atime;
    e.mtime = mtime;
    return e;
  }
};

// One piece of the current entry's data.
struct DataPiece {
  uint64_t offset;
  std::span<const std::byte> bytes;  // valid until the next call
};

class EntrySource {
 public:
  virtual ~EntrySource() = default;
  // The next entry, or nullopt at the end of the source.
  virtual Result<std::optional<SourceEntry>> next() = 0;
  // The next piece of the current regular file's data, or nullopt when
  // it has no more; pieces come at increasing offsets below its size.
  virtual Result<std::optional<DataPiece>> data() = 0;
  // How far the source is read and its size in the same unit (bytes of
  // the source), for progress; total 0: unknown.
  uint64_t read_bytes() const { return read_; }
  uint64_t total_bytes() const { return total_; }
  // Called after the last entry, before anything is committed: a source
  // that checks what it read (an OCI blob's digest) refuses here.
  virtual Result<void> finish() { return ok(); }
  // Whether a leading '/' is stripped with a note (tar's rule) rather
  // than refused.
  virtual bool strips_leading_slash() const { return true; }

 protected:
  uint64_t read_ = 0, total_ = 0;  // what read_bytes() and total_bytes() say
};

// The sources (source_*.cpp).
// `count_total`: walk it once first to know its size (progress).
Result<std::unique_ptr<EntrySource>> open_dir_source(const std::string& dir, bool count_total);
// A tarball, any compression libarchive reads; `oci_layer` turns
// ".wh.NAME" and ".wh..wh..opq" into whiteout and opaque entries. The
// digest hook, when given, sees every byte of the file as read (OCI blobs).
using DigestFeed = std::function<void(std::span<const std::byte>)>;
Result<std::unique_ptr<EntrySource>> open_archive_source(const std::string& file, bool oci_layer,
                                                         DigestFeed feed = {});
Result<std::unique_ptr<EntrySource>> open_ext4_source(const std::string& image, bool force);

// The builder of one new branch from a source (importer.cpp): creates its
// doomed tree, takes entries, and leaves the tree doomed for the caller's
// final transaction (import.cpp).
struct BuildTarget {
  std::string name;
  TreeId parent{0};
  bool read_only = false;
};
Result<BranchMeta> build_branch(Volume& v, const BuildTarget& target, EntrySource& src,
                                ImportStats& stats, const ImportOptions& o);

}  // namespace plyfs::io

namespace plyfs::io {

// POSIX ACLs (acl.cpp): the kernel's xattr encoding (lib/fs/acl.h) and the
// entries libarchive reads and writes as text (SCHILY.acl.access/default).
struct AclEntry {
  uint16_t tag;   // ACL_USER_OBJ 0x01, USER 0x02, GROUP_OBJ 0x04, GROUP 0x08, MASK 0x10, OTHER 0x20
  uint16_t perm;  // r 4, w 2, x 1
  uint32_t id;    // a user's or group's id; 0xffffffff for the others
};
// Sorted by tag and id, as the kernel keeps them.
std::vector<std::byte> encode_acl(std::vector<AclEntry> entries);
Result<std::vector<AclEntry>> decode_acl(std::span<const std::byte> xattr);

}  // namespace plyfs::io
