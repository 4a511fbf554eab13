// The daemon's end of the control channel (control.h): the ioctl on the
// mount point, the JSON requests it carries (the stack commands, the branch
// lifecycle, clone, delete and diff) and the answers it pages out.
#include <linux/fs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "control.h"
#include "daemon.h"
#include "snap/model.h"
#include "util/text.h"

namespace plyfs::daemon {

using model::Json;

namespace {

// Answers too long for the answer field, paged out (control.h): a text
// waits under a random token until its last byte is read or it is closed.
// A client that dies leaves its text behind, so at most kMax texts wait, of
// at most kMaxBytes in all: a new one pushes out the oldest, whose reader
// then gets ENOENT. Under mu, a leaf lock.
struct Pending {
  static constexpr size_t kMax = 4;
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  static constexpr size_t kChunk = sizeof(ControlMsg::answer) - 1;
  struct Text {
    std::string token, text;
  };
  std::mutex mu;
  std::deque<Text> q;  // oldest first
  std::mt19937_64 rng{std::random_device{}()};
};
Pending pending;

// Keeps `text` and returns the answer that names it.
Result<std::string> page_out(std::string text) {
  if (text.size() > Pending::kMaxBytes)
    return Error::io(EFBIG, "the answer is too large to send from the mount (" + std::to_string(text.size()) +
                                " bytes): run the command on the image unmounted");
  std::lock_guard lk(pending.mu);
  size_t held = text.size();
  for (const auto& t : pending.q) held += t.text.size();
  while (!pending.q.empty() && (pending.q.size() >= Pending::kMax || held > Pending::kMaxBytes)) {
    held -= pending.q.front().text.size();
    pending.q.pop_front();
  }
  char token[33];
  std::snprintf(token, sizeof token, "%016llx%016llx", (unsigned long long)pending.rng(),
                (unsigned long long)pending.rng());
  Json a = {{"paged", {{"token", token}, {"size", text.size()}}}};
  pending.q.push_back({token, std::move(text)});
  return model::dump(a);
}

// `read` and `close`: raw bytes of a paged text; the read that reaches the
// end frees it.
Result<std::string> page_in(const Json& req, bool close) {
  if (!req.contains("token") || !req["token"].is_string()) return Error::invalid("\"token\" is missing");
  const std::string token = req["token"];
  std::lock_guard lk(pending.mu);
  auto it = std::find_if(pending.q.begin(), pending.q.end(), [&](const auto& t) { return t.token == token; });
  if (it == pending.q.end())
    return Error::io(ENOENT, "no answer waits under \"" + token + "\" (read to its end, closed, or pushed out by newer ones)");
  if (close) {
    pending.q.erase(it);
    return std::string();
  }
  const Json& o = req.contains("offset") ? req["offset"] : Json();
  if (!o.is_number_unsigned() || o.get<uint64_t>() > it->text.size())
    return Error::invalid("\"offset\" must be 0 to " + std::to_string(it->text.size()));
  const size_t off = o.get<size_t>();
  std::string chunk = it->text.substr(off, Pending::kChunk);
  if (off + chunk.size() >= it->text.size()) pending.q.erase(it);
  return chunk;
}

// The long operation running (RunningOp, daemon.h), for `progress`. Under
// mu, a leaf lock: `progress` reads it while the operation holds ctl_mu,
// which serializes the operations, so at most one runs.
struct Running {
  std::mutex mu;
  bool active = false;
  std::string command, what, noun;
  uint64_t done = 0;
  double fraction = 0;
};
Running running;

// `progress`: answered at once, whatever holds ctl_mu (control.h).
Json progress_answer() {
  std::lock_guard lk(running.mu);
  if (!running.active) return Json{{"result", {{"running", false}}}};
  return Json{{"result",
               {{"running", true},
                {"command", running.command},
                {"what", lossy_utf8(running.what)},
                {"done", running.done},
                {"unit", running.noun},
                {"fraction", running.fraction}}}};
}

}  // namespace

// A request's arguments (daemon.h).
Result<BranchMeta> arg_branch(const Json& req, const std::string& key) {
  if (req.contains(key) && req[key].is_number_unsigned())
    return find_branch(*g->vol, std::to_string(req[key].get<uint64_t>()));
  return find_branch(*g->vol, PLY_TRY(model::get_name(req, key)));
}

namespace {

Result<bool> arg_bool(const Json& req, const std::string& key, bool dflt) {
  if (!req.contains(key)) return dflt;
  if (!req[key].is_boolean()) return Error::invalid("\"" + key + "\" must be true or false");
  return req[key].get<bool>();
}
Result<size_t> arg_position(const Json& req, size_t max, size_t dflt) {
  if (!req.contains("position")) return dflt;
  const Json& p = req["position"];
  if (!p.is_number_unsigned() || p.get<uint64_t>() > max)
    return Error::invalid("\"position\" must be 0 to " + std::to_string(max));
  return p.get<size_t>();
}

Result<Json> stack_answer() { return PLY_TRY(model::Branches::read(*g->vol)).stack(g->stack); }

// `diff`: the entries of a durable generation: the commit and the diff run
// while no operation does, so the diff holds every change that finished
// before it. The same model::diff as offline, and the same progress.
Result<Json> run_diff(const Json& req) {
  const BranchMeta a = PLY_TRY(arg_branch(req, "from"));
  const BranchMeta b = PLY_TRY(arg_branch(req, "to"));
  Json out;
  std::string what = "comparing ";
  what += shown(a.name);
  what += " and ";
  what += shown(b.name);
  RunningOp op("diff", what, "changes");
  PLY_CHECK(g->u->hold_still([&]() -> Result<void> {
    if (!g->read_only) PLY_CHECK(g->vol->commit());
    out = model::diff(PLY_TRY(diff(*g->vol, a.tree, b.tree,
                                   [&](const DiffStats& st) { op.update(st.entries, st.fraction); })));
    return ok();
  }));
  return out;
}

// `clone` and `delete`: branches the stack does not show (or a copy of one).
Result<Json> clone_or_delete(const std::string& cmd, const Json& req) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  if (cmd == "clone") {
    BranchMeta src = PLY_TRY(arg_branch(req, "source"));
    const std::string name = PLY_TRY(model::get_name(req, "name"));
    // Each operation is one transaction: a clone between two is whole.
    BranchMeta c = PLY_TRY(clone_branch(*g->vol, src.tree, name, !PLY_TRY(arg_bool(req, "writable", true))));
    auto bs = PLY_TRY(model::Branches::read(*g->vol));
    return bs.branch(*bs.find(c.tree));
  }
  return delete_online(PLY_TRY(arg_branch(req, "branch")));
}

// `hold` and `release` (format.md#snapshots, "Holds"): every branch of
// "branches" (an array of {"branch": NAME} or {"branch": ID}) is found
// before any changes, so that a wrong name changes nothing; the answer is
// the branches after, in that order, durable when it returns.
Result<Json> hold_or_release(const std::string& cmd, const Json& req) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  if (!req.contains("branches") || !req["branches"].is_array() || req["branches"].empty())
    return Error::invalid("\"branches\" must be a non-empty array");
  std::vector<BranchMeta> bs;
  for (const Json& one : req["branches"]) bs.push_back(PLY_TRY(arg_branch(one, "branch")));
  for (const auto& b : bs) (void)PLY_TRY(set_held(*g->vol, b.tree, cmd == "hold"));
  PLY_CHECK(g->vol->commit());
  auto all = PLY_TRY(model::Branches::read(*g->vol));
  Json out = Json::array();
  for (const auto& b : bs) out.push_back(all.branch(*all.find(b.tree)));
  return out;
}

// `quota` (format.md#quotas): {"branch": B, "referenced": N, "exclusive":
// N}, each limit optional (kept when absent), 0 removing it; the answer is
// the Branch after, durable when it returns.
Result<Json> quota_answer(const Json& req) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  const BranchMeta b = PLY_TRY(arg_branch(req, "branch"));
  QuotaChange q;
  for (const char* k : {"referenced", "exclusive"}) {
    if (!req.contains(k)) continue;
    if (!req[k].is_number_unsigned()) return Error::invalid(std::string("\"") + k + "\" must be a number of bytes");
    (k[0] == 'r' ? q.referenced : q.exclusive) = req[k].get<uint64_t>();
  }
  if (q.referenced || q.exclusive || !req.contains("compress")) (void)PLY_TRY(set_quota(*g->vol, b.tree, q));
  if (req.contains("compress")) {  // plyctl branch set --compress (format.md#fs-compress)
    if (!req["compress"].is_string()) return Error::invalid("\"compress\" must be a string");
    const std::string z = req["compress"].get<std::string>();
    BranchMeta m = PLY_TRY(Filesystem::branch(*g->vol, b.tree));
    m.compress = z == "default" ? Compression{} : PLY_TRY(parse_compression(z));
    PLY_CHECK(Filesystem::set_branch(*g->vol, m));
  }
  PLY_CHECK(g->vol->commit());
  auto all = PLY_TRY(model::Branches::read(*g->vol));
  return all.branch(*all.find(b.tree));
}

// --- the image's own commands, answered from the mount (issue 24) ----------
// plyctl reads no block of a mounted image: the daemon reuses the blocks a
// generation freed once the next one is durable, so a second reader would
// see torn trees. These answer from the daemon's Volume with the objects
// plyctl prints offline.

// `show`: the Image object of a durable generation, committed and read
// while no operation runs (as `diff`), so that its trees are that
// generation's. A mount that has committed since it opened has written its
// newest superblock into slot G % 2 and the one before into the other
// (format.md#commit, C2): both valid.
Result<Json> show_answer() {
  Json out;
  auto views_held = g->ctl->hold();
  PLY_CHECK(g->u->hold_still([&]() -> Result<void> {
    // A volume an error turned read-only (C5, a bad data checksum) is shown
    // too, as it stands, with its newest durable generation: a look at it
    // is what is wanted then.
    if (!g->read_only && !g->vol->failure()) PLY_CHECK(g->vol->commit());
    const SuperChoice& rec = g->vol->recovery();
    int slot = rec.slot;
    SlotState slots[2] = {rec.reports[0].state, rec.reports[1].state};
    const Generation durable = g->vol->durable_generation();
    if (durable.v != rec.info.generation.v) {
      slot = int(durable.v % 2);
      slots[0] = slots[1] = SlotState::Valid;
    }
    out = PLY_TRY(model::image(*g->vol, slot, slots));
    return ok();
  }));
  return out;
}

// `branches`, `views` and `default`: [Branch], [View] and the Stack a mount
// without -o view= shows.
Result<Json> catalog_answer(const std::string& cmd) {
  auto bs = PLY_TRY(model::Branches::read(*g->vol, cmd == "branches"));
  Json a = Json::array();
  if (cmd == "branches")
    for (const auto& b : bs.all()) a.push_back(bs.branch(b));
  if (cmd == "views")
    for (const auto& w : PLY_TRY(list_views(*g->vol))) a.push_back(bs.view(w));
  if (cmd == "default") a = bs.stack(PLY_TRY(default_stack(*g->vol)));
  return a;
}

// `view-create`, `view-delete` and `view-default`: the View, as plyctl view
// prints it offline; one durable generation each. The mount keeps the stack
// it shows until it is remounted, whatever happens to its view.
Result<Json> view_change(const std::string& cmd, const Json& req) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  const std::string name = PLY_TRY(model::get_name(req, "name"));
  View result;
  if (cmd == "view-create") {
    PLY_CHECK(check_branch_name(name, "view"));
    const std::string spec = PLY_TRY(model::get_name(req, "stack"));
    result = View{name, PLY_TRY(arg_bool(req, "default", false)), PLY_TRY(parse_stack(*g->vol, spec))};
    PLY_CHECK(put_view(*g->vol, result));
  } else {
    auto views = PLY_TRY(list_views(*g->vol));
    auto it = std::find_if(views.begin(), views.end(), [&](const View& w) { return w.name == name; });
    if (it == views.end()) {
      std::string m = "no view named \"";
      m += shown(name);
      m += '"';
      return Error::io(ENOENT, m);
    }
    result = *it;
    if (cmd == "view-delete") {
      PLY_CHECK(delete_view(*g->vol, name));
    } else {
      result.is_default = true;
      PLY_CHECK(put_view(*g->vol, result));
    }
  }
  PLY_CHECK(g->vol->commit());
  return PLY_TRY(model::Branches::read(*g->vol)).view(result);
}

// `sync`: every operation that ended before it durable (what the kernel
// held was flushed by plyctl's syncfs first); the Sync object.
Result<Json> sync_answer() {
  const Generation gen = g->read_only ? g->vol->durable_generation() : PLY_TRY(g->vol->commit());
  return Json{{"generation", gen.v}};
}

// The view a restack with "save" rewrites: the one the mount shows, as
// the catalog holds it now.
Result<View> mounted_view() {
  if (g->view.empty())
    return Error::io(ENOENT, "this mount shows no view (-o branches=, -o layer=, or an image without views): "
                             "save its stack with plyctl view create MOUNTPOINT NAME STACK");
  for (auto& w : PLY_TRY(list_views(*g->vol)))
    if (w.name == g->view) return w;
  std::string m = "view \"";
  m += shown(g->view);
  m += "\", which this mount shows, was deleted: save the stack with plyctl view create MOUNTPOINT NAME STACK";
  return Error::io(ENOENT, m);
}

// `add`, `remove`, `set` and `move`: the stack afterwards; with "save", it
// is written into the mounted view too, in one more generation.
Result<Json> restack(const std::string& cmd, const Json& req) {
  const bool save = PLY_TRY(arg_bool(req, "save", false));
  if (save && g->read_only) return Error::io(EROFS, "the mount is read-only: its view cannot be saved");
  std::optional<View> view;
  if (save) view = PLY_TRY(mounted_view());
  BranchMeta b = PLY_TRY(arg_branch(req, "branch"));
  std::vector<ViewLayer> next = g->stack;
  auto at = std::find_if(next.begin(), next.end(), [&](const ViewLayer& l) { return l.tree == b.tree; });
  const bool in_stack = at != next.end();
  const std::string name = "branch \"" + shown(b.name) + "\"";
  if (cmd != "add" && !in_stack) return Error::io(ENOENT, name + " is not in the stack");
  if (cmd == "add") {
    if (in_stack) return Error::io(EEXIST, name + " is in the stack already");
    const size_t p = PLY_TRY(arg_position(req, next.size(), 0));
    next.insert(next.begin() + long(p), ViewLayer{b.tree, PLY_TRY(arg_bool(req, "writable", true))});
  } else if (cmd == "remove") {
    if (next.size() == 1)
      return Error::io(EBUSY, name + " is the stack's only branch: add another first, or unmount");
    next.erase(at);
  } else if (cmd == "set") {
    if (!req.contains("writable")) return Error::invalid("\"writable\" is missing");
    at->writable = PLY_TRY(arg_bool(req, "writable", true));
  } else {
    const size_t p = PLY_TRY(arg_position(req, next.size() - 1, size_t(at - next.begin())));
    ViewLayer l = *at;
    next.erase(at);
    next.insert(next.begin() + long(p), l);
  }
  if (g->read_only)
    for (const auto& l : next)
      if (l.writable) return Error::io(EROFS, "the mount is read-only");
  PLY_CHECK(check_stack(*g->vol, next));
  PLY_CHECK(g->u->restack(PLY_TRY(union_branches(next))));
  g->stack = next;
  invalidate_all();
  if (view) {
    view->layers = next;
    if (auto r = put_view(*g->vol, *view); !r) {
      std::string m = "the stack changed, but saving it failed: ";
      m += r.error().message();
      return Error::io(r.error().code, m);
    }
    PLY_CHECK(g->vol->commit());
  }
  return stack_answer();
}

}  // namespace

RunningOp::RunningOp(const std::string& command, const std::string& what, const std::string& noun) {
  std::lock_guard lk(running.mu);
  running.active = true;
  running.command = command;
  running.what = what;
  running.noun = noun;
  running.done = 0;
  running.fraction = 0;
}

RunningOp::~RunningOp() {
  std::lock_guard lk(running.mu);
  running.active = false;
}

void RunningOp::update(uint64_t done, double fraction) {
  std::lock_guard lk(running.mu);
  running.done = done;
  running.fraction = fraction;
}

Result<Json> control(const Json& req, bool may_change, pid_t caller) {
  static const std::vector<std::string> kCommands = {"list",     "add",   "remove", "set",    "move",
                                                     "snapshot", "merge", "rollback", "clone", "delete", "diff",
                                                     "trim", "resize", "show", "branches", "views", "default",
                                                     "view-create", "view-delete", "view-default", "sync", "du",
                                                     "hold", "release", "quota", "scrub", "send", "receive",
                                                     "devices", "where", "policy", "policy-set", "policy-test",
                                                     "policy-apply", "device-add", "device-remove", "device-replace"};
  const std::string cmd = req.is_object() && req.contains("command") && req["command"].is_string()
                              ? req["command"].get<std::string>()
                              : "";
  if (std::find(kCommands.begin(), kCommands.end(), cmd) == kCommands.end())
    return Error::invalid("unknown command \"" + shown(cmd) +
                          "\" (list, add, remove, set, move, snapshot, merge, rollback, clone, delete, diff, trim, resize, "
                          "read, close, progress, show, branches, views, default, view-create, view-delete, view-default, "
                          "sync, du, hold, release, quota, scrub, scrub-cancel, send, receive, devices, where, policy, policy-set, "
                          "policy-test, policy-apply, device-add, device-remove, device-replace)");
  // Not behind a long merge: a commit is serialized with the others.
  if (cmd == "sync") return sync_answer();
  std::lock_guard lk(g->ctl_mu);
  if (cmd == "list") return stack_answer();
  if (cmd == "show") return show_answer();
  if (cmd == "branches" || cmd == "views" || cmd == "default") return catalog_answer(cmd);
  // What a listing with --json shows (Branch.space), per branch or in detail.
  if (cmd == "du") {
    std::optional<TreeId> b;
    if (req.contains("branch")) b = PLY_TRY(arg_branch(req, "branch")).tree;
    return model::du(*g->vol, b);
  }
  // The open generation's new extents are not in the space tree yet
  // (Volume::device_usage): committed first, the use is exact.
  if (cmd == "devices") {
    if (!g->read_only) (void)PLY_TRY(g->vol->commit());
    return model::devices(*g->vol);
  }
  // Where a file's data lies: its inode number as stat(2) shows it on the
  // mount (the union's, format.md#fs-union).
  if (cmd == "where") {
    if (!req.contains("ino") || !req["ino"].is_number_unsigned())
      return Error::invalid("\"ino\" must be an inode number");
    const uint64_t ino = req["ino"].get<uint64_t>();
    if (ino >> 63) return Error::invalid("the control folder's files have no data of their own");
    // Where the data is once the migrations queued so far are done
    // (format.md#migration).
    for (auto& [id, fs] : g->branches) fs->settle_placement();
    Json out = model::where(*g->vol, PLY_TRY(g->u->placement(ino)));
    return out;
  }
  if (cmd == "policy") {
    // The rules, and what the mount's branches moved in the background
    // since it began (format.md#migration).
    Json out = PLY_TRY(model::policy(*g->vol));
    Filesystem::MigrationStats sum;
    for (const auto& [tree, fs] : g->branches)
      if (fs) sum += fs->migration_stats();
    out["migration"] = model::policy_migration(*g->vol, sum);
    return out;
  }
  if (cmd == "policy-test") {
    auto num = [&](const char* k, uint64_t dflt, uint64_t max) -> Result<uint64_t> {
      if (!req.contains(k)) return dflt;
      if (!req[k].is_number_unsigned() || req[k].get<uint64_t>() > max)
        return Error::invalid(std::string("\"") + k + "\" must be a number up to " + std::to_string(max));
      return req[k].get<uint64_t>();
    };
    if (!req.contains("path") || !req["path"].is_string()) return Error::invalid("\"path\" must be a path");
    const uint64_t size = PLY_TRY(num("size", 0, ~uint64_t{0}));
    const uint32_t uid = uint32_t(PLY_TRY(num("uid", 0, 0xffffffffu)));
    const uint32_t gid = uint32_t(PLY_TRY(num("gid", 0, 0xffffffffu)));
    const uint32_t mode = uint32_t(PLY_TRY(num("mode", 0644, 07777)));
    auto rules = PLY_TRY(list_placement_rules(*g->vol));
    return model::policy_test(*g->vol, rules, req["path"].get<std::string>(), size, uid, gid, S_IFREG | mode);
  }
  // A diff names files in directories the caller may not be allowed to
  // list, and pauses every operation while it runs: root or the owner only.
  if (!may_change)
    return Error::io(EPERM, cmd == "diff"    ? "only root or the mount's owner may diff branches"
                            : cmd == "scrub" ? "only root or the mount's owner may scrub"
                            : cmd == "send"  ? "only root or the mount's owner may send branches"
                            : cmd == "policy-set" || cmd == "policy-apply" ? "only root or the mount's owner may change placement"
                            : cmd.rfind("device-", 0) == 0 ? "only root or the mount's owner may change the devices"
                                             : "only root or the mount's owner may change branches");
  if (cmd == "policy-set") {
    if (!req.contains("rules") || !req["rules"].is_array()) return Error::invalid("\"rules\" must be a list of rules");
    std::vector<PlacementRule> rules;
    for (const auto& r : req["rules"]) {
      if (!r.is_string()) return Error::invalid("each rule is a string");
      rules.push_back(PLY_TRY(parse_rule(r.get<std::string>())));
    }
    if (g->read_only) return Error::io(EROFS, "the mount is read-only");
    PLY_CHECK(set_placement_rules(*g->vol, std::move(rules)));
    (void)PLY_TRY(g->vol->commit());
    return model::policy(*g->vol);
  }
  // The seed's enforcer: every file of the writable branch moved to its
  // rule's first class (format.md#migration).
  if (cmd == "policy-apply") {
    if (g->read_only) return Error::io(EROFS, "the mount is read-only");
    Filesystem* fs = nullptr;
    for (const auto& l : g->stack)
      if (l.writable && g->branches.count(l.tree.v)) {
        fs = g->branches[l.tree.v].get();
        break;
      }
    if (!fs) return Error::io(EROFS, "the mount has no writable branch");
    RunningOp op("policy-apply", "moving files to their rules' classes", "files");
    auto st = PLY_TRY(fs->migrate_all([&](uint64_t done, uint64_t total) {
      op.update(done, total ? double(done) / double(total) : 1.0);
    }));
    (void)PLY_TRY(g->vol->commit());
    return model::policy_applied(*g->vol, st);
  }
  if (cmd.rfind("device-", 0) == 0) return device_online(cmd, req);
  if (cmd == "diff") return run_diff(req);
  if (cmd == "send") return send_online(req, caller);
  if (cmd == "receive") return receive_online(req, caller);
  // A scrub names the damaged files of every branch, as a diff names files.
  if (cmd == "scrub") {
    const Json& r = req.contains("rate") ? req["rate"] : Json(0);
    if (!r.is_number_unsigned()) return Error::invalid("\"rate\" must be a number of bytes a second");
    return scrub_online(r.get<uint64_t>());
  }
  if (cmd == "trim") {
    const Json& m = req.contains("minimum") ? req["minimum"] : Json(0);
    if (!m.is_number_unsigned()) return Error::invalid("\"minimum\" must be a number of bytes");
    return trim_online(0, UINT64_MAX, m.get<uint64_t>());
  }
  if (cmd == "resize") {
    const Json& sz = req.contains("size") ? req["size"] : Json("max");
    if (sz == "max") return resize_online(std::nullopt);
    if (!sz.is_number_unsigned()) return Error::invalid("\"size\" must be a number of bytes or \"max\"");
    return resize_online(sz.get<uint64_t>());
  }
  if (cmd == "snapshot" || cmd == "merge" || cmd == "rollback") {
    std::string name, to;
    if (cmd != "snapshot") name = PLY_TRY(arg_branch(req, "branch")).name;
    else if (req.contains("name")) {
      // Checked here: an empty name would ask lifecycle for the default one.
      name = PLY_TRY(model::get_name(req, "name"));
      PLY_CHECK(check_branch_name(name, "snapshot"));
    }
    if (cmd == "rollback" && req.contains("to")) to = PLY_TRY(arg_branch(req, "to")).name;
    return lifecycle(cmd, name, to);
  }
  if (cmd == "clone" || cmd == "delete") return clone_or_delete(cmd, req);
  if (cmd == "hold" || cmd == "release") return hold_or_release(cmd, req);
  if (cmd == "quota") return quota_answer(req);
  if (cmd.rfind("view-", 0) == 0) return view_change(cmd, req);
  return restack(cmd, req);
}

namespace {

// One request as op_ioctl runs it: the text for the answer field, or an error.
Result<std::string> answer(const std::string& request, bool may_change, pid_t caller) {
  Json req = Json::parse(request, nullptr, false);
  if (req.is_discarded() || !req.is_object()) return Error::invalid("the request is not a JSON object");
  const Json& c = req.contains("command") ? req["command"] : Json();
  if (c == "read" || c == "close") return page_in(req, c == "close");
  if (c == "progress") return model::dump(progress_answer());
  if (c == "scrub-cancel") return model::dump(cancel_scrub());
  Json result = PLY_TRY(control(req, may_change, caller));
  std::string text = model::dump(Json{{"result", std::move(result)}});
  if (text.size() <= Pending::kChunk) return text;
  return page_out(std::move(text));
}

}  // namespace

void op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void*, fuse_file_info*,
              unsigned flags, const void* in_buf, size_t in_size, size_t out_size) {
  if (cmd == FITRIM && !(flags & FUSE_IOCTL_COMPAT)) return op_fitrim(req, in_buf, in_size, out_size);
  if (cmd == FS_IOC_GETFLAGS || cmd == FS_IOC_SETFLAGS || cmd == FS_IOC32_GETFLAGS || cmd == FS_IOC32_SETFLAGS ||
      cmd == FS_IOC_FSGETXATTR || cmd == FS_IOC_FSSETXATTR)
    return op_fsflags(req, ino, cmd, in_buf, in_size, out_size);
  if (cmd != kControlIoctl) return (void)fuse_reply_err(req, ENOTTY);
  if (flags & FUSE_IOCTL_COMPAT) return (void)fuse_reply_err(req, ENOSYS);
  if (ino != FUSE_ROOT_ID) return (void)fuse_reply_err(req, ENOTTY);  // the mount point only
  if (in_size < sizeof(ControlMsg) || out_size < sizeof(ControlMsg))
    return (void)fuse_reply_err(req, EINVAL);
  ControlMsg m;
  std::memcpy(&m, in_buf, sizeof m);
  std::string text;
  if (m.version != kControlVersion) {
    // Plain text: a client of version 1 prints the answer as it is.
    text = "this mount's plyfs speaks control protocol version " + std::to_string(kControlVersion) +
           ", plyctl version " + std::to_string(m.version) + ": use the plyctl of the same plyfs release";
    log_error("refused a control request of protocol version %u (this plyfs speaks %u)", m.version, kControlVersion);
    m.status = EPROTO;
  } else {
    m.request[sizeof m.request - 1] = 0;
    const uid_t uid = fuse_req_ctx(req)->uid;
    Result<std::string> r = Error::io(EIO, "");
    try {
      r = answer(m.request, uid == 0 || uid == ::getuid(), fuse_req_ctx(req)->pid);
    } catch (const std::exception& e) {  // nothing may cross the C callback
      r = Error::io(EIO, std::string("the control request failed: ") + e.what());
    }
    text = r ? *r : model::dump(Json{{"error", lossy_utf8(r.error().message())}});
    m.status = r ? 0 : errno_of(r.error());
  }
  m.version = kControlVersion;
  std::snprintf(m.answer, sizeof m.answer, "%s", text.c_str());
  fuse_reply_ioctl(req, 0, &m, sizeof m);
}

}  // namespace plyfs::daemon
