#!/usr/bin/python3
"""Python's own regression tests (Debian's libpython3.11-testsuite) on one
interpreter, /usr/bin/python3.11, three ways: glibc's malloc, stock Debian
jemalloc preloaded, rdmalloc preloaded. Prints suite x allocator (cases,
passed, failed, skipped, seconds) and fails when rdmalloc fails, errors,
skips or loses a case that passes under stock jemalloc, unless
expectations.ini explains it, or when any run hangs (each run has its own
timeout; the message names the suite, the case that was running and what
every process of the tree was doing). See docs/TESTING.md.

  python_suites_test.py --rdmalloc LIB --expectations FILE [--suites a,b]
                        [--jobs N] [--budget SECONDS] [--allocators a,b]
"""

import argparse
import collections
import concurrent.futures
import json
import os
import re
import shutil
import sys
import threading
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suites_lib as lib  # noqa: E402

PYTHON = "/usr/bin/python3.11"
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"

# The suites, with a timeout for one run of each (about 4x what one takes
# under load on the 2-core machine; an idle run of test_multiprocessing_fork
# takes 80 s, test_subprocess 30 s, test_threading 12 s, the rest < 6 s).
SUITES = collections.OrderedDict([
    ("test_multiprocessing_fork", 360),  # whole: pools, managers, queues, forked children
    ("test_subprocess", 200),
    ("test_threading", 150),
    ("test_os", 90),                      # fork, register_at_fork, spawn
    ("test_posix", 90),                   # fork, posix_spawn, waitpid
    ("test_fork1", 90),                   # fork with threads, imports across fork
    ("test_wait3", 90),
    ("test_wait4", 90),
    ("test_thread", 60),
    ("test_gc", 90),
    ("test_tracemalloc", 90),
    ("test_sys", 90),                     # getallocatedblocks, getsizeof, thread switching
    ("test_mmap", 60),
    ("test_memoryview", 60),
    ("test_memoryio", 60),
    ("test_bigmem", 60),                  # no -M: each case at its small default size
])

# Everything but what needs the network, a display, a sound card or a
# terminal; largefile and cpu are on (test_mmap's large sparse files).
RESOURCES = "all,-network,-urlfetch,-gui,-audio,-curses"

RESULT_RE = re.compile(r"\.\.\. (ok|FAIL|ERROR|skipped|expected failure|unexpected success)\b")
START_RE = re.compile(r"^(\w+) \((\w+(?:\.\w+){2,})\)")
STATUS_OF = {"ok": "pass", "FAIL": "fail", "ERROR": "error", "skipped": "skip",
             "expected failure": "pass", "unexpected success": "fail"}

# Run from ctypes inside each configuration: which malloc serves Python?
PROBE = r"""
import ctypes, json
c = ctypes.CDLL(None)
out = {"jemalloc": None, "rdmalloc": None}
if hasattr(c, "mallctl"):
    v = ctypes.c_char_p(); n = ctypes.c_size_t(ctypes.sizeof(v))
    if c.mallctl(b"version", ctypes.byref(v), ctypes.byref(n), None, 0) == 0:
        out["jemalloc"] = v.value.decode()
if hasattr(c, "rdmalloc_backend"):
    c.rdmalloc_backend.restype = ctypes.c_char_p
    out["rdmalloc"] = c.rdmalloc_backend().decode()
print(json.dumps(out))
"""


class Run:
    """One regrtest run of one suite (maybe a re-run with some cases left out)."""

    def __init__(self):
        self.cases = collections.OrderedDict()  # case id -> outcome
        self.failure_text = {}                  # case id -> traceback
        self.rc = None
        self.seconds = 0.0
        self.hung_case = None
        self.hang_note = ""
        self.log = None


class Result:
    """All runs of one suite under one allocator, merged."""

    def __init__(self, suite, alloc):
        self.suite, self.alloc = suite, alloc
        self.runs = []
        self.cases = collections.OrderedDict()
        self.failure_text = {}
        self.hangs = []      # (case, log)
        self.crash = None    # a run that ended without a report and no timeout
        self.not_run = None  # why it could not run at all

    @property
    def seconds(self):
        return sum(r.seconds for r in self.runs)

    def counts(self):
        c = collections.Counter(self.cases.values())
        return {"cases": len(self.cases), "pass": c["pass"], "fail": c["fail"] + c["error"],
                "skip": c["skip"], "hang": c["hang"]}


def parse_junit(path):
    cases, texts = collections.OrderedDict(), {}
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = case.get("name")
        outcome = "pass"
        for tag in ("error", "failure", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"error": "error", "failure": "fail", "skipped": "skip"}[tag]
                if tag != "skipped":
                    texts[name] = (el.text or el.get("message") or "")[-3000:]
                break
        cases[name] = outcome
    return cases, texts


def parse_verbose(path):
    """Cases from regrtest -v output (for a run killed before its report):
    every started case with its result, and the last one started if it has
    no result (the one that was running)."""
    cases = collections.OrderedDict()
    current = None
    with open(path, errors="replace") as f:
        for line in f:
            m = START_RE.match(line)
            if m:
                current = m.group(2)
                cases.setdefault(current, None)
            r = RESULT_RE.search(line)
            if r and current is not None and cases.get(current) is None:
                cases[current] = STATUS_OF[r.group(1)]
    running = [c for c, s in cases.items() if s is None]
    done = collections.OrderedDict((c, s) for c, s in cases.items() if s is not None)
    return done, (running[-1] if running else None)


class Driver:
    def __init__(self, args):
        self.args = args
        self.deadline = time.monotonic() + args.budget
        self.tmp = lib.short_tmpdir("rdm-suites-")
        # Under Bazel the logs are the test's outputs (test.outputs/outputs.zip).
        self.logdir = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or lib.short_tmpdir("rdm-suites-logs-")
        self.libs = {"glibc": None, "jemalloc": JEMALLOC, "rdmalloc": os.path.abspath(args.rdmalloc)}
        self.lock = threading.Lock()

    def remaining(self):
        return self.deadline - time.monotonic()

    def env(self, alloc, tmpdir):
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "MALLOC_CONF", "PYTHONPATH", "PYTHONHOME")
               and not k.startswith("RDMALLOC_")}
        env.update(TMPDIR=tmpdir, PYTHONDONTWRITEBYTECODE="1", LC_ALL="C.UTF-8", LANG="C.UTF-8")
        if self.libs[alloc]:
            env["LD_PRELOAD"] = self.libs[alloc]
        return env

    def probe(self, alloc):
        import subprocess
        out = subprocess.run([PYTHON, "-c", PROBE], env=self.env(alloc, self.tmp),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        try:
            got = json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"probe did not run: {out.stdout.strip()[-500:]}", None
        want_je = alloc in ("jemalloc", "rdmalloc")
        if bool(got["jemalloc"]) != want_je or bool(got["rdmalloc"]) != (alloc == "rdmalloc"):
            return f"{alloc}: the process's malloc is not what it should be: {got}", got
        return None, got

    def regrtest(self, suite, alloc, tag, timeout, match=None, ignore=()):
        run = Run()
        workdir = lib.short_tmpdir(f"{suite[5:12]}-{alloc[:2]}-")
        xml = os.path.join(workdir, "junit.xml")
        argv = [PYTHON, "-m", "test", "-v", "--junit-xml", xml, "-u", RESOURCES,
                "--tempdir", workdir]
        if self.args.testdir:
            argv += ["--testdir", self.args.testdir]
        if match:
            argv += ["-m", match]
        if ignore:
            ignorefile = os.path.join(workdir, "ignore.txt")
            with open(ignorefile, "w") as f:
                f.write("\n".join(ignore) + "\n")
            argv += ["--ignorefile", ignorefile]
        argv.append(suite)
        run.log = os.path.join(self.logdir, f"{suite}.{alloc}.{tag}.log")
        run.rc, run.seconds = lib.run_with_timeout(
            argv, self.env(alloc, workdir), workdir, run.log, timeout,
            f"{suite} under {alloc}", gdb=not self.args.no_gdb)
        if run.rc is not None and os.path.exists(xml):
            run.cases, run.failure_text = parse_junit(xml)
        else:
            run.cases, run.hung_case = parse_verbose(run.log)
            if run.rc is None:
                run.hang_note = f"timeout after {timeout:.0f} s"
            else:
                run.hang_note = f"exit code {run.rc} without a report"
        shutil.rmtree(workdir, ignore_errors=True)
        return run

    def suite_job(self, suite, alloc):
        """Runs one suite under one allocator; after a hang, runs the rest of
        the suite without the case(s) that hung (at most twice more), so that
        one hang does not hide the other cases' results."""
        res = Result(suite, alloc)
        ignore = []
        for attempt in range(3):
            wanted = self.args.suite_timeout or SUITES[suite]
            timeout = min(wanted, self.remaining() - 30)
            if timeout < min(wanted, 20):
                res.not_run = res.not_run or "the test's time budget ran out before this run"
                break
            run = self.regrtest(suite, alloc, f"run{attempt}", timeout, ignore=ignore)
            res.runs.append(run)
            for c, s in run.cases.items():
                res.cases[c] = s
            res.failure_text.update(run.failure_text)
            if run.rc is not None and not run.hang_note:
                break
            if run.rc is not None:  # died without its report: not a hang
                res.crash = (f"{run.hang_note}; last case started: {run.hung_case}; the end of "
                             f"its output:\n" + indent(lib.tail(run.log, 15)))
                if run.hung_case:
                    res.cases[run.hung_case] = "error"
                break
            case = run.hung_case or "(between cases: module set-up or tear-down)"
            res.hangs.append((case, run.log))
            with self.lock:
                lib.banner(f"HANG: {suite} under {alloc}: no progress for {timeout:.0f} s in {case}",
                           f"(process tree, thread states and stacks: {run.log})")
            if not run.hung_case:
                break
            res.cases[run.hung_case] = "hang"
            ignore.append(run.hung_case)
        with self.lock:
            c = res.counts()
            print(f"  done: {suite:<28} {alloc:<9} {c['cases']:>4} cases {c['pass']:>4} pass "
                  f"{c['fail']:>3} fail {c['skip']:>3} skip {res.seconds:6.1f} s"
                  + (f"  HANG x{len(res.hangs)}" if res.hangs else "")
                  + (f"  CRASH ({res.crash})" if res.crash else ""), flush=True)
        return res

    def rerun_case(self, suite, alloc, case):
        timeout = min(120, self.remaining() - 10)
        if timeout < 20:
            return None
        run = self.regrtest(suite, alloc, "rerun-" + case.rsplit(".", 1)[-1], timeout, match=case)
        return run.cases.get(case) if run.rc is not None else "hang"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rdmalloc", required=True)
    ap.add_argument("--expectations", required=True)
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--allocators", default="glibc,jemalloc,rdmalloc")
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--budget", type=float, default=840)
    ap.add_argument("--no-gdb", action="store_true")
    # For python_suites_selftest.sh: another suite directory, shorter timeouts.
    ap.add_argument("--testdir")
    ap.add_argument("--suite-timeout", type=float)
    args = ap.parse_args()

    if args.testdir:
        args.testdir = os.path.abspath(args.testdir)
    suites = [s for s in args.suites.split(",") if s]
    for s in suites:
        if s not in SUITES:
            SUITES[s] = 120
    allocs = [a for a in args.allocators.split(",") if a]
    junit = lib.JUnit("python_suites")
    expectations = lib.load_expectations(args.expectations, "python")

    for path in (PYTHON, JEMALLOC, "/usr/lib/python3.11/test/regrtest.py"):
        if not os.path.exists(path):
            lib.banner(f"FAIL: {path} is missing: run tools/setup.sh "
                       "(python3.11, libjemalloc2, libpython3.11-testsuite)")
            junit.add("setup", failure=f"{path} missing")
            junit.write()
            return 1

    d = Driver(args)
    print(f"python: {PYTHON}; stock jemalloc: {JEMALLOC}; rdmalloc: {d.libs['rdmalloc']}")
    print(f"suites: {', '.join(suites)}")
    print(f"{args.jobs} runs at a time, {args.budget:.0f} s for everything; logs in {d.logdir}")

    failures = []
    for alloc in allocs:
        err, got = d.probe(alloc)
        print(f"  probe {alloc:<9}: {json.dumps(got) if got else err}")
        if err:
            failures.append(err)
            junit.add(f"probe {alloc}", failure=err)
        else:
            junit.add(f"probe {alloc}")
    if failures:
        lib.banner("FAIL: the allocators are not what they should be", *failures)
        junit.write()
        return 1

    start = time.monotonic()
    results = {}
    jobs = [(s, a) for s in suites for a in allocs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(d.suite_job, s, a): (s, a) for s, a in jobs}
        for fut in concurrent.futures.as_completed(futures):
            results[futures[fut]] = fut.result()

    # Compare rdmalloc with stock jemalloc, case by case.
    rows, report = [], []
    flaky_all = []
    for s in suites:
        problems = []
        flaky = []
        je = results.get((s, "jemalloc"))
        rd = results.get((s, "rdmalloc"))
        for a in allocs:
            r = results[(s, a)]
            if r.not_run:
                problems.append(f"{a}: not run: {r.not_run}")
        if rd is not None:
            for case, log in rd.hangs:
                problems.append(f"rdmalloc HANGS in {case}; what the processes were doing "
                                f"(from {os.path.basename(log)} in the test's outputs):\n"
                                + indent(hang_dump(log), 200))
            if rd.crash:
                problems.append(f"rdmalloc: the suite crashed: {rd.crash}")
        if je is not None:
            for case, log in je.hangs:
                problems.append(f"stock jemalloc hangs in {case}: no baseline for it (log: {log})")
            if je.crash:
                problems.append(f"stock jemalloc: the suite crashed: {je.crash}")
        if je is not None and rd is not None:
            missing = []
            for case, js in je.cases.items():
                if js != "pass":
                    continue
                rs = rd.cases.get(case, "missing")
                if rs in ("pass", "hang"):
                    continue  # hangs are reported above
                exp = expectations.get(case)
                if exp and exp.rdmalloc == rs:
                    exp.used = True
                    report.append(f"  expected: {case}: rdmalloc {rs}: {exp.reason}")
                    continue
                if rs == "missing":
                    missing.append(case)
                    continue
                if rs in ("fail", "error"):
                    # Timing-sensitive cases on a loaded machine: a case that
                    # passes when re-run alone (one of two tries) is reported
                    # as flaky, loudly, and not counted as a difference.
                    again = []
                    for _ in range(2):
                        again.append(d.rerun_case(s, "rdmalloc", case))
                        if again[-1] == "pass":
                            break
                    if again[-1] == "pass":
                        flaky.append(case)
                        flaky_all.append((s, case, rd.failure_text.get(case, "")))
                        continue
                    problems.append(f"{case}: jemalloc pass, rdmalloc {rs} (re-run alone: "
                                    f"{', '.join(map(str, again))})\n"
                                    + indent(rd.failure_text.get(case, "")))
                else:
                    problems.append(f"{case}: jemalloc pass, rdmalloc {rs}")
            if missing:
                why = "after the hang(s) above" if rd.hangs or rd.crash else "absent from its report"
                problems.append(f"{len(missing)} case(s) passing under jemalloc did not run under "
                                f"rdmalloc ({why}): {', '.join(missing[:5])}"
                                + (" ..." if len(missing) > 5 else ""))
            for case, exp in expectations.items():
                if case.startswith((f"test.{s}.", f"{s}.")) and not exp.used:
                    problems.append(f"stale expectation {exp}: rdmalloc gives "
                                    f"{rd.cases.get(case, 'missing')}, jemalloc "
                                    f"{je.cases.get(case, 'missing')}")
        row = [s]
        for a in allocs:
            r = results[(s, a)]
            c = r.counts()
            cell = f"{c['cases']}/{c['pass']}/{c['fail']}/{c['skip']} {r.seconds:.0f}s"
            if r.hangs:
                cell += f" HANG{len(r.hangs)}"
            if r.crash:
                cell += " CRASH"
            if r.not_run:
                cell = "NOT RUN"
            row.append(cell)
        row.append("ok" if not problems else "DIFF")
        rows.append(row)
        junit.add(f"{s} rdmalloc vs jemalloc",
                  failure="\n".join(problems) if problems else None,
                  seconds=sum(results[(s, a)].seconds for a in allocs),
                  output="flaky under rdmalloc (failed once, passed on re-run): " + ", ".join(flaky)
                  if flaky else "")
        if problems:
            failures.append((s, problems))

    print()
    print("Python regression suites, /usr/bin/python3.11; each cell: cases/passed/failed/skipped and "
          "wall time (runs overlap; 'failed' counts errors)")
    print(lib.table(["suite"] + allocs + ["rdmalloc vs jemalloc"], rows))
    totals = []
    for a in allocs:
        c = collections.Counter()
        for s in suites:
            for k, v in results[(s, a)].counts().items():
                c[k] += v
        totals.append(f"{a}: {c['cases']} cases, {c['pass']} passed, {c['fail']} failed, "
                      f"{c['skip']} skipped, {sum(results[(s, a)].seconds for s in suites):.0f} s")
    print("totals: " + "; ".join(totals))
    print(f"wall time of all runs: {time.monotonic() - start:.0f} s")
    for line in report:
        print(line)
    for s, case, text in flaky_all:
        lib.banner(f"FLAKY under rdmalloc: {case} failed once and passed when re-run alone",
                   "(not counted as a difference; its first failure:)", text[-1500:])
    # Differences in the other direction, for the record.
    for s in suites:
        if "jemalloc" in allocs and "rdmalloc" in allocs:
            je, rd = results[(s, "jemalloc")], results[(s, "rdmalloc")]
            odd = [c for c, st in je.cases.items() if st in ("fail", "error") and rd.cases.get(c) == "pass"]
            if odd:
                print(f"  note: {s}: fail under stock jemalloc but pass under rdmalloc: {', '.join(odd)}")
    if "glibc" in allocs and "jemalloc" in allocs:
        for s in suites:
            g, je = results[(s, "glibc")], results[(s, "jemalloc")]
            odd = [c for c, st in g.cases.items() if st == "pass" and je.cases.get(c) in ("fail", "error")]
            if odd:
                print(f"  note: {s}: pass under glibc but fail under stock jemalloc: {', '.join(odd)}")

    junit.write()
    shutil.rmtree(d.tmp, ignore_errors=True)
    if failures:
        for s, problems in failures:
            lib.banner(f"FAIL: {s}: rdmalloc differs from stock jemalloc", *problems)
        print(f"{len(failures)} of {len(suites)} suites differ")
        return 1
    print(f"all {len(suites)} suites: rdmalloc gives what stock jemalloc gives")
    return 0


def indent(text, lines=25):
    return "\n".join("      " + l for l in text.strip().splitlines()[-lines:])


def hang_dump(log):
    """The part of a timed-out run's log that says where it hung: the tree
    (states, wait channels, C stacks) and the Python tracebacks."""
    with open(log, errors="replace") as f:
        text = f.read()
    at = text.find("===== TIMEOUT")
    text = text[at:] if at >= 0 else text[-6000:]
    keep = [l for l in text.splitlines()
            if l.startswith(("=====", "---", "    tid", "    #", "    Thread", "  File", "Fatal",
                             "Current thread", "Thread 0x"))]
    return "\n".join(keep[:200])


if __name__ == "__main__":
    sys.exit(main())
