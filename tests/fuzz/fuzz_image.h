// The image fuzzer's target, shared by the libFuzzer build and the corpus
// replay (see fuzz_image.cpp for the input format).
#pragma once

#include <cstddef>
#include <cstdint>

namespace plyfs::fuzz {

void run_one(const uint8_t* data, size_t size);

}  // namespace plyfs::fuzz
