/* The decoder on a GPU: dtrain's decoder (its rows checked, its slots' fill kept) with its steps run by the GPU
 * plugin's decoder (src/gpu/decode.c), which holds the weights and the cache on the device. */
#include "dtrain/gpu_lm.h"
#include "dtrain/infer.h"

#include <stdlib.h>

typedef struct {
    const dt_gpu_api *api;
    dt_gpu *g;
    dt_gpu_decoder *d;
} on_gpu;

static dt_status run(void *ctx, const int32_t *rows, int n, float *logits) {
    on_gpu *o = ctx;
    return o->api->decoder_run(o->d, rows, n, logits);
}

static void destroy(void *ctx) {
    on_gpu *o = ctx;
    if (!o) return;
    if (o->d) o->api->decoder_destroy(o->d);
    if (o->g) o->api->close(o->g);
    free(o);
}

dt_status dt_decoder_create_gpu(const dt_gpt2 *m, int ordinal, int nslots, int max_rows, int context, dt_decoder **out) {
    *out = NULL;
    on_gpu *o = calloc(1, sizeof *o);
    if (!o) return dt_error(DT_ERR_NOMEM, "decoder: out of memory");
    dt_status st = dt_gpu_api_load(&o->api);
    if (!st) st = o->api->open(ordinal, &o->g);
    if (!st) st = o->api->decoder_create(o->g, dt_gpt2_program((dt_gpt2 *)m), nslots, max_rows, context, &o->d);
    if (st) {
        destroy(o);
        return st;
    }
    return dt_decoder_create_on(m, nslots, max_rows, context, (dt_decoder_device){ o, run, destroy }, out);
}
