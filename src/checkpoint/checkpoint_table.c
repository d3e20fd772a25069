/* The manifest's tensor table: the whole model's tensors (name, Hugging Face's name, unit, global shape and offset) in
 * the store's order. A model in parts (pipeline stages, tensor-parallel slices, experts over ranks) has each rank
 * hold only its own entries, so rank 0's table alone would list the first stage's: every rank's entries are gathered
 * and each tensor kept once (its global offset names it; a pipeline's tied copy of wte is the first stage's). */
#include "dtrain/train.h"
#include "checkpoint_internal.h"

#include <stdlib.h>
#include <string.h>

/* An entry as 64-bit words (no padding: 144 bytes of names, then 8-byte fields). */
enum { WORDS = sizeof(dt_ckpt_tensor) / sizeof(int64_t) };
_Static_assert(sizeof(dt_ckpt_tensor) % sizeof(int64_t) == 0, "dt_ckpt_tensor travels as 64-bit words");

static int entries(const dt_model *m, dt_ckpt_tensor *out) {
    int n = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        if (t->tied_copy) continue;
        if (out) {
            dt_ckpt_tensor *e = &out[n];
            memset(e, 0, sizeof *e);
            memcpy(e->name, t->name, sizeof e->name);
            memcpy(e->hf, t->hf, sizeof e->hf);
            e->name[sizeof e->name - 1] = e->hf[sizeof e->hf - 1] = '\0';
            e->unit = t->unit, e->ndim = t->ndim, e->goffset = (int64_t)t->goffset;
            for (int d = 0; d < t->ndim && d < 4; d++) e->gshape[d] = t->gshape[d];
        }
        n++;
    }
    return n;
}

static int by_offset(const void *a, const void *b) {
    int64_t x = ((const dt_ckpt_tensor *)a)->goffset, y = ((const dt_ckpt_tensor *)b)->goffset;
    return (x > y) - (x < y);
}

dt_status dt_ckpt_table_collect(dt_comm *w, const dt_checkpoint_model *cm, bool parts, dt_ckpt_tensor **out, int *n) {
    int mine = entries(&cm->m, NULL);
    dt_ckpt_tensor *own = calloc((size_t)mine + 1, sizeof *own);
    void *buf = NULL;
    size_t words = 0;
    *out = NULL, *n = 0;
    dt_status st = dt_ckpt_every_rank(parts ? w : NULL, own != NULL, "hold the tensor table");
    if (!st) entries(&cm->m, own);
    if (!st) st = dt_comm_allgatherv_alloc(parts ? w : NULL, own, (size_t)mine * WORDS, DT_I64, &buf, &words);
    free(own);
    if (st) return dt_error(st, "checkpoint: the tensor table: %s", dt_last_error());
    dt_ckpt_tensor *all = buf;
    size_t total = words / WORDS;
    qsort(all, total, sizeof *all, by_offset);
    int kept = 0;
    for (size_t i = 0; i < total; i++)
        if (!kept || all[kept - 1].goffset != all[i].goffset) all[kept++] = all[i];
    *out = all, *n = kept;
    return DT_OK;
}

void dt_ckpt_table_manifest(cJSON *j, const dt_ckpt_tensor *t, int n) {
    cJSON *x = cJSON_AddArrayToObject(j, "tensors");
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        int shape[4] = { (int)t[i].gshape[0], (int)t[i].gshape[1], (int)t[i].gshape[2], (int)t[i].gshape[3] };
        cJSON_AddStringToObject(e, "name", t[i].name);
        cJSON_AddStringToObject(e, "hf", t[i].hf);
        cJSON_AddNumberToObject(e, "unit", (double)t[i].unit);
        cJSON_AddNumberToObject(e, "offset", (double)t[i].goffset);
        cJSON_AddItemToObject(e, "shape", cJSON_CreateIntArray(shape, (int)t[i].ndim));
        cJSON_AddItemToArray(x, e);
    }
}
