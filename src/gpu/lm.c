/* The model program on the GPU: the same spec (the family's block ops, read through dt_program_view) run by the
 * device kernels, its parameters, gradients and AdamW's moments on the device in the host program's store layout (so
 * a checkpoint is the host store, downloaded). One process, the whole model, f32 or bf16; GPT-2's and the Llama family's ops
 * (LayerNorm or RMSNorm, a Linear of one part or several side by side, attention on q|k|v made from K/V heads and
 * turned by rotary positions where the family says, GELU or SwiGLU, the add, a tied or untied head); a mixture of
 * experts, or a model split over ranks, is refused by name when the model is made. Under the program's bf16
 * precision it rounds where the CPU's program rounds (program_run.c: a norm's, a Linear's, attention's and an
 * activation's outputs, the packed q|k|v, the Linears' gradients, a norm's input as a block's backward reads it) and
 * runs the Linears and the head on the tensor cores in bf16 (lowp.cu) from a bf16 copy of the parameters made after
 * each update. */
#include "dtrain/gpu_lm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dt_gpu_lm {
    dt_gpu *g;
    dt_program_view v;
    int B, T, L, C, NH, KVH, hd, V, Vp, nblock;
    int repack;                /* attention makes its own q|k|v of all heads (rotary positions, or fewer K/V heads) */
    float eps;                 /* RMSNorm's */
    bool bf16;                 /* the program's precision: autocast's bf16 (else f32) */
    bool lse;                  /* attention keeps each row's log-sum-exp, not T x T probabilities (flash.cu) */
    bool flash_ok;             /* flash attention may be taken (bf16 or TF32, a head it has a kernel for) */
    bool cudnn;                /* attention through cuDNN's fused kernel (DT_ATTN_CUDNN; lse is set too: its stats) */
    size_t n;                  /* parameters */
    size_t *off;               /* [L * nblock]: block l's tensor k's offset in the store */
    size_t o_wte, o_head, o_lnfw;
    const dt_tensor_info *wpe, *lnfb; /* NULL: none (rotary positions; RMSNorm) */
    float *inv_freq;           /* device: rotary's head_dim / 2 frequencies */
    float **packed, *dpacked;  /* with repack: each block's q|k|v of all heads [BT, 3 Q], kept; its gradient */
    float *params, *grads, *m, *vv; /* device */
    uint16_t *params16, *work16; /* bf16: the parameters' copy; a Linear's packed input and output gradient */
    float *work;               /* bf16: a Linear's weight gradient before its rounding */
    double *ss;                /* device: the last step's gradient sum of squares */
    int32_t *tok, *tgt;        /* device */
    float *stream;             /* (L + 1) x BT x C: each block's input, then the last block's output */
    float **val;               /* [l * nvalues + v]: block l's values (IN and OUT: into stream) */
    float **stats;             /* [l * nops + k]: a norm's mean | rstd, attention's probabilities */
    float **dval;              /* [v]: one block's value gradients (IN and OUT: the two dres buffers) */
    uint16_t **bits;           /* bf16: [l * nvalues + v]: value v's bf16 bits, where a Linear reads it and its producer (a norm,
                                * attention, an activation) writes them (else NULL: the Linear packs it); kept for backward */
    uint16_t *lnf16;           /* bf16: the final norm's bits, the head's input */
    float *dres[2], *lnf, *lnf_stats, *logits, *losses, *dlnf, *scratch;
    float *ce_stats;           /* bf16: each row's maximum and sum of exponentials (the head's gradient is made from them) */
    float *h_losses;           /* host: a forward's rows' losses */
    float *staged;             /* host: the buffer dt_gpu_lm_grads last moved the gradients through, page-locked if staged_pinned */
    int staged_pinned;
    double scored;
    long step;
    int counting;              /* lay_out counts bytes (need; state_need of them the parameters' and AdamW's) */
    size_t need, state_need;
};

/* The pre-flight: everything the model takes on the GPU counted before any of it is asked for, and refused, naming
 * the sizes, when it is more than the GPU has free. */
static dt_status lay_out(dt_gpu_lm *m);
static void count(dt_gpu_lm *m) {
    m->counting = 1, m->need = m->state_need = 0;
    (void)lay_out(m); /* counting takes nothing, so fails at nothing */
    m->counting = 0;
}

static dt_status preflight(dt_gpu_lm *m) {
    count(m);
    size_t fr = 0, tot = 0;
    dt_status st = dt_gpu_mem_info(m->g, &fr, &tot);
    if (st || m->need <= fr) return st;
    return dt_error(DT_ERR_NOMEM, "--device cuda: this model at B %d x T %d needs %.2f GiB of the GPU (parameters, gradients and AdamW's "
                    "moments%s %.2f GiB; activations %.2f GiB: a smaller --batch or --seq takes less), and %s has %.2f GiB free",
                    m->B, m->T, m->need / 1073741824.0, m->bf16 ? ", and their bf16 copy" : "", m->state_need / 1073741824.0,
                    (m->need - m->state_need) / 1073741824.0, dt_gpu_name(m->g), fr / 1073741824.0);
}

static dt_status check_ops(const dt_program *p, const dt_program_view *v) {
    const dt_lm_config *c = dt_program_config(p);
    if (v->heads != c->num_heads)
        return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: the GPU path runs the whole model in one process (no tensor parallelism)");
    if (dt_program_precision(p) == DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: fp16 is not on the GPU path (--precision bf16 is)");
    if (v->rotary && v->head_dim / 2 > 4096) return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: a head of %d channels", v->head_dim);
    int repack = v->rotary || v->kv_heads != v->heads;
    for (int k = 0; k < v->nops; k++) {
        const dt_program_op *o = &v->ops[k];
        if (o->s.kind == DT_OP_MOE || o->s.kind == DT_OP_HEADNORM)
            return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: block op %d (%s) has no GPU kernel yet", k,
                            o->s.kind == DT_OP_MOE ? "a mixture of experts" : "Qwen 3's norm of each head's queries and keys");
        if (o->s.kind == DT_OP_ATTENTION && o->width_in != (repack ? o->width_out + 2 * v->kv_heads * v->head_dim : 3 * o->width_out))
            return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: attention (op %d) reads %d channels, not q, k and v of its heads", k,
                            o->width_in);
    }
    return DT_OK;
}

/* A device buffer; while counting (the pre-flight), only its bytes, added to m->need. */
static dt_status take_bytes(dt_gpu_lm *m, size_t bytes, void **out) {
    if (!m->counting) return dt_gpu_alloc(m->g, bytes, out);
    m->need += bytes;
    return DT_OK;
}

static dt_status take(dt_gpu_lm *m, size_t floats, float **out) {
    void *p = NULL;
    dt_status st = take_bytes(m, floats * sizeof(float), &p);
    if (!st && !m->counting) *out = p;
    return st;
}

/* Whether value x keeps its bf16 bits: a Linear reads it and the op that makes it writes them (a norm, attention, GELU
 * or SwiGLU: each rounds its output there anyway). */
static bool keeps_bits(const dt_program_view *v, int x) {
    bool read = false, made = false;
    for (int k = 0; k < v->nops; k++) {
        dt_op_kind kind = v->ops[k].s.kind;
        read = read || (kind == DT_OP_LINEAR && v->ops[k].s.in == x);
        made = made || (v->ops[k].s.out == x &&
                        (kind == DT_OP_NORM || kind == DT_OP_ATTENTION || kind == DT_OP_GELU || kind == DT_OP_SWIGLU));
    }
    return read && made && x != DT_V_IN && x != DT_V_OUT;
}

/* bf16's working buffers, for the widest Linear (or the head): its input and output gradient packed, its weight
 * gradient and bias sums before rounding. */
static dt_status take_lp_work(dt_gpu_lm *m) {
    size_t BT = (size_t)m->B * m->T, io = (size_t)m->C + m->Vp, wk = (size_t)m->Vp * m->C + m->Vp;
    for (int k = 0; k < m->v.nops; k++) {
        const dt_program_op *o = &m->v.ops[k];
        if (o->s.kind != DT_OP_LINEAR) continue;
        size_t in = (size_t)o->width_in, out = (size_t)o->width_out;
        io = in + out > io ? in + out : io;
        wk = out * in + out > wk ? out * in + out : wk;
    }
    size_t att = 8 * (size_t)m->NH * m->hd; /* cuDNN's backward: q|k|v, out, dout and d(q|k|v) in bf16 */
    if (m->cudnn && att > io) io = att;
    void *w16 = NULL;
    dt_status st = take_bytes(m, BT * io * sizeof(uint16_t), &w16);
    if (!st && !m->counting) m->work16 = w16;
    if (!st) st = take(m, wk, &m->work);
    return st;
}

static dt_status lay_out(dt_gpu_lm *m) {
    const dt_program_view *v = &m->v;
    size_t BT = (size_t)m->B * m->T, att = (size_t)m->B * m->NH * m->T * (m->lse ? 1 : m->T);
    dt_status st = take(m, m->n, &m->params);
    if (!st) st = take(m, m->n, &m->grads);
    if (!st) st = take(m, m->n, &m->m);
    if (!st) st = take(m, m->n, &m->vv);
    void *ss = NULL, *tok = NULL; /* each kept as soon as it is taken: destroy frees what a failure leaves */
    if (!st && !(st = take_bytes(m, sizeof(double), &ss)) && !m->counting) m->ss = ss;
    if (!st && !(st = take_bytes(m, 2 * BT * sizeof(int32_t), &tok)) && !m->counting) m->tok = tok, m->tgt = m->tok + BT;
    void *p16 = NULL;
    if (!st && m->bf16 && !(st = take_bytes(m, m->n * sizeof(uint16_t), &p16)) && !m->counting) m->params16 = p16;
    m->state_need = m->need;
    if (!st && m->bf16) st = take_lp_work(m);
    if (!st) st = take(m, (size_t)(m->L + 1) * BT * m->C, &m->stream);
    for (int l = 0; !st && l < m->L; l++) {
        for (int x = 0; !st && x < v->nvalues; x++) {
            float **dst = &m->val[l * v->nvalues + x];
            if (x != DT_V_IN && x != DT_V_OUT) st = take(m, BT * v->value_width[x], dst);
            else if (!m->counting) *dst = m->stream + (size_t)(l + (x == DT_V_OUT)) * BT * m->C;
        }
        for (int k = 0; !st && k < v->nops; k++) {
            dt_op_kind kind = v->ops[k].s.kind;
            if (kind == DT_OP_NORM) st = take(m, 2 * BT, &m->stats[l * v->nops + k]);
            if (kind == DT_OP_ATTENTION) st = take(m, att, &m->stats[l * v->nops + k]);
        }
        if (!st && m->repack) st = take(m, BT * 3 * m->NH * m->hd, &m->packed[l]);
        for (int x = 0; !st && m->bf16 && x < v->nvalues; x++) {
            void *b = NULL;
            if (keeps_bits(v, x) && !(st = take_bytes(m, BT * v->value_width[x] * sizeof(uint16_t), &b)) && !m->counting)
                m->bits[l * v->nvalues + x] = b;
        }
    }
    if (!st && m->repack) st = take(m, BT * 3 * m->NH * m->hd, &m->dpacked);
    if (!st && v->rotary) st = take(m, (size_t)m->hd / 2, &m->inv_freq);
    for (int x = 0; !st && x < v->nvalues; x++)
        if (x == DT_V_IN || x == DT_V_OUT) st = take(m, BT * m->C, &m->dres[x]);
        else st = take(m, BT * v->value_width[x], &m->dval[x]);
    if (!st) st = take(m, BT * m->C, &m->lnf);
    void *lnf16 = NULL;
    if (!st && m->bf16 && !(st = take_bytes(m, BT * m->C * sizeof(uint16_t), &lnf16)) && !m->counting) m->lnf16 = lnf16;
    if (!st) st = take(m, 2 * BT, &m->lnf_stats);
    if (!st) st = take(m, BT * m->Vp, &m->logits);
    if (!st) st = take(m, BT, &m->losses);
    if (!st && m->bf16) st = take(m, 2 * BT, &m->ce_stats);
    if (!st) st = take(m, BT * m->C, &m->dlnf);
    if (!st) st = take(m, m->lse ? (size_t)m->B * m->NH * m->T : (size_t)m->NH * m->T * m->T, &m->scratch);
    /* cuDNN's workspace, which its graphs ask for when built (attention_cudnn.cpp allocates it then): counted at the
     * most cuDNN takes by default, so that the pre-flight's refusal still comes first */
    if (m->counting && m->cudnn) m->need += DT_GPU_CUDNN_WORKSPACE;
    return st;
}

/* The runner's fields for p at B x T, nothing on the device yet. */
static dt_status make(dt_gpu *g, dt_program *p, int B, int T, dt_gpu_lm **out) {
    *out = NULL;
    const dt_lm_config *c = dt_program_config(p);
    if (B < 1 || T < 1 || T > c->max_seq_len) return dt_error(DT_ERR_ARG, "--device cuda: B %d x T %d (T at most %d)", B, T, c->max_seq_len);
    dt_gpu_lm *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "dt_gpu_lm_create: out of memory");
    m->g = g;
    dt_program_get_view(p, &m->v);
    dt_status st = check_ops(p, &m->v);
    if (st) {
        free(m);
        return st;
    }
    m->B = B, m->T = T, m->L = c->num_layers, m->C = c->channels, m->NH = m->v.heads, m->KVH = m->v.kv_heads, m->hd = m->v.head_dim;
    m->V = c->vocab_size, m->Vp = m->v.embed->shape[0], m->eps = c->norm_eps, m->bf16 = dt_program_precision(p) == DT_BF16;
    m->repack = m->v.rotary || m->KVH != m->NH;
    /* flash attention (its products TF32) where asked, in a bf16 or TF32 run: by default the T x T probabilities are kept
     * while they fit (preflight), cuBLAS's products on them being faster than flash.cu's (docs/gpu.md) */
    bool flash_ok = (m->bf16 || dt_gpu_tf32(g)) && dt_gpu_flash_supported(m->hd);
    m->cudnn = dt_program_attention(p) == DT_ATTN_CUDNN;
    m->lse = m->cudnn || (dt_program_attention(p) == DT_ATTN_BLOCKWISE && flash_ok);
    if (m->cudnn && (!m->bf16 || !dt_gpu_cudnn_supported(m->hd)))
        st = dt_error(DT_ERR_UNSUPPORTED, "--attention cudnn: %s", !m->bf16 ? "cuDNN's fused attention runs in bf16 (--precision bf16)"
                      : dt_gpu_cudnn_supported(64) ? "heads of at most 128 channels, a multiple of 8" : "this build has no cuDNN attention "
                      "(scripts/get-cudnn-frontend.sh, then build again)");
    m->n = dt_program_num_params(p);
    m->o_wte = m->v.embed->offset, m->o_head = m->v.head ? m->v.head->offset : m->o_wte, m->o_lnfw = m->v.norm_w->offset;
    m->wpe = m->v.positions, m->lnfb = m->v.norm_b;
    for (m->nblock = 0; dt_program_block_tensor(p, 0, m->nblock); m->nblock++) {}
    m->off = calloc((size_t)m->L * m->nblock, sizeof *m->off);
    m->val = calloc((size_t)m->L * m->v.nvalues, sizeof *m->val);
    m->stats = calloc((size_t)m->L * m->v.nops, sizeof *m->stats);
    m->dval = calloc((size_t)m->v.nvalues, sizeof *m->dval);
    m->packed = calloc((size_t)m->L, sizeof *m->packed);
    m->bits = calloc((size_t)m->L * m->v.nvalues, sizeof *m->bits);
    m->h_losses = malloc((size_t)B * T * sizeof(float));
    if (!m->off || !m->val || !m->stats || !m->dval || !m->packed || !m->bits || !m->h_losses) st = dt_error(DT_ERR_NOMEM, "dt_gpu_lm_create: out of memory");
    for (int l = 0; !st && l < m->L; l++)
        for (int k = 0; k < m->nblock; k++) m->off[l * m->nblock + k] = dt_program_block_tensor(p, l, k)->offset;
    m->flash_ok = flash_ok;
    *out = m;
    return st;
}

/* The pre-flight's choice: with DT_ATTN_AUTO, flash attention where the T x T probabilities do not fit and it can. */
static dt_status fit(dt_gpu_lm *m, dt_program *p) {
    dt_status st = preflight(m);
    if (st == DT_ERR_NOMEM && !m->lse && dt_program_attention(p) == DT_ATTN_AUTO && m->flash_ok) {
        m->lse = true; /* without the T x T probabilities it may fit */
        st = preflight(m);
    }
    return st;
}

dt_status dt_gpu_lm_count(dt_gpu *g, dt_program *p, int B, int T, size_t *need, size_t *state, int *flash) {
    dt_gpu_lm *m = NULL;
    dt_status st = make(g, p, B, T, &m);
    if (!st && fit(m, p) == DT_ERR_NOMEM) st = DT_OK; /* fit counted; the count stands either way (a refusal is its news) */
    if (!st) *need = m->need, *state = m->state_need, *flash = m->lse;
    dt_gpu_lm_destroy(m);
    return st;
}

dt_status dt_gpu_lm_create(dt_gpu *g, dt_program *p, int B, int T, dt_gpu_lm **out) {
    dt_gpu_lm *m = NULL;
    dt_status st = make(g, p, B, T, &m);
    *out = NULL;
    if (!st) st = fit(m, p);
    if (!st) st = lay_out(m);
    if (!st) st = dt_gpu_lm_upload(m, dt_program_params(p));
    if (!st && m->v.rotary) st = dt_gpu_upload(g, m->inv_freq, m->v.inv_freq, (size_t)m->hd / 2 * sizeof(float));
    if (!st) st = dt_gpu_lm_zero_grad(m);
    if (!st) {
        dt_gpu_zero(g, m->m, m->n * sizeof(float));
        dt_gpu_zero(g, m->vv, m->n * sizeof(float));
        st = dt_gpu_sync(g);
    }
    if (st) {
        dt_gpu_lm_destroy(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

void dt_gpu_lm_destroy(dt_gpu_lm *m) {
    if (!m) return;
    dt_gpu *g = m->g;
    if (m->staged_pinned) dt_gpu_host_pin(g, m->staged, m->n * sizeof(float), 0);
    float *bufs[] = { m->params, m->grads, m->m, m->vv, m->stream, m->dres[0], m->dres[1], m->lnf, m->lnf_stats, m->logits, m->losses,
                      m->dlnf, m->scratch, m->dpacked, m->inv_freq, m->work, m->ce_stats };
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dt_gpu_free(g, bufs[i]);
    dt_gpu_free(g, m->ss);
    dt_gpu_free(g, m->params16);
    dt_gpu_free(g, m->work16);
    dt_gpu_free(g, m->tok);
    for (int l = 0; m->val && l < m->L; l++)
        for (int x = 0; x < m->v.nvalues; x++)
            if (x != DT_V_IN && x != DT_V_OUT) dt_gpu_free(g, m->val[l * m->v.nvalues + x]);
    for (int i = 0; m->stats && i < m->L * m->v.nops; i++) dt_gpu_free(g, m->stats[i]);
    for (int x = 0; m->dval && x < m->v.nvalues; x++) dt_gpu_free(g, m->dval[x]);
    for (int l = 0; m->packed && l < m->L; l++) dt_gpu_free(g, m->packed[l]);
    for (int i = 0; m->bits && i < m->L * m->v.nvalues; i++) dt_gpu_free(g, m->bits[i]);
    dt_gpu_free(g, m->lnf16);
    free(m->packed);
    free(m->bits);
    free(m->off);
    free(m->val);
    free(m->stats);
    free(m->dval);
    free(m->h_losses);
    free(m);
}


/* bf16: the parameters' 16-bit copy made again (after they were written) */
static void refresh_lp(dt_gpu_lm *m) {
    if (m->bf16) dt_gpu_pack_bf16(m->g, m->params16, m->params, m->n);
}

dt_status dt_gpu_lm_upload(dt_gpu_lm *m, const float *params) {
    dt_status st = dt_gpu_upload(m->g, m->params, params, m->n * sizeof(float));
    if (!st) refresh_lp(m);
    return st;
}

dt_status dt_gpu_lm_download(dt_gpu_lm *m, float *params, float *grads) {
    dt_status st = params ? dt_gpu_download(m->g, params, m->params, m->n * sizeof(float)) : DT_OK;
    if (!st && grads) st = dt_gpu_download(m->g, grads, m->grads, m->n * sizeof(float));
    return st;
}

dt_status dt_gpu_lm_zero_grad(dt_gpu_lm *m) {
    dt_gpu_zero(m->g, m->grads, m->n * sizeof(float));
    return DT_OK;
}

/* ---- the trace: each unit's forward and backward, and the update, as the GPU ran them ---- */

/* Whether this pass is traced (units: its marks' count less one must fit the device's marks); then its first mark. */
static bool tracing(const dt_gpu_lm *m) { return dt_trace_on() && m->L + 3 <= DT_GPU_MARKS; }
static void mark(dt_gpu_lm *m, bool on, int k) {
    if (on) (void)dt_gpu_mark(m->g, k);
}

/* After the pass was waited for: unit k ran between marks k and k + 1 (a backward pass's units in reverse), on the
 * trace's GPU track, the last mark put at now. */
static void trace_pass(dt_gpu_lm *m, const char *pass, int units, bool backward) {
    double now = dt_time_now(), last = dt_gpu_elapsed_ms(m->g, 0, units);
    if (last < 0) return;
    char name[32];
    for (int k = 0; k < units; k++) {
        dt_program_unit_name(m->L, pass, backward ? units - 1 - k : k, name, sizeof name);
        double a = dt_gpu_elapsed_ms(m->g, 0, k), b = dt_gpu_elapsed_ms(m->g, 0, k + 1);
        dt_trace_span(DT_TRACK_DEVICE, name, now - (last - a) / 1e3, now - (last - b) / 1e3);
    }
}

/* ---- forward ---- */

static float *W(const dt_gpu_lm *m, int l, int k) { return m->params + m->off[l * m->nblock + k]; }
static float *dW(const dt_gpu_lm *m, int l, int k) { return m->grads + m->off[l * m->nblock + k]; }
static uint16_t *W16(const dt_gpu_lm *m, int l, int k) { return m->params16 + m->off[l * m->nblock + k]; }

/* bf16: an output rounded as autocast casts it for the next Linear */
/* bf16: an output rounded as autocast casts it for the next Linear, unless its kernel did (writing its bits) */
static void lp_round(dt_gpu_lm *m, float *x, size_t n, const uint16_t *bits) {
    if (m->bf16 && !bits) dt_gpu_round_bf16(m->g, x, x, n, NULL);
}

/* Value x of block l's bf16 bits, if kept (keeps_bits). */
static uint16_t *bits_of(const dt_gpu_lm *m, int l, int x) { return m->bf16 ? m->bits[l * m->v.nvalues + x] : NULL; }

/* A Linear's forward and backward, f32 or bf16; w and b: the block tensors' indices, b below 0 for none (l -1: the
 * head, at offset o_head); in16: its input's bits, where kept. */
static void linear_forward(dt_gpu_lm *m, float *out, const float *in, const uint16_t *in16, int l, int w, int b, int BT, int C, int OC) {
    if (l < 0 && m->bf16) dt_gpu_matmul_forward_bf16(m->g, out, in, in16, m->params16 + m->o_head, NULL, BT, C, OC, m->work16);
    else if (l < 0) dt_gpu_matmul_forward(m->g, out, in, m->params + m->o_head, NULL, BT, C, OC);
    else if (m->bf16) dt_gpu_matmul_forward_bf16(m->g, out, in, in16, W16(m, l, w), b >= 0 ? W16(m, l, b) : NULL, BT, C, OC, m->work16);
    else dt_gpu_matmul_forward(m->g, out, in, W(m, l, w), b >= 0 ? W(m, l, b) : NULL, BT, C, OC);
}

static void linear_backward(dt_gpu_lm *m, float *din, float *dout, const float *in, const uint16_t *in16, int l, int w, int b, int BT, int C,
                            int OC) {
    float *dw = l < 0 ? m->grads + m->o_head : dW(m, l, w), *db = l >= 0 && b >= 0 ? dW(m, l, b) : NULL;
    if (m->bf16)
        dt_gpu_matmul_backward_bf16(m->g, din, dw, db, dout, in, in16, l < 0 ? m->params16 + m->o_head : W16(m, l, w), BT, C, OC, m->work16,
                                    m->work);
    else dt_gpu_matmul_backward(m->g, din, dw, db, dout, in, l < 0 ? m->params + m->o_head : W(m, l, w), BT, C, OC);
}

static void op_forward(dt_gpu_lm *m, int l, int k) {
    const dt_program_op *o = &m->v.ops[k];
    const dt_op_spec *s = &o->s;
    int BT = m->B * m->T;
    float *in = m->val[l * m->v.nvalues + s->in], *out = m->val[l * m->v.nvalues + s->out], *st = m->stats[l * m->v.nops + k];
    uint16_t *bits = bits_of(m, l, s->out); /* the output's, where a Linear reads it */
    switch (s->kind) {
    case DT_OP_NORM:
        if (m->v.rms) dt_gpu_rmsnorm_forward(m->g, out, st, in, W(m, l, s->w), BT, o->width_in, m->eps, bits);
        else dt_gpu_layernorm_forward(m->g, out, st, st + BT, in, W(m, l, s->w), W(m, l, s->b), BT, o->width_in, bits);
        lp_round(m, out, (size_t)BT * o->width_out, bits);
        break;
    case DT_OP_LINEAR: linear_forward(m, out, in, bits_of(m, l, s->in), l, s->w, s->b, BT, o->width_in, o->width_out); break;
    case DT_OP_ATTENTION: {
        const float *qkv = in;
        if (m->repack) { /* q|k|v of all heads, q and k turned by position: kept for backward */
            size_t Q = (size_t)o->width_out;
            dt_gpu_attention_pack(m->g, m->packed[l], in, BT, m->NH, m->KVH, m->hd);
            for (int part = 0; m->v.rotary && part < 2; part++)
                dt_gpu_rope(m->g, m->packed[l] + part * Q, m->inv_freq, BT, m->T, m->NH, m->hd, 3 * Q, 0);
            lp_round(m, m->packed[l], (size_t)BT * 3 * Q, NULL); /* turned q and k are 16-bit values too */
            qkv = m->packed[l];
        }
        /* rounded (and backward's D reads it so, as the CPU's): cuDNN's output is bf16, its bits written where kept */
        if (m->cudnn) dt_gpu_attention_forward_cudnn(m->g, out, st, qkv, m->B, m->T, o->width_out, m->NH, m->work16, bits);
        else if (m->lse) dt_gpu_attention_forward_lse(m->g, out, st, qkv, m->B, m->T, o->width_out, m->NH);
        else dt_gpu_attention_forward(m->g, out, st, qkv, m->B, m->T, o->width_out, m->NH);
        if (!m->cudnn && m->bf16) dt_gpu_round_bf16(m->g, out, out, (size_t)BT * o->width_out, bits);
        break;
    }
    case DT_OP_GELU:
        dt_gpu_gelu_forward(m->g, out, in, (size_t)BT * o->width_in, bits);
        lp_round(m, out, (size_t)BT * o->width_out, bits);
        break;
    case DT_OP_SWIGLU:
        dt_gpu_swiglu_forward(m->g, out, in, BT, o->width_out, bits);
        lp_round(m, out, (size_t)BT * o->width_out, bits);
        break;
    case DT_OP_ADD: dt_gpu_residual_forward(m->g, out, in, m->val[l * m->v.nvalues + s->in2], (size_t)BT * o->width_out); break;
    default: break; /* refused at create */
    }
}

dt_status dt_gpu_lm_forward(dt_gpu_lm *m, const int32_t *inputs, const int32_t *targets, double loss_tokens, float *loss) {
    size_t BT = (size_t)m->B * m->T;
    for (size_t i = 0; i < BT; i++)
        if (inputs[i] < 0 || inputs[i] >= m->V || (targets && targets[i] >= m->V))
            return dt_error(DT_ERR_ARG, "--device cuda: token %d at row %zu is outside the vocabulary of %d", targets && targets[i] >= m->V ? targets[i] : inputs[i], i, m->V);
    dt_status st = dt_gpu_upload(m->g, m->tok, inputs, BT * sizeof(int32_t));
    if (!st && targets) st = dt_gpu_upload(m->g, m->tgt, targets, BT * sizeof(int32_t));
    if (st) return st;
    bool on = tracing(m);
    mark(m, on, 0);
    dt_gpu_embedding_forward(m->g, m->stream, m->tok, m->params + m->o_wte, m->wpe ? m->params + m->wpe->offset : NULL, m->B, m->T, m->C);
    mark(m, on, 1);
    for (int l = 0; l < m->L; l++) {
        for (int k = 0; k < m->v.nops; k++) op_forward(m, l, k);
        mark(m, on, l + 2);
    }
    const float *x = m->stream + (size_t)m->L * BT * m->C;
    if (m->v.rms) dt_gpu_rmsnorm_forward(m->g, m->lnf, m->lnf_stats, x, m->params + m->o_lnfw, (int)BT, m->C, m->eps, m->lnf16);
    else dt_gpu_layernorm_forward(m->g, m->lnf, m->lnf_stats, m->lnf_stats + BT, x, m->params + m->o_lnfw, m->params + m->lnfb->offset, (int)BT,
                                  m->C, m->lnf16);
    /* bf16 with targets: the head's sums left unrounded, the cross-entropy reading them rounded (one pass fewer) */
    if (m->bf16 && targets)
        dt_gpu_matmul_sums_bf16(m->g, m->logits, m->lnf, m->lnf16, m->params16 + m->o_head, (int)BT, m->C, m->Vp, m->work16);
    else linear_forward(m, m->logits, m->lnf, m->lnf16, -1, 0, -1, (int)BT, m->C, m->Vp);
    if (!targets) {
        mark(m, on, m->L + 2);
        st = dt_gpu_sync(m->g);
        if (!st && on) trace_pass(m, "forward", m->L + 2, false);
        return st;
    }
    size_t scored = 0;
    for (size_t i = 0; i < BT; i++) scored += targets[i] >= 0;
    m->scored = loss_tokens > 0 ? loss_tokens : scored ? (double)scored : 1;
    /* f32: the gradient comes with the loss (the logits are not kept): backward starts from it; bf16: the logits and
     * each row's statistics are kept, and backward makes the gradient's bf16 bits from them (the CPU's 16-bit head) */
    if (m->bf16) dt_gpu_crossentropy_forward_bf16(m->g, m->logits, m->losses, m->ce_stats, m->tgt, (int)BT, m->V, m->Vp);
    else dt_gpu_crossentropy_fused(m->g, m->logits, m->losses, m->tgt, (int)BT, m->V, m->Vp, (float)(1.0 / m->scored));
    mark(m, on, m->L + 2);
    st = dt_gpu_download(m->g, m->h_losses, m->losses, BT * sizeof(float));
    if (!st) st = dt_gpu_sync(m->g);
    if (st) return st;
    if (on) trace_pass(m, "forward", m->L + 2, false);
    double sum = 0;
    for (size_t i = 0; i < BT; i++) sum += m->h_losses[i];
    if (loss) *loss = (float)(sum / m->scored);
    return DT_OK;
}

/* ---- backward ---- */

/* d(q|k|v) += attention's backward, from its probabilities or its rows' log-sum-exp and output (cuDNN's: its stats) */
static void attention_backward(dt_gpu_lm *m, float *dqkv, const float *dout, const float *qkv, int l, int k) {
    const dt_program_op *o = &m->v.ops[k];
    const float *st = m->stats[l * m->v.nops + k];
    if (m->cudnn)
        dt_gpu_attention_backward_cudnn(m->g, dqkv, dout, m->val[l * m->v.nvalues + o->s.out], qkv, st, m->B, m->T, o->width_out, m->NH,
                                        m->work16);
    else if (m->lse)
        dt_gpu_attention_backward_lse(m->g, dqkv, m->scratch, dout, m->val[l * m->v.nvalues + o->s.out], qkv, st, m->B, m->T, o->width_out,
                                      m->NH);
    else dt_gpu_attention_backward(m->g, dqkv, m->scratch, dout, qkv, st, m->B, m->T, o->width_out, m->NH);
}

static void op_backward(dt_gpu_lm *m, int l, int k) {
    const dt_program_op *o = &m->v.ops[k];
    const dt_op_spec *s = &o->s;
    int BT = m->B * m->T;
    float *in = m->val[l * m->v.nvalues + s->in], *st = m->stats[l * m->v.nops + k];
    float *din = m->dval[s->in], *dout = m->dval[s->out];
    switch (s->kind) {
    case DT_OP_NORM: /* bf16: the CPU's block keeps its norms' inputs in 16 bits, so backward reads them rounded */
        if (m->v.rms) dt_gpu_rmsnorm_backward(m->g, din, dW(m, l, s->w), dout, in, W(m, l, s->w), st, BT, o->width_in, m->bf16);
        else dt_gpu_layernorm_backward(m->g, din, dW(m, l, s->w), dW(m, l, s->b), dout, in, W(m, l, s->w), st, st + BT, BT, o->width_in,
                                       m->bf16);
        break;
    case DT_OP_LINEAR: linear_backward(m, din, dout, in, bits_of(m, l, s->in), l, s->w, s->b, BT, o->width_in, o->width_out); break;
    case DT_OP_ATTENTION:
        if (!m->repack) {
            attention_backward(m, din, dout, in, l, k);
            break;
        }
        /* through the packed q|k|v: turned back, each K/V head's gradient the sum of its heads' */
        dt_gpu_zero(m->g, m->dpacked, (size_t)BT * 3 * o->width_out * sizeof(float));
        attention_backward(m, m->dpacked, dout, m->packed[l], l, k);
        for (int part = 0; m->v.rotary && part < 2; part++)
            dt_gpu_rope(m->g, m->dpacked + (size_t)part * o->width_out, m->inv_freq, BT, m->T, m->NH, m->hd, 3 * (size_t)o->width_out, 1);
        dt_gpu_attention_unpack(m->g, din, m->dpacked, BT, m->NH, m->KVH, m->hd);
        break;
    case DT_OP_GELU: dt_gpu_gelu_backward(m->g, din, in, dout, (size_t)BT * o->width_in); break;
    case DT_OP_SWIGLU: dt_gpu_swiglu_backward(m->g, din, in, dout, BT, o->width_out); break;
    case DT_OP_ADD:
        dt_gpu_accumulate(m->g, din, dout, (size_t)BT * o->width_out);
        dt_gpu_accumulate(m->g, m->dval[s->in2], dout, (size_t)BT * o->width_out);
        break;
    default: break;
    }
}

dt_status dt_gpu_lm_backward(dt_gpu_lm *m, float grad_scale) {
    size_t BT = (size_t)m->B * m->T, C = (size_t)m->C;
    float *x = m->stream + (size_t)m->L * BT * C, *dres = m->dres[DT_V_OUT];
    bool on = tracing(m);
    mark(m, on, 0);
    dt_gpu_zero(m->g, m->dlnf, BT * C * sizeof(float));
    if (m->bf16) { /* the scale over the scored tokens and the engine's one multiplier, as the CPU's head_backward */
        dt_gpu_crossentropy_backward_bf16(m->g, m->work16, m->logits, m->ce_stats, m->tgt, (int)BT, m->V, m->Vp,
                                          (float)(grad_scale / m->scored));
        dt_gpu_matmul_backward_bf16_from(m->g, m->dlnf, m->grads + m->o_head, m->work16, m->lnf, m->lnf16, m->params16 + m->o_head, (int)BT,
                                         m->C, m->Vp, m->work16, m->work);
    } else {
        if (grad_scale != 1.0f) dt_gpu_scale(m->g, m->logits, BT * m->Vp, grad_scale); /* forward made d(loss)/d(logits) */
        linear_backward(m, m->dlnf, m->logits, m->lnf, NULL, -1, 0, -1, (int)BT, m->C, m->Vp);
    }
    dt_gpu_zero(m->g, dres, BT * C * sizeof(float));
    if (m->v.rms) dt_gpu_rmsnorm_backward(m->g, dres, m->grads + m->o_lnfw, m->dlnf, x, m->params + m->o_lnfw, m->lnf_stats, (int)BT, m->C, 0);
    else dt_gpu_layernorm_backward(m->g, dres, m->grads + m->o_lnfw, m->grads + m->lnfb->offset, m->dlnf, x, m->params + m->o_lnfw,
                                   m->lnf_stats, m->lnf_stats + BT, (int)BT, m->C, 0);
    mark(m, on, 1);
    for (int l = m->L - 1; l >= 0; l--) {
        m->dval[DT_V_OUT] = dres;
        m->dval[DT_V_IN] = dres == m->dres[0] ? m->dres[1] : m->dres[0];
        for (int v = 0; v < m->v.nvalues; v++)
            if (v != DT_V_OUT) dt_gpu_zero(m->g, m->dval[v], BT * m->v.value_width[v] * sizeof(float));
        for (int k = m->v.nops - 1; k >= 0; k--) op_backward(m, l, k);
        dres = m->dval[DT_V_IN];
        mark(m, on, m->L - l + 1);
    }
    m->dval[DT_V_IN] = m->dval[DT_V_OUT] = NULL;
    dt_gpu_embedding_backward(m->g, m->grads + m->o_wte, m->wpe ? m->grads + m->wpe->offset : NULL, dres, m->tok, m->B, m->T, m->C);
    mark(m, on, m->L + 2);
    dt_status st = dt_gpu_sync(m->g);
    if (!st && on) trace_pass(m, "backward", m->L + 2, true);
    return st;
}

dt_status dt_gpu_lm_step(dt_gpu_lm *m, const dt_optim_config *c, float lr, float clip, int skip_nonfinite, double *norm, int *skipped) {
    double ss = 0, t0 = dt_time_now();
    bool on = dt_trace_on();
    mark(m, on, 0);
    dt_gpu_zero(m->g, m->ss, sizeof(double));
    dt_gpu_sumsq(m->g, m->grads, m->n, m->ss);
    dt_status st = dt_gpu_download(m->g, &ss, m->ss, sizeof ss);
    if (!st) st = dt_gpu_sync(m->g);
    if (st) return st;
    *norm = sqrt(ss);
    *skipped = skip_nonfinite && !isfinite(*norm);
    if (!*skipped) {
        /* dt_optim_step_clipped's: the gradients scaled to the clip's norm, then dt_optim's coefficients in its float arithmetic */
        float f = clip > 0 && clip / (*norm + 1e-6) < 1 ? (float)(clip / (*norm + 1e-6)) : 1.0f;
        m->step++;
        float bc1 = 1.0f - powf(c->beta1, (float)m->step), bc2 = 1.0f - powf(c->beta2, (float)m->step);
        dt_gpu_adamw(m->g, m->params, m->grads, f, m->m, m->vv, m->n, c->beta1, c->beta2, c->eps, 1.0f - lr * c->weight_decay, lr / bc1,
                     sqrtf(bc2));
        refresh_lp(m);
    }
    dt_gpu_zero(m->g, m->grads, m->n * sizeof(float));
    mark(m, on, 1);
    st = dt_gpu_sync(m->g);
    double ms = on && !st ? dt_gpu_elapsed_ms(m->g, 0, 1) : -1, now = dt_time_now();
    if (ms >= 0) dt_trace_span(DT_TRACK_DEVICE, "optimizer", now - ms / 1e3 > t0 ? now - ms / 1e3 : t0, now);
    return st;
}

dt_status dt_gpu_lm_state(dt_gpu_lm *m, float *params, float *m1, float *m2, long *steps, int to_host) {
    float *dev[3] = { m->params, m->m, m->vv }, *host[3] = { params, m1, m2 };
    dt_status st = DT_OK;
    for (int i = 0; i < 3 && !st; i++)
        if (host[i])
            st = to_host ? dt_gpu_download(m->g, host[i], dev[i], m->n * sizeof(float)) : dt_gpu_upload(m->g, dev[i], host[i], m->n * sizeof(float));
    if (!st && !to_host && params) refresh_lp(m);
    if (to_host) *steps = m->step;
    else m->step = *steps;
    return st;
}

dt_status dt_gpu_lm_grads(dt_gpu_lm *m, float *host, int to_host) {
    size_t bytes = m->n * sizeof(float);
    if (host != m->staged) { /* the buffer gradients are staged through every step: page-locked once (twice the bus's rate) */
        if (m->staged_pinned) dt_gpu_host_pin(m->g, m->staged, bytes, 0);
        m->staged = host, m->staged_pinned = dt_gpu_host_pin(m->g, host, bytes, 1);
    }
    return to_host ? dt_gpu_download(m->g, host, m->grads, bytes) : dt_gpu_upload(m->g, m->grads, host, bytes);
}

dt_status dt_gpu_lm_grads_nccl(dt_gpu_lm *m, dt_gpu_nccl *c) {
    dt_gpu_nccl_allreduce(m->g, c, m->grads, m->n, 1);
    return dt_gpu_sync(m->g);
}

dt_gpu *dt_gpu_lm_gpu(const dt_gpu_lm *m) { return m->g; }

int dt_gpu_lm_flash(const dt_gpu_lm *m) { return m->lse; }

static dt_status device_forward(void *ctx, const int32_t *inputs, const int32_t *targets, int B, int T, double loss_tokens, float *loss) {
    dt_gpu_lm *m = ctx;
    if (B != m->B || T != m->T)
        return dt_error(DT_ERR_ARG, "--device cuda: a batch of %d x %d tokens; the GPU's model was made for %d x %d", B, T, m->B, m->T);
    return dt_gpu_lm_forward(m, inputs, targets, loss_tokens, loss);
}

static dt_status device_backward(void *ctx, float grad_scale) { return dt_gpu_lm_backward(ctx, grad_scale); }

void dt_gpu_lm_device(dt_gpu_lm *m, dt_program_device *out) { *out = (dt_program_device){ device_forward, device_backward, m }; }
