/* GPT-2 in ranges of units, as pipeline stages will run it: three models
 * holding units [0,2), [2,3) and [3,5) of a 3-block GPT-2, initialised from
 * the same seed, chained forward (activations out of one, into the next)
 * and backward (d output in, d input out), give the whole model's loss and
 * logits and every gradient bit for bit; wte, whose head part lives in the
 * last stage's copy and whose embedding rows in the first stage's, sums to
 * the whole model's within float rounding. The hooks before each unit's
 * forward and backward and after its backward come in order. */
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

static char events[256];
static size_t nev;
static void note(char kind, int unit) {
    if (nev + 3 < sizeof events) nev += (size_t)snprintf(events + nev, sizeof events - nev, "%c%d ", kind, unit);
}
static void before_fwd(int u, void *ctx) { (void)ctx; note('F', u); }
static void before_bwd(int u, void *ctx) { (void)ctx; note('B', u); }
static void after_bwd(int u, void *ctx) { (void)ctx; note('A', u); }
static void second_sub(int u, void *ctx) { (void)ctx; note('S', u); } /* a second subscriber to the gradient hook */

/* The tensor called name in model m: its parameters or gradients. */
static const float *find(dt_gpt2 *m, const char *name, int grads, size_t *count) {
    dt_model v;
    dt_gpt2_model(m, &v);
    const dt_tensor_info *t = dt_model_find(&v, name);
    if (!t) return NULL;
    *count = t->count;
    return (grads ? dt_gpt2_grads(m) : dt_gpt2_params(m)) + t->offset;
}

/* A backward split into B (input gradients) and W (weight gradients), three
 * micro-batches in flight in their slots: the gradients one backward per
 * micro-batch gives, bit for bit, in f32 and in 16 bits (W widens the
 * packed activations again and, for the head, computes the loss's 16-bit
 * gradient again); the hooks after each unit's W; and recomputing, one recomputing backward's. */
static void split_backward(const dt_gpt2_config *cfg, int B, int T, dt_dtype prec) {
    dt_gpt2 *a = NULL, *b = NULL;
    if (dt_gpt2_create(cfg, &a) || dt_gpt2_create(cfg, &b)) { EXPECT(0, "split backward: %s", dt_last_error()); return; }
    dt_gpt2_init_random(a, 7);
    dt_gpt2_init_random(b, 7);
    EXPECT(!dt_gpt2_set_precision(a, prec) && !dt_gpt2_set_precision(b, prec), "split backward's precision: %s", dt_last_error());
    EXPECT(!dt_gpt2_set_split_backward(b, 1) && !dt_gpt2_set_slots(b, 3), "split backward: %s", dt_last_error());
    size_t BT = (size_t)B * T;
    int32_t *tok = malloc(3 * 2 * BT * sizeof(int32_t));
    uint64_t r = 11;
    for (size_t i = 0; i < 6 * BT; i++) tok[i] = (int32_t)(dt_rng_next(&r) % (uint64_t)cfg->vocab_size);
    float la[3] = { 0 }, lb[3] = { 0 };
    for (int k = 0; k < 3; k++) /* one process: F and B in turn */
        if (dt_gpt2_forward(a, tok + 2 * k * BT, tok + (2 * k + 1) * BT, B, T, &la[k]) || dt_gpt2_backward(a, 1.0f))
            EXPECT(0, "split backward's reference: %s", dt_last_error());
    dt_gpt2_set_grad_hook(b, after_bwd, NULL);
    nev = 0;
    events[0] = 0;
    dt_status st = DT_OK;
    for (int k = 0; k < 3 && !st; k++) { /* F0 F1 F2, then B0 B1 B2, then W0 W1 W2: each slot waits for its W */
        dt_gpt2_use_slot(b, k);
        st = dt_gpt2_forward(b, tok + 2 * k * BT, tok + (2 * k + 1) * BT, B, T, &lb[k]);
    }
    for (int k = 0; k < 3 && !st; k++) { dt_gpt2_use_slot(b, k); st = dt_gpt2_backward(b, 1.0f); }
    EXPECT(!st && nev == 0, "B announced gradients (%s) or failed: %s", events, st ? dt_last_error() : "");
    dt_gpt2_use_slot(b, 0);
    EXPECT(dt_gpt2_forward(b, tok, tok + BT, B, T, NULL) != DT_OK && strstr(dt_last_error(), "weight gradients"),
           "a forward over activations whose W is still to run: %s", dt_last_error());
    for (int k = 0; k < 3 && !st; k++) { dt_gpt2_use_slot(b, k); st = dt_gpt2_backward_weights(b); }
    EXPECT(!st, "W: %s", st ? dt_last_error() : "");
    EXPECT(!strcmp(events, "A4 A3 A2 A1 A0 A4 A3 A2 A1 A0 A4 A3 A2 A1 A0 "), "W's hooks: %s", events);
    EXPECT(dt_gpt2_backward_weights(b) != DT_OK, "a W without its B was accepted");
    size_t n = dt_gpt2_num_params(a);
    EXPECT(n == dt_gpt2_num_params(b) && !memcmp(dt_gpt2_grads(a), dt_gpt2_grads(b), n * sizeof(float)) &&
               !memcmp(la, lb, sizeof la), "split backward's gradients or losses differ from one backward's (%s)", dt_dtype_name(prec));
    /* recomputing, W runs each block's forward again (B's recomputed values are one block's): one recomputing
     * backward's gradients, bit for bit */
    dt_gpt2_zero_grad(a), dt_gpt2_zero_grad(b);
    EXPECT(!dt_gpt2_set_recompute(a, 1) && !dt_gpt2_set_recompute(b, 1), "recomputing: %s", dt_last_error());
    for (int k = 0; k < 3; k++)
        if (dt_gpt2_forward(a, tok + 2 * k * BT, tok + (2 * k + 1) * BT, B, T, &la[k]) || dt_gpt2_backward(a, 1.0f))
            EXPECT(0, "recomputing backward's reference: %s", dt_last_error());
    for (int k = 0; k < 3 && !st; k++) { dt_gpt2_use_slot(b, k); st = dt_gpt2_forward(b, tok + 2 * k * BT, tok + (2 * k + 1) * BT, B, T, &lb[k]); }
    for (int k = 0; k < 3 && !st; k++) { dt_gpt2_use_slot(b, k); st = dt_gpt2_backward(b, 1.0f); }
    for (int k = 0; k < 3 && !st; k++) { dt_gpt2_use_slot(b, k); st = dt_gpt2_backward_weights(b); }
    EXPECT(!st && !memcmp(dt_gpt2_grads(a), dt_gpt2_grads(b), n * sizeof(float)) && !memcmp(la, lb, sizeof la),
           "a split backward recomputing: its gradients or losses differ from one recomputing backward's (%s): %s", dt_dtype_name(prec),
           st ? dt_last_error() : "");
    dt_gpt2_set_grad_hook(b, NULL, NULL);
    free(tok);
    dt_gpt2_destroy(a);
    dt_gpt2_destroy(b);
}

/* Each chunk's activations apart: the stage of chunks() again, its two micro-batches now one after the other (each
 * through both chunks and back before the next), holds one area of each chunk where all forwards first held two, so
 * it holds the two chunks' areas less than that run (both_first: its activation memory), as the planner counts them;
 * and a second step adds nothing. */
static void chunk_areas(const dt_gpt2_config *cfg, const dt_model_part *p0, dt_gpt2 *s1, const int32_t *tok, int B, int T, size_t both_first) {
    dt_gpt2 *s = NULL;
    if (dt_gpt2_create_part(cfg, p0, &s)) { EXPECT(0, "chunk areas: %s", dt_last_error()); return; }
    dt_gpt2_init_random(s, 7);
    dt_gpt2_set_slots(s, 2);
    size_t BT = (size_t)B * T, area[DT_GPT2_MAX_CHUNKS], one_each = 0;
    dt_status st = DT_OK;
    for (int step = 0; step < 2 && !st; step++) {
        for (int k = 0; k < 2 && !st; k++) {
            dt_gpt2_use_slot(s, k);
            dt_gpt2_use_slot(s1, k);
            if (!(st = dt_gpt2_forward_units(s, 0, 2, tok + 2 * k * BT, NULL, NULL, B, T, NULL)) &&
                !(st = dt_gpt2_forward_units(s1, 2, 3, NULL, dt_gpt2_output(s), NULL, B, T, NULL)) &&
                !(st = dt_gpt2_forward_units(s, 3, 5, NULL, dt_gpt2_output(s1), tok + (2 * k + 1) * BT, B, T, NULL)) &&
                !(st = dt_gpt2_backward_units(s, NULL, 1.0f)) && !(st = dt_gpt2_backward_units(s1, dt_gpt2_input_grad(s, NULL, NULL), 1.0f)) &&
                !(st = dt_gpt2_use_chunk(s, 0)))
                st = dt_gpt2_backward_units(s, dt_gpt2_input_grad(s1, NULL, NULL), 1.0f);
        }
        if (!step) one_each = dt_gpt2_activation_memory(s);
    }
    EXPECT(!st, "chunk areas: %s", st ? dt_last_error() : "");
    int a[2] = { 0, 3 }, b[2] = { 2, 5 };
    dt_gpt2_chunks_activation_split(cfg, 2, a, b, 1, 0, B, T, 0, DT_ATTN_AUTO, DT_F32, 0, area);
    EXPECT(area[0] > 0 && area[1] > 0 && one_each + area[0] + area[1] == both_first && dt_gpt2_activation_memory(s) == one_each,
           "chunk areas: micro-batches in turn hold %zu bytes of activations (%zu after a second step), both forwards first %zu, "
           "the chunks' areas %zu and %zu", one_each, dt_gpt2_activation_memory(s), both_first, area[0], area[1]);
    dt_gpt2_destroy(s);
}

/* An interleaved stage: one model holding chunks [0, 2) and [3, 5) of the
 * 5 units, another [2, 3) between them; two micro-batches in two slots, all
 * forwards then all backwards chunk by chunk, give one model's losses and
 * gradients bit for bit (the chunk that holds the head holds wte too: no
 * copy). */
static void chunks(const dt_gpt2_config *cfg, int B, int T) {
    dt_gpt2 *whole = NULL, *s0 = NULL, *s1 = NULL;
    dt_model_part p0 = dt_gpt2_whole(cfg), p1 = dt_gpt2_whole(cfg);
    p0.nchunks = 2, p0.chunk_a[0] = 0, p0.chunk_b[0] = 2, p0.chunk_a[1] = 3, p0.chunk_b[1] = 5;
    p1.ua = 2, p1.ub = 3;
    if (dt_gpt2_create(cfg, &whole) || dt_gpt2_create_part(cfg, &p0, &s0) || dt_gpt2_create_part(cfg, &p1, &s1)) {
        EXPECT(0, "chunks: %s", dt_last_error());
        return;
    }
    dt_gpt2_init_random(whole, 7);
    dt_gpt2_init_random(s0, 7);
    dt_gpt2_init_random(s1, 7);
    EXPECT(dt_gpt2_num_params(s0) + dt_gpt2_num_params(s1) == dt_gpt2_num_params(whole), "chunks hold %zu + %zu parameters, the model %zu",
           dt_gpt2_num_params(s0), dt_gpt2_num_params(s1), dt_gpt2_num_params(whole));
    dt_gpt2_set_slots(s0, 2);
    dt_gpt2_set_slots(s1, 2);
    size_t BT = (size_t)B * T;
    int32_t tok[4 * 64];
    uint64_t r = 13;
    for (size_t i = 0; i < 4 * BT; i++) tok[i] = (int32_t)(dt_rng_next(&r) % (uint64_t)cfg->vocab_size);
    float lw[2] = { 0 }, lc[2] = { 0 };
    dt_status st = DT_OK;
    for (int k = 0; k < 2 && !st; k++)
        st = dt_gpt2_forward(whole, tok + 2 * k * BT, tok + (2 * k + 1) * BT, B, T, &lw[k]) ? 1 : dt_gpt2_backward(whole, 1.0f);
    for (int k = 0; k < 2 && !st; k++) {
        const int32_t *in = tok + 2 * k * BT, *tg = tok + (2 * k + 1) * BT;
        dt_gpt2_use_slot(s0, k);
        dt_gpt2_use_slot(s1, k);
        if (!(st = dt_gpt2_forward_units(s0, 0, 2, in, NULL, NULL, B, T, NULL)) &&
            !(st = dt_gpt2_forward_units(s1, 2, 3, NULL, dt_gpt2_output(s0), NULL, B, T, NULL)))
            st = dt_gpt2_forward_units(s0, 3, 5, NULL, dt_gpt2_output(s1), tg, B, T, &lc[k]);
    }
    for (int k = 0; k < 2 && !st; k++) {
        dt_gpt2_use_slot(s0, k);
        dt_gpt2_use_slot(s1, k);
        if (!(st = dt_gpt2_use_chunk(s0, 1)) && !(st = dt_gpt2_backward_units(s0, NULL, 1.0f)) &&
            !(st = dt_gpt2_backward_units(s1, dt_gpt2_input_grad(s0, NULL, NULL), 1.0f)) && !(st = dt_gpt2_use_chunk(s0, 0)))
            st = dt_gpt2_backward_units(s0, dt_gpt2_input_grad(s1, NULL, NULL), 1.0f);
    }
    EXPECT(!st, "chunks: %s", st ? dt_last_error() : "");
    int nw, exact = 1;
    const dt_tensor_info *tw = dt_gpt2_tensors(whole, &nw);
    for (int i = 0; i < nw; i++) {
        size_t cw = 0, c = 0;
        const float *gw = find(whole, tw[i].name, 1, &cw), *g = find(s0, tw[i].name, 1, &c);
        if (!g) g = find(s1, tw[i].name, 1, &c);
        exact &= g && c == cw && !memcmp(g, gw, cw * sizeof(float));
    }
    EXPECT(exact && !memcmp(lw, lc, sizeof lw), "two chunks on a stage: losses %.9g %.9g (one model %.9g %.9g), gradients %s", lc[0], lc[1],
           lw[0], lw[1], exact ? "equal" : "differ");
    chunk_areas(cfg, &p0, s1, tok, B, T, dt_gpt2_activation_memory(s0));
    EXPECT(dt_gpt2_forward_units(s0, 1, 4, NULL, dt_gpt2_output(s1), NULL, B, T, NULL) != DT_OK && strstr(dt_last_error(), "chunks"),
           "a range across two chunks: %s", dt_last_error());
    EXPECT(dt_gpt2_check_whole(s0, "x") != DT_OK, "a stage of two chunks passed for the whole model");
    dt_gpt2_destroy(whole);
    dt_gpt2_destroy(s0);
    dt_gpt2_destroy(s1);
}

int main(void) {
    const dt_gpt2_config cfg = { .max_seq_len = 16, .vocab_size = 64, .padded_vocab_size = 64, .num_layers = 3, .num_heads = 4, .channels = 32 };
    enum { B = 2, T = 16, S = 3 };
    const int cut[S + 1] = { 0, 2, 3, 5 };
    dt_gpt2 *whole = NULL, *st[S] = { NULL };
    dt_kernels_set_threads(1); /* as test_gpt2: ThreadSanitizer cannot see libgomp's barriers */
    if (dt_gpt2_create(&cfg, &whole)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    for (int s = 0; s < S; s++)
        if (dt_gpt2_create_units(&cfg, cut[s], cut[s + 1], &st[s])) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    dt_gpt2_init_random(whole, 7);
    for (int s = 0; s < S; s++) dt_gpt2_init_random(st[s], 7);

    /* what a stage holds without building it (the memory plan's count): every range of units, as built */
    for (int a = 0; a < 5; a++)
        for (int b = a + 1; b <= 5; b++) {
            dt_gpt2 *u = NULL;
            if (dt_gpt2_create_units(&cfg, a, b, &u)) { EXPECT(0, "units [%d, %d): %s", a, b, dt_last_error()); continue; }
            EXPECT(dt_gpt2_units_num_params(&cfg, a, b, 1) == dt_gpt2_num_params(u), "units [%d, %d): counted %zu parameters, built %zu",
                   a, b, dt_gpt2_units_num_params(&cfg, a, b, 1), dt_gpt2_num_params(u));
            dt_gpt2_destroy(u);
        }
    EXPECT(dt_gpt2_units_num_params(&cfg, 0, 5, 2) == dt_gpt2_part_num_params(&cfg, 2), "the whole model at tp 2: %zu, not %zu",
           dt_gpt2_units_num_params(&cfg, 0, 5, 2), dt_gpt2_part_num_params(&cfg, 2));

    /* memory that setup must not make resident: a new optimizer's state (zero pages until the first update) and
     * the model's own gradients once a strategy's store replaces them (given back, and never copied) */
    {
        dt_optim_config oc;
        dt_optim_defaults(DT_OPT_ADAMW, &oc);
        dt_optim *o = NULL;
        size_t n = 1 << 22;
        if (dt_optim_create(&oc, n, NULL, 0, &o)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
        size_t rm = dt_mem_resident(dt_optim_buffer(o, 0), n * 4), rv = dt_mem_resident(dt_optim_buffer(o, 1), n * 4);
        /* one page at most: the allocation's header shares it */
        EXPECT(rm <= 4096 && rv <= 4096, "a new AdamW's state is resident before any update: %zu and %zu of %zu bytes", rm, rv, n * 4);
        dt_optim_destroy(o);
        size_t np = dt_gpt2_num_params(whole);
        float *store = dt_alloc_zeroed(np * sizeof(float));
        dt_gpt2_set_grad_storage(whole, store);
        dt_gpt2_set_grad_storage(whole, NULL);
        size_t rs = dt_mem_resident(store, np * sizeof(float));
        EXPECT(rs <= 4096, "handing the gradients' storage over and back read %zu bytes of the store into memory", rs);
        dt_free_zeroed(store);
    }

    /* weights streamed whole: 2 MB aligned from 8 MB on (huge pages' size), 64 bytes below, and usable to the end */
    {
        const size_t sizes[3] = { 1000, ((size_t)8 << 20) + 4, (size_t)20 << 20 };
        for (int i = 0; i < 3; i++) {
            unsigned char *w = dt_alloc_streamed(sizes[i]);
            uintptr_t align = sizes[i] >= ((size_t)8 << 20) ? (uintptr_t)2 << 20 : 64;
            EXPECT(w && (uintptr_t)w % align == 0, "dt_alloc_streamed(%zu): %p, not %zu-byte aligned", sizes[i], (void *)w, (size_t)align);
            if (w) {
                memset(w, 7, sizes[i]);
                EXPECT(w[sizes[i] - 1] == 7, "dt_alloc_streamed(%zu): its last byte", sizes[i]);
            }
            dt_free_aligned(w);
        }
    }

    /* the initialisation made in pieces (as ranks make it, each a piece; threads split a piece the same way) is the
     * whole one's */
    {
        dt_gpt2 *pieces = NULL;
        size_t n = dt_gpt2_num_params(whole);
        if (dt_gpt2_create(&cfg, &pieces)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
        const size_t cuts[4] = { 0, 1000, n / 2 + 7, n };
        for (int k = 0; k < 3; k++) dt_gpt2_init_random_range(pieces, 7, cuts[k], cuts[k + 1]);
        EXPECT(!memcmp(dt_gpt2_params(pieces), dt_gpt2_params(whole), n * sizeof(float)),
               "the initialisation made in 3 pieces differs from the whole one");
        dt_gpt2_destroy(pieces);
    }

    /* the stages hold exactly their units' tensors, with the whole model's values */
    int nw, held = 0, same = 1;
    const dt_tensor_info *tw = dt_gpt2_tensors(whole, &nw);
    for (int s = 0; s < S; s++) {
        int n;
        const dt_tensor_info *t = dt_gpt2_tensors(st[s], &n);
        held += n;
        for (int i = 0; i < n; i++) {
            size_t cw = 0;
            const float *pw = find(whole, t[i].name, 0, &cw);
            same &= pw && cw == t[i].count && !memcmp(pw, dt_gpt2_params(st[s]) + t[i].offset, cw * sizeof(float));
        }
    }
    EXPECT(held == nw + 1 && same, "the stages hold %d tensors (the whole model %d, plus wte's copy), values %s", held, nw,
           same ? "equal" : "differ");
    EXPECT(dt_gpt2_num_params(st[1]) == 12 * 32 * 32 + 13 * 32, /* 12 C^2 + 13 C */
           "the middle stage holds one block's parameters, not %zu", dt_gpt2_num_params(st[1]));

    int32_t in[B * T], tg[B * T];
    uint64_t r = 3;
    for (int i = 0; i < B * T; i++) { in[i] = (int32_t)(dt_rng_next(&r) % 64); tg[i] = (int32_t)(dt_rng_next(&r) % 64); }
    float lw = 0, ls = 0;
    dt_gpt2_set_unit_hooks(whole, before_fwd, before_bwd, NULL);
    dt_gpt2_set_grad_hook(whole, after_bwd, NULL);
    size_t nl = (size_t)B * T * 64;
    float *logits = malloc(nl * sizeof(float));
    if (dt_gpt2_forward(whole, in, tg, B, T, &lw)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    memcpy(logits, dt_gpt2_logits(whole), nl * sizeof(float)); /* backward turns them into their gradient */
    if (dt_gpt2_backward(whole, 1.0f)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    EXPECT(!strcmp(events, "F0 F1 F2 F3 F4 B4 A4 B3 A3 B2 A2 B1 A1 B0 A0 "), "hooks in the wrong order: %s", events);

    /* the pipeline: forward stage by stage, backward in reverse */
    const float *x = NULL;
    for (int s = 0; s < S; s++) {
        if (dt_gpt2_forward_units(st[s], cut[s], cut[s + 1], in, x, tg, B, T, &ls)) { printf("FAIL: stage %d: %s\n", s, dt_last_error()); return 1; }
        x = dt_gpt2_output(st[s]);
    }
    EXPECT(ls == lw && !memcmp(dt_gpt2_logits(st[S - 1]), logits, nl * sizeof(float)),
           "stages' loss %.9g vs the whole model's %.9g", ls, lw);
    const float *dout = NULL;
    for (int s = S - 1; s >= 0; s--) {
        if (dt_gpt2_backward_units(st[s], dout, 1.0f)) { printf("FAIL: stage %d backward: %s\n", s, dt_last_error()); return 1; }
        dout = dt_gpt2_input_grad(st[s], NULL, NULL);
    }
    int exact = 1;
    double wte_rel = 0;
    for (int i = 0; i < nw; i++) {
        size_t cw = 0, c0 = 0, c2 = 0;
        const float *gw = find(whole, tw[i].name, 1, &cw);
        if (!strcmp(tw[i].name, "wte")) {
            const float *g0 = find(st[0], "wte", 1, &c0), *g2 = find(st[2], "wte", 1, &c2);
            double dmax = 0, rmax = 0;
            for (size_t j = 0; j < cw; j++) {
                dmax = fmax(dmax, fabs((double)g0[j] + g2[j] - gw[j]));
                rmax = fmax(rmax, fabs(gw[j]));
            }
            wte_rel = dmax / rmax;
            continue;
        }
        for (int s = 0; s < S; s++) {
            size_t c = 0;
            const float *g = find(st[s], tw[i].name, 1, &c);
            if (g) exact &= c == cw && !memcmp(g, gw, cw * sizeof(float));
        }
    }
    EXPECT(exact, "a stage's gradient differs from the whole model's");
    EXPECT(wte_rel < 1e-6, "wte: first stage's rows + last stage's head part differ from the whole model's by %.3g", wte_rel);
    printf("3 stages: loss %.7f (whole model %.7f); gradients bit for bit: %s; wte's two parts sum to it within %.2g\n", ls, lw,
           exact ? "yes" : "no", wte_rel);

    /* one model in two ranges, the second taking the first's output in place */
    float l2 = 0;
    if (dt_gpt2_forward_units(whole, 0, 2, in, NULL, NULL, B, T, NULL) ||
        dt_gpt2_forward_units(whole, 2, 5, NULL, dt_gpt2_output(whole), tg, B, T, &l2))
        EXPECT(0, "ranges of one model: %s", dt_last_error());
    else EXPECT(l2 == lw, "ranges of one model: loss %.9g, whole %.9g", l2, lw);

    /* a stage is not a whole model */
    EXPECT(dt_gpt2_forward(st[1], in, tg, B, T, &ls) != DT_OK && strstr(dt_last_error(), "units [2, 3)"),
           "forward on a stage: %s", dt_last_error());
    EXPECT(dt_llmc_save("/tmp/dtrain-stage.bin", st[1]) != DT_OK && strstr(dt_last_error(), "not the whole model"),
           "saving a stage as an llm.c file: %s", dt_last_error());
    EXPECT(dt_gpt2_forward_units(st[1], 2, 3, in, NULL, NULL, B, T, NULL) != DT_OK && strstr(dt_last_error(), "input activations"),
           "a middle range without its input: %s", dt_last_error());
    dt_gpt2 *empty = NULL;
    EXPECT(dt_gpt2_create_units(&cfg, 3, 3, &empty) != DT_OK && !empty, "an empty range of units was accepted");
    /* hooks are lists: a second subscriber is called after the first, and unsubscribing one leaves the other */
    int sub2;
    dt_gpt2_set_grad_hook(whole, second_sub, &sub2);
    nev = 0;
    events[0] = 0;
    if (dt_gpt2_forward(whole, in, tg, B, T, &lw) || dt_gpt2_backward(whole, 1.0f)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    EXPECT(!strcmp(events, "F0 F1 F2 F3 F4 B4 A4 S4 B3 A3 S3 B2 A2 S2 B1 A1 S1 B0 A0 S0 "), "two subscribers: %s", events);
    dt_gpt2_set_grad_hook(whole, NULL, NULL); /* the first (its context NULL) leaves */
    dt_gpt2_set_unit_hooks(whole, NULL, NULL, NULL);
    nev = 0;
    events[0] = 0;
    if (dt_gpt2_forward(whole, in, tg, B, T, &lw) || dt_gpt2_backward(whole, 1.0f)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    EXPECT(!strcmp(events, "S4 S3 S2 S1 S0 "), "after unsubscribing the first: %s", events);
    dt_gpt2_set_grad_hook(whole, NULL, &sub2);
    for (int i = 0; i < 3; i++) split_backward(&cfg, B, T, (dt_dtype[]){ DT_F32, DT_BF16, DT_F16 }[i]);
    chunks(&cfg, B, T);
    printf("units: %d passed, %d failed\n", passed, failed);
    free(logits);
    dt_gpt2_destroy(whole);
    for (int s = 0; s < S; s++) dt_gpt2_destroy(st[s]);
    return failed ? 1 : 0;
}
