#include "test/fault_injection.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "allocator/testing.h"
#include "verbs/registrar.h"

namespace rdmalloc_test {
namespace {

using rdmalloc::Domain;
using rdmalloc::Registrar;
using rdmalloc::Registration;

enum class Mode { kNone, kNext, kEveryKth, kAll };

// The schedule. Register may run inside jemalloc's hooks (eager mode), so
// deciding takes a spin lock and never allocates.
struct Schedule {
  std::atomic_flag lock = ATOMIC_FLAG_INIT;
  Mode mode = Mode::kNone;
  int err = 0;
  uint64_t param = 0;  // kNext: calls left to fail; kEveryKth: k
  uint64_t seen = 0;   // calls since the schedule was set

  void Lock() {
    while (lock.test_and_set(std::memory_order_acquire)) {
    }
  }
  void Unlock() { lock.clear(std::memory_order_release); }

  void Set(Mode m, uint64_t p, int e) {
    Lock();
    mode = m;
    param = p;
    err = e;
    seen = 0;
    Unlock();
  }

  // 0: let the call through; else the errno to fail it with.
  int Decide() {
    Lock();
    seen++;
    int result = 0;
    switch (mode) {
      case Mode::kNone: break;
      case Mode::kNext:
        if (param > 0) {
          param--;
          result = err;
        }
        break;
      case Mode::kEveryKth: result = seen % param == 0 ? err : 0; break;
      case Mode::kAll: result = err; break;
    }
    Unlock();
    return result;
  }
};

Schedule g_schedule;
std::atomic<uint64_t> g_calls{0}, g_failed{0}, g_deregisters{0};
std::atomic<long> g_last_deregister_thread{0};
std::atomic<bool> g_active{false};

std::atomic<int> g_open_delay_ms{0};

enum Gate : int { kOpen, kArmed, kHolding };
std::atomic<int> g_gate{kOpen};

// Stops the calling registration while the gate holds it.
void PassGate() {
  int armed = kArmed;
  if (!g_gate.compare_exchange_strong(armed, kHolding)) return;
  while (g_gate.load() == kHolding) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

class FaultyDomain final : public Domain {
 public:
  explicit FaultyDomain(Domain* real) : real_(real) {}
  ~FaultyDomain() override { delete real_; }

  int Register(void* base, size_t len, Registration* out) override {
    g_calls.fetch_add(1, std::memory_order_relaxed);
    if (int err = g_schedule.Decide()) {
      g_failed.fetch_add(1, std::memory_order_relaxed);
      return err;
    }
    PassGate();
    return real_->Register(base, len, out);
  }
  int Deregister(void* base, size_t len, const Registration& reg) override {
    g_last_deregister_thread.store(syscall(SYS_gettid));
    g_deregisters.fetch_add(1);
    return real_->Deregister(base, len, reg);
  }
  int DmaWrite(const Registration& reg, const void* region_base, void* addr, const void* src,
               size_t n) override {
    return real_->DmaWrite(reg, region_base, addr, src, n);
  }
  int DmaRead(const Registration& reg, const void* region_base, const void* addr, void* dst,
              size_t n) override {
    return real_->DmaRead(reg, region_base, addr, dst, n);
  }
  void ForgetAfterFork() override { real_->ForgetAfterFork(); }
  void* handle() const override { return real_->handle(); }

 private:
  Domain* real_;
};

class FaultyRegistrar final : public Registrar {
 public:
  explicit FaultyRegistrar(Registrar* real) : real_(real) {}
  ~FaultyRegistrar() override { delete real_; }

  const char* name() const override { return real_->name(); }
  const char* device_name() const override { return real_->device_name(); }
  bool hook_safe() const override { return real_->hook_safe(); }
  Domain* OpenDomain(ibv_pd* pd, int access, int* err) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(g_open_delay_ms.load()));
    Domain* d = real_->OpenDomain(pd, access, err);
    if (d == nullptr) return nullptr;
    g_active.store(true);
    return new FaultyDomain(d);
  }

 private:
  Registrar* real_;
};

Registrar* Wrap(Registrar* made) { return new FaultyRegistrar(made); }

}  // namespace

void InstallFaultInjection() { rdmalloc::testing::SetRegistrarWrapper(Wrap); }
bool FaultInjectionActive() { return g_active.load(); }

void FailNextRegistrations(uint64_t count, int err) { g_schedule.Set(Mode::kNext, count, err); }
void FailEveryKthRegistration(uint64_t k, int err) {
  g_schedule.Set(k == 0 ? Mode::kNone : Mode::kEveryKth, k, err);
}
void FailAllRegistrations(int err) { g_schedule.Set(Mode::kAll, 0, err); }
void ClearFaults() { g_schedule.Set(Mode::kNone, 0, 0); }

uint64_t RegisterCallsSeen() { return g_calls.load(); }
uint64_t RegistrationsFailed() { return g_failed.load(); }

void HoldNextRegistration() { g_gate.store(kArmed); }
void WaitUntilRegistrationHeld() {
  while (g_gate.load() != kHolding) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
void OpenHeldRegistration() { g_gate.store(kOpen); }

void DelayDomainOpens(int ms) { g_open_delay_ms.store(ms); }

uint64_t DeregisterCallsSeen() { return g_deregisters.load(); }
long LastDeregisterThread() { return g_last_deregister_thread.load(); }

}  // namespace rdmalloc_test
