"""Shared by the suite drivers in test/suites: the expectations file, running
a command with its own timeout (and a diagnosis of what hangs), tables, and
the JUnit XML that Bazel and .ci/run read."""

import configparser
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

OUTCOMES = ("pass", "fail", "error", "skip", "missing", "hang")


def banner(*lines):
    print("*" * 78)
    for line in lines:
        print(line)
    print("*" * 78)
    sys.stdout.flush()


# ---------------------------------------------------------------------------
# Expectations: the differences between rdmalloc and stock jemalloc that are
# explained (docs/TESTING.md), one INI section each:
#
#   [python test.test_x.Class.test_y]     a regrtest case id
#   rdmalloc = fail                        what rdmalloc gives (jemalloc passes)
#   reason = ...
#
#   [jemalloc extent]                      a jemalloc integration program
#   rdmalloc = fail
#   assertion = extent.c:50: Failed ...    every failed assertion of the
#   reason = ...                           rdmalloc run must contain this text
#
# An entry whose difference no longer shows is stale and fails the test too,
# so that the file and the documentation stay true.

class Expectation:
    def __init__(self, kind, name, rdmalloc, reason, assertion=None):
        self.kind, self.name, self.rdmalloc = kind, name, rdmalloc
        self.reason, self.assertion = reason, assertion
        self.used = False

    def __repr__(self):
        return f"[{self.kind} {self.name}] rdmalloc={self.rdmalloc}"


def load_expectations(path, kind):
    parser = configparser.ConfigParser(interpolation=None)
    with open(path) as f:
        parser.read_file(f)
    found = {}
    for section in parser.sections():
        try:
            skind, name = section.split(None, 1)
        except ValueError:
            raise SystemExit(f"{path}: section [{section}] is not '<python|jemalloc> <name>'")
        if skind not in ("python", "jemalloc"):
            raise SystemExit(f"{path}: [{section}]: unknown kind {skind!r}")
        entry = parser[section]
        unknown = set(entry) - {"rdmalloc", "reason", "assertion"}
        if unknown:
            raise SystemExit(f"{path}: [{section}]: unknown keys {sorted(unknown)}")
        rdmalloc = entry.get("rdmalloc", "").strip()
        reason = " ".join(entry.get("reason", "").split())
        if rdmalloc not in ("fail", "error", "skip", "missing"):
            raise SystemExit(f"{path}: [{section}]: rdmalloc = fail|error|skip|missing, not {rdmalloc!r}"
                             " (a hang is never an expected difference)")
        if len(reason) < 20:
            raise SystemExit(f"{path}: [{section}]: every expected difference needs its reason")
        if skind == kind:
            found[name] = Expectation(skind, name, rdmalloc, reason, entry.get("assertion"))
    return found


# ---------------------------------------------------------------------------
# Processes.

def descendants(root_pid):
    """The pids of root_pid's process tree (root included), from /proc."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def describe_tree(root_pid, log, gdb=True):
    """Writes what every process and thread of the tree is doing to log:
    state, kernel wait channel, the syscall it sits in and, with gdb, the C
    stack of each thread. Returns the pids."""
    pids = descendants(root_pid)
    gdb_left = 10  # C stacks of the first ten processes (each attach takes seconds)
    log.write(f"\n===== process tree of {root_pid} at timeout ({len(pids)} processes) =====\n")
    for pid in pids:
        cmd = _read(f"/proc/{pid}/cmdline").replace("\0", " ")[:200]
        log.write(f"--- pid {pid}: {cmd}\n")
        try:
            tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
        except OSError:
            tids = []
        for tid in tids:
            stat = _read(f"/proc/{pid}/task/{tid}/stat")
            state = stat[stat.rfind(")") + 2:].split()[0] if ")" in stat else "?"
            wchan = _read(f"/proc/{pid}/task/{tid}/wchan")
            syscall = _read(f"/proc/{pid}/task/{tid}/syscall").split()[:1]
            log.write(f"    tid {tid}: state {state} wchan {wchan} syscall {syscall}\n")
        if gdb and gdb_left > 0 and _which("gdb"):
            gdb_left -= 1
            try:
                bt = subprocess.run(
                    ["gdb", "-batch", "-nx", "-p", str(pid), "-ex", "thread apply all bt 15"],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30).stdout
            except subprocess.TimeoutExpired:
                bt = "gdb timed out\n"
            # Thread headers and frames; the interpreter's own frames (no
            # symbols, or _PyEval_*, PyObject_*) say nothing the Python
            # tracebacks below do not.
            keep = [l for l in bt.splitlines()
                    if (l.startswith(("Thread ", "#")) or "LWP" in l)
                    and not re.search(r" in (\?\?|_?Py\w*) \(\)$", l)]
            log.write("\n".join("    " + l for l in keep) + "\n")
    log.flush()
    return pids


def _which(name):
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(":") + ["/usr/bin"]:
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return None


def kill_tree(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def run_with_timeout(argv, env, cwd, log_path, timeout, what, gdb=True):
    """Runs argv in a session of its own, output to log_path. On timeout:
    describes the tree, asks every Python process for its tracebacks
    (SIGABRT: regrtest and its children run with faulthandler), kills the
    tree. Returns (exit code or None on timeout, seconds)."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            log.write(f"\n===== TIMEOUT: {what} still running after {timeout:.0f} s =====\n")
            pids = describe_tree(proc.pid, log, gdb=gdb)
            kill_tree(pids, signal.SIGABRT)
            time.sleep(3)
            kill_tree(descendants(proc.pid) + pids, signal.SIGKILL)
            proc.wait()
        # Whatever the tests left behind in the session.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    return rc, time.monotonic() - start


# ---------------------------------------------------------------------------
# Output.

def table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(lines)


class JUnit:
    """The test's own test.xml (Bazel's XML_OUTPUT_FILE): one test case per
    comparison, so .ci/run counts them."""

    def __init__(self, suite_name):
        self.suite_name = suite_name
        self.cases = []

    def add(self, name, failure=None, seconds=0.0, output=""):
        self.cases.append((name, failure, seconds, output))

    def failures(self):
        return [c for c in self.cases if c[1]]

    def write(self):
        path = os.environ.get("XML_OUTPUT_FILE")
        if not path:
            return
        suites = ET.Element("testsuites")
        suite = ET.SubElement(suites, "testsuite", name=self.suite_name,
                              tests=str(len(self.cases)), failures=str(len(self.failures())),
                              errors="0")
        for name, failure, seconds, output in self.cases:
            case = ET.SubElement(suite, "testcase", name=name, classname=self.suite_name,
                                 time=f"{seconds:.1f}")
            if failure:
                ET.SubElement(case, "failure", message=failure[:500]).text = failure
            if output:
                ET.SubElement(case, "system-out").text = output
        ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def tail(path, lines=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def short_tmpdir(prefix):
    """A directory with a short path: AF_UNIX socket paths (multiprocessing)
    must fit in 108 bytes, which Bazel's TEST_TMPDIR does not leave room for."""
    import tempfile
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


