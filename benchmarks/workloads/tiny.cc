// tiny: a short-lived program that mallocs 100 bytes, uses them and exits.
// Its run time and peak RSS are what an allocator costs a program up front
// (run.py's "Short-lived programs"); it prints no result line of its own.
#include <cstdlib>
#include <cstring>

int main() {
  auto* p = static_cast<volatile char*>(malloc(100));
  if (p == nullptr) return 1;
  memset(const_cast<char*>(p), 1, 100);
  int ok = p[50] == 1;
  free(const_cast<char*>(p));
  return ok ? 0 : 1;
}
