// Filesystem-, union- and snapshot-level workloads for the crash harness
// (docs/testing.md#workloads): operations through lib/fs, lib/union and
// lib/snap on a small two-branch image, recorded at the device like the
// engine workloads, and the oracle for their crash states.
//
// The model of generation g is what the volume held (every tree's items)
// when commit g returned. Generations the volume wrote inside an operation
// (a commit begin() made on its own, at its change budget) take their
// content from the log itself, and must show the view from before or after
// the operation. Whether the operations do what POSIX and the union rules
// say is the job of the model tests (fs-model, union-model, snap-model):
// this harness proves that they are atomic and durable.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "workload.h"

namespace plyfs::crash {

enum class FsOpKind : uint8_t {
  Create,      // mknod path (regular file)
  Write,       // write arg bytes at off to path (inline when small)
  Truncate,    // size arg
  Rename,      // path -> path2
  Link,        // path -> path2
  Unlink,      // path
  Mkdir,       // path
  Rmdir,       // path
  Setxattr,    // user.crash = arg bytes
  Fallocate,   // [off, off+arg)
  CopyUp,      // open path for writing (copies a lower file up)
  Snapshot,    // snapshot of the default stack, name path
  Clone,       // clone of the writable branch, name path
  Merge,       // merge the writable layer into the branch below
  Rollback,    // discard the writable layer's changes
  AddBranch,   // a new empty branch named path (not in a view)
  DelBranch,   // delete_branch of the branch named path
  Fill,        // write path in 64 KiB pieces until ENOSPC
  Commit,
  SplitRename, // test-only planted bug: a rename made of link, commit, unlink
  RenameBranch, // the branch named path gets the name path2
  Quota,       // the branch named path gets a referenced quota of arg bytes (0: none) and,
               // with off 1, a hold (off 2: released): one FsInfo write each
  Shrink,      // plyctl resize to arg bytes on the mounted image: blocks past it move first
  Chattr,      // chattr: the file or directory at path gets the FS_*_FL flags arg (FS_COMPR_FL
               // +c, FS_NOCOMP_FL +m; a lower one is copied up)
  WriteText,   // as Write, with compressible text (low entropy: the compression test passes)
  CopyRange,   // copy_file_range of [off, off+arg) of path to the same offset of path2 (aligned:
               // the blocks are shared, compressed frames with them; else copied, compressed anew)
  Receive,     // receive_branch of the stream named path ("full", "incremental": recv_stream)
};

struct FsOp {
  FsOp(FsOpKind k, std::string p = "", std::string p2 = "", uint64_t o = 0, uint64_t a = 0)
      : kind(k), path(std::move(p)), path2(std::move(p2)), off(o), arg(a) {}
  FsOpKind kind;
  std::string path, path2;
  uint64_t off = 0, arg = 0;
  std::string str() const;
};

struct FsWorkload {
  std::string id;
  std::string image;  // the name of the starting image ("base", "full")
  std::vector<FsOp> ops;
  PlantedBug bug = PlantedBug::None;
  bool discard = false;  // VolumeOptions::discard (A6)
  // Mount compression (plyfs -o compress-force=zstd:1, MountCompression) for
  // the workload and the write checks of its crash states.
  bool compress = false;
  // The workload exists to write compressed extents (fs-scenario/compress...):
  // a run whose committed generations hold none is a failure (WORKLOAD), so
  // that a change of the compression policy cannot make it test nothing.
  bool expect_compressed = false;
};

struct FsRun {
  Run run;
  // Views (a listing of the default view) before and after each operation,
  // and the operation each generation written inside one belongs to.
  std::vector<std::string> view_before, view_after;
  std::map<uint64_t, size_t> inner_gen;  // generation -> operation index
  size_t failed_ops = 0;                 // operations and commits refused with a clean error
  std::vector<std::string> results;      // per operation: "ok" or the error
  // Fault runs (record_fs with a rule): the first operation or commit the
  // injected failure made fail, with its error (EIO, ENOSPC or EROFS: a
  // clean one; anything else is in run.error).
  std::string fault_error;
  size_t fault_ops = 0;  // operations and commits refused because of the fault
  // The listing (list_view: every file's bytes as a digest) of each committed
  // generation, as the workload saw it when the commit returned (or, in a
  // fault run, right before a commit that may be durable anyway): a crash
  // state that recovers generation g must list exactly view_at[g].
  std::map<uint64_t, std::string> view_at;
  // Compressed extent items in the committed generations' models, and the
  // ones that map part of their frame (a partial overwrite or truncation
  // inside it), counted over every generation (verbose output, expect_compressed).
  size_t compressed_items = 0, partial_frames = 0;
};

// Runs the workload from its starting image (built once and cached),
// recording every device call. With a fault rule, the workload's operations
// and commits (not the open, and not the harness's own listings and dumps)
// go through a FaultDevice: an operation may then fail with EIO, ENOSPC or
// EROFS, the run goes on while the volume is writable, stops at a failed
// commit (which must leave the volume read-only: run.failed_writable) and
// at a failed volume; any other outcome of the fault is in run.error.
FsRun record_fs(const FsWorkload& w, const FaultDevice::Rule* fault = nullptr);

// A listing of the default view (every path with type, mode, size, data
// checksum, xattrs, link target): what a mount shows. Error text on failure.
Result<std::string> list_view(Volume& v);

// The oracle for one crash state of a filesystem workload. `cache` keeps, by
// recovered generation, the result of the expensive checks (filesystem
// objects, views, listing) for the states that recover it.
struct FsOracleCache {
  std::map<uint64_t, std::string> by_gen;
};
std::string check_fs_state(const FsWorkload& w, const FsRun& r, const Spec& spec, bool write_check,
                           FsOracleCache& cache);

// The send streams the Receive operation applies (fs/send.h), made once on
// another image (a copy of "base", changed): "full", a whole snapshot "r1"
// of its main branch (files of inline and extent data with a hole, a
// preallocated range, a hard link, xattrs small and out of line, a
// compressed file); "incremental", the snapshot "r2" against r1 (partial
// overwrites shared from r1, a reflinked copy, an unlink). `items`: the
// branch's items as a receiver must hold them (send_test.cpp's items_of:
// what is the image's own left out).
struct RecvStream {
  std::string branch;  // the name the stream gives its branch
  std::vector<std::byte> bytes;
  Items items;
};
const RecvStream& recv_stream(const std::string& name);
// The branch `s.branch` of `v`, if named, must hold exactly `s.items`:
// empty, or what is wrong.
std::string check_received(Volume& v, const RecvStream& s);

// Workloads.
std::vector<FsOp> fs_instances();
// seq-1 whole; seq-2 and seq-3 sampled (`sample` workloads) with `seed`.
std::vector<FsWorkload> fs_ace(size_t length, uint64_t seed, size_t sample);
std::vector<FsWorkload> fs_scenarios();  // near-full devices, quotas, a shrink, compression
// fs-scenario/compress (file and directory flags, copy-up of compressed lower
// data) and fs-scenario/compress-force (the mount option): part of fs_scenarios.
std::vector<FsWorkload> fs_compress_scenarios();
FsWorkload fs_random_workload(uint64_t seed, size_t nops);
// For the fault suite: a handful of representative operations (a copy-up
// write, a rename over a whiteout, a snapshot, a merge, a delete_branch...),
// each committed and followed by more work and a second commit.
std::vector<FsWorkload> fs_fault_workloads();

}  // namespace plyfs::crash
