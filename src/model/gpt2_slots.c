/* Activation slots: several micro-batches in flight on one model (a
 * pipeline stage runs F of micro-batch k+1 before B of k). Each slot is a
 * whole arena, sized on its first forward like the model's own; switching
 * swaps the model's activation fields with the slot's, so the forward and
 * backward code knows nothing of slots. */
#include "gpt2_internal.h"

#include <stdlib.h>
#include <string.h>

static void save(const dt_gpt2 *m, gpt2_slot *s) {
    s->acts = m->acts;
    memcpy(s->act_sizes, m->act_sizes, sizeof s->act_sizes);
    memcpy(s->act_off, m->act_off, sizeof s->act_off);
    s->nacts = m->nacts;
    memcpy(s->rs, m->rs, sizeof s->rs);
    s->cur = m->cur;
    s->B = m->B, s->T = m->T, s->run_a = m->run_a, s->run_b = m->run_b;
    s->bt_capacity = m->bt_capacity, s->att_capacity = m->att_capacity;
    s->inputs = m->inputs, s->targets = m->targets;
    s->have_targets = m->have_targets, s->blockwise = m->blockwise, s->w_pending = m->w_pending;
    s->loss = m->loss, s->w_dscale = m->w_dscale;
    s->acts_lp = m->acts_lp, s->lp_layer = m->lp_layer, s->lp_capacity = m->lp_capacity;
}

static void load(dt_gpt2 *m, const gpt2_slot *s) {
    m->acts = s->acts;
    memcpy(m->act_sizes, s->act_sizes, sizeof s->act_sizes);
    memcpy(m->act_off, s->act_off, sizeof s->act_off);
    m->nacts = s->nacts;
    memcpy(m->rs, s->rs, sizeof m->rs);
    m->cur = s->cur;
    m->B = s->B, m->T = s->T, m->run_a = s->run_a, m->run_b = s->run_b;
    m->bt_capacity = s->bt_capacity, m->att_capacity = s->att_capacity;
    m->inputs = s->inputs, m->targets = s->targets;
    m->have_targets = s->have_targets, m->blockwise = s->blockwise, m->w_pending = s->w_pending;
    m->loss = s->loss, m->w_dscale = s->w_dscale;
    m->acts_lp = s->acts_lp, m->lp_layer = s->lp_layer, m->lp_capacity = s->lp_capacity;
}

static void free_slot(gpt2_slot *s) {
    dt_free_aligned(s->acts);
    dt_free_aligned(s->acts_lp);
    free(s->inputs);
    free(s->targets);
    memset(s, 0, sizeof *s);
}

dt_status dt_gpt2_set_slots(dt_gpt2 *m, int n) {
    if (n < 1) return dt_error(DT_ERR_ARG, "model: %d activation slots (at least 1)", n);
    dt_gpt2_use_slot(m, 0);
    gpt2_slot *s = calloc((size_t)n, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "model: out of memory for %d activation slots", n);
    /* slot 0 is the model's fields; the rest of the old ones go */
    dt_gpt2_free_slots(m);
    m->slots = s;
    m->nslots = n;
    m->slot = 0;
    return DT_OK;
}

void dt_gpt2_use_slot(dt_gpt2 *m, int k) {
    if (!m->slots || k == m->slot || k < 0 || k >= m->nslots) return;
    save(m, &m->slots[m->slot]);
    load(m, &m->slots[k]);
    m->slot = k;
}

int dt_gpt2_num_slots(const dt_gpt2 *m) { return m->slots ? m->nslots : 1; }

void dt_gpt2_free_slots(dt_gpt2 *m) {
    for (int i = 0; m->slots && i < m->nslots; i++)
        if (i != m->slot) free_slot(&m->slots[i]);
    free(m->slots);
    m->slots = NULL;
    m->nslots = 0;
    m->slot = 0;
}

void dt_gpt2_drop_slots(dt_gpt2 *m) {
    for (int i = 0; m->slots && i < m->nslots; i++)
        if (i != m->slot) free_slot(&m->slots[i]);
}

size_t dt_gpt2_slots_bytes(const dt_gpt2 *m) {
    size_t b = 0;
    for (int i = 0; m->slots && i < m->nslots; i++)
        if (i != m->slot) b += m->slots[i].nacts * sizeof(float) + m->slots[i].lp_capacity * sizeof(uint16_t);
    return b;
}
