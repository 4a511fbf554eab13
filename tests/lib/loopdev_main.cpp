// The precondition of the loop-device tests (tests/main.cpp runs it): they
// need root and a free loop device, and exit 77 (skipped) without them,
// saying why.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

extern "C" int plyfs_test_precheck() {
  if (geteuid() != 0) {
    std::printf("SKIP: loop device tests need root\n");
    return 77;
  }
  if (std::system("losetup -f >/dev/null 2>&1") != 0) {
    std::printf("SKIP: no free loop device (losetup -f failed)\n");
    return 77;
  }
  return 0;
}
