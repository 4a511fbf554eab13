// The test runner of every Catch2 (v3) test program, so that a program that
// must check its preconditions first (the loop-device tests need root) can
// define plyfs_test_precheck(): a non-zero result is the exit status (77:
// skipped). Catch2's implementation comes from its library (libCatch2).
#include <catch2/catch_session.hpp>

extern "C" int plyfs_test_precheck() __attribute__((weak));

int main(int argc, char** argv) {
  if (plyfs_test_precheck)
    if (int rc = plyfs_test_precheck()) return rc;
  return Catch::Session().run(argc, argv);
}
