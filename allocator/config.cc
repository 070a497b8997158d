#include "allocator/config.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace rdmalloc {
namespace {

constexpr const char* kKnownVariables[] = {
    "RDMALLOC_BACKEND",  "RDMALLOC_DEVICE",      "RDMALLOC_VERBS_LIBRARY", "RDMALLOC_REGION_SIZE",
    "RDMALLOC_REGISTER", "RDMALLOC_ACCESS",      "RDMALLOC_MAX_PINNED",    "RDMALLOC_DECAY_MS",
    "RDMALLOC_STATS",    "RDMALLOC_STATS_FILE", "RDMALLOC_VERBOSE",      "RDMALLOC_NOTIFY",
};

struct AccessName {
  const char* name;
  int bit;
};
constexpr AccessName kAccessNames[] = {
    {"local_write", kAccessLocalWrite},     {"remote_write", kAccessRemoteWrite},
    {"remote_read", kAccessRemoteRead},     {"remote_atomic", kAccessRemoteAtomic},
    {"relaxed_ordering", kAccessRelaxedOrdering},
};

// Copies a value for display: one line whatever it holds.
void Shown(const char* value, char* out, size_t cap) {
  size_t n = 0;
  for (; value[n] != '\0' && n < cap - 1; n++)
    out[n] = (value[n] >= ' ' && value[n] != 127) ? value[n] : '?';
  out[n] = '\0';
}

void Warn(WarnFn warn, const char* name, const char* value, const char* accepted,
          const char* used) {
  char shown[320];
  Shown(value, shown, sizeof shown);
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

template <typename T>
struct Choice {
  const char* text;
  T value;
};

// A variable whose value is one of a few words. Returns whether it was set.
template <typename T, size_t N>
bool ParseChoice(EnvFn env, WarnFn warn, const char* name, const Choice<T> (&choices)[N],
                 const char* accepted, T* out) {
  const char* v = env(name);
  if (v == nullptr) return false;
  for (const Choice<T>& c : choices) {
    if (strcmp(v, c.text) == 0) {
      *out = c.value;
      return true;
    }
  }
  Warn(warn, name, v, accepted, choices[0].text);
  return false;
}

void ParseStringVar(EnvFn env, WarnFn warn, const char* name, char* out, size_t cap,
                    const char* accepted, const char* used) {
  if (const char* v = env(name)) {
    if (!CopyString(v, out, cap)) Warn(warn, name, v, accepted, used);
  }
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

bool ParseAccess(const char* s, int* out) {
  int bits = 0;
  while (true) {
    const char* end = strchr(s, ',');
    size_t len = end != nullptr ? static_cast<size_t>(end - s) : strlen(s);
    bool known = false;
    for (const AccessName& a : kAccessNames) {
      if (strlen(a.name) == len && strncmp(a.name, s, len) == 0) {
        bits |= a.bit;
        known = true;
      }
    }
    if (!known) return false;
    if (end == nullptr) break;
    s = end + 1;
  }
  *out = bits;
  return true;
}

void FormatAccess(int bits, char* out, size_t cap) {
  size_t n = 0;
  out[0] = '\0';
  for (const AccessName& a : kAccessNames) {
    if (!(bits & a.bit)) continue;
    int m = snprintf(out + n, cap - n, "%s%s", n != 0 ? "," : "", a.name);
    if (m < 0 || static_cast<size_t>(m) >= cap - n) break;
    n += static_cast<size_t>(m);
  }
}

Config ParseConfig(EnvFn env, WarnFn warn) {
  Config c;
  static constexpr Choice<BackendChoice> kBackends[] = {{"auto", BackendChoice::kAuto},
                                                         {"verbs", BackendChoice::kVerbs},
                                                         {"uring", BackendChoice::kUring},
                                                         {"none", BackendChoice::kNone}};
  ParseChoice(env, warn, "RDMALLOC_BACKEND", kBackends, "auto|verbs|uring|none", &c.backend);
  ParseStringVar(env, warn, "RDMALLOC_DEVICE", c.device, sizeof c.device,
                 "a device name of 1 to 63 characters", "the first device");
  ParseStringVar(env, warn, "RDMALLOC_VERBS_LIBRARY", c.verbs_library, sizeof c.verbs_library,
                 "a path of 1 to 255 characters", "libibverbs.so.1");
  if (const char* v = env("RDMALLOC_REGION_SIZE")) {
    size_t s = 0;
    if (!ParseSize(v, &s) || s < kMinRegionSize || s > kMaxRegionSize) {
      Warn(warn, "RDMALLOC_REGION_SIZE", v, "a size from 2M to 64G, suffix K/M/G", "32M");
    } else {
      // Regions are whole 2 MiB chunks.
      c.region_size = (s + kMinRegionSize - 1) & ~(kMinRegionSize - 1);
    }
  }
  static constexpr Choice<RegisterMode> kModes[] = {{"lazy", RegisterMode::kLazy},
                                                     {"eager", RegisterMode::kEager}};
  ParseChoice(env, warn, "RDMALLOC_REGISTER", kModes, "lazy|eager", &c.register_mode);
  if (const char* v = env("RDMALLOC_ACCESS")) {
    if (!ParseAccess(v, &c.access))
      Warn(warn, "RDMALLOC_ACCESS", v,
           "a comma list of local_write,remote_read,remote_write,remote_atomic,relaxed_ordering",
           "local_write");
  }
  if (const char* v = env("RDMALLOC_MAX_PINNED")) {
    if (strcmp(v, "unlimited") != 0 && !ParseSize(v, &c.max_pinned))
      Warn(warn, "RDMALLOC_MAX_PINNED", v, "a size with suffix K/M/G, or unlimited", "unlimited");
  }
  if (const char* v = env("RDMALLOC_DECAY_MS")) {
    char* end = nullptr;
    long ms = strtol(v, &end, 10);
    if (end == v || *end != '\0' || ms < -1 || ms > kMaxDecayMs) {
      Warn(warn, "RDMALLOC_DECAY_MS", v, "-1 (never) or 0 to 86400000", "jemalloc's dirty_decay_ms");
    } else {
      c.decay_ms = ms;
    }
  }
  static constexpr Choice<StatsMode> kStats[] = {
      {"0", StatsMode::kOff}, {"1", StatsMode::kText}, {"json", StatsMode::kJson}};
  bool stats_set = ParseChoice(env, warn, "RDMALLOC_STATS", kStats, "0|1|json", &c.stats);
  ParseStringVar(env, warn, "RDMALLOC_STATS_FILE", c.stats_file, sizeof c.stats_file,
                 "a path of 1 to 255 characters", "stderr");
  static constexpr Choice<int> kVerbose[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}};
  ParseChoice(env, warn, "RDMALLOC_VERBOSE", kVerbose, "0|1|2|3", &c.verbose);
  if (const char* v = env("RDMALLOC_NOTIFY")) {
    static constexpr Choice<int> kCaches[] = {{"ucx", kNotifyUcx}, {"libfabric", kNotifyLibfabric}};
    int bits = 0;
    bool ok = *v != '\0';
    for (const char* s = v; ok;) {
      const char* end = strchr(s, ',');
      size_t len = end != nullptr ? static_cast<size_t>(end - s) : strlen(s);
      int bit = 0;
      for (const Choice<int>& k : kCaches)
        if (strlen(k.text) == len && strncmp(k.text, s, len) == 0) bit = k.value;
      ok = bit != 0;
      bits |= bit;
      if (end == nullptr) break;
      s = end + 1;
    }
    if (ok)
      c.notify = bits;
    else
      Warn(warn, "RDMALLOC_NOTIFY", v, "a comma list of ucx,libfabric", "none");
  }

  // Contradictions: one line each, naming what is used instead.
  char line[640];
  if (c.register_mode == RegisterMode::kEager && c.backend == BackendChoice::kVerbs) {
    warn("rdmalloc: RDMALLOC_REGISTER=eager contradicts RDMALLOC_BACKEND=verbs (eager "
         "registration needs a backend that registers without malloc: uring); using lazy");
    c.register_mode = RegisterMode::kLazy;
  }
  if (c.device[0] != '\0' &&
      (c.backend == BackendChoice::kUring || c.backend == BackendChoice::kNone)) {
    char shown[80];
    Shown(c.device, shown, sizeof shown);
    snprintf(line, sizeof line,
             "rdmalloc: RDMALLOC_DEVICE=\"%s\" contradicts RDMALLOC_BACKEND=%s (no devices); "
             "ignoring RDMALLOC_DEVICE",
             shown, c.backend == BackendChoice::kUring ? "uring" : "none");
    warn(line);
    c.device[0] = '\0';
  }
  if (c.stats_file[0] != '\0' && c.stats == StatsMode::kOff) {
    if (stats_set) {
      warn("rdmalloc: RDMALLOC_STATS_FILE is set but RDMALLOC_STATS=0; writing no report");
    } else {
      c.stats = StatsMode::kText;  // asking for a report file asks for a report
    }
  }
  return c;
}

void WarnUnknownVariables(const char* const* envp, WarnFn warn) {
  for (; envp != nullptr && *envp != nullptr; envp++) {
    const char* e = *envp;
    if (strncmp(e, "RDMALLOC_", 9) != 0) continue;
    const char* eq = strchr(e, '=');
    size_t len = eq != nullptr ? static_cast<size_t>(eq - e) : strlen(e);
    bool known = false;
    for (const char* k : kKnownVariables) known |= strlen(k) == len && strncmp(k, e, len) == 0;
    if (known) continue;
    char name[128];
    Shown(e, name, len + 1 < sizeof name ? len + 1 : sizeof name);
    char line[256];
    snprintf(line, sizeof line,
             "rdmalloc: %s is not an rdmalloc variable (see docs/TUNING.md); ignoring it", name);
    warn(line);
  }
}

}  // namespace rdmalloc
