// An OCI image layout (the OCI image spec, "image-layout"): oci-layout,
// index.json, the manifest it names (by tag, or the only one, or the one for
// this machine's platform in a nested index), and the layers the manifest
// lists, imported bottom first as a chain of layers. Every blob is checked
// against its descriptor's size and sha256 digest: the manifest, the index
// it came through and the config before any layer is read, each layer while
// it streams in, and a mismatch fails the import before the final
// transaction, so nothing of it is ever committed (io.h, I1).
#include <fcntl.h>
#include <nettle/sha2.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>

#include "io/import_internal.h"
#include "io/source.h"
#include "util/text.h"

namespace plyfs::io {

namespace {

using Json = nlohmann::json;

class Sha256 {
 public:
  Sha256() { sha256_init(&c_); }
  void add(std::span<const std::byte> b) { sha256_update(&c_, b.size(), reinterpret_cast<const uint8_t*>(b.data())); }
  std::string hex() {
    std::array<uint8_t, SHA256_DIGEST_SIZE> d;
    sha256_digest(&c_, d.size(), d.data());
    std::string s;
    char h[3];
    for (uint8_t x : d) std::snprintf(h, sizeof h, "%02x", x), s += h;
    return s;
  }

 private:
  sha256_ctx c_;
};

struct Descriptor {
  std::string media_type, hex;  // hex: the sha256 digest's 64 hex digits
  uint64_t size = 0;
  Json annotations, platform;
};

Error bad(const std::string& dir, const std::string& why) {
  std::string m = "OCI image ";
  m += shown(dir);
  m += ": ";
  m += why;
  return Error::invalid(m);
}

// A descriptor as the spec has it; only sha256 digests, whose 64 lowercase
// hex digits name the blob's file (nothing else may reach the path).
Result<Descriptor> descriptor(const std::string& dir, const Json& j) {
  if (!j.is_object() || !j.contains("digest") || !j["digest"].is_string() || !j.contains("size") ||
      !j["size"].is_number_unsigned() || !j.contains("mediaType") || !j["mediaType"].is_string())
    return bad(dir, "a descriptor without mediaType, digest or size");
  const std::string digest = j["digest"];
  if (digest.rfind("sha256:", 0) != 0)
    return bad(dir, "digest \"" + shown(digest) + "\": only sha256 digests are supported");
  Descriptor d;
  d.hex = digest.substr(7);
  if (d.hex.size() != 64 || d.hex.find_first_not_of("0123456789abcdef") != std::string::npos)
    return bad(dir, "digest \"" + shown(digest) + "\" is not 64 lowercase hex digits");
  d.media_type = j["mediaType"];
  d.size = j["size"];
  if (j.contains("annotations")) d.annotations = j["annotations"];
  if (j.contains("platform")) d.platform = j["platform"];
  return d;
}

std::string blob_path(const std::string& dir, const Descriptor& d) { return dir + "/blobs/sha256/" + d.hex; }

Result<std::string> read_file(const std::string& path, uint64_t limit) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error::sys(errno, "cannot open " + path);
  std::string s;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && s.size() <= limit) s.append(buf, size_t(n));
  const int e = errno;
  ::close(fd);
  if (n < 0) return Error::sys(e, "cannot read " + path);
  if (s.size() > limit) return Error::io(EFBIG, path + " is larger than " + std::to_string(limit) + " bytes");
  return s;
}

// A small blob (index, manifest, config), checked before it is parsed.
Result<Json> read_json_blob(const std::string& dir, const Descriptor& d) {
  const std::string text = PLY_TRY(read_file(blob_path(dir, d), 16u << 20));
  Sha256 h;
  h.add(std::as_bytes(std::span(text.data(), text.size())));
  if (text.size() != d.size || h.hex() != d.hex)
    return bad(dir, "blob sha256:" + d.hex + " does not match its digest or size");
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad(dir, "blob sha256:" + d.hex + " is not a JSON object");
  return j;
}

bool is_index(const std::string& t) {
  return t == "application/vnd.oci.image.index.v1+json" ||
         t == "application/vnd.docker.distribution.manifest.list.v2+json";
}

std::string host_arch() {
  utsname u;
  if (::uname(&u) != 0) return "";
  const std::string m = u.machine;
  if (m == "x86_64") return "amd64";
  if (m == "aarch64") return "arm64";
  return m;
}

// The manifest index.json (or a nested index) names: by tag at the top,
// then the only one, or the one for linux on this machine.
Result<Descriptor> pick_manifest(const std::string& dir, const Json& index, const std::string& tag, bool top) {
  if (!index.contains("manifests") || !index["manifests"].is_array())
    return bad(dir, "an index without a manifests list");
  std::vector<Descriptor> all;
  for (const auto& m : index["manifests"]) all.push_back(PLY_TRY(descriptor(dir, m)));
  std::vector<Descriptor> pick;
  for (auto& d : all) {
    const std::string ref = d.annotations.is_object() ? d.annotations.value("org.opencontainers.image.ref.name", "") : "";
    if (top && !tag.empty()) {
      if (ref == tag) pick.push_back(d);
    } else if (all.size() == 1 ||
               (d.platform.is_object() && d.platform.value("os", "") == "linux" &&
                d.platform.value("architecture", "") == host_arch())) {
      pick.push_back(d);
    }
  }
  if (pick.empty() && top && !tag.empty()) return bad(dir, "no image tagged \"" + shown(tag) + "\"");
  if (pick.size() != 1) {
    std::string tags;
    for (auto& d : all)
      if (d.annotations.is_object() && d.annotations.contains("org.opencontainers.image.ref.name")) {
        tags += tags.empty() ? "" : ", ";
        tags += shown(d.annotations.value("org.opencontainers.image.ref.name", ""));
      }
    return bad(dir, "it holds " + std::to_string(all.size()) + " images: name one as DIR:TAG" +
                        (tags.empty() ? std::string() : " (tags: " + tags + ")"));
  }
  Descriptor d = pick[0];
  if (!is_index(d.media_type)) return d;
  return pick_manifest(dir, PLY_TRY(read_json_blob(dir, d)), tag, false);
}

bool is_layer_type(const std::string& t) {
  for (std::string_view p : {"application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.nondistributable.v1.tar",
                             "application/vnd.docker.image.rootfs.diff.tar"})
    if (t.rfind(p, 0) == 0 && (t.size() == p.size() || t == std::string(p) + "+gzip" || t == std::string(p) + "+zstd" ||
                               t == std::string(p) + ".gzip"))
      return true;
  return false;
}

// An empty image (no layers) is an empty branch.
class EmptySource final : public EntrySource {
 public:
  Result<std::optional<SourceEntry>> next() override { return std::optional<SourceEntry>{}; }
  Result<std::optional<DataPiece>> data() override { return std::optional<DataPiece>{}; }
};

}  // namespace

Result<void> import_oci(Volume& v, const std::string& source, const ImportOptions& o, Imported& out) {
  const OciRef ref = split_oci_ref(source);
  const std::string& dir = ref.dir;
  Json layout = Json::parse(PLY_TRY(read_file(dir + "/oci-layout", 1u << 20)), nullptr, false);
  if (!layout.is_object() || !layout.contains("imageLayoutVersion") || !layout["imageLayoutVersion"].is_string())
    return bad(dir, "oci-layout is not an image layout");
  Json index = Json::parse(PLY_TRY(read_file(dir + "/index.json", 16u << 20)), nullptr, false);
  if (!index.is_object()) return bad(dir, "index.json is not a JSON object");
  const Descriptor md = PLY_TRY(pick_manifest(dir, index, ref.tag, true));
  const Json manifest = PLY_TRY(read_json_blob(dir, md));
  if (!manifest.contains("config") || !manifest.contains("layers") || !manifest["layers"].is_array())
    return bad(dir, "manifest sha256:" + md.hex + " has no config or layers");
  (void)PLY_TRY(read_json_blob(dir, PLY_TRY(descriptor(dir, manifest["config"]))));
  std::vector<Descriptor> layers;
  for (const auto& l : manifest["layers"]) {
    Descriptor d = PLY_TRY(descriptor(dir, l));
    if (!is_layer_type(d.media_type))
      return bad(dir, "layer sha256:" + d.hex + " is of type \"" + shown(d.media_type) + "\", not a tar layer");
    struct stat st;
    if (::stat(blob_path(dir, d).c_str(), &st) != 0) return Error::sys(errno, "cannot open " + blob_path(dir, d));
    if (uint64_t(st.st_size) != d.size) return bad(dir, "blob sha256:" + d.hex + " does not match its size");
    layers.push_back(d);
  }
  if (layers.size() + 1 > kMaxViewLayers)
    return bad(dir, std::to_string(layers.size()) + " layers: a view shows at most " + std::to_string(kMaxViewLayers) + " branches");
  // Below the top one, each layer is named after the image and itself:
  // 12 digits of the manifest's digest and 12 of the layer's.
  std::vector<std::string> names;
  for (size_t i = 0; i + 1 < layers.size(); i++) {
    names.push_back(md.hex.substr(0, 12) + "-" + layers[i].hex.substr(0, 12));
    PLY_CHECK(check_new_name(v, names.back(), false));
  }
  names.push_back(o.name);
  auto fail = [&](Error e) -> Result<void> {
    (void)drop_trees(v, out.branches);
    out.branches.clear();
    return e;
  };
  TreeId parent = o.parent;
  if (layers.empty()) {
    EmptySource empty;
    out.branches.push_back(PLY_TRY(build_branch(v, {o.name, parent, o.read_only}, empty, out.stats, o)));
  }
  for (size_t i = 0; i < layers.size(); i++) {
    Sha256 h;
    auto src = open_archive_source(blob_path(dir, layers[i]), true, [&](std::span<const std::byte> b) { h.add(b); });
    if (!src) return fail(src.error());
    const bool top = i + 1 == layers.size();
    auto made = build_branch(v, {names[i], parent, top && o.read_only}, **src, out.stats, o);
    if (!made) return fail(made.error());
    out.branches.push_back(*made);
    if (h.hex() != layers[i].hex) return fail(bad(dir, "blob sha256:" + layers[i].hex + " does not match its digest"));
    parent = made->tree;
    out.stats.layers++;
  }
  return ok();
}

}  // namespace plyfs::io
