// import (io.h): picks the source, builds the new branches as doomed trees
// (importer.cpp) and makes them live in one transaction (I1).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "io/import_internal.h"
#include "io/source.h"
#include "snap/snap.h"
#include "union/view.h"
#include "util/text.h"

namespace plyfs::io {

Result<Format> parse_format(std::string_view s) {
  if (s == "dir") return Format::Dir;
  if (s == "tar") return Format::Tar;
  if (s == "oci-layer") return Format::OciLayer;
  if (s == "oci") return Format::Oci;
  if (s == "ext4") return Format::Ext4;
  return Error::invalid("unknown format '" + std::string(s) + "' (dir, tar, oci-layer, oci, ext4)");
}

const char* format_name(Format f) {
  switch (f) {
    case Format::Dir: return "dir";
    case Format::Tar: return "tar";
    case Format::OciLayer: return "oci-layer";
    case Format::Oci: return "oci";
    case Format::Ext4: return "ext4";
    default: return "auto";
  }
}

namespace {

// An ext2/3/4 superblock: magic 0xEF53 at byte 56 of the superblock, which
// starts at byte 1024.
bool has_ext_magic(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  unsigned char m[2] = {0, 0};
  const bool ok = ::pread(fd, m, 2, 1024 + 56) == 2;
  ::close(fd);
  return ok && m[0] == 0x53 && m[1] == 0xef;
}

}  // namespace

Result<Format> detect_format(const std::string& source, bool has_parent) {
  if (source == "-") return has_parent ? Format::OciLayer : Format::Tar;  // standard input
  const OciRef ref = split_oci_ref(source);
  struct stat st;
  if (::stat(ref.dir.c_str(), &st) != 0) return Error::sys(errno, "cannot open " + source);
  if (S_ISDIR(st.st_mode)) {
    const std::string layout = ref.dir + "/oci-layout";
    if (::access(layout.c_str(), F_OK) == 0) return Format::Oci;
    if (!ref.tag.empty()) return Error::sys(ENOENT, "cannot open " + source);
    return Format::Dir;
  }
  if (!ref.tag.empty()) return Error::sys(ENOENT, "cannot open " + source);
  if (has_ext_magic(source)) return Format::Ext4;
  return has_parent ? Format::OciLayer : Format::Tar;
}

OciRef split_oci_ref(const std::string& source) {
  struct stat st;
  if (::stat(source.c_str(), &st) == 0) return {source, ""};
  const size_t colon = source.rfind(':');
  if (colon == std::string::npos || colon == 0) return {source, ""};
  return {source.substr(0, colon), source.substr(colon + 1)};
}

// The live branch named `name`, if any (doomed trees have no name).
Result<std::optional<BranchMeta>> live_named(Volume::Txn& t, std::string_view name) {
  for (auto& b : PLY_TRY(Filesystem::branches(t)))
    if (!b.doomed && b.name == name) return std::optional<BranchMeta>(b);
  return std::optional<BranchMeta>{};
}

Result<void> check_new_name(Volume& v, std::string_view name, bool replace) {
  PLY_CHECK(check_branch_name(name));
  auto t = PLY_TRY(v.begin());
  if (!replace && PLY_TRY(live_named(t, name)))
    return Error::io(EEXIST, "a branch named \"" + shown(name) + "\" exists");
  return ok();
}

Result<void> drop_trees(Volume& v, const std::vector<BranchMeta>& made) {
  for (const auto& m : made) {
    auto t = PLY_TRY(v.begin({.for_delete = true, .reserve_blocks = 64}));
    PLY_CHECK(t.drop_tree(m.tree));
  }
  return ok();
}

// The one transaction that makes an import visible (I1): each new tree
// loses DOOMED, under the name it was built with; with `replace`, the live
// branch of the top's name is doomed in its place (mkfs -d).
Result<void> make_live(Volume& v, std::vector<BranchMeta>& made, bool replace) {
  auto t = PLY_TRY(v.begin({.reserve_blocks = Filesystem::kSetBranchBlocks * (made.size() + 2) + 64}));
  for (auto& m : made) {
    auto old = PLY_TRY(live_named(t, m.name));
    if (old && !(replace && &m == &made.back()))
      return Error::io(EEXIST, "a branch named \"" + shown(m.name) + "\" exists");
    if (old && old->held)  // a held branch goes only once released (format.md#snapshots)
      return Error::io(EBUSY, "\"" + shown(old->name) + "\" is held: release it first (plyctl release)");
    if (old) {
      old->doomed = true;
      PLY_CHECK(Filesystem::set_branch(t, *old));
    }
  }
  for (auto& m : made) {
    m.doomed = false;
    PLY_CHECK(Filesystem::set_branch(t, m));
    m.created = t.gen();
  }
  return ok();
}

namespace {

Result<std::unique_ptr<EntrySource>> open_source(const std::string& source, Format f, const ImportOptions& o) {
  switch (f) {
    case Format::Dir: return open_dir_source(source, bool(o.progress));
    case Format::Tar: return open_archive_source(source, false);
    case Format::OciLayer: return open_archive_source(source, true);
    case Format::Ext4: return open_ext4_source(source, o.force);
    default: return Error::invalid("no single source for format " + std::string(format_name(f)));
  }
}

}  // namespace

Result<Imported> import(Volume& v, const std::string& source, const ImportOptions& o) {
  Imported out;
  out.format = o.format == Format::Auto ? PLY_TRY(detect_format(source, o.parent.v != 0)) : o.format;
  PLY_CHECK(check_new_name(v, o.name, o.replace));
  if (o.parent.v) {
    BranchMeta p = PLY_TRY(Filesystem::branch(v, o.parent));
    if (p.doomed) return Error::io(ENOENT, "the parent is being dropped");
  }
  if (out.format == Format::Oci) {
    PLY_CHECK(import_oci(v, source, o, out));
  } else {
    auto src = PLY_TRY(open_source(source, out.format, o));
    BuildTarget target{o.name, o.parent, o.read_only};
    out.branches.push_back(PLY_TRY(build_branch(v, target, *src, out.stats, o)));
    out.stats.layers = 1;
  }
  auto live = make_live(v, out.branches, o.replace);
  if (!live) {
    (void)drop_trees(v, out.branches);
    return live.error();
  }
  (void)PLY_TRY(v.commit());
  if (o.replace) (void)PLY_TRY(drop_doomed(v));  // the branch replaced
  return out;
}

}  // namespace plyfs::io
