// large_blocks: 1..32 MiB blocks, every page touched. One op = one malloc or one free.
// sparse_blocks (this file built with SPARSE_BLOCKS): the same blocks, of which
// only the first 64 KiB and the last byte are written, as a program writes a
// message into a buffer sized for the largest: what the allocator costs per
// large block when page faults do not hide it.
//
// Usage: large_blocks [threads=1] [scale=1.0]
//        sparse_blocks [threads=1] [scale=1.0]
// Meant to be run with one thread (the default); with T > 1, T threads run the
// same loop independently. Each thread keeps kLive blocks alive; a step frees
// the oldest block and allocates a new one of random size (1..32 MiB, not page
// aligned), then writes one byte in every 4 KiB page and the last byte. Before
// a block is freed every one of those bytes is read back and checked. The
// total work is fixed, kTotalBlocks * scale blocks, split evenly among the
// threads. Peak live memory is about kLive * 32 MiB per thread (128 MiB).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "benchmarks/workloads/workload.h"

namespace {

#ifdef SPARSE_BLOCKS
constexpr char kName[] = "sparse_blocks";
constexpr size_t kWritten = 64 << 10;  // of each block, from its start
constexpr double kTotalBlocks = 20000;
#else
constexpr char kName[] = "large_blocks";
constexpr size_t kWritten = SIZE_MAX;
constexpr double kTotalBlocks = 500;
#endif
constexpr size_t kMinSize = 1 << 20;
constexpr size_t kMaxSize = 32 << 20;
constexpr size_t kPage = 4096;
constexpr size_t kLive = 4;

// The pages of an n-byte block that get a byte.
size_t WrittenEnd(size_t n) { return n < kWritten ? n : kWritten; }

struct Block {
  unsigned char* p = nullptr;
  size_t n = 0;
  uint64_t tag = 0;
};

struct Tally {
  uint64_t ops = 0, made = 0, freed = 0, written = 0, read = 0, bad = 0;
};

unsigned char PageByte(uint64_t tag, size_t page) { return static_cast<unsigned char>(tag + page * 0x9D); }
unsigned char LastByte(uint64_t tag) { return static_cast<unsigned char>((tag >> 8) ^ 0x5A); }

void Make(Block& b, size_t n, uint64_t tag, Tally& t) {
  b.p = static_cast<unsigned char*>(workload::Malloc(kName, n));
  b.n = n;
  b.tag = tag;
  for (size_t off = 0, page = 0; off < WrittenEnd(n); off += kPage, page++) {
    b.p[off] = PageByte(tag, page);
    t.written += b.p[off];
  }
  if ((n - 1) % kPage != 0) {
    b.p[n - 1] = LastByte(tag);
    t.written += b.p[n - 1];
  }
  t.ops++;
  t.made++;
}

void Release(Block& b, Tally& t) {
  for (size_t off = 0, page = 0; off < WrittenEnd(b.n); off += kPage, page++) {
    if (b.p[off] != PageByte(b.tag, page)) t.bad++;
    t.read += b.p[off];
  }
  if ((b.n - 1) % kPage != 0) {
    if (b.p[b.n - 1] != LastByte(b.tag)) t.bad++;
    t.read += b.p[b.n - 1];
  }
  free(b.p);
  b = Block();
  t.ops++;
  t.freed++;
}

void Worker(int id, long blocks, Tally& tally) {
  workload::Rng rng(6000 + id);
  Tally t;
  Block live[kLive];
  for (long i = 0; i < blocks; i++) {
    Block& b = live[i % kLive];  // the oldest
    if (b.p != nullptr) Release(b, t);
    Make(b, kMinSize + rng.Next() % (kMaxSize - kMinSize + 1), rng.Next(), t);
  }
  for (Block& b : live)
    if (b.p != nullptr) Release(b, t);
  tally = t;
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Args args = workload::ParseArgs(argc, argv);
  const int threads = args.threads;
  const long blocks = workload::Share(kTotalBlocks, args);
  std::vector<Tally> tallies(threads);

  return workload::Run(
      kName, threads, workload::OneThread::kMainThread, [&](int i) { Worker(i, blocks, tallies[i]); },
      [&]() -> workload::Ops {
        Tally sum;
        for (const Tally& t : tallies) {
          sum.ops += t.ops;
          sum.made += t.made;
          sum.freed += t.freed;
          sum.written += t.written;
          sum.read += t.read;
          sum.bad += t.bad;
        }
        if (sum.bad != 0 || sum.made != sum.freed || sum.written != sum.read ||
            sum.made != static_cast<uint64_t>(blocks) * threads) {
          fprintf(stderr, "%s: verification failed: bad=%llu made=%llu freed=%llu checksum %s\n",
                  kName, (unsigned long long)sum.bad, (unsigned long long)sum.made, (unsigned long long)sum.freed,
                  sum.written == sum.read ? "match" : "differs");
          return std::nullopt;
        }
        return sum.ops;
      });
}
