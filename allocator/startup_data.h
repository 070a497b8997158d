// Where the small globals go that every program's start touches.
#ifndef RDMALLOC_ALLOCATOR_STARTUP_DATA_H_
#define RDMALLOC_ALLOCATOR_STARTUP_DATA_H_

// Zero-initialised all the same, but in .data rather than .bss: the dynamic
// loader has already written .data's page (its relocations), while a .bss
// page costs a page fault at its first touch, 12-16 us on this machine. A
// few bytes of state next to a 4 KiB table took two pages of their own.
#define RDMALLOC_STARTUP_DATA __attribute__((section(".data.rdmalloc_startup")))

#endif  // RDMALLOC_ALLOCATOR_STARTUP_DATA_H_
