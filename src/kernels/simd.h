/* Which vector path inference's fixed-order kernels take (rowdot.c, attend.c,
 * and panels.c's choice of layout): every path computes the same bits, so
 * this is speed only. Internal to src/kernels. */
#ifndef DT_KERNELS_SIMD_H
#define DT_KERNELS_SIMD_H

#include <stdbool.h>

enum { DT_SIMD_PORTABLE = 0, DT_SIMD_AVX2 = 1, DT_SIMD_AVX512 = 2 };

/* The widest path this CPU has, or a narrower one by $DTRAIN_ROWDOT
 * (portable|avx2|avx512|avx512bf16; the tests run each and expect the same
 * bits); decided on the first call. */
int dt_kernels_simd(void);

/* Whether int8 Linears multiply with AVX512-BF16's vdpbf16ps (their activations
 * are bf16, their int8 weights exact in bf16): the AVX-512 path on a CPU with
 * avx512_bf16, unless DTRAIN_ROWDOT=avx512 (AVX-512 without it) or
 * DTRAIN_BF16_GEMM=0 (no bf16 instructions, as on a Zen 3). The other paths
 * compute the same bits with two fused multiply-adds a lane. */
bool dt_kernels_dpbf16(void);

/* Whether one int8 row widens its weights by table (AVX512-VBMI's vpermi2b) beside
 * those products: a CPU with both, unless DTRAIN_ROWDOT=avx512bf16 (the bf16
 * products without the table, as on a Cooper Lake). */
bool dt_kernels_vbmi(void);

/* Whether a decoding pass that streams one packed panel alone (one f32 row; one or two int8 rows) leaves the stream to
 * the hardware's prefetchers: on AMD's CPUs, whose prefetchers kept pace with it (a Zen 4, 124M, int8 one row: 139-140
 * tokens/s with the pass's own prefetches, 150-151 without; a Zen 5, f32, 71.0 and 73.5), not elsewhere (an Intel
 * Xeon guest, SmolLM-135M, batch 1, builds alternating three times: int8 61-66 without, 72-112 with on one thread,
 * 111-123 and 152-209 on two; f32 on two threads 47.7-48.4 and 50.0-50.6, on one the same within noise). */
bool dt_kernels_hw_stream(void);

#endif
