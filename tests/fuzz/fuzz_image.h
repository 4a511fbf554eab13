// The image fuzzer's target, shared by the libFuzzer build and the corpus
// replay (see fuzz_image.cpp for the input format).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fsck/fsck.h"

namespace plyfs {
class MemDevice;
}

namespace plyfs::fuzz {

// An engine image (plain trees, a clone, extent references).
void run_one(const uint8_t* data, size_t size);
// An image of filesystem trees, checked with fsck's object passes too.
void run_one_fs(const uint8_t* data, size_t size);
void apply_patches(MemDevice& dev, const uint8_t* data, size_t size);
// fsck -n, -y, and -n again when -y says it corrected: that one must be clean.
void fsck_cycle(MemDevice& dev, FsckOptions fo);

}  // namespace plyfs::fuzz
