// Structure-aware mutations of a base image (issue 21): instead of random
// bytes, which mostly fail a checksum, a mutation picks a metadata node of
// the image, an item of it and one of its fields (a key's hi or lo, a
// value's offset or length, a field of the value, a child pointer, a header
// field, or a superblock field) and gives it a value chosen to break an
// invariant: a neighbour's key and one past it, a number far past every
// inode, a block just outside the device, zero, all ones... The patch
// re-seals the checksum, so the damage reaches the checks behind it.
//
// A mutation is one patch in the fuzz input format (fuzz_image.cpp), so the
// libFuzzer targets' custom mutator, the default suite's regression test
// (struct_fuzz_test.cpp) and the corpus replay share it.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace plyfs {
class MemDevice;
}

namespace plyfs::fuzz {

// What the mutator knows of a base image: its metadata nodes as they are.
struct NodeMap {
  struct Node {
    uint64_t block = 0;
    uint64_t tree = 0;  // 1 root, 2 space, >= 256 a user tree
    int level = 0;
    std::vector<uint8_t> bytes;  // the block
  };
  std::vector<Node> nodes;
  // The compressed extent items of the filesystem trees (format.md#fs-compress):
  // where the item's value lies, its frame fields and the frame's stored
  // blocks, so that a mutation can damage a frame and re-seal the item's
  // checksums of it (frame_patch).
  struct Frame {
    uint64_t node = 0;       // the leaf's block
    uint32_t value = 0;      // the item's value offset in the leaf
    uint64_t ino = 0, file_blk = 0;
    uint64_t disk_start = 0, disk_nblocks = 0;
    uint32_t frame_bytes = 0, ram_blocks = 0;
    std::vector<uint8_t> stored;  // disk_nblocks blocks
  };
  std::vector<Frame> frames;
  uint64_t total_blocks = 0, first_block = 0, next_inode = 0;
  uint32_t block_size = 4096;
};

// Every node reachable from the newest superblock (each once).
NodeMap map_nodes(const MemDevice& base);

// Damage to a compressed extent (FrameDamage), as patches appended to
// `input`: the stored bytes, re-sealed by patching the item's checksums of
// the damaged blocks to match (and the leaf's own checksum), so that the
// damage reaches the frame decoder; or the item's frame_bytes or ram_blocks.
enum class FrameDamage {
  Magic,         // the zstd frame's magic number: no frame at all
  ContentSize,   // the frame header's content size (FCS): decodes to another length
  Bytes,         // bytes anywhere in the frame (random: may even decode)
  Tail,          // the frame's last bytes
  FrameBytes,    // frame_bytes: a truncated frame, one past it, the block bounds...
  RamBlocks,     // ram_blocks: larger than the frame decodes to, smaller, the maximum...
};
// `frame` indexes map.frames; `variant` picks among the values a kind tries
// (the same variant, the same patch). Returns what it did.
std::string append_frame_patch(std::vector<uint8_t>& input, const NodeMap& map, size_t frame, FrameDamage kind,
                               uint64_t variant);

// One structured patch, appended to `input` (whole patches, fuzz_image.cpp).
// With compressed frames in the map, a fifth of them damage one (above).
// Returns a line saying what it damages ("node 57 (tree 256) item 3
// key.hi: 507 -> 1152921504606847483").
std::string append_struct_patch(std::vector<uint8_t>& input, const NodeMap& map, std::mt19937_64& rng);

// The whole patches at the start of `input` (a partial one at its end is cut
// off), so that a patch appended after them parses as one.
size_t whole_patches(const uint8_t* data, size_t size);

}  // namespace plyfs::fuzz
