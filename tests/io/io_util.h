// What the import/export tests share: plyctl run with its stdout and stderr
// apart, --json output checked against docs/plyctl.schema.json, GNU tar,
// shell commands, and random changes to a tree (a new OCI layer).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>

#include "../fuse/fuse_util.h"
#include "../fuse/json_schema.h"
#include "tree.h"

namespace plyfs::iotest {

using namespace plyfs::fusetest;

struct Out {
  int rc;
  std::string out, err;
};

// Runs argv with stdout and stderr into files of their own.
inline Out run_out(const std::vector<std::string>& argv) {
  static int n = 0;
  const std::string base = "/tmp/plyfs-io-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
  const std::string o = base + ".out", e = base + ".err";
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int fo = ::open(o.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int fe = ::open(e.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    dup2(fo, 1);
    dup2(fe, 2);
    execv(av[0], av.data());
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  Out r{WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), slurp(o), slurp(e)};
  ::unlink(o.c_str());
  ::unlink(e.c_str());
  return r;
}

inline Out plyctl_out(std::vector<std::string> args) {
  args.insert(args.begin(), plyctl_bin());
  Out r = run_out(args);
  UNSCOPED_INFO("plyctl " << args[1] << " -> " << r.rc << "\nstdout: " << r.out.substr(0, 2000) << "\nstderr: " << r.err);
  return r;
}

inline int sh(const std::string& cmd, const std::string& log) {
  const int rc = run({"/bin/sh", "-c", cmd}, log);
  UNSCOPED_INFO("$ " << cmd << " -> " << rc << "\n" << slurp(log));
  return rc;
}

inline bool have_tool(const std::string& t) {
  return std::system(("command -v " + t + " >/dev/null 2>&1").c_str()) == 0;
}

// An error as the tools print it: one line, "plyctl: ..." (after the
// note of tar's rule, when a leading '/' went).
inline bool one_line_error(std::string err) {
  const std::string note = "plyctl: removing leading '/' from member names\n";
  if (err.rfind(note, 0) == 0) err = err.substr(note.size());
  return err.rfind("plyctl: ", 0) == 0 && !err.empty() && err.back() == '\n' &&
         err.find('\n') == err.size() - 1;
}

inline std::string branch_list(const std::string& img) { return plyctl_out({"branch", "list", img, "--json"}).out; }

inline const SchemaValidator& schema() {
  static SchemaValidator v(nlohmann::json::parse(slurp(tool("PLYFS_SCHEMA"))));
  return v;
}

// A command's --json output: exit 0, one line of JSON that the command's
// schema (docs/plyctl.schema.json) accepts.
inline nlohmann::json validated(const std::string& command, const Out& o) {
  INFO("plyctl " << command << " --json:\n" << o.out << "\nstderr: " << o.err);
  REQUIRE(o.rc == 0);
  REQUIRE(!o.out.empty());
  CHECK(o.out.find('\n') == o.out.size() - 1);
  nlohmann::json j = nlohmann::json::parse(o.out, nullptr, false);
  REQUIRE(!j.is_discarded());
  const auto problems = schema().validate(j, schema().command(command));
  std::string all;
  for (const auto& p : problems) all += p + "\n";
  INFO("schema problems:\n" << all);
  CHECK(problems.empty());
  return j;
}

// GNU tar, keeping everything it can: pax, xattrs in every namespace,
// ACLs, holes; compression by the suffix; sources' atimes left alone.
inline int gnu_tar_create(const std::string& tarball, const std::string& dir, const std::string& log) {
  return sh("tar --format=posix --xattrs --xattrs-include='*' --acls --sparse --atime-preserve=system -caf '" + tarball +
                "' -C '" + dir + "' .",
            log);
}
inline int gnu_tar_extract(const std::string& tarball, const std::string& dir, const std::string& log) {
  return sh("mkdir -p '" + dir + "' && tar --xattrs --xattrs-include='*' --acls --numeric-owner -xpf '" + tarball +
                "' -C '" + dir + "'",
            log);
}

// A new layer's worth of changes under `root`: files and directories
// deleted, a directory replaced by a file, a directory emptied and made
// anew (an opaque one), files rewritten, a new subtree.
inline void change_tree(const std::string& root, std::mt19937_64& rng, const std::string& scratch) {
  namespace fs = std::filesystem;
  std::vector<fs::path> all;
  for (auto& e : fs::recursive_directory_iterator(root)) all.push_back(e.path());
  std::shuffle(all.begin(), all.end(), rng);
  size_t used = 0;
  auto next = [&]() -> std::optional<fs::path> {
    while (used < all.size()) {
      fs::path p = all[used++];
      std::error_code ec;
      if (fs::exists(fs::symlink_status(p, ec))) return p;
    }
    return std::nullopt;
  };
  for (int i = 0; i < 8; i++)
    if (auto p = next()) fs::remove_all(*p);
  for (int i = 0; i < 2; i++)
    if (auto p = next(); p && fs::is_directory(fs::symlink_status(*p))) {
      fs::remove_all(*p);
      write_file(p->string(), "a file where a directory was");
    }
  for (int i = 0; i < 2; i++)
    if (auto p = next(); p && fs::is_directory(fs::symlink_status(*p))) {
      fs::remove_all(*p);
      fs::create_directory(*p);
      write_file((*p / "fresh").string(), "in a directory made anew");
    }
  for (int i = 0; i < 5; i++)
    if (auto p = next(); p && fs::is_regular_file(fs::symlink_status(*p))) write_file(p->string(), "rewritten " + std::to_string(rng()));
  (void)scratch;
  TreeGen((fs::path(root) / ("new" + std::to_string(rng() % 100000))).string(), rng(),
          {.entries = 30, .sockets = false, .security_xattrs = false})
      .make();
}

}  // namespace plyfs::iotest
