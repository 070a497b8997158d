// spawn_rss: runs a program once and prints its wall time, peak RSS, page
// faults and CPU time (user and system, all threads).
//
// Usage: spawn_rss PRELOAD PROGRAM [ARG...]   (PRELOAD "" for none)
// Prints "seconds=S maxrss_kib=K minflt=F majflt=M cpu_seconds=C"; exits 1
// if the program failed.
//
// Peak RSS of a short program cannot be taken from its parent's wait4 when
// the parent is a big process: ru_maxrss keeps, across execve, the high-water
// mark of the memory the child had before it (a fork or vfork of the parent:
// Python's 16 MiB for every program). This launcher is small and clean (no
// preload of its own): the program's figure is its own unless it stays below
// the launcher's ~1 MiB.
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s PRELOAD PROGRAM [ARG...]\n", argv[0]);
    return 2;
  }
  timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid = fork();
  if (pid == 0) {
    if (argv[1][0] != '\0') setenv("LD_PRELOAD", argv[1], 1);
    execvp(argv[2], argv + 2);
    _exit(127);
  }
  if (pid < 0) return 1;
  int status = 0;
  rusage usage{};
  if (wait4(pid, &status, 0, &usage) != pid) return 1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "spawn_rss: %s failed: status %d\n", argv[2], status);
    return 1;
  }
  double s = static_cast<double>(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  double cpu = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
               (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  printf("seconds=%.6f maxrss_kib=%ld minflt=%ld majflt=%ld cpu_seconds=%.6f\n", s,
         usage.ru_maxrss, usage.ru_minflt, usage.ru_majflt, cpu);
  return 0;
}
