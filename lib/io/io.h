// Data in and out of an image without a mount (format.md#import-export):
// import builds a new branch from a directory, a tarball (plain, gzip, zstd,
// xz), an OCI layer, an OCI image layout or an ext4 image; export writes a
// branch's view as a tarball, or a layer's own changes as an OCI layer.
//
// This layer sits on the branch lifecycle (lib/snap) and the union
// (lib/union) and reaches the image only through them and lib/fs. The tools
// (plyctl import|export, mkfs.plyfs -d) parse arguments, call it and print.
//
// Invariants (the tests in tests/io/ cite them):
//   I1 an import is atomic: the new branches are built as trees flagged
//      DOOMED (format.md#snapshots), over as many generations as their size
//      needs, and one transaction at the end clears the flag and gives each
//      its name. A failure (bad input, ENOSPC, an I/O error) drops them; a
//      crash leaves doomed trees, which the next read-write open drops. So
//      an import leaves its branches whole or nothing, and no block leaked.
//   I2 no entry of a source ever lands outside the new tree: paths are
//      resolved in the tree being built, never in the host's filesystem;
//      absolute paths lose their leading '/' (tar's rule, said in a note),
//      and a '..' component, a path through a symbolic link or a file, a
//      hard link to a missing or escaping target and a name longer than 255
//      bytes are refused, naming the entry.
//   I3 what is kept: every file type, mode bits with setuid, setgid and
//      sticky, owners, atime and mtime (ctime and btime are the import's
//      time: no interface sets them), xattrs including security.* and POSIX
//      ACLs, holes, hard links as links, names as bytes.
//   I4 export reads one committed generation: offline the image as opened,
//      online (plyctl) clones the daemon made and committed for it.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "union/view.h"

namespace plyfs::io {

enum class Format { Auto, Dir, Tar, OciLayer, Oci, Ext4 };
// "dir", "tar", "oci-layer", "oci", "ext4" (EINVAL for anything else).
Result<Format> parse_format(std::string_view s);
const char* format_name(Format f);

// What an import did so far (progress) or in all (the result).
struct ImportStats {
  uint64_t entries = 0;     // source entries taken
  uint64_t files = 0, dirs = 0, symlinks = 0, specials = 0;  // objects made
  uint64_t hardlinks = 0;   // names linked to an object made before
  uint64_t whiteouts = 0, opaque = 0;  // OCI markers turned native
  uint64_t xattrs = 0;      // xattrs set (ACLs included)
  uint64_t bytes = 0;       // file data written (holes not counted)
  uint64_t layers = 0;      // branches made (an OCI image: one per layer)
  uint64_t read_bytes = 0, total_bytes = 0;  // source read so far / its size (0: unknown)
};

struct ImportOptions {
  std::string name;          // the new branch (an OCI image: its top layer)
  TreeId parent{0};          // 0: a base branch; else a layer over this branch
  Format format = Format::Auto;
  bool read_only = false;    // the new branch is flagged READ_ONLY
  bool force = false;        // ext4: import an image that has errors
  // mkfs -d: the live branch `name` is replaced (doomed in the final
  // transaction) instead of refusing the name with EEXIST.
  bool replace = false;
  std::function<void(const ImportStats&)> progress;  // every few ms of work
  std::function<void(const std::string&)> note;      // warnings, one line each
};

struct Imported {
  Format format = Format::Auto;  // the format used (detected or given)
  std::vector<BranchMeta> branches;  // bottom first; the last is `name`
  ImportStats stats;
};

// Imports `source` (a path; an OCI layout may be "DIR:TAG"; "-" is a
// tarball on standard input) as a new branch
// of `v`, committed durably (I1). The caller opened `v` read-write and
// dropped doomed trees first.
Result<Imported> import(Volume& v, const std::string& source, const ImportOptions& o);

// The format import would use for `source` (Auto resolved): a directory
// holding "oci-layout" is an OCI image, another directory a directory; a
// file or device with an ext2/3/4 superblock is ext4; anything else is a
// tarball, an OCI layer when it goes over a parent.
Result<Format> detect_format(const std::string& source, bool has_parent);

enum class ExportFormat { Tar, OciLayer };
enum class Compress { None, Gzip, Zstd };
Result<ExportFormat> parse_export_format(std::string_view s);  // "tar", "oci-layer"
Result<Compress> parse_compress(std::string_view s);          // "none", "gzip", "zstd"

struct ExportStats {
  uint64_t entries = 0;    // archive entries written
  uint64_t files = 0, dirs = 0, symlinks = 0, specials = 0, hardlinks = 0;
  uint64_t whiteouts = 0, opaque = 0;
  uint64_t bytes = 0;      // file data read (holes not counted)
  uint64_t skipped = 0;    // sockets: tar cannot hold them
};

struct ExportOptions {
  ExportFormat format = ExportFormat::Tar;
  Compress compress = Compress::None;
  std::function<void(const ExportStats&)> progress;
  std::function<void(const std::string&)> note;
};

// Writes branch `tree` of `v` to `fd` as a pax tarball: with Tar its whole
// view (the branch over its ancestor layers, as plyfs -o layer= shows it);
// with OciLayer only the branch's own tree, whiteouts as ".wh.NAME" and
// opaque directories with ".wh..wh..opq", which import --format oci-layer
// takes back exactly. `v` may be opened read-only.
Result<ExportStats> export_branch(Volume& v, TreeId tree, int fd, const ExportOptions& o);

// The same for a stack given (plyctl's export of a mount: clones of the
// branch and its ancestors): Tar writes the view of `stack`, OciLayer the
// own tree of stack[0].
Result<ExportStats> export_view(Volume& v, const std::vector<ViewLayer>& stack, int fd, const ExportOptions& o);

// The view export writes for `tree` with Tar: the branch over its ancestor
// layers (view.h layer_stack), every one read-only. Doomed trees too (the
// layers of an OCI image being imported).
Result<std::vector<ViewLayer>> export_stack(Volume& v, TreeId tree);

}  // namespace plyfs::io
