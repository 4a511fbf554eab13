// zstd compression of file data (format.md#fs-compress): the policy that
// says whether and how a write compresses, the frame codec with its
// cheap incompressibility test, a pool that compresses a write's frames on
// several threads, and a cache of decompressed frames for small reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/result.h"

namespace plyfs {

// How data is written. `mode` Unset defers to the next less specific
// setting (file flag, then branch default, then mount option:
// format.md#fs-compress, "Policy").
struct Compression {
  enum class Mode : uint8_t { Unset = 0, None = 1, Zstd = 2 };
  Mode mode = Mode::Unset;
  int level = 0;       // zstd level 1..19; 0: kDefaultLevel
  bool force = false;  // compress-force: no incompressibility test

  static constexpr int kDefaultLevel = 3;  // btrfs's and zstd's default
  static constexpr int kMaxLevel = 19;
  bool on() const { return mode == Mode::Zstd; }
  int effective_level() const { return level ? level : kDefaultLevel; }
  bool operator==(const Compression&) const = default;
};

// "zstd", "zstd:N" (1..19) or "none"; EINVAL with a one-line reason otherwise.
Result<Compression> parse_compression(std::string_view s);
// The same text back: "zstd:3", "none", "" for Unset.
std::string compression_name(const Compression& c);

// A compressed extent's frame covers at most this many blocks (128 KiB at
// 4 KiB blocks, as btrfs): a 4 KiB random read decompresses at most this
// much (measured in docs/benchmarks.md, "Compression").
inline constexpr uint32_t kFrameBlocks = 32;

// btrfs's heuristic in spirit: a sample of the data whose bytes are close to
// uniformly distributed (Shannon entropy of the sampled bytes above 7.5
// bits) will not compress; a few µs per frame instead of a compression.
bool looks_compressible(std::span<const std::byte> data);

// Compresses `in` at `level`. Returns the frame, or nullopt if it would not
// save at least one block of `bs` bytes (the data is then written plain).
std::optional<std::vector<std::byte>> compress_frame(std::span<const std::byte> in, int level, uint32_t bs);

// Decompresses a frame into `out`, which must come out exactly full: EIO
// (Error::io) for a frame that is damaged, decodes to another length, or
// would overflow `out`.
Result<void> decompress_frame(std::span<const std::byte> frame, std::span<std::byte> out);

// Runs fn(0..n-1) on the calling thread and up to hardware_concurrency - 1
// pool threads, returning when all are done.
void parallel_for(size_t n, const std::function<void(size_t)>& fn);

// Decompressed frames, keyed by the frame's first block and a hash of its
// stored checksums: a block freed and reused for other data has other
// checksums, so an entry can never be stale (format.md#fs-compress, "Cache").
class FrameCache {
 public:
  explicit FrameCache(size_t max_bytes = 8u << 20) : max_(max_bytes) {}
  std::shared_ptr<const std::vector<std::byte>> get(uint64_t block, uint64_t tag);
  void put(uint64_t block, uint64_t tag, std::shared_ptr<const std::vector<std::byte>> data);

 private:
  struct Key {
    uint64_t block, tag;
    bool operator==(const Key&) const = default;
  };
  struct Hash {
    size_t operator()(const Key& k) const { return std::hash<uint64_t>()(k.block * 0x9e3779b97f4a7c15ull ^ k.tag); }
  };
  using Entry = std::pair<Key, std::shared_ptr<const std::vector<std::byte>>>;
  std::mutex mu_;
  std::list<Entry> lru_;  // front: most recent
  std::unordered_map<Key, std::list<Entry>::iterator, Hash> map_;
  size_t bytes_ = 0, max_;
};

}  // namespace plyfs
