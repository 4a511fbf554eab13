// plyctl send and receive (format.md#send-stream): a branch written as a
// stream, whole or as the difference from a parent snapshot, and a stream
// made a new read-only branch of another image. On a mount point, or the
// path of a mounted image, the mount's daemon does the work (control
// requests `send` and `receive`: it takes this process's descriptor of the
// stream, fuse/stream.cpp); otherwise the image is opened here.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "cli.h"
#include "fs/send.h"
#include "io_cmd.h"
#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "union/view.h"
#include "util/parse.h"
#include "util/progress.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

constexpr const char* kSendUsage =
    "usage: plyctl send IMAGE|MOUNTPOINT BRANCH [--parent SNAPSHOT] [-o FILE|-] [--compress zstd[:N]|none] [--json]";
constexpr const char* kReceiveUsage = "usage: plyctl receive IMAGE|MOUNTPOINT [-f FILE|-] [--name NAME] [--json]";

// --compress: "none" (0), "zstd" (level 3) or "zstd:N" (1-19).
Result<int> parse_stream_compress(std::string_view s) {
  if (s == "none") return 0;
  if (s == "zstd") return 3;
  if (s.rfind("zstd:", 0) == 0) {
    const std::string n(s.substr(5));
    if (!n.empty() && n.size() <= 2 && n.find_first_not_of("0123456789") == std::string::npos) {
      const int l = std::stoi(n);
      if (l >= 1 && l <= 19) return l;
    }
  }
  return Error::invalid("invalid --compress \"" + shown(s) + "\": zstd, zstd:N (N 1 to 19) or none");
}

std::string text_counts(uint64_t items, uint64_t deleted, uint64_t extents, uint64_t shared, uint64_t data) {
  std::string s = Progress::count(items) + (items == 1 ? " item" : " items");
  if (deleted) s += ", " + Progress::count(deleted) + " removed";
  s += ", " + Progress::count(extents) + (extents == 1 ? " extent" : " extents") + " of data (" +
       format_size(data) + ")";
  if (shared) s += ", " + Progress::count(shared) + " shared";
  return s;
}

}  // namespace

int cmd_send(const std::vector<std::string>& args) {
  int rc = 0;
  const auto p = parse_io_args(args, 2, kSendUsage, {"-o", "--output", "--parent", "--compress"}, {"--json"}, rc);
  if (!p) return rc;
  auto has = [&](const char* o) { return p->has(o); };
  const std::string& where = p->pos(0);
  const std::string& branch = p->pos(1);
  const std::string output = has("-o") ? p->p.opt.at("-o") : has("--output") ? p->p.opt.at("--output") : "-";
  int level = 0;
  if (!p->value("--compress", parse_stream_compress, level, rc)) return rc;
  const bool json = has("--json");
  if (output == "-" && json) return usage_error("--json needs -o FILE: the stream goes to standard output");
  if (output == "-" && ::isatty(1))
    return usage_error("refusing to write a stream to a terminal: give -o FILE or redirect standard output");
  auto target = open_target(where, false);
  if (!target) return fail_on(where, target.error());
  OutputFile out;
  model::Json result;
  if (target->mnt.empty()) {
    Volume& v = *target->o.vol;
    auto b = find_branch(v, branch);
    if (!b) return fail(b.error().message());
    SendOptions o;
    o.zstd_level = level;
    std::optional<BranchMeta> parent;
    if (has("--parent")) {
      auto par = find_branch(v, p->p.opt.at("--parent"));
      if (!par) return fail(par.error().message());
      parent = *par;
      o.parent = par->tree;
    }
    if (auto op = out.open(output); !op) return fail(op.error().message());
    Result<SendStats> r = Error::invalid("");
    {
      Progress prog("sending " + shown(branch), 0, Progress::Unit::Bytes);
      o.progress = [&](const SendStats& s) { prog.update(s.stream_bytes, s.fraction); };
      r = send_branch(v, b->tree, out.fd, o);
      if (r && prog.shown()) prog.finish();
    }
    if (!r) return fail_on(where, r.error());
    auto bs = model::Branches::read(v);
    if (!bs) return fail_on(where, bs.error());
    result = model::sent(*bs, *b, parent, *r, output, level);
  } else {
    sync_mount(target->mnt);  // what the kernel holds for the mount reaches the branch first
    if (auto op = out.open(output); !op) return fail(op.error().message());
    model::Json req = {{"command", "send"}};
    model::put_name(req, "branch", branch);
    if (has("--parent")) model::put_name(req, "parent", p->p.opt.at("--parent"));
    req["zstd"] = level;
    req["fd"] = out.fd;
    model::put_name(req, "output", output);
    Progress prog("sending " + shown(branch), 0, Progress::Unit::Bytes);
    auto r = request(target->mnt, req, nullptr, &prog);
    if (!r) return fail(target->mnt + ": " + r.error().message());
    result = std::move(*r);
  }
  if (auto c = out.commit(); !c) return fail(c.error().message());
  if (json) print_json(result);
  return 0;
}

int cmd_receive(const std::vector<std::string>& args) {
  int rc = 0;
  const auto p = parse_io_args(args, 1, kReceiveUsage, {"-f", "--file", "--name"}, {"--json"}, rc);
  if (!p) return rc;
  auto has = [&](const char* o) { return p->has(o); };
  const std::string& where = p->pos(0);
  const std::string input = has("-f") ? p->p.opt.at("-f") : has("--file") ? p->p.opt.at("--file") : "-";
  std::string name;
  if (has("--name")) {
    name = p->p.opt.at("--name");
    if (auto n = check_branch_name(name); !n) return fail(n.error().message());
  }
  int fd = 0;
  if (input == "-") {
    if (::isatty(0))
      return usage_error("refusing to read a stream from a terminal: give -f FILE or redirect standard input");
  } else {
    fd = ::open(input.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(Error::sys(errno, "cannot open " + input).message());
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd > 0) ::close(fd);
    }
  } closer{fd};
  struct stat st;
  const uint64_t total = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? uint64_t(st.st_size) : 0;
  auto target = open_target(where, true);
  if (!target) return fail_on(where, target.error());
  model::Json result;
  if (target->mnt.empty()) {
    Volume& v = *target->o.vol;
    ReceiveOptions o;
    o.name = name;
    o.check_name = [](const std::string& n) { return check_branch_name(n); };
    Result<Received> r = Error::invalid("");
    {
      Progress prog("receiving", total, Progress::Unit::Bytes);
      o.progress = [&](const ReceiveStats& s) { prog.update(s.stream_bytes); };
      r = receive_branch(v, fd, o);
      if (r && prog.shown()) prog.finish();
    }
    if (!r) {
      (void)v.close();  // what the failed receive made is dropped: its space back now
      return fail_on(where, r.error());
    }
    auto bs = model::Branches::read(v);
    if (!bs) return fail_on(where, bs.error());
    result = model::received(*bs, *r);
    if (auto c = v.close(); !c) return fail_on(where, c.error());
  } else {
    model::Json req = {{"command", "receive"}};
    if (!name.empty()) model::put_name(req, "name", name);
    req["fd"] = fd;
    Progress prog("receiving", total, Progress::Unit::Bytes);
    auto r = request(target->mnt, req, nullptr, &prog);
    if (!r) return fail(target->mnt + ": " + r.error().message());
    result = std::move(*r);
  }
  if (has("--json")) {
    print_json(result);
    return 0;
  }
  const auto& b = result["branch"];
  std::printf("received %s (id %llu)%s: %s\n", in_quotes(b["name"].get<std::string>()).c_str(),
              (unsigned long long)b["id"].get<uint64_t>(),
              result["parent"].is_null()
                  ? ""
                  : (" on " + in_quotes(result["parent"]["name"].get<std::string>())).c_str(),
              text_counts(result["items"].get<uint64_t>(), result["deleted"].get<uint64_t>(),
                          result["extents"].get<uint64_t>(), result["shared"].get<uint64_t>(),
                          result["data_bytes"].get<uint64_t>())
                  .c_str());
  return 0;
}

}  // namespace plyfs::ctl
