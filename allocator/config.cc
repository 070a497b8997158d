#include "allocator/config.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "allocator/options.h"

namespace rdmalloc {
namespace {

// Most environments hold no RDMALLOC_* variable: one byte decides for most
// entries (strncmp for each cost more than parsing the rest).
bool IsRdmallocVariable(const char* e) { return e[0] == 'R' && strncmp(e, "RDMALLOC_", 9) == 0; }

// The index in kOptions of an environment entry's name (up to its '=' or its
// end, *name_len), or kOptionCount.
size_t OptionOfEntry(const char* e, size_t* name_len) {
  const char* eq = strchr(e, '=');
  size_t len = eq != nullptr ? static_cast<size_t>(eq - e) : strlen(e);
  *name_len = len;
  for (size_t i = 0; i < kOptionCount; i++)
    if (strlen(kOptions[i].name) == len && strncmp(kOptions[i].name, e, len) == 0) return i;
  return kOptionCount;
}

// Copies a value for display: one line whatever it holds.
void Shown(const char* value, char* out, size_t cap) {
  size_t n = 0;
  for (; value[n] != '\0' && n < cap - 1; n++)
    out[n] = (value[n] >= ' ' && value[n] != 127) ? value[n] : '?';
  out[n] = '\0';
}

void Warn(WarnFn warn, const Option& o, const char* value) {
  char words[128];
  const char* accepted = o.values.accepted;
  if (accepted == nullptr) {
    JoinOptionWords(o.values, "|", words, sizeof words);
    accepted = words;
  }
  char shown[320];
  Shown(value, shown, sizeof shown);
  char line[640];
  snprintf(line, sizeof line, "rdmalloc: %s=\"%s\" is not valid (accepted: %s); using %s", o.name,
           shown, accepted, o.used);
  warn(line);
}

bool CopyString(const char* s, char* out, size_t cap) {
  size_t n = strlen(s);
  if (n == 0 || n >= cap) return false;
  memcpy(out, s, n + 1);
  return true;
}

const OptionWord* FindWord(const OptionValues& values, const char* s, size_t len) {
  for (size_t i = 0; i < values.word_count; i++) {
    const OptionWord& w = values.words[i];
    if (strlen(w.text) == len && strncmp(w.text, s, len) == 0) return &w;
  }
  return nullptr;
}

// A comma list of `values`' words, their values or'ed; no empty item.
bool ParseWordList(const OptionValues& values, const char* s, long long* out) {
  long long bits = 0;
  while (true) {
    const char* end = strchr(s, ',');
    size_t len = end != nullptr ? static_cast<size_t>(end - s) : strlen(s);
    const OptionWord* w = FindWord(values, s, len);
    if (w == nullptr) return false;
    bits |= w->value;
    if (end == nullptr) break;
    s = end + 1;
  }
  *out = bits;
  return true;
}

// One setting's value into its Config member. False, leaving it alone, if
// the value is not one the setting accepts.
bool ParseOption(const Option& o, const char* v, Config* c) {
  const OptionValues& values = o.values;
  long long value = 0;
  switch (values.kind) {
    case OptionKind::kChoice:
    case OptionKind::kSize: {
      if (const OptionWord* w = FindWord(values, v, strlen(v))) {
        value = w->value;
        break;
      }
      size_t s = 0;
      if (values.kind == OptionKind::kChoice || !ParseSize(v, &s) || s < values.size_min ||
          s > values.size_max)
        return false;
      value = static_cast<long long>((s + values.size_round - 1) & ~(values.size_round - 1));
      break;
    }
    case OptionKind::kText:
      return CopyString(v, o.field.text(c), o.field.text_cap);
    case OptionKind::kInteger: {
      char* end = nullptr;
      long n = strtol(v, &end, 10);
      if (end == v || *end != '\0' || n < values.int_min || n > values.int_max) return false;
      value = n;
      break;
    }
    case OptionKind::kWordList:
      if (!ParseWordList(values, v, &value)) return false;
      break;
  }
  o.field.store(c, value);
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

bool ParseAccess(const char* s, int* out) {
  constexpr size_t kAccess = OptionIndex("RDMALLOC_ACCESS");
  static_assert(kAccess < kOptionCount, "RDMALLOC_ACCESS is in kOptions");
  long long bits = 0;
  if (!ParseWordList(kOptions[kAccess].values, s, &bits)) return false;
  *out = static_cast<int>(bits);
  return true;
}

void FormatAccess(int bits, char* out, size_t cap) {
  size_t n = 0;
  out[0] = '\0';
  for (const OptionWord& a : kAccessWords) {
    if (!(bits & a.value)) continue;
    int m = snprintf(out + n, cap - n, "%s%s", n != 0 ? "," : "", a.text);
    if (m < 0 || static_cast<size_t>(m) >= cap - n) break;
    n += static_cast<size_t>(m);
  }
}

void JoinOptionWords(const OptionValues& values, const char* sep, char* out, size_t cap) {
  size_t n = 0;
  out[0] = '\0';
  for (size_t i = 0; i < values.word_count; i++) {
    int m = snprintf(out + n, cap - n, "%s%s", i != 0 ? sep : "", values.words[i].text);
    if (m < 0 || static_cast<size_t>(m) >= cap - n) break;
    n += static_cast<size_t>(m);
  }
}

namespace {

// values(i): kOptions[i]'s value, or nullptr if it is not set.
template <typename Values>
Config ParseValues(Values values, WarnFn warn) {
  Config c;
  bool set[kOptionCount] = {};  // a valid value was used
  for (size_t i = 0; i < kOptionCount; i++) {
    const char* v = values(i);
    if (v == nullptr) continue;
    set[i] = ParseOption(kOptions[i], v, &c);
    if (!set[i]) Warn(warn, kOptions[i], v);
  }
  constexpr size_t kStats = OptionIndex("RDMALLOC_STATS");
  static_assert(kStats < kOptionCount, "RDMALLOC_STATS is in kOptions");
  bool stats_set = set[kStats];

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

}  // namespace

Config ParseConfig(EnvFn env, WarnFn warn) {
  return ParseValues([env](size_t i) { return env(kOptions[i].name); }, warn);
}

Config ParseEnvironment(const char* const* envp, WarnFn warn) {
  const char* values[kOptionCount] = {};
  for (; envp != nullptr && *envp != nullptr; envp++) {
    const char* e = *envp;
    if (!IsRdmallocVariable(e)) continue;
    size_t len;
    size_t i = OptionOfEntry(e, &len);
    // The first entry of a name that has a value, as getenv answers.
    if (i < kOptionCount && e[len] == '=' && values[i] == nullptr) values[i] = e + len + 1;
  }
  return ParseValues([&values](size_t i) { return values[i]; }, warn);
}

void WarnUnknownVariables(const char* const* envp, WarnFn warn) {
  for (; envp != nullptr && *envp != nullptr; envp++) {
    const char* e = *envp;
    if (!IsRdmallocVariable(e)) continue;
    size_t len;
    if (OptionOfEntry(e, &len) < kOptionCount) continue;
    char name[128];
    Shown(e, name, len + 1 < sizeof name ? len + 1 : sizeof name);
    char line[256];
    snprintf(line, sizeof line,
             "rdmalloc: %s is not an rdmalloc variable (see docs/TUNING.md); ignoring it", name);
    warn(line);
  }
}

}  // namespace rdmalloc
