// What the small C helpers of the benchmark scripts share (fsbench_files.c,
// unionbench_ops.c): a monotonic clock and a one-line fatal error. Each
// program defines BENCH_PROG (its name for messages) before including this.
#pragma once
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char* what, const char* name) {
  fprintf(stderr, "%s: %s %s: %s\n", BENCH_PROG, what, name, strerror(errno));
  exit(1);
}
