/* The layout of packed Linear weights, shared by their packing (panels.c)
 * and the kernels that read them (rowdot.c). Outputs go in panels of
 * DT_PANEL (the last one narrower); a panel of width pw over K inputs holds,
 * first, chunks of c inputs [K / c][pw][c] (each output's c values of a
 * chunk side by side with the panel's other outputs'; c = dt_panel_chunk:
 * 8 in f32, 16 in int8), then the tails [pw][K % c]. A decoding step reads a panel as one sequential stream;
 * rows in place ([O][K]) are pw short streams at once. Panel p starts at
 * p * DT_PANEL * K elements in either layout. Weights are packed where the
 * AVX-512 kernels run (simd.h; int8 where they multiply bf16,
 * dt_kernels_dpbf16); the AVX2 and portable tiles read
 * rows in place faster (an AVX2 decoding step on packed panels measured
 * 8-43% slower), so there a dt_panels holds its rows as they came. */
#ifndef DT_KERNELS_PANELS_H
#define DT_KERNELS_PANELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DT_PANEL 24 /* a multiple of every tile's width (2, 3, 6, 8, 12, 24) */

/* Inputs a chunk holds: 8 f32 (an AVX2 register), 16 int8 (the 32 products of a vdpbf16ps are two outputs' 16) */
static inline int dt_panel_chunk(bool int8) { return int8 ? 16 : 8; }

struct dt_panels {
    int O, K;
    float *f;     /* f32 weights, packed (NULL for int8) */
    int8_t *q;    /* int8 weights, packed, output o worth scale[o] * q */
    float *scale;
    bool packed;  /* the layout above, or rows in place */
    bool borrowed; /* f is the caller's memory, packed where it was (dt_panels_pack_in_place) */
};


#endif
