#!/usr/bin/env python3
"""Checks that rdmalloc was active in every rank of an mpi_pingpong run.

  check_ranks.py OUTPUT REPORT NRANKS [BACKEND]

OUTPUT is the program's stdout (its "rank R: pid P rdmalloc present ..."
lines), REPORT the RDMALLOC_STATS=json file all ranks appended to. Each rank
must have found rdmalloc (on BACKEND, if given), every one of its lookups
must have hit, and its exit report (matched by pid) must show live registered
regions, no failed registration and the same number of lookups.
"""
import json
import re
import sys


def main():
    out, report, nranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    backend = sys.argv[4] if len(sys.argv) > 4 else None
    line_re = re.compile(
        r"rank (\d+): pid (\d+) rdmalloc present backend=(\S+) lookups=(\d+) hits=(\d+)")
    ranks = {}
    for line in open(out):
        m = line_re.match(line)
        if m:
            ranks[int(m[1])] = dict(pid=int(m[2]), backend=m[3], lookups=int(m[4]), hits=int(m[5]))
    problems = []
    if sorted(ranks) != list(range(nranks)):
        problems.append(f"ranks that found rdmalloc: {sorted(ranks)}, expected 0..{nranks - 1}")
    reports = {}
    try:
        for line in open(report):
            if line.startswith("{"):
                r = json.loads(line)
                reports[r["pid"]] = r
    except OSError as e:
        problems.append(f"no report: {e}")
    for rank, r in sorted(ranks.items()):
        rep = reports.get(r["pid"])
        if backend and r["backend"] != backend:
            problems.append(f"rank {rank}: backend {r['backend']}, expected {backend}")
        if r["lookups"] == 0 or r["hits"] != r["lookups"]:
            problems.append(f"rank {rank}: {r['hits']} of {r['lookups']} lookups hit")
        if rep is None:
            problems.append(f"rank {rank}: no report for pid {r['pid']}")
            continue
        if rep["regions_live"] == 0 or rep["bytes_registered"] == 0:
            problems.append(f"rank {rank}: nothing registered at exit")
        if rep["reg_failures"] != 0:
            problems.append(f"rank {rank}: {rep['reg_failures']} failed registrations")
        if rep["lookups"] != r["lookups"]:
            problems.append(f"rank {rank}: report counts {rep['lookups']} lookups, program {r['lookups']}")
        print(f"rank {rank}: backend={rep['backend']} device={rep['device']!r} lookups={r['lookups']} "
              f"hits={r['hits']} regions_live={rep['regions_live']} "
              f"registered={rep['bytes_registered'] >> 20} MiB reg_calls={rep['reg_calls']} "
              f"dereg_calls={rep['dereg_calls']}")
    for p in problems:
        print(f"FAIL: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
