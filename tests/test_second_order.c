/* The second-order optimizers against their oracles. K-FAC: kfac-pytorch's KFACPreconditioner (scripts/make_kfac_fixture.py: tiny Hugging Face
 * Llama and Qwen 2 models, every Linear but the head preconditioned): the preconditioned gradients of every parameter
 * at the first and last step and the weights after the steps, eigen and inverse methods, intervals, SGD and AdamW
 * underneath; KAISA's assignment; the settings refused; a decomposition that fails skips the step, naming the Linear.
 * SOAP: pytorch_optimizer's SOAP on fixed gradients (scripts/make_soap_fixture.py says why not a model's own), every
 * parameter after 10 steps, and a sharded slice refused. K-FAC's distributed strategies against one process: tests/kfac_equivalence.sh.
 * usage: test_second_order FIXTURES_DIR */
#include "kfac_fixture.h"

#include "dtrain/kfac.h"
#include "dtrain/optim.h"
#include "dtrain/soap.h"

#include <cjson/cJSON.h>
#include <string.h>

enum { B = 2, T = 16 };

static void report(const char *name, const char *what, double err, const char *tensor, double tol) {
    char line[256], detail[160];
    snprintf(line, sizeof line, "%-22s %s", name, what);
    snprintf(detail, sizeof detail, "worst relative error %.2e (%s), at most %.0e", err, tensor, tol);
    check(line, err <= tol, detail);
}

static dt_status settings(dt_safetensors *f, dt_kfac_config *kc, dt_optim_config *oc, float *lr, int *steps) {
    cJSON *j;
    dt_status st = fixture_settings(f, "the K-FAC fixture", "kfac", &j);
    if (st) return st;
    kfac_fixture_settings(j, kc, oc, lr, steps);
    cJSON_Delete(j);
    return DT_OK;
}

static void check_case(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/kfac/%s.safetensors", dir, name);
    dt_safetensors *f = NULL;
    dt_program *p = NULL;
    dt_kfac *k = NULL;
    dt_optim *o = NULL;
    dt_lm_config cfg;
    dt_kfac_config kc;
    dt_optim_config oc;
    float lr = 0;
    int steps = 0;
    dt_model m;
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = fixture_program(f, path, &cfg, &p);
    if (!st) dt_program_model(p, &m), st = settings(f, &kc, &oc, &lr, &steps);
    if (!st) st = dt_kfac_create(&kc, &m, NULL, &k);
    if (!st) st = dt_optim_create(&oc, m.nparams, NULL, 0, &o);
    int32_t *in = malloc(sizeof(int32_t) * (size_t)(steps > 0 ? steps : 1) * B * T), *tg = malloc(sizeof(int32_t) * (size_t)(steps > 0 ? steps : 1) * B * T);
    if (!st) st = dt_safetensors_read_i32(f, "inputs", (size_t)steps * B * T, in);
    if (!st) st = dt_safetensors_read_i32(f, "targets", (size_t)steps * B * T, tg);
    const char *worst_name = "";
    for (int s = 0; !st && s < steps; s++) {
        float loss;
        int skip = 0;
        dt_program_zero_grad(p);
        dt_kfac_begin(k, 1, 0);
        if (!(st = dt_program_forward(p, in + (size_t)s * B * T, tg + (size_t)s * B * T, B, T, &loss))) st = dt_program_backward(p, 1.0f);
        if (!st) st = dt_kfac_step(k, m.grads(m.self), lr, &skip);
        if (!st && skip) st = dt_error(DT_ERR_ARG, "step %d skipped", s);
        if (!st && (s == 0 || s == steps - 1)) {
            double e = 0;
            st = fixture_err(f, &m, m.grads(m.self), s == 0 ? "pgrad0." : "pgradN.", cfg.vocab_size, &e, &worst_name);
            char what[96];
            snprintf(what, sizeof what, "preconditioned gradients at step %d of %d", s + 1, steps);
            if (!st) report(name, what, e, worst_name, 1e-5);
        }
        if (!st) dt_optim_step(o, m.params(m.self), m.grads(m.self), lr, 0);
    }
    if (!st) {
        double e = 0;
        st = fixture_err(f, &m, m.params(m.self), "final.", cfg.vocab_size, &e, &worst_name);
        char what[96];
        snprintf(what, sizeof what, "weights after %d steps", steps);
        if (!st) report(name, what, e, worst_name, 1e-5);
    }
    if (st) check(name, false, dt_last_error());
    free(in), free(tg);
    dt_optim_destroy(o);
    dt_kfac_destroy(k);
    dt_program_destroy(p);
    dt_safetensors_close(f);
}

/* KAISA's greedy assignment, worked by hand (kfac.h's rule). */
static void assignment_checks(void) {
    const double cost[4] = { 5, 3, 3, 1 }, cost5[5] = { 1, 2, 3, 4, 5 };
    int w[5];
    char got[64];
    dt_kfac_assign(cost, 4, 4, 2, w); /* columns {0, 2}, {1, 3} */
    snprintf(got, sizeof got, "%d %d %d %d", w[0], w[1], w[2], w[3]);
    check("KAISA: 4 ranks, 2 gradient workers (HYBRID): costs 5 3 3 1 go to 0 1 3 2", !strcmp(got, "0 1 3 2"), got);
    dt_kfac_assign(cost, 4, 4, 1, w); /* MEM-OPT: a column a rank */
    snprintf(got, sizeof got, "%d %d %d %d", w[0], w[1], w[2], w[3]);
    check("KAISA: 4 ranks, MEM-OPT: one Linear a rank", !strcmp(got, "0 1 2 3"), got);
    dt_kfac_assign(cost5, 5, 2, 2, w); /* COMM-OPT: one column, the least loaded rank, the first among equals */
    snprintf(got, sizeof got, "%d %d %d %d %d", w[0], w[1], w[2], w[3], w[4]);
    check("KAISA: 2 ranks, COMM-OPT: costs 1..5 go to 0 0 1 1 0", !strcmp(got, "0 0 1 1 0"), got);
}

static void refused(const char *what, dt_kfac_config c, int ranks, const char *want) {
    dt_status st = dt_kfac_check(&c, ranks);
    const char *msg = st ? dt_last_error() : "accepted";
    check(what, st && strstr(msg, want), msg);
}

static void settings_checks(void) {
    dt_kfac_config c;
    dt_kfac_defaults(&c);
    dt_kfac_config d = c;
    d.damping = 0;
    refused("a damping of 0 refused", d, 1, "damping");
    d = c, d.damping = -1;
    refused("a negative damping refused", d, 1, "damping");
    d = c, d.inv_every = 0;
    refused("an inverse interval of 0 refused", d, 1, "1 step or more");
    d = c, d.factor_every = 0;
    refused("a factor interval of 0 refused", d, 1, "1 step or more");
    d = c, d.workers = 0.3f;
    refused("--kfac-workers 0.3 on 4 ranks refused", d, 4, "divides the ranks");
    d = c, d.factor_decay = 1;
    refused("a decay of 1 refused", d, 1, "decay");
    d = c, d.workers = 0.5f;
    check("--kfac-workers 0.5 on 4 ranks (HYBRID) accepted", !dt_kfac_check(&d, 4), NULL);
}

/* A Linear whose factors are not finite: the step is skipped, the gradients left as they were, the Linear named. */
static void failure_checks(void) {
    dt_lm_config cfg;
    dt_program *p = NULL;
    dt_kfac *k = NULL;
    dt_kfac_config c;
    dt_kfac_defaults(&c);
    dt_status st = dt_lm_preset("llama-tiny", &cfg);
    cfg.num_layers = 1;
    if (!st) st = dt_program_create(&cfg, &p);
    dt_model m;
    if (!st) dt_program_init_random(p, 7), dt_program_model(p, &m), st = dt_kfac_create(&c, &m, NULL, &k);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = i % 50, tg[i] = (i * 7) % 50;
    int skip = 0;
    float loss;
    if (!st) {
        const dt_tensor_info *w = dt_program_block_tensor(p, 0, 0); /* the first norm's weight: q's input goes NaN */
        m.params(m.self)[w->offset] = NAN;
        dt_program_zero_grad(p);
        dt_kfac_begin(k, 1, 0);
        if (!(st = dt_program_forward(p, in, tg, B, T, &loss))) st = dt_program_backward(p, 1.0f);
    }
    float *before = NULL;
    if (!st && (before = malloc(m.nparams * sizeof(float)))) memcpy(before, m.grads(m.self), m.nparams * sizeof(float));
    if (!st && before) st = dt_kfac_step(k, m.grads(m.self), 0.1f, &skip);
    bool same = before && !memcmp(before, m.grads(m.self), m.nparams * sizeof(float));
    check("a decomposition of non-finite factors: the step skipped, the gradients untouched", !st && skip && same,
           st ? dt_last_error() : NULL);
    free(before);
    dt_kfac_destroy(k);
    dt_program_destroy(p);
}

static void soap_synthetic(dt_safetensors *f, const dt_optim_config *oc, float lr, int steps);

/* SOAP's settings from the fixture, then its case. */
static void soap_checks(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/soap/soap.safetensors", dir);
    dt_safetensors *f = NULL;
    cJSON *set = NULL;
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = fixture_settings(f, path, "soap", &set);
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_SOAP, &oc);
    if (!st) {
        oc.beta1 = (float)fixture_number(set, "beta1"), oc.beta2 = (float)fixture_number(set, "beta2");
        oc.eps = (float)fixture_number(set, "eps"), oc.weight_decay = (float)fixture_number(set, "weight_decay");
        oc.precond_every = (int)fixture_number(set, "precondition_frequency");
        oc.precond_max_dim = (int)fixture_number(set, "max_precondition_dim");
        soap_synthetic(f, &oc, (float)fixture_number(set, "lr"), (int)fixture_number(set, "steps"));
    } else check("SOAP's fixture", false, dt_last_error());
    dt_optim *o = NULL;
    dt_status cs = dt_optim_create(&oc, 22, NULL, 0, &o);
    check("SOAP as a dt_optim refused (it is a preconditioner over SGD)", cs && strstr(dt_last_error(), "preconditioner"),
          cs ? dt_last_error() : "accepted");
    dt_optim_destroy(o);
    cJSON_Delete(set);
    dt_safetensors_close(f);
}

/* SOAP on fixed, well-conditioned gradients (the fixture's synthetic case) as the engine runs it: its directions, SGD
 * under it with the same weight decay; every parameter to 1e-5 after 10 steps, the first only measuring. */
static void soap_synthetic(dt_safetensors *f, const dt_optim_config *oc, float lr, int steps) {
    static const char *names[3] = { "a", "b", "c" };
    static const int shape[3][2] = { { 6, 5 }, { 40, 3 }, { 7, 0 } };
    dt_tensor_info t[3] = { { .ndim = 0 } };
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(t[i].name, sizeof t[i].name, "%s", names[i]);
        t[i].ndim = shape[i][1] ? 2 : 1, t[i].shape[0] = shape[i][0], t[i].shape[1] = shape[i][1];
        t[i].offset = n, t[i].count = (size_t)shape[i][0] * (shape[i][1] ? shape[i][1] : 1);
        n += t[i].count;
    }
    float *p = calloc(n, sizeof(float)), *g = calloc(n, sizeof(float)), *want = calloc(n, sizeof(float)), *all = NULL;
    dt_soap *s = NULL;
    dt_optim *o = NULL;
    dt_optim_config sgd;
    dt_optim_defaults(DT_OPT_SGD, &sgd);
    sgd.weight_decay = oc->weight_decay;
    dt_status st = p && g && want ? dt_soap_create(oc, t, 3, NULL, &s) : dt_error(DT_ERR_NOMEM, "out of memory");
    if (!st) st = dt_optim_create(&sgd, n, NULL, 0, &o);
    for (int i = 0; i < 3 && !st; i++) {
        char name[64];
        int nd = t[i].ndim, dims[3] = { steps, shape[i][0], shape[i][1] };
        snprintf(name, sizeof name, "syn.%s", names[i]);
        if ((st = dt_safetensors_read(f, name, nd, dims + 1, 0, p + t[i].offset))) break;
        snprintf(name, sizeof name, "syn.final.%s", names[i]);
        st = dt_safetensors_read(f, name, nd, dims + 1, 0, want + t[i].offset);
    }
    int first = -1;
    for (int k = 0; k < steps && !st; k++) {
        for (int i = 0; i < 3 && !st; i++) {
            char name[64];
            int nd = t[i].ndim + 1, dims[3] = { steps, shape[i][0], shape[i][1] };
            snprintf(name, sizeof name, "syn.grads.%s", names[i]);
            free(all);
            if (!(all = malloc(sizeof(float) * (size_t)steps * t[i].count))) st = dt_error(DT_ERR_NOMEM, "out of memory");
            else if (!(st = dt_safetensors_read(f, name, nd, dims, 0, all)))
                memcpy(g + t[i].offset, all + (size_t)k * t[i].count, t[i].count * sizeof(float));
        }
        int skip = 0;
        if (!st) st = dt_soap_step(s, g, lr, &skip);
        if (k == 0) first = skip;
        if (!st && !skip) dt_optim_step(o, p, g, lr, 1);
    }
    check("SOAP's first step only measures (skip 2)", first == 2, NULL);
    double worst = 0;
    for (int i = 0; i < 3 && !st; i++) {
        double d = 0, r = 0;
        for (size_t k = t[i].offset; k < t[i].offset + t[i].count; k++) d += (double)(p[k] - want[k]) * (p[k] - want[k]), r += (double)want[k] * want[k];
        worst = fmax(worst, sqrt(d) / sqrt(r));
    }
    char line[160];
    snprintf(line, sizeof line, "SOAP on fixed gradients (a 6 x 5 and a 40 x 3 matrix, a vector), %d steps: worst relative error %.2e", steps, worst);
    check(st ? "SOAP on fixed gradients" : line, !st && worst <= 1e-5, st ? dt_last_error() : NULL);
    free(all), free(p), free(g), free(want);
    dt_optim_destroy(o);
    dt_soap_destroy(s);
}

/* SOAP's bases where LAPACK fails (a NaN in the statistics: LAPACKE refuses it by its NaN check, on unless LAPACKE_NANCHECK=0), which a run never reaches (the engine
 * stops a non-finite gradient first): a first step's failure leaves both sides the identity (Adam in the weights'
 * coordinates); a refresh's failure leaves the bases made before as they were, bit for bit; neither is an error. */
static void soap_failure_checks(void) {
    dt_tensor_info t[1] = { { .name = "w", .ndim = 2, .shape = { 6, 5 }, .offset = 0, .count = 30 } };
    enum { R = 6, C = 5, N = R * C };
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    oc.precond_every = 2;
    float g[N], state[2][2 * (R * R + C * C) + 2 * N];
    bool identity = true, kept = false, made = false;
    dt_status st = DT_OK;
    for (int run = 0; run < 2 && !st; run++) {
        dt_soap *s = NULL;
        dt_preconditioner pc;
        if ((st = dt_soap_create(&oc, t, 1, NULL, &s))) break;
        dt_soap_preconditioner(s, &pc);
        int skip = 0, bad = run == 0 ? 0 : 2; /* the step whose gradient holds a NaN: the first, or a refresh */
        for (int step = 0; step <= bad && !st; step++) {
            for (int i = 0; i < N; i++) g[i] = sinf(0.37f * (float)(i + 1) * (float)(step + 1)) + 0.1f * (float)(i % 3);
            if (step == bad) g[7] = NAN;
            if (step == bad && run == 1) pc.state.io(pc.ctx, 0, state[0], 0);
            st = dt_soap_step(s, g, 0.1f, &skip);
        }
        pc.state.io(pc.ctx, 0, state[1], 0);
        const float *QL = state[1] + R * R, *QR = state[1] + 2 * R * R + C * C;
        if (run == 0)
            for (int i = 0; i < R * R; i++) identity = identity && QL[i] == (i % (R + 1) == 0) && (i >= C * C || QR[i] == (i % (C + 1) == 0));
        else {
            const float *QL0 = state[0] + R * R, *QR0 = state[0] + 2 * R * R + C * C;
            made = QL0[1] != 0 && QR0[1] != 0; /* bases made at the first step, not the identity */
            kept = !memcmp(QL0, QL, R * R * sizeof(float)) && !memcmp(QR0, QR, C * C * sizeof(float));
        }
        dt_soap_destroy(s);
    }
    check("SOAP: a first step whose eigen-decomposition fails leaves both bases the identity (warned, not an error)", !st && identity,
          st ? dt_last_error() : NULL);
    check("SOAP: a refresh whose QR fails keeps the bases it had, bit for bit (warned, not an error)", !st && made && kept,
          st ? dt_last_error() : made ? NULL : "the bases before the refresh were not made");
}

/* One layout's SOAP for the expert checks: a stacked [E, 6, 5] tensor holding experts [first, first + E) of 4 (E 4: every
 * expert, as one process or data parallelism holds them), or (split) the same experts as E separate matrices. */
enum { XR = 6, XC = 5, XE = 4, XN = XR * XC };
static dt_status expert_soap(int E, int first, int split, dt_tensor_info *t, dt_soap **s) {
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    oc.precond_every = 2;
    for (int e = 0; e < (split ? E : 1); e++) {
        t[e] = (dt_tensor_info){ .ndim = split ? 2 : 3, .offset = (size_t)e * XN, .count = (size_t)(split ? 1 : E) * XN };
        snprintf(t[e].name, sizeof t[e].name, "e%d", e);
        int shape[3] = { E, XR, XC }, gshape[3] = { XE, XR, XC };
        for (int d = 0; d < 3; d++) t[e].shape[d] = split ? (d < 2 ? shape[d + 1] : 0) : shape[d], t[e].gshape[d] = split ? t[e].shape[d] : gshape[d];
        t[e].stacked = !split;
        t[e].group = split || E == XE ? DT_GROUP_DATA : DT_GROUP_EXPERT;
        t[e].slice = (dt_tensor_slice){ 0, first, E, 1, E };
    }
    return dt_soap_create(&oc, t, split ? E : 1, NULL, s);
}

/* A mixture's experts under SOAP: a stacked tensor's experts are each its own matrix (as separate tensors, bit for bit),
 * and an expert-parallel rank's own experts (two SOAPs of 2 experts each, no exchange) step as the whole tensor's do,
 * bit for bit, over 5 steps with refreshes; their checkpoint units are the whole tensor's, a global expert each (the
 * same sizes, the holding rank saving and loading it, the same state), so a checkpoint reshards across EP sizes. */
static void soap_experts_checks(void) {
    dt_tensor_info tw[1], ts[XE], th[2][1];
    dt_soap *whole = NULL, *split = NULL, *half[2] = { NULL, NULL };
    dt_status st = expert_soap(XE, 0, 0, tw, &whole);
    if (!st) st = expert_soap(XE, 0, 1, ts, &split);
    for (int r = 0; r < 2 && !st; r++) st = expert_soap(2, 2 * r, 0, th[r], &half[r]);
    float gw[XE * XN], gs[XE * XN], gh[XE * XN];
    bool same_split = true, same_ep = true, units = !st;
    for (int step = 0; step < 5 && !st; step++) {
        for (int i = 0; i < XE * XN; i++) gw[i] = gs[i] = gh[i] = sinf(0.11f * (float)(i + 1) * (float)(step + 2)) + 0.05f * (float)(i % 7);
        int skip;
        if (!(st = dt_soap_step(whole, gw, 0.1f, &skip))) st = dt_soap_step(split, gs, 0.1f, &skip);
        for (int r = 0; r < 2 && !st; r++) st = dt_soap_step(half[r], gh + r * 2 * XN, 0.1f, &skip);
        same_split = same_split && !memcmp(gw, gs, sizeof gw), same_ep = same_ep && !memcmp(gw, gh, sizeof gw);
    }
    dt_preconditioner pw, ph[2];
    dt_soap_preconditioner(whole, &pw);
    for (int r = 0; r < 2 && half[r]; r++) dt_soap_preconditioner(half[r], &ph[r]);
    float a[2 * (XR * XR + XC * XC) + 2 * XN], b[sizeof a / sizeof *a];
    for (int r = 0; r < 2 && units; r++) {
        units = ph[r].state.units == XE && pw.state.units == XE;
        for (int u = 0; u < XE && units; u++) {
            bool mine = u / 2 == r;
            units = ph[r].state.floats(ph[r].ctx, u) == pw.state.floats(pw.ctx, u) && ph[r].state.floats(ph[r].ctx, u) == sizeof a / sizeof *a &&
                    ph[r].state.loads(ph[r].ctx, u, r) == mine && ph[r].state.loads(ph[r].ctx, u, r + 2) == mine &&
                    ph[r].state.saver(ph[r].ctx, u) == u / 2;
            if (units && mine) pw.state.io(pw.ctx, u, a, 0), ph[r].state.io(ph[r].ctx, u, b, 0), units = !memcmp(a, b, sizeof a);
        }
    }
    check("SOAP: a stacked tensor's experts = the same experts as separate matrices, bit for bit (5 steps, refreshed every 2)", !st && same_split,
          st ? dt_last_error() : NULL);
    check("SOAP: an expert-parallel rank's own experts (2 of 4 on each of 2) = the whole tensor's, bit for bit", !st && same_ep, st ? dt_last_error() : NULL);
    check("SOAP: their checkpoint units a global expert each: the same sizes and state as the whole tensor's, saved and loaded by the "
          "ranks holding them", !st && units, st ? dt_last_error() : NULL);
    dt_soap_destroy(whole), dt_soap_destroy(split), dt_soap_destroy(half[0]), dt_soap_destroy(half[1]);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    dt_log_set_level(DT_LOG_WARN);
    const char *cases[] = { "llama_eigen", "qwen2_eigen", "llama_inverse", "llama_intervals_adamw" };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_case(dir, cases[i]);
    assignment_checks();
    settings_checks();
    failure_checks();
    soap_failure_checks();
    soap_experts_checks();
    soap_checks(dir);
    printf("%s\n", failed ? "FAILED" : "all passed");
    return failed ? 1 : 0;
}
