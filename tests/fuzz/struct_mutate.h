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
  uint64_t total_blocks = 0, first_block = 0, next_inode = 0;
  uint32_t block_size = 4096;
};

// Every node reachable from the newest superblock (each once).
NodeMap map_nodes(const MemDevice& base);

// One structured patch, appended to `input` (whole patches, fuzz_image.cpp).
// Returns a line saying what it damages ("node 57 (tree 256) item 3
// key.hi: 507 -> 1152921504606847483").
std::string append_struct_patch(std::vector<uint8_t>& input, const NodeMap& map, std::mt19937_64& rng);

// The whole patches at the start of `input` (a partial one at its end is cut
// off), so that a patch appended after them parses as one.
size_t whole_patches(const uint8_t* data, size_t size);

}  // namespace plyfs::fuzz
