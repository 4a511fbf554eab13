// fsck.plyfs: checks and repairs a plyfs image, following fsck(8) and e2fsck
// conventions (options, exit codes). The work is in lib/fsck.
#include <fcntl.h>
#include <getopt.h>
#include <malloc.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "util/json.h"
#include "util/parse.h"
#include "util/progress.h"
#include "blockdev/blockdev.h"
#include "commit/devices.h"
#include "fsck/fsck.h"
#include "fs/check.h"
#include "union/view.h"
#include "fs/fs.h"

#ifndef PLYFS_VERSION
#define PLYFS_VERSION "unknown"
#endif

namespace plyfs {
namespace {

constexpr const char* kProg = "fsck.plyfs";
std::atomic<bool> g_cancel{false};

struct Args {
  FsckMode mode = FsckMode::Check;
  bool mode_given = false, json = false, verbose = false, data = false;
  // -C FD (e2fsck's): 0 a progress bar on standard output, FD > 0 lines
  // "PASS DONE TOTAL DEVICE" written to FD, FD < 0 none (fsck(8) gives
  // another checker the bar). Without -C: the bar on a terminal.
  std::optional<int> progress_fd;
  std::string path;
  std::vector<std::string> others;  // the other devices of a multi-device volume
};

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: %s [-n|-p|-a|-y] [-f] [-c] [-C FD] [-v] [--json] DEVICE|IMAGE [DEVICE...]\n"
               "Check a plyfs filesystem and repair it. A multi-device volume's other\n"
               "devices (or directories to scan for them) follow the first.\n\n"
               "  -n      check only; open read-only and change nothing (the default)\n"
               "  -p, -a  preen: repair what loses nothing, without asking\n"
               "  -y      repair everything that can be repaired\n"
               "  -f      accepted for compatibility: every run is a full check\n"
               "  -c      also read every file data block and verify its checksum\n"
               "  -C FD   progress: 0 a progress line on standard output; FD > 0 lines\n"
               "          \"PASS DONE TOTAL DEVICE\" to file descriptor FD (as e2fsck)\n"
               "  -v      list every problem, including information\n"
               "  --json  print a machine-readable report on standard output\n"
               "  -V      print the version;  -h  print this help\n\n"
               "Exit status: 0 clean, 1 errors corrected, 4 errors left uncorrected,\n"
               "8 operational error, 16 usage error, 32 cancelled.\n",
               kProg);
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "%s: %s\nTry '%s -h' for more information.\n", kProg, msg.c_str(), kProg);
  return kFsckUsage;
}


void print_json(const std::string& path, const FsckReport& r) {
  std::printf("{\n  \"device\": %s,\n  \"generation\": %llu,\n  \"slot\": %d,\n",
              json_quote(path).c_str(), (unsigned long long)r.checked.v, r.choice.slot);
  if (r.written) std::printf("  \"written_generation\": %llu,\n", (unsigned long long)r.written->v);
  std::printf("  \"trees\": %llu, \"nodes\": %llu, \"items\": %llu, \"extents\": %llu,\n"
              "  \"used_blocks\": %llu, \"total_blocks\": %llu,\n  \"problems\": [",
              (unsigned long long)r.trees, (unsigned long long)r.nodes,
              (unsigned long long)r.items, (unsigned long long)r.extents,
              (unsigned long long)r.used_blocks, (unsigned long long)r.total_blocks);
  for (size_t i = 0; i < r.problems.size(); i++) {
    const auto& p = r.problems[i];
    std::printf("%s\n    {\"code\": \"%s\", \"pass\": %d, \"tree\": %llu, \"block\": %s, "
                "\"fix\": \"%s\", \"fixed\": %s, \"message\": %s}",
                i ? "," : "", p.code.c_str(), p.pass, (unsigned long long)p.tree,
                p.block == Error::kNoBlock ? "null" : std::to_string(p.block).c_str(),
                fix_class_name(p.fix), p.fixed ? "true" : "false", json_quote(p.message).c_str());
  }
  std::printf("%s],\n  \"actions\": [", r.problems.empty() ? "" : "\n  ");
  for (size_t i = 0; i < r.actions.size(); i++)
    std::printf("%s%s", i ? ", " : "", json_quote(r.actions[i]).c_str());
  std::printf("],\n  \"exit_code\": %d\n}\n", r.exit_code);
}

// What to do about the errors left: the command that repairs them, or why
// none will.
std::string advice(const Args& a, const FsckReport& r) {
  size_t preen = 0, yes = 0, none = 0;
  for (const auto& p : r.problems) {
    if (p.fix == FixClass::Info || p.fixed) continue;
    (p.fix == FixClass::Preen ? preen : p.fix == FixClass::Yes ? yes : none)++;
  }
  std::string s;
  if (a.mode == FsckMode::Check && (preen || yes)) {
    s = "; checked only: run '";
    s += kProg;
    s += yes ? " -y " : " -p ";
    s += a.path;
    for (const auto& o : a.others) s += " " + o;  // a multi-device volume's other devices
    s += yes ? "' to repair them (some repairs give something up)" : "' to repair them (nothing is lost)";
  }
  if (none) {
    s += "; ";
    s += std::to_string(none);
    s += " no repair can mend (mount the image read-only and copy what it holds)";
  }
  return s;
}

void print_text(const Args& a, const FsckReport& r) {
  const bool preen = a.mode == FsckMode::Preen;
  if (!preen || a.verbose) {
    std::printf("%s: generation %llu (superblock slot %d)\n", a.path.c_str(),
                (unsigned long long)r.checked.v, r.choice.slot);
  }
  for (const auto& p : r.problems) {
    if (p.fix == FixClass::Info && !a.verbose) continue;
    std::string where;
    if (p.tree) where += " tree " + std::to_string(p.tree);
    if (p.block != Error::kNoBlock) where += " block " + std::to_string(p.block);
    const char* state = p.fix == FixClass::Info ? "" : p.fixed ? " [fixed]" : " [not fixed]";
    std::printf("%s: pass %d %s%s: %s%s\n", a.path.c_str(), p.pass, p.code.c_str(), where.c_str(),
                p.message.c_str(), state);
  }
  for (const auto& act : r.actions) std::printf("%s: %s\n", a.path.c_str(), act.c_str());
  const std::string counts = std::to_string(r.trees) + " trees, " + std::to_string(r.nodes) +
                             " nodes, " + std::to_string(r.items) + " items, " +
                             std::to_string(r.used_blocks) + "/" + std::to_string(r.total_blocks) +
                             " blocks";
  switch (r.exit_code) {
    case kFsckClean:
      std::printf("%s: clean, %s\n", a.path.c_str(), counts.c_str());
      break;
    case kFsckCorrected:
      std::printf("%s: %zu errors corrected, %s\n", a.path.c_str(), r.errors(), counts.c_str());
      break;
    case kFsckCancelled:
      std::printf("%s: cancelled; nothing was changed\n", a.path.c_str());
      break;
    default:
      if (preen)
        std::printf("%s: UNEXPECTED INCONSISTENCY; RUN %s -y MANUALLY.\n", a.path.c_str(), kProg);
      std::printf("%s: %zu errors left uncorrected%s\n", a.path.c_str(), r.remaining(), advice(a, r).c_str());
  }
}

// -C's value, as e2fsck reads it: a descriptor, negative for none.
Result<int> parse_fd(std::string_view v) {
  const bool neg = v.starts_with('-');
  auto n = parse_uint(neg ? v.substr(1) : v, "-C file descriptor", 0, 1 << 20);
  if (!n) return n.error();
  return neg ? -int(*n) : int(*n);
}

// The progress of the passes (FsckOptions::progress), as -C asks.
class PassProgress {
 public:
  PassProgress(const Args& a, int fd) : a_(a), fd_(fd) {}
  void operator()(int pass, const std::string& what, uint64_t done, uint64_t total) {
    if (fd_ > 0) {
      // e2fsck's format for fsck(8) and systemd-fsck: "PASS DONE TOTAL DEVICE".
      const std::string line = std::to_string(pass) + " " + std::to_string(done) + " " +
                               std::to_string(std::max<uint64_t>({total, done, 1})) + " " + a_.path + "\n";
      for (size_t off = 0; !failed_ && off < line.size();) {
        const ssize_t n = ::write(fd_, line.data() + off, line.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) failed_ = true;  // the reader is gone: the check goes on
        else off += size_t(n);
      }
      return;
    }
    if (pass != pass_) {
      bar_.reset();  // erases the previous pass's line
      pass_ = pass;
      std::string label = a_.path;
      label += ": pass ";
      label += std::to_string(pass);
      label += ", ";
      label += what;
      // -C 0 asked for it: drawn on standard output whatever it is (as
      // e2fsck); by default only on a terminal, on standard error.
      // (With --json, standard output holds the report: the line goes to
      // standard error.)
      bar_ = std::make_unique<Progress>(label, total, Progress::Unit::Count, "blocks",
                                        fd_ == 0 && !a_.json ? stdout : stderr, fd_ == 0);
    }
    bar_->set_total(std::max(total, done));
    bar_->update(done);
  }
  void done() { bar_.reset(); }

 private:
  const Args& a_;
  int fd_;
  bool failed_ = false;
  int pass_ = 0;
  std::unique_ptr<Progress> bar_;
};

int real_main(int argc, char** argv) {
  Args a;
  static const option kLong[] = {{"json", no_argument, nullptr, 'J'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {}};
  opterr = 0;
  auto set_mode = [&](FsckMode m) {
    if (a.mode_given && a.mode != m) return false;
    a.mode = m;
    a.mode_given = true;
    return true;
  };
  for (int c; (c = getopt_long(argc, argv, ":npayfcC:vVh", kLong, nullptr)) != -1;) {
    switch (c) {
      case 'n': if (!set_mode(FsckMode::Check)) return usage_error("-n, -p and -y exclude each other"); break;
      case 'p': case 'a': if (!set_mode(FsckMode::Preen)) return usage_error("-n, -p and -y exclude each other"); break;
      case 'y': if (!set_mode(FsckMode::Yes)) return usage_error("-n, -p and -y exclude each other"); break;
      case 'f': break;
      case 'c': a.data = true; break;
      case 'C': {
        auto fd = parse_fd(optarg);
        if (!fd) return usage_error(fd.error().message());
        a.progress_fd = *fd;
        break;
      }
      case ':':
        return usage_error(optopt == 'C' ? "option -C needs a file descriptor (0: a progress line on standard output)"
                                         : std::string("option -") + char(optopt) + " needs a value");
      case 'v': a.verbose = true; break;
      case 'J': a.json = true; break;
      case 'V': std::printf("%s (plyfs) %s\n", kProg, PLYFS_VERSION); return 0;
      case 'h': usage(stdout); return 0;
      default:
        return usage_error(optopt ? std::string("unknown option -") + char(optopt)
                                  : std::string("unknown option ") + argv[optind - 1]);
    }
  }
  if (optind == argc) return usage_error("no device or image file given");
  a.path = argv[optind];
  // The other devices of a multi-device volume (or directories to scan).
  for (int i = optind + 1; i < argc; i++) a.others.push_back(argv[i]);

  if (a.progress_fd && *a.progress_fd > 0 && ::fcntl(*a.progress_fd, F_GETFD) < 0) {
    std::fprintf(stderr, "%s: %s\n", kProg,
                 Error::sys(errno, "-C " + std::to_string(*a.progress_fd) + ": cannot write progress there")
                     .message()
                     .c_str());
    return kFsckOperational;
  }
  auto dev = open_volume(a.path, a.others, FileOpenOptions{a.mode == FsckMode::Check, true});
  if (!dev) {
    std::fprintf(stderr, "%s: %s\n", kProg, dev.error().message().c_str());
    return kFsckOperational;
  }
  std::signal(SIGINT, [](int) { g_cancel = true; });
  std::signal(SIGTERM, [](int) { g_cancel = true; });
  FsckOptions fo;
  set_object_passes(fo, a.data);  // passes 5-6 and their repairs
  fo.mode = a.mode;
  fo.cancel = &g_cancel;
  // Without -C, a line on a terminal (standard error), unless preening
  // (fsck -A runs checkers side by side on one console) or --json.
  const int fd = a.progress_fd.value_or(-1);
  const bool bar = a.progress_fd ? fd >= 0 : a.mode != FsckMode::Preen && !a.json && ::isatty(STDERR_FILENO);
  PassProgress shown(a, a.progress_fd ? fd : -2);
  if (bar) {
    if (fd > 0) std::signal(SIGPIPE, SIG_IGN);  // a reader that goes away stops the lines, not fsck
    fo.progress = [&](int pass, const std::string& what, uint64_t done, uint64_t total) {
      shown(pass, what, done, total);
    };
    fo.progress_data = a.data;
  }
  auto r = fsck_run(**dev, fo);
  shown.done();
  if (!r) {
    std::fprintf(stderr, "%s: %s: %s\n", kProg, a.path.c_str(), r.error().message().c_str());
    return kFsckOperational;
  }
  if (a.json) print_json(a.path, *r);
  else print_text(a, *r);
  return r->exit_code;
}

}  // namespace
}  // namespace plyfs

int main(int argc, char** argv) {
  // The object checks build tables of a million entries per tree, one tree
  // after another: freed memory stays in the heap for the next tree instead
  // of going back to the kernel and being faulted in again, page by page.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  try {
    return plyfs::real_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsck.plyfs: %s\n", e.what());
    return plyfs::kFsckOperational;
  }
}
