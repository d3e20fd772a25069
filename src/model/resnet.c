/* ResNets as torchvision defines them (resnet18, resnet34: basic blocks;
 * resnet50: bottlenecks, stride on the 3x3 as torchvision's v1.5), and a
 * small one for 28x28 images: the same layer names, shapes and order, so a
 * torchvision state dict maps onto the table entry by entry.
 *
 * The network is built once as a tape of operations (convolution,
 * BatchNorm, ReLU, max pooling, residual add, global average pooling, the
 * linear head), each reading activation slots and writing one; forward runs
 * the tape, backward runs it in reverse, each operation adding into the
 * gradients of what it read. Units for the engine: the stem, each block,
 * the head; a unit's gradients are final once backward has gone through
 * its first operation. BatchNorm's running averages are buffers beside the
 * parameters (not trained, not averaged as gradients).
 *
 * Memory, as torchvision's modules use it: ReLU and the residual add write
 * over their input (BatchNorm's backward reads its input, not its output,
 * and ReLU's backward needs only where its output is 0), so a block keeps
 * each convolution's output and each BatchNorm's. A gradient slot lives
 * only from its first reader in backward to the op that wrote the slot;
 * slots whose lives do not overlap share a buffer (`plan_grads`). */
#include "dtrain/kernels.h"
#include "dtrain/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OP_CONV, OP_BN, OP_RELU, OP_MAXPOOL, OP_ADD, OP_AVGPOOL, OP_FC } op_kind;

typedef struct {
    op_kind kind;
    int in, in2, out;        /* activation slots (in2: the residual add's other input) */
    int unit;
    int tensor;              /* its first table entry (conv: weight; bn, fc: weight, then bias) */
    int buffer;              /* bn: its running mean's offset in the buffers (the variance follows) */
    int K, stride, pad, OC;  /* conv, maxpool */
    float *mean, *rstd;      /* bn: the batch's, kept for backward */
    int32_t *idx;            /* maxpool: each output's pixel */
} op;

typedef struct { int C, H, W; } shape;

#define MAX_OPS 256
#define MAX_TENSORS 256

struct dt_resnet {
    dt_resnet_config cfg;
    op ops[MAX_OPS];
    int nops;
    shape slot[MAX_OPS + 1]; /* slot 0: the images */
    int nslots;
    dt_tensor_info tab[MAX_TENSORS];
    int ntab, nunits;
    size_t nparams, nbuffers;
    float *params, *grads, *own_params, *own_grads, *buffers;
    char buffer_names[MAX_TENSORS / 2][48];
    int nbn;
    /* per batch */
    int B, cap_B;
    float *act[MAX_OPS + 1], *dact[MAX_OPS + 1];
    /* gradient buffers: slot s's is dbuf[grad_buf[s]] (-1: the images, none),
     * needed from backward's op grad_born[s] (nops: the loss) down to grad_dies[s] */
    int grad_buf[MAX_OPS + 1], grad_born[MAX_OPS + 1], grad_dies[MAX_OPS + 1];
    size_t dbuf_floats[MAX_OPS + 1]; /* per image */
    float *dbuf[MAX_OPS + 1];
    int ndbuf;
    float *work, *losses;
    size_t nwork;
    int32_t *labels;
    bool train, have_labels;
    dt_hook_list grad_hooks;
    dt_bn_reduce bn_reduce;
    void *bn_ctx;
    dt_linear_observer observer; /* shown the convolutions' patches and the head's input, and their outputs' gradients */
    void *observer_ctx;
};

/* ---- building the tape ---- */

static int new_slot(dt_resnet *m, int C, int H, int W) {
    m->slot[m->nslots] = (shape){ C, H, W };
    return m->nslots++;
}

static int add_tensor(dt_resnet *m, const char *name, int unit, int ndim, int s0, int s1, int s2, int s3) {
    dt_tensor_info *t = &m->tab[m->ntab];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->hf, sizeof t->hf, "%s", name);
    t->unit = t->grad_unit = unit;
    t->ndim = ndim;
    int s[4] = { s0, s1, s2, s3 };
    t->count = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = s[i], t->count *= (size_t)s[i];
    t->offset = m->nparams;
    dt_tensor_set_whole(t);
    m->nparams += t->count;
    return m->ntab++;
}

static op *add_op(dt_resnet *m, op_kind k, int in, int unit) {
    op *o = &m->ops[m->nops++];
    memset(o, 0, sizeof *o);
    o->kind = k;
    o->in = in;
    o->in2 = -1;
    o->unit = unit;
    return o;
}

static int conv(dt_resnet *m, const char *name, int in, int OC, int K, int stride, int pad, int unit) {
    char n[48];
    snprintf(n, sizeof n, "%s.weight", name);
    shape s = m->slot[in];
    op *o = add_op(m, OP_CONV, in, unit);
    o->tensor = add_tensor(m, n, unit, 4, OC, s.C, K, K);
    o->K = K, o->stride = stride, o->pad = pad, o->OC = OC;
    return o->out = new_slot(m, OC, (s.H + 2 * pad - K) / stride + 1, (s.W + 2 * pad - K) / stride + 1);
}

static int bn(dt_resnet *m, const char *name, int in, int unit) {
    char n[48];
    int C = m->slot[in].C;
    op *o = add_op(m, OP_BN, in, unit);
    snprintf(n, sizeof n, "%s.weight", name);
    o->tensor = add_tensor(m, n, unit, 1, C, 0, 0, 0);
    snprintf(n, sizeof n, "%s.bias", name);
    add_tensor(m, n, unit, 1, C, 0, 0, 0);
    o->buffer = (int)m->nbuffers;
    snprintf(m->buffer_names[m->nbn++], sizeof m->buffer_names[0], "%s", name);
    m->nbuffers += 2 * (size_t)C;
    return o->out = new_slot(m, C, m->slot[in].H, m->slot[in].W);
}

/* In place: every ReLU here follows a BatchNorm or an add, whose output nothing else reads. */
static int relu(dt_resnet *m, int in, int unit) {
    return add_op(m, OP_RELU, in, unit)->out = in;
}

/* In place, into a (a BatchNorm's output), as torchvision's `out += identity`. */
static int add(dt_resnet *m, int a, int b, int unit) {
    op *o = add_op(m, OP_ADD, a, unit);
    o->in2 = b;
    return o->out = a;
}

/* Which slots' gradients can share a buffer. Backward goes from the loss
 * (step nops) down to op 0; op i adds into the gradients of what it reads
 * and reads its output's. So slot s's gradient is needed from the highest
 * op that reads s down to the lowest that writes it (in-place ops write a
 * slot more than once). Buffers are handed out at birth (best fit among the
 * free ones, else the largest free one grown, else a new one) and freed
 * after the step the slot dies at, once that op has read it. */
static void plan_grads(dt_resnet *m) {
    int last = m->nslots - 1, owner[MAX_OPS + 1];
    for (int s = 0; s < m->nslots; s++) m->grad_born[s] = -1, m->grad_dies[s] = m->nops, m->grad_buf[s] = -1;
    for (int i = 0; i < m->nops; i++) {
        op *o = &m->ops[i];
        if (o->in > 0 && m->grad_born[o->in] < i) m->grad_born[o->in] = i;
        if (o->in2 > 0 && m->grad_born[o->in2] < i) m->grad_born[o->in2] = i;
        if (m->grad_dies[o->out] > i) m->grad_dies[o->out] = i;
    }
    m->grad_born[last] = m->nops;
    m->ndbuf = 0;
    for (int t = m->nops; t >= 0; t--) {
        for (int s = 1; s < m->nslots; s++) {
            if (m->grad_born[s] != t) continue;
            size_t need = (size_t)m->slot[s].C * m->slot[s].H * m->slot[s].W;
            int best = -1, largest = -1;
            for (int k = 0; k < m->ndbuf; k++) {
                if (owner[k] >= 0) continue;
                if (m->dbuf_floats[k] >= need && (best < 0 || m->dbuf_floats[k] < m->dbuf_floats[best])) best = k;
                if (largest < 0 || m->dbuf_floats[k] > m->dbuf_floats[largest]) largest = k;
            }
            if (best < 0) best = largest;
            if (best < 0) best = m->ndbuf++, m->dbuf_floats[best] = 0;
            if (m->dbuf_floats[best] < need) m->dbuf_floats[best] = need;
            owner[best] = s;
            m->grad_buf[s] = best;
        }
        for (int s = 1; s < m->nslots; s++)
            if (m->grad_born[s] >= 0 && m->grad_dies[s] == t) owner[m->grad_buf[s]] = -1;
    }
}

/* torchvision's BasicBlock: conv3x3-bn-relu-conv3x3-bn, + identity (or
 * the downsampling 1x1 conv and bn), relu. */
static int basic_block(dt_resnet *m, const char *name, int in, int planes, int stride, int unit) {
    char n[48];
    snprintf(n, sizeof n, "%s.conv1", name);
    int x = conv(m, n, in, planes, 3, stride, 1, unit);
    snprintf(n, sizeof n, "%s.bn1", name);
    x = relu(m, bn(m, n, x, unit), unit);
    snprintf(n, sizeof n, "%s.conv2", name);
    x = conv(m, n, x, planes, 3, 1, 1, unit);
    snprintf(n, sizeof n, "%s.bn2", name);
    x = bn(m, n, x, unit);
    int id = in;
    if (stride != 1 || m->slot[in].C != planes) {
        snprintf(n, sizeof n, "%s.downsample.0", name);
        id = conv(m, n, in, planes, 1, stride, 0, unit);
        snprintf(n, sizeof n, "%s.downsample.1", name);
        id = bn(m, n, id, unit);
    }
    return relu(m, add(m, x, id, unit), unit);
}

/* torchvision's Bottleneck (v1.5): 1x1 to planes, 3x3 with the stride, 1x1 to 4 planes. */
static int bottleneck(dt_resnet *m, const char *name, int in, int planes, int stride, int unit) {
    char n[48];
    const char *part[3][2] = { { "conv1", "bn1" }, { "conv2", "bn2" }, { "conv3", "bn3" } };
    int x = in;
    for (int i = 0; i < 3; i++) {
        snprintf(n, sizeof n, "%s.%s", name, part[i][0]);
        x = conv(m, n, x, i == 2 ? 4 * planes : planes, i == 1 ? 3 : 1, i == 1 ? stride : 1, i == 1, unit);
        snprintf(n, sizeof n, "%s.%s", name, part[i][1]);
        x = bn(m, n, x, unit);
        if (i < 2) x = relu(m, x, unit);
    }
    int id = in;
    if (stride != 1 || m->slot[in].C != 4 * planes) {
        snprintf(n, sizeof n, "%s.downsample.0", name);
        id = conv(m, n, in, 4 * planes, 1, stride, 0, unit);
        snprintf(n, sizeof n, "%s.downsample.1", name);
        id = bn(m, n, id, unit);
    }
    return relu(m, add(m, x, id, unit), unit);
}

dt_status dt_resnet_config_parse(const char *spec, int channels, int height, int width, int classes, dt_resnet_config *out) {
    dt_resnet_config c = { .channels = channels, .height = height, .width = width, .classes = classes };
    if (!strcmp(spec, "resnet18")) c.depth = 18;
    else if (!strcmp(spec, "resnet34")) c.depth = 34;
    else if (!strcmp(spec, "resnet50")) c.depth = 50;
    else if (!strcmp(spec, "resnet:small")) c.depth = 0;
    else return dt_error(DT_ERR_ARG, "model %s: expected resnet18, resnet34, resnet50 or resnet:small", spec);
    if (channels < 1 || classes < 1 || height < 1 || width < 1)
        return dt_error(DT_ERR_ARG, "model %s: images %dx%dx%d and %d classes", spec, channels, height, width, classes);
    /* the stem and the strides must leave at least one pixel */
    int min = c.depth ? 32 : 4;
    if (height < min || width < min)
        return dt_error(DT_ERR_ARG, "model %s: images of %dx%d are too small (at least %dx%d: the strides would leave no pixel)",
                        spec, height, width, min, min);
    *out = c;
    return DT_OK;
}

/* The small one: a 3x3 stem without pooling, three stages of two basic blocks (16, 32, 64 channels). The last unit. */
static int small_trunk(dt_resnet *m, int *x) {
    int unit = 0;
    *x = relu(m, bn(m, "bn1", conv(m, "conv1", *x, 16, 3, 1, 1, unit), unit), unit);
    const int planes[3] = { 16, 32, 64 };
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < 2; b++) {
            char n[32];
            snprintf(n, sizeof n, "layer%d.%d", s + 1, b);
            *x = basic_block(m, n, *x, planes[s], b == 0 && s > 0 ? 2 : 1, ++unit);
        }
    return unit;
}

/* torchvision's ResNet-18, 34 and 50: a 7x7 stem and a max pool, four stages. The last unit. */
static int imagenet_trunk(dt_resnet *m, int *x) {
    int unit = 0;
    *x = relu(m, bn(m, "bn1", conv(m, "conv1", *x, 64, 7, 2, 3, unit), unit), unit);
    op *mp = add_op(m, OP_MAXPOOL, *x, unit);
    mp->K = 3, mp->stride = 2, mp->pad = 1;
    shape s = m->slot[*x];
    *x = mp->out = new_slot(m, s.C, (s.H + 2 - 3) / 2 + 1, (s.W + 2 - 3) / 2 + 1);
    const int d18[4] = { 2, 2, 2, 2 }, d34[4] = { 3, 4, 6, 3 };
    const int *blocks = m->cfg.depth == 18 ? d18 : d34;
    for (int st = 0; st < 4; st++)
        for (int b = 0; b < blocks[st]; b++) {
            char n[32];
            snprintf(n, sizeof n, "layer%d.%d", st + 1, b);
            int stride = b == 0 && st > 0 ? 2 : 1;
            *x = m->cfg.depth == 50 ? bottleneck(m, n, *x, 64 << st, stride, ++unit) : basic_block(m, n, *x, 64 << st, stride, ++unit);
        }
    return unit;
}

/* The parameters, gradients, running statistics and each norm's batch statistics (NULL params: out of memory). */
static void make_stores(dt_resnet *m) {
    plan_grads(m);
    m->params = m->own_params = dt_alloc_aligned(m->nparams * sizeof(float));
    m->grads = m->own_grads = dt_alloc_zeroed(m->nparams * sizeof(float));
    m->buffers = calloc(m->nbuffers + 1, sizeof(float));
    for (int i = 0; i < m->nops; i++)
        if (m->ops[i].kind == OP_BN) {
            int C = m->slot[m->ops[i].in].C;
            m->ops[i].mean = malloc(sizeof(float) * (size_t)C);
            m->ops[i].rstd = malloc(sizeof(float) * (size_t)C);
            if (!m->ops[i].mean || !m->ops[i].rstd) m->params = NULL;
        }
}

dt_status dt_resnet_create(const dt_resnet_config *cfg, dt_resnet **out) {
    *out = NULL;
    dt_resnet *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "resnet: out of memory");
    m->cfg = *cfg;
    int x = new_slot(m, cfg->channels, cfg->height, cfg->width);
    int unit = (cfg->depth == 0 ? small_trunk(m, &x) : imagenet_trunk(m, &x)) + 1;
    op *ap = add_op(m, OP_AVGPOOL, x, unit);
    x = ap->out = new_slot(m, m->slot[x].C, 1, 1);
    op *fc = add_op(m, OP_FC, x, unit);
    fc->OC = cfg->classes;
    fc->tensor = add_tensor(m, "fc.weight", unit, 2, cfg->classes, m->slot[x].C, 0, 0);
    add_tensor(m, "fc.bias", unit, 1, cfg->classes, 0, 0, 0);
    fc->out = new_slot(m, cfg->classes, 1, 1);
    m->nunits = unit + 1;
    make_stores(m);
    if (!m->params || !m->grads || !m->buffers) {
        dt_resnet_destroy(m);
        return dt_error(DT_ERR_NOMEM, "resnet: out of memory for %zu parameters", m->nparams);
    }
    dt_resnet_init_random(m, 1);
    *out = m;
    return DT_OK;
}

static void free_batch(dt_resnet *m) {
    for (int i = 0; i < m->nslots; i++) {
        dt_free_aligned(m->act[i]);
        m->act[i] = m->dact[i] = NULL;
    }
    for (int k = 0; k < m->ndbuf; k++) dt_free_aligned(m->dbuf[k]), m->dbuf[k] = NULL;
    for (int i = 0; i < m->nops; i++) free(m->ops[i].idx), m->ops[i].idx = NULL;
    dt_free_aligned(m->work);
    free(m->losses);
    free(m->labels);
    m->work = NULL, m->losses = NULL, m->labels = NULL;
    m->cap_B = 0;
}

void dt_resnet_destroy(dt_resnet *m) {
    if (!m) return;
    free_batch(m);
    for (int i = 0; i < m->nops; i++) free(m->ops[i].mean), free(m->ops[i].rstd);
    dt_free_aligned(m->own_params);
    dt_free_zeroed(m->own_grads);
    free(m->buffers);
    free(m);
}

/* torchvision's initialisation from dtrain's generator, in table order:
 * convolutions N(0, 2 / (OC KH KW)) (kaiming_normal_, fan_out, relu);
 * BatchNorm weight 1, bias 0; the head as nn.Linear, uniform in
 * +-1/sqrt(in) (weight, then bias). Running mean 0, variance 1. */
void dt_resnet_init_random(dt_resnet *m, uint64_t seed) {
    uint64_t s = seed ? seed : 1;
    for (int i = 0; i < m->ntab; i++) {
        dt_tensor_info *t = &m->tab[i];
        float *p = m->params + t->offset;
        bool is_fc = !strncmp(t->name, "fc.", 3), is_bias = strstr(t->name, ".bias") != NULL;
        if (t->ndim == 4) {
            float sd = sqrtf(2.0f / (float)(t->shape[0] * t->shape[2] * t->shape[3]));
            for (size_t k = 0; k < t->count; k++) p[k] = dt_rng_normal(&s) * sd;
        } else if (is_fc) {
            float bound = 1.0f / sqrtf((float)m->tab[is_bias ? i - 1 : i].shape[1]);
            for (size_t k = 0; k < t->count; k++) p[k] = (2.0f * dt_rng_uniform(&s) - 1.0f) * bound;
        } else {
            for (size_t k = 0; k < t->count; k++) p[k] = is_bias ? 0.0f : 1.0f;
        }
    }
    for (int i = 0; i < m->nops; i++)
        if (m->ops[i].kind == OP_BN) {
            int C = m->slot[m->ops[i].in].C;
            for (int c = 0; c < C; c++) m->buffers[m->ops[i].buffer + c] = 0, m->buffers[m->ops[i].buffer + C + c] = 1;
        }
}

/* ---- running it ---- */

static size_t slot_floats(const dt_resnet *m, int i, int B) {
    return (size_t)B * m->slot[i].C * m->slot[i].H * m->slot[i].W;
}

static dt_status reserve(dt_resnet *m, int B) {
    if (B <= m->cap_B) return DT_OK;
    free_batch(m);
    bool ok = true;
    for (int i = 0; i < m->nslots && ok; i++) ok = (m->act[i] = dt_alloc_aligned(slot_floats(m, i, B) * sizeof(float))) != NULL;
    for (int k = 0; k < m->ndbuf && ok; k++) ok = (m->dbuf[k] = dt_alloc_aligned(m->dbuf_floats[k] * (size_t)B * sizeof(float))) != NULL;
    for (int i = 1; i < m->nslots && ok; i++) m->dact[i] = m->grad_buf[i] >= 0 ? m->dbuf[m->grad_buf[i]] : NULL;
    for (int i = 0; i < m->nops && ok; i++)
        if (m->ops[i].kind == OP_MAXPOOL) ok = (m->ops[i].idx = malloc(slot_floats(m, m->ops[i].out, B) * sizeof(int32_t))) != NULL;
    dt_resnet_batch_bytes(m, B, NULL, NULL, &m->nwork);
    m->nwork /= sizeof(float);
    if (ok) ok = (m->work = dt_alloc_aligned(m->nwork * sizeof(float))) && (m->losses = malloc(sizeof(float) * (size_t)B)) &&
                 (m->labels = malloc(sizeof(int32_t) * (size_t)B));
    if (!ok) {
        free_batch(m);
        return dt_error(DT_ERR_NOMEM, "resnet: out of memory for the activations of a batch of %d", B);
    }
    m->cap_B = B;
    return DT_OK;
}

static dt_conv_shape conv_shape(const dt_resnet *m, const op *o) {
    shape s = m->slot[o->in];
    return dt_conv_make(m->B, s.C, s.H, s.W, o->OC, o->K, o->stride, o->pad);
}

static float *P(dt_resnet *m, int t) { return m->params + m->tab[t].offset; }
static float *G(dt_resnet *m, int t) { return m->grads + m->tab[t].offset; }

/* BatchNorm's statistics: the batch's (summed over every rank's batch when
 * synchronised), the running averages updated; or the running ones. */
static dt_status bn_stats(dt_resnet *m, op *o) {
    shape s = m->slot[o->in];
    float *rm = m->buffers + o->buffer, *rv = rm + s.C;
    if (!m->train) {
        dt_batchnorm_eval_stats(o->mean, o->rstd, rm, rv, s.C, 1e-5f);
        return DT_OK;
    }
    double sums[2 * 2048 + 1];
    if (s.C > 2048) return dt_error(DT_ERR_ARG, "resnet: BatchNorm over %d channels (at most 2048)", s.C);
    double count = (double)m->B * s.H * s.W;
    dt_batchnorm_sums(sums, sums + s.C, m->act[o->in], m->B, s.C, s.H * s.W);
    sums[2 * s.C] = count;
    if (m->bn_reduce) {
        dt_status st = m->bn_reduce(sums, (size_t)2 * s.C + 1, m->bn_ctx);
        if (st) return st;
    }
    dt_batchnorm_stats(o->mean, o->rstd, rm, rv, sums, sums + s.C, sums[2 * s.C], s.C, 0.1f, 1e-5f);
    return DT_OK;
}

/* The observer shown op i's input (forward) or its output's gradient (backward): a convolution's image by image as
 * columns (forward: its patches, made again in m->work, which the convolution is done with), the head's whole. */
static void observe(dt_resnet *m, int i, int backward, const float *x) {
    const op *o = &m->ops[i];
    dt_linear_event e = { .layer = i, .backward = backward, .weight = &m->tab[o->tensor], .pieces = 1, .spatial = 1 };
    shape s = m->slot[o->in];
    if (o->kind == OP_FC) {
        e.rows = (size_t)m->B, e.width = backward ? o->OC : s.C, e.values = x;
        m->observer(m->observer_ctx, &e);
        return;
    }
    dt_conv_shape cs = conv_shape(m, o);
    int P = cs.OH * cs.OW;
    e.rows = (size_t)P, e.width = backward ? o->OC : s.C * o->K * o->K, e.pieces = m->B, e.by_column = 1, e.spatial = P;
    for (int n = 0; n < m->B; n++) {
        e.piece = n;
        e.values = backward ? x + (size_t)n * o->OC * P : dt_conv2d_columns(x + (size_t)n * s.C * s.H * s.W, &cs, m->work);
        m->observer(m->observer_ctx, &e);
    }
}

dt_status dt_resnet_forward(dt_resnet *m, const float *x, const int32_t *labels, int B, bool train, float *loss, int *correct) {
    if (B < 1) return dt_error(DT_ERR_ARG, "resnet: batch %d", B);
    int K = m->cfg.classes;
    for (int i = 0; labels && i < B; i++)
        if (labels[i] < 0 || labels[i] >= K) return dt_error(DT_ERR_ARG, "resnet: label %d of image %d is not in 0..%d", labels[i], i, K - 1);
    dt_status st = reserve(m, B);
    if (st) return st;
    m->B = B;
    m->train = train;
    memcpy(m->act[0], x, slot_floats(m, 0, B) * sizeof(float));
    for (int i = 0; i < m->nops && !st; i++) {
        op *o = &m->ops[i];
        shape s = m->slot[o->in];
        float *in = m->act[o->in], *out = m->act[o->out];
        size_t n = slot_floats(m, o->out, B);
        switch (o->kind) {
        case OP_CONV: {
            dt_conv_shape cs = conv_shape(m, o);
            dt_conv2d_forward(out, in, P(m, o->tensor), NULL, &cs, m->work);
            if (m->observer && train) observe(m, i, 0, in);
            break;
        }
        case OP_BN:
            if (!(st = bn_stats(m, o))) dt_batchnorm_forward(out, in, o->mean, o->rstd, P(m, o->tensor), P(m, o->tensor + 1), B, s.C, s.H * s.W);
            break;
        case OP_RELU: dt_relu_forward(out, in, n); break;
        case OP_MAXPOOL: dt_maxpool2d_forward(out, o->idx, in, B * s.C, s.H, s.W, o->K, o->stride, o->pad); break;
        case OP_ADD: dt_residual_forward(out, in, m->act[o->in2], n); break;
        case OP_AVGPOOL: dt_avgpool_global_forward(out, in, B * s.C, s.H * s.W); break;
        case OP_FC:
            dt_matmul_forward(out, in, P(m, o->tensor), P(m, o->tensor + 1), B, s.C, o->OC);
            if (m->observer && train) observe(m, i, 0, in);
            break;
        }
    }
    if (st) return st;
    const float *logits = m->act[m->nslots - 1];
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
    m->have_labels = labels != NULL;
    if (labels) {
        memcpy(m->labels, labels, sizeof(int32_t) * (size_t)B);
        float mean = dt_crossentropy_forward(m->losses, NULL, logits, labels, B, K, K);
        if (loss) *loss = mean;
    }
    return DT_OK;
}

const float *dt_resnet_logits(const dt_resnet *m) { return m->cap_B ? m->act[m->nslots - 1] : NULL; }

dt_status dt_resnet_backward(dt_resnet *m, float grad_scale) {
    if (!m->have_labels || !m->train) return dt_error(DT_ERR_ARG, "resnet backward: needs a training forward with labels first");
    m->have_labels = false; /* the logits become their gradient */
    int B = m->B, K = m->cfg.classes, last = m->nslots - 1;
    memcpy(m->dact[last], m->act[last], slot_floats(m, last, B) * sizeof(float));
    dt_crossentropy_fused(m->dact[last], m->losses, m->labels, B, K, K, grad_scale / (float)B, DT_F32);
    for (int i = m->nops - 1; i >= 0; i--) {
        op *o = &m->ops[i];
        for (int k = 1; k < last; k++) /* gradients first added into at this op */
            if (m->grad_born[k] == i) memset(m->dact[k], 0, slot_floats(m, k, B) * sizeof(float));
        shape s = m->slot[o->in];
        float *in = m->act[o->in], *din = o->in ? m->dact[o->in] : NULL, *dout = m->dact[o->out];
        size_t n = slot_floats(m, o->out, B);
        switch (o->kind) {
        case OP_CONV: {
            dt_conv_shape cs = conv_shape(m, o);
            dt_conv2d_backward(din, G(m, o->tensor), NULL, dout, in, P(m, o->tensor), &cs, m->work);
            if (m->observer) observe(m, i, 1, dout);
            break;
        }
        case OP_BN: {
            double sums[2 * 2048 + 1];
            float *gw = G(m, o->tensor), *gb = G(m, o->tensor + 1);
            dt_batchnorm_backward_sums(sums, sums + s.C, dout, in, o->mean, o->rstd, B, s.C, s.H * s.W);
            for (int c = 0; c < s.C; c++) gb[c] += (float)sums[c], gw[c] += (float)sums[s.C + c];
            sums[2 * s.C] = (double)B * s.H * s.W;
            if (m->bn_reduce) {
                dt_status st = m->bn_reduce(sums, (size_t)2 * s.C + 1, m->bn_ctx);
                if (st) return st;
            }
            dt_batchnorm_backward(din, dout, in, o->mean, o->rstd, P(m, o->tensor), sums, sums + s.C, sums[2 * s.C], B, s.C, s.H * s.W);
            break;
        }
        case OP_RELU: dt_relu_backward_inplace(dout, in, n); break; /* in is the output */
        case OP_MAXPOOL: dt_maxpool2d_backward(din, dout, o->idx, B * s.C, s.H, s.W, m->slot[o->out].H, m->slot[o->out].W); break;
        case OP_ADD: /* in place: a's gradient is dout itself; b's += dout */
            dt_residual_forward(m->dact[o->in2], m->dact[o->in2], dout, n);
            break;
        case OP_AVGPOOL: dt_avgpool_global_backward(din, dout, B * s.C, s.H * s.W); break;
        case OP_FC:
            dt_matmul_backward(din, G(m, o->tensor), G(m, o->tensor + 1), dout, in, P(m, o->tensor), B, s.C, o->OC);
            if (m->observer) observe(m, i, 1, dout);
            break;
        }
        if (i == 0 || m->ops[i - 1].unit != o->unit) dt_hook_list_call(&m->grad_hooks, DT_HOOK_GRADS_READY, o->unit);
    }
    return DT_OK;
}

/* ---- the rest of the model's face ---- */

const dt_resnet_config *dt_resnet_get_config(const dt_resnet *m) { return &m->cfg; }
size_t dt_resnet_num_params(const dt_resnet *m) { return m->nparams; }
float *dt_resnet_params(dt_resnet *m) { return m->params; }
float *dt_resnet_grads(dt_resnet *m) { return m->grads; }
void dt_resnet_zero_grad(dt_resnet *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

void dt_resnet_batch_bytes(const dt_resnet *m, int B, size_t *kept, size_t *grads, size_t *work) {
    size_t k = 0, g = 0;
    for (int i = 0; i < m->nslots; i++) k += slot_floats(m, i, B) * sizeof(float);
    for (int i = 0; i < m->nops; i++)
        if (m->ops[i].kind == OP_MAXPOOL) k += slot_floats(m, m->ops[i].out, B) * sizeof(int32_t);
    for (int i = 0; i < m->ndbuf; i++) g += m->dbuf_floats[i] * (size_t)B * sizeof(float);
    if (kept) *kept = k;
    if (grads) *grads = g;
    if (work) {
        size_t w = 1;
        for (int i = 0; i < m->nops; i++) {
            const op *o = &m->ops[i];
            if (o->kind != OP_CONV) continue;
            shape s = m->slot[o->in];
            dt_conv_shape cs = dt_conv_make(1, s.C, s.H, s.W, o->OC, o->K, o->stride, o->pad);
            size_t n = dt_conv2d_work_floats(&cs);
            if (n > w) w = n;
        }
        *work = w * sizeof(float);
    }
}

const dt_tensor_info *dt_resnet_tensors(const dt_resnet *m, int *n) {
    if (n) *n = m->ntab;
    return m->tab;
}

float *dt_resnet_buffers(dt_resnet *m, size_t *n) {
    if (n) *n = m->nbuffers;
    return m->buffers;
}

int dt_resnet_num_batchnorms(const dt_resnet *m) { return m->nbn; }

const char *dt_resnet_batchnorm_name(const dt_resnet *m, int i, int *channels, size_t *buffer_offset) {
    for (int k = 0, seen = 0; k < m->nops; k++)
        if (m->ops[k].kind == OP_BN && seen++ == i) {
            if (channels) *channels = m->slot[m->ops[k].in].C;
            if (buffer_offset) *buffer_offset = (size_t)m->ops[k].buffer;
            return m->buffer_names[i];
        }
    return NULL;
}

void dt_resnet_set_bn_reduce(dt_resnet *m, dt_bn_reduce fn, void *ctx) {
    m->bn_reduce = fn;
    m->bn_ctx = ctx;
}

void dt_resnet_set_grad_hook(dt_resnet *m, dt_unit_hook hook, void *ctx) {
    if (dt_hook_list_set(&m->grad_hooks, hook, NULL, ctx)) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
}

void dt_resnet_set_grad_storage(dt_resnet *m, float *grads) {
    m->grads = dt_model_grad_storage(m->own_grads, m->grads, grads, m->nparams);
}

void dt_resnet_set_param_storage(dt_resnet *m, float *params) {
    m->params = dt_model_param_storage(m->own_params, m->params, params, m->nparams);
}

void dt_resnet_set_linear_observer(dt_resnet *m, dt_linear_observer fn, void *ctx) {
    m->observer = fn;
    m->observer_ctx = ctx;
}

dt_status dt_resnet_linears(const dt_resnet *m, dt_linear_layer **out, int *n) {
    *n = 0;
    if (!(*out = calloc((size_t)m->nops + 1, sizeof **out))) return dt_error(DT_ERR_NOMEM, "resnet: out of memory");
    for (int i = 0; i < m->nops; i++) {
        const op *o = &m->ops[i];
        if (o->kind != OP_CONV && o->kind != OP_FC) continue;
        int in = m->slot[o->in].C * (o->kind == OP_CONV ? o->K * o->K : 1);
        (*out)[(*n)++] = (dt_linear_layer){ .layer = i, .in = in, .nparts = 1, .w = { &m->tab[o->tensor] },
                                            .b = { o->kind == OP_FC ? &m->tab[o->tensor + 1] : NULL } };
    }
    return DT_OK;
}

static dt_status v_linears(void *m, dt_linear_layer **out, int *n) { return dt_resnet_linears(m, out, n); }
static void v_observer(void *m, dt_linear_observer fn, void *ctx) { dt_resnet_set_linear_observer(m, fn, ctx); }
static float *v_params(void *m) { return dt_resnet_params(m); }
static float *v_grads(void *m) { return dt_resnet_grads(m); }
static void v_storage(void *m, float *g) { dt_resnet_set_grad_storage(m, g); }
static void v_hook(void *m, dt_unit_hook h, void *ctx) { dt_resnet_set_grad_hook(m, h, ctx); }
static void v_param_storage(void *m, float *p) { dt_resnet_set_param_storage(m, p); }

void dt_resnet_model(dt_resnet *m, dt_model *out) {
    *out = (dt_model){ .self = m, .kind = "resnet", .tensors = m->tab, .ntensors = m->ntab, .nunits = m->nunits,
                       .nparams = m->nparams, .params = v_params, .grads = v_grads, .set_grad_storage = v_storage,
                       .set_grad_hook = v_hook, .set_param_storage = v_param_storage, .global_params = m->nparams,
                       .linears = v_linears, .set_linear_observer = v_observer };
}
