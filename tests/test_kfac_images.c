/* K-FAC on the image models against kfac-pytorch's KFACPreconditioner (scripts/make_kfac_fixture.py's image cases):
 * dtrain's MLP (every Linear) and resnet:small (every convolution and the head; the BatchNorms plain), both from
 * dtrain's own initialisation, SGD with momentum underneath: the preconditioned gradients of every parameter at the
 * first step (and the MLP's last) and the weights after the steps. A convolution's factors come from its patches at
 * every position (kfac.h); this is what shows they are kfac-pytorch's. At kfac-pytorch's scale a convolution's G
 * (1e-9 to 1e-7 here) hides under the running averages' identity start and the damping, so the observer is checked
 * on its own too: each layer's weight gradient is the sum over its events' pieces of output gradient x input.
 * usage: test_kfac_images FIXTURES_DIR */
#include "kfac_fixture.h"

#include <string.h>

typedef struct {
    dt_mlp *mlp;
    dt_resnet *resnet;
    dt_model m;
    int batch, dim, steps, classes, shape[3], nshape;
    float lr;
} image_case;

static void report(const char *name, const char *what, double err, const char *tensor, double tol) {
    char line[256], detail[160];
    snprintf(line, sizeof line, "%-20s %s", name, what);
    snprintf(detail, sizeof detail, "worst relative error %.2e (%s), at most %.0e", err, tensor, tol);
    check(line, err <= tol, detail);
}

/* The fixture's settings, and its model made from dtrain's initialisation with the fixture's seed. */
static dt_status make_case(dt_safetensors *f, const char *path, image_case *c, dt_kfac_config *kc, dt_optim_config *oc) {
    cJSON *j;
    dt_status st = fixture_settings(f, path, "kfac", &j);
    if (st) return st;
    kfac_fixture_settings(j, kc, oc, &c->lr, &c->steps);
    c->batch = (int)fixture_number(j, "batch");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model"), *sizes = cJSON_GetObjectItemCaseSensitive(j, "sizes"),
                *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    uint64_t seed = (uint64_t)fixture_number(j, "seed");
    int sz[16], ns = cJSON_GetArraySize(sizes), sh[3] = { 1, 1, 1 }, nsh = cJSON_GetArraySize(shape);
    for (int i = 0; i < ns && i < 16; i++) sz[i] = cJSON_GetArrayItem(sizes, i)->valueint;
    for (int i = 0; i < nsh && i < 3; i++) sh[i] = cJSON_GetArrayItem(shape, i)->valueint;
    c->dim = sh[0] * sh[1] * sh[2];
    memcpy(c->shape, sh, sizeof sh);
    c->nshape = nsh;
    c->classes = sz[ns - 1];
    if (!cJSON_IsString(model) || ns < 1 || ns > 16 || nsh < 1 || nsh > 3) st = dt_error(DT_ERR_ARG, "%s: its settings name no model", path);
    else if (!strcmp(model->valuestring, "mlp")) {
        if (!(st = dt_mlp_create(sz, ns, &c->mlp))) dt_mlp_init_random(c->mlp, seed), dt_mlp_model(c->mlp, &c->m);
    } else {
        dt_resnet_config rc;
        st = dt_resnet_config_parse(model->valuestring, sh[0], sh[1], sh[2], c->classes, &rc);
        if (!st && !(st = dt_resnet_create(&rc, &c->resnet))) dt_resnet_init_random(c->resnet, seed), dt_resnet_model(c->resnet, &c->m);
    }
    cJSON_Delete(j);
    return st;
}

static dt_status train_step(image_case *c, const float *x, const int32_t *y) {
    float loss;
    memset(c->m.grads(c->m.self), 0, c->m.nparams * sizeof(float));
    dt_status st = c->mlp ? dt_mlp_forward(c->mlp, x, y, c->batch, &loss, NULL) : dt_resnet_forward(c->resnet, x, y, c->batch, true, &loss, NULL);
    if (!st) st = c->mlp ? dt_mlp_backward(c->mlp, 1.0f) : dt_resnet_backward(c->resnet, 1.0f);
    return st;
}

static void compare(dt_safetensors *f, const char *name, image_case *c, const float *store, const char *prefix, const char *what) {
    const char *worst_name = "";
    double e = 0;
    dt_status st = fixture_err(f, &c->m, store, prefix, 0, &e, &worst_name);
    if (st) check(name, false, dt_last_error());
    else report(name, what, e, worst_name, 1e-5);
}

/* The fixture's images and labels of every step into *x and *y (the caller frees them; NULL on a failure before). */
static dt_status read_steps(dt_safetensors *f, const image_case *c, dt_status st, float **x, int32_t **y) {
    size_t n = st ? 1 : (size_t)c->steps * c->batch;
    *x = malloc(n * (size_t)(c->dim > 0 ? c->dim : 1) * sizeof(float));
    *y = malloc(n * sizeof(int32_t));
    int xd[4] = { (int)n, c->shape[0], c->shape[1], c->shape[2] };
    if (!st && (!*x || !*y)) st = dt_error(DT_ERR_NOMEM, "out of memory");
    if (!st) st = dt_safetensors_read(f, "images", 1 + c->nshape, xd, 0, *x);
    if (!st) st = dt_safetensors_read_i32(f, "labels", n, *y);
    return st;
}

static void check_case(const char *dir, const char *name) {
    char path[512], what[96];
    snprintf(path, sizeof path, "%s/kfac/%s.safetensors", dir, name);
    dt_safetensors *f = NULL;
    dt_kfac *k = NULL;
    dt_optim *o = NULL;
    dt_kfac_config kc;
    dt_optim_config oc;
    image_case c = { 0 };
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = make_case(f, path, &c, &kc, &oc);
    if (!st) st = dt_kfac_create(&kc, &c.m, NULL, &k);
    if (!st) st = dt_optim_create(&oc, c.m.nparams, NULL, 0, &o);
    float *x = NULL;
    int32_t *y = NULL;
    st = read_steps(f, &c, st, &x, &y);
    for (int s = 0; !st && s < c.steps; s++) {
        int skip = 0;
        dt_kfac_begin(k, 1, 0);
        st = train_step(&c, x + (size_t)s * c.batch * c.dim, y + (size_t)s * c.batch);
        if (!st) st = dt_kfac_step(k, c.m.grads(c.m.self), c.lr, &skip);
        if (!st && skip) st = dt_error(DT_ERR_ARG, "step %d skipped", s);
        const char *tag = s == 0 ? "pgrad0." : s == c.steps - 1 && dt_safetensors_has(f, "pgradN.0.weight") ? "pgradN." : NULL;
        snprintf(what, sizeof what, "preconditioned gradients at step %d of %d", s + 1, c.steps);
        if (!st && tag) compare(f, name, &c, c.m.grads(c.m.self), tag, what);
        if (!st) dt_optim_step(o, c.m.params(c.m.self), c.m.grads(c.m.self), c.lr, 0);
    }
    snprintf(what, sizeof what, "weights after %d steps", c.steps);
    if (!st) compare(f, name, &c, c.m.params(c.m.self), "final.", what);
    if (st) check(name, false, dt_last_error());
    free(x), free(y);
    dt_optim_destroy(o);
    dt_kfac_destroy(k);
    dt_mlp_destroy(c.mlp);
    dt_resnet_destroy(c.resnet);
    dt_safetensors_close(f);
}

/* ---- the Fisher's scale against kfac-pytorch's (kfac.h's dt_kfac_scale) ---- */

#define MAX_UNITS 64

/* Case name's factors after its first step at the given scale: each Linear's unit as checkpoints hold it (units[u], at
 * most MAX_UNITS), with its sides (lin[u]); the images a step in *batch. */
static dt_status first_factors(const char *dir, const char *name, dt_kfac_scale scale, float **units, dt_kfac_linear **lin, int *n,
                               int *batch) {
    char path[512];
    snprintf(path, sizeof path, "%s/kfac/%s.safetensors", dir, name);
    dt_safetensors *f = NULL;
    dt_kfac *k = NULL;
    dt_kfac_config kc;
    dt_optim_config oc;
    image_case c = { 0 };
    dt_linear_layer *layers = NULL;
    int nl = 0, columns = 0, skip = 0;
    *lin = NULL, *n = 0;
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = make_case(f, path, &c, &kc, &oc);
    if (!st) kc.scale = scale, st = dt_kfac_create(&kc, &c.m, NULL, &k);
    if (!st) st = c.m.linears(c.m.self, &layers, &nl);
    if (!st) st = dt_kfac_plan(&kc, layers, nl, 1, lin, n, &columns);
    if (!st && *n > MAX_UNITS) st = dt_error(DT_ERR_ARG, "%s: %d Linears, the check holds %d", name, *n, MAX_UNITS);
    float *x = NULL;
    int32_t *y = NULL;
    st = read_steps(f, &c, st, &x, &y); /* the first step's taken */
    if (!st) dt_kfac_begin(k, 1, 0), st = train_step(&c, x, y);
    if (!st) st = dt_kfac_step(k, c.m.grads(c.m.self), c.lr, &skip);
    dt_preconditioner p;
    if (!st) dt_kfac_preconditioner(k, &p);
    for (int u = 0; !st && u < *n; u++) {
        units[u] = malloc(p.state.floats(p.state.ctx, u) * sizeof(float));
        if (!units[u]) st = dt_error(DT_ERR_NOMEM, "out of memory");
        else p.state.io(p.state.ctx, u, units[u], 0);
    }
    *batch = c.batch;
    free(x), free(y), free(layers);
    dt_kfac_destroy(k);
    dt_mlp_destroy(c.mlp);
    dt_resnet_destroy(c.resnet);
    dt_safetensors_close(f);
    return st;
}

/* The least-squares r with fisher's off-diagonal entries = r x kfac-pytorch's (the diagonals keep the identity start,
 * under which kfac-pytorch's tiny G vanishes in f32), and the worst entry's miss relative to the largest. */
static double off_diagonal_ratio(const float *fisher, const float *pt, int n, double *miss) {
    double num = 0, den = 0, most = 0, worst = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) num += (double)fisher[i * n + j] * pt[i * n + j], den += (double)pt[i * n + j] * pt[i * n + j];
    double r = den > 0 ? num / den : 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            most = fmax(most, fabs(fisher[i * n + j]));
            worst = fmax(worst, fabs(fisher[i * n + j] - r * pt[i * n + j]));
        }
    *miss = most > 0 ? worst / most : 1;
    return r;
}

/* One step's factors at both scales: A's ratio is each layer's positions S (1 for a Linear) and G's is batch^2 x S^4,
 * entry for entry (kfac.h). */
static void fisher_scale_check(const char *dir, const char *name) {
    float *pt[MAX_UNITS] = { 0 }, *fi[MAX_UNITS] = { 0 };
    dt_kfac_linear *lp = NULL, *lf = NULL;
    int np = 0, nf = 0, batch = 0, bad = 0;
    double S0 = 0, rG0 = 0, S = 0;
    char detail[256] = "";
    dt_status st = first_factors(dir, name, DT_KFAC_SCALE_KFAC_PYTORCH, pt, &lp, &np, &batch);
    if (!st) st = first_factors(dir, name, DT_KFAC_SCALE_FISHER, fi, &lf, &nf, &batch);
    if (!st && np != nf) st = dt_error(DT_ERR_ARG, "%d and %d Linears", np, nf);
    for (int u = 0; !st && u < np; u++) {
        int n = lp[u].n, out = lp[u].out[0];
        double missA, missG;
        S = off_diagonal_ratio(fi[u] + 1, pt[u] + 1, n, &missA);
        double rG = off_diagonal_ratio(fi[u] + 1 + n * n, pt[u] + 1 + n * n, out, &missG);
        double want = (double)batch * batch * pow(round(S), 4);
        if (u == 0) S0 = S, rG0 = rG;
        if (fabs(S - round(S)) > 1e-3 * S || round(S) < 1 || missA > 1e-4 || missG > 1e-4 || fabs(rG / want - 1) > 1e-3) {
            snprintf(detail, sizeof detail, "Linear %d: A x %.4f (miss %.1e), G x %.4e (miss %.1e) where batch^2 S^4 is %.4e", u, S, missA,
                     rG, missG, want);
            bad = 1;
        }
    }
    if (!st && !bad) snprintf(detail, sizeof detail, "%d Linears; the first's A x %.0f, G x %.3e; the last's A x %.0f", np, S0, rG0, S);
    char line[128];
    snprintf(line, sizeof line, "%-20s --kfac-scale fisher: A x positions, G x batch^2 positions^4", name);
    check(line, !st && !bad, st ? dt_last_error() : detail);
    for (int u = 0; u < MAX_UNITS; u++) free(pt[u]), free(fi[u]);
    free(lp), free(lf);
}

/* ---- the observer: each layer's weight gradient is the sum over its pieces of output gradient x input ---- */

typedef struct {
    dt_linear_layer *layers;
    int n;
    float *in[32];   /* each layer's forward pieces, one after another */
    float *est[32];  /* the gradient they make with the backward pieces */
    size_t piece[32]; /* floats a forward piece */
    int events[2];
} seen_layers;

static int layer_of(const seen_layers *s, const dt_linear_event *e) {
    for (int i = 0; i < s->n; i++)
        if (s->layers[i].layer == e->layer && s->layers[i].op == e->op) return i;
    return -1;
}

static void record(void *ctx, const dt_linear_event *e) {
    seen_layers *s = ctx;
    int i = layer_of(s, e), in = i < 0 ? 0 : s->layers[i].in, out = i < 0 ? 0 : s->layers[i].w[0]->shape[0];
    s->events[e->backward]++;
    if (i < 0 || e->width != (e->backward ? out : in)) return; /* the check below finds the gradient missing */
    size_t rows = e->rows, piece = rows * (size_t)in;
    if (!e->backward) {
        if (!s->in[i]) s->in[i] = calloc(piece * (size_t)e->pieces, sizeof(float)), s->piece[i] = piece;
        if (s->in[i]) memcpy(s->in[i] + piece * (size_t)e->piece, e->values, piece * sizeof(float));
        return;
    }
    if (!s->est[i]) s->est[i] = calloc((size_t)out * in, sizeof(float));
    const float *a = s->in[i] ? s->in[i] + s->piece[i] * (size_t)e->piece : NULL;
    for (int o = 0; a && s->est[i] && o < out; o++)
        for (int c = 0; c < in; c++) {
            double sum = 0;
            for (size_t r = 0; r < rows; r++)
                sum += e->by_column ? (double)e->values[(size_t)o * rows + r] * a[(size_t)c * rows + r]
                                    : (double)e->values[r * (size_t)out + o] * a[r * (size_t)in + c];
            s->est[i][(size_t)o * in + c] += (float)sum;
        }
}

/* A batch of random images through the model with the observer on: every listed layer's weight gradient against what
 * its events make, each seen once a piece each way. */
static void observer_check(const char *what, image_case *c, int batch) {
    seen_layers s = { 0 };
    dt_status st = c->m.linears(c->m.self, &s.layers, &s.n);
    if (!st && s.n > 32) st = dt_error(DT_ERR_ARG, "%d layers (the check holds 32)", s.n);
    float *x = malloc(sizeof(float) * (size_t)batch * c->dim);
    int32_t y[16];
    uint64_t seed = 5;
    for (int i = 0; x && i < batch * c->dim; i++) x[i] = dt_rng_normal(&seed);
    for (int i = 0; i < batch; i++) y[i] = i % c->classes;
    c->batch = batch;
    if (!st) c->m.set_linear_observer(c->m.self, record, &s), st = train_step(c, x, y);
    double worst = 0;
    for (int i = 0; !st && i < s.n; i++) {
        const dt_tensor_info *w = s.layers[i].w[0];
        if (!s.est[i]) st = dt_error(DT_ERR_ARG, "%s: no gradient events", w->name);
        else worst = fmax(worst, rel_err(s.est[i], c->m.grads(c->m.self) + w->offset, w->count));
    }
    char line[128], detail[128];
    snprintf(line, sizeof line, "%s: the observer's pieces make each weight's gradient", what);
    snprintf(detail, sizeof detail, "%d layers, %d and %d events, worst relative error %.1e (at most 1e-5)", s.n, s.events[0], s.events[1], worst);
    check(line, !st && worst <= 1e-5, st ? dt_last_error() : detail);
    for (int i = 0; i < 32; i++) free(s.in[i]), free(s.est[i]);
    free(s.layers);
    free(x);
    c->m.set_linear_observer(c->m.self, NULL, NULL);
}

static void observer_checks(void) {
    image_case c = { 0 };
    int sizes[] = { 12, 9, 7, 4 };
    if (!dt_mlp_create(sizes, 4, &c.mlp)) {
        dt_mlp_init_random(c.mlp, 3), dt_mlp_model(c.mlp, &c.m);
        c.dim = 12, c.classes = 4;
        observer_check("MLP 12-9-7-4", &c, 5);
        dt_mlp_destroy(c.mlp);
    } else check("MLP", false, dt_last_error());
    c = (image_case){ 0 };
    dt_resnet_config rc;
    if (!dt_resnet_config_parse("resnet:small", 1, 12, 12, 10, &rc) && !dt_resnet_create(&rc, &c.resnet)) {
        dt_resnet_init_random(c.resnet, 3), dt_resnet_model(c.resnet, &c.m);
        c.dim = 144, c.classes = 10;
        observer_check("resnet:small, 3 images of 12 x 12", &c, 3);
        dt_resnet_destroy(c.resnet);
    } else check("resnet:small", false, dt_last_error());
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    dt_log_set_level(DT_LOG_WARN);
    check_case(dir, "mlp_eigen");
    check_case(dir, "resnet_small_eigen");
    fisher_scale_check(dir, "mlp_eigen");
    fisher_scale_check(dir, "resnet_small_eigen");
    observer_checks();
    printf("%s\n", failed ? "FAILED" : "all passed");
    return failed ? 1 : 0;
}
