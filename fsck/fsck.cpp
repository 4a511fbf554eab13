// fsck.plyfs: checks and repairs a plyfs image, following fsck(8) and e2fsck
// conventions (options, exit codes). The work is in lib/fsck.
#include <malloc.h>
#include <getopt.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "util/json.h"
#include "blockdev/blockdev.h"
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
  bool mode_given = false, progress = false, json = false, verbose = false, data = false;
  std::string path;
};

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: %s [-n|-p|-a|-y] [-f] [-c] [-C] [-v] [--json] DEVICE|IMAGE\n"
               "Check a plyfs filesystem and repair it.\n\n"
               "  -n      check only; open read-only and change nothing (the default)\n"
               "  -p, -a  preen: repair what loses nothing, without asking\n"
               "  -y      repair everything that can be repaired\n"
               "  -f      accepted for compatibility: every run is a full check\n"
               "  -c      also read every file data block and verify its checksum\n"
               "  -C      show progress\n"
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
      std::printf("%s: %zu errors left uncorrected%s\n", a.path.c_str(), r.remaining(),
                  a.mode == FsckMode::Check ? " (checked only: run with -p or -y to repair)" : "");
  }
}

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
  for (int c; (c = getopt_long(argc, argv, "npayfcCvVh", kLong, nullptr)) != -1;) {
    switch (c) {
      case 'n': if (!set_mode(FsckMode::Check)) return usage_error("-n, -p and -y exclude each other"); break;
      case 'p': case 'a': if (!set_mode(FsckMode::Preen)) return usage_error("-n, -p and -y exclude each other"); break;
      case 'y': if (!set_mode(FsckMode::Yes)) return usage_error("-n, -p and -y exclude each other"); break;
      case 'f': break;
      case 'c': a.data = true; break;
      case 'C': a.progress = true; break;
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
  if (argc - optind > 1) return usage_error("more than one device given");
  a.path = argv[optind];

  auto dev = FileDevice::open(a.path, FileOpenOptions{a.mode == FsckMode::Check, true});
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
  if (a.progress)
    fo.progress = [&](int pass, const std::string& what) {
      std::fprintf(a.json ? stderr : stdout, "%s: pass %d: %s\n", a.path.c_str(), pass, what.c_str());
      std::fflush(a.json ? stderr : stdout);
    };
  auto r = fsck_run(**dev, fo);
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
