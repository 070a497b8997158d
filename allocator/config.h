// RDMALLOC_* settings, read once while malloc initialises: no allocation, and
// every bad value is reported in one line and replaced by the default. Each
// setting is defined once, in allocator/options.h's table, which drives the
// parser and from which docs/TUNING.md's table and `rdmalloc-run --help` are
// generated.
#ifndef RDMALLOC_ALLOCATOR_CONFIG_H_
#define RDMALLOC_ALLOCATOR_CONFIG_H_

#include <cstddef>

namespace rdmalloc {

enum class BackendChoice { kAuto, kVerbs, kUring, kNone };
enum class RegisterMode { kLazy, kEager };
enum class StatsMode { kOff, kText, kJson };

// Access bits, the values of enum ibv_access_flags.
constexpr int kAccessLocalWrite = 1;
constexpr int kAccessRemoteWrite = 2;
constexpr int kAccessRemoteRead = 4;
constexpr int kAccessRemoteAtomic = 8;
constexpr int kAccessRelaxedOrdering = 1 << 20;
// The plain heap is local-only: remote rights come with rdmalloc_alloc's
// access classes, so an rkey never exposes unrelated heap data.
constexpr int kDefaultAccess = kAccessLocalWrite;
constexpr int kRemoteAccess = kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic;

// RDMALLOC_NOTIFY: other registration caches told of released memory at start.
constexpr int kNotifyUcx = 1;
constexpr int kNotifyLibfabric = 2;

constexpr size_t kNoPinLimit = ~size_t{0};
constexpr long kDecayUnset = -2;  // keep jemalloc's own dirty_decay_ms
constexpr long kMaxDecayMs = 86400000;
constexpr size_t kDefaultRetain = size_t{128} << 20;
constexpr size_t kMaxRetain = size_t{1} << 40;
constexpr size_t kPageBytes = 4096;

struct Config {
  BackendChoice backend = BackendChoice::kAuto;
  char device[64] = {};
  char verbs_library[256] = {};  // libibverbs to load; empty: libibverbs.so.1
  size_t region_size = size_t{64} << 20;  // growth limit of a shared region
  RegisterMode register_mode = RegisterMode::kLazy;
  int access = kDefaultAccess;  // of the default domain
  size_t max_pinned = kNoPinLimit;  // bytes registered, summed over domains
  long decay_ms = kDecayUnset;
  size_t retain = kDefaultRetain;  // freed bytes kept resident for reuse
  int huge_pages = 1;  // large blocks on transparent huge pages
  StatsMode stats = StatsMode::kOff;
  char stats_file[256] = {};
  int verbose = 0;
  int notify = 0;  // kNotify* bits
  int interpose = 1;  // serve the program's ibv_reg_mr from the heap's registrations
};

// A Config that is all zero bytes until set. Config{} holds the defaults, and
// one non-zero byte in an object puts the whole object in the library file's
// .data: the heap, with its megabytes of tables, would then be file pages
// that the kernel maps in around every first read (fault-around), and a
// program that mallocs 100 bytes would carry 100 KiB more. Read only after Set.
class ConfigSlot {
 public:
  constexpr ConfigSlot() : unset_() {}
  void Set(const Config& c) { config_ = c; }
  const Config& get() const { return config_; }

 private:
  union {
    char unset_;
    Config config_;
  };
};

constexpr size_t kMinRegionSize = size_t{2} << 20;
constexpr size_t kMaxRegionSize = size_t{1} << 36;

// getenv-like lookup, so tests can feed their own environment.
using EnvFn = const char* (*)(const char* name);
using WarnFn = void (*)(const char* line);

// Parses the RDMALLOC_* variables. Each problem is reported through `warn`
// (one line, no newline) and the default is kept.
Config ParseConfig(EnvFn env, WarnFn warn);
// The same from `envp` ("NAME=value" strings, null terminated) in one pass:
// getenv for each option scanned the whole environment each time, 14 k of
// the 2 M instructions a small program runs (three parses at start-up).
Config ParseEnvironment(const char* const* envp, WarnFn warn);

// Warns once for each RDMALLOC_* name in `envp` ("NAME=value" strings, null
// terminated) that rdmalloc does not know: a typo must not pass silently.
void WarnUnknownVariables(const char* const* envp, WarnFn warn);

// Parses "64M", "2g", "1048576". Returns false on anything else.
bool ParseSize(const char* s, size_t* out);

// Parses "local_write,remote_read" into access bits. Returns false on an
// unknown or empty name.
bool ParseAccess(const char* s, int* out);
// The inverse: "local_write,remote_read" (ParseAccess's names, in its order).
void FormatAccess(int bits, char* out, size_t cap);

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_CONFIG_H_
