/* A PPO or REINFORCE run's state file (see rl_state.h): the magic line, the header's length (8 bytes) and the header (JSON: the
 * settings the state depends on, the counters), then doubles: the policy's parameters, Adam's first and second moments,
 * the last DT_RL_WINDOW episodes' returns, and each environment's record in the job's order; then the CRC-32C of the
 * header and the doubles. Floats travel as doubles (exactly). */
#include "rl_state.h"
#include "env_internal.h"
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char MAGIC[] = "dtrain rl state 1\n";
enum { NSCALARS = 6 }; /* updates, env steps, episodes, Adam's steps, the pool's steps, the header's check (below) */

static size_t record_len(const dt_rl_learner *l) { return l->actors ? l->actors->env_rec : dt_rollout_env_len(l->ro); }
/* the environments' kind, and why they cannot be saved (NULL: they can): the rollout's pool's, or IMPALA's one of the kind */
static const char *env_id(const dt_rl_learner *l) { return l->actors ? l->actors->env_id : l->ro->info->id; }
static const char *unsaveable(const dt_rl_learner *l) { return l->ro ? dt_rollout_unsaveable(l->ro) : dt_env_pool_unsaveable(l->pool); }
static bool restarts(const dt_rl_learner *l) { return l->ro ? dt_rollout_restarts(l->ro) : dt_env_pool_restarts(l->pool); }
/* the policy, Adam's two moments, the returns' window; with actors, the weights they hold */
static size_t learner_len(const dt_rl_learner *l) { return (3 + (l->actors != NULL)) * dt_policy_num_params(l->pol) + DT_RL_WINDOW; }
static const char *algo_name(dt_rl_algo a) { return a == DT_RL_REINFORCE ? "reinforce" : a == DT_RL_IMPALA ? "impala" : "ppo"; }

/* The settings the state depends on, as the header names them. */
static cJSON *settings(const dt_rl_learner *l) {
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "algo", algo_name(l->c->algo));
    cJSON_AddStringToObject(h, "env", env_id(l));
    cJSON_AddNumberToObject(h, "envs", l->c->num_envs);
    cJSON_AddNumberToObject(h, "rollout_steps", l->c->num_steps);
    cJSON_AddNumberToObject(h, "seed", (double)l->c->seed);
    cJSON_AddNumberToObject(h, "hidden", l->c->hidden);
    cJSON_AddNumberToObject(h, "norm_obs", l->c->norm_obs);
    cJSON_AddNumberToObject(h, "norm_reward", l->c->norm_reward);
    cJSON_AddNumberToObject(h, "params", (double)dt_policy_num_params(l->pol));
    cJSON_AddNumberToObject(h, "record", (double)record_len(l));
    if (l->actors) cJSON_AddNumberToObject(h, "actors", l->actors->actors), cJSON_AddNumberToObject(h, "sync", l->c->sync);
    return h;
}

/* This rank's environments' records, one after another. */
static dt_status records(const dt_rl_learner *l, double *out) {
    size_t len = record_len(l);
    for (int j = 0; j < l->ro->n; j++) {
        dt_status st = dt_rollout_env_record(l->ro, j, out + (size_t)j * len);
        if (st) return st;
    }
    return DT_OK;
}

/* Every rank agrees on ok (a failure anywhere fails all: no rank waits in a collective another left). */
static dt_status agree(const dt_rl_learner *l, dt_status st, const char *what) {
    bool ok;
    dt_status s = dt_comm_every(l->comm, st == DT_OK, &ok);
    if (s) return s;
    return st ? st : ok ? DT_OK : dt_error(DT_ERR_IO, "%s: another rank failed (its message says why)", what);
}

/* IMPALA's: where each actor goes on, and the update of the weights they hold. */
static void add_actors(cJSON *h, const dt_rl_actor_state *a) {
    cJSON *r = cJSON_AddArrayToObject(h, "actor_rollouts"), *s = cJSON_AddArrayToObject(h, "actor_pool_steps");
    for (int i = 0; i < a->actors; i++) {
        cJSON_AddItemToArray(r, cJSON_CreateNumber((double)a->rollouts[i]));
        cJSON_AddItemToArray(s, cJSON_CreateNumber((double)a->pool_steps[i]));
    }
    cJSON_AddNumberToObject(h, "version", (double)a->version);
}

/* Rank 0: the file's parts from the learner and every environment's records. */
static dt_status write_file(const dt_rl_learner *l, const char *path, int updates, int64_t steps, const double *all, size_t nall) {
    size_t np = dt_policy_num_params(l->pol), nl = learner_len(l);
    double *learner = malloc(sizeof *learner * (nl + 1));
    if (!learner) return dt_error(DT_ERR_NOMEM, "rl: out of memory for the run state");
    const float *p = dt_policy_params(l->pol), *m = dt_optim_buffer(l->opt, 0), *v = dt_optim_buffer(l->opt, 1);
    for (size_t i = 0; i < np; i++) learner[i] = p[i], learner[np + i] = m ? m[i] : 0, learner[2 * np + i] = v ? v[i] : 0;
    memcpy(learner + 3 * np, l->prog->returns, sizeof l->prog->returns);
    for (size_t i = 0; l->actors && i < np; i++) learner[3 * np + DT_RL_WINDOW + i] = l->actors->published[i];
    cJSON *h = settings(l);
    cJSON_AddNumberToObject(h, "updates", updates);
    cJSON_AddNumberToObject(h, "env_steps", (double)steps);
    cJSON_AddNumberToObject(h, "episodes", (double)l->prog->episodes);
    cJSON_AddNumberToObject(h, "optimizer_steps", (double)dt_optim_steps(l->opt));
    cJSON_AddNumberToObject(h, "pool_steps", l->actors ? 0 : (double)dt_rollout_pool_steps(l->ro));
    if (l->actors) add_actors(h, l->actors);
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!text) { free(learner); return dt_error(DT_ERR_NOMEM, "rl: out of memory for the run state"); }
    uint64_t hlen = strlen(text);
    uint32_t crc = dt_crc32c(0, text, hlen);
    crc = dt_crc32c(crc, learner, nl * sizeof *learner);
    crc = dt_crc32c(crc, all, nall * sizeof *all);
    const void *parts[] = { MAGIC, &hlen, text, learner, all, &crc };
    size_t sizes[] = { sizeof MAGIC - 1, sizeof hlen, hlen, nl * sizeof *learner, nall * sizeof *all, sizeof crc };
    dt_status st = dt_file_write_atomic(path, parts, sizes, 6);
    free(text);
    free(learner);
    return st;
}

dt_status dt_rl_state_save(const dt_rl_learner *l, const char *path, int updates, int64_t steps) {
    if (l->actors) return write_file(l, path, updates, steps, l->actors->records, (size_t)l->c->num_envs * record_len(l));
    size_t len = record_len(l), n = (size_t)l->ro->n, N = n * (size_t)l->P;
    double *mine = malloc(sizeof *mine * (n * len + 1)), *all = l->rank == 0 ? malloc(sizeof *all * (N * len + 1)) : NULL;
    dt_status st = mine && (all || l->rank) ? records(l, mine) : dt_error(DT_ERR_NOMEM, "rl: out of memory for the run state");
    if (st) st = dt_error(st, "rl: cannot save the run's state: %s", dt_last_error());
    st = agree(l, st, "rl: saving the run's state");
    if (!st) st = l->comm ? dt_comm_gather(l->comm, mine, all, n * len, DT_F64, 0) : (memcpy(all, mine, n * len * sizeof *all), DT_OK);
    if (!st && l->rank == 0) st = write_file(l, path, updates, steps, all, N * len);
    free(mine);
    free(all);
    return agree(l, st, "rl: saving the run's state");
}

/* The file whole, its magic, length and check verified: *h its header, *data its doubles (n of them). */
static dt_status read_file(const char *path, cJSON **h, double **data, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot read the run state (it is written by --save FILE beside FILE: FILE.state)", path);
    char magic[sizeof MAGIC];
    uint64_t hlen = 0;
    dt_status st = fread(magic, 1, sizeof MAGIC - 1, f) == sizeof MAGIC - 1 && !memcmp(magic, MAGIC, sizeof MAGIC - 1) &&
                           fread(&hlen, sizeof hlen, 1, f) == 1 && hlen > 0 && hlen < (1u << 20)
                       ? DT_OK
                       : dt_error(DT_ERR_IO, "%s: not a dtrain rl run state (its first line or header length)", path);
    long at = st ? 0 : ftell(f);
    long end = !st && !fseek(f, 0, SEEK_END) ? ftell(f) : -1;
    size_t body = end > at ? (size_t)(end - at) : 0;
    if (!st && (body < hlen + 4 || (body - hlen - 4) % sizeof(double)))
        st = dt_error(DT_ERR_IO, "%s: %zu bytes after its header length: not a header of %llu bytes, doubles and a check", path, body,
                      (unsigned long long)hlen);
    char *buf = st ? NULL : malloc(body + 1);
    if (!st && !buf) st = dt_error(DT_ERR_NOMEM, "rl: out of memory for %s", path);
    if (!st && (fseek(f, at, SEEK_SET) || fread(buf, 1, body, f) != body)) st = dt_error(DT_ERR_IO, "%s: cannot read it whole", path);
    fclose(f);
    uint32_t crc = 0;
    if (!st) memcpy(&crc, buf + body - 4, 4);
    if (!st && dt_crc32c(0, buf, body - 4) != crc) st = dt_error(DT_ERR_IO, "%s: its check (CRC-32C) does not match: the file is damaged", path);
    if (!st) {
        *n = (body - hlen - 4) / sizeof(double);
        *data = malloc(sizeof **data * (*n + 1));
        if (!*data) st = dt_error(DT_ERR_NOMEM, "rl: out of memory for %s", path);
    }
    if (!st) {
        memcpy(*data, buf + hlen, *n * sizeof **data);
        buf[hlen] = 0; /* the header ends where the doubles (copied already) began */
        if (!(*h = cJSON_Parse(buf))) st = dt_error(DT_ERR_IO, "%s: its header is not JSON", path);
    }
    free(buf);
    return st;
}

/* The header against this run: each setting the state depends on, the same (the first that differs named). */
static dt_status same_run(const dt_rl_learner *l, const cJSON *h, const char *path) {
    cJSON *want = settings(l);
    dt_status st = DT_OK;
    for (const cJSON *w = want->child; w && !st; w = w->next) {
        const cJSON *got = cJSON_GetObjectItemCaseSensitive(h, w->string);
        if (cJSON_IsString(w) ? cJSON_IsString(got) && !strcmp(got->valuestring, w->valuestring) : cJSON_IsNumber(got) && got->valuedouble == w->valuedouble)
            continue;
        char a[64], b[64];
        snprintf(a, sizeof a, "%s", !got ? "(none)" : cJSON_IsString(got) ? got->valuestring : cJSON_IsNumber(got) ? "" : "?");
        if (cJSON_IsNumber(got)) snprintf(a, sizeof a, "%.17g", got->valuedouble);
        if (cJSON_IsString(w)) snprintf(b, sizeof b, "%s", w->valuestring);
        else snprintf(b, sizeof b, "%.17g", w->valuedouble);
        st = dt_error(DT_ERR_ARG, "%s: the run was saved with %s %s; this one has %s (give the saved run's settings to go on with it)", path,
                      w->string, a, b);
    }
    cJSON_Delete(want);
    return st;
}

/* Whether a header's item is a whole number from 0 to max. */
static bool count_in(const cJSON *x, double max) {
    return cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble <= max && x->valuedouble == (double)(int64_t)x->valuedouble;
}

/* IMPALA's header: each actor's next rollout and pool steps, the weights' update (counts, one an actor). */
static dt_status read_actors(const cJSON *h, dt_rl_actor_state *a, const char *path) {
    const char *keys[2] = { "actor_rollouts", "actor_pool_steps" };
    int64_t *into[2] = { a->rollouts, a->pool_steps };
    for (int k = 0; k < 2; k++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(h, keys[k]);
        if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != a->actors)
            return dt_error(DT_ERR_IO, "%s: its header's %s is not a list of %d counts", path, keys[k], a->actors);
        int i = 0;
        for (const cJSON *x = arr->child; x; x = x->next, i++) {
            if (!count_in(x, 1e15))
                return dt_error(DT_ERR_IO, "%s: its header's %s[%d] is not a count", path, keys[k], i);
            into[k][i] = (int64_t)x->valuedouble;
        }
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, "version");
    if (!count_in(v, 2147483647.0))
        return dt_error(DT_ERR_IO, "%s: its header's version is missing or not a count", path);
    a->version = (int64_t)v->valuedouble;
    return DT_OK;
}

/* Rank 0: the file read and checked; scalars[NSCALARS] and the learner's doubles to broadcast; every environment's records. */
static dt_status read_checked(const dt_rl_learner *l, const char *path, double *scalars, double *learner, double **all) {
    cJSON *h = NULL;
    double *data = NULL;
    size_t n = 0, nl = learner_len(l), N = (size_t)l->c->num_envs, len = record_len(l);
    dt_status st = read_file(path, &h, &data, &n);
    if (!st) st = same_run(l, h, path);
    static const char *const keys[NSCALARS - 1] = { "updates", "env_steps", "episodes", "optimizer_steps", "pool_steps" };
    for (int i = 0; !st && i < NSCALARS - 1; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(h, keys[i]);
        if (!count_in(x, i == 0 ? 2147483647.0 : 1e15))
            st = dt_error(DT_ERR_IO, "%s: its header's %s is missing or not a count", path, keys[i]);
        else scalars[i] = x->valuedouble;
    }
    if (!st && l->actors) st = read_actors(h, l->actors, path);
    if (!st && n != nl + N * len)
        st = dt_error(DT_ERR_IO, "%s: %zu doubles where the learner and %zu environments hold %zu", path, n, N, nl + N * len);
    if (!st) memcpy(learner, data, nl * sizeof *data), memmove(data, data + nl, N * len * sizeof *data), *all = data;
    else free(data);
    cJSON_Delete(h);
    return st;
}

/* This rank's part taken: the learner, its environments' records. */
static dt_status take(const dt_rl_learner *l, const double *scalars, const double *learner, const double *mine) {
    size_t np = dt_policy_num_params(l->pol), len = record_len(l);
    float *p = dt_policy_params(l->pol), *m = dt_optim_buffer(l->opt, 0), *v = dt_optim_buffer(l->opt, 1);
    for (size_t i = 0; i < np; i++) {
        p[i] = (float)learner[i];
        if (m) m[i] = (float)learner[np + i];
        if (v) v[i] = (float)learner[2 * np + i];
    }
    memcpy(l->prog->returns, learner + 3 * np, sizeof l->prog->returns);
    l->prog->episodes = (int64_t)scalars[2];
    dt_optim_set_steps(l->opt, (long)scalars[3]);
    if (l->actors) { /* the environments go to the actors as they start (impala.c) */
        for (size_t i = 0; i < np; i++) l->actors->published[i] = (float)learner[3 * np + DT_RL_WINDOW + i];
        memcpy(l->actors->records, mine, sizeof *mine * (size_t)l->c->num_envs * len);
        return DT_OK;
    }
    dt_rollout_set_pool_steps(l->ro, (int64_t)scalars[4]);
    dt_status st = DT_OK;
    for (int j = 0; j < l->ro->n && !st; j++) st = dt_rollout_env_restore(l->ro, j, mine + (size_t)j * len);
    return st;
}

dt_status dt_rl_state_load(const dt_rl_learner *l, const char *path, int *updates, int64_t *steps) {
    size_t nl = learner_len(l), n = l->actors ? (size_t)l->c->num_envs : (size_t)l->ro->n, len = record_len(l);
    double scalars[NSCALARS] = { 0 }, *all = NULL, *learner = malloc(sizeof *learner * (nl + 1)), *mine = malloc(sizeof *mine * (n * len + 1));
    dt_status st = learner && mine ? DT_OK : dt_error(DT_ERR_NOMEM, "rl: out of memory for the run state");
    if (!st && l->rank == 0) st = read_checked(l, path, scalars, learner, &all);
    scalars[NSCALARS - 1] = st == DT_OK;
    dt_status bs = l->comm ? dt_comm_broadcast(l->comm, scalars, NSCALARS, DT_F64, 0) : DT_OK;
    if (!bs && !scalars[NSCALARS - 1]) bs = l->rank == 0 ? st : dt_error(DT_ERR_IO, "%s: rank 0 could not read the run state (its message says why)", path);
    if (!bs && l->comm) bs = dt_comm_broadcast(l->comm, learner, nl, DT_F64, 0);
    if (!bs) bs = l->comm ? dt_comm_scatter(l->comm, all, mine, n * len, DT_F64, 0) : (memcpy(mine, all, n * len * sizeof *mine), DT_OK);
    if (!bs) bs = take(l, scalars, learner, mine);
    if (!bs) *updates = (int)scalars[0], *steps = (int64_t)scalars[1];
    free(learner);
    free(mine);
    free(all);
    return agree(l, bs, "rl: resuming the run's state");
}

dt_status dt_rl_resume_run(const dt_rl_learner *l, int updates, int *u0, int64_t *steps) {
    const dt_rl_config *c = l->c;
    const char *why = unsaveable(l), *id = env_id(l);
    *u0 = 0, *steps = 0;
    if (why && (c->resume || c->save_every))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: %s: %s, which a run state cannot hold", c->resume ? "--resume" : "--save-every", id, why);
    if (why && c->save && l->rank == 0)
        dt_log(DT_LOG_WARN, "rl: --save %s keeps the policy; the run's state is not saved beside it (%s: %s)", c->save, id, why);
    if (!c->resume) return DT_OK;
    dt_status st = dt_rl_state_load(l, c->resume, u0, steps);
    if (!st && *u0 >= updates)
        st = dt_error(DT_ERR_ARG, "%s is at update %d of %d (--total-steps %lld): nothing left to train", c->resume, *u0, updates,
                      (long long)c->total_steps);
    if (!st && l->rank == 0 && c->print_every) printf("resumed from %s at update %d (%lld environment steps)\n", c->resume, *u0, (long long)*steps);
    if (!st && l->rank == 0 && restarts(l)) /* said whether or not the run prints its progress */
        dt_log(DT_LOG_WARN, "rl: %s: a physics world has no state to save: each environment's interrupted episode restarts (not counted), "
               "from its saved stream; the policy, the optimizer, the normalisers and the counters go on, but not bit for bit as the "
               "uninterrupted run", id);
    return st;
}

dt_status dt_rl_save_run(const dt_rl_learner *l, int updates, int64_t steps) {
    const dt_rollout *ro = l->ro;
    dt_status st = DT_OK;
    if (l->rank == 0) /* environment 0's statistics, which rank 0 holds */
        st = dt_policy_save(l->pol, l->c->save, ro->od, ro->obs_norm ? ro->obs_norm[0].mean : NULL, ro->obs_norm ? ro->obs_norm[0].var : NULL);
    if (unsaveable(l)) return st; /* the policy alone (said at the start) */
    char path[4200];
    snprintf(path, sizeof path, "%s.state", l->c->save);
    dt_status s2 = dt_rl_state_save(l, path, updates, steps);
    return st ? st : s2;
}
