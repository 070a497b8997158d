"""A real Python workload under LD_PRELOAD=librdmalloc.so.

Computes things whose answers are known (so the allocator cannot silently
corrupt them), then uses rdmalloc's C API through ctypes the way an RDMA
program would: keys for live buffers, bytes moved through the registration.
"""
import ctypes
import hashlib
import json
import random
import sys


def workload():
    rng = random.Random(1234)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 12))) for _ in range(200000)]
    counts = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    blob = json.dumps({"words": words[:50000], "top": top})
    assert json.loads(blob)["top"] == [list(t) for t in top]
    big = bytearray(rng.getrandbits(8) for _ in range(1 << 20)) * 24  # 24 MiB
    digest = hashlib.sha256(big).hexdigest()
    squares = sum(i * i for i in range(10 ** 6))
    return {"distinct": len(counts), "top": top, "sha256": digest, "squares": squares}


class Keys(ctypes.Structure):
    _fields_ = [("lkey", ctypes.c_uint32), ("rkey", ctypes.c_uint32), ("mr", ctypes.c_void_p),
                ("handle", ctypes.c_void_p), ("region_base", ctypes.c_void_p),
                ("region_len", ctypes.c_size_t), ("addr", ctypes.c_void_p), ("len", ctypes.c_size_t),
                ("reg_errno", ctypes.c_int), ("domain", ctypes.c_int), ("access", ctypes.c_int)]


LOCAL_WRITE = 1          # RDMALLOC_ACCESS_LOCAL_WRITE
REMOTE_READ_WRITE = 3    # RDMALLOC_REMOTE_READ | RDMALLOC_REMOTE_WRITE
EDMA = -6


def rdma_like():
    lib = ctypes.CDLL(None)  # the preloaded library's symbols are global
    lib.rdmalloc_backend.restype = ctypes.c_char_p
    checked = 0
    # Python keeps objects of 512 bytes and less in its own mmap'd pools
    # (pymalloc), which are not malloc memory: rdmalloc rightly says so.
    small = bytearray(64)
    keys = Keys()
    addr = ctypes.addressof(ctypes.c_char.from_buffer(small))
    rc = lib.rdmalloc_lookup(ctypes.c_void_p(addr), ctypes.c_size_t(64), None, ctypes.byref(keys))
    assert rc == -1, f"pymalloc memory should not be rdmalloc's: {rc}"
    # Plain malloc memory (bytearrays) is registered for local access only:
    # its keys carry no remote rights and a peer's write through them is refused.
    for size in (1000, 4096, 1 << 20, 16 << 20):
        buf = bytearray(size)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        keys = Keys()
        rc = lib.rdmalloc_lookup(ctypes.c_void_p(addr), ctypes.c_size_t(size), None, ctypes.byref(keys))
        assert rc == 0, f"lookup of a {size}-byte bytearray failed: {rc}"
        assert keys.access == LOCAL_WRITE, f"plain heap keys carry rights {keys.access:#x}"
        rc = lib.rdmalloc_dma_write(ctypes.byref(keys), ctypes.c_size_t(0), b"x", ctypes.c_size_t(1))
        assert rc == EDMA and buf[0] == 0, f"a remote write into plain memory was not refused: {rc}"
    # Buffers meant for peers come from rdmalloc_alloc with remote rights.
    lib.rdmalloc_alloc.restype = ctypes.c_void_p
    for size in (1000, 4096, 1 << 20, 16 << 20):
        addr = lib.rdmalloc_alloc(ctypes.c_size_t(size), ctypes.c_uint(REMOTE_READ_WRITE))
        assert addr, f"rdmalloc_alloc({size}) failed"
        buf = (ctypes.c_char * size).from_address(addr)
        keys = Keys()
        rc = lib.rdmalloc_lookup(ctypes.c_void_p(addr), ctypes.c_size_t(size), None, ctypes.byref(keys))
        assert rc == 0, f"lookup of a {size}-byte remote buffer failed: {rc}"
        assert keys.access & 6 == 6, f"remote buffer keys lack rights: {keys.access:#x}"
        payload = bytes((i * 7 + size) % 251 for i in range(min(size, 65536)))
        rc = lib.rdmalloc_dma_write(ctypes.byref(keys), ctypes.c_size_t(0), payload, ctypes.c_size_t(len(payload)))
        assert rc == 0, f"dma_write failed: {rc}"
        assert bytes(buf[:len(payload)]) == payload, "NIC->CPU mismatch"
        ctypes.memmove(addr, payload[::-1], len(payload))
        out = ctypes.create_string_buffer(len(payload))
        rc = lib.rdmalloc_dma_read(ctypes.byref(keys), ctypes.c_size_t(0), out, ctypes.c_size_t(len(payload)))
        assert rc == 0, f"dma_read failed: {rc}"
        assert out.raw == payload[::-1], "CPU->NIC mismatch"
        lib.free(ctypes.c_void_p(addr))
        checked += 1
    return lib.rdmalloc_backend().decode(), checked


if __name__ == "__main__":
    result = workload()
    print(json.dumps(result, sort_keys=True))
    if len(sys.argv) > 1 and sys.argv[1] == "--rdma":
        backend, checked = rdma_like()
        print(f"rdma: backend={backend} buffers_checked={checked}", file=sys.stderr)
