// plyctl snapshot, clone, merge, rollback, delete and diff, on an image or
// a mount point (format.md#snapshots).
#include "cli.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "fs/fs.h"
#include "mount_client.h"
#include "snap/snap.h"
#include "union/view.h"
#include "util/json.h"

namespace plyfs::ctl {

namespace {

// Sends a lifecycle request to a mount after flushing what the kernel
// holds, so that a snapshot holds every write made before the command.
int mounted_request(const std::string& mnt, const std::string& req, bool json) {
  for (char c : req)
    if (c == '\n' || c == '\t') return usage_error("names cannot hold a newline or tab");
  // The request is words: a name with a space would split (fuse/control.h).
  if (std::count(req.begin(), req.end(), ' ') + 1 > (req.rfind("clone ", 0) == 0 ? 4 : 2))
    return usage_error("on a mount point, branch names cannot hold spaces");
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)::syscall(SYS_syncfs, fd);
    ::close(fd);
  }
  auto r = control(mnt, req);
  if (!r) return fail(r.error().message());
  const bool stack = req.rfind("clone", 0) != 0 && req.rfind("delete", 0) != 0;
  if (json) std::printf("{\"%s\": %s}\n", stack ? "stack" : "result", json_quote(*r).c_str());
  else std::printf("%s\n", r->c_str());
  return 0;
}

// A diff from a mount's daemon, paged (fuse/control.h): "diff" leaves the
// whole text with the daemon under a token, and "read"s fetch it a chunk at
// a time, the last one freeing it. The daemon formats it with format_diff,
// as the offline diff below, so both print the same bytes.
int mounted_diff(const std::string& mnt, const std::string& from, const std::string& to, bool json) {
  for (const auto& n : {from, to})
    if (n.find_first_of(" \t\n") != std::string::npos)
      return usage_error("on a mount point, branch names cannot hold spaces");
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {  // what the kernel holds lands first, as for a snapshot
    (void)::syscall(SYS_syncfs, fd);
    ::close(fd);
  }
  auto r = control(mnt, "diff " + from + " " + to + (json ? " json" : ""));
  if (!r) return fail(r.error().message());
  std::istringstream in(*r);
  std::string token;
  unsigned long long size = 0;
  if (!(in >> token >> size)) return fail(mnt + ": unexpected answer to diff: \"" + *r + "\"");
  for (unsigned long long off = 0; off < size;) {
    auto c = control(mnt, "read " + token + " " + std::to_string(off));
    if (!c) return fail(c.error().message());
    if (c->empty()) return fail(mnt + ": the diff ended early, at byte " + std::to_string(off));
    std::fwrite(c->data(), 1, c->size(), stdout);
    off += c->size();
  }
  return 0;
}

std::string branch_json(const BranchMeta& b) {
  return "{\"name\": " + json_quote(b.name) + ", \"id\": " + std::to_string(b.tree.v) +
         ", \"read_only\": " + (b.read_only ? "true" : "false") + "}";
}

}  // namespace

int cmd_lifecycle(const std::string& cmd, const std::vector<std::string>& args) {
  auto p = parse(args, {"--view", "--name"}, {"--json", "--ro"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  const bool json = has("--json");
  static const std::map<std::string, std::pair<std::string, size_t>> kUsage = {
      {"snapshot", {"snapshot IMAGE|MOUNTPOINT [--view V] [--name SNAP] [--json]", 1}},
      {"clone", {"clone IMAGE|MOUNTPOINT SRC NAME [--ro] [--json]", 3}},
      {"merge", {"merge IMAGE|MOUNTPOINT BRANCH [--json]", 2}},
      {"rollback", {"rollback IMAGE|MOUNTPOINT BRANCH [--json]", 2}},
      {"delete", {"delete IMAGE|MOUNTPOINT BRANCH", 2}},
      {"diff", {"diff IMAGE|MOUNTPOINT FROM TO [--json]", 3}}};
  const auto& [use, npos] = kUsage.at(cmd);
  if (pos.size() != npos || (has("--view") && cmd != "snapshot") || (has("--name") && cmd != "snapshot") ||
      (has("--ro") && cmd != "clone"))
    return usage_error("usage: plyctl " + use);
  if (is_directory(pos[0])) {
    if (cmd == "snapshot") {
      if (has("--view")) return usage_error("--view is for an image: a mount snapshots its own stack");
      return mounted_request(pos[0], "snapshot" + (has("--name") ? " " + p->opt.at("--name") : std::string()), json);
    }
    if (cmd == "merge" || cmd == "rollback" || cmd == "delete")
      return mounted_request(pos[0], cmd + " " + pos[1], json);
    if (cmd == "clone") return mounted_request(pos[0], "clone " + pos[1] + " " + pos[2] + (has("--ro") ? " ro" : ""), json);
    return mounted_diff(pos[0], pos[1], pos[2], json);
  }
  auto o = open_volume(pos[0], cmd != "diff");
  if (!o) return fail(pos[0] + ": " + o.error().message());
  Volume& v = *o->vol;
  auto branch = [&](const std::string& name) { return find_branch(v, name); };
  if (cmd == "snapshot") {
    auto stack = has("--view") ? view_stack(v, p->opt.at("--view")) : default_stack(v);
    if (!stack) return fail(stack.error().message());
    std::string name;
    if (has("--name")) {
      name = p->opt.at("--name");
    } else {
      auto top = std::find_if(stack->begin(), stack->end(), [](const ViewLayer& l) { return l.writable; });
      auto b = top == stack->end() ? Result<BranchMeta>(Error::io(EROFS, "the stack has no writable branch"))
                                   : Filesystem::branch(v, top->tree);
      if (!b) return fail(b.error().message());
      auto n = snapshot_name(v, b->name);
      if (!n) return fail(n.error().message());
      name = *n;
    }
    auto s = snapshot(v, *stack, name);
    if (!s) return fail(s.error().message());
    if (auto c = v.close(); !c) return fail(c.error().message());
    if (json)
      std::printf("{\"snapshot\": %s, \"live\": %s, \"stack\": %s}\n", branch_json(s->frozen).c_str(),
                  branch_json(s->live).c_str(), json_quote(format_stack(v, s->stack)).c_str());
    else
      std::printf("snapshot \"%s\" taken; \"%s\" is a new layer on it (%s)\n", s->frozen.name.c_str(),
                  s->live.name.c_str(), format_stack(v, s->stack).c_str());
    return 0;
  }
  if (cmd == "clone") {
    auto src = branch(pos[1]);
    if (!src) return fail(src.error().message());
    auto c = clone_branch(v, src->tree, pos[2], has("--ro"));
    if (!c) return fail(c.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    if (json) std::printf("%s\n", branch_json(*c).c_str());
    else std::printf("cloned \"%s\" as \"%s\" (id %llu)\n", src->name.c_str(), c->name.c_str(), (unsigned long long)c->tree.v);
    return 0;
  }
  if (cmd == "merge") {
    auto b = branch(pos[1]);
    if (!b) return fail(b.error().message());
    const bool tty = isatty(2);
    auto m = merge(v, b->tree, nullptr, [&](const MergeStats& st) {
      if (tty) std::fprintf(stderr, "\rmerging: %llu entries, %llu objects", (unsigned long long)st.entries,
                            (unsigned long long)st.objects);
    });
    if (tty) std::fprintf(stderr, "\n");
    if (!m) return fail(m.error().message());
    bool shown = false;
    auto dropped = drop_doomed(v, [&](const BTree::DropStats& st) {
      if (tty) std::fprintf(stderr, "\rfreeing the merged branches: %llu nodes, %llu extents",
                            (unsigned long long)st.nodes, (unsigned long long)st.extents);
      shown = tty;
    });
    if (shown) std::fprintf(stderr, "\n");
    if (!dropped) return fail(dropped.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    if (json)
      std::printf("{\"merged\": %s, \"entries\": %llu, \"objects\": %llu, \"removed\": %llu}\n",
                  branch_json(m->merged).c_str(), (unsigned long long)m->stats.entries,
                  (unsigned long long)m->stats.objects, (unsigned long long)m->stats.removed);
    else
      std::printf("merged \"%s\" into the branch below it: %llu entries, %llu objects, %llu names removed\n",
                  m->merged.name.c_str(), (unsigned long long)m->stats.entries,
                  (unsigned long long)m->stats.objects, (unsigned long long)m->stats.removed);
    return 0;
  }
  if (cmd == "rollback" || cmd == "delete") {
    auto b = branch(pos[1]);
    if (!b) return fail(b.error().message());
    // Freeing a large tree is one long transaction: on a terminal, as for a
    // merge, what it freed so far.
    const bool tty = isatty(2);
    bool shown = false;
    auto progress = [&](const BTree::DropStats& st) {
      if (!tty) return;
      std::fprintf(stderr, "\rfreeing: %llu nodes, %llu extents", (unsigned long long)st.nodes,
                   (unsigned long long)st.extents);
      shown = true;
    };
    if (cmd == "rollback") {
      auto r = rollback(v, b->tree);
      if (!r) return fail(r.error().message());
    } else if (auto r = delete_branch(v, b->tree, progress); !r) {
      if (shown) std::fprintf(stderr, "\n");
      return fail(r.error().message());
    }
    auto dropped = drop_doomed(v, progress);  // a rollback's old layer
    if (shown) std::fprintf(stderr, "\n");
    if (!dropped) return fail(dropped.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    if (json) std::printf("{\"%s\": %s}\n", cmd == "rollback" ? "rolled_back" : "deleted", json_quote(b->name).c_str());
    else std::printf("%s \"%s\"\n", cmd == "rollback" ? "rolled back" : "deleted", b->name.c_str());
    return 0;
  }
  // diff
  auto a = branch(pos[1]);
  if (!a) return fail(a.error().message());
  auto b = branch(pos[2]);
  if (!b) return fail(b.error().message());
  auto d = diff(v, a->tree, b->tree);
  if (!d) return fail(d.error().message());
  const std::string text = format_diff(*d, json);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace plyfs::ctl
