#include "allocator/config.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "allocator/options.h"

namespace rdmalloc {
namespace {

// EnvFn and the warn callback are plain function pointers: state is static.
std::map<std::string, std::string> g_env;
std::set<std::string> g_asked;
std::vector<std::string> g_warnings;

const char* FakeEnv(const char* name) {
  g_asked.insert(name);
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

void CaptureWarn(const char* line) { g_warnings.emplace_back(line); }

constexpr size_t kM = size_t{1} << 20;
constexpr size_t kG = size_t{1} << 30;

// Every field compared, so a setting that leaks into another field is caught.
void ExpectSameConfig(const Config& a, const Config& b) {
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_STREQ(a.device, b.device);
  EXPECT_STREQ(a.verbs_library, b.verbs_library);
  EXPECT_EQ(a.region_size, b.region_size);
  EXPECT_EQ(a.register_mode, b.register_mode);
  EXPECT_EQ(a.access, b.access);
  EXPECT_EQ(a.max_pinned, b.max_pinned);
  EXPECT_EQ(a.decay_ms, b.decay_ms);
  EXPECT_EQ(a.retain, b.retain);
  EXPECT_EQ(a.huge_pages, b.huge_pages);
  EXPECT_EQ(a.stats, b.stats);
  EXPECT_STREQ(a.stats_file, b.stats_file);
  EXPECT_EQ(a.verbose, b.verbose);
  EXPECT_EQ(a.notify, b.notify);
  EXPECT_EQ(a.interpose, b.interpose);
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_env.clear();
    g_asked.clear();
    g_warnings.clear();
  }
  Config Parse() { return ParseConfig(&FakeEnv, &CaptureWarn); }
};

TEST_F(ConfigTest, EmptyEnvironmentGivesDefaultsSilently) {
  Config c = Parse();
  ExpectSameConfig(c, Config{});
  EXPECT_EQ(c.backend, BackendChoice::kAuto);
  EXPECT_EQ(c.device[0], '\0');
  EXPECT_EQ(c.region_size, 64 * kM);
  EXPECT_EQ(c.register_mode, RegisterMode::kLazy);
  EXPECT_EQ(c.stats, StatsMode::kOff);
  EXPECT_EQ(c.stats_file[0], '\0');
  EXPECT_EQ(c.verbose, 0);
  EXPECT_TRUE(g_warnings.empty());
}

TEST_F(ConfigTest, AsksForExactlyTheDocumentedVariables) {
  Parse();
  std::set<std::string> want = {"RDMALLOC_BACKEND",  "RDMALLOC_DEVICE",     "RDMALLOC_REGION_SIZE",
                                "RDMALLOC_REGISTER", "RDMALLOC_STATS",      "RDMALLOC_STATS_FILE",
                                "RDMALLOC_VERBOSE",  "RDMALLOC_VERBS_LIBRARY", "RDMALLOC_ACCESS", "RDMALLOC_NOTIFY",
                                "RDMALLOC_MAX_PINNED", "RDMALLOC_DECAY_MS", "RDMALLOC_RETAIN",
                                "RDMALLOC_INTERPOSE", "RDMALLOC_HUGEPAGES"};
  EXPECT_EQ(g_asked, want);
}

// A good value: the expected Config is the default with one field changed.
struct GoodCase {
  const char* var;
  std::string value;
  void (*apply)(Config* c, const std::string& value);
};

std::vector<GoodCase> GoodCases() {
  std::vector<GoodCase> v;
  auto add = [&](const char* var, std::string value, void (*apply)(Config*, const std::string&)) {
    v.push_back({var, std::move(value), apply});
  };
  add("RDMALLOC_BACKEND", "auto", [](Config* c, const std::string&) { c->backend = BackendChoice::kAuto; });
  add("RDMALLOC_BACKEND", "verbs", [](Config* c, const std::string&) { c->backend = BackendChoice::kVerbs; });
  add("RDMALLOC_BACKEND", "uring", [](Config* c, const std::string&) { c->backend = BackendChoice::kUring; });
  add("RDMALLOC_BACKEND", "none", [](Config* c, const std::string&) { c->backend = BackendChoice::kNone; });
  auto device = [](Config* c, const std::string& s) { strcpy(c->device, s.c_str()); };
  add("RDMALLOC_DEVICE", "mlx5_0", device);
  add("RDMALLOC_DEVICE", "x", device);
  add("RDMALLOC_DEVICE", std::string(63, 'd'), device);  // longest that fits
  add("RDMALLOC_REGION_SIZE", "2M", [](Config* c, const std::string&) { c->region_size = 2 * kM; });
  add("RDMALLOC_REGION_SIZE", "128M", [](Config* c, const std::string&) { c->region_size = 128 * kM; });
  add("RDMALLOC_REGION_SIZE", "1g", [](Config* c, const std::string&) { c->region_size = kG; });
  add("RDMALLOC_REGION_SIZE", "64G", [](Config* c, const std::string&) { c->region_size = 64 * kG; });
  add("RDMALLOC_REGION_SIZE", "2048KB", [](Config* c, const std::string&) { c->region_size = 2 * kM; });
  add("RDMALLOC_REGION_SIZE", "33554432", [](Config* c, const std::string&) { c->region_size = 32 * kM; });
  // Not a multiple of 2 MiB: rounded up to whole chunks.
  add("RDMALLOC_REGION_SIZE", "3M", [](Config* c, const std::string&) { c->region_size = 4 * kM; });
  add("RDMALLOC_REGION_SIZE", "2097153", [](Config* c, const std::string&) { c->region_size = 4 * kM; });
  add("RDMALLOC_REGISTER", "lazy", [](Config* c, const std::string&) { c->register_mode = RegisterMode::kLazy; });
  add("RDMALLOC_REGISTER", "eager", [](Config* c, const std::string&) { c->register_mode = RegisterMode::kEager; });
  add("RDMALLOC_STATS", "0", [](Config* c, const std::string&) { c->stats = StatsMode::kOff; });
  add("RDMALLOC_STATS", "1", [](Config* c, const std::string&) { c->stats = StatsMode::kText; });
  add("RDMALLOC_STATS", "json", [](Config* c, const std::string&) { c->stats = StatsMode::kJson; });
  // Asking for a report file asks for a report.
  auto stats_file = [](Config* c, const std::string& s) {
    strcpy(c->stats_file, s.c_str());
    c->stats = StatsMode::kText;
  };
  add("RDMALLOC_STATS_FILE", "/tmp/rdmalloc.stats", stats_file);
  add("RDMALLOC_STATS_FILE", "-", stats_file);
  add("RDMALLOC_STATS_FILE", "/" + std::string(254, 'f'), stats_file);  // 255: longest that fits
  auto verbs_library = [](Config* c, const std::string& s) { strcpy(c->verbs_library, s.c_str()); };
  add("RDMALLOC_VERBS_LIBRARY", "/opt/rdma-core/lib/libibverbs.so.1", verbs_library);
  add("RDMALLOC_VERBS_LIBRARY", "/" + std::string(254, 'v'), verbs_library);  // 255: longest that fits
  add("RDMALLOC_ACCESS", "local_write", [](Config* c, const std::string&) { c->access = kAccessLocalWrite; });
  add("RDMALLOC_ACCESS", "remote_read,local_write", [](Config* c, const std::string&) {
    c->access = kAccessRemoteRead | kAccessLocalWrite;
  });
  add("RDMALLOC_ACCESS", "local_write,remote_read,remote_write,remote_atomic,relaxed_ordering",
      [](Config* c, const std::string&) {
        c->access = kAccessLocalWrite | kAccessRemoteRead | kAccessRemoteWrite |
                    kAccessRemoteAtomic | kAccessRelaxedOrdering;
      });
  add("RDMALLOC_MAX_PINNED", "unlimited", [](Config* c, const std::string&) { c->max_pinned = kNoPinLimit; });
  add("RDMALLOC_MAX_PINNED", "0", [](Config* c, const std::string&) { c->max_pinned = 0; });
  add("RDMALLOC_MAX_PINNED", "512M", [](Config* c, const std::string&) { c->max_pinned = 512 * kM; });
  add("RDMALLOC_MAX_PINNED", "2G", [](Config* c, const std::string&) { c->max_pinned = 2 * kG; });
  add("RDMALLOC_RETAIN", "0", [](Config* c, const std::string&) { c->retain = 0; });
  add("RDMALLOC_RETAIN", "256M", [](Config* c, const std::string&) { c->retain = 256 * kM; });
  add("RDMALLOC_RETAIN", "1024G", [](Config* c, const std::string&) { c->retain = 1024 * kG; });
  add("RDMALLOC_RETAIN", "5000", [](Config* c, const std::string&) { c->retain = 8192; });
  add("RDMALLOC_DECAY_MS", "-1", [](Config* c, const std::string&) { c->decay_ms = -1; });
  add("RDMALLOC_DECAY_MS", "0", [](Config* c, const std::string&) { c->decay_ms = 0; });
  add("RDMALLOC_DECAY_MS", "250", [](Config* c, const std::string&) { c->decay_ms = 250; });
  add("RDMALLOC_DECAY_MS", "86400000", [](Config* c, const std::string&) { c->decay_ms = 86400000; });
  add("RDMALLOC_VERBOSE", "0", [](Config* c, const std::string&) { c->verbose = 0; });
  add("RDMALLOC_VERBOSE", "1", [](Config* c, const std::string&) { c->verbose = 1; });
  add("RDMALLOC_VERBOSE", "2", [](Config* c, const std::string&) { c->verbose = 2; });
  add("RDMALLOC_VERBOSE", "3", [](Config* c, const std::string&) { c->verbose = 3; });
  add("RDMALLOC_HUGEPAGES", "0", [](Config* c, const std::string&) { c->huge_pages = 0; });
  add("RDMALLOC_HUGEPAGES", "1", [](Config* c, const std::string&) { c->huge_pages = 1; });
  add("RDMALLOC_INTERPOSE", "0", [](Config* c, const std::string&) { c->interpose = 0; });
  add("RDMALLOC_INTERPOSE", "1", [](Config* c, const std::string&) { c->interpose = 1; });
  add("RDMALLOC_NOTIFY", "ucx", [](Config* c, const std::string&) { c->notify = kNotifyUcx; });
  add("RDMALLOC_NOTIFY", "libfabric", [](Config* c, const std::string&) { c->notify = kNotifyLibfabric; });
  add("RDMALLOC_NOTIFY", "libfabric,ucx", [](Config* c, const std::string&) {
    c->notify = kNotifyUcx | kNotifyLibfabric;
  });
  return v;
}

TEST_F(ConfigTest, GoodValuesAreParsedWithoutWarnings) {
  for (const GoodCase& gc : GoodCases()) {
    SCOPED_TRACE(std::string(gc.var) + "=\"" + gc.value + "\"");
    SetUp();
    g_env[gc.var] = gc.value;
    Config want;
    gc.apply(&want, gc.value);
    Config got = Parse();
    ExpectSameConfig(got, want);
    EXPECT_TRUE(g_warnings.empty()) << g_warnings.front();
  }
}

struct BadCase {
  const char* var;
  std::string value;
  const char* used;  // what the warning says is used instead
};

std::vector<BadCase> BadCases() {
  return {
      {"RDMALLOC_BACKEND", "", "auto"},
      {"RDMALLOC_BACKEND", "AUTO", "auto"},
      {"RDMALLOC_BACKEND", "rdma", "auto"},
      {"RDMALLOC_BACKEND", "uring ", "auto"},
      {"RDMALLOC_BACKEND", "verb", "auto"},
      {"RDMALLOC_DEVICE", "", "the first device"},
      {"RDMALLOC_DEVICE", std::string(64, 'd'), "the first device"},  // no room for the NUL
      {"RDMALLOC_REGION_SIZE", "", "64M"},
      {"RDMALLOC_REGION_SIZE", "abc", "64M"},
      {"RDMALLOC_REGION_SIZE", "-64M", "64M"},
      {"RDMALLOC_REGION_SIZE", "0", "64M"},
      {"RDMALLOC_REGION_SIZE", "1M", "64M"},          // below the minimum
      {"RDMALLOC_REGION_SIZE", "2097151", "64M"},     // one byte below the minimum
      {"RDMALLOC_REGION_SIZE", "65G", "64M"},         // above the maximum
      {"RDMALLOC_REGION_SIZE", "68719476737", "64M"}, // one byte above the maximum
      {"RDMALLOC_REGION_SIZE", "64T", "64M"},
      {"RDMALLOC_REGION_SIZE", "64 M", "64M"},
      {"RDMALLOC_REGION_SIZE", "99999999999999999999999", "64M"},  // overflows
      {"RDMALLOC_REGISTER", "", "lazy"},
      {"RDMALLOC_REGISTER", "Lazy", "lazy"},
      {"RDMALLOC_REGISTER", "now", "lazy"},
      {"RDMALLOC_STATS", "", "0"},
      {"RDMALLOC_STATS", "2", "0"},
      {"RDMALLOC_STATS", "yes", "0"},
      {"RDMALLOC_STATS", "JSON", "0"},
      {"RDMALLOC_STATS_FILE", "", "stderr"},
      {"RDMALLOC_STATS_FILE", "/" + std::string(255, 'f'), "stderr"},  // 256 characters
      {"RDMALLOC_VERBS_LIBRARY", "", "libibverbs.so.1"},
      {"RDMALLOC_VERBS_LIBRARY", "/" + std::string(255, 'v'), "libibverbs.so.1"},  // 256 characters
      {"RDMALLOC_ACCESS", "", "local_write"},
      {"RDMALLOC_ACCESS", "remote_read,", "local_write"},
      {"RDMALLOC_ACCESS", ",local_write", "local_write"},
      {"RDMALLOC_ACCESS", "local_write remote_read", "local_write"},
      {"RDMALLOC_ACCESS", "LOCAL_WRITE", "local_write"},
      {"RDMALLOC_ACCESS", "remote_execute", "local_write"},
      {"RDMALLOC_MAX_PINNED", "", "unlimited"},
      {"RDMALLOC_MAX_PINNED", "-1", "unlimited"},
      {"RDMALLOC_MAX_PINNED", "lots", "unlimited"},
      {"RDMALLOC_MAX_PINNED", "Unlimited", "unlimited"},
      {"RDMALLOC_MAX_PINNED", "99999999999999999999G", "unlimited"},
      {"RDMALLOC_RETAIN", "", "128M"},
      {"RDMALLOC_RETAIN", "-1", "128M"},
      {"RDMALLOC_RETAIN", "1025G", "128M"},
      {"RDMALLOC_RETAIN", "lots", "128M"},
      {"RDMALLOC_DECAY_MS", "", "jemalloc's dirty_decay_ms"},
      {"RDMALLOC_DECAY_MS", "-2", "jemalloc's dirty_decay_ms"},
      {"RDMALLOC_DECAY_MS", "86400001", "jemalloc's dirty_decay_ms"},
      {"RDMALLOC_DECAY_MS", "10s", "jemalloc's dirty_decay_ms"},
      {"RDMALLOC_DECAY_MS", "1e3", "jemalloc's dirty_decay_ms"},
      {"RDMALLOC_DECAY_MS", "99999999999999999999999", "jemalloc's dirty_decay_ms"},
      {"RDMALLOC_HUGEPAGES", "", "1"},
      {"RDMALLOC_HUGEPAGES", "on", "1"},
      {"RDMALLOC_HUGEPAGES", "2", "1"},
      {"RDMALLOC_INTERPOSE", "", "1"},
      {"RDMALLOC_INTERPOSE", "yes", "1"},
      {"RDMALLOC_INTERPOSE", "2", "1"},
      {"RDMALLOC_NOTIFY", "", "none"},
      {"RDMALLOC_NOTIFY", "UCX", "none"},
      {"RDMALLOC_NOTIFY", "ucx,", "none"},
      {"RDMALLOC_NOTIFY", "ucx,,libfabric", "none"},
      {"RDMALLOC_NOTIFY", "mpi", "none"},
      {"RDMALLOC_VERBOSE", "", "0"},
      {"RDMALLOC_VERBOSE", "4", "0"},
      {"RDMALLOC_VERBOSE", "-1", "0"},
      {"RDMALLOC_VERBOSE", "01", "0"},
      {"RDMALLOC_VERBOSE", "10", "0"},
      {"RDMALLOC_VERBOSE", "1 ", "0"},
      {"RDMALLOC_VERBOSE", "high", "0"},
  };
}

TEST_F(ConfigTest, BadValuesWarnOnceAndKeepTheDefault) {
  for (const BadCase& bc : BadCases()) {
    SCOPED_TRACE(std::string(bc.var) + "=\"" + bc.value + "\"");
    SetUp();
    g_env[bc.var] = bc.value;
    Config got = Parse();
    ExpectSameConfig(got, Config{});
    ASSERT_EQ(g_warnings.size(), 1u);
    const std::string& w = g_warnings[0];
    EXPECT_NE(w.find(std::string(bc.var) + "=\"" + bc.value + "\""), std::string::npos) << w;
    EXPECT_NE(w.find(std::string("using ") + bc.used), std::string::npos) << w;
    EXPECT_EQ(w.find('\n'), std::string::npos) << "warning must be one line: " << w;
  }
}

TEST_F(ConfigTest, AllGoodAtOnce) {
  g_env = {{"RDMALLOC_BACKEND", "auto"},     {"RDMALLOC_DEVICE", "rxe0"},
           {"RDMALLOC_REGION_SIZE", "128M"}, {"RDMALLOC_REGISTER", "eager"},
           {"RDMALLOC_STATS", "json"},       {"RDMALLOC_STATS_FILE", "/tmp/s.json"},
           {"RDMALLOC_VERBOSE", "2"},        {"RDMALLOC_ACCESS", "local_write"},
           {"RDMALLOC_MAX_PINNED", "1G"},    {"RDMALLOC_DECAY_MS", "100"}};
  Config c = Parse();
  EXPECT_EQ(c.access, kAccessLocalWrite);
  EXPECT_EQ(c.max_pinned, kG);
  EXPECT_EQ(c.decay_ms, 100);
  EXPECT_EQ(c.backend, BackendChoice::kAuto);
  EXPECT_STREQ(c.device, "rxe0");
  EXPECT_EQ(c.region_size, 128 * kM);
  EXPECT_EQ(c.register_mode, RegisterMode::kEager);
  EXPECT_EQ(c.stats, StatsMode::kJson);
  EXPECT_STREQ(c.stats_file, "/tmp/s.json");
  EXPECT_EQ(c.verbose, 2);
  EXPECT_TRUE(g_warnings.empty());
}

// One bad variable does not disturb the good ones; each bad one gets its own line.
TEST_F(ConfigTest, MixedGoodAndBad) {
  g_env = {{"RDMALLOC_BACKEND", "verbs"},   {"RDMALLOC_DEVICE", ""},
           {"RDMALLOC_REGION_SIZE", "1k"},  {"RDMALLOC_REGISTER", "eager"},
           {"RDMALLOC_STATS", "maybe"},     {"RDMALLOC_STATS_FILE", "/tmp/s"},
           {"RDMALLOC_VERBOSE", "9"}};
  Config c = Parse();
  EXPECT_EQ(c.backend, BackendChoice::kVerbs);
  EXPECT_STREQ(c.device, "");
  EXPECT_EQ(c.region_size, 64 * kM);
  EXPECT_EQ(c.register_mode, RegisterMode::kLazy) << "eager contradicts verbs";
  EXPECT_EQ(c.stats, StatsMode::kText) << "a bad RDMALLOC_STATS, but a report file asked for";
  EXPECT_STREQ(c.stats_file, "/tmp/s");
  EXPECT_EQ(c.verbose, 0);
  ASSERT_EQ(g_warnings.size(), 5u);
  EXPECT_NE(g_warnings[4].find("RDMALLOC_REGISTER=eager contradicts RDMALLOC_BACKEND=verbs"),
            std::string::npos) << g_warnings[4];
  EXPECT_NE(g_warnings[0].find("RDMALLOC_DEVICE=\"\""), std::string::npos) << g_warnings[0];
  EXPECT_NE(g_warnings[1].find("RDMALLOC_REGION_SIZE=\"1k\""), std::string::npos) << g_warnings[1];
  EXPECT_NE(g_warnings[2].find("RDMALLOC_STATS=\"maybe\""), std::string::npos) << g_warnings[2];
  EXPECT_NE(g_warnings[3].find("RDMALLOC_VERBOSE=\"9\""), std::string::npos) << g_warnings[3];
}

// The environment read in one pass answers as getenv does: the first entry
// of a name, names that only share a prefix (RDMALLOC_STATS, _STATS_FILE)
// kept apart, other variables and bare names ignored; the same config and the
// same warnings, in the same order, as parsing through getenv.
TEST_F(ConfigTest, OnePassOverTheEnvironmentReadsWhatGetenvWould) {
  g_env = {{"RDMALLOC_BACKEND", "verbs"},     {"RDMALLOC_DEVICE", ""},
           {"RDMALLOC_STATS_FILE", "/tmp/s"}, {"RDMALLOC_REGISTER", "eager"},
           {"RDMALLOC_STATS", "maybe"},       {"RDMALLOC_DECAY_MS", "250"},
           {"RDMALLOC_REGION_SIZE", "128M"}};
  Config want = Parse();
  std::vector<std::string> want_warnings = g_warnings;
  g_warnings.clear();
  const char* envp[] = {"PATH=/usr/bin",
                        "RDMALLOC_STATS_FILE=/tmp/s",
                        "RDMALLOC_BACKEND=verbs",
                        "RDMALLOC_DEVICE=",
                        "RDMALLOC_REGISTER=eager",
                        "RDMALLOC_STATS=maybe",
                        "RDMALLOC_STATS=json",  // a second entry: getenv reads the first
                        "RDMALLOC_DECAY_MS",    // no '=': not a value
                        "RDMALLOC_DECAY_MS=250",
                        "XRDMALLOC_VERBOSE=3",
                        "RDMALLOC_REGION_SIZEX=1G",
                        "RDMALLOC_REGION_SIZE=128M",
                        nullptr};
  Config got = ParseEnvironment(envp, &CaptureWarn);
  ExpectSameConfig(got, want);
  EXPECT_EQ(g_warnings, want_warnings);
  EXPECT_EQ(got.decay_ms, 250);
  EXPECT_EQ(got.region_size, 128 * kM);
  EXPECT_STREQ(got.stats_file, "/tmp/s");
  const char* empty[] = {nullptr};
  g_warnings.clear();
  ExpectSameConfig(ParseEnvironment(empty, &CaptureWarn), Config{});
  ExpectSameConfig(ParseEnvironment(nullptr, &CaptureWarn), Config{});
  EXPECT_TRUE(g_warnings.empty());
}

// --- ParseSize ---

struct SizeCase {
  const char* in;
  size_t want;
};

TEST(ParseSizeTest, AcceptsNumbersWithOptionalSuffix) {
  const SizeCase cases[] = {
      {"64M", 64 * kM},
      {"2g", 2 * kG},
      {"1048576", 1048576},
      {"4KB", 4096},
      {"4kb", 4096},
      {"4k", 4096},
      {"7Mb", 7 * kM},
      {"16G", 16 * kG},
      {"0", 0},
      {"0K", 0},
      {"007", 7},
      {"18446744073709551609", 18446744073709551609ull},
      {"18446744073709551615", 18446744073709551615ull},  // UINT64_MAX fits
      {"17179869183G", ((size_t{1} << 34) - 1) << 30},  // largest G value that fits
  };
  for (const SizeCase& sc : cases) {
    SCOPED_TRACE(sc.in);
    size_t out = 12345;
    ASSERT_TRUE(ParseSize(sc.in, &out));
    EXPECT_EQ(out, sc.want);
  }
}

TEST(ParseSizeTest, RejectsGarbageAndLeavesOutputAlone) {
  const char* cases[] = {
      "",   "-1", "-64M", "+64M", "abc", "M",     "KB",   " 64M", "64M ", "64 M", "64X",
      "64B" /* B only after K/M/G */,   "64MBB", "64MM", "0x10", "1.5G", "64T",  "1e6", "6 4",
  };
  for (const char* s : cases) {
    SCOPED_TRACE(std::string("\"") + s + "\"");
    size_t out = 12345;
    EXPECT_FALSE(ParseSize(s, &out));
    EXPECT_EQ(out, 12345u);
  }
  size_t out = 12345;
  EXPECT_FALSE(ParseSize(nullptr, &out));
  EXPECT_EQ(out, 12345u);
}

TEST_F(ConfigTest, ControlCharactersInAValueStayOnOneLine) {
  g_env["RDMALLOC_REGISTER"] = "eag\ner";
  Parse();
  ASSERT_EQ(g_warnings.size(), 1u);
  EXPECT_EQ(g_warnings[0].find('\n'), std::string::npos);
  EXPECT_NE(g_warnings[0].find("RDMALLOC_REGISTER=\"eag?er\""), std::string::npos);
}

// Contradictory combinations: one line each, naming both and what is used.
TEST_F(ConfigTest, ContradictionsWarnOnceAndResolve) {
  g_env = {{"RDMALLOC_BACKEND", "verbs"}, {"RDMALLOC_REGISTER", "eager"}};
  EXPECT_EQ(Parse().register_mode, RegisterMode::kLazy);
  ASSERT_EQ(g_warnings.size(), 1u);
  EXPECT_NE(g_warnings[0].find("using lazy"), std::string::npos) << g_warnings[0];

  for (const char* backend : {"uring", "none"}) {
    SetUp();
    g_env = {{"RDMALLOC_BACKEND", backend}, {"RDMALLOC_DEVICE", "mlx5_0"}};
    EXPECT_STREQ(Parse().device, "");
    ASSERT_EQ(g_warnings.size(), 1u);
    EXPECT_NE(g_warnings[0].find("RDMALLOC_DEVICE=\"mlx5_0\" contradicts RDMALLOC_BACKEND=" +
                                 std::string(backend)),
              std::string::npos)
        << g_warnings[0];
    EXPECT_NE(g_warnings[0].find("ignoring RDMALLOC_DEVICE"), std::string::npos);
  }

  SetUp();
  g_env = {{"RDMALLOC_STATS", "0"}, {"RDMALLOC_STATS_FILE", "/tmp/r"}};
  EXPECT_EQ(Parse().stats, StatsMode::kOff);
  ASSERT_EQ(g_warnings.size(), 1u);
  EXPECT_NE(g_warnings[0].find("writing no report"), std::string::npos) << g_warnings[0];
}

TEST(UnknownVariables, EachTypoGetsOneLine) {
  static std::vector<std::string> lines;
  lines.clear();
  const char* envp[] = {"PATH=/bin", "RDMALLOC_BACKEND=uring", "RDMALLOC_BAKEND=uring",
                        "RDMALLOC_STATS=1", "RDMALLOC_STAT=1", "RDMALLOC_=x", "NOT_RDMALLOC_X=1",
                        "RDMALLOC_REGION_SIZE_MB=4", nullptr};
  WarnUnknownVariables(envp, [](const char* l) { lines.emplace_back(l); });
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_NE(lines[0].find("RDMALLOC_BAKEND is not an rdmalloc variable"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("RDMALLOC_STAT is not"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("RDMALLOC_ is not"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("RDMALLOC_REGION_SIZE_MB is not"), std::string::npos) << lines[3];
  lines.clear();
  WarnUnknownVariables(nullptr, [](const char* l) { lines.emplace_back(l); });
  EXPECT_TRUE(lines.empty());
}

TEST(ParseAccessTest, NamesAndErrors) {
  int bits = -1;
  EXPECT_TRUE(ParseAccess("remote_atomic", &bits));
  EXPECT_EQ(bits, kAccessRemoteAtomic);
  EXPECT_TRUE(ParseAccess("local_write,local_write", &bits));
  EXPECT_EQ(bits, kAccessLocalWrite);
  bits = -1;
  for (const char* bad : {"", ",", "local_write,", "remote", "local_write,,remote_read"}) {
    EXPECT_FALSE(ParseAccess(bad, &bits)) << bad;
    EXPECT_EQ(bits, -1) << bad;
  }
}

TEST(ParseSizeTest, RejectsOverflow) {
  const char* cases[] = {
      "18446744073709551616",       // 2^64
      "99999999999999999999",       // 20 nines
      "123456789012345678901234",   // far past 64 bits
      "17179869184G",               // 2^34 G = 2^64
      "17592186044416M",            // 2^44 M = 2^64
      "18014398509481984K",         // 2^54 K = 2^64
      "18014398509481984KB",
  };
  for (const char* s : cases) {
    SCOPED_TRACE(s);
    size_t out = 12345;
    EXPECT_FALSE(ParseSize(s, &out));
    EXPECT_EQ(out, 12345u);
  }
}


// --- The table (allocator/options.h) drives the parser and the known names.

TEST_F(ConfigTest, AsksForExactlyTheTablesVariables) {
  Parse();
  std::set<std::string> want;
  for (const Option& o : kOptions) want.insert(o.name);
  EXPECT_EQ(g_asked, want);
  EXPECT_EQ(want.size(), kOptionCount) << "a name twice in the table";
}

TEST(UnknownVariables, EveryTableNameIsKnown) {
  static std::vector<std::string> lines;
  lines.clear();
  std::vector<std::string> entries;
  for (const Option& o : kOptions) {
    entries.push_back(std::string(o.name) + "=x");
    entries.push_back(std::string(o.name) + "X=x");  // a typo of each
  }
  std::vector<const char*> envp;
  for (const std::string& e : entries) envp.push_back(e.c_str());
  envp.push_back(nullptr);
  WarnUnknownVariables(envp.data(), [](const char* l) { lines.emplace_back(l); });
  ASSERT_EQ(lines.size(), kOptionCount);
  for (size_t i = 0; i < kOptionCount; i++)
    EXPECT_EQ(lines[i], std::string("rdmalloc: ") + kOptions[i].name +
                            "X is not an rdmalloc variable (see docs/TUNING.md); ignoring it");
}

// The whole line for an empty value of every variable, as config.cc wrote
// them before the table: the table keeps every warning text.
TEST_F(ConfigTest, WarningTextsOfAnEmptyValue) {
  const std::pair<const char*, const char*> want[] = {
      {"RDMALLOC_BACKEND", "(accepted: auto|verbs|uring|none); using auto"},
      {"RDMALLOC_DEVICE", "(accepted: a device name of 1 to 63 characters); using the first device"},
      {"RDMALLOC_VERBS_LIBRARY", "(accepted: a path of 1 to 255 characters); using libibverbs.so.1"},
      {"RDMALLOC_REGION_SIZE", "(accepted: a size from 2M to 64G, suffix K/M/G); using 64M"},
      {"RDMALLOC_REGISTER", "(accepted: lazy|eager); using lazy"},
      {"RDMALLOC_ACCESS",
       "(accepted: a comma list of "
       "local_write,remote_read,remote_write,remote_atomic,relaxed_ordering); using local_write"},
      {"RDMALLOC_MAX_PINNED", "(accepted: a size with suffix K/M/G, or unlimited); using unlimited"},
      {"RDMALLOC_DECAY_MS", "(accepted: -1 (never) or 0 to 86400000); using jemalloc's dirty_decay_ms"},
      {"RDMALLOC_RETAIN", "(accepted: a size from 0 to 1024G, suffix K/M/G); using 128M"},
      {"RDMALLOC_HUGEPAGES", "(accepted: 0|1); using 1"},
      {"RDMALLOC_STATS", "(accepted: 0|1|json); using 0"},
      {"RDMALLOC_STATS_FILE", "(accepted: a path of 1 to 255 characters); using stderr"},
      {"RDMALLOC_VERBOSE", "(accepted: 0|1|2|3); using 0"},
      {"RDMALLOC_INTERPOSE", "(accepted: 0|1); using 1"},
      {"RDMALLOC_NOTIFY", "(accepted: a comma list of ucx,libfabric); using none"},
  };
  ASSERT_EQ(sizeof want / sizeof want[0], kOptionCount);
  for (const auto& [var, rest] : want) {
    SCOPED_TRACE(var);
    SetUp();
    g_env[var] = "";
    ExpectSameConfig(Parse(), Config{});
    ASSERT_EQ(g_warnings.size(), 1u);
    EXPECT_EQ(g_warnings[0], std::string("rdmalloc: ") + var + "=\"\" is not valid " + rest);
  }
}

// Each word of a choice or a list is taken, and is named in the doc's
// "accepted" column; Config{} holds each default (also a static_assert).
TEST_F(ConfigTest, TableWordsAreAcceptedAndDocumented) {
  const Config defaults;
  for (const Option& o : kOptions) {
    SCOPED_TRACE(o.name);
    if (o.field.load != nullptr) {
      EXPECT_EQ(o.field.load(&defaults), o.default_value);
    }
    for (size_t i = 0; i < o.values.word_count; i++) {
      const OptionWord& w = o.values.words[i];
      SCOPED_TRACE(w.text);
      EXPECT_NE(std::string(o.doc_accepted).find(std::string("`") + w.text + "`"), std::string::npos);
      SetUp();
      g_env[o.name] = w.text;
      Config c = Parse();
      EXPECT_TRUE(g_warnings.empty()) << g_warnings.front();
      EXPECT_EQ(o.field.load(&c), w.value);
    }
  }
}

}  // namespace
}  // namespace rdmalloc
