// fsbench_files: the many-files workload of bench/fsbench (workload 1).
//
//   fsbench_files create DIR NDIRS NFILES   mkdir DIR/dNNNN, then create NFILES
//                                           empty files spread over NDIRS of them
//   fsbench_files delete DIR NDIRS NFILES   unlink them all, then rmdir the dirs
//
// Files are created with openat(O_CREAT|O_EXCL) + close and removed with
// unlinkat, relative to an open directory, as tar and rm -r do. It prints one
// line, "<seconds> <operations>", timed with CLOCK_MONOTONIC; the operations
// are the files plus the directories. Built by bench/fsbench with gcc -O2;
// it is C so that the process itself costs next to nothing.
#define _GNU_SOURCE
#define BENCH_PROG "fsbench_files"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

int main(int argc, char** argv) {
  if (argc != 5 || (strcmp(argv[1], "create") && strcmp(argv[1], "delete"))) {
    fprintf(stderr, "usage: fsbench_files create|delete DIR NDIRS NFILES\n");
    return 2;
  }
  int create = strcmp(argv[1], "create") == 0;
  const char* top = argv[2];
  long ndirs = atol(argv[3]), nfiles = atol(argv[4]);
  if (ndirs < 1 || nfiles < 0) return 2;
  if (create && mkdir(top, 0755) != 0 && errno != EEXIST) die("mkdir", top);
  int topfd = open(top, O_RDONLY | O_DIRECTORY);
  if (topfd < 0) die("open", top);

  char dname[32], fname[32];
  double t0 = now();
  for (long d = 0; d < ndirs; d++) {
    // Files d, d + ndirs, d + 2*ndirs... go to directory d.
    long first = d, count = nfiles > d ? (nfiles - d + ndirs - 1) / ndirs : 0;
    snprintf(dname, sizeof dname, "d%04ld", d);
    if (create && mkdirat(topfd, dname, 0755) != 0) die("mkdir", dname);
    int dfd = openat(topfd, dname, O_RDONLY | O_DIRECTORY);
    if (dfd < 0) die("open", dname);
    for (long i = 0; i < count; i++) {
      snprintf(fname, sizeof fname, "f%07ld", first + i * ndirs);
      if (create) {
        int fd = openat(dfd, fname, O_CREAT | O_EXCL | O_WRONLY, 0644);
        if (fd < 0) die("create", fname);
        if (close(fd) != 0) die("close", fname);
      } else if (unlinkat(dfd, fname, 0) != 0) {
        die("unlink", fname);
      }
    }
    close(dfd);
    if (!create && unlinkat(topfd, dname, AT_REMOVEDIR) != 0) die("rmdir", dname);
  }
  double t = now() - t0;
  close(topfd);
  printf("%.6f %ld\n", t, nfiles + ndirs);
  return 0;
}
