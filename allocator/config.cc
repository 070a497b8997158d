#include "allocator/config.h"

#include <cstdio>
#include <cstring>

namespace rdmalloc {
namespace {

void Warn(void (*warn)(const char*), const char* name, const char* value, const char* accepted,
          const char* used) {
  // One line, whatever the value holds: control characters become '?'.
  char shown[320];
  size_t n = 0;
  for (; value[n] != '\0' && n < sizeof shown - 1; n++)
    shown[n] = (value[n] >= ' ' && value[n] != 127) ? value[n] : '?';
  shown[n] = '\0';
  char line[640];
  snprintf(line, sizeof line, "rdmalloc: %s=\"%s\" is not valid (accepted: %s); using %s", name,
           shown, accepted, used);
  warn(line);
}

bool CopyString(const char* s, char* out, size_t cap) {
  size_t n = strlen(s);
  if (n == 0 || n >= cap) return false;
  memcpy(out, s, n + 1);
  return true;
}

}  // namespace

bool ParseSize(const char* s, size_t* out) {
  if (s == nullptr || *s < '0' || *s > '9') return false;
  unsigned long long v = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    unsigned digit = static_cast<unsigned>(*s - '0');
    if (v > (~0ull - digit) / 10) return false;
    v = v * 10 + digit;
  }
  unsigned shift = 0;
  switch (*s) {
    case '\0': break;
    case 'k': case 'K': shift = 10; s++; break;
    case 'm': case 'M': shift = 20; s++; break;
    case 'g': case 'G': shift = 30; s++; break;
    default: return false;
  }
  if ((*s == 'b' || *s == 'B') && shift != 0) s++;
  if (*s != '\0') return false;
  if (shift != 0 && v > (~0ull >> shift)) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

Config ParseConfig(EnvFn env, void (*warn)(const char*)) {
  Config c;
  if (const char* v = env("RDMALLOC_BACKEND")) {
    if (!strcmp(v, "auto")) c.backend = BackendChoice::kAuto;
    else if (!strcmp(v, "verbs")) c.backend = BackendChoice::kVerbs;
    else if (!strcmp(v, "uring")) c.backend = BackendChoice::kUring;
    else if (!strcmp(v, "none")) c.backend = BackendChoice::kNone;
    else Warn(warn, "RDMALLOC_BACKEND", v, "auto|verbs|uring|none", "auto");
  }
  if (const char* v = env("RDMALLOC_DEVICE")) {
    if (!CopyString(v, c.device, sizeof c.device))
      Warn(warn, "RDMALLOC_DEVICE", v, "a device name of 1 to 63 characters", "the first device");
  }
  if (const char* v = env("RDMALLOC_VERBS_LIBRARY")) {
    if (!CopyString(v, c.verbs_library, sizeof c.verbs_library))
      Warn(warn, "RDMALLOC_VERBS_LIBRARY", v, "a path of 1 to 255 characters", "libibverbs.so.1");
  }
  if (const char* v = env("RDMALLOC_REGION_SIZE")) {
    size_t s = 0;
    if (!ParseSize(v, &s) || s < kMinRegionSize || s > kMaxRegionSize) {
      Warn(warn, "RDMALLOC_REGION_SIZE", v, "a size from 2M to 64G, suffix K/M/G", "32M");
    } else {
      // Regions are whole 2 MiB chunks.
      c.region_size = (s + kMinRegionSize - 1) & ~(kMinRegionSize - 1);
    }
  }
  if (const char* v = env("RDMALLOC_REGISTER")) {
    if (!strcmp(v, "lazy")) c.register_mode = RegisterMode::kLazy;
    else if (!strcmp(v, "eager")) c.register_mode = RegisterMode::kEager;
    else Warn(warn, "RDMALLOC_REGISTER", v, "lazy|eager", "lazy");
  }
  if (const char* v = env("RDMALLOC_STATS")) {
    if (!strcmp(v, "0")) c.stats = StatsMode::kOff;
    else if (!strcmp(v, "1")) c.stats = StatsMode::kText;
    else if (!strcmp(v, "json")) c.stats = StatsMode::kJson;
    else Warn(warn, "RDMALLOC_STATS", v, "0|1|json", "0");
  }
  if (const char* v = env("RDMALLOC_STATS_FILE")) {
    if (!CopyString(v, c.stats_file, sizeof c.stats_file))
      Warn(warn, "RDMALLOC_STATS_FILE", v, "a path of 1 to 255 characters", "stderr");
  }
  if (const char* v = env("RDMALLOC_VERBOSE")) {
    if (v[0] >= '0' && v[0] <= '2' && v[1] == '\0') c.verbose = v[0] - '0';
    else Warn(warn, "RDMALLOC_VERBOSE", v, "0|1|2", "0");
  }
  return c;
}

}  // namespace rdmalloc
