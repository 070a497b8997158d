#!/usr/bin/env python3
"""Runs rdmalloc's benchmarks side by side and writes docs/BENCHMARKS.md.

Allocator workloads: the same binaries under glibc, stock Debian jemalloc,
rdmalloc and a second copy of jemalloc (the A/A control: the noise between two
identical allocators), LD_PRELOAD, fresh copies of the libraries each round,
interleaved A B C D, B C D A, ..., medians of N rounds, peak RSS of each run.
Then the lookup and message-path benchmarks (in-process, Google Benchmark).
This machine is noisy: compare ratios from one run only.
"""
import argparse
import atexit
import datetime
import glob
import json
import math
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = None  # the optimised build's bazel-bin, set in main()
WORKLOADS = ["larson", "xmalloc", "cache_scratch", "mstress", "small_loop", "large_blocks",
             "sparse_blocks", "extent_churn"]
ALLOCATORS = ["glibc", "jemalloc", "rdmalloc"]
# The workloads also run a second, separate copy of stock jemalloc in every
# round: its ratio to the first (an A/A control) shows how far two identical
# allocators' ratios stray on this machine, the band inside which a ratio of
# rdmalloc's to jemalloc's is parity.
JEMALLOC_AGAIN = "jemalloc_again"
WORKLOAD_ALLOCATORS = ALLOCATORS + [JEMALLOC_AGAIN]


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def installed_library(allocator):
    if allocator == "glibc":
        return None
    if allocator in ("jemalloc", JEMALLOC_AGAIN):
        return sorted(glob.glob("/usr/lib/*/libjemalloc.so.2"))[0]
    return os.path.join(BIN, "allocator", "librdmalloc.so")


# Byte-identical copies of one library ran small_loop up to 25 % apart, stable
# for a copy across runs: where the kernel placed the file's pages (the text's
# physical layout) shows in the allocator's speed. Each round therefore
# preloads fresh copies of both libraries, written the same way, so placement
# varies from round to round like the rest of the noise instead of favouring
# one allocator for a whole run.
COPIES = {}
COPY_DIR = None


def fresh_copies(allocators=ALLOCATORS):
    global COPY_DIR
    if COPY_DIR is None:
        COPY_DIR = tempfile.mkdtemp(prefix="rdmalloc_bench_libs.")
        atexit.register(shutil.rmtree, COPY_DIR, True)
    for lib in COPIES.values():
        os.unlink(lib)
    COPIES.clear()
    # Written in the order given (the round's), and all named alike: one
    # LD_PRELOAD path as long as another, so no allocator's runs always see
    # their environment, and stack, laid out differently.
    for a in allocators:
        src = installed_library(a)
        if src:
            fd, dst = tempfile.mkstemp(dir=COPY_DIR, prefix="lib.", suffix=".so")
            os.close(fd)
            shutil.copyfile(src, dst)
            COPIES[a] = dst


def preload(allocator):
    return COPIES.get(allocator) or installed_library(allocator)


# How rounds order the allocators (saved with the results, "order"): until
# 2026-12-08 a rotation (A B C D, B C D A, ...), in which each allocator always
# ran right after the same other one, so whatever a run leaves behind for the
# next (freed memory, caches, the clock's state) fell on one allocator only.
ORDER = "balanced"


def round_order(i, allocators=ALLOCATORS):
    """The allocators in round i: a Williams design, in which over a cycle of
    rounds (n of them for n allocators, 2n when n is odd) each allocator runs
    first and last equally often and right after each other one equally often.

    >>> [round_order(i, "ABCD") for i in range(4)]
    [['A', 'B', 'D', 'C'], ['B', 'C', 'A', 'D'], ['C', 'D', 'B', 'A'], ['D', 'A', 'C', 'B']]
    >>> def pairs(n, rounds):
    ...     seen = {}
    ...     for i in range(rounds):
    ...         order = round_order(i, range(n))
    ...         for ab in zip(order, order[1:]):
    ...             seen[ab] = seen.get(ab, 0) + 1
    ...     return sorted(set(seen.values())), len(seen)
    >>> pairs(4, 4), pairs(3, 6), pairs(5, 10)  # (times each ordered pair is adjacent, pairs)
    (([1], 12), ([2], 6), ([2], 20))
    """
    n = len(allocators)
    first = [0]  # 0, 1, n-1, 2, n-2, ...
    for j in range(1, n):
        first.append((j + 1) // 2 if j % 2 else n - j // 2)
    cycle = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        cycle += [row[::-1] for row in cycle]
    return [allocators[x] for x in cycle[i % len(cycle)]]


def run_once(binary, args, allocator, extra_env=None, fields_out=None):
    """Returns (ops_per_s, peak_rss_kib) of one run; fields_out gets every key=value printed."""
    # Through spawn_rss, not Popen + wait4: a child forked from this Python
    # process keeps Python's ~17 MiB in its ru_maxrss across execve, which
    # hid the small workloads' own peak (they read 16.8 MiB under every
    # allocator). spawn_rss prints maxrss_kib after the workload's fields.
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(extra_env or {})
    launcher = os.path.join(BIN, "benchmarks", "workloads", "spawn_rss")
    proc = subprocess.run([launcher, preload(allocator) or "", binary] + args,
                          stdout=subprocess.PIPE, env=env, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{binary} {args} under {allocator} failed: status {proc.returncode}")
    fields = dict(kv.split("=", 1) for kv in proc.stdout.split())
    if fields_out is not None:
        fields_out.update(fields)
    return float(fields["ops_per_s"]), int(fields["maxrss_kib"])


def median(xs):
    return statistics.median(xs)


def median_interval(xs, level=0.95):
    """A distribution-free confidence interval for the median of what xs samples:
    its k-th smallest and k-th largest values, k as large as keeps the chance
    that the median lies outside at most 1 - level (the sign test's binomial:
    the k-th smallest of n lies above the median with probability P(B(n, 1/2) < k)).
    It assumes nothing of the noise's shape, only that the rounds are alike.
    None with fewer than 6 values.

    >>> median_interval([5, 1, 4, 2, 3, 0, 7, 6])  # 8 rounds: P = 2/256 outside
    [0, 7]
    >>> median_interval(list(range(24)))  # the 7th smallest and largest: P = 0.023
    [6, 17]
    >>> median_interval([1, 2, 3, 4, 5]) is None  # even min-max leaves 2/32 outside
    True
    """
    n, s = len(xs), sorted(xs)
    k = interval_rank(n, level)
    return None if k is None else [s[k - 1], s[n - k]]


def interval_rank(n, level=0.95):
    """median_interval's k for n values."""
    tail, k = 0.0, None
    for j in range(1, n // 2 + 1):
        tail += math.comb(n, j - 1) / 2 ** n
        if 2 * tail > 1 - level:
            break
        k = j
    return k


def workloads(rounds, threads_list):
    rows = []
    for name in WORKLOADS:
        binary = os.path.join(BIN, "benchmarks", "workloads", name)
        for threads in threads_list:
            res = {a: {"ops": [], "rss": [], "faults": [], "cpu": []} for a in WORKLOAD_ALLOCATORS}
            for i in range(rounds):
                order = round_order(i, WORKLOAD_ALLOCATORS)
                fresh_copies(order)
                for a in order:
                    fields = {}
                    ops, rss = run_once(binary, [str(threads)], a, fields_out=fields)
                    res[a]["ops"].append(ops)
                    res[a]["rss"].append(rss)
                    res[a]["faults"].append(int(fields["minflt"]) + int(fields["majflt"]))
                    res[a]["cpu"].append(float(fields["cpu_seconds"]))
            row = {"workload": name, "threads": threads}
            for a in WORKLOAD_ALLOCATORS:
                row[a] = median(res[a]["ops"])
                row[a + "_rss"] = max(res[a]["rss"])
                row[a + "_rounds"] = res[a]["ops"]
                row[a + "_rss_rounds"] = res[a]["rss"]
            # Ratios within each round (the allocators ran back to back), then
            # their median: noise that changes between rounds cancels.
            vs_jem = [r / j for r, j in zip(res["rdmalloc"]["ops"], res["jemalloc"]["ops"])]
            vs_glibc = [r / g for r, g in zip(res["rdmalloc"]["ops"], res["glibc"]["ops"])]
            row["rdm_vs_jem"] = median(vs_jem)
            row["rdm_vs_glibc"] = median(vs_glibc)
            row["rss_vs_jem"] = row["rdmalloc_rss"] / row["jemalloc_rss"]
            # The median runs' peaks too: one run's outlier (a producer that ran
            # further ahead) moves the largest, not these.
            row["rss_median_vs_jem"] = median(res["rdmalloc"]["rss"]) / median(res["jemalloc"]["rss"])
            again = [b / j for b, j in zip(res[JEMALLOC_AGAIN]["ops"], res["jemalloc"]["ops"])]
            row["jem_vs_jem"] = median(again)
            row["jem_rss_vs_jem"] = row[JEMALLOC_AGAIN + "_rss"] / row["jemalloc_rss"]
            # What the clock does not separate from the machine's noise: page faults (nearly
            # deterministic) and CPU time (all threads, user and system; waits excluded).
            for a in WORKLOAD_ALLOCATORS:
                row[a + "_faults"] = median(res[a]["faults"])
                row[a + "_faults_rounds"] = res[a]["faults"]
                row[a + "_cpu_rounds"] = res[a]["cpu"]
            row["faults_vs_jem"] = row["rdmalloc_faults"] / row["jemalloc_faults"]
            row["jem_faults_vs_jem"] = row[JEMALLOC_AGAIN + "_faults"] / row["jemalloc_faults"]
            for key, other in (("cpu_vs_jem", "rdmalloc"), ("jem_cpu_vs_jem", JEMALLOC_AGAIN)):
                ratios = [o / j for o, j in zip(res[other]["cpu"], res["jemalloc"]["cpu"])]
                row[key] = median(ratios)
                row[key + "_range"] = [min(ratios), max(ratios)]
            rows.append(row)
            print(f"{name:14s} t={threads} glibc={row['glibc']:.3g} jemalloc={row['jemalloc']:.3g} "
                  f"rdmalloc={row['rdmalloc']:.3g} rdm/jem={row['rdm_vs_jem']:.3f} "
                  f"rdm/glibc={row['rdm_vs_glibc']:.3f} rss rdm/jem={row['rss_vs_jem']:.2f} "
                  f"A/A jem/jem={row['jem_vs_jem']:.3f} rss {row['jem_rss_vs_jem']:.2f}",
                  flush=True)
    return rows


# Thread scaling: extent_churn sends every malloc and free through the extent
# hooks (jemalloc's decay at 0), where rdmalloc's own locks are; larson for
# contrast stays in jemalloc's caches. 1..8 threads on this machine's cores:
# past the core count, scaling is about how much threads wait for each other.
SCALING = [("extent_churn", {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}), ("larson", {})]
SCALING_THREADS = [1, 2, 4, 8]


def scaling(rounds):
    rows = []
    for name, extra in SCALING:
        binary = os.path.join(BIN, "benchmarks", "workloads", name)
        for threads in SCALING_THREADS:
            res = {a: [] for a in ALLOCATORS}
            waits = []
            for i in range(rounds):
                order = round_order(i)
                fresh_copies(order)
                for a in order:
                    fields = {}
                    ops, _ = run_once(binary, [str(threads)], a, extra, fields)
                    res[a].append(ops)
                    if a == "rdmalloc" and "heap_lock_waits" in fields:
                        waits.append(int(fields["heap_lock_waits"]) / (int(fields["ops"]) / 1000))
            row = {"workload": name, "threads": threads}
            for a in ALLOCATORS:
                row[a] = median(res[a])
            row["waits_per_kop"] = median(waits) if waits else None
            rows.append(row)
            print(f"scaling {name:12s} t={threads} " +
                  " ".join(f"{a}={row[a]:.3g}" for a in ALLOCATORS) +
                  (f" lock waits/1k ops={row['waits_per_kop']:.3f}" if waits else ""), flush=True)
    return rows


# Instructions: each workload once per allocator under callgrind, at 1 thread
# and a small scale (callgrind runs a program 50-100 times slower). What a
# program executes in user space does not depend on the machine's load, so
# the counts show differences of a fraction of a percent, where the timed
# ratios swing by tens of percent between two identical allocators. They do
# not show cache misses, page faults or time in the kernel: large_blocks'
# lead over jemalloc, page faults not taken, barely shows in them. A second
# copy of jemalloc is counted too: its distance from the first is what is
# left of timing in the counts (jemalloc's decay purges by the clock).
INSTRUCTION_SCALES = {"larson": 0.05, "xmalloc": 0.05, "cache_scratch": 0.02, "mstress": 0.05,
                      "small_loop": 0.05, "large_blocks": 0.1, "sparse_blocks": 0.25,
                      "extent_churn": 0.2}


def count_instructions(binary, args, allocator):
    """(instructions, operations) of one run under callgrind; LD_PRELOAD goes through env(1),
    so that valgrind's own launcher does not load the allocator."""
    lib = preload(allocator)
    cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes", "--callgrind-out-file=/dev/null",
           "env"] + ([f"LD_PRELOAD={lib}"] if lib else []) + [binary] + args
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    collected = re.findall(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not collected:
        raise RuntimeError(f"callgrind {binary} {args} under {allocator} failed: "
                           f"status {proc.returncode}\n{proc.stderr[-2000:]}")
    fields = dict(kv.split("=", 1) for kv in proc.stdout.split() if "=" in kv)
    return int(collected[-1]), int(fields["ops"])


def instructions(runs):
    """Each workload `runs` times per allocator, interleaved; the median of each allocator's
    counts. jemalloc's decay purges by the clock, so two runs of one program differ by up to a
    few tenths of a percent (xmalloc most: its producer and consumer threads interleave)."""
    rows = []
    for name in WORKLOADS:
        binary = os.path.join(BIN, "benchmarks", "workloads", name)
        scale = INSTRUCTION_SCALES[name]
        fresh_copies(WORKLOAD_ALLOCATORS)
        row = {"workload": name, "scale": scale, "runs": runs}
        counts = {a: [] for a in WORKLOAD_ALLOCATORS}
        ops = set()
        for i in range(runs):
            for a in round_order(i, WORKLOAD_ALLOCATORS):
                n, o = count_instructions(binary, ["1", str(scale)], a)
                counts[a].append(n)
                ops.add(o)
        if len(ops) != 1:
            raise RuntimeError(f"{name}: operation counts differ between runs: {sorted(ops)}")
        for a in WORKLOAD_ALLOCATORS:
            row[a] = median(counts[a])
            row[a + "_runs"] = counts[a]
            row[a + "_ops"] = next(iter(ops))
        rows.append(row)
        print(f"instructions {name:14s} " + " ".join(f"{a}={row[a]:,.0f}" for a in WORKLOAD_ALLOCATORS)
              + f" rdm/jem={row['rdmalloc'] / row['jemalloc']:.4f}"
              + f" A/A={row[JEMALLOC_AGAIN] / row['jemalloc']:.4f}", flush=True)
    return rows


def instruction_table(L, rows, git):
    L.append("## Instructions executed (callgrind)\n")
    runs = rows[0].get("runs", 1) if rows else 1
    L.append(f"Each workload {runs} times per allocator, interleaved, under valgrind's callgrind, "
             "at 1 thread (xmalloc: one producer and one consumer) and the scale shown "
             "(`valgrind --tool=callgrind env LD_PRELOAD=LIB WORKLOAD 1 SCALE`), "
             f"rdmalloc {git}: every instruction the process executes in user space, the "
             "workload's own included; the median of each allocator's runs. Unlike the times "
             "above, these counts barely depend on the machine's load, so they show differences "
             "of a fraction of a percent. Barely: jemalloc's decay purges by the clock, so two "
             "runs of one program under one allocator differ by up to a few tenths of a percent "
             "(*runs*: the spread of jemalloc's, (max − min) / median). They leave out cache "
             "misses, page faults and the kernel's time (large_blocks' lead, page faults not "
             "taken, is not in them). *A/A* is a second copy of jemalloc, counted the same way. "
             "*extra per op* is (rdmalloc − jemalloc) / operations.\n")
    L.append("| workload | scale | operations | glibc | jemalloc | rdmalloc | "
             "rdmalloc / jemalloc | A/A | runs | extra per op | rdmalloc / glibc |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ops = r["rdmalloc_ops"]
        jem_runs = r.get("jemalloc_runs", [r["jemalloc"]])
        spread = (max(jem_runs) - min(jem_runs)) / r["jemalloc"]
        L.append(f"| {r['workload']} | {r['scale']:g} | {ops:,} | {r['glibc'] / 1e6:,.1f} M | "
                 f"{r['jemalloc'] / 1e6:,.1f} M | {r['rdmalloc'] / 1e6:,.1f} M | "
                 f"**{r['rdmalloc'] / r['jemalloc']:.4f}** | "
                 f"{r[JEMALLOC_AGAIN] / r['jemalloc']:.4f} | "
                 f"{spread * 100:.2f} % | "
                 f"{(r['rdmalloc'] - r['jemalloc']) / ops:+.1f} | "
                 f"{r['rdmalloc'] / r['glibc']:.3f} |")
    L.append("")
    L.append("large_blocks and sparse_blocks allocate few, large blocks. What rdmalloc adds there, "
             "thousands of instructions a block, is its search for the most resident place to "
             "put a block, one `mincore` per freed block, and the sweep of untouched pages, which "
             "runs by the clock (every 10 ms): under callgrind, tens of times slower, it runs far "
             "more often per block than natively. What that buys is in the timed table: the page "
             "faults jemalloc takes for every block.\n")


# Short-lived programs: what an allocator costs up front. Whole runs timed
# (wall clock, fork to exit) and their own peak RSS (spawn_rss.cc says why
# not this process's wait4), interleaved per allocator.
def startup_programs():
    return [
        ("tiny: malloc(100), exit", [os.path.join(BIN, "benchmarks", "workloads", "tiny")]),
        ("python3 -c pass", ["/usr/bin/python3", "-c", "pass"]),
        ("sort of 20k lines", ["/usr/bin/sort", "-o", "/dev/null", SORT_INPUT]),
    ]


SORT_INPUT = "/tmp/rdmalloc_bench_sort_input.txt"


def startup(runs):
    with open(SORT_INPUT, "w") as f:
        for i in range(20000):
            f.write(f"{(i * 7919) % 20011:08d} line {i}\n")
    rows = []
    for name, cmd in startup_programs():
        res = {a: {"s": [], "rss": [], "faults": []} for a in ALLOCATORS}
        for i in range(runs):
            order = round_order(i)
            fresh_copies(order)
            for a in order:
                env = dict(os.environ)
                env.pop("LD_PRELOAD", None)
                out = sh([os.path.join(BIN, "benchmarks", "workloads", "spawn_rss"), preload(a) or ""]
                         + cmd, env=env)
                fields = dict(kv.split("=", 1) for kv in out.split())
                t, rss = float(fields["seconds"]), int(fields["maxrss_kib"])
                res[a]["s"].append(t)
                res[a]["rss"].append(rss)
                res[a]["faults"].append(int(fields["minflt"]) + int(fields["majflt"]))
        row = {"program": name}
        for a in ALLOCATORS:
            row[a] = median(res[a]["s"])
            row[a + "_rss"] = median(res[a]["rss"])
            row[a + "_faults"] = median(res[a]["faults"])
        rows.append(row)
        print(f"startup {name:26s} " + " ".join(
            f"{a}={row[a] * 1e3:.2f}ms/{row[a + '_rss'] / 1024:.2f}MiB" for a in ALLOCATORS), flush=True)
    return rows


def gbench(binary, args):
    out = sh([binary, "--benchmark_format=json"] + args)
    return json.loads(out)["benchmarks"]


def message_path(min_time, vm=False):
    cmd = [os.path.join(BIN, "benchmarks", "message_path_benchmark"), "--benchmark_format=json",
           f"--benchmark_min_time={min_time}", "--benchmark_repetitions=3",
           "--benchmark_report_aggregates_only=true"]
    if vm:  # real verbs: soft-RoCE rxe0 in the VM (test/vm), emulated CPU
        cmd = [os.path.join(ROOT, "test", "vm", "run.sh"), "--timeout", "900"] + cmd
    bms = json.loads(sh(cmd))["benchmarks"]
    per = {}
    keys = {}
    steady = {}
    for b in bms:
        name = b["name"]
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if name.startswith("BM_RegistrationsPerGiB"):
            steady = {"reg_per_GiB": b["reg_per_GiB"], "dereg_per_GiB": b["dereg_per_GiB"]}
            continue
        base = name.split("/")[0]
        size = int(name.split("/")[1].split("_")[0])
        if base.startswith("BM_FreshBuffer_"):
            per.setdefault(size, {})[base.replace("BM_FreshBuffer_", "")] = b["real_time"]  # ns
        elif base.startswith("BM_KeysOnly_"):
            keys.setdefault(size, {})[base.replace("BM_KeysOnly_", "")] = b["real_time"]
    return per, keys, steady


SMALL_REGIONS = "4M"  # the random lookup again, over about ten times as many regions


def lookup(min_time, rounds):
    """{name: [median ns, fastest ns, regions the pattern spans or None, runs]}: the benchmark run
    `rounds` times, each followed by its random case at SMALL_REGIONS, so that a noisy moment
    of the machine moves one run of each, not all of one."""
    binary = os.path.join(BIN, "benchmarks", "lookup_benchmark")
    small = dict(os.environ, RDMALLOC_REGION_SIZE=SMALL_REGIONS)
    variants = [("", None, []),
                (f" (RDMALLOC_REGION_SIZE={SMALL_REGIONS})", small,
                 ["--benchmark_filter=LookupRandom/threads:1"])]
    runs = {}
    for _ in range(rounds):
        for suffix, env, extra in variants:
            out = sh([binary, "--benchmark_format=json", f"--benchmark_min_time={min_time}"] + extra,
                     env=env)
            for b in json.loads(out)["benchmarks"]:
                runs.setdefault(b["name"] + suffix, []).append((b["cpu_time"], b.get("regions")))
    return {name: [statistics.median(ns for ns, _ in v), min(ns for ns, _ in v), v[0][1], len(v)]
            for name, v in runs.items()}


def reg_mr_vm(min_time):
    """An unmodified verbs program's malloc + ibv_reg_mr + ibv_dereg_mr + free per size, in
    the VM: {way: {size: ns per pair}} for way in kernel, forwarded, served, served_one."""
    subprocess.run(["bash", os.path.join(ROOT, "test", "vm", "setup.sh")], check=True,
                   stdout=subprocess.DEVNULL)
    out = sh([os.path.join(ROOT, "test", "vm", "run.sh"), "--timeout", "1800",
              os.path.join(ROOT, "benchmarks", "reg_mr_vm.sh"),
              os.path.join(BIN, "benchmarks", "reg_mr_benchmark"),
              os.path.join(BIN, "allocator", "librdmalloc.so"), str(min_time)])
    res = {}
    for line in out.splitlines():
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if "way" in f and "ns_reg_dereg" in f:
            res.setdefault(f["way"], {})[int(f["size"])] = {
                "pair": float(f["ns_per_pair"]), "buffer": float(f["ns_buffer_only"]),
                "reg": float(f["ns_reg_dereg"])}
    return res


def reg_mr_native(min_time, runs=3):
    """The served pair natively: no RDMA device here, so test/fake_ibverbs.cc stands in for
    libibverbs (it answers each region's one registration; every later request is served).
    {size: median ns of reg+dereg over `runs` runs}."""
    fake = os.path.join(BIN, "test", "libfake_ibverbs.so")
    env = dict(os.environ, LD_PRELOAD=f"{os.path.join(BIN, 'allocator', 'librdmalloc.so')} {fake}",
               RDMALLOC_BACKEND="verbs", RDMALLOC_VERBS_LIBRARY=fake,
               RDMALLOC_ACCESS="local_write,remote_read,remote_write")
    per = {}
    for _ in range(runs):
        out = sh([os.path.join(BIN, "benchmarks", "reg_mr_benchmark"), f"--min-time={min_time}"],
                 env=env)
        for line in out.splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if "ns_reg_dereg" in f:
                per.setdefault(int(f["size"]), []).append(float(f["ns_reg_dereg"]))
    return {size: median(v) for size, v in per.items()}


def reg_mr_table(L, reg, git):
    ways = ["kernel", "forwarded", "served"]
    sizes = sorted(reg.get("kernel", {}))
    L.append("## `ibv_reg_mr` in an unmodified verbs program (soft-RoCE in the VM)\n")
    L.append("`benchmarks/reg_mr_benchmark.cc` never includes `rdmalloc.h`: per message it does "
             "`malloc(n)`, `ibv_reg_mr` with local and remote rights, `ibv_dereg_mr`, `free`, on "
             "`rxe0` in the VM (`benchmarks/reg_mr_vm.sh`). *kernel*: no rdmalloc; *forwarded*: "
             "librdmalloc.so preloaded, default local-only heap, so the remote request goes to "
             "libibverbs; *served*: `RDMALLOC_ACCESS=local_write,remote_read,remote_write`, the "
             "request is served from the region's registration (docs/INTERPOSE.md). ns per pair "
             f"(malloc and free included), rdmalloc {git}; the CPU is emulated, so compare the ratios.\n")
    L.append("*reg+dereg* is timed around the registrations alone: messages go in windows of up "
             "to 16 and 4 MiB (one at a time from 4 MiB up), each buffer is allocated and written, "
             "then the window's buffers are registered and deregistered under the clock, then "
             "freed; the clock's own cost, timed beside them, is taken off. *buffer alone* is the "
             "rest of the message. Each is the median of 5 rounds. *served, one at a time*: the "
             "same with windows of one message (`--window=1`), as the sizes from 4 MiB up always "
             "go: under emulation a served pair timed alone, after its buffer's malloc and "
             "free, swings between runs and sizes by up to 3x, and the served column's rise at "
             "the large sizes stays within that. Natively the served pair does not depend on "
             "the size (below).\n")
    L.append("| size | buffer alone | reg+dereg kernel | reg+dereg forwarded | reg+dereg served | "
             "served, one at a time | kernel / served | whole message kernel / served |")
    L.append("|---|---|---|---|---|---|---|---|")
    for n in sizes:
        k, f, v = (reg.get(w, {}).get(n) for w in ways)
        if not (k and f and v):
            continue
        one = reg.get("served_one", {}).get(n)
        one = f"{one['reg']:,.0f}" if one else "–"
        ratio = f"**{k['reg'] / v['reg']:,.0f}×**" if v["reg"] > 0 else ""
        L.append(f"| {fmt_size(n)} | {v['buffer']:,.0f} | {k['reg']:,.0f} | {f['reg']:,.0f} | "
                 f"{v['reg']:,.0f} | {one} | {ratio} | {k['pair'] / v['pair']:,.0f}× |")
    L.append("")
    native = reg.get("native", {})
    if native:
        each = ", ".join(f"{fmt_size(int(n))} {ns:.0f} ns" for n, ns in
                         sorted(native.items(), key=lambda kv: int(kv[0])))
        L.append("Natively (no VM: this machine has no RDMA device, so the stand-in libibverbs of "
                 "`test/fake_ibverbs.cc` answers the one registration of each region, and every "
                 f"later request is served), a served reg+dereg pair costs {each} (median of 3 "
                 "runs, same build; `LD_PRELOAD=\"librdmalloc.so libfake_ibverbs.so\" "
                 "RDMALLOC_BACKEND=verbs RDMALLOC_VERBS_LIBRARY=libfake_ibverbs.so "
                 "RDMALLOC_ACCESS=local_write,remote_read,remote_write reg_mr_benchmark`).\n")


def mpi_vm(iters):
    """The plain MPI program over UCX in the VM (examples/mpi/mpi_served_vm.sh): per way, us per
    ping-pong iteration per size, kernel registrations, and what rdmalloc served."""
    subprocess.run(["bash", os.path.join(ROOT, "test", "vm", "setup.sh")], check=True,
                   stdout=subprocess.DEVNULL)
    out = sh([os.path.join(ROOT, "test", "vm", "run.sh"), "--timeout", "3600",
              os.path.join(ROOT, "examples", "mpi", "mpi_served_vm.sh"),
              os.path.join(BIN, "examples", "mpi", "mpi_pingpong"),
              os.path.join(BIN, "allocator", "librdmalloc.so"),
              os.path.join(ROOT, "examples", "mpi", "check_served.py"), str(iters)])
    res = {"iters": iters, "us": {}, "kernel_regs": {}}
    for line in out.splitlines():
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if "size" in f:
            res["us"].setdefault(f["way"], {})[int(f["size"])] = float(f["us"])
        elif "kernel_regs" in f:
            res["kernel_regs"][f["way"]] = int(f["kernel_regs"])
        m = re.match(r"rdmalloc: UCX asked (\d+) registrations: (\d+) served, (\d+) forwarded", line)
        if m:
            res["asked"], res["served"], res["forwarded"] = (int(x) for x in m.groups())
    return res


def mpi_table(L, mpi, git):
    us = {w: {int(k): v for k, v in d.items()} for w, d in mpi["us"].items()}
    regs = mpi["kernel_regs"]
    L.append("## An unmodified MPI program over UCX: registrations served by rdmalloc (soft-RoCE in the VM)\n")
    L.append("`examples/mpi/mpi_pingpong --no-lookup` (fresh `malloc` buffers per message, every byte "
             "checked; it never calls rdmalloc) under Open MPI 4.1.4's UCX pml, UCX 1.13 on RC verbs "
             "over `rxe0`, two ranks in the VM (`examples/mpi/mpi_served_vm.sh`, "
             f"{mpi['iters']} ping-pongs per size). *UCX cache*: UCX's defaults (its registration "
             "cache and memory hooks), no rdmalloc. *direct*: UCX's cache and hooks off "
             "(`UCX_IB_REG_METHODS=direct UCX_RCACHE_ENABLE=n UCX_MEM_MALLOC_HOOKS=no "
             "UCX_MEM_MMAP_HOOK_MODE=none`; UCX 1.13 has no `UCX_MEM_EVENTS`), no rdmalloc. "
             "*rdmalloc*: the same, with librdmalloc.so preloaded and "
             "`RDMALLOC_ACCESS=local_write,remote_read,remote_write,remote_atomic`, so UCX's own "
             "`ibv_reg_mr` calls are served from the heap's registrations (docs/INTERPOSE.md). "
             f"rdmalloc {git}. The CPU is emulated (TCG): the times are not performance, compare "
             "the ratios and the counts.\n")
    L.append(f"Kernel registrations per run, counted by a kprobe on `rxe_reg_user_mr`: UCX cache "
             f"**{regs.get('ucx-cache', '?')}**, direct **{regs.get('direct', '?')}**, rdmalloc "
             f"**{regs.get('rdmalloc', '?')}** (UCX asked {mpi.get('asked', '?')}: "
             f"{mpi.get('served', '?')} served, {mpi.get('forwarded', '?')} forwarded; the rest are "
             "rdmalloc's own region registrations).\n")
    L.append("| size | round trip, UCX cache (µs) | round trip, rdmalloc (µs) | UCX cache / rdmalloc | "
             "bandwidth UCX cache (MB/s) | bandwidth rdmalloc (MB/s) | direct / rdmalloc |")
    L.append("|---|---|---|---|---|---|---|")
    for n in sorted(us.get("rdmalloc", {})):
        c, r, d = us.get("ucx-cache", {}).get(n), us["rdmalloc"][n], us.get("direct", {}).get(n)
        if not (c and r and d):
            continue
        L.append(f"| {fmt_size(n)} | {c:,.1f} | {r:,.1f} | {c / r:.2f}× | {2 * n / c:#.3g} | "
                 f"{2 * n / r:#.3g} | {d / r:.2f}× |")
    L.append("")
    L.append("A round trip is one iteration of the program: `malloc`, fill, send, receive, check and "
             "`free` on both ranks; bandwidth is 2 × size / round trip. The first sizes include "
             "connection set-up.\n")


def fmt_size(n):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s:
            return f"{n // s} {unit}"
    return f"{n} B"


def plot(rows, per, png):
    data = os.path.join(os.path.dirname(png), "benchmarks.dat")
    msg = os.path.join(os.path.dirname(png), "benchmarks_msg.dat")
    with open(data, "w") as f:
        for r in rows:
            f.write(f"\"{r['workload']}/{r['threads']}t\" {r['glibc'] / r['jemalloc']:.4f} 1.0 "
                    f"{r['rdm_vs_jem']:.4f}\n")
    with open(msg, "w") as f:
        for size in sorted(per):
            p = per[size]
            f.write(f"\"{fmt_size(size)}\" {p.get('Rdmalloc', 0):.2f} {p.get('UcxRcache', 0):.2f} "
                    f"{p.get('RegPerMsg', 0):.2f}\n")
    script = f"""
set terminal png size 1400,560 font ",11" noenhanced
set output "{png}"
set multiplot layout 1,2
set title "Allocator throughput relative to stock jemalloc (log scale, higher is better)"
set logscale y
set yrange [0.1:20]
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set xtics rotate by -35
set grid ytics
set key top left
plot "{data}" using 2:xtic(1) title "glibc", "" using 3 title "jemalloc", "" using 4 title "rdmalloc"
set title "Fresh buffer per message: ns per message (log scale, lower is better)"
set yrange [*:*]
plot "{msg}" using 2:xtic(1) title "rdmalloc lookup", "" using 3 title "UCX rcache", "" using 4 title "register+deregister"
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    os.remove(data)
    os.remove(msg)


def message_tables(L, per, keys):
    L.append("| n | rdmalloc | UCX rcache | register + deregister | UCX / rdmalloc | reg+dereg / rdmalloc |")
    L.append("|---|---|---|---|---|---|")
    for size in sorted(per):
        p = per[size]
        L.append(f"| {fmt_size(size)} | {p['Rdmalloc']:.1f} | {p['UcxRcache']:.1f} | {p['RegPerMsg']:.1f} | "
                 f"{p['UcxRcache'] / p['Rdmalloc']:.1f}× | {p['RegPerMsg'] / p['Rdmalloc']:.0f}× |")
    L.append("")
    L.append("Keys alone, for a buffer that stays allocated (ns per call):\n")
    L.append("| n | rdmalloc_lookup | ucs_rcache_get + put | UCX / rdmalloc |")
    L.append("|---|---|---|---|")
    for size in sorted(keys):
        k = keys[size]
        L.append(f"| {fmt_size(size)} | {k['Rdmalloc']:.1f} | {k['UcxRcache']:.1f} | "
                 f"{k['UcxRcache'] / k['Rdmalloc']:.1f}× |")
    L.append("")


def ratio_interval(row, allocator, what=""):
    """median_interval of allocator / jemalloc over a workload row's rounds."""
    mine, theirs = row.get(allocator + what + "_rounds"), row.get("jemalloc" + what + "_rounds")
    if not mine or not theirs:
        return None
    return median_interval([m / t for m, t in zip(mine, theirs)])


def write_markdown(path, res):
    rows, per, keys, steady, look, vm = (res[k] for k in ("rows", "per", "keys", "steady", "look", "vm"))
    # Runs before the regions column saved {"BM_..._median": ns}, the median of 5 repetitions.
    look = {k.replace("_median", ""): (v if isinstance(v, list) else [v, None, None, None])
            for k, v in look.items()}
    L = []
    L.append("# rdmalloc benchmarks\n")
    L.append(f"Generated by `bash benchmarks/run.sh` (`benchmarks/run.py --rounds {res['rounds']}`) on "
             f"{res['started']} UTC, rdmalloc {res['git']}. Raw results: `benchmarks.json`.\n")
    alone = any(k.endswith("_git") for k in res)
    L.append(f"Machine: {res['machine']}; Debian jemalloc 5.3.0 (`LD_PRELOAD=libjemalloc.so.2`); "
             "rdmalloc on the io_uring backend (no RDMA device here). Every number below comes from "
             + ("this run, but for the sections that name a run of their own (`--only-*`)"
                if alone else "this one run") +
             "; the machine is shared and noisy, so read ratios, not absolute values.\n")
    L.append("![throughput and message path](benchmarks.png)\n")
    L.append("## Allocator workloads\n")
    rounds = res.get("rows_rounds", res["rounds"])
    if "rows_git" in res:
        L.append(f"From a run of this section alone (`benchmarks/run.py --only-workloads --rounds "
                 f"{rounds}`) on {res['rows_started']} UTC, rdmalloc {res['rows_git']}.\n")
    order = res.get("rows_order", res.get("order", "rotated"))
    L.append(f"Operations per second, median of {rounds} rounds; each round runs the three "
             "allocators and a second copy of stock jemalloc back to back, "
             + ("in an order rotated each round (so each always ran right after the same other "
                "one)" if order == "rotated" else
                "in orders balanced over every four rounds (a Williams design: each allocator "
                "runs first, last, and right after each other one equally often)")
             + ", each preloaded from a fresh "
             "copy of its library (same binaries; see `benchmarks/workloads/README.md`; where a "
             "library file's pages lie showed in its speed, up to 25 % between byte-identical "
             "copies). The "
             "ratios are taken within each round and their median is shown, with a 95 % interval "
             "(below): noise that changes between rounds cancels, and a wide interval says the "
             "workload itself swings (xmalloc at 2 threads flips between two speeds with thread "
             "placement, for every allocator). Peak RSS is the largest of the runs; in "
             "parentheses, the ratio of the median runs' peaks, which one run's outlier does not "
             "move (runs before it was recorded show none). *A/A* is the "
             "second copy of jemalloc against the first, taken the same way: two identical "
             "allocators, so its distance from 1.00 is this machine's noise, and a ratio of "
             "rdmalloc's that strays no further is parity.\n")
    L.append("The interval beside each ratio is a 95 % confidence interval for its median, "
             "distribution-free (the sign test's: with n rounds, the k-th smallest and k-th largest "
             "of the rounds' ratios, k the largest that leaves at most 5 % outside; with "
             f"{rounds} rounds, k = {interval_rank(rounds)}). An interval wholly below 1.00 is a loss this run "
             "shows beyond its noise; one that holds 1.00 shows no difference.\n")
    L.append("| workload | threads | glibc | jemalloc | rdmalloc | rdmalloc / jemalloc | 95 % interval | "
             "A/A: jemalloc / jemalloc [interval] | rdmalloc / glibc | peak RSS jemalloc | "
             "peak RSS rdmalloc | RSS rdmalloc / jemalloc | RSS A/A |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mine, theirs = ratio_interval(r, "rdmalloc"), ratio_interval(r, JEMALLOC_AGAIN)
        spread = "%.3f–%.3f" % tuple(mine) if mine else "—"
        again = (f"{r['jem_vs_jem']:.3f}" + (" [%.3f–%.3f]" % tuple(theirs) if theirs else "")
                 if "jem_vs_jem" in r else "—")
        again_rss = "%.2f" % r["jem_rss_vs_jem"] if "jem_rss_vs_jem" in r else "—"
        L.append(f"| {r['workload']} | {r['threads']} | {r['glibc']:.3g} | {r['jemalloc']:.3g} | "
                 f"{r['rdmalloc']:.3g} | **{r['rdm_vs_jem']:.3f}** | {spread} | {again} | "
                 f"{r['rdm_vs_glibc']:.3f} | "
                 f"{r['jemalloc_rss'] / 1024:.1f} MiB | {r['rdmalloc_rss'] / 1024:.1f} MiB | "
                 f"{r['rss_vs_jem']:.2f}"
                 + (f" ({r['rss_median_vs_jem']:.2f})" if "rss_median_vs_jem" in r else "") +
                 f" | {again_rss} |")
    worst = min(rows, key=lambda r: r["rdm_vs_jem"])
    L.append("")
    L.append(f"Lowest throughput ratio to jemalloc: {worst['rdm_vs_jem']:.3f} ({worst['workload']}, "
             f"{worst['threads']} thread(s)); target ≥ 1.00.")
    controls = [r for r in rows if "jem_vs_jem" in r]
    if controls:
        aa = [r["jem_vs_jem"] for r in controls]
        aa_rss = [r["jem_rss_vs_jem"] for r in controls]
        below = [r for r in controls if r["rdm_vs_jem"] < 1.0]
        shown = {a: [(r, ratio_interval(r, a)) for r in controls] for a in ("rdmalloc", JEMALLOC_AGAIN)}
        losses = {a: [(r, i) for r, i in v if i and i[1] < 1.0] for a, v in shown.items()}
        gains = {a: [(r, i) for r, i in v if i and i[0] > 1.0] for a, v in shown.items()}

        def named(pairs):
            return ", ".join(f"{r['workload']} at {r['threads']} thread(s) ({i[0]:.3f}–{i[1]:.3f})"
                             for r, i in pairs) or "none"
        L.append(f"The A/A control's median ratios run from {min(aa):.3f} to {max(aa):.3f} in this "
                 f"run, its peak RSS ratios from {min(aa_rss):.2f} to {max(aa_rss):.2f}. "
                 f"{len(below)} of rdmalloc's {len(controls)} throughput ratios are below 1.00. "
                 f"Intervals wholly below 1.00, a loss beyond this run's noise: rdmalloc's "
                 f"{named(losses['rdmalloc'])}; the A/A control's {named(losses[JEMALLOC_AGAIN])}. "
                 f"Wholly above: rdmalloc's {named(gains['rdmalloc'])}; the A/A control's "
                 f"{named(gains[JEMALLOC_AGAIN])}.\n")
    else:
        L.append("")
    if all("faults_vs_jem" in r for r in rows):
        L.append("What the clock does not separate from this machine's noise, from the same runs: "
                 "page faults (minor and major, of the whole run; median of the rounds) and CPU "
                 "time (user and system, all threads: time spent waiting is not in it), each "
                 "rdmalloc / jemalloc, with the A/A control beside. Below 1.00 rdmalloc spends "
                 "less.\n")
        # Runs before the rounds' CPU times were kept show the rounds' range.
        kept = all(r.get("rdmalloc_cpu_rounds") for r in rows)
        what = "95 % interval" if kept else "rounds' range"
        L.append("| workload | threads | faults jemalloc | faults rdmalloc | faults rdmalloc / jemalloc | "
                 f"faults A/A | CPU time rdmalloc / jemalloc ({what}) | CPU time A/A ({what}) |")
        L.append("|---|---|---|---|---|---|---|---|")
        for r in rows:
            spans = [ratio_interval(r, a, "_cpu") or r[key + "_range"]
                     for a, key in (("rdmalloc", "cpu_vs_jem"), (JEMALLOC_AGAIN, "jem_cpu_vs_jem"))]
            L.append(f"| {r['workload']} | {r['threads']} | {r['jemalloc_faults']:.0f} | "
                     f"{r['rdmalloc_faults']:.0f} | **{r['faults_vs_jem']:.3f}** | "
                     f"{r['jem_faults_vs_jem']:.3f} | **{r['cpu_vs_jem']:.3f}** "
                     f"({spans[0][0]:.2f}–{spans[0][1]:.2f}) | "
                     f"{r['jem_cpu_vs_jem']:.3f} ({spans[1][0]:.2f}–{spans[1][1]:.2f}) |")
        L.append("")
    if res.get("instructions"):
        instruction_table(L, res["instructions"], res.get("instructions_git", res["git"]))
    if res.get("startup"):
        L.append("## Short-lived programs\n")
        L.append("Whole runs, fork to exit (wall clock), and peak RSS, median of "
                 f"{res['startup_runs']} interleaved runs per allocator: what each allocator costs a "
                 "program up front. Time ratios below 1.00 mean rdmalloc is faster.\n")
        faults = all("rdmalloc_faults" in r for r in res["startup"])  # runs before kept none
        L.append("| program | glibc | jemalloc | rdmalloc | time rdmalloc / jemalloc | "
                 "RSS glibc | RSS jemalloc | RSS rdmalloc | RSS rdmalloc / jemalloc |"
                 + (" page faults glibc / jemalloc / rdmalloc |" if faults else ""))
        L.append("|---|---|---|---|---|---|---|---|---|" + ("---|" if faults else ""))
        for r in res["startup"]:
            L.append(f"| {r['program']} | {r['glibc'] * 1e3:.2f} ms | {r['jemalloc'] * 1e3:.2f} ms | "
                     f"{r['rdmalloc'] * 1e3:.2f} ms | **{r['rdmalloc'] / r['jemalloc']:.3f}** | "
                     f"{r['glibc_rss'] / 1024:.2f} MiB | {r['jemalloc_rss'] / 1024:.2f} MiB | "
                     f"{r['rdmalloc_rss'] / 1024:.2f} MiB | **{r['rdmalloc_rss'] / r['jemalloc_rss']:.2f}** |"
                     + (f" {r['glibc_faults']:.0f} / {r['jemalloc_faults']:.0f} / "
                        f"{r['rdmalloc_faults']:.0f} |" if faults else ""))
        L.append("")
    if res.get("scaling"):
        L.append("## Thread scaling\n")
        L.append(f"Operations per second at 1, 2, 4 and 8 threads on this machine's {os.cpu_count()} "
                 "cores, median of the rounds. `extent_churn` runs with "
                 "`MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0`: every malloc and free goes "
                 "through jemalloc's extent hooks, into rdmalloc's region store, where threads of "
                 "different arenas would wait for each other on a lock of rdmalloc's; *lock waits* "
                 "counts, per 1000 operations, the extent requests and returns that found their "
                 "shard's lock held (`heap_lock_waits`). `larson` stays in jemalloc's caches, for "
                 "contrast.\n")
        L.append("| workload | threads | glibc | jemalloc | rdmalloc | rdmalloc / jemalloc | lock waits / 1k ops |")
        L.append("|---|---|---|---|---|---|---|")
        for r in res["scaling"]:
            w = "" if r["waits_per_kop"] is None else f"{r['waits_per_kop']:.3f}"
            L.append(f"| {r['workload']} | {r['threads']} | {r['glibc']:.3g} | {r['jemalloc']:.3g} | "
                     f"{r['rdmalloc']:.3g} | **{r['rdmalloc'] / r['jemalloc']:.3f}** | {w} |")
        L.append("")
    L.append("## Lookup\n")
    if "look_git" in res:
        L.append(f"From a run of this section alone (`benchmarks/run.py --only-lookup`) on "
                 f"{res['look_started']} UTC, rdmalloc {res['look_git']}.\n")
    runs = next(iter(look.values()))[3] if look else None
    L.append("`rdmalloc_lookup` on a registered region, CPU time per call (with 2 threads each "
             "thread's own time): "
             + (f"the median of {runs} runs of the benchmark, and the fastest run; the random case's "
                f"runs at RDMALLOC_REGION_SIZE={SMALL_REGIONS} alternate with them. *regions*: how many "
                "the random pattern's buffers lie in.\n" if runs else "the median of 5 repetitions.\n"))
    L.append("| benchmark | ns | fastest run | regions |")
    L.append("|---|---|---|---|")
    for name, (ns, fastest, regions, _) in look.items():
        L.append(f"| {name} | {ns:.2f} | {'' if fastest is None else f'{fastest:.2f}'} | "
                 f"{'' if regions is None else f'{regions:.0f}'} |")
    L.append("")
    probe = look.get("BM_LookupRandomProbeOnly", (None,))[0]
    for name in ("BM_LookupRandom/threads:1",
                 f"BM_LookupRandom/threads:1 (RDMALLOC_REGION_SIZE={SMALL_REGIONS})"):
        rnd, _, regions, _ = look.get(name, (None, None, None, None))
        if rnd is None or probe is None:
            continue
        where = "" if regions is None else f" in {regions:.0f} regions"
        L.append(f"On the random pattern (8192 live buffers{where}), the lookup itself costs "
                 f"**{rnd - probe:.2f} ns**: {rnd:.2f} ns per iteration less {probe:.2f} ns for the "
                 "same loop without the call (`BM_LookupRandomProbeOnly`: the index table and each "
                 "buffer's address and length loaded and passed on).\n")
    L.append("## The message path: a fresh buffer per message\n")
    L.append("Each message: `malloc(n)`, get keys for it, touch it, `free`. Keys come from "
             "`rdmalloc_lookup` (the heap is registered already), from registering and deregistering "
             "the buffer every time, or from UCX's registration cache (`ucs_rcache` from Debian's "
             "libucx 1.13, with its UCM memory events on, as MPI libraries use it). All three pin "
             "through the same io_uring backend. Median of 3 repetitions, ns per message:\n")
    message_tables(L, per, keys)
    L.append("Both caches share the allocator's own `malloc`/`free`, which dominates for large "
             "buffers (jemalloc serves sizes above 32 KiB from its arena, not its thread cache).\n")
    L.append(f"Steady state, after 1 GiB of warm-up churn (64 B – 4 MiB buffers, each looked up): "
             f"**{steady.get('reg_per_GiB', 0):g} registrations and {steady.get('dereg_per_GiB', 0):g} "
             "deregistrations per GiB allocated**.\n")
    L.append("Registering through io_uring costs far less than `ibv_reg_mr` on a NIC (UCX models "
             "the latter as 16 µs + 0.06 ns/B, i.e. ≈ 20 µs for 64 KiB and ≈ 268 µs for 4 MiB), so the "
             "register-per-message column here understates what rdmalloc saves on real hardware.\n")
    if res.get("reg_mr"):
        reg_mr_table(L, res["reg_mr"], res.get("reg_mr_git", res["git"]))
    if res.get("mpi"):
        mpi_table(L, res["mpi"], res.get("mpi_git", res["git"]))
    if vm is not None:
        vper, vkeys = vm
        L.append("## The message path on real verbs (soft-RoCE in the VM)\n")
        L.append("The same benchmark inside the QEMU VM of `test/vm/` (Debian's 6.1 kernel, `rdma_rxe` "
                 "on a dummy netdev), rdmalloc on the verbs backend: every key is an `ibv_reg_mr` MR, "
                 "and register-per-message calls `ibv_reg_mr`/`ibv_dereg_mr`. The CPU is emulated "
                 "(TCG), so absolute times are inflated; the ratios are the point. Median of 3, ns:\n")
        message_tables(L, vper, vkeys)
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def save(res, out):
    with open(os.path.join(os.path.dirname(out), "benchmarks.json"), "w") as f:
        json.dump(res, f, indent=1)


def render(res, out):
    # JSON keys are strings: sizes back to numbers.
    def ints(d):
        return {int(k): v for k, v in d.items()}
    res = dict(res, per=ints(res["per"]), keys=ints(res["keys"]),
               vm=(ints(res["vm"][0]), ints(res["vm"][1])) if res["vm"] else None,
               reg_mr={w: ints(v) for w, v in res.get("reg_mr", {}).items()
                       if w == "native" or all(isinstance(x, dict) for x in v.values())})
    plot(res["rows"], res["per"], os.path.join(os.path.dirname(out), "benchmarks.png"))
    write_markdown(out, res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--min-time", default="0.5")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "BENCHMARKS.md"))
    ap.add_argument("--vm", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the message path on real verbs in the soft-RoCE VM")
    ap.add_argument("--vm-min-time", default="0.05")
    ap.add_argument("--startup-runs", type=int, default=21)
    ap.add_argument("--render-only", action="store_true",
                    help="rewrite the markdown and plot from docs/benchmarks.json")
    ap.add_argument("--only-reg-mr", action="store_true",
                    help="run only the ibv_reg_mr section (in the VM) into docs/benchmarks.json")
    ap.add_argument("--only-mpi", action="store_true",
                    help="run only the MPI-over-UCX section (in the VM) into docs/benchmarks.json")
    ap.add_argument("--only-instructions", action="store_true",
                    help="run only the callgrind instruction counts into docs/benchmarks.json")
    ap.add_argument("--only-workloads", action="store_true",
                    help="run only the timed allocator workloads (--rounds, --threads) into "
                         "docs/benchmarks.json")
    ap.add_argument("--only-lookup", action="store_true",
                    help="run only the lookup benchmark into docs/benchmarks.json")
    ap.add_argument("--mpi-iters", type=int, default=10)
    ap.add_argument("--instruction-runs", type=int, default=5,
                    help="callgrind runs per workload and allocator (the median is reported)")
    args = ap.parse_args()
    if args.render_only:
        with open(os.path.join(os.path.dirname(args.out), "benchmarks.json")) as f:
            render(json.load(f), args.out)
        return
    global BIN
    # One section anew, into the saved results: (its target, its key, how to run it).
    only = {"mpi": ("//examples/mpi:mpi_pingpong", lambda: mpi_vm(args.mpi_iters)),
            "instructions": ("//benchmarks/workloads/...",
                             lambda: instructions(args.instruction_runs)),
            "rows": ("//benchmarks/workloads/...",
                     lambda: workloads(args.rounds, [int(t) for t in args.threads.split(",")])),
            "reg_mr": ("//benchmarks:reg_mr_benchmark",
                       lambda: dict(reg_mr_vm(args.min_time),
                                    native=reg_mr_native(args.min_time))),
            "look": ("//benchmarks:lookup_benchmark", lambda: lookup(args.min_time, args.rounds))}
    section = ("mpi" if args.only_mpi else "reg_mr" if args.only_reg_mr else
               "look" if args.only_lookup else
               "instructions" if args.only_instructions else
               "rows" if args.only_workloads else None)
    if section is not None:
        target, run_section = only[section]
        subprocess.run(["bazel", "build", "-c", "opt", target, "//allocator:librdmalloc.so",
                        "//test:libfake_ibverbs.so"], cwd=ROOT, check=True)
        BIN = sh(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=ROOT).strip()
        with open(os.path.join(os.path.dirname(args.out), "benchmarks.json")) as f:
            res = json.load(f)
        started = datetime.datetime.utcnow()
        res[section] = run_section()
        res[section + "_git"] = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).strip()
        res[section + "_started"] = f"{started:%Y-%m-%d %H:%M}"
        res[section + "_rounds"] = args.rounds
        res[section + "_order"] = ORDER
        save(res, args.out)
        render(res, args.out)
        print(f"wrote {args.out}")
        return
    started = datetime.datetime.utcnow()
    subprocess.run(["bazel", "build", "-c", "opt", "//benchmarks/...", "//allocator:librdmalloc.so",
                    "//examples/mpi:mpi_pingpong", "//test:libfake_ibverbs.so"],
                   cwd=ROOT, check=True)
    BIN = sh(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=ROOT).strip()
    rows = workloads(args.rounds, [int(t) for t in args.threads.split(",")])
    instruction_rows = instructions(args.instruction_runs)
    scale_rows = scaling(args.rounds)
    start_rows = startup(args.startup_runs)
    per, keys, steady = message_path(args.min_time)
    vm = None
    if args.vm:
        subprocess.run(["bash", os.path.join(ROOT, "test", "vm", "setup.sh")], check=True,
                       stdout=subprocess.DEVNULL)
        vm = message_path(args.vm_min_time, vm=True)[:2]
    reg_mr = dict(reg_mr_vm(args.vm_min_time), native=reg_mr_native(args.min_time)) if args.vm else {}
    mpi = mpi_vm(args.mpi_iters) if args.vm else {}
    look = lookup(args.min_time, args.rounds)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    res = {
        "rounds": args.rounds, "started": f"{started:%Y-%m-%d %H:%M}",
        "git": sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).strip(),
        "machine": f"{os.cpu_count()} cores ({cpu}), {platform.release()} kernel, glibc {platform.libc_ver()[1]}",
        "order": ORDER, "rows": rows, "instructions": instruction_rows, "scaling": scale_rows, "startup": start_rows, "startup_runs": args.startup_runs,
        "per": per, "keys": keys, "steady": steady, "look": look,
        "vm": [vm[0], vm[1]] if vm else None, "reg_mr": reg_mr, "mpi": mpi,
    }
    save(res, args.out)
    render(res, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
