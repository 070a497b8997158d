#!/usr/bin/env python3
"""Checks mpi_served_vm.sh's four runs: UCX's registrations were served by rdmalloc.

  check_served.py WORKDIR

WORKDIR holds `summary` (the "way=W kernel_regs=K pass=P" lines; K counted by a
kernel probe) and the RDMALLOC_STATS=json reports rdmalloc.json and
interpose-off.json (one line per rank). The kernel's count must equal what
rdmalloc says reached the kernel (its own region registrations plus the
requests it forwarded), so neither side can hide a registration.
"""
import json
import os
import sys


def reports(path):
    try:
        return [json.loads(l) for l in open(path) if l.startswith("{")]
    except OSError as e:
        return str(e)


def main():
    work = sys.argv[1]
    runs = {}
    for line in open(os.path.join(work, "summary")):
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if "kernel_regs" in f:
            runs[f["way"]] = dict(kernel=int(f["kernel_regs"]), ok=f["pass"] == "1")
    problems = []
    for way in ("ucx-cache", "direct", "rdmalloc", "interpose-off"):
        if way not in runs:
            problems.append(f"{way}: did not run")
        elif not runs[way]["ok"]:
            problems.append(f"{way}: mpirun failed or wrong bytes")
    if problems:
        return finish(problems)

    def served_checks(way):
        """What must hold when rdmalloc served UCX; the list of what does not."""
        reps = reports(os.path.join(work, f"{way}.json"))
        if isinstance(reps, str) or len(reps) != 2:
            return [f"{way}: expected 2 rank reports, got {reps if isinstance(reps, str) else len(reps)}"]
        bad = []
        served = sum(r["mrs_served"] for r in reps)
        forwarded = sum(r["mrs_forwarded"] for r in reps)
        own = sum(r["reg_calls"] for r in reps)
        for r in reps:
            if r["mrs_served"] == 0:
                bad.append(f"{way}: pid {r['pid']} served no registration")
            if r["reg_failures"] or r["mrs_forwarded_on_heap"]:
                bad.append(f"{way}: pid {r['pid']}: {r['reg_failures']} failed registrations, "
                           f"{r['mrs_forwarded_on_heap']} forwarded MRs live on heap pages at exit")
        kernel, direct = runs[way]["kernel"], runs["direct"]["kernel"]
        print(f"{way}: UCX asked {served + forwarded} registrations: {served} served, {forwarded} "
              f"forwarded; rdmalloc's own {own}; kernel counted {kernel} (direct without "
              f"rdmalloc: {direct}, UCX's cache: {runs['ucx-cache']['kernel']})")
        if kernel != own + forwarded:
            bad.append(f"{way}: kernel counted {kernel} registrations, rdmalloc accounts for "
                       f"{own} + {forwarded}")
        if served + forwarded < 0.9 * direct:
            bad.append(f"{way}: rdmalloc saw {served + forwarded} of UCX's ~{direct} registrations")
        if kernel >= direct:
            bad.append(f"{way}: {kernel} kernel registrations, no fewer than without rdmalloc ({direct})")
        return bad

    problems += served_checks("rdmalloc")
    # The negative control: with interposition off the same checks must fail.
    if not served_checks("interpose-off"):
        problems.append("interpose-off: the served checks passed without interposition")
    else:
        print("interpose-off: the served checks fail, as they must without interposition")
    return finish(problems)


def finish(problems):
    for p in problems:
        print(f"FAIL: {p}")
    print("mpi_served: " + ("PASS" if not problems else f"{len(problems)} check(s) failed"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
