/* Shampoo against Meta's distributed_shampoo (scripts/make_shampoo_fixture.py): fixed gradients through every path of
 * the blocking (2-D blocks cut from a matrix, a squeezed matrix, a vector cut in two, a matrix merged into a vector),
 * Adam grafting before the start step, roots at intervals, SGD's weight decay underneath; every parameter after the
 * fixture's steps within 1e-5. The merging rule on distributed_shampoo's own examples; the settings refused; a root
 * that fails skips the step, naming the block. The distributed step against one process: tests/kfac_equivalence.sh.
 * usage: test_shampoo FIXTURES_DIR */
#include "fixture_checks.h"

#include "dtrain/optim.h"
#include "dtrain/shampoo.h"

#include <cjson/cJSON.h>
#include <string.h>

enum { NT = 4 };
static const char *names[NT] = { "a", "b", "c", "d" };
static const int shapes[NT][2] = { { 20, 12 }, { 1, 3 }, { 10, 0 }, { 2, 2 } };

/* The fixture's tensors as a table over one store; its size. */
static size_t table(dt_tensor_info *t) {
    size_t n = 0;
    for (int i = 0; i < NT; i++) {
        memset(&t[i], 0, sizeof t[i]);
        snprintf(t[i].name, sizeof t[i].name, "%s", names[i]);
        t[i].ndim = shapes[i][1] ? 2 : 1;
        t[i].shape[0] = shapes[i][0], t[i].shape[1] = shapes[i][1];
        t[i].count = (size_t)shapes[i][0] * (shapes[i][1] ? (size_t)shapes[i][1] : 1);
        t[i].offset = n;
        n += t[i].count;
    }
    return n;
}

/* Tensor i's fixture array `what` ("syn", "syn.final", "syn.grads": steps of them) into out. */
static dt_status read_array(dt_safetensors *f, const dt_tensor_info *t, int i, const char *what, int steps, float *out) {
    char name[64];
    snprintf(name, sizeof name, "%s.%s", what, names[i]);
    int dims[3] = { steps, t->shape[0], t->shape[1] }, grads = !strcmp(what, "syn.grads");
    return dt_safetensors_read(f, name, t->ndim + grads, grads ? dims : dims + 1, 0, out);
}

static void fixture_case(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/shampoo/shampoo.safetensors", dir);
    dt_safetensors *f = NULL;
    cJSON *set = NULL;
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = fixture_settings(f, path, "shampoo", &set);
    dt_tensor_info t[NT];
    size_t n = table(t);
    int steps = set ? (int)fixture_number(set, "steps") : 0;
    float lr = set ? (float)fixture_number(set, "lr") : 0;
    dt_shampoo_config c;
    dt_shampoo_defaults(&c);
    if (set) {
        c.beta1 = (float)fixture_number(set, "beta1"), c.beta2 = (float)fixture_number(set, "beta2");
        c.eps = (float)fixture_number(set, "eps");
        c.graft_eps = (float)fixture_number(set, "graft_eps"), c.block = (int)fixture_number(set, "block");
        c.every = (int)fixture_number(set, "precondition_every"), c.start = (int)fixture_number(set, "start");
    }
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_SGD, &oc);
    oc.weight_decay = set ? (float)fixture_number(set, "weight_decay") : 0;
    float *p = calloc(n, sizeof *p), *init = calloc(n, sizeof *p), *want = calloc(n, sizeof *p), *g = calloc(n, sizeof *g);
    float *all = steps > 0 ? calloc(n * (size_t)steps, sizeof *all) : NULL;
    dt_shampoo *s = NULL;
    dt_optim *o = NULL;
    if (!st && !(p && init && want && g && all)) st = dt_error(DT_ERR_NOMEM, "out of memory");
    if (!st) st = dt_shampoo_create(&c, t, NT, NULL, &s);
    if (!st) st = dt_optim_create(&oc, n, NULL, 0, &o);
    for (int i = 0; i < NT && !st; i++)
        if (!(st = read_array(f, &t[i], i, "syn", 0, p + t[i].offset)) && !(st = read_array(f, &t[i], i, "syn.final", 0, want + t[i].offset)))
            st = read_array(f, &t[i], i, "syn.grads", steps, all + t[i].offset * (size_t)steps);
    if (!st) memcpy(init, p, n * sizeof *p);
    for (int k = 0; k < steps && !st; k++) {
        for (int i = 0; i < NT; i++) memcpy(g + t[i].offset, all + t[i].offset * (size_t)steps + (size_t)k * t[i].count, t[i].count * sizeof *g);
        int skip = 0;
        if (!(st = dt_shampoo_step(s, g, &skip)) && skip) st = dt_error(DT_ERR_NUMERIC, "step %d skipped", k + 1);
        if (!st) dt_optim_step(o, p, g, lr, 1);
    }
    double worst = 0, worst_moved = 0;
    for (int i = 0; i < NT && !st; i++) {
        double d = 0, r = 0, m = 0;
        for (size_t k = t[i].offset; k < t[i].offset + t[i].count; k++)
            d += (double)(p[k] - want[k]) * (p[k] - want[k]), r += (double)want[k] * want[k], m += (double)(want[k] - init[k]) * (want[k] - init[k]);
        worst = fmax(worst, sqrt(d / r)), worst_moved = fmax(worst_moved, sqrt(d / m));
    }
    char line[256];
    snprintf(line, sizeof line, "Shampoo vs distributed_shampoo, %d blocks, %d steps: worst relative error %.2e (of the change: %.2e)",
             s ? dt_shampoo_blocks(s) : 0, steps, worst, worst_moved);
    check(st ? "Shampoo vs distributed_shampoo" : line, !st && worst <= 1e-5 && s && dt_shampoo_blocks(s) == 10, st ? dt_last_error() : NULL);
    free(p), free(init), free(want), free(g), free(all);
    dt_shampoo_destroy(s);
    dt_optim_destroy(o);
    cJSON_Delete(set);
    dt_safetensors_close(f);
}

/* distributed_shampoo's merge_small_dims examples, and a GPT-2 Linear's and a convolution's shapes. */
static void merge_checks(void) {
    static const struct { int ndim, shape[4], block, k, want[4]; } cases[] = {
        { 4, { 1, 2, 5, 1 }, 10, 1, { 10 } },      { 4, { 1, 2, 5, 1 }, 1, 2, { 2, 5 } },
        { 4, { 32, 3, 64, 64 }, 8192, 2, { 96, 4096 } }, { 2, { 768, 2304 }, 1024, 2, { 768, 2304 } },
        { 4, { 64, 32, 3, 3 }, 1024, 2, { 64, 288 } }, { 1, { 1 }, 8, 1, { 1 } },
    };
    int bad = -1;
    for (size_t i = 0; i < sizeof cases / sizeof *cases && bad < 0; i++) {
        int out[4];
        int k = dt_shampoo_merge(cases[i].ndim, cases[i].shape, cases[i].block, out);
        if (k != cases[i].k || memcmp(out, cases[i].want, (size_t)k * sizeof *out)) bad = (int)i;
    }
    char why[64];
    snprintf(why, sizeof why, "case %d", bad);
    check("shapes merged as distributed_shampoo's merge_small_dims", bad < 0, bad < 0 ? NULL : why);
}

static void refused(const char *what, dt_shampoo_config c, const char *says) {
    dt_status st = dt_shampoo_check(&c);
    check(what, st && strstr(dt_last_error(), says), st ? dt_last_error() : "accepted");
}

static void settings_checks(void) {
    dt_shampoo_config c, d;
    dt_shampoo_defaults(&c);
    d = c, d.eps = 0;
    refused("an epsilon of 0 refused", d, "--shampoo-eps");
    d = c, d.every = 0;
    refused("an interval of 0 refused", d, "--precondition-every");
    d = c, d.block = 0;
    refused("a block size below 1 refused", d, "--shampoo-block");
    d = c, d.beta2 = 1;
    refused("a beta2 of 1 refused", d, "--betas");
    check("the defaults accepted", !dt_shampoo_check(&c), NULL);
}

/* A gradient that is not finite on a root step: the step skipped, the gradients untouched, the block named. */
static void failure_checks(void) {
    dt_tensor_info t[NT];
    size_t n = table(t);
    dt_shampoo_config c;
    dt_shampoo_defaults(&c);
    c.block = 8, c.every = 1;
    dt_shampoo *s = NULL;
    float *g = calloc(n, sizeof *g), *before = calloc(n, sizeof *g);
    dt_status st = g && before ? dt_shampoo_create(&c, t, NT, NULL, &s) : dt_error(DT_ERR_NOMEM, "out of memory");
    int skip = 0;
    if (!st) {
        for (size_t i = 0; i < n; i++) g[i] = (float)((i * 37) % 11) - 5.0f;
        g[t[2].offset + 9] = NAN; /* "c"'s second block */
        memcpy(before, g, n * sizeof *g);
        st = dt_shampoo_step(s, g, &skip);
    }
    bool same = !st && !memcmp(before, g, n * sizeof *g);
    check("a root of a non-finite factor: the step skipped, the gradients untouched", !st && skip && same, st ? dt_last_error() : NULL);
    free(g), free(before);
    dt_shampoo_destroy(s);
}

/* A mixture's stacked experts ([4, 6, 5]) are each their own matrix, as Hugging Face's separate Linears: the same
 * directions as four [6, 5] tensors, bit for bit, over 4 steps (roots every 2). */
static void experts_checks(void) {
    enum { E = 4, R = 6, C = 5, N = E * R * C };
    dt_tensor_info st3[1] = { { .name = "e", .ndim = 3, .shape = { E, R, C }, .gshape = { E, R, C }, .offset = 0, .count = N, .stacked = 1 } };
    dt_tensor_info sep[E];
    for (int e = 0; e < E; e++) {
        sep[e] = (dt_tensor_info){ .ndim = 2, .shape = { R, C }, .gshape = { R, C }, .offset = (size_t)e * R * C, .count = R * C };
        snprintf(sep[e].name, sizeof sep[e].name, "e%d", e);
    }
    dt_shampoo_config c;
    dt_shampoo_defaults(&c);
    c.every = 2, c.start = 2;
    dt_shampoo *a = NULL, *b = NULL;
    dt_status st = dt_shampoo_create(&c, st3, 1, NULL, &a);
    if (!st) st = dt_shampoo_create(&c, sep, E, NULL, &b);
    float ga[N], gb[N];
    bool same = true;
    for (int k = 0; k < 4 && !st; k++) {
        for (int i = 0; i < N; i++) ga[i] = gb[i] = sinf(0.13f * (float)(i + 1) * (float)(k + 2)) + 0.07f * (float)(i % 5);
        int skip = 0;
        if (!(st = dt_shampoo_step(a, ga, &skip))) st = dt_shampoo_step(b, gb, &skip);
        same = same && !memcmp(ga, gb, sizeof ga);
    }
    dt_preconditioner pa, pb;
    if (a && b) dt_shampoo_preconditioner(a, &pa), dt_shampoo_preconditioner(b, &pb);
    bool units = a && b && pa.state.units == pb.state.units && pa.state.units >= E;
    check("Shampoo: a stacked tensor's experts = the same experts as separate matrices, bit for bit (4 steps, roots every 2; "
          "as many blocks)", !st && same && units, st ? dt_last_error() : NULL);
    dt_shampoo_destroy(a), dt_shampoo_destroy(b);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    dt_log_set_level(DT_LOG_ERROR);
    fixture_case(dir);
    merge_checks();
    settings_checks();
    failure_checks();
    experts_checks();
    printf("%s\n", failed ? "FAILED" : "all passed");
    return failed ? 1 : 0;
}
