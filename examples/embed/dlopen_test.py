#!/usr/bin/env python3
"""dlopen of rdmalloc from Python, as ctypes or mpi4py load an MPI library.

jemalloc inside rdmalloc uses initial-exec TLS, so a library loaded after
start needs room in glibc's static TLS block. For each library given:
without GLIBC_TUNABLES the load fails with glibc's "cannot allocate memory in
static TLS block"; with glibc.rtld.optional_static_tls=4096 it loads, and its
own malloc (CDLL(...).malloc resolves inside the library) hands out
registered, local-only memory; its rdmalloc_alloc with the remote flags hands
out memory whose bytes move through rdmalloc_dma_write/read; Python's own
(glibc) memory is RDMALLOC_ENOTOURS. See docs/EMBEDDING.md.

usage: dlopen_test.py LIBRARY...
"""
import ctypes
import errno
import os
import subprocess
import sys

TUNABLE = "glibc.rtld.optional_static_tls=4096"
TLS_MESSAGE = "cannot allocate memory in static TLS block"
RDMALLOC_OK, RDMALLOC_ENOTOURS, RDMALLOC_EDMA = 0, -1, -6
RDMALLOC_REMOTE_READ, RDMALLOC_REMOTE_WRITE = 1, 2  # rdmalloc_alloc flags
RDMALLOC_ACCESS_REMOTE_WRITE, RDMALLOC_ACCESS_REMOTE_READ = 2, 4  # keys.access bits
MINIMPI_ZERO_COPY, MINIMPI_BOUNCED = 1, 2
MAX_DOMAINS = 8


class Keys(ctypes.Structure):  # struct rdmalloc_keys
    _fields_ = [("lkey", ctypes.c_uint32), ("rkey", ctypes.c_uint32), ("mr", ctypes.c_void_p),
                ("handle", ctypes.c_void_p), ("region_base", ctypes.c_void_p),
                ("region_len", ctypes.c_size_t), ("addr", ctypes.c_void_p), ("len", ctypes.c_size_t),
                ("reg_errno", ctypes.c_int), ("domain", ctypes.c_int), ("access", ctypes.c_int)]


class DomainStats(ctypes.Structure):  # struct rdmalloc_domain_stats
    _fields_ = [("pd", ctypes.c_void_p)] + [(name, ctypes.c_uint64) for name in (
        "open", "bytes_registered", "reg_calls", "dereg_calls", "reg_failures")]


class Stats(ctypes.Structure):  # struct rdmalloc_stats, version 1
    _fields_ = [("version", ctypes.c_uint32), ("size", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64) for name in (
            "regions_live", "regions_created", "regions_released", "bytes_mapped", "bytes_in_use",
            "bytes_registered", "bytes_pinned", "domains", "reg_calls", "dereg_calls", "reg_ns",
            "dereg_ns", "reg_failures", "lookups", "lookup_not_ours", "lookup_cross",
            "lookup_reg_failed", "lookup_einval", "lookup_slow", "foreign_extents",
            "releases_deferred", "cap_hits", "max_pinned")] + [
        ("domain", DomainStats * MAX_DOMAINS)]


def declare(lib):
    vp, size = ctypes.c_void_p, ctypes.c_size_t
    for name, restype, argtypes in (
            ("malloc", vp, [size]), ("calloc", vp, [size, size]), ("realloc", vp, [vp, size]),
            ("rdmalloc_alloc", vp, [size, ctypes.c_uint]),
            ("free", None, [vp]),
            ("rdmalloc_lookup", ctypes.c_int, [vp, size, vp, ctypes.POINTER(Keys)]),
            ("rdmalloc_dma_write", ctypes.c_int, [ctypes.POINTER(Keys), size, vp, size]),
            ("rdmalloc_dma_read", ctypes.c_int, [ctypes.POINTER(Keys), size, vp, size]),
            ("rdmalloc_stats", ctypes.c_int, [ctypes.POINTER(Stats), size]),
            ("rdmalloc_backend", ctypes.c_char_p, [])):
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes


def check(ok, what):
    if not ok:
        raise AssertionError(what)


def pattern(n, seed):
    return bytes((seed + i * 31) & 0xFF for i in range(n))


def child(path):
    """Loads path and exercises it; exit 3 with the message if dlopen fails."""
    try:
        lib = ctypes.CDLL(path, use_errno=True)
    except OSError as error:
        print(f"dlopen failed: {error}")
        return 3
    declare(lib)
    glibc = ctypes.CDLL(None)
    glibc.malloc.restype, glibc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    glibc.free.argtypes = [ctypes.c_void_p]
    address = lambda f: ctypes.cast(f, ctypes.c_void_p).value
    check(address(lib.malloc) != address(glibc.malloc), "CDLL(library).malloc is the library's own")
    backend = lib.rdmalloc_backend().decode()
    check(backend in ("uring", "verbs"), f"backend {backend} registers memory")

    # Memory a peer may read and write: registered with those rights, and
    # bytes move through its keys.
    n = 1 << 20
    remote = lib.rdmalloc_alloc(n, RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE)
    keys = Keys()
    check(remote and lib.rdmalloc_lookup(remote, n, None, ctypes.byref(keys)) == RDMALLOC_OK,
          "rdmalloc_alloc memory has keys")
    check(keys.addr == remote and keys.region_base <= remote < keys.region_base + keys.region_len,
          "keys describe the buffer")
    rights = RDMALLOC_ACCESS_REMOTE_READ | RDMALLOC_ACCESS_REMOTE_WRITE
    check(keys.access & rights == rights, f"remote rights granted (access {keys.access:#x})")
    sent = pattern(4096, 1)
    check(lib.rdmalloc_dma_write(ctypes.byref(keys), 12345, sent, len(sent)) == RDMALLOC_OK, "dma_write")
    check(ctypes.string_at(remote + 12345, len(sent)) == sent, "dma_write landed in the buffer")
    ctypes.memmove(remote + 500000, pattern(4096, 2), 4096)
    back = ctypes.create_string_buffer(4096)  # Python's memory, as a dma target
    check(lib.rdmalloc_dma_read(ctypes.byref(keys), 500000, back, 4096) == RDMALLOC_OK, "dma_read")
    check(back.raw == pattern(4096, 2), "dma_read brought the buffer's bytes")
    lib.free(remote)

    # The library's malloc: registered for local access only, so a peer's
    # write is refused as the NIC would refuse it.
    buffer = lib.malloc(n)
    check(buffer and lib.rdmalloc_lookup(buffer, n, None, ctypes.byref(keys)) == RDMALLOC_OK,
          "library malloc memory has keys")
    check(keys.access & rights == 0, f"plain heap is local-only (access {keys.access:#x})")
    ctypes.memmove(buffer + 12345, sent, len(sent))
    check(lib.rdmalloc_dma_write(ctypes.byref(keys), 0, sent, len(sent)) == RDMALLOC_EDMA and
          ctypes.get_errno() == errno.EACCES, "dma_write into the plain heap is refused (EACCES)")

    # calloc and realloc of the library stay registered; realloc keeps the bytes.
    zeroed = lib.calloc(1000, 100)
    check(lib.rdmalloc_lookup(zeroed, 100000, None, ctypes.byref(Keys())) == RDMALLOC_OK, "calloc has keys")
    check(ctypes.string_at(zeroed, 100000) == bytes(100000), "calloc memory is zeroed")
    grown = lib.realloc(buffer, 3 * n)
    check(lib.rdmalloc_lookup(grown, 3 * n, None, ctypes.byref(keys)) == RDMALLOC_OK, "realloc has keys")
    check(ctypes.string_at(grown + 12345, len(sent)) == sent, "realloc kept the bytes")
    lib.free(grown)
    lib.free(zeroed)

    # Python's and glibc's memory is not rdmalloc's.
    python_owned = ctypes.create_string_buffer(n)
    check(lib.rdmalloc_lookup(python_owned, n, None, ctypes.byref(keys)) == RDMALLOC_ENOTOURS,
          "Python's buffer is RDMALLOC_ENOTOURS")
    from_glibc = glibc.malloc(n)
    check(lib.rdmalloc_lookup(from_glibc, n, None, ctypes.byref(keys)) == RDMALLOC_ENOTOURS,
          "glibc's malloc memory is RDMALLOC_ENOTOURS")
    glibc.free(from_glibc)

    if hasattr(lib, "minimpi_send"):  # the embedding library: a message through it
        lib.minimpi_send.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.minimpi_recv.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.POINTER(ctypes.c_size_t)]
        message = ctypes.create_string_buffer(pattern(65536, 3), 65536)
        lib.minimpi_alloc_mem.restype, lib.minimpi_alloc_mem.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        lib.minimpi_free_mem.argtypes = [ctypes.c_void_p]
        inbox = lib.minimpi_alloc_mem(65536)
        got = ctypes.c_size_t()
        check(lib.minimpi_send(message, 65536, 5) == MINIMPI_BOUNCED, "send from Python memory bounces")
        check(lib.minimpi_recv(inbox, 65536, 5, ctypes.byref(got)) == MINIMPI_ZERO_COPY,
              "recv into minimpi_alloc_mem memory is zero-copy")
        check(got.value == 65536 and ctypes.string_at(inbox, 65536) == message.raw, "message arrived")
        lib.minimpi_free_mem(inbox)

    stats = Stats()
    check(lib.rdmalloc_stats(ctypes.byref(stats), ctypes.sizeof(stats)) == RDMALLOC_OK, "rdmalloc_stats")
    check(stats.version >= 1 and stats.size == ctypes.sizeof(stats), f"stats header {stats.version}/{stats.size}")
    check(stats.lookups >= 5 and stats.lookup_not_ours >= 2, f"lookups {stats.lookups}/{stats.lookup_not_ours}")
    check(stats.regions_live >= 1 and stats.bytes_registered > 0, "registered regions")
    print(f"{os.path.basename(path)}: backend={backend} regions_live={stats.regions_live} "
          f"bytes_registered={stats.bytes_registered} lookups={stats.lookups} "
          f"lookup_not_ours={stats.lookup_not_ours}")
    return 0


def run_child(path, tunables):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    env.pop("RDMALLOC_ACCESS", None)  # the default: the plain heap is local-only
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    return subprocess.run([sys.executable, __file__, "--child", path], env=env, capture_output=True,
                          text=True, timeout=60)


def main(paths):
    failures = 0
    for path in map(os.path.abspath, paths):
        name = os.path.basename(path)
        plain = run_child(path, None)
        print(f"--- {name} without GLIBC_TUNABLES: exit {plain.returncode}\n{plain.stdout}{plain.stderr}")
        if plain.returncode != 3 or plain.stdout.strip() != f"dlopen failed: {path}: {TLS_MESSAGE}":
            print(f"FAIL: {name} without the tunable: expected the static TLS failure")
            failures += 1
        tuned = run_child(path, TUNABLE)
        print(f"--- {name} with GLIBC_TUNABLES={TUNABLE}: exit {tuned.returncode}\n{tuned.stdout}{tuned.stderr}")
        if tuned.returncode != 0:
            print(f"FAIL: {name} with the tunable")
            failures += 1
    print("dlopen checks passed" if failures == 0 else f"{failures} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2]))
    sys.exit(main(sys.argv[1:]))
