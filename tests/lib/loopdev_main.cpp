// The runner of the loop-device tests: they need root and a free loop
// device, and exit 77 (skipped) without them, saying why.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (geteuid() != 0) {
    std::printf("SKIP: loop device tests need root\n");
    return 77;
  }
  if (std::system("losetup -f >/dev/null 2>&1") != 0) {
    std::printf("SKIP: no free loop device (losetup -f failed)\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
