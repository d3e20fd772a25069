/* The layout of packed Linear weights, shared by their packing (panels.c)
 * and the kernels that read them (rowdot.c). Outputs go in panels of
 * DT_PANEL (the last one narrower); a panel of width pw over K inputs holds,
 * first, chunks of eight inputs [K / 8][pw][8] (each output's eight values
 * of a chunk side by side with the panel's other outputs'), then the tails
 * [pw][K % 8]. A decoding step reads a panel as one sequential stream;
 * rows in place ([O][K]) are pw short streams at once. Panel p starts at
 * p * DT_PANEL * K elements in either layout. Weights are packed where the
 * AVX-512 kernels run (simd.h); the AVX2 and portable tiles read
 * rows in place faster (an AVX2 decoding step on packed panels measured
 * 8-43% slower), so there a dt_panels holds its rows as they came. */
#ifndef DT_KERNELS_PANELS_H
#define DT_KERNELS_PANELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DT_PANEL 24 /* a multiple of every tile's width (2, 3, 6, 8, 12, 24) */

struct dt_panels {
    int O, K;
    float *f;     /* f32 weights, packed (NULL for int8) */
    int8_t *q;    /* int8 weights, packed, output o worth scale[o] * q */
    float *scale;
    bool packed;  /* the layout above, or rows in place */
    bool borrowed; /* f is the caller's memory, packed where it was (dt_panels_pack_in_place) */
};


#endif
