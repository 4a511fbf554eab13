// The daemon's end of the control channel (control.h): the ioctl on the
// mount point, the requests it carries (the stack commands, the branch
// lifecycle, clone and delete) and the diffs it pages out.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "control.h"
#include "daemon.h"
#include "snap/snap.h"

namespace plyfs::daemon {

namespace {

// Diffs of the mount's branches, paged out through the control channel
// (control.h): a diff's whole text waits under a random token until its
// last chunk is read or it is closed. A client that dies leaves its text
// behind, so at most kMax texts wait, of at most kMaxBytes in all: a new
// diff pushes out the oldest, whose reader then gets ENOENT. Under ctl_mu.
struct PendingDiffs {
  static constexpr size_t kMax = 4;
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  static constexpr size_t kChunk = sizeof(ControlMsg::answer) - 1;
  struct Text {
    std::string token, text;
  };
  std::deque<Text> q;  // oldest first
  std::mt19937_64 rng{std::random_device{}()};
};
PendingDiffs pending;

// `diff FROM TO [json]`: the text plyctl prints offline (format_diff), of
// a durable generation: the commit and the diff run while no operation
// does, so the diff holds every change that finished before it.
Result<std::string> start_diff(const std::string& from, const std::string& to, const std::string& json) {
  if (!json.empty() && json != "json") return Error::invalid("diff takes json or nothing, not \"" + json + "\"");
  const BranchMeta a = PLY_TRY(find_branch(*g->vol, from));
  const BranchMeta b = PLY_TRY(find_branch(*g->vol, to));
  std::string text;
  PLY_CHECK(g->u->hold_still([&]() -> Result<void> {
    if (!g->read_only) PLY_CHECK(g->vol->commit());
    text = format_diff(PLY_TRY(diff(*g->vol, a.tree, b.tree)), !json.empty());
    return ok();
  }));
  if (text.size() > PendingDiffs::kMaxBytes)
    return Error::io(EFBIG, "the diff is too large to send from the mount (" + std::to_string(text.size()) +
                                " bytes): diff the image unmounted");
  size_t held = text.size();
  for (const auto& t : pending.q) held += t.text.size();
  while (!pending.q.empty() && (pending.q.size() >= PendingDiffs::kMax || held > PendingDiffs::kMaxBytes)) {
    held -= pending.q.front().text.size();
    pending.q.pop_front();
  }
  char token[17];
  std::snprintf(token, sizeof token, "%016llx", (unsigned long long)pending.rng());
  const std::string answer = std::string(token) + " " + std::to_string(text.size());
  if (!text.empty()) pending.q.push_back({token, std::move(text)});  // no read would free it
  return answer;
}

// `read TOKEN OFFSET` and `close TOKEN`; the read that reaches the end frees the text.
Result<std::string> page_diff(const std::string& cmd, const std::string& token, const std::string& offset) {
  auto it = std::find_if(pending.q.begin(), pending.q.end(), [&](const auto& t) { return t.token == token; });
  if (it == pending.q.end())
    return Error::io(ENOENT, "no diff waits under \"" + token + "\" (read to its end, closed, or pushed out by newer ones)");
  if (cmd == "close") {
    pending.q.erase(it);
    return std::string("closed");
  }
  char* end = nullptr;
  const unsigned long long off = std::strtoull(offset.c_str(), &end, 10);
  if (offset.empty() || *end || off > it->text.size())
    return Error::invalid("offset must be 0 to " + std::to_string(it->text.size()) + ", not \"" + offset + "\"");
  std::string chunk = it->text.substr(size_t(off), PendingDiffs::kChunk);
  if (off + chunk.size() >= it->text.size()) pending.q.erase(it);
  return chunk;
}

}  // namespace

// Runs one control request; the answer is the stack afterwards.
Result<std::string> control(const std::string& request, bool may_change) {
  std::istringstream in(request);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  static const std::map<std::string, std::pair<size_t, size_t>> kArity = {
      {"list", {1, 1}}, {"add", {3, 4}},      {"remove", {2, 2}}, {"set", {3, 3}},
      {"move", {3, 3}}, {"snapshot", {1, 2}}, {"merge", {2, 2}},  {"rollback", {2, 2}},
      {"clone", {3, 4}}, {"delete", {2, 2}},  {"diff", {3, 4}},     {"read", {3, 3}},
      {"close", {2, 2}}};
  auto ar = kArity.find(w.empty() ? "" : w[0]);
  if (ar == kArity.end())
    return Error::invalid("unknown command \"" + request +
                          "\" (list, add, remove, set, move, snapshot, merge, rollback, clone, delete, diff, read, close)");
  if (w.size() < ar->second.first || w.size() > ar->second.second)
    return Error::invalid("wrong number of words in \"" + request + "\"");
  w.resize(4);
  const std::string &cmd = w[0], &name = w[1], &arg = w[2];
  std::lock_guard lk(g->ctl_mu);
  if (cmd == "list") return format_stack(*g->vol, g->stack);
  // A diff names files in directories the caller may not be allowed to
  // list, and pauses every operation while it runs: root or the owner only.
  if (!may_change)
    return Error::io(EPERM, cmd == "diff" || cmd == "read" || cmd == "close"
                                ? "only root or the mount's owner may diff branches"
                                : "only root or the mount's owner may change branches");
  if (cmd == "diff") return start_diff(name, arg, w[3]);
  if (cmd == "read" || cmd == "close") return page_diff(cmd, name, arg);
  if (cmd == "snapshot" || cmd == "merge" || cmd == "rollback") return lifecycle(cmd, name);
  if (cmd == "clone" || cmd == "delete") {
    if (g->read_only) return Error::io(EROFS, "the mount is read-only");
    BranchMeta b = PLY_TRY(find_branch(*g->vol, name));
    if (cmd == "clone") {
      // Each operation is one transaction: a clone between two is whole.
      if (!w[3].empty() && w[3] != "ro") return Error::invalid("clone mode must be ro, not \"" + w[3] + "\"");
      BranchMeta c = PLY_TRY(clone_branch(*g->vol, b.tree, arg, w[3] == "ro"));
      return "cloned \"" + b.name + "\" as \"" + c.name + "\"";
    }
    // A branch this mount has shown may still be in use by an operation
    // that began before it left the stack: it goes after the unmount.
    if (g->branches.count(b.tree.v))
      return Error::io(EBUSY, "this mount has shown \"" + b.name + "\"; delete it after unmounting");
    PLY_CHECK(delete_branch(*g->vol, b.tree));
    return "deleted \"" + b.name + "\"";
  }
  auto mode = [&](const std::string& m) -> Result<bool> {
    if (m == "rw" || m == "ro") return m == "rw";
    return Error::invalid("mode must be rw or ro, not \"" + m + "\"");
  };
  auto position = [](const std::string& p, size_t max) -> Result<size_t> {
    char* end = nullptr;
    unsigned long v = std::strtoul(p.c_str(), &end, 10);
    if (p.empty() || *end || v > max)
      return Error::invalid("position must be 0 to " + std::to_string(max) + ", not \"" + p + "\"");
    return size_t(v);
  };
  BranchMeta b = PLY_TRY(find_branch(*g->vol, name));
  std::vector<ViewLayer> next = g->stack;
  auto at = std::find_if(next.begin(), next.end(), [&](const ViewLayer& l) { return l.tree == b.tree; });
  const bool in_stack = at != next.end();
  if (cmd == "add") {
    if (in_stack) return Error::io(EEXIST, "branch \"" + b.name + "\" is in the stack already");
    const size_t p = PLY_TRY(position(arg, next.size()));
    next.insert(next.begin() + long(p), ViewLayer{b.tree, PLY_TRY(mode(w[3].empty() ? "rw" : w[3]))});
  } else if (cmd == "remove") {
    if (!in_stack) return Error::io(ENOENT, "branch \"" + b.name + "\" is not in the stack");
    if (next.size() == 1) return Error::io(EBUSY, "the stack's last branch cannot go");
    next.erase(at);
  } else if (cmd == "set") {
    if (!in_stack) return Error::io(ENOENT, "branch \"" + b.name + "\" is not in the stack");
    at->writable = PLY_TRY(mode(arg));
  } else if (cmd == "move") {
    if (!in_stack) return Error::io(ENOENT, "branch \"" + b.name + "\" is not in the stack");
    const size_t p = PLY_TRY(position(arg, next.size() - 1));
    ViewLayer l = *at;
    next.erase(at);
    next.insert(next.begin() + long(p), l);
  } else {
    return Error::invalid("unknown command \"" + cmd + "\" (list, add, remove, set, move)");
  }
  if (g->read_only)
    for (const auto& l : next)
      if (l.writable) return Error::io(EROFS, "the mount is read-only");
  PLY_CHECK(check_stack(*g->vol, next));
  PLY_CHECK(g->u->restack(PLY_TRY(union_branches(next))));
  g->stack = next;
  invalidate_all();
  return format_stack(*g->vol, g->stack);
}

void op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void*, fuse_file_info*,
              unsigned flags, const void* in_buf, size_t in_size, size_t out_size) {
  if (cmd != kControlIoctl) return (void)fuse_reply_err(req, ENOTTY);
  if (flags & FUSE_IOCTL_COMPAT) return (void)fuse_reply_err(req, ENOSYS);
  if (ino != FUSE_ROOT_ID) return (void)fuse_reply_err(req, ENOTTY);  // the mount point only
  if (in_size < sizeof(ControlMsg) || out_size < sizeof(ControlMsg))
    return (void)fuse_reply_err(req, EINVAL);
  ControlMsg m;
  std::memcpy(&m, in_buf, sizeof m);
  if (m.version != kControlVersion) return (void)fuse_reply_err(req, EPROTO);
  m.request[sizeof m.request - 1] = 0;
  const uid_t uid = fuse_req_ctx(req)->uid;
  auto r = control(m.request, uid == 0 || uid == ::getuid());
  const std::string text = r ? *r : r.error().reason;  // plyctl adds strerror
  m.status = r ? 0 : errno_of(r.error());
  std::snprintf(m.answer, sizeof m.answer, "%s", text.c_str());
  fuse_reply_ioctl(req, 0, &m, sizeof m);
}

}  // namespace plyfs::daemon
