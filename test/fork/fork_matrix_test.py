#!/usr/bin/env python3
"""The fork test matrix (docs/TESTING.md, "The fork matrix").

Runs test/fork/fork_matrix (one program, not linked against rdmalloc) in every
cell of
    {background threads off, on} x {workload} x {child action} x {jemalloc, rdmalloc}
under LD_PRELOAD of stock jemalloc and of librdmalloc.so, each cell with its
own timeouts, and prints a table: per cell ok (forks done, seconds), HANG at
fork N (what was stuck), FAIL (why) or n/a under jemalloc (the workload needs
rdmalloc's API). Fails if any rdmalloc cell is not ok, or if a jemalloc cell
that can run is not ok twice in a row (the baseline must be sane; one hang of
stock jemalloc's own is retried and reported).

Profiles:
  host  workloads plain, purge, arena, class, observers (the default)
  vm    workload lookups with RDMALLOC_BACKEND=verbs: run inside the soft-RoCE
        VM (//test/fork:fork_matrix_vm_test), fewer forks, longer timeouts

usage: fork_matrix_test.py PROGRAM LIBRDMALLOC [--jemalloc=LIB] [--profile=host|vm]
         [--workloads=W,...] [--filter=REGEX] [--jobs=N] [--scale=F] [--gdb]
  --workloads  instead of the profile's (lookups runs on the host too, on uring)
  --filter  only cells whose name ("bg=on plain allocate rdmalloc") matches
  --scale   multiply every cell's fork count (and soft time budget) by F
  --gdb     FORK_MATRIX_GDB=1: backtraces of every thread of a hung process
Environment: FORK_MATRIX_WORKLOADS, FORK_MATRIX_FILTER, FORK_MATRIX_SCALE, FORK_MATRIX_JOBS,
FORK_MATRIX_GDB
(for bazel test --test_env=...).
"""
import argparse
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
BG = {
    "off": "background_thread:false",
    "on": "background_thread:true,dirty_decay_ms:1,muzzy_decay_ms:0",
}
CHILDREN = ["allocate", "threads", "exec"]
RDMALLOC_ONLY = {"class", "observers", "lookups"}


class Profile:
    def __init__(self, name, workloads, fork_timeout, child_timeout, env):
        self.name = name
        self.workloads = workloads
        self.fork_timeout = fork_timeout  # one fork(), one post-fork check, one stuck worker op
        self.child_timeout = child_timeout  # one child, fork to exit
        self.env = env

    def plan(self, bg, workload, child):
        """(forks, soft budget in seconds) of a cell: no new fork after the budget."""
        if self.name == "vm":
            # TCG: a fork with a child takes ~1 s, an exec'd child (libibverbs,
            # rdmalloc's verbs start-up, two grandchildren) 4-6 s.
            return (8, 20) if child == "exec" else (20, 14)
        # The cells that reproduce the two known fork hangs get the most
        # forks: 2 churn threads with background threads (hung after 2-110
        # forks, median ~40, when found), and arena create/destroy churn
        # (hangs within ~10 forks).
        if workload in ("plain", "purge") and bg == "on" and child == "allocate":
            return 300, 15
        if workload == "arena" and child == "allocate":
            return 200, 15
        return 40, 8


# Host timeouts: a fork took at most 0.6 s and a child 0.4 s with the cores
# overloaded (load 10 on 2 cores); 10 s leaves room for a busier CI machine.
PROFILES = {
    "host": Profile("host", ["plain", "purge", "arena", "class", "observers"],
                    fork_timeout=10, child_timeout=10, env={}),
    # TCG emulation runs some 20-50 times slower than the host.
    "vm": Profile("vm", ["lookups"], fork_timeout=30, child_timeout=30,
                  env={"RDMALLOC_BACKEND": "verbs"}),
}


class Cell:
    def __init__(self, bg, workload, child, allocator):
        self.bg, self.workload, self.child, self.allocator = bg, workload, child, allocator
        self.status = "?"  # ok, HANG, FAIL, n/a
        self.text = ""     # what the table shows
        self.detail = ""   # the reason, in full
        self.forks_done = None
        self.forks = None
        self.seconds = 0.0
        self.output = ""
        self.log = None
        self.first_try = None  # a stock jemalloc cell's failed first try (run_cell_checked)

    @property
    def name(self):
        return f"bg={self.bg} {self.workload} {self.child} {self.allocator}"

    def expected_na(self):
        return self.allocator == "jemalloc" and self.workload in RDMALLOC_ONLY


def parse_result(cell, rc, out, timed_out):
    """Fills in the cell's status from the program's RESULT line and exit code."""
    lines = [l for l in out.splitlines() if l.startswith("fork_matrix: RESULT ")]
    m = re.match(r"fork_matrix: RESULT (\S+) ?(.*)", lines[-1]) if lines else None
    if timed_out:
        cell.status, cell.text = "HANG", "HANG (killed by the driver)"
        cell.detail = ("no report from the program's own watchdog; killed after "
                       f"{cell.seconds:.0f} s")
        return
    if m is None:
        how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
        cell.status, cell.text = "FAIL", f"FAIL: {how}, no RESULT line"
        cell.detail = cell.text
        return
    kind, rest = m.group(1), m.group(2)
    fields = dict(re.findall(r"(\w+)=(\S+)", rest.split(" where=")[0].split(" reason=")[0]))
    tail = re.search(r" (?:where|reason)=(.*)", rest)
    cell.detail = tail.group(1) if tail else rest
    expected_rc = {"ok": (0,), "FAIL": (1,), "HANG": (3, 4), "NA": (5,)}.get(kind, ())
    if rc not in expected_rc:
        cell.status, cell.text = "FAIL", f"FAIL: RESULT {kind} with exit code {rc}"
        return
    if kind == "ok":
        done, total = fields["forks"].split("/")
        cell.forks_done, cell.forks = int(done), int(total)
        cell.status = "ok"
        cell.text = f"ok {done}/{total}"
        if "stopped" in fields:
            cell.text += " (budget)"
        cell.detail = rest
    elif kind == "NA":
        cell.status = "n/a"
        cell.text = "n/a under " + cell.allocator
    elif kind == "HANG":
        cell.status = "HANG"
        cell.forks_done = int(fields.get("forks_done", 0))
        where = cell.detail
        if rc == 4:
            what = "child hung"
        elif "main thread in fork()" in where:
            what = "in fork()"
        elif where.startswith("worker "):
            what = where.split(" for ")[0].replace("worker ", "")
        else:
            what = where.split(" for ")[0]
        cell.text = f"HANG at fork {fields.get('fork', '?')} ({what})"
    else:
        cell.status = "FAIL"
        cell.forks_done = int(fields.get("forks_done", 0))
        m = re.match(r"child (?:exit code (\d+)|killed by signal (.*))", cell.detail)
        if m:
            short = f"child exit {m.group(1)}" if m.group(1) else f"child {m.group(2)}"
        else:
            short = cell.detail if len(cell.detail) <= 30 else cell.detail[:27] + "..."
        cell.text = f"FAIL at fork {fields.get('fork', '?')} ({short})"


def run_program(cmd, env, timeout):
    """Runs cmd in a process group of its own; returns (rc, output, timed out, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, errors="replace")
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    # Children of a hung run are in its process group: none may outlive it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.returncode, out, timed_out, time.monotonic() - t0


# Negative controls: a fault put in at fork 3 (fork_matrix --inject) under
# stock jemalloc must end as this status, with this in its reason; otherwise
# the harness would miss that kind of failure.
CONTROLS = [
    ("fork-hang", "HANG", "main thread in fork()"),
    ("child-hang", "HANG", "child did not exit"),
    ("worker-hang", "HANG", "worker churn0 stuck in malloc"),
    ("child-fails", "FAIL", "child exit code 34"),
    ("lost-bytes", "FAIL", "lost its bytes"),
]


def run_control(control, args, libs):
    fault, status, reason = control
    cell = Cell("off", "plain", "allocate", "jemalloc")
    cmd = [args.program, "--workload=plain", "--child=allocate", "--forks=6", "--expect=jemalloc",
           "--fork-timeout=1", "--child-timeout=1", "--stall-timeout=1", "--deadline=20",
           f"--inject={fault}"]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env["LD_PRELOAD"] = libs["jemalloc"]
    rc, out, timed_out, cell.seconds = run_program(cmd, env, 60)
    parse_result(cell, rc, out, timed_out)
    cell.output = out
    return fault, cell, cell.status == status and reason in cell.detail


def run_cell(cell, args, profile, libs, logdir, extra=()):
    forks, budget = profile.plan(cell.bg, cell.workload, cell.child)
    forks = max(1, int(forks * args.scale))
    budget *= args.scale
    cmd = [
        args.program,
        f"--workload={cell.workload}",
        f"--child={cell.child}",
        f"--forks={forks}",
        f"--expect={cell.allocator}",
        f"--expect-bg={1 if cell.bg == 'on' else 0}",
        f"--fork-timeout={profile.fork_timeout}",
        f"--stall-timeout={profile.fork_timeout}",
        f"--child-timeout={profile.child_timeout}",
        f"--max-seconds={budget}",
        f"--deadline={budget + 4 * profile.fork_timeout + profile.child_timeout}",
    ]
    cmd += extra
    if profile.env.get("RDMALLOC_BACKEND") and cell.allocator == "rdmalloc":
        cmd.append(f"--expect-backend={profile.env['RDMALLOC_BACKEND']}")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env.update(profile.env)
    env["LD_PRELOAD"] = libs[cell.allocator]
    env["MALLOC_CONF"] = BG[cell.bg]
    if args.gdb:
        env["FORK_MATRIX_GDB"] = "1"
    # The program's watchdog reports hangs; this outer limit is for a hang it
    # cannot report (the watchdog itself stuck).
    outer = budget + 6 * profile.fork_timeout + 2 * profile.child_timeout + 60
    rc, out, timed_out, cell.seconds = run_program(cmd, env, outer)
    cell.output = out
    parse_result(cell, rc, out, timed_out)
    if logdir:
        cell.log = os.path.join(logdir, cell.name.replace(" ", "_").replace("=", "-") + ".log")
        with open(cell.log, "w") as f:
            f.write("$ LD_PRELOAD=%s MALLOC_CONF=%s %s\n%s" % (
                env["LD_PRELOAD"], env["MALLOC_CONF"], " ".join(cmd), out))
    if cell.expected_na() and cell.status != "n/a":
        cell.status, cell.text = "FAIL", f"FAIL: expected n/a, got {cell.text}"
    return cell


def run_cell_checked(cell, args, profile, libs, logdir, first_extra=()):
    """run_cell, and once more for a stock jemalloc cell that is not ok.

    The jemalloc column is the baseline that shows the harness sane; it is not
    what the test checks. Stock jemalloc has fork hangs of its own with
    background threads (seen once in many runs: bg=on arena exec, the exec'd
    child stuck with jemalloc_bg_thd threads on futexes), so one such hang
    is retried and reported, not counted. An rdmalloc cell is never retried."""
    run_cell(cell, args, profile, libs, logdir, first_extra)
    if cell.allocator != "jemalloc" or cell.status in ("ok", "n/a"):
        return cell
    first = Cell(cell.bg, cell.workload, cell.child, cell.allocator)
    for k in ("status", "text", "detail", "output", "seconds", "log"):
        setattr(first, k, getattr(cell, k))
    if cell.log:
        first.log = cell.log[:-len(".log")] + ".first.log"
        os.replace(cell.log, first.log)
    print(f"  {cell.name}: {cell_text(first)}: stock jemalloc, retried once", flush=True)
    run_cell(cell, args, profile, libs, logdir)
    cell.first_try = first
    if cell.status == "ok":
        cell.text += " (2nd try)"
    return cell


def run_retry_control(args, profile, libs):
    """The retry's own control: a stock jemalloc cell whose first try hangs
    (fork-hang put in at fork 3) passes on its second, its first try kept."""
    cell = Cell("off", "plain", "allocate", "jemalloc")
    run_cell_checked(cell, args, profile, libs, None, ["--inject=fork-hang"])
    first = cell.first_try
    caught = cell.status == "ok" and first is not None and first.status == "HANG"
    if first is not None and not caught:
        cell.detail = f"first try {first.text}, second {cell.text}: {cell.detail}"
    return "retry", cell, caught


def cell_text(c):
    if c.status == "n/a":
        return c.text
    return f"{c.text} {c.seconds:.1f}s"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("program")
    ap.add_argument("rdmalloc")
    ap.add_argument("--jemalloc", default=JEMALLOC)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="host")
    ap.add_argument("--filter", default=os.environ.get("FORK_MATRIX_FILTER", ""))
    ap.add_argument("--workloads", default=os.environ.get("FORK_MATRIX_WORKLOADS", ""),
                    help="comma-separated, instead of the profile's (lookups: on the host, uring)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("FORK_MATRIX_JOBS", "2")))
    ap.add_argument("--scale", type=float, default=float(os.environ.get("FORK_MATRIX_SCALE", "1")))
    ap.add_argument("--gdb", action="store_true", default=os.environ.get("FORK_MATRIX_GDB") == "1")
    args = ap.parse_args()
    args.program = os.path.abspath(args.program)
    profile = PROFILES[args.profile]
    libs = {"rdmalloc": os.path.abspath(args.rdmalloc), "jemalloc": args.jemalloc}
    for name, lib in libs.items():
        if not os.path.exists(lib):
            print(f"fork matrix: {name} library {lib} not found "
                  "(stock jemalloc: libjemalloc2, installed by tools/setup.sh)")
            return 1

    workloads = args.workloads.split(",") if args.workloads else profile.workloads
    cells = [Cell(bg, w, c, a) for bg in BG for w in workloads for c in CHILDREN
             for a in ("jemalloc", "rdmalloc")]
    if args.filter:
        cells = [c for c in cells if re.search(args.filter, c.name)]
    logdir = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or os.environ.get("TEST_TMPDIR")
    if logdir:
        logdir = os.path.join(logdir, "fork_matrix")
        os.makedirs(logdir, exist_ok=True)
    print(f"fork matrix ({profile.name}): {len(cells)} cells, {args.jobs} at a time; "
          f"rdmalloc={libs['rdmalloc']} jemalloc={libs['jemalloc']}"
          + "".join(f" {k}={v}" for k, v in profile.env.items()), flush=True)
    print(f"  timeouts: fork {profile.fork_timeout} s, child {profile.child_timeout} s, "
          f"worker op {profile.fork_timeout} s", flush=True)

    t0 = time.monotonic()
    missed = []
    if profile.name == "host":
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(CONTROLS) + 1) as pool:
            jobs = [pool.submit(run_control, k, args, libs) for k in CONTROLS]
            jobs.append(pool.submit(run_retry_control, args, profile, libs))
            for fault, c, caught in (j.result() for j in jobs):
                print(f"  negative control {fault}: {c.text}: "
                      f"{'caught' if caught else 'MISSED: ' + c.detail}", flush=True)
                if not caught:
                    missed.append((fault, c))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_cell_checked, c, args, profile, libs, logdir) for c in cells]
        for f in concurrent.futures.as_completed(futures):
            c = f.result()
            print(f"  {c.name}: {cell_text(c)}", flush=True)
    total = time.monotonic() - t0

    # The table: one row per (bg, workload, child), jemalloc and rdmalloc side by side.
    rows = {}
    for c in cells:
        rows.setdefault((c.bg, c.workload, c.child), {})[c.allocator] = c
    w_alloc = max([len(cell_text(c)) for c in cells] + [20]) + 2
    print()
    head = f"{'bg':<4}{'workload':<11}{'child':<10}{'jemalloc':<{w_alloc}}rdmalloc"
    print(head)
    print("-" * (len(head) + w_alloc))
    for (bg, w, ch), by in rows.items():
        j = cell_text(by["jemalloc"]) if "jemalloc" in by else "-"
        r = cell_text(by["rdmalloc"]) if "rdmalloc" in by else "-"
        print(f"{bg:<4}{w:<11}{ch:<10}{j:<{w_alloc}}{r}")
    print()

    bad = [c for c in cells if c.status != "ok" and not (c.status == "n/a" and c.expected_na())]
    for a in ("jemalloc", "rdmalloc"):
        mine = [c for c in cells if c.allocator == a]
        if not mine:
            continue
        counts = {s: sum(1 for c in mine if c.status == s) for s in ("ok", "HANG", "FAIL", "n/a")}
        print(f"{a}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) +
              f" of {len(mine)} cells")
    print(f"matrix: {total:.0f} s wall")

    for c in bad:
        print(f"\n=== {c.name}: {c.status}: {c.detail}")
        if c.log:
            print(f"    log: {c.log}")
        body = [l for l in c.output.splitlines() if not l.startswith("fork_matrix: RESULT")]
        for l in body[:60]:
            print("    " + l)
        if len(body) > 60:
            print(f"    ... {len(body) - 60} more lines")

    if logdir:
        with open(os.path.join(logdir, "results.json"), "w") as f:
            json.dump([{"cell": c.name, "status": c.status, "text": c.text,
                        "detail": c.detail, "forks_done": c.forks_done, "forks": c.forks,
                        "seconds": round(c.seconds, 2),
                        "first_try": c.first_try.text if c.first_try else None}
                       for c in cells], f, indent=1)
    for c in cells:
        first = c.first_try
        if first is None:
            continue
        counted = "counted" if c in bad else "not counted: stock jemalloc's own"
        print(f"\n=== NOTE {c.name}: {first.text} on its first try, {c.text} on the second "
              f"({counted}): {first.detail}")
        if first.log:
            print(f"    log: {first.log}")
        for l in first.output.splitlines()[:40]:
            if not l.startswith("fork_matrix: RESULT"):
                print("    " + l)
    for fault, c in missed:
        print(f"\n=== negative control {fault} missed: {c.text}: {c.detail}")
        for l in c.output.splitlines()[:30]:
            print("    " + l)
    if missed:
        print(f"\nFAILED: the harness missed {len(missed)} injected fault(s): " +
              ", ".join(f for f, _ in missed))
    if bad:
        print(f"\nFAILED: {len(bad)} cell(s): " + "; ".join(f"{c.name}: {c.text}" for c in bad))
    if missed or bad:
        return 1
    print("all cells passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
