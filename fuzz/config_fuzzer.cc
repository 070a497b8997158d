// Fuzz target: the RDMALLOC_* parser (allocator/config.h) with arbitrary
// names and values.
//
// Input: lines. A line starting with a byte below 0x20 sets the known
// variable that byte picks to the rest of the line; any other line is a raw
// "NAME=VALUE" environment entry (parsed too when NAME is a known variable).
// Checked against reference parsers written from docs/TUNING.md: every
// value is used exactly when it is valid, otherwise the default is kept and
// exactly one warning names the variable; every warning is one printable
// line; parsed values are in range; unknown RDMALLOC_* names warn once each.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "allocator/config.h"

namespace rdmalloc {
namespace {

// Every variable docs/TUNING.md documents.
const char* const kKnown[] = {
    "RDMALLOC_BACKEND",  "RDMALLOC_DEVICE",     "RDMALLOC_VERBS_LIBRARY", "RDMALLOC_REGION_SIZE",
    "RDMALLOC_REGISTER", "RDMALLOC_ACCESS",     "RDMALLOC_MAX_PINNED",    "RDMALLOC_DECAY_MS",
    "RDMALLOC_STATS",    "RDMALLOC_STATS_FILE", "RDMALLOC_VERBOSE",      "RDMALLOC_NOTIFY",
    "RDMALLOC_RETAIN",   "RDMALLOC_INTERPOSE",  "RDMALLOC_HUGEPAGES",
};
constexpr size_t kKnownCount = sizeof kKnown / sizeof kKnown[0];

std::vector<std::pair<std::string, std::string>> g_env;
std::vector<std::string> g_warnings;

const char* Env(const char* name) {
  for (const auto& [n, v] : g_env)
    if (n == name) return v.c_str();
  return nullptr;
}

void Collect(const char* line) { g_warnings.emplace_back(line); }

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  fprintf(stderr, "config_fuzzer: %s: \"%s\"\n", what, detail.c_str());
  abort();
}

void Check(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) Fail(what, detail);
}

// --- Reference parsers, written from the documentation, not from config.cc.

// Digits, then optionally K/M/G (any case) and, after one of those, B.
bool RefSize(const std::string& s, uint64_t* out) {
  size_t i = 0;
  unsigned __int128 v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    v = v * 10 + static_cast<unsigned>(s[i] - '0');
    if (v > UINT64_MAX) return false;
    i++;
  }
  if (i == 0) return false;
  unsigned shift = 0;
  if (i < s.size()) {
    char c = s[i] | 0x20;
    shift = c == 'k' ? 10 : c == 'm' ? 20 : c == 'g' ? 30 : 0;
    if (shift == 0) return false;
    i++;
    if (i < s.size() && (s[i] | 0x20) == 'b') i++;
  }
  if (i != s.size()) return false;
  v <<= shift;
  if (v > UINT64_MAX) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

// A comma list of known right names; nothing empty.
bool RefAccess(const std::string& s, int* out) {
  static const std::pair<const char*, int> kNames[] = {
      {"local_write", kAccessLocalWrite},   {"remote_write", kAccessRemoteWrite},
      {"remote_read", kAccessRemoteRead},   {"remote_atomic", kAccessRemoteAtomic},
      {"relaxed_ordering", kAccessRelaxedOrdering}};
  int bits = 0;
  size_t start = 0;
  while (true) {
    size_t end = s.find(',', start);
    std::string word = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    bool known = false;
    for (const auto& [name, bit] : kNames) {
      if (word == name) {
        bits |= bit;
        known = true;
      }
    }
    if (!known) return false;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  *out = bits;
  return true;
}

// Plain decimal, optionally negative; -1 or 0 to 86400000.
bool RefDecay(const std::string& s, long* out) {
  if (s.empty() || s.size() > 12) return false;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  long v = 0;
  for (; i < s.size(); i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  if (s[0] == '-') v = -v;
  if (v < -1 || v > kMaxDecayMs) return false;
  *out = v;
  return true;
}

// What a warning may hold: printable ASCII (config.cc shows anything else as '?').
bool Printable(const std::string& s) {
  for (unsigned char c : s)
    if (c < ' ' || c >= 127) return false;
  return true;
}

// Warnings about `name`'s value ("rdmalloc: NAME=..." or "rdmalloc: NAME is ...").
int WarningsAbout(const std::string& name) {
  int n = 0;
  for (const std::string& w : g_warnings) {
    std::string prefix = "rdmalloc: " + name;
    if (w.compare(0, prefix.size(), prefix) == 0 &&
        (w.size() > prefix.size() && (w[prefix.size()] == '=' || w[prefix.size()] == ' ')))
      n++;
  }
  return n;
}

// One variable: used when valid, otherwise default and one warning.
void ExpectUsedOrWarned(const char* name, bool valid, bool used, bool is_default) {
  const char* v = Env(name);
  int warned = WarningsAbout(name);
  if (v == nullptr) {
    Check(is_default, "unset variable changed the config", name);
    Check(warned == 0, "unset variable warned", name);
    return;
  }
  Check(warned <= 1, "more than one warning for one variable", name);
  if (valid) {
    Check(used, "valid value not used", std::string(name) + "=" + v);
  } else {
    Check(is_default, "invalid value not replaced by the default", std::string(name) + "=" + v);
    Check(warned == 1, "invalid value without a warning", std::string(name) + "=" + v);
  }
}

void CheckConfig() {
  g_warnings.clear();
  Config c = ParseConfig(Env, Collect);
  const Config d;
  size_t set = 0;
  for (const char* k : kKnown) set += Env(k) != nullptr;
  // One line per problem: each variable warns at most once, plus at most
  // three contradictions.
  Check(g_warnings.size() <= set + 3, "more warnings than problems");
  for (const std::string& w : g_warnings) {
    Check(w.compare(0, 10, "rdmalloc: ") == 0 && w.size() > 10, "warning without prefix", w);
    Check(Printable(w), "warning is not one printable line", w);
  }

  // Ranges, whatever the input.
  Check(c.region_size >= kMinRegionSize && c.region_size <= kMaxRegionSize &&
            c.region_size % kMinRegionSize == 0,
        "region size out of range");
  Check((c.access & ~(kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead |
                       kAccessRemoteAtomic | kAccessRelaxedOrdering)) == 0,
        "unknown access bits");
  Check(c.decay_ms == kDecayUnset || (c.decay_ms >= -1 && c.decay_ms <= kMaxDecayMs),
        "decay out of range");
  Check(c.verbose >= 0 && c.verbose <= 3, "verbose out of range");
  Check(strnlen(c.device, sizeof c.device) < sizeof c.device, "device not terminated");
  Check(strnlen(c.verbs_library, sizeof c.verbs_library) < sizeof c.verbs_library,
        "library not terminated");
  Check(strnlen(c.stats_file, sizeof c.stats_file) < sizeof c.stats_file, "file not terminated");
  Check(!(c.register_mode == RegisterMode::kEager && c.backend == BackendChoice::kVerbs),
        "eager registration with verbs");
  Check(c.device[0] == '\0' ||
            (c.backend != BackendChoice::kUring && c.backend != BackendChoice::kNone),
        "device kept with a backend without devices");

  // Each variable against its reference.
  std::string v;
  auto value = [&](const char* name) {
    const char* s = Env(name);
    v = s != nullptr ? s : "";
    return s != nullptr;
  };
  uint64_t size = 0;
  bool ok = value("RDMALLOC_REGION_SIZE") && RefSize(v, &size) && size >= kMinRegionSize &&
            size <= kMaxRegionSize;
  ExpectUsedOrWarned("RDMALLOC_REGION_SIZE", ok,
                     c.region_size == ((size + kMinRegionSize - 1) & ~(kMinRegionSize - 1)),
                     c.region_size == d.region_size);
  int access = 0;
  ok = value("RDMALLOC_ACCESS") && RefAccess(v, &access);
  ExpectUsedOrWarned("RDMALLOC_ACCESS", ok, c.access == access, c.access == d.access);
  ok = value("RDMALLOC_MAX_PINNED") && (v == "unlimited" || RefSize(v, &size));
  ExpectUsedOrWarned("RDMALLOC_MAX_PINNED", ok,
                     c.max_pinned == (v == "unlimited" ? kNoPinLimit : size),
                     c.max_pinned == d.max_pinned);
  ok = value("RDMALLOC_RETAIN") && RefSize(v, &size) && size <= kMaxRetain;
  ExpectUsedOrWarned("RDMALLOC_RETAIN", ok, c.retain == ((size + kPageBytes - 1) & ~(kPageBytes - 1)),
                     c.retain == d.retain);
  long decay = 0;
  if (value("RDMALLOC_DECAY_MS") && RefDecay(v, &decay)) {
    Check(c.decay_ms == decay, "valid decay not used", v);
    Check(WarningsAbout("RDMALLOC_DECAY_MS") == 0, "valid decay warned", v);
  }
  Check(WarningsAbout("RDMALLOC_DECAY_MS") <= 1, "more than one decay warning");
  if (WarningsAbout("RDMALLOC_DECAY_MS") == 1) Check(c.decay_ms == kDecayUnset, "bad decay used");

  ok = value("RDMALLOC_BACKEND") && (v == "auto" || v == "verbs" || v == "uring" || v == "none");
  ExpectUsedOrWarned("RDMALLOC_BACKEND", ok,
                     (v == "auto") == (c.backend == BackendChoice::kAuto) &&
                         (v == "verbs") == (c.backend == BackendChoice::kVerbs) &&
                         (v == "uring") == (c.backend == BackendChoice::kUring),
                     c.backend == d.backend);
  ok = value("RDMALLOC_VERBOSE") && v.size() == 1 && v[0] >= '0' && v[0] <= '3';
  ExpectUsedOrWarned("RDMALLOC_VERBOSE", ok, ok && c.verbose == v[0] - '0', c.verbose == 0);
  ok = value("RDMALLOC_INTERPOSE") && (v == "0" || v == "1");
  ExpectUsedOrWarned("RDMALLOC_INTERPOSE", ok, ok && c.interpose == v[0] - '0', c.interpose == 1);

  ok = value("RDMALLOC_HUGEPAGES") && (v == "0" || v == "1");
  ExpectUsedOrWarned("RDMALLOC_HUGEPAGES", ok, ok && c.huge_pages == v[0] - '0', c.huge_pages == 1);
  int notify = 0;
  ok = value("RDMALLOC_NOTIFY") && !v.empty();
  for (size_t at = 0; ok;) {  // a comma list of ucx, libfabric; no empty items
    size_t comma = v.find(',', at);
    std::string item = v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    ok = item == "ucx" || item == "libfabric";
    notify |= item == "ucx" ? kNotifyUcx : item == "libfabric" ? kNotifyLibfabric : 0;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  ExpectUsedOrWarned("RDMALLOC_NOTIFY", ok, c.notify == notify, c.notify == 0);
  ok = value("RDMALLOC_VERBS_LIBRARY") && !v.empty() && v.size() < sizeof c.verbs_library;
  ExpectUsedOrWarned("RDMALLOC_VERBS_LIBRARY", ok, v == c.verbs_library, c.verbs_library[0] == 0);
  // RDMALLOC_REGISTER and RDMALLOC_DEVICE can also meet a contradiction:
  // still one warning each, and the value is used unless it contradicts.
  ok = value("RDMALLOC_REGISTER") && (v == "lazy" || v == "eager");
  bool contradiction = v == "eager" && c.backend == BackendChoice::kVerbs;
  ExpectUsedOrWarned("RDMALLOC_REGISTER", ok && !contradiction,
                     (c.register_mode == RegisterMode::kEager) == (v == "eager"),
                     c.register_mode == d.register_mode);
  ok = value("RDMALLOC_DEVICE") && !v.empty() && v.size() < sizeof c.device;
  contradiction = c.backend == BackendChoice::kUring || c.backend == BackendChoice::kNone;
  ExpectUsedOrWarned("RDMALLOC_DEVICE", ok && !contradiction, v == c.device, c.device[0] == 0);
  // RDMALLOC_STATS_FILE alone turns the text report on.
  ok = value("RDMALLOC_STATS_FILE") && !v.empty() && v.size() < sizeof c.stats_file;
  ExpectUsedOrWarned("RDMALLOC_STATS_FILE", ok, v == c.stats_file, c.stats_file[0] == 0);
  bool file = c.stats_file[0] != '\0';
  ok = value("RDMALLOC_STATS") && (v == "0" || v == "1" || v == "json");
  if (ok) {
    Check((c.stats == StatsMode::kOff) == (v == "0") && (c.stats == StatsMode::kJson) == (v == "json"),
          "valid stats mode not used", v);
  } else {
    Check(c.stats == (file ? StatsMode::kText : StatsMode::kOff), "stats mode", v);
  }
  Check(WarningsAbout("RDMALLOC_STATS") <= 1, "more than one stats warning");
}

void CheckUnknownVariables(const std::vector<std::string>& entries) {
  std::vector<const char*> envp;
  int expected = 0;
  for (const std::string& e : entries) {
    envp.push_back(e.c_str());
    // One entry alone: a warning exactly when it is an RDMALLOC_* name we do
    // not know, one printable line that shows the name.
    const char* one[] = {e.c_str(), nullptr};
    g_warnings.clear();
    WarnUnknownVariables(one, Collect);
    std::string name = e.substr(0, e.find('='));
    bool known = false;
    for (const char* k : kKnown) known |= name == k;
    bool ours = name.compare(0, 9, "RDMALLOC_") == 0;
    Check(g_warnings.size() == (ours && !known ? 1u : 0u), "unknown-variable warnings", e);
    if (!g_warnings.empty()) {
      const std::string& w = g_warnings[0];
      Check(Printable(w), "unknown-variable warning is not one printable line", w);
      if (Printable(name) && name.size() < 100)
        Check(w.find(name) != std::string::npos, "warning does not name the variable", w);
      expected++;
    }
  }
  envp.push_back(nullptr);
  g_warnings.clear();
  WarnUnknownVariables(envp.data(), Collect);
  Check(static_cast<int>(g_warnings.size()) == expected, "unknown-variable warnings in a list");
}

}  // namespace
}  // namespace rdmalloc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmalloc;
  g_env.clear();
  std::vector<std::string> entries;
  std::string input(reinterpret_cast<const char*>(data), size);
  size_t start = 0;
  while (start < input.size() && entries.size() < 32) {
    size_t end = input.find('\n', start);
    if (end == std::string::npos) end = input.size();
    std::string line = input.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    // Values are C strings: they end at the first NUL, as in a real environment.
    if (static_cast<unsigned char>(line[0]) < 0x20) {
      std::string name = kKnown[static_cast<unsigned char>(line[0]) % kKnownCount];
      std::string value = line.substr(1).c_str();
      g_env.emplace_back(name, value);
      entries.push_back(name + "=" + value);
    } else {
      line = line.c_str();
      entries.push_back(line);
      size_t eq = line.find('=');
      if (eq != std::string::npos) g_env.emplace_back(line.substr(0, eq), line.substr(eq + 1));
    }
  }
  // The parsers alone, on every value.
  for (const auto& [name, value] : g_env) {
    size_t got = 0;
    uint64_t want = 0;
    bool ok = ParseSize(value.c_str(), &got);
    Check(ok == RefSize(value, &want) && (!ok || got == want), "ParseSize disagrees", value);
    int bits = 0, ref_bits = 0;
    ok = ParseAccess(value.c_str(), &bits);
    Check(ok == RefAccess(value, &ref_bits) && (!ok || bits == ref_bits), "ParseAccess disagrees",
          value);
  }
  CheckConfig();
  CheckUnknownVariables(entries);
  return 0;
}
