/* heap_guard.c - malloc and friends that abort() while armed (see heap_guard.h). Linked into
 * embedded_noheap_test only; the executable's definitions interpose on glibc's for every
 * library in the process, libc's own internal calls included. */
#include "heap_guard.h"

#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void* __libc_malloc(size_t size);
extern void __libc_free(void* p);
extern void* __libc_calloc(size_t n, size_t size);
extern void* __libc_realloc(void* p, size_t size);
extern void* __libc_memalign(size_t alignment, size_t size);

const int heap_guard_enforced = 1;
static volatile sig_atomic_t armed;
static unsigned long armed_count;

void heap_guard_arm(void) {
  ++armed_count;
  armed = 1;
}
void heap_guard_disarm(void) { armed = 0; }
unsigned long heap_guard_armed_count(void) { return armed_count; }

static void die(const char* what) {
  static const char prefix[] = "heap_guard: ";
  static const char suffix[] = " called while a client call runs: the client must not use the heap\n";
  /* write(2) only: stdio could allocate. */
  (void)!write(2, prefix, sizeof prefix - 1);
  (void)!write(2, what, strlen(what));
  (void)!write(2, suffix, sizeof suffix - 1);
  abort();
}

void* malloc(size_t size) {
  if (armed) die("malloc");
  return __libc_malloc(size);
}
void free(void* p) {
  if (armed) die("free");
  __libc_free(p);
}
void* calloc(size_t n, size_t size) {
  if (armed) die("calloc");
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t size) {
  if (armed) die("realloc");
  return __libc_realloc(p, size);
}
void* memalign(size_t alignment, size_t size) {
  if (armed) die("memalign");
  return __libc_memalign(alignment, size);
}
void* aligned_alloc(size_t alignment, size_t size) {
  if (armed) die("aligned_alloc");
  return __libc_memalign(alignment, size);
}
int posix_memalign(void** out, size_t alignment, size_t size) {
  void* p;
  if (armed) die("posix_memalign");
  p = __libc_memalign(alignment, size);
  if (p == NULL) return 12; /* ENOMEM */
  *out = p;
  return 0;
}
