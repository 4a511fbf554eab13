// Replays fuzzer inputs kept as text hex dumps (tests/fuzz/corpus/*.hex):
// the seed corpus and every input that ever crashed the fuzzer, as
// regression tests. Each file: hex bytes, whitespace ignored, '#' starts a
// comment to the end of the line (where the input came from).
//   replay [--fs | --recv] FILE...
//   replay [--fs] --image OUT FILE   writes the patched image to OUT instead
//                                    (to look at it with fsck.plyfs, plyctl)
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "blockdev/test_devices.h"
#include "fuzz_image.h"

namespace {

bool load(const char* path, std::vector<uint8_t>& out) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line, hex;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    for (char c : line)
      if (std::isxdigit(static_cast<unsigned char>(c))) hex += c;
  }
  if (hex.size() % 2) return false;
  for (size_t i = 0; i < hex.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  // --fs: the inputs patch the filesystem image (fuzz_fs_image.cpp).
  void (*target)(const uint8_t*, size_t) = plyfs::fuzz::run_one;
  bool fs = false;
  const char* out = nullptr;
  for (int i = 1; i < argc; i++) {
    if (std::string(argv[i]) == "--fs") {
      target = plyfs::fuzz::run_one_fs;
      fs = true;
      continue;
    }
    // --recv: the inputs are send streams (fuzz_receive.cpp).
    if (std::string(argv[i]) == "--recv") {
      target = plyfs::fuzz::run_one_recv;
      continue;
    }
    if (std::string(argv[i]) == "--image" && i + 1 < argc) {
      out = argv[++i];
      continue;
    }
    if (out) {
      std::vector<uint8_t> data;
      if (!load(argv[i], data)) return std::fprintf(stderr, "replay: cannot read %s\n", argv[i]), 1;
      auto dev = (!fs ? plyfs::fuzz::engine_base()
                  : plyfs::fuzz::uses_z_base(data.data(), data.size()) ? plyfs::fuzz::fs_base_z()
                                                                       : plyfs::fuzz::fs_base())
                     .clone();
      plyfs::fuzz::apply_patches(*dev, data.data(), data.size());
      auto bytes = dev->peek(0, dev->size_bytes());
      std::ofstream f(out, std::ios::binary);
      f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
      return f ? 0 : (std::fprintf(stderr, "replay: cannot write %s\n", out), 1);
    }
    std::vector<uint8_t> data;
    if (!load(argv[i], data)) {
      std::fprintf(stderr, "replay: cannot read %s\n", argv[i]);
      return 1;
    }
    target(data.data(), data.size());
    n++;
  }
  std::printf("replayed %d inputs: no crash\n", n);
  return 0;
}
