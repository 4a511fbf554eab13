// unionbench_ops: the timed operations of bench/unionbench (the Unionfs
// paper's micro-benchmarks). File i of NFILES lives in directory
// DIR/d<i % NDIRS> and is named f<i>.
//
//   unionbench_ops create DIR NDIRS NFILES K N   mkdir every directory, then
//                                                create the files i with
//                                                i % N == K (a branch's share)
//   unionbench_ops stat DIR NDIRS NFILES         lstat every file by its path
//   unionbench_ops readdir DIR NDIRS             list every directory
//   unionbench_ops unlink DIR NDIRS NFILES       unlink every file
//   unionbench_ops openw FILE                    open FILE for writing (which
//                                                copies it up), then close it
//
// It prints one line, "<seconds> <count>", timed with CLOCK_MONOTONIC; the
// count is the operations made (readdir: the entries seen, "." and ".."
// excluded), so that the caller can check that the union showed everything.
// C, built by bench/unionbench with gcc -O2, so that the process itself costs
// next to nothing next to the system calls it times.
#define _GNU_SOURCE
#define BENCH_PROG "unionbench_ops"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

static void file_path(char* out, size_t n, const char* top, long ndirs, long i) {
  snprintf(out, n, "%s/d%04ld/f%06ld", top, i % ndirs, i);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: unionbench_ops create|stat|readdir|unlink|openw ARGS (see the source)\n");
    return 2;
  }
  const char* op = argv[1];
  const char* top = argv[2];
  char path[4096];
  long count = 0;
  double t0 = now();
  if (strcmp(op, "create") == 0 && argc == 7) {
    long ndirs = atol(argv[3]), nfiles = atol(argv[4]), k = atol(argv[5]), n = atol(argv[6]);
    if (mkdir(top, 0755) != 0 && errno != EEXIST) die("mkdir", top);
    for (long d = 0; d < ndirs; d++) {
      snprintf(path, sizeof path, "%s/d%04ld", top, d);
      if (mkdir(path, 0755) != 0 && errno != EEXIST) die("mkdir", path);
    }
    for (long i = k; i < nfiles; i += n) {
      file_path(path, sizeof path, top, ndirs, i);
      int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
      if (fd < 0) die("create", path);
      close(fd);
      count++;
    }
  } else if (strcmp(op, "stat") == 0 && argc == 5) {
    long ndirs = atol(argv[3]), nfiles = atol(argv[4]);
    struct stat st;
    for (long i = 0; i < nfiles; i++) {
      file_path(path, sizeof path, top, ndirs, i);
      if (lstat(path, &st) != 0) die("stat", path);
      count++;
    }
  } else if (strcmp(op, "readdir") == 0 && argc == 4) {
    long ndirs = atol(argv[3]);
    for (long d = 0; d < ndirs; d++) {
      snprintf(path, sizeof path, "%s/d%04ld", top, d);
      DIR* dir = opendir(path);
      if (!dir) die("opendir", path);
      struct dirent* e;
      errno = 0;
      while ((e = readdir(dir)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) count++;
      if (errno) die("readdir", path);
      closedir(dir);
    }
  } else if (strcmp(op, "unlink") == 0 && argc == 5) {
    long ndirs = atol(argv[3]), nfiles = atol(argv[4]);
    for (long i = 0; i < nfiles; i++) {
      file_path(path, sizeof path, top, ndirs, i);
      if (unlink(path) != 0) die("unlink", path);
      count++;
    }
  } else if (strcmp(op, "openw") == 0 && argc == 3) {
    int fd = open(top, O_WRONLY);
    if (fd < 0) die("open", top);
    close(fd);
    count = 1;
  } else {
    fprintf(stderr, "unionbench_ops: bad arguments for %s (see the source)\n", op);
    return 2;
  }
  printf("%.6f %ld\n", now() - t0, count);
  return 0;
}
