#!/usr/bin/python3
"""jemalloc's own integration tests (Debian's jemalloc source, built by
jemalloc_build.sh into a tarball) linked twice: against the freshly built
libjemalloc.so.2 and against librdmalloc.so. Runs every program of
jemalloc's 'make check' integration passes (the plain one, two decay and two
prof configurations) both ways, as jemalloc's test/test.sh runs them, prints
program x {jemalloc, rdmalloc}, and fails where rdmalloc's result differs from
jemalloc's, unless expectations.ini explains the difference (and, where it
names one, every failed assertion of rdmalloc's run is that one).

  jemalloc_integration_test.py --tarball T --rdmalloc LIB --shim C --probe C
                               --expectations FILE
"""

import argparse
import collections
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suites_lib as lib  # noqa: E402

# MALLOC_CONF for every program, per pass of jemalloc's 'make check'
# (Makefile.in: check_integration, check_integration_decay,
# check_integration_prof), in its order.
CONFIGS = [
    ("plain", ""),
    ("decay-off", "dirty_decay_ms:-1,muzzy_decay_ms:-1"),
    ("decay-0", "dirty_decay_ms:0,muzzy_decay_ms:0"),
    ("prof", "prof:true"),
    ("prof-inactive", "prof:true,prof_active:false"),
]
TIMEOUT = 120  # one program, one configuration (each takes well under a second)

# Options rdmalloc sets by design (allocator/extent_hooks.cc); everything else
# the probe prints must be the same in both builds.
RDMALLOC_FIXES = {"opt.retain", "opt.oversize_threshold"}

SUBTEST_RE = re.compile(r"^(\w+) \((non-reentrant|libc-reentrant|arena_new-reentrant)\): (pass|skip|fail)$")
SUMMARY_RE = re.compile(r"^--- pass: (\d+)/(\d+), skip: (\d+)/\d+, fail: (\d+)/\d+ ---$")


def sh(argv, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


class Outcome:
    def __init__(self, rc, seconds, log):
        self.rc, self.seconds, self.log = rc, seconds, log
        with open(log, errors="replace") as f:
            self.text = f.read()
        self.subtests = collections.OrderedDict()
        self.summary = None
        for line in self.text.splitlines():
            m = SUBTEST_RE.match(line)
            if m:
                self.subtests[f"{m.group(1)} ({m.group(2)})"] = m.group(3)
            m = SUMMARY_RE.match(line)
            if m:
                self.summary = tuple(int(x) for x in m.groups())
        # test/test.sh: 0 pass, 1 skip, 2 fail, anything else a harness error.
        self.kind = {0: "pass", 1: "skip", 2: "fail"}.get(rc, "hang" if rc is None else "error")

    def assertions(self):
        return [l for l in self.text.splitlines() if "Failed assertion" in l or "Failed assert" in l]

    def cell(self):
        if self.kind == "hang":
            return "HANG"
        if self.kind == "error":
            return f"ERROR(rc={self.rc})"
        if self.summary:
            p, n, s, f = self.summary
            return f"{self.kind} {p}/{n}" + (f" skip {s}" if s else "")
        return self.kind

    def same_as(self, other):
        return self.kind == other.kind and self.subtests == other.subtests


def program_conf(work, program, env, enable):
    """The program's own MALLOC_CONF: its .sh sourced as test/test.sh does."""
    script = os.path.join(work, program + ".sh")
    if not os.path.exists(script):
        return ""
    out = sh(["/bin/sh", "-c", '. "$1" && printf %s "$MALLOC_CONF"', "sh", script],
             env=dict(env, MALLOC_CONF="", **enable), cwd=work)
    if out.returncode != 0:
        raise SystemExit(f"{script}: {out.stdout}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tarball", required=True)
    ap.add_argument("--rdmalloc", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--expectations", required=True)
    args = ap.parse_args()
    junit = lib.JUnit("jemalloc_integration")
    expectations = lib.load_expectations(args.expectations, "jemalloc")

    work = os.path.join(os.environ.get("TEST_TMPDIR") or lib.short_tmpdir("rdm-je-"), "jemalloc")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with tarfile.open(args.tarball) as t:
        t.extractall(work)
    build = {}
    with open(os.path.join(work, "rdmalloc-build.env")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            build[k] = v
    tests = build["tests"].split()
    harness = [os.path.join(work, h) for h in build["harness"].split()]
    print(f"jemalloc {build['version']} from Debian's source package, configure {build['configure']}")
    print(f"work directory (programs, logs): {work}")
    print(f"{len(tests)} integration programs (jemalloc's Makefile): {' '.join(t.split('/', 2)[-1] for t in tests)}")

    # The two libraries, each in a directory of its own (rpath).
    je_lib = os.path.join(work, "je-lib")
    rd_lib = os.path.join(work, "rd-lib")
    os.makedirs(je_lib)
    os.makedirs(rd_lib)
    shutil.copy(os.path.join(work, "lib/libjemalloc.so.2"), je_lib)
    shutil.copy(os.path.realpath(args.rdmalloc), os.path.join(rd_lib, "librdmalloc.so"))
    os.symlink("librdmalloc.so", os.path.join(rd_lib, "librdmalloc.so.0"))
    libs = {"jemalloc": (je_lib, os.path.join(je_lib, "libjemalloc.so.2")),
            "rdmalloc": (rd_lib, os.path.join(rd_lib, "librdmalloc.so"))}

    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "MALLOC_CONF", "LD_LIBRARY_PATH") and not k.startswith("RDMALLOC_")}
    cc, cxx = shlex.split(build["cc"]), shlex.split(build["cxx"])
    ldflags = shlex.split(build["ldflags"])

    def link(program, side, extra=()):
        d, so = libs[side]
        out = os.path.join(work, side, program)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        is_cpp = "/cpp/" in program
        # jemalloc's Makefile link line, with the library swapped.
        argv = ((cxx if is_cpp else cc) + ["-o", out, os.path.join(work, program + ".o")] + harness
                + list(extra) + [f"-Wl,-rpath,{d}", so] + ldflags
                + shlex.split(build["cxx_libs" if is_cpp else "c_libs"]))
        r = sh(argv)
        return out, r

    failures = []
    # What a new user meets first: the harness does not link against rdmalloc.
    _, r = link(tests[0], "rdmalloc")
    shim = []
    if r.returncode != 0:
        undefined = sorted(set(re.findall(r"undefined reference to `([^']+)'", r.stdout)))
        print(f"linking the harness against librdmalloc.so as it is: fails, undefined: {', '.join(undefined)}")
        if set(undefined) - {"je_test_hooks_libc_hook", "je_test_hooks_arena_new_hook"}:
            failures.append("the harness needs more than jemalloc's two test hooks from librdmalloc.so:\n"
                            + r.stdout[-3000:])
        shim_o = os.path.join(work, "test_hooks_shim.o")
        r = sh(cc + ["-c", "-o", shim_o, args.shim])
        if r.returncode != 0:
            raise SystemExit(r.stdout)
        shim = [shim_o]
        print(f"  so the rdmalloc builds link {os.path.basename(args.shim)} (the two hook pointers, "
              "never called by rdmalloc: see docs/TESTING.md)")
    else:
        print("linking the harness against librdmalloc.so as it is: works (no shim needed)")

    binaries = {}
    for program in tests:
        for side in ("jemalloc", "rdmalloc"):
            out, r = link(program, side, shim if side == "rdmalloc" else ())
            if r.returncode != 0:
                failures.append(f"{program}: link against {side} failed:\n{r.stdout[-2000:]}")
                junit.add(f"link {program} {side}", failure=r.stdout[-2000:])
            else:
                binaries[(program, side)] = out

    # The configuration both builds report.
    probe = {}
    for side in ("jemalloc", "rdmalloc"):
        d, so = libs[side]
        exe = os.path.join(work, f"probe-{side}")
        r = sh(cc + ["-o", exe, args.probe, f"-Wl,-rpath,{d}", so])
        if r.returncode != 0:
            raise SystemExit(f"probe against {side}: {r.stdout}")
        r = sh([exe], env=env)
        probe[side] = dict(l.split("=", 1) for l in r.stdout.splitlines() if "=" in l)
    rows, mismatch = [], []
    for k in probe["jemalloc"]:
        a, b = probe["jemalloc"][k], probe["rdmalloc"].get(k)
        note = ""
        if a != b:
            note = "set by rdmalloc (by design)" if k in RDMALLOC_FIXES else "MISMATCH"
            if k not in RDMALLOC_FIXES:
                mismatch.append(f"{k}: jemalloc {a}, rdmalloc {b}")
        rows.append([k, a, b, note])
    print("\nmallctl in both builds (no MALLOC_CONF):")
    print(lib.table(["name", "jemalloc (fresh build)", "rdmalloc", ""], rows))
    if mismatch:
        failures.append("the jemalloc inside rdmalloc is not configured like the harness:\n  "
                        + "\n  ".join(mismatch))
    junit.add("configuration matches", failure="\n".join(mismatch) or None)

    # Run everything: each program as test/test.sh would, per configuration.
    enable = {"enable_fill": build["enable_fill"], "enable_prof": build["enable_prof"]}
    logdir = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or os.path.join(work, "logs")
    os.makedirs(logdir, exist_ok=True)
    results = {}
    for cname, conf_all in CONFIGS:
        for program in tests:
            own = program_conf(work, program, env, enable)
            conf = f"{own},{conf_all}" if own and conf_all else own + conf_all
            for side in ("jemalloc", "rdmalloc"):
                exe = binaries.get((program, side))
                if not exe:
                    continue
                log = os.path.join(logdir, f"{program.replace('/', '_')}.{cname}.{side}.log")
                rc, secs = lib.run_with_timeout([exe, work + "/", work + "/"], dict(env, MALLOC_CONF=conf),
                                                work, log, TIMEOUT, f"{program} ({cname}) under {side}")
                results[(program, cname, side)] = Outcome(rc, secs, log)
                results[(program, cname, side)].conf = conf

    # Compare.
    rows = []
    differing = collections.defaultdict(list)
    for program in tests:
        name = program.split("/", 2)[-1]
        row = [name]
        for cname, _ in CONFIGS:
            je = results.get((program, cname, "jemalloc"))
            rd = results.get((program, cname, "rdmalloc"))
            if not je or not rd:
                row.append("NOT BUILT")
                continue
            cell = f"{je.cell()} | {rd.cell()}"
            problem = None
            if not je.same_as(rd):
                exp = expectations.get(name)
                wrong = []
                if exp:
                    if je.kind != "pass":
                        wrong.append(f"jemalloc gives {je.kind}, not pass")
                    if rd.kind != exp.rdmalloc:
                        wrong.append(f"rdmalloc gives {rd.kind}, expected {exp.rdmalloc}")
                    if exp.assertion:
                        other = [a for a in rd.assertions() if exp.assertion not in a]
                        if other or not rd.assertions():
                            wrong.append("failed assertions other than the expected one:\n    "
                                         + "\n    ".join(other or ["(none at all)"]))
                if exp and not wrong:
                    exp.used = True
                    cell += " (expected)"
                else:
                    diff = [f"{k}: jemalloc {je.subtests.get(k, '-')}, rdmalloc {rd.subtests.get(k, '-')}"
                            for k in list(je.subtests) + [k for k in rd.subtests if k not in je.subtests]
                            if je.subtests.get(k) != rd.subtests.get(k)]
                    problem = (f"{name} ({cname}, MALLOC_CONF={rd.conf!r}): jemalloc {je.cell()}, "
                               f"rdmalloc {rd.cell()}\n  " + "\n  ".join(diff[:20] + wrong)
                               + "\n  rdmalloc's output (" + rd.log + "):\n"
                               + "\n".join("    " + l for l in rd.text.splitlines()[-30:]))
                    differing[name].append(problem)
                    cell += " DIFF"
            junit.add(f"{name} ({cname})", failure=problem, seconds=je.seconds + rd.seconds)
            row.append(cell)
        rows.append(row)
    for name, exp in expectations.items():
        if not exp.used:
            msg = f"stale expectation {exp}: no configuration shows that difference any more"
            differing[name].append(msg)
            junit.add(f"expectation {name}", failure=msg)

    print("\njemalloc's integration programs: jemalloc's own build | linked against librdmalloc.so "
          "(outcome, subtests passed/run)")
    print(lib.table(["program"] + [f"{c} ({v or 'no MALLOC_CONF'})" if c == "plain" else c for c, v in CONFIGS],
                    rows))
    for side in ("jemalloc", "rdmalloc"):
        c = collections.Counter(results[(p, "plain", side)].kind for p in tests if (p, "plain", side) in results)
        print(f"{side} (plain pass, as 'make check_integration'): pass: {c['pass']}/{len(tests)}, "
              f"skip: {c['skip']}/{len(tests)}, fail: {c['fail']}/{len(tests)}"
              + (f", error/hang: {c['error'] + c['hang']}" if c['error'] + c['hang'] else ""))
    same = sum(1 for p in tests if all((p, cn, s) in results for cn, _ in CONFIGS for s in ("jemalloc", "rdmalloc"))
               and all(results[(p, cn, "jemalloc")].same_as(results[(p, cn, "rdmalloc")]) for cn, _ in CONFIGS))
    print(f"{same} of {len(tests)} programs give jemalloc's results under rdmalloc in all {len(CONFIGS)} configurations")
    for name, exp in expectations.items():
        if exp.used:
            print(f"  expected difference: {name}: rdmalloc {exp.rdmalloc}: {exp.reason}")

    junit.write()
    for name, problems in differing.items():
        failures.extend(problems)
    if failures:
        lib.banner("FAIL: rdmalloc differs from jemalloc's own build", *failures)
        return 1
    print("no unexplained difference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
