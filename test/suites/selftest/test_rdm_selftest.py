"""A stand-in regression suite for python_suites_selftest.sh: its cases
behave differently under rdmalloc (LD_PRELOAD names librdmalloc) as
SELFTEST_MODE says, to show that the driver reports a difference and a hang
(and fails), accepts an expected difference, and fails on a stale one."""
import os
import time
import unittest

UNDER_RDMALLOC = "librdmalloc" in os.environ.get("LD_PRELOAD", "")
MODE = os.environ.get("SELFTEST_MODE", "")


class SelfTest(unittest.TestCase):
    def test_a_passes(self):
        pass

    def test_b_differs(self):
        if UNDER_RDMALLOC and "differ" in MODE:
            self.fail("fails only under rdmalloc")

    def test_c_hangs_in_fork(self):
        pid = os.fork()
        if pid == 0:
            if UNDER_RDMALLOC and "hang" in MODE:
                time.sleep(3600)  # a child that never exits: the parent waits
            os._exit(0)
        os.waitpid(pid, 0)

    def test_d_after_the_hang(self):
        pass

    @unittest.skipIf(True, "skipped everywhere")
    def test_e_skipped(self):
        pass
