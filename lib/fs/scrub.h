// Scrub (format.md#scrub): reads every tree node and every data block that
// some tree reaches, each once however many branches share it, from the
// device (not the cache), and checks it against its checksum: a node as
// any read verifies it, a data block against the XXH3 its extent item
// holds. It changes nothing. Each damaged block is named with every
// branch, and for data every path, that references it -- a block ten
// snapshots share names all ten.
//
// It runs beside operations (on a mount): what it checks is planned under
// short transactions and read outside them, so a block freed and reused
// meanwhile could fail its check without being damaged; every failure is
// therefore confirmed under a transaction (the block still referenced as
// planned, read again) before it is reported. Nodes and blocks written by
// a generation not yet durable are left for the next scrub.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "commit/volume.h"

namespace plyfs {

struct ScrubOptions {
  uint64_t rate_bytes = 0;  // bytes read per second at most; 0: no limit
  // The bytes checked so far and the bytes to check (an estimate: the
  // used blocks when the scrub began).
  std::function<void(uint64_t done, uint64_t total)> progress;
  const std::atomic<bool>* cancel = nullptr;  // set: stop at the next batch
};

struct ScrubRef {
  std::string branch;  // the branch's name ("(root tree)", "(space tree)" for those)
  std::string path;    // data: the file's path in the branch ("" if it has none); metadata: ""
};
struct ScrubDamage {
  uint64_t block = 0;
  bool metadata = false;
  // Checksum: a data block's bytes fail its checksum; Corrupt: a node fails
  // verification (checksum, magic, address, generation...); Unreadable: the
  // device answered the read with an error.
  enum class Reason : uint8_t { Checksum, Corrupt, Unreadable } reason = Reason::Checksum;
  std::string error;  // one sentence
  std::vector<ScrubRef> refs;
};
struct ScrubReport {
  uint64_t metadata_blocks = 0, data_blocks = 0;  // checked, each once
  uint64_t bytes = 0;                              // read
  double seconds = 0;
  bool cancelled = false;
  std::vector<ScrubDamage> damage;
};

Result<ScrubReport> scrub(Volume& v, const ScrubOptions& o = {});

}  // namespace plyfs
