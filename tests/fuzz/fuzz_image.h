// The image fuzzer's target, shared by the libFuzzer build and the corpus
// replay (see fuzz_image.cpp for the input format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fsck/fsck.h"

namespace plyfs {
class MemDevice;
class Volume;
}

namespace plyfs::fuzz {

// The base images the inputs patch, built once.
const MemDevice& engine_base();
const MemDevice& fs_base();
// The filesystem image with compressed extents (format.md#fs-compress): what
// an fs input patches when its first patch's flags have bit 2 (kUseZBase).
const MemDevice& fs_base_z();
inline constexpr uint8_t kUseZBase = 4;
// Whether an fs input patches fs_base_z.
bool uses_z_base(const uint8_t* data, size_t size);

// An engine image (plain trees, a clone, extent references).
void run_one(const uint8_t* data, size_t size);
// An image of filesystem trees, checked with fsck's object passes too.
void run_one_fs(const uint8_t* data, size_t size);
void apply_patches(MemDevice& dev, const uint8_t* data, size_t size);
// Reads what a mount of each branch could (bounded); never fails.
void read_all_fs(Volume& vol);
// fsck -n, -y, and -n again when -y says it corrected: that one must be clean.
void fsck_cycle(MemDevice& dev, FsckOptions fo);

// The receive fuzzer (fuzz_receive.cpp): its input is a send stream,
// received into a copy of recv_base() (an image holding a received branch,
// from tests/fuzz/corpus-recv/base.hex); the image must stay writable and
// clean, with no block left behind by a refused stream.
const MemDevice& recv_base();
void run_one_recv(const uint8_t* data, size_t size);
// Its mutator: the stream's records changed and put back together with
// right checksums, END and (for a zstd stream) compression.
size_t recv_mutate(uint8_t* data, size_t size, size_t max_size, unsigned seed,
                   size_t (*byte_mutate)(uint8_t*, size_t, size_t));
// The seed corpus: streams of one source image (base.hex among them).
struct RecvSeed {
  std::string name, note;
  std::vector<uint8_t> bytes;
};
std::vector<RecvSeed> recv_corpus();

// libFuzzer's custom mutator for both image targets: mostly a structured patch
// (struct_mutate.h) appended to the input's whole patches, else libFuzzer's
// own byte mutation (`byte_mutate`).
// With `zbase` (the fs target), an input whose first patch selects it
// (kUseZBase) gets patches for that image, and a fresh list starts with that
// selection a third of the time.
size_t custom_mutate(const MemDevice& base, uint8_t* data, size_t size, size_t max_size, unsigned seed,
                     size_t (*byte_mutate)(uint8_t*, size_t, size_t), const MemDevice* zbase = nullptr);

}  // namespace plyfs::fuzz
