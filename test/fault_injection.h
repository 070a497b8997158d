// Fault injection for the registration backend: a decorator Registrar whose
// domains fail Register with a chosen errno on a schedule, installed through
// rdmalloc::testing::SetRegistrarWrapper. Everything else is forwarded to the
// real backend, so registrations that are let through are real (DMA works).
#ifndef RDMALLOC_TEST_FAULT_INJECTION_H_
#define RDMALLOC_TEST_FAULT_INJECTION_H_

#include <cstdint>

namespace rdmalloc_test {

// Call before the heap starts its backend (before the first rdmalloc_* call;
// lazy registration mode). Idempotent.
void InstallFaultInjection();
// Whether the heap took the decorator (it opened a domain through it).
bool FaultInjectionActive();

// Schedules; each replaces the previous one. Register calls the schedule
// fails return `err` without reaching the real backend.
void FailNextRegistrations(uint64_t count, int err);  // the next `count` calls
void FailEveryKthRegistration(uint64_t k, int err);   // calls k, 2k, 3k, ... from now
void FailAllRegistrations(int err);                   // until ClearFaults
void ClearFaults();

// Register calls seen by the decorator, and how many of them it failed.
uint64_t RegisterCallsSeen();
uint64_t RegistrationsFailed();

// A gate: the next Register call (API context only: lazy mode) stops before
// the real backend, holding its region's lock, until OpenHeldRegistration.
void HoldNextRegistration();
void WaitUntilRegistrationHeld();
void OpenHeldRegistration();

// Every OpenDomain sleeps this long first, as a driver's slow open may.
void DelayDomainOpens(int ms);

// Deregister calls seen, and the thread (gettid) of the last one.
uint64_t DeregisterCallsSeen();
long LastDeregisterThread();

}  // namespace rdmalloc_test

#endif  // RDMALLOC_TEST_FAULT_INJECTION_H_
