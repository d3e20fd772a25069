/* A multilayer perceptron: Linear layers with ReLU (or tanh) between them,
 * and softmax cross-entropy on the last for image classification (or the
 * outputs alone, for a policy's heads whose loss is its algorithm's). Parameters in one
 * flat store (layer by layer: weight [out, in] then bias [out], PyTorch's
 * nn.Linear layout), gradients in a second, as for GPT-2, so that the same
 * optimizers and data parallelism apply. */
#include "dtrain/kernels.h"
#include "dtrain/model.h"

#include <lapacke.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 16

struct dt_mlp {
    int n;                      /* Linear layers */
    int size[MAX_LAYERS + 1];   /* size[0] inputs .. size[n] classes */
    size_t woff[MAX_LAYERS], boff[MAX_LAYERS], nparams;
    dt_tensor_info tab[2 * MAX_LAYERS]; /* per layer: weight, bias */
    float *params, *grads, *own_grads, *own_params;
    float *acts;                /* per layer: pre-activation [B, out], then ReLU output [B, out] */
    size_t act_off[MAX_LAYERS][2], nacts;
    float *dbuf[3];             /* d input of layers (alternating), d pre-activation */
    float *losses;
    const float *x;             /* the last forward's inputs (not copied) */
    int32_t *labels;
    int B, cap_B;
    dt_mlp_activation act;
    dt_hook_list grad_hooks;
    dt_linear_observer observer; /* shown each layer's input and its output's gradient */
    void *observer_ctx;
};

dt_status dt_mlp_create(const int *sizes, int nsizes, dt_mlp **out) {
    *out = NULL;
    if (nsizes < 2 || nsizes > MAX_LAYERS + 1) return dt_error(DT_ERR_ARG, "mlp: %d sizes (expected 2..%d)", nsizes, MAX_LAYERS + 1);
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] < 1 || sizes[i] > (1 << 20)) return dt_error(DT_ERR_ARG, "mlp: layer size %d is out of range", sizes[i]);
    dt_mlp *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "mlp: out of memory");
    m->n = nsizes - 1;
    memcpy(m->size, sizes, sizeof(int) * (size_t)nsizes);
    for (int l = 0; l < m->n; l++) {
        m->woff[l] = m->nparams;
        m->nparams += (size_t)sizes[l + 1] * sizes[l];
        m->boff[l] = m->nparams;
        m->nparams += (size_t)sizes[l + 1];
        for (int b = 0; b < 2; b++) {
            dt_tensor_info *t = &m->tab[2 * l + b];
            snprintf(t->name, sizeof t->name, "layer.%d.%s", l, b ? "bias" : "weight");
            snprintf(t->hf, sizeof t->hf, "%d.%s", 2 * l, b ? "bias" : "weight"); /* nn.Sequential(Linear, ReLU, ...) */
            t->unit = t->grad_unit = l;
            t->ndim = b ? 1 : 2;
            t->shape[0] = sizes[l + 1];
            t->shape[1] = b ? 0 : sizes[l];
            t->offset = b ? m->boff[l] : m->woff[l];
            t->count = b ? (size_t)sizes[l + 1] : (size_t)sizes[l + 1] * sizes[l];
            /* Megatron's pairing: column-parallel, then row-parallel (whose bias is whole) */
            t->split = l % 2 == 0 ? DT_SPLIT_COLUMN : b ? DT_SPLIT_NONE : DT_SPLIT_ROW;
            dt_tensor_set_whole(t);
        }
    }
    m->params = m->own_params = dt_alloc_aligned(m->nparams * sizeof(float));
    m->own_grads = m->grads = dt_alloc_zeroed(m->nparams * sizeof(float));
    if (!m->params || !m->grads) { dt_mlp_destroy(m); return dt_error(DT_ERR_NOMEM, "mlp: out of memory"); }
    memset(m->params, 0, m->nparams * sizeof(float));
    *out = m;
    return DT_OK;
}

static void free_acts(dt_mlp *m) {
    dt_free_aligned(m->acts);
    dt_free_aligned(m->dbuf[0]);
    dt_free_aligned(m->dbuf[1]);
    dt_free_aligned(m->dbuf[2]);
    free(m->losses);
    free(m->labels);
    m->acts = m->dbuf[0] = m->dbuf[1] = m->dbuf[2] = m->losses = NULL;
    m->labels = NULL;
}

void dt_mlp_destroy(dt_mlp *m) {
    if (!m) return;
    free_acts(m);
    dt_free_aligned(m->own_params);
    dt_free_zeroed(m->own_grads);
    free(m);
}

/* nn.Linear's default: weight and bias uniform in +-1/sqrt(fan_in). */
void dt_mlp_init_random(dt_mlp *m, uint64_t seed) {
    uint64_t s = seed ? seed : 1;
    for (int l = 0; l < m->n; l++) {
        float bound = 1.0f / sqrtf((float)m->size[l]);
        size_t nw = (size_t)m->size[l + 1] * m->size[l];
        for (size_t i = 0; i < nw + (size_t)m->size[l + 1]; i++) {
            float u = dt_rng_uniform(&s);
            m->params[m->woff[l] + i] = (2 * u - 1) * bound; /* bias follows weight in the store */
        }
    }
}

/* As torch.nn.init.orthogonal_: QR of a normal [rows, cols] matrix (its transpose when it is wide), Q's columns
 * signed by R's diagonal. */
dt_status dt_mlp_init_orthogonal(dt_mlp *m, uint64_t seed, const float *gain) {
    uint64_t s = seed ? seed : 1;
    for (int l = 0; l < m->n; l++) {
        int rows = m->size[l + 1], cols = m->size[l], tall = rows >= cols;
        int M = tall ? rows : cols, N = tall ? cols : rows; /* Q is M x N, column-major */
        float *a = malloc(sizeof(float) * (size_t)M * N), *tau = malloc(sizeof(float) * (size_t)N), *d = malloc(sizeof(float) * (size_t)N);
        if (!a || !tau || !d) { free(a); free(tau); free(d); return dt_error(DT_ERR_NOMEM, "mlp: out of memory"); }
        for (size_t i = 0; i < (size_t)M * N; i++) a[i] = dt_rng_normal(&s);
        int info = LAPACKE_sgeqrf(LAPACK_COL_MAJOR, M, N, a, M, tau);
        for (int j = 0; j < N; j++) d[j] = a[(size_t)j * M + j] < 0 ? -1.0f : 1.0f;
        if (!info) info = LAPACKE_sorgqr(LAPACK_COL_MAJOR, M, N, N, a, M, tau);
        float *w = m->params + m->woff[l];
        for (int i = 0; !info && i < M; i++)
            for (int j = 0; j < N; j++) {
                float v = a[(size_t)j * M + i] * d[j] * gain[l];
                if (tall) w[(size_t)i * cols + j] = v; /* weight [rows, cols] = Q */
                else w[(size_t)j * cols + i] = v;      /* = Q^T */
            }
        memset(m->params + m->boff[l], 0, sizeof(float) * (size_t)rows);
        free(a);
        free(tau);
        free(d);
        if (info) return dt_error(DT_ERR_NUMERIC, "mlp: orthogonal initialisation of layer %d: LAPACK info %d", l, info);
    }
    return DT_OK;
}

void dt_mlp_set_activation(dt_mlp *m, dt_mlp_activation a) { m->act = a; }

int dt_mlp_num_layers(const dt_mlp *m) { return m->n; }
size_t dt_mlp_num_params(const dt_mlp *m) { return m->nparams; }
float *dt_mlp_params(dt_mlp *m) { return m->params; }
float *dt_mlp_grads(dt_mlp *m) { return m->grads; }

void dt_mlp_layer(const dt_mlp *m, int l, size_t *w_off, size_t *b_off, int *in, int *out) {
    if (w_off) *w_off = m->woff[l];
    if (b_off) *b_off = m->boff[l];
    if (in) *in = m->size[l];
    if (out) *out = m->size[l + 1];
}

void dt_mlp_set_grad_storage(dt_mlp *m, float *grads) {
    m->grads = dt_model_grad_storage(m->own_grads, m->grads, grads, m->nparams);
}

void dt_mlp_set_param_storage(dt_mlp *m, float *params) {
    m->params = dt_model_param_storage(m->own_params, m->params, params, m->nparams);
}

void dt_mlp_set_grad_hook(dt_mlp *m, dt_unit_hook hook, void *ctx) {
    if (dt_hook_list_set(&m->grad_hooks, hook, NULL, ctx)) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
}

static dt_status reserve(dt_mlp *m, int B) {
    if (B <= m->cap_B) return DT_OK;
    free_acts(m);
    size_t widest = 0;
    m->nacts = 0;
    for (int l = 0; l < m->n; l++) {
        size_t o = (size_t)B * m->size[l + 1];
        m->act_off[l][0] = m->nacts;
        m->act_off[l][1] = m->nacts + o;
        m->nacts += 2 * o;
        if ((size_t)m->size[l + 1] > widest) widest = (size_t)m->size[l + 1];
        if ((size_t)m->size[l] > widest) widest = (size_t)m->size[l];
    }
    m->acts = dt_alloc_aligned(m->nacts * sizeof(float));
    m->dbuf[0] = dt_alloc_aligned((size_t)B * widest * sizeof(float));
    m->dbuf[1] = dt_alloc_aligned((size_t)B * widest * sizeof(float));
    m->dbuf[2] = dt_alloc_aligned((size_t)B * widest * sizeof(float));
    m->losses = malloc((size_t)B * sizeof(float));
    m->labels = malloc((size_t)B * sizeof(int32_t));
    if (!m->acts || !m->dbuf[0] || !m->dbuf[1] || !m->dbuf[2] || !m->losses || !m->labels) {
        free_acts(m);
        m->cap_B = 0;
        return dt_error(DT_ERR_NOMEM, "mlp: out of memory for a batch of %d", B);
    }
    m->cap_B = B;
    return DT_OK;
}

/* The observer shown layer l's input (forward) or its output's gradient (backward), B rows. */
static void observe(const dt_mlp *m, int l, int backward, const float *x) {
    if (!m->observer) return;
    dt_linear_event e = { .layer = l, .backward = backward, .weight = &m->tab[2 * l], .rows = (size_t)m->B,
                          .width = m->size[l + backward], .values = x, .pieces = 1, .spatial = 1 };
    m->observer(m->observer_ctx, &e);
}

dt_status dt_mlp_forward(dt_mlp *m, const float *x, const int32_t *labels, int B, float *loss, int *correct) {
    if (B < 1) return dt_error(DT_ERR_ARG, "mlp: batch %d", B);
    dt_status st = reserve(m, B);
    if (st) return st;
    int K = m->size[m->n];
    if (labels)
        for (int i = 0; i < B; i++)
            if (labels[i] < 0 || labels[i] >= K) return dt_error(DT_ERR_ARG, "mlp: label %d of sample %d is not in 0..%d", labels[i], i, K - 1);
    m->x = x;
    m->B = B;
    const float *in = x;
    for (int l = 0; l < m->n; l++) {
        float *pre = m->acts + m->act_off[l][0], *post = m->acts + m->act_off[l][1];
        dt_matmul_forward(pre, in, m->params + m->woff[l], m->params + m->boff[l], B, m->size[l], m->size[l + 1]);
        observe(m, l, 0, in);
        if (l + 1 < m->n && m->act == DT_MLP_TANH)
            dt_tanh_rows(post, pre, B, m->size[l + 1]);
        else if (l + 1 < m->n) dt_relu_forward(post, pre, (size_t)B * m->size[l + 1]);
        in = post;
    }
    const float *logits = m->acts + m->act_off[m->n - 1][0];
    if (correct) {
        int c = 0;
        for (int i = 0; labels && i < B; i++) {
            const float *r = logits + (size_t)i * K;
            int best = 0;
            for (int k = 1; k < K; k++) if (r[k] > r[best]) best = k;
            c += best == labels[i];
        }
        *correct = c;
    }
    if (labels) {
        memcpy(m->labels, labels, (size_t)B * sizeof(int32_t));
        float mean = dt_crossentropy_forward(m->losses, NULL, logits, labels, B, K, K);
        if (loss) *loss = mean;
    }
    return DT_OK;
}

const float *dt_mlp_logits(const dt_mlp *m) { return m->acts ? m->acts + m->act_off[m->n - 1][0] : NULL; }

/* Backward through every layer from dout = d loss / d outputs. */
static void backward_layers(dt_mlp *m, const float *dout) {
    int B = m->B;
    for (int l = m->n - 1; l >= 0; l--) {
        const float *in = l ? m->acts + m->act_off[l - 1][1] : m->x;
        float *din = l ? m->dbuf[l & 1] : NULL;
        if (din) memset(din, 0, (size_t)B * m->size[l] * sizeof(float));
        dt_matmul_backward(din, m->grads + m->woff[l], m->grads + m->boff[l], dout, in, m->params + m->woff[l], B,
                           m->size[l], m->size[l + 1]);
        observe(m, l, 1, dout);
        dt_hook_list_call(&m->grad_hooks, DT_HOOK_GRADS_READY, l);
        if (!l) break;
        /* through the activation in front of this layer (the next din goes to the other buffer) */
        float *dpre = m->dbuf[2];
        size_t n = (size_t)B * m->size[l];
        if (m->act == DT_MLP_TANH) {
            const float *y = m->acts + m->act_off[l - 1][1];
            for (size_t i = 0; i < n; i++) dpre[i] = din[i] * (1 - y[i] * y[i]);
        } else {
            memset(dpre, 0, n * sizeof(float));
            dt_relu_backward(dpre, m->acts + m->act_off[l - 1][0], din, n);
        }
        dout = dpre;
    }
    m->B = 0;
}

dt_status dt_mlp_backward(dt_mlp *m, float grad_scale) {
    if (!m->acts || !m->B) return dt_error(DT_ERR_ARG, "mlp backward: needs a forward with labels first");
    int B = m->B, K = m->size[m->n];
    float *logits = m->acts + m->act_off[m->n - 1][0];
    /* d(mean loss)/d logits, in place of the logits (which are then their gradient) */
    dt_crossentropy_fused(logits, m->losses, m->labels, B, K, K, grad_scale / (float)B, DT_F32);
    backward_layers(m, logits);
    return DT_OK;
}

dt_status dt_mlp_backward_outputs(dt_mlp *m, const float *dout) {
    if (!m->acts || !m->B) return dt_error(DT_ERR_ARG, "mlp backward: needs a forward first");
    backward_layers(m, dout);
    return DT_OK;
}

void dt_mlp_zero_grad(dt_mlp *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

const dt_tensor_info *dt_mlp_tensors(const dt_mlp *m, int *n) {
    if (n) *n = 2 * m->n;
    return m->tab;
}

void dt_mlp_set_linear_observer(dt_mlp *m, dt_linear_observer fn, void *ctx) {
    m->observer = fn;
    m->observer_ctx = ctx;
}

dt_status dt_mlp_linears(const dt_mlp *m, dt_linear_layer **out, int *n) {
    if (!(*out = calloc((size_t)m->n, sizeof **out))) return dt_error(DT_ERR_NOMEM, "mlp: out of memory");
    for (int l = 0; l < m->n; l++)
        (*out)[l] = (dt_linear_layer){ .layer = l, .in = m->size[l], .nparts = 1, .w = { &m->tab[2 * l] }, .b = { &m->tab[2 * l + 1] } };
    *n = m->n;
    return DT_OK;
}

static dt_status v_linears(void *m, dt_linear_layer **out, int *n) { return dt_mlp_linears(m, out, n); }
static void v_observer(void *m, dt_linear_observer fn, void *ctx) { dt_mlp_set_linear_observer(m, fn, ctx); }
static float *v_params(void *m) { return dt_mlp_params(m); }
static float *v_grads(void *m) { return dt_mlp_grads(m); }
static void v_storage(void *m, float *g) { dt_mlp_set_grad_storage(m, g); }
static void v_hook(void *m, dt_unit_hook h, void *ctx) { dt_mlp_set_grad_hook(m, h, ctx); }
static void v_param_storage(void *m, float *p) { dt_mlp_set_param_storage(m, p); }

void dt_mlp_model(dt_mlp *m, dt_model *out) {
    *out = (dt_model){ .self = m, .kind = "mlp", .tensors = m->tab, .ntensors = 2 * m->n, .nunits = m->n, .nparams = m->nparams,
                       .params = v_params, .grads = v_grads, .set_grad_storage = v_storage, .set_grad_hook = v_hook,
                       .set_param_storage = v_param_storage, .global_params = m->nparams, .linears = v_linears,
                       .set_linear_observer = v_observer };
}
