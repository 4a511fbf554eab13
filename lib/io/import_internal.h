// What import.cpp and oci.cpp share (lib/io internal).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/io.h"

namespace plyfs::io {

// An OCI layout named "DIR:TAG" (umoci's form): the tag picks a manifest of
// index.json. A path that exists as given has no tag.
struct OciRef {
  std::string dir, tag;
};
OciRef split_oci_ref(const std::string& source);

Result<std::optional<BranchMeta>> live_named(Volume::Txn& t, std::string_view name);
// The name rule, and EEXIST for a live branch of that name (unless `replace`).
Result<void> check_new_name(Volume& v, std::string_view name, bool replace);
// Drops trees an import built (doomed), for their space.
Result<void> drop_trees(Volume& v, const std::vector<BranchMeta>& made);
// The final transaction (I1).
Result<void> make_live(Volume& v, std::vector<BranchMeta>& made, bool replace);

// An OCI image layout (oci.cpp): its layers, bottom first, as a chain of
// doomed layers in out.branches, every blob's digest checked.
Result<void> import_oci(Volume& v, const std::string& source, const ImportOptions& o, Imported& out);

}  // namespace plyfs::io
