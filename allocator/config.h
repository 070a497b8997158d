// RDMALLOC_* settings, read once while malloc initialises: no allocation, and
// every bad value is reported in one line and replaced by the default.
#ifndef RDMALLOC_ALLOCATOR_CONFIG_H_
#define RDMALLOC_ALLOCATOR_CONFIG_H_

#include <cstddef>

namespace rdmalloc {

enum class BackendChoice { kAuto, kVerbs, kUring, kNone };
enum class RegisterMode { kLazy, kEager };
enum class StatsMode { kOff, kText, kJson };

struct Config {
  BackendChoice backend = BackendChoice::kAuto;
  char device[64] = {};
  char verbs_library[256] = {};  // libibverbs to load; empty: libibverbs.so.1
  size_t region_size = size_t{32} << 20;  // growth limit of a region
  RegisterMode register_mode = RegisterMode::kLazy;
  StatsMode stats = StatsMode::kOff;
  char stats_file[256] = {};
  int verbose = 0;
};

constexpr size_t kMinRegionSize = size_t{2} << 20;
constexpr size_t kMaxRegionSize = size_t{1} << 36;

// getenv-like lookup, so tests can feed their own environment.
using EnvFn = const char* (*)(const char* name);

// Parses the RDMALLOC_* variables. Each problem is reported through `warn`
// (one line, no newline) and the default is kept.
Config ParseConfig(EnvFn env, void (*warn)(const char* line));

// Parses "64M", "2g", "1048576". Returns false on anything else.
bool ParseSize(const char* s, size_t* out);

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_CONFIG_H_
