/* Which vector path inference's fixed-order kernels take (rowdot.c, attend.c,
 * and panels.c's choice of layout): every path computes the same bits, so
 * this is speed only. Internal to src/kernels. */
#ifndef DT_KERNELS_SIMD_H
#define DT_KERNELS_SIMD_H

enum { DT_SIMD_PORTABLE = 0, DT_SIMD_AVX2 = 1, DT_SIMD_AVX512 = 2 };

/* The widest path this CPU has, or a narrower one by $DTRAIN_ROWDOT
 * (portable|avx2; the tests run each and expect the same bits); decided on
 * the first call. */
int dt_kernels_simd(void);

#endif
