/* CRC-32C (Castagnoli), the checksum TensorBoard's records carry: the CPU's
 * crc32 instruction (SSE4.2) where it has one, else bit by bit (the same
 * value, for other CPUs). */
#include "dtrain/base.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c, const unsigned char *p, size_t n) {
    uint64_t c64 = c;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
    }
    c = (uint32_t)c64;
    for (; n; p++, n--) c = _mm_crc32_u8(c, *p);
    return c;
}
#endif

/* Bit by bit with the reflected polynomial 0x82f63b78: the portable path (records are small and few). */
static uint32_t crc_bits(uint32_t c, const unsigned char *p, size_t n) {
    for (; n; p++, n--) {
        c ^= *p;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    }
    return c;
}

/* 1: the instruction, 0: the portable path (DTRAIN_CRC32C=portable, for its test), -1: not decided yet */
static _Atomic int use_instruction = -1;

uint32_t dt_crc32c(uint32_t crc, const void *data, size_t n) {
    uint32_t c = ~crc;
#if defined(__x86_64__)
    int hw = atomic_load(&use_instruction);
    if (hw < 0) {
        const char *e = getenv("DTRAIN_CRC32C");
        hw = !(e && !strcmp(e, "portable")) && __builtin_cpu_supports("sse4.2");
        atomic_store(&use_instruction, hw);
    }
    if (hw) return ~crc_sse42(c, data, n);
#endif
    return ~crc_bits(c, data, n);
}
