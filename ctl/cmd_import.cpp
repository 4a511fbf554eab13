// plyctl import: a directory, tarball, OCI layer or image, or ext4 image as a
// new branch of an unmounted image (lib/io, io.h). Progress on a terminal;
// the result as text or as an Import object (plyctl.8, JSON SCHEMA).
#include <cstdio>

#include "cli.h"
#include "io/io.h"
#include "io_cmd.h"
#include "output.h"
#include "snap/model.h"
#include "util/parse.h"
#include "util/progress.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

constexpr const char* kImportUsage =
    "usage: plyctl import IMAGE BRANCH SOURCE [--parent P] [--format dir|tar|oci-layer|oci|ext4] [--ro] [--force] "
    "[--json]";

Json import_json(const model::Branches& bs, const io::Imported& r, const std::string& source) {
  const io::ImportStats& s = r.stats;
  Json layers = Json::array();
  for (const auto& b : r.branches) layers.push_back(bs.branch(*bs.find(b.tree)));
  Json o = Json::object();
  o["branch"] = layers.back();
  o["layers"] = layers;
  o["format"] = io::format_name(r.format);
  model::put_name(o, "source", source);
  put_counts(o, s);
  o["xattrs"] = s.xattrs;
  o["bytes"] = s.bytes;
  return o;
}

}  // namespace

int cmd_import(const std::vector<std::string>& args) {
  int rc = 0;
  const auto p = parse_io_args(args, 3, kImportUsage, {"--parent", "--format"}, {"--json", "--ro", "--force"}, rc);
  if (!p) return rc;
  auto has = [&](const char* o) { return p->has(o); };
  const std::string& image = p->pos(0);
  const std::string& name = p->pos(1);
  const std::string& source = p->pos(2);
  io::ImportOptions o;
  if (!p->value("--format", io::parse_format, o.format, rc)) return rc;
  if (is_directory(image))
    return need_image("import", image, "unmount it first: import writes to the image, never through a mount");
  if (auto n = check_branch_name(name); !n) return fail(n.error().message());
  auto opened = open_volume(image, true);
  if (!opened) return fail_on(image, opened.error());
  Volume& v = *opened->vol;
  if (has("--parent")) {
    auto par = find_branch(v, p->p.opt.at("--parent"));
    if (!par) return fail(par.error().message());
    o.parent = par->tree;
  }
  o.name = name;
  o.read_only = has("--ro");
  o.force = has("--force");
  std::vector<std::string> notes;
  o.note = [&](const std::string& n) { notes.push_back(n); };
  Result<io::Imported> r = Error::invalid("");
  {  // the progress line goes before anything else is printed
    Progress prog("importing " + shown(source), 0, Progress::Unit::Bytes);
    // Only on a terminal: a directory source walks itself once more to know its size.
    if (prog.shown())
      o.progress = [&](const io::ImportStats& s) {
        prog.set_total(s.total_bytes);
        prog.update(s.read_bytes);
      };
    r = io::import(v, source, o);
    if (r && prog.shown()) prog.finish();
  }
  for (const auto& n : notes) std::fprintf(stderr, "%s: %s\n", kProg, n.c_str());
  if (!r) {
    (void)v.close();  // the failed import's trees are dropped: their space back now
    return fail_on(image, r.error());
  }
  auto bs = model::Branches::read(v);
  if (!bs) return fail_on(image, bs.error());
  const Json out = import_json(*bs, *r, source);
  if (auto c = v.close(); !c) return fail_on(image, c.error());
  if (has("--json")) {
    print_json(out);
    return 0;
  }
  const io::ImportStats& s = r->stats;
  const BranchMeta& top = r->branches.back();
  std::string chain;
  if (r->branches.size() > 1) {
    chain = ", the top of ";
    chain += std::to_string(r->branches.size());
    chain += " layers";
  }
  std::printf("imported %s (%s) as %s (id %llu%s): %s files, %s directories, %s symlinks, %s other files, %s hard links, %s of data",
              in_quotes(source).c_str(), io::format_name(r->format), in_quotes(top.name).c_str(),
              (unsigned long long)top.tree.v,
              chain.c_str(),
              Progress::count(s.files).c_str(), Progress::count(s.dirs).c_str(), Progress::count(s.symlinks).c_str(),
              Progress::count(s.specials).c_str(), Progress::count(s.hardlinks).c_str(), format_size(s.bytes).c_str());
  if (s.whiteouts || s.opaque)
    std::printf(", %s whiteouts, %s opaque directories", Progress::count(s.whiteouts).c_str(),
                Progress::count(s.opaque).c_str());
  std::printf("\n");
  return 0;
}

}  // namespace plyfs::ctl
