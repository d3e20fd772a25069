/* Subnormal floats flushed to zero, in the calling thread and every thread it starts later (a new thread, and a forked
 * worker, inherit the control register). A multiply-add that reads or makes a subnormal takes a microcode assist of
 * about a hundred cycles on x86: a d6 run at a learning rate too high for it (AdamW 4e-3, 2 ranks of one thread)
 * slowed from 0.6 s a step to 4 s by step 450, 88% of it in sgemm's kernel. Only values below 1.2e-38 change. */
#include "dtrain/kernels.h"

#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

bool dt_kernels_flush_denormals(void) {
    const char *e = getenv("DTRAIN_DENORMALS");
    if (e && strcmp(e, "keep") == 0) return false;
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(_mm_getcsr() | 0x8040); /* FTZ (bit 15): results; DAZ (bit 6): inputs */
    return true;
#elif defined(__aarch64__)
    unsigned long fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr | (1ul << 24))); /* FZ */
    return true;
#else
    return false;
#endif
}
