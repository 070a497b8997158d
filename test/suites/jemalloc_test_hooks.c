/* jemalloc's test harness (test/src/test.c) sets two function pointers that
 * jemalloc's library defines and exports for its tests:
 * je_test_hooks_libc_hook and je_test_hooks_arena_new_hook. librdmalloc.so
 * exports only jemalloc's public API (allocator/exports.map), so linking the
 * harness against it fails with "undefined reference to
 * je_test_hooks_libc_hook". Linked into the rdmalloc build of each program,
 * these two make the link succeed; rdmalloc's jemalloc never calls them, so
 * the harness's "libc-reentrant" and "arena_new-reentrant" passes of each
 * test run like its "non-reentrant" one under rdmalloc (under jemalloc's own
 * library only the arena_new hook is ever called: the libc hook is wired in
 * jemalloc's JET builds for unit tests). See docs/TESTING.md. */
void (*je_test_hooks_libc_hook)(void) = 0;
void (*je_test_hooks_arena_new_hook)(void) = 0;
