/* The actor-critic policy: two MLPs, one store (see policy.h). */
#include "policy.h"
#include "distribution.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 3 /* each network: two hidden layers and a head */
#define LOGSTD_UNIT (2 * LAYERS)

struct dt_policy {
    dt_mlp *net[2];           /* actor, critic */
    size_t off[2], n;         /* each network's place in the store; the log std's follows them */
    int outputs, gaussian;
    float *own_params, *own_grads, *params, *grads;
    dt_tensor_info tab[4 * LAYERS + 1];
    dt_hook_list hooks;
};

static size_t logstd_off(const dt_policy *p) { return p->n - (size_t)(p->gaussian ? p->outputs : 0); }

static void point_nets(dt_policy *p) {
    for (int k = 0; k < 2; k++) {
        dt_mlp_set_param_storage(p->net[k], p->params + p->off[k]);
        dt_mlp_set_grad_storage(p->net[k], p->grads + p->off[k]);
    }
}

static void net_hook(int unit, void *ctx, int k) {
    dt_policy *p = ctx;
    dt_hook_list_call(&p->hooks, DT_HOOK_GRADS_READY, k * LAYERS + unit);
}
static void actor_hook(int unit, void *ctx) { net_hook(unit, ctx, 0); }
static void critic_hook(int unit, void *ctx) { net_hook(unit, ctx, 1); }

static void fill_table(dt_policy *p) {
    const char *const who[2] = { p->gaussian ? "actor_mean" : "actor", "critic" };
    for (int k = 0; k < 2; k++) {
        int n;
        const dt_tensor_info *t = dt_mlp_tensors(p->net[k], &n);
        for (int i = 0; i < n; i++) {
            dt_tensor_info *d = &p->tab[k * 2 * LAYERS + i];
            *d = t[i];
            snprintf(d->name, sizeof d->name, "%s.%.40s", who[k], t[i].name); /* the MLP's names are short */
            snprintf(d->hf, sizeof d->hf, "%s.%.80s", who[k], t[i].hf);
            d->offset += p->off[k];
            d->unit += k * LAYERS;
            d->grad_unit += k * LAYERS;
            d->split = DT_SPLIT_NONE;
            dt_tensor_set_whole(d);
        }
    }
    if (!p->gaussian) return;
    dt_tensor_info *d = &p->tab[4 * LAYERS];
    *d = (dt_tensor_info){ .name = "actor_logstd", .hf = "actor_logstd", .unit = LOGSTD_UNIT, .grad_unit = LOGSTD_UNIT, .ndim = 2,
                           .shape = { 1, p->outputs }, .offset = logstd_off(p), .count = (size_t)p->outputs };
    dt_tensor_set_whole(d);
}

dt_status dt_policy_create(int obs_dim, int outputs, int gaussian, int hidden, uint64_t seed, dt_policy **out) {
    *out = NULL;
    if (obs_dim < 1 || outputs < 1 || hidden < 1)
        return dt_error(DT_ERR_ARG, "policy: %d observations, %d outputs, %d hidden", obs_dim, outputs, hidden);
    dt_policy *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "policy: out of memory");
    p->outputs = outputs;
    p->gaussian = gaussian != 0;
    const int sizes[2][LAYERS + 1] = { { obs_dim, hidden, hidden, outputs }, { obs_dim, hidden, hidden, 1 } };
    const float gains[2][LAYERS] = { { sqrtf(2), sqrtf(2), 0.01f }, { sqrtf(2), sqrtf(2), 1.0f } };
    dt_status st = DT_OK;
    for (int k = 0; k < 2 && !st; k++) {
        st = dt_mlp_create(sizes[k], LAYERS + 1, &p->net[k]);
        if (st) break;
        dt_mlp_set_activation(p->net[k], DT_MLP_TANH);
        st = dt_mlp_init_orthogonal(p->net[k], seed * 2 + (uint64_t)k + 1, gains[k]);
        p->off[k] = p->n;
        p->n += dt_mlp_num_params(p->net[k]);
    }
    p->n += (size_t)(p->gaussian ? outputs : 0);
    if (!st) {
        p->params = p->own_params = dt_alloc_aligned(p->n * sizeof(float));
        p->grads = p->own_grads = dt_alloc_zeroed(p->n * sizeof(float));
        if (!p->params || !p->grads) st = dt_error(DT_ERR_NOMEM, "policy: out of memory");
    }
    if (st) { dt_policy_destroy(p); return st; }
    for (int k = 0; k < 2; k++) memcpy(p->params + p->off[k], dt_mlp_params(p->net[k]), dt_mlp_num_params(p->net[k]) * sizeof(float));
    for (size_t i = logstd_off(p); i < p->n; i++) p->params[i] = 0;
    point_nets(p);
    fill_table(p);
    *out = p;
    return DT_OK;
}

void dt_policy_destroy(dt_policy *p) {
    if (!p) return;
    for (int k = 0; k < 2; k++) dt_mlp_destroy(p->net[k]);
    dt_free_aligned(p->own_params);
    dt_free_zeroed(p->own_grads);
    free(p);
}

size_t dt_policy_num_params(const dt_policy *p) { return p->n; }
float *dt_policy_params(dt_policy *p) { return p->params; }
int dt_policy_outputs(const dt_policy *p) { return p->outputs; }
const float *dt_policy_logstd(const dt_policy *p) { return p->gaussian ? p->params + logstd_off(p) : NULL; }
int dt_policy_uniforms(const dt_policy *p) { return p->gaussian ? 2 * p->outputs : 1; }

dt_status dt_policy_forward(dt_policy *p, const float *obs, int B, const float **head, const float **values) {
    for (int k = 0; k < 2; k++) {
        dt_status st = dt_mlp_forward(p->net[k], obs, NULL, B, NULL, NULL);
        if (st) return st;
    }
    *head = dt_mlp_logits(p->net[0]);
    *values = dt_mlp_logits(p->net[1]);
    return DT_OK;
}

dt_status dt_policy_backward(dt_policy *p, const float *dhead, const float *dvalues, const float *dlogstd) {
    if (p->gaussian) { /* the later units first, as a model's backward reports them */
        float *g = p->grads + logstd_off(p);
        for (int k = 0; k < p->outputs; k++) g[k] += dlogstd[k];
        dt_hook_list_call(&p->hooks, DT_HOOK_GRADS_READY, LOGSTD_UNIT);
    }
    dt_status st = dt_mlp_backward_outputs(p->net[1], dvalues);
    return st ? st : dt_mlp_backward_outputs(p->net[0], dhead);
}

static void draw_categorical(const float *z, int K, const double *u, float *action, float *logp) {
    double mx = z[0], sum = 0, cum = 0;
    for (int k = 1; k < K; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < K; k++) sum += exp(z[k] - mx);
    int a = 0;
    if (u) {
        a = K - 1;
        for (int k = 0; k < K; k++) {
            cum += exp(z[k] - mx) / sum;
            if (*u < cum) { a = k; break; }
        }
    } else
        for (int k = 1; k < K; k++) a = z[k] > z[a] ? k : a;
    *action = (float)a;
    if (logp) *logp = (float)dt_rl_categorical(z, K, a, NULL);
}

static void draw_gaussian(const float *mu, const float *logstd, int K, const double *u, float *action, float *logp) {
    for (int k = 0; k < K; k++) {
        double n = u ? sqrt(-2 * log(1 - u[2 * k])) * cos(2 * M_PI * u[2 * k + 1]) : 0;
        action[k] = (float)(mu[k] + exp(logstd[k]) * n);
    }
    if (logp) *logp = (float)dt_rl_gaussian(mu, logstd, K, action, NULL);
}

void dt_policy_draw(const dt_policy *p, const float *head, const double *u, float *action, float *logp) {
    if (p->gaussian) draw_gaussian(head, dt_policy_logstd(p), p->outputs, u, action, logp);
    else draw_categorical(head, p->outputs, u, action, logp);
}

static float *v_params(void *s) { return ((dt_policy *)s)->params; }
static float *v_grads(void *s) { return ((dt_policy *)s)->grads; }
static void v_grad_storage(void *s, float *g) {
    dt_policy *p = s;
    p->grads = dt_model_grad_storage(p->own_grads, p->grads, g, p->n);
    point_nets(p);
}
static void v_param_storage(void *s, float *to) {
    dt_policy *p = s;
    p->params = dt_model_param_storage(p->own_params, p->params, to, p->n);
    point_nets(p);
}
static void v_hook(void *s, dt_unit_hook h, void *ctx) {
    dt_policy *p = s;
    if (dt_hook_list_set(&p->hooks, h, NULL, ctx)) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    dt_mlp_set_grad_hook(p->net[0], p->hooks.n ? actor_hook : NULL, p);
    dt_mlp_set_grad_hook(p->net[1], p->hooks.n ? critic_hook : NULL, p);
}

void dt_policy_model(dt_policy *p, dt_model *out) {
    *out = (dt_model){ .self = p, .kind = "policy", .tensors = p->tab, .ntensors = 4 * LAYERS + p->gaussian,
                       .nunits = 2 * LAYERS + p->gaussian,
                       .nparams = p->n, .params = v_params, .grads = v_grads, .set_grad_storage = v_grad_storage,
                       .set_grad_hook = v_hook, .set_param_storage = v_param_storage, .global_params = p->n };
}

dt_status dt_policy_engine_create(dt_policy *p, const dt_rl_config *c, dt_comm *comm, dt_engine **out) {
    dt_engine_config ec = { .comm = comm, .grad_clip = c->max_grad_norm, .step_at_end = 1, .bucket_first = DT_DDP_FIRST_BUCKET,
                            .bucket_bytes = 1u << 22 };
    dt_optim_defaults(DT_OPT_ADAMW, &ec.opt);
    ec.opt.eps = 1e-5f; /* CleanRL's Adam */
    ec.opt.weight_decay = 0;
    dt_policy_model(p, &ec.model);
    return dt_engine_create(&ec, out);
}
