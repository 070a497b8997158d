"""vm_test: a Bazel test that runs a command inside the soft-RoCE VM."""

def vm_test(name, what, command, data = [], env = {}, timeout = 240, pair = False):
    """Boots the VM (test/vm/run.sh) and runs `command` in it.

    vm_test.sh turns "the VM cannot start" into a loud skip, or a failure
    under CI=true. Exclusive: each boot takes both cores of emulated CPU.
    Not under UBSan: minutes of emulated VM each; the plain build runs it.

    Args:
      name: the test's name.
      what: how the test names itself in messages ("real-verbs suite").
      command: the command and its arguments, e.g. ["$(rootpath :bin)"].
      data: what the command needs (its binaries and files).
      env: environment of the command (run.sh passes the caller's on).
      timeout: seconds before run.sh kills a hung guest.
      pair: boot two VMs joined by a virtual link (test/vm/run_pair.sh):
        `command` runs in the first and reaches the second through vm_rsh.py.
    """
    runner = "//test/vm:run_pair.sh" if pair else "//test/vm:run.sh"
    pair_files = ["//test/vm:run.sh", "//test/vm:vm_rsh.py"] if pair else []
    native.sh_test(
        name = name,
        size = "large",
        srcs = ["//test/vm:vm_test.sh"],
        args = ["'%s'" % what, "$(rootpath %s)" % runner, "--timeout", str(timeout)] + command,
        data = data + [runner] + pair_files,
        env = env,
        tags = [
            "exclusive",
            "no_ubsan",
        ],
    )
