// plyctl export: a branch's view as a tarball, or a layer's own changes as
// an OCI layer (lib/io, io.h), from an image or from a mount.
//
// On a mount the archive must come from one consistent generation, never
// through FUSE (a read-only mount writes nothing: its image is read as it
// is). Otherwise plyctl flushes the kernel's dirty pages (syncfs), has the
// daemon clone, read-only, the branch and the ancestors its view shows (one
// O(1) clone each, plyctl clone's request), fsyncs the mount's root (the
// daemon commits), opens the image read-only beside the daemon and exports
// the clones, then has the daemon delete them. A clone shares every block
// of its source and nothing writes to it, so the blocks it reads stay as
// they were while the mount goes on writing.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>

#include "cli.h"
#include "fs/fs.h"
#include "io/io.h"
#include "io_cmd.h"
#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "union/view.h"
#include "util/parse.h"
#include "util/progress.h"
#include "util/mountinfo.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

constexpr const char* kExportUsage =
    "usage: plyctl export IMAGE|MOUNTPOINT BRANCH [-o FILE|-] [--format tar|oci-layer] [--compress zstd|gzip|none] "
    "[--json]";

const char* compress_name(io::Compress c) {
  return c == io::Compress::Gzip ? "gzip" : c == io::Compress::Zstd ? "zstd" : "none";
}

bool ends_with(const std::string& s, std::string_view t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// Where the image of mount point `mnt` may be: the mount's source (the
// daemon gives the image path as given to it, fsname=), and the files a
// plyfs process holds open under that name. Which one it is, the clones
// made for the export tell (export_mounted).
std::vector<std::string> image_candidates(const std::string& mnt) {
  std::vector<std::string> out;
  char* rp = ::realpath(mnt.c_str(), nullptr);
  if (!rp) return out;
  const std::string where = rp;
  std::free(rp);
  std::string source;  // the last mount there is the one that shows
  for (const MountEntry& m : read_mountinfo())
    if (m.mountpoint == where && m.fstype.rfind("fuse", 0) == 0) source = m.source;
  if (source.empty()) return out;
  if (source[0] == '/') out.push_back(source);
  const std::string base = source.substr(source.rfind('/') + 1);
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* de = ::readdir(d)) {
      const std::string pid = de->d_name;
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream comm("/proc/" + pid + "/comm");
      std::string c;
      if (!std::getline(comm, c) || c != "plyfs") continue;
      const std::string fds = "/proc/" + pid + "/fd";
      DIR* fd = ::opendir(fds.c_str());
      if (!fd) continue;
      while (dirent* e = ::readdir(fd)) {
        char target[4096];
        const std::string link = fds + "/" + e->d_name;
        ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
        if (n <= 0) continue;
        const std::string t(target, size_t(n));
        if (t[0] == '/' && (t == source || ends_with(t, "/" + base))) out.push_back(t);
      }
      ::closedir(fd);
    }
    ::closedir(d);
  }
  return out;
}

// The image beside its daemon: read-only, without the lock the daemon holds.
Result<Opened> open_beside(const std::string& image) {
  Opened o;
  o.dev = PLY_TRY(open_device(image, FileOpenOptions{true, false}));
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.read_only = true;
  vo.cache_bytes = 64ull << 20;
  o.vol = PLY_TRY(Volume::open(*o.dev, vo));
  // Every branch's record read now, in the generation just opened: the
  // clones' own blocks stay put from then on (the daemon frees only what a
  // later generation stops referencing).
  (void)PLY_TRY(Filesystem::branches(*o.vol));
  return o;
}

// The clones (by name) found in the image, as a stack in that order.
Result<std::vector<ViewLayer>> find_clones(Volume& v, const std::vector<std::string>& names) {
  std::vector<ViewLayer> s;
  for (const auto& n : names) s.push_back({PLY_TRY(find_branch(v, n)).tree, false});
  return s;
}

// An fsync of the mount's root: the daemon commits.
Result<void> commit_mount(const std::string& mnt) {
  int root = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) return Error::sys(errno, "cannot open " + mnt);
  const int synced = ::fsync(root);
  const int e = errno;
  ::close(root);
  if (synced != 0) return Error::sys(e, "cannot commit " + mnt);
  return ok();
}

Result<io::ExportStats> export_mounted(const std::string& mnt, const std::string& branch, int fd,
                                       const io::ExportOptions& o, TreeId& id) {
  sync_mount(mnt);
  PLY_CHECK(commit_mount(mnt));  // a branch made online is in the image the next lines read
  const auto candidates = image_candidates(mnt);
  if (candidates.empty())
    return Error::io(ENOENT, "cannot find the image of " + mnt + ": export it unmounted, from the image");
  // The branches to clone: the branch and, for a tar, its ancestors.
  std::vector<std::string> names;
  std::string image;
  for (const auto& c : candidates) {
    auto op = open_beside(c);
    if (!op) continue;
    auto b = find_branch(*op->vol, branch);
    if (!b) continue;
    id = b->tree;
    std::vector<ViewLayer> stack = {{b->tree, false}};
    if (o.format == io::ExportFormat::Tar) stack = PLY_TRY(io::export_stack(*op->vol, b->tree));
    for (const auto& l : stack) names.push_back(PLY_TRY(Filesystem::branch(*op->vol, l.tree)).name);
    image = c;
    break;
  }
  if (names.empty()) return Error::io(ENOENT, "no branch \"" + shown(branch) + "\" in the image of " + mnt);
  std::random_device rd;
  char tag[16];
  std::snprintf(tag, sizeof tag, "%08x", unsigned(rd()));
  std::vector<std::string> clones;
  auto cleanup = [&] {
    for (const auto& c : clones) {
      Json req = {{"command", "delete"}};
      model::put_name(req, "branch", c);
      if (auto r = request(mnt, req); !r)
        std::fprintf(stderr, "%s: cannot delete the clone %s: %s\n", kProg, in_quotes(c).c_str(), r.error().message().c_str());
    }
  };
  auto run = [&]() -> Result<io::ExportStats> {
    for (size_t i = 0; i < names.size(); i++) {
      std::string c = "export-";
      c += tag;
      c += '-';
      c += std::to_string(i);
      Json req = {{"command", "clone"}, {"writable", false}};
      model::put_name(req, "source", names[i]);
      model::put_name(req, "name", c);
      auto made = request(mnt, req);
      if (!made && made.error().code == EROFS && i == 0) {
        // A read-only mount never writes the image: it is read as it is.
        auto op = PLY_TRY(open_beside(image));
        return io::export_branch(*op.vol, PLY_TRY(find_branch(*op.vol, branch)).tree, fd, o);
      }
      if (!made) return made.error();
      clones.push_back(c);
    }
    PLY_CHECK(commit_mount(mnt));  // the clones are durable
    // The image that holds the clones (their names are this export's).
    for (int attempt = 0; attempt < 5; attempt++) {
      std::vector<std::string> order = {image};
      for (const auto& c : candidates)
        if (c != image) order.push_back(c);
      for (const auto& c : order) {
        auto op = open_beside(c);
        if (!op) continue;
        auto stack = find_clones(*op->vol, clones);
        if (!stack) continue;
        return io::export_view(*op->vol, *stack, fd, o);
      }
    }
    return Error::io(ENOENT, "cannot read the clones made for the export in the image of " + mnt);
  };
  auto r = run();
  cleanup();
  return r;
}

Json export_json(const std::string& branch, TreeId id, const io::ExportStats& s, const io::ExportOptions& o,
                 const std::string& output) {
  Json ref = Json::object();
  model::put_name(ref, "branch", branch);
  if (id.v) ref["id"] = id.v;
  Json j = Json::object();
  j["branch"] = ref;
  j["format"] = o.format == io::ExportFormat::Tar ? "tar" : "oci-layer";
  j["compression"] = compress_name(o.compress);
  model::put_name(j, "output", output);
  put_counts(j, s);
  j["bytes"] = s.bytes;
  j["skipped"] = s.skipped;
  return j;
}

}  // namespace

int cmd_export(const std::vector<std::string>& args) {
  int rc = 0;
  const auto p = parse_io_args(args, 2, kExportUsage, {"-o", "--output", "--format", "--compress"}, {"--json"}, rc);
  if (!p) return rc;
  auto has = [&](const char* o) { return p->has(o); };
  const std::string& where = p->pos(0);
  const std::string& branch = p->pos(1);
  const std::string output = has("-o") ? p->p.opt.at("-o") : has("--output") ? p->p.opt.at("--output") : "-";
  io::ExportOptions o;
  if (!p->value("--format", io::parse_export_format, o.format, rc)) return rc;
  if (!p->value("--compress", io::parse_compress, o.compress, rc)) return rc;
  if (!has("--compress") && (ends_with(output, ".gz") || ends_with(output, ".tgz"))) o.compress = io::Compress::Gzip;
  if (!has("--compress") && (ends_with(output, ".zst") || ends_with(output, ".tzst"))) o.compress = io::Compress::Zstd;
  const bool json = has("--json");
  if (output == "-" && json) return usage_error("--json needs -o FILE: the archive goes to standard output");
  if (output == "-" && ::isatty(1))
    return usage_error("refusing to write an archive to a terminal: give -o FILE or redirect standard output");
  std::vector<std::string> notes;
  o.note = [&](const std::string& n) { notes.push_back(n); };
  OutputFile out;
  const bool mounted = is_directory(where);
  Result<io::ExportStats> r = Error::invalid("");
  TreeId id{0};
  std::optional<Opened> opened;
  if (!mounted) {
    auto op = open_volume(where, false);
    if (!op) return fail_on(where, op.error());
    opened = std::move(*op);
    auto b = find_branch(*opened->vol, branch);
    if (!b) return fail(b.error().message());
    id = b->tree;
  }
  if (auto op = out.open(output); !op) return fail(op.error().message());
  {  // the progress line goes before anything else is printed
    Progress prog("exporting " + shown(branch), 0, Progress::Unit::Bytes);
    o.progress = [&](const io::ExportStats& s) { prog.update(s.bytes); };
    r = mounted ? export_mounted(where, branch, out.fd, o, id) : io::export_branch(*opened->vol, id, out.fd, o);
    if (r && prog.shown()) prog.finish();
  }
  for (const auto& n : notes) std::fprintf(stderr, "%s: %s\n", kProg, n.c_str());
  if (!r) return mounted ? fail(where + ": " + r.error().message()) : fail_on(where, r.error());
  if (auto c = out.commit(); !c) return fail(c.error().message());
  if (json) print_json(export_json(branch, id, *r, o, output));
  return 0;
}

}  // namespace plyfs::ctl
