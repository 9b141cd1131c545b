/* heap_guard.h - the no-heap proof for the embedded client's tests.
 *
 * heap_guard.c defines malloc, free, calloc, realloc (and the aligned allocators) for the whole
 * process: while the guard is armed any of them abort(); disarmed they forward to glibc's
 * __libc_* functions so that stdio and libsodium set-up work. heap_guard_off.c gives the same
 * functions as no-ops for the ordinary build of the same test.
 */
#ifndef CLIENT_EMBEDDED_HEAP_GUARD_H_
#define CLIENT_EMBEDDED_HEAP_GUARD_H_

/* 1 in the binary where arming forbids the heap, 0 in the ordinary one. */
extern const int heap_guard_enforced;
void heap_guard_arm(void);
void heap_guard_disarm(void);
/* How many times the guard was armed. */
unsigned long heap_guard_armed_count(void);

#endif /* CLIENT_EMBEDDED_HEAP_GUARD_H_ */
