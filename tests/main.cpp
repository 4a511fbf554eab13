// Catch2 v2 test runner, compiled once for every test program (Catch2's
// implementation is the slowest file of the build). A program that must
// check its preconditions first (the loop-device tests need root) defines
// plyfs_test_precheck(): a non-zero result is the exit status (77: skipped).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

extern "C" int plyfs_test_precheck() __attribute__((weak));

int main(int argc, char** argv) {
  if (plyfs_test_precheck)
    if (int rc = plyfs_test_precheck()) return rc;
  return Catch::Session().run(argc, argv);
}
