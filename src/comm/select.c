/* Algorithm selection: the cost model behind algo=auto.
 *
 * Each algorithm's cost is α (per message or barrier), β (per byte moved)
 * and γ (per byte reduced), with the formulas in the algorithm files'
 * headers. Two sets of parameters: "p2p" for the channel/MPI transport the
 * generic algorithms use, "direct" for shm_direct's barriers and memory
 * traffic. `dtrain bench comm --calibrate` measures them on the machine at
 * hand and writes them to the calibration file; without one the defaults
 * below (measured on a 2-core x86 VM) apply. */
#include "comm_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static dt_cost_params params = {
    .p2p_alpha = 1.0e-6, .p2p_beta = 1.0 / 6e9, .gamma = 1.0 / 8e9,
    .direct_alpha = 0.2e-6, .direct_beta = 1.0 / 20e9,
    .mpi_alpha = 3e-6, .mpi_beta = 1.0 / 5e9,
};
static bool loaded;

const char *dt_cost_params_path(char *buf, size_t cap) {
    const char *e = getenv("DTRAIN_CALIBRATION");
    if (e && *e) { snprintf(buf, cap, "%s", e); return buf; }
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(buf, cap, "%s/dtrain/comm-calibration.txt", xdg);
    else snprintf(buf, cap, "%s/.cache/dtrain/comm-calibration.txt", home && *home ? home : ".");
    return buf;
}

dt_status dt_cost_params_load(const char *path, dt_cost_params *out) {
    FILE *f = fopen(path, "r");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open calibration file", path);
    dt_cost_params p = params;
    char key[64];
    double v;
    int line = 0;
    dt_status st = DT_OK;
    while (!st && fscanf(f, "%63s %lf", key, &v) == 2) {
        line++;
        double *slot = !strcmp(key, "p2p_alpha") ? &p.p2p_alpha : !strcmp(key, "p2p_beta") ? &p.p2p_beta
                     : !strcmp(key, "gamma") ? &p.gamma : !strcmp(key, "direct_alpha") ? &p.direct_alpha
                     : !strcmp(key, "direct_beta") ? &p.direct_beta : !strcmp(key, "mpi_alpha") ? &p.mpi_alpha
                     : !strcmp(key, "mpi_beta") ? &p.mpi_beta : !strcmp(key, "mpi_slowdown") ? &p.mpi_slowdown : NULL;
        bool ratio = slot == &p.mpi_slowdown; /* a ratio, not seconds: 0 (nothing measured) up to 10x slower */
        if (!slot) st = dt_error(DT_ERR_IO, "%s: line %d: unknown parameter '%s'", path, line, key);
        else if (ratio && !(v >= 0 && v < 10)) st = dt_error(DT_ERR_IO, "%s: line %d: %s = %g is out of range [0, 10)", path, line, key, v);
        else if (!ratio && !(v > 0 && v < 1)) st = dt_error(DT_ERR_IO, "%s: line %d: %s = %g is out of range (0, 1) seconds", path, line, key, v);
        else *slot = v;
    }
    fclose(f);
    if (!st) *out = p;
    return st;
}

dt_status dt_cost_params_save(const char *path, const dt_cost_params *p) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot write calibration file", tmp);
    fprintf(f, "p2p_alpha %.6e\np2p_beta %.6e\ngamma %.6e\ndirect_alpha %.6e\ndirect_beta %.6e\nmpi_alpha %.6e\nmpi_beta %.6e\n"
               "mpi_slowdown %.6f\n",
            p->p2p_alpha, p->p2p_beta, p->gamma, p->direct_alpha, p->direct_beta, p->mpi_alpha, p->mpi_beta, p->mpi_slowdown);
    if (fclose(f) != 0 || rename(tmp, path) != 0) return dt_error(DT_ERR_IO, "%s: cannot write calibration file", path);
    return DT_OK;
}

void dt_cost_params_set(const dt_cost_params *p) { params = *p; loaded = true; }

const dt_cost_params *dt_cost_params_current(void) {
    if (!loaded) {
        loaded = true;
        char path[4096];
        dt_cost_params p;
        /* a file there that cannot be read is said once (no file: the defaults, silently) */
        if (dt_cost_params_load(dt_cost_params_path(path, sizeof path), &p) == DT_OK) params = p;
        else if (access(path, F_OK) == 0) dt_log(DT_LOG_WARN, "%s: the defaults are used instead", dt_last_error());
    }
    return &params;
}

static double lg(int p) { return ceil(log2((double)p)); }

/* Predicted seconds for algo on collective coll of n bytes (the whole vector
 * for allreduce/broadcast/reduce, the gathered total otherwise); INFINITY when
 * the algorithm does not apply. */
double dt_cost_predict(const dt_comm *c, dt_algo algo, dt_coll coll, size_t nbytes) {
    const dt_cost_params *k = dt_cost_params_current();
    int p = c->size;
    double n = (double)nbytes, f = (double)(p - 1) / p;
    bool local = c->local_size == p && c->slots;
    double a = local ? k->p2p_alpha : k->mpi_alpha, b = local ? k->p2p_beta : k->mpi_beta, g = k->gamma;
    bool pow2 = (p & (p - 1)) == 0;
    double fold = pow2 ? 0 : 2 * (a + n * b); /* non-power-of-two pre/post step */
    if (!dt_algo_lookup(algo, coll)) return INFINITY;
    switch (algo) {
    case DT_ALGO_SHM_DIRECT: {
        if (!local) return INFINITY;
        double per_rank_in = coll == DT_COLL_ALLGATHER || coll == DT_COLL_GATHER ? n / p : n;
        bool small = per_rank_in <= DT_CELL_INLINE;
        double traffic = coll == DT_COLL_ALLREDUCE || coll == DT_COLL_REDUCE ? 2 * n : n;
        return k->direct_alpha * (small ? 1 : 2) + traffic * k->direct_beta + (coll == DT_COLL_ALLREDUCE ? n * g / p : 0);
    }
    case DT_ALGO_RING:
        if (coll == DT_COLL_ALLREDUCE) return 2 * (p - 1) * a + 2 * n * f * b + n * f * g;
        return (p - 1) * a + n * f * b + (coll == DT_COLL_REDUCE_SCATTER ? n * f * g : 0);
    case DT_ALGO_RD:
        if (coll == DT_COLL_ALLREDUCE) return lg(p) * (a + n * b + n * g) + fold;
        if (coll == DT_COLL_BARRIER) return lg(p) * a;
        return lg(p) * a + n * f * b + fold;
    case DT_ALGO_RABENSEIFNER: return 2 * lg(p) * a + 2 * n * f * b + n * f * g + fold;
    case DT_ALGO_TREE:
        switch (coll) {
        case DT_COLL_ALLREDUCE: return 2 * lg(p) * (a + n * b) + lg(p) * n * g;
        case DT_COLL_REDUCE: return lg(p) * (a + n * b + n * g);
        case DT_COLL_BARRIER: return 2 * lg(p) * a;
        case DT_COLL_BROADCAST: return lg(p) * (a + n * b);
        default: return lg(p) * a + n * f * b;
        }
    case DT_ALGO_BRUCK: return lg(p) * a + n * f * b + n * b / p; /* + the final rotation */
    case DT_ALGO_PAIRWISE: return (p - 1) * a + n * f * b + (coll == DT_COLL_REDUCE_SCATTER ? n * f * g : 0);
    case DT_ALGO_HIER: {
        if (c->nodes < 2 || local || !c->node_comm || !c->cross_comm) return INFINITY;
        int q = c->nodes, l = c->local_size;
        double fq = (double)(q - 1) / q, fl = (double)(l - 1) / l;
        /* shm reduce-scatter + inter-node allreduce of n/l + shm allgather */
        return 2 * k->direct_alpha + 2 * n * fl * k->direct_beta + n * fl * g / l + 2 * lg(q) * k->mpi_alpha +
               2 * (n / l) * fq * k->mpi_beta + (n / l) * fq * g;
    }
    default: return INFINITY;
    }
}

dt_algo dt_select_algo(dt_comm *c, dt_coll coll, size_t bytes) {
    dt_algo best = DT_ALGO_TREE;
    double best_cost = INFINITY;
    for (int a = DT_ALGO_SHM_DIRECT; a < DT_ALGO_COUNT; a++) {
        double t = dt_cost_predict(c, (dt_algo)a, coll, bytes);
        if (t < best_cost) { best_cost = t; best = (dt_algo)a; }
    }
    return best;
}

void dt_comm_link_costs(double *intra_alpha, double *intra_beta, double *gamma, double *inter_alpha, double *inter_beta) {
    const dt_cost_params *p = dt_cost_params_current();
    *intra_alpha = p->direct_alpha, *intra_beta = p->direct_beta, *gamma = p->gamma;
    *inter_alpha = p->mpi_alpha, *inter_beta = p->mpi_beta;
}

double dt_comm_link_slowdown(void) { return dt_cost_params_current()->mpi_slowdown; }
