// Send and receive (format.md#send-stream): a branch written as a stream of
// its filesystem tree's items, whole or as the difference from a parent
// snapshot, and a stream applied to another image as a new branch.
//
// The stream carries items, not operations: the keys and values of
// format.md#fs-tree as the sender's tree holds them, with the data of every
// extent item in place of its disk address. The receiver therefore rebuilds
// the tree exactly: inode numbers, types, modes, owners, all four times,
// xattrs, hard-link groups, holes, inline data, whiteouts and opaque
// directories, compressed extents still compressed. An incremental stream is
// the item difference between the parent and the branch (Volume::Txn::diff,
// which skips the subtrees they share), so its cost follows the change, not
// the branch.
//
// Invariants (tests/lib/send_test.cpp cites them):
//   S1 a receive is atomic: the new branch is built as a DOOMED tree (over
//      as many generations as its size needs) and named by one final
//      transaction, as an import is (io.h, I1). A stream that is truncated,
//      corrupt (a record's XXH3), reordered (record sequence numbers;
//      item keys strictly increasing, each key once),
//      incomplete (no END record, or END's counts differ), refers to data it
//      never sent, or does not match its parent on this image, leaves no
//      branch and no block behind.
//   S2 nothing from a stream is trusted: every extent's data is checked
//      against the item's own block checksums before it is written, every
//      reference to data already here is checked the same way, and the
//      finished tree passes the filesystem checks of fsck (F1-F9, U1-U2)
//      before it is named; a tree that fails them is dropped (EUCLEAN).
//   S3 sharing: the data of one extent is sent once however many items
//      reference it (reflinks, split extents); an incremental stream refers
//      to data the parent already holds instead of sending it again when
//      the changed item maps a part of what the parent's item at the same
//      file position mapped (a partial overwrite), or of what any other
//      extent item of the parent maps (a reflink of the parent's data), and
//      the receiver shares the parent's blocks there. Unchanged items are
//      shared by the clone.
//   S4 identity: a received branch is read-only, gets a new uuid, and
//      records the sender's uuid as its received_uuid; an incremental
//      stream names its parent by uuid, found on the receiver as a branch
//      whose uuid or received_uuid is that uuid.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "fs/fs.h"

namespace plyfs {

struct SendStats {
  uint64_t records = 0;       // records written, END included
  uint64_t items = 0;         // items put (new or changed)
  uint64_t deleted = 0;       // items removed (incremental)
  uint64_t extents = 0;       // extent items whose data the stream carries
  uint64_t shared = 0;        // extent items sent as a reference (S3)
  uint64_t shared_elsewhere = 0;  // of which to another file or position of the parent (SHARED source 2)
  uint64_t data_bytes = 0;    // extent data carried, as stored (compressed stays so)
  uint64_t prealloc_bytes = 0;  // preallocated ranges (no data: the receiver allocates them)
  uint64_t stream_bytes = 0;  // bytes written to the file descriptor
  double fraction = 0;        // the share of the tree(s) walked, for progress
};

struct SendOptions {
  // Incremental: the difference from this branch (a snapshot the receiver
  // already has). nullopt: the whole branch.
  std::optional<TreeId> parent;
  // zstd-compress the records (the header stays plain); 0: do not.
  int zstd_level = 0;
  std::function<void(const SendStats&)> progress;  // every few ms of work
};

// Writes branch `tree` of `v` to `fd` (format.md#send-stream). `v` may be
// open read-only; the caller gives one committed generation (an image as
// opened, or a clone the mount's daemon made).
Result<SendStats> send_branch(Volume& v, TreeId tree, int fd, const SendOptions& o);

struct ReceiveStats {
  uint64_t records = 0, items = 0, deleted = 0, extents = 0, shared = 0;
  uint64_t data_bytes = 0;    // extent data written
  uint64_t prealloc_bytes = 0;  // preallocated ranges allocated
  uint64_t stream_bytes = 0;  // bytes read from the file descriptor
};

struct ReceiveOptions {
  // The new branch's name; empty: the sender's.
  std::string name;
  // Checks the name the branch will get (the sender's, when `name` is
  // empty) before anything is written: the tools pass the name rule
  // (check_branch_name, union/view.h), which lives above this layer.
  std::function<Result<void>(const std::string&)> check_name;
  std::function<void(const ReceiveStats&)> progress;
};

struct Received {
  BranchMeta branch;              // the new branch, named and committed
  std::optional<BranchMeta> parent;  // an incremental stream's parent here
  ReceiveStats stats;
};

// Reads one stream from `fd` and makes it a new read-only branch of `v`
// (opened read-write, doomed trees dropped), committed durably (S1-S4).
Result<Received> receive_branch(Volume& v, int fd, const ReceiveOptions& o);

}  // namespace plyfs
