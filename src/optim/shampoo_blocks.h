/* Inside Shampoo: how a store's tensors are cut into blocks (shampoo_blocks.c), and where each block lives. */
#ifndef DTRAIN_SHAMPOO_BLOCKS_H
#define DTRAIN_SHAMPOO_BLOCKS_H

#include "dtrain/model.h"

#include <stdbool.h>

typedef struct {
    int tensor, index, of;  /* its tensor in the table, its number among that tensor's blocks, how many */
    int ndim, dim[4];       /* its shape (order 1 to 4) */
    size_t stride[4];       /* those dimensions' strides in the store */
    size_t base, numel;     /* its first element in the store; its size */
    double cost;            /* the work of its roots and steps, for the assignment */
    int owner;              /* the rank that keeps its state and computes its direction (-1: own) */
    bool own;               /* an expert-parallel rank's own expert's: its direction made where it is, never sent */
    size_t at;              /* where its direction sits among the gathered ones (its owner's share, each rank's as
                             * large as the largest, then its place there), or among this rank's own ones */
} sh_block;

/* Every block of the tensors (count 0 and tied copies left out) into *out (malloc'd), their number in *n. */
int sh_blocks_make(const dt_tensor_info *t, int ntensors, int block, sh_block **out, int *n);
/* Owners (greedily by cost over ranks) and places: counts[r] the floats rank r's blocks hold, each rank's share of
 * the gathered directions the largest count (returned); own blocks (owner -1) placed among themselves, their floats in
 * *own. */
size_t sh_blocks_assign(sh_block *b, int n, int ranks, size_t *counts, size_t *own);
/* The block's elements between the store and x (contiguous, row-major): gather (into x) or scatter (into the store). */
void sh_block_gather(const sh_block *b, const float *store, float *x);
void sh_block_scatter(const sh_block *b, const float *x, float *store);

#endif
