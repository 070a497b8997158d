// The one table of RDMALLOC_* settings: for each, its name, what it accepts,
// its default (as the warning names it, as docs/TUNING.md shows it, and as
// Config holds it), the Config member it sets and what it means. Everything
// else is produced from it:
//  - ParseEnvironment (ParseConfig in tests) and WarnUnknownVariables
//    (config.cc) walk it while malloc initialises, so it is constexpr:
//    constant-initialised, nothing runs at load, no allocation;
//  - //tools:rdmalloc_options prints it as `rdmalloc-run --help` (the launcher
//    takes --NAME=VALUE for every setting here) and as docs/TUNING.md's table,
//    which //docs:tuning_table_test keeps equal to it
//    (`bazel run //docs:update_tuning_table` rewrites the doc).
// Adding a setting: a Config member (config.h) and one entry in kOptions.
// Checks across settings (eager with verbs, a device without devices, a
// report file with RDMALLOC_STATS=0) stay in config.cc, after the table.
#ifndef RDMALLOC_ALLOCATOR_OPTIONS_H_
#define RDMALLOC_ALLOCATOR_OPTIONS_H_

#include <cstddef>
#include <type_traits>
#include <utility>

#include "allocator/config.h"

namespace rdmalloc {

enum class OptionKind {
  kChoice,    // exactly one of `words`
  kText,      // 1 to sizeof(member) - 1 bytes: a name or a path
  kSize,      // one of `words`, or ParseSize's syntax from size_min to
              // size_max, rounded up to a multiple of size_round (a power of 2)
  kInteger,   // decimal (strtol) from int_min to int_max
  kWordList,  // a comma list of `words`, their values or'ed; no empty item
};

struct OptionWord {
  const char* text;
  long long value;
};

// What a value may be.
struct OptionValues {
  OptionKind kind;
  const OptionWord* words;
  size_t word_count;
  unsigned long long size_min, size_max, size_round;
  long long int_min, int_max;
  const char* metavar;   // rdmalloc-run --help shows --name=METAVAR; null: the words joined by |
  const char* accepted;  // a bad value's warning says "(accepted: ...)"; null: the words joined by |
};

// The Config member a setting sets. Numbers and enums go through a long long
// (sizes above LLONG_MAX and back as two's complement, which gcc and clang
// define); text members are char arrays.
struct OptionField {
  void (*store)(Config* c, long long value);
  long long (*load)(const Config* c);
  char* (*text)(Config* c);
  size_t text_cap;
};

struct Option {
  const char* name;
  OptionValues values;
  OptionField field;
  long long default_value;   // what Config{} holds in the member (text: empty)
  const char* used;          // a bad value's warning ends "; using <used>"
  const char* doc_accepted;  // docs/TUNING.md's columns, Markdown
  const char* doc_default;
  const char* meaning;
};

namespace option_internal {

template <auto M>
using Member = std::remove_reference_t<decltype(std::declval<Config&>().*M)>;

template <auto M>
constexpr void Store(Config* c, long long value) {
  c->*M = static_cast<Member<M>>(value);
}
template <auto M>
constexpr long long Load(const Config* c) {
  return static_cast<long long>(c->*M);
}
template <auto M>
constexpr char* Text(Config* c) {
  return c->*M;
}

}  // namespace option_internal

template <auto M>
constexpr OptionField FieldOf() {
  if constexpr (std::is_array_v<option_internal::Member<M>>) {
    return {nullptr, nullptr, &option_internal::Text<M>, sizeof(option_internal::Member<M>)};
  } else {
    return {&option_internal::Store<M>, &option_internal::Load<M>, nullptr, 0};
  }
}

template <size_t N>
constexpr OptionValues OneOf(const OptionWord (&words)[N]) {
  return {OptionKind::kChoice, words, N, 0, 0, 0, 0, 0, nullptr, nullptr};
}
constexpr OptionValues TextOf(const char* metavar, const char* accepted) {
  return {OptionKind::kText, nullptr, 0, 0, 0, 0, 0, 0, metavar, accepted};
}
template <size_t N>
constexpr OptionValues SizeOr(const OptionWord (&words)[N], unsigned long long min,
                              unsigned long long max, unsigned long long round,
                              const char* metavar, const char* accepted) {
  return {OptionKind::kSize, words, N, min, max, round, 0, 0, metavar, accepted};
}
constexpr OptionValues SizeOf(unsigned long long min, unsigned long long max,
                              unsigned long long round, const char* metavar,
                              const char* accepted) {
  return {OptionKind::kSize, nullptr, 0, min, max, round, 0, 0, metavar, accepted};
}
constexpr OptionValues IntegerOf(long long min, long long max, const char* metavar,
                                 const char* accepted) {
  return {OptionKind::kInteger, nullptr, 0, 0, 0, 0, min, max, metavar, accepted};
}
template <size_t N>
constexpr OptionValues ListOf(const OptionWord (&words)[N], const char* metavar,
                              const char* accepted) {
  return {OptionKind::kWordList, words, N, 0, 0, 0, 0, 0, metavar, accepted};
}

inline constexpr OptionWord kBackendWords[] = {
    {"auto", static_cast<long long>(BackendChoice::kAuto)},
    {"verbs", static_cast<long long>(BackendChoice::kVerbs)},
    {"uring", static_cast<long long>(BackendChoice::kUring)},
    {"none", static_cast<long long>(BackendChoice::kNone)},
};
inline constexpr OptionWord kRegisterWords[] = {
    {"lazy", static_cast<long long>(RegisterMode::kLazy)},
    {"eager", static_cast<long long>(RegisterMode::kEager)},
};
// In FormatAccess's order (the report's).
inline constexpr OptionWord kAccessWords[] = {
    {"local_write", kAccessLocalWrite},     {"remote_write", kAccessRemoteWrite},
    {"remote_read", kAccessRemoteRead},     {"remote_atomic", kAccessRemoteAtomic},
    {"relaxed_ordering", kAccessRelaxedOrdering},
};
inline constexpr OptionWord kUnlimitedWords[] = {
    {"unlimited", static_cast<long long>(kNoPinLimit)},
};
inline constexpr OptionWord kStatsWords[] = {
    {"0", static_cast<long long>(StatsMode::kOff)},
    {"1", static_cast<long long>(StatsMode::kText)},
    {"json", static_cast<long long>(StatsMode::kJson)},
};
inline constexpr OptionWord kVerboseWords[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}};
inline constexpr OptionWord kOnOffWords[] = {{"0", 0}, {"1", 1}};
inline constexpr OptionWord kNotifyWords[] = {
    {"ucx", kNotifyUcx},
    {"libfabric", kNotifyLibfabric},
};

// In the order ParseConfig reads them, warns about them and docs/TUNING.md
// lists them.
inline constexpr Option kOptions[] = {
    {"RDMALLOC_BACKEND", OneOf(kBackendWords), FieldOf<&Config::backend>(),
     static_cast<long long>(BackendChoice::kAuto), "auto",
     "`auto`, `verbs`, `uring`, `none`", "`auto`",
     "What pins memory. `auto`: `verbs` if `/sys/class/infiniband` lists a device, "
     "else `uring` (io_uring fixed buffers, the kernel's own pinning, used as a soft "
     "NIC), else `none`. With `none` nothing is registered and lookups return "
     "`RDMALLOC_EREGFAIL` (`ENODEV`)."},
    {"RDMALLOC_DEVICE", TextOf("NAME", "a device name of 1 to 63 characters"),
     FieldOf<&Config::device>(), 0, "the first device",
     "a device name, 1–63 characters", "the first device",
     "The device of the default protection domain (verbs). Contradicts `uring`/`none`: "
     "ignored with a warning."},
    {"RDMALLOC_VERBS_LIBRARY", TextOf("PATH", "a path of 1 to 255 characters"),
     FieldOf<&Config::verbs_library>(), 0, "libibverbs.so.1",
     "a path, 1–255 characters", "`libibverbs.so.1`",
     "The libibverbs that the verbs backend loads with `dlopen`."},
    {"RDMALLOC_REGION_SIZE",
     SizeOf(kMinRegionSize, kMaxRegionSize, kMinRegionSize, "SIZE",
            "a size from 2M to 64G, suffix K/M/G"),
     FieldOf<&Config::region_size>(), static_cast<long long>(size_t{64} << 20), "64M",
     "a size, `2M`..`64G`, suffix `K`/`M`/`G` (optional `B`), rounded up to 2 MiB", "`64M`",
     "Largest shared region, the unit of registration. Regions grow 2, 4, 8, … MiB up to "
     "this (at least twice the request that makes them); a request larger than this gets "
     "a region of its own. Larger: fewer registrations, and large blocks pack better (a "
     "loop over 1–32 MiB blocks faults 2.5× more pages with `32M`); smaller: less memory "
     "pinned in partly used registered regions."},
    {"RDMALLOC_REGISTER", OneOf(kRegisterWords), FieldOf<&Config::register_mode>(),
     static_cast<long long>(RegisterMode::kLazy), "lazy",
     "`lazy`, `eager`", "`lazy`",
     "`lazy`: a region is registered with a domain on the first lookup that needs it. "
     "`eager`: every region is registered as it is made (only on `uring`: the verbs "
     "library allocates, which jemalloc's hooks cannot do; `eager` with `verbs` warns "
     "and uses `lazy`). Eager pins all heap memory (jemalloc's metadata is never in the heap)."},
    {"RDMALLOC_ACCESS",
     ListOf(kAccessWords, "LIST",
            "a comma list of local_write,remote_read,remote_write,remote_atomic,relaxed_ordering"),
     FieldOf<&Config::access>(), kDefaultAccess, "local_write",
     "comma list of `local_write`, `remote_read`, `remote_write`, `remote_atomic`, "
     "`relaxed_ordering`",
     "`local_write`",
     "Access rights of the **plain heap** (malloc, new) under the default domain. "
     "Local only by default: memory for peers comes from `rdmalloc_alloc(size, "
     "RDMALLOC_REMOTE_*)`, whose regions get exactly those rights. Adding remote "
     "rights here widens the whole plain heap for legacy code; the report then prints "
     "a warning (any rkey exposes unrelated heap data). Domains added with "
     "`rdmalloc_add_pd` use the rights given there for the plain heap."},
    {"RDMALLOC_MAX_PINNED",
     SizeOr(kUnlimitedWords, 0, ~0ull, 1, "SIZE|unlimited",
            "a size with suffix K/M/G, or unlimited"),
     FieldOf<&Config::max_pinned>(), static_cast<long long>(kNoPinLimit), "unlimited",
     "a size (suffix `K`/`M`/`G`), or `unlimited`", "`unlimited`",
     "Cap on registered bytes, summed over domains. A registration that would pass it "
     "is refused: allocations still succeed, the lookup returns `RDMALLOC_EREGFAIL` "
     "with `ENOMEM`, `cap_hits` counts it, and a later lookup retries once there is "
     "room."},
    {"RDMALLOC_DECAY_MS", IntegerOf(-1, kMaxDecayMs, "MS", "-1 (never) or 0 to 86400000"),
     FieldOf<&Config::decay_ms>(), kDecayUnset, "jemalloc's dirty_decay_ms",
     "`-1` (never) or `0`..`86400000`", "jemalloc's `dirty_decay_ms` (10 000)",
     "How long jemalloc keeps freed extents before giving them back to rdmalloc's "
     "heap; a region is released once all of it came back. `0`: at once. Applies to "
     "every arena."},
    {"RDMALLOC_RETAIN",
     SizeOf(0, kMaxRetain, kPageBytes, "SIZE", "a size from 0 to 1024G, suffix K/M/G"),
     FieldOf<&Config::retain>(), static_cast<long long>(kDefaultRetain), "128M",
     "a size, `0`..`1024G`, suffix `K`/`M`/`G`, rounded up to 4 KiB", "`128M`",
     "Freed memory rdmalloc keeps resident for reuse once jemalloc has given it back: "
     "free pages it does not purge and empty regions it does not release, up to this "
     "many bytes over all arenas (glibc keeps up to 64 MiB above each arena's heap top). "
     "Past it, the excess is purged. A freed large block (2 MiB or more) comes back "
     "from jemalloc at once; smaller blocks wait in jemalloc's dirty cache, as in stock "
     "jemalloc, and are not kept again when it gives them back after its decay time "
     "(`RDMALLOC_DECAY_MS`): they are purged; so are "
     "kept pages no request took for 100 ms, and, before a large block faults "
     "in new pages, as many kept pages elsewhere (what is kept does not raise the peak). "
     "Of a large block whose program wrote only its head (less than a quarter of "
     "its middle MiB resident), only that head is kept and counted; the rest is purged within "
     "10 ms, and the next large block starts on a freed head. "
     "A loop of large "
     "blocks then reuses pages instead of mapping, faulting and unmapping them (1–32 MiB "
     "blocks, 2 threads: `64M` faulted 2.7× more pages and took 2.6× longer); a kept "
     "registered region is reused without registering again. `0`: give everything "
     "back at once. `arena.<i>.purge`, `arena.<i>.decay` and `malloc_trim` give it all "
     "back."},
    {"RDMALLOC_HUGEPAGES", OneOf(kOnOffWords), FieldOf<&Config::huge_pages>(), 1, "1",
     "`0`, `1`", "`1`",
     "`1`: while an arena's last freed large block (an extent of 2 MiB or more) was "
     "at least half resident, its next fresh large blocks (with at least 2 MiB of "
     "pages not yet resident) ask the kernel for transparent huge pages "
     "(`madvise(MADV_HUGEPAGE)` on their whole 2 MiB pages, undone when freed): they "
     "fault in 2 MiB at a time (a loop over 1–32 MiB blocks ran 3–9× "
     "faster) and a NIC maps them with fewer, larger pages. A program that touches "
     "little of its large blocks (`sort`'s 28 MiB buffer) keeps 4 KiB pages, a large "
     "block of pages already resident is left as it is (no system call), and "
     "everything else never gets huge ones (regions are made `MADV_NOHUGEPAGE`, so "
     "freed pages are counted exactly even under THP `always`). Needs THP `madvise` "
     "or `always` in `/sys/kernel/mm/transparent_hugepage/enabled`. The kernel never "
     "collapses or moves pinned pages. `0`: no `madvise` of either kind (the "
     "system's THP setting applies to all of the heap)."},
    {"RDMALLOC_STATS", OneOf(kStatsWords), FieldOf<&Config::stats>(),
     static_cast<long long>(StatsMode::kOff), "0",
     "`0`, `1`, `json`", "`0` (`1` if `RDMALLOC_STATS_FILE` is set)",
     "Report at exit: `1` a short text, `json` one JSON object per process."},
    {"RDMALLOC_STATS_FILE", TextOf("PATH", "a path of 1 to 255 characters"),
     FieldOf<&Config::stats_file>(), 0, "stderr",
     "a path, 1–255 characters", "stderr",
     "Where the report is appended. Setting it with `RDMALLOC_STATS=0` warns and "
     "writes nothing."},
    {"RDMALLOC_VERBOSE", OneOf(kVerboseWords), FieldOf<&Config::verbose>(), 0, "0",
     "`0`, `1`, `2`, `3`", "`0`",
     "`1`: one line at start (backend, device, registration mode), and one line at "
     "load when another malloc already serves the process (rdmalloc `dlopen`ed late or "
     "linked behind another malloc: see docs/EMBEDDING.md). `2`: also every region "
     "made or released and every (de)registration. `3`: also every extent jemalloc "
     "asks for (size, alignment, arena, access class)."},
    {"RDMALLOC_INTERPOSE", OneOf(kOnOffWords), FieldOf<&Config::interpose>(), 1, "1",
     "`0`, `1`", "`1`",
     "`1`: with the verbs backend, the program's own `ibv_reg_mr`, `ibv_reg_mr_iova`, "
     "`ibv_reg_mr_iova2` on heap memory are served from rdmalloc's registration of the "
     "region (no kernel call) when the region's rights cover the request; everything "
     "else goes to libibverbs. While any MR of the program covers heap pages, their "
     "region is never purged or released. `0`: every call goes to libibverbs (MRs on "
     "heap pages still hold their regions). See docs/INTERPOSE.md."},
    {"RDMALLOC_NOTIFY", ListOf(kNotifyWords, "LIST", "a comma list of ucx,libfabric"),
     FieldOf<&Config::notify>(), 0, "none",
     "comma list of `ucx`, `libfabric`", "none",
     "When rdmalloc loads (before `main`), tell these registration caches of released "
     "memory, as `rdmalloc_notify_ucx()` / `rdmalloc_notify_libfabric()` would: for "
     "programs that cannot call them (an unmodified MPI application with rdmalloc "
     "preloaded). Run UCX with `UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none` "
     "then. See docs/NOTIFICATIONS.md."},
};

inline constexpr size_t kOptionCount = sizeof kOptions / sizeof kOptions[0];

namespace option_internal {

constexpr bool Same(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) a++, b++;
  return *a == *b;
}

constexpr bool StartsWith(const char* s, const char* prefix) {
  while (*prefix != '\0' && *s == *prefix) s++, prefix++;
  return *prefix == '\0';
}

// The table against itself and against Config{}: names are RDMALLOC_* and
// unique, every default is what Config{} holds, every kind has what it needs.
// (No comparison of an address with null: gcc cannot evaluate one at compile
// time under -fsanitize. A null text is read instead, which fails to compile.)
constexpr bool TableIsConsistent() {
  Config defaults{};
  for (size_t i = 0; i < kOptionCount; i++) {
    const Option& o = kOptions[i];
    if (!StartsWith(o.name, "RDMALLOC_") || o.name[9] == '\0') return false;
    for (size_t j = 0; j < i; j++)
      if (Same(o.name, kOptions[j].name)) return false;
    if (o.used[0] == '\0' || o.doc_accepted[0] == '\0' || o.doc_default[0] == '\0' ||
        o.meaning[0] == '\0')
      return false;
    bool text = o.values.kind == OptionKind::kText;
    if (text != (o.field.text_cap != 0)) return false;
    if (text ? o.field.text(&defaults)[0] != '\0' : o.field.load(&defaults) != o.default_value)
      return false;
    bool needs_words = o.values.kind == OptionKind::kChoice || o.values.kind == OptionKind::kWordList;
    if (needs_words && o.values.word_count == 0) return false;
    if (o.values.kind != OptionKind::kChoice &&
        (o.values.metavar[0] == '\0' || o.values.accepted[0] == '\0'))
      return false;
    if (o.values.kind == OptionKind::kSize &&
        (o.values.size_round == 0 || (o.values.size_round & (o.values.size_round - 1)) != 0))
      return false;
  }
  return true;
}

}  // namespace option_internal

// The index of `name` in kOptions; kOptionCount if there is none.
constexpr size_t OptionIndex(const char* name) {
  for (size_t i = 0; i < kOptionCount; i++)
    if (option_internal::Same(kOptions[i].name, name)) return i;
  return kOptionCount;
}

static_assert(option_internal::TableIsConsistent(),
              "kOptions: a name, a default or a kind's parameters are wrong");

// A setting's words joined by `sep` ("auto|verbs|uring|none"), cut to `cap`.
void JoinOptionWords(const OptionValues& values, const char* sep, char* out, size_t cap);

}  // namespace rdmalloc

#endif  // RDMALLOC_ALLOCATOR_OPTIONS_H_
