// The image fuzzer's target, shared by the libFuzzer build and the corpus
// replay (see fuzz_image.cpp for the input format).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fsck/fsck.h"

namespace plyfs {
class MemDevice;
class Volume;
}

namespace plyfs::fuzz {

// The base images the inputs patch, built once.
const MemDevice& engine_base();
const MemDevice& fs_base();

// An engine image (plain trees, a clone, extent references).
void run_one(const uint8_t* data, size_t size);
// An image of filesystem trees, checked with fsck's object passes too.
void run_one_fs(const uint8_t* data, size_t size);
void apply_patches(MemDevice& dev, const uint8_t* data, size_t size);
// Reads what a mount of each branch could (bounded); never fails.
void read_all_fs(Volume& vol);
// fsck -n, -y, and -n again when -y says it corrected: that one must be clean.
void fsck_cycle(MemDevice& dev, FsckOptions fo);

// libFuzzer's custom mutator for both targets: mostly a structured patch
// (struct_mutate.h) appended to the input's whole patches, else libFuzzer's
// own byte mutation (`byte_mutate`).
size_t custom_mutate(const MemDevice& base, uint8_t* data, size_t size, size_t max_size, unsigned seed,
                     size_t (*byte_mutate)(uint8_t*, size_t, size_t));

}  // namespace plyfs::fuzz
