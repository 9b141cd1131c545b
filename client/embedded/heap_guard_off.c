/* heap_guard_off.c - the ordinary build of the live test: arming does nothing. */
#include "heap_guard.h"

const int heap_guard_enforced = 0;
static unsigned long armed_count;
void heap_guard_arm(void) { ++armed_count; }
void heap_guard_disarm(void) {}
unsigned long heap_guard_armed_count(void) { return armed_count; }
