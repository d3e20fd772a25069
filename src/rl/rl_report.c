/* dtrain rl --report DIR: the run's metrics, its run.json (kind "rl": the
 * settings, the machine, the outcome), a film of the trained policy's
 * greedy episode, and report.html, the page dt_report_write makes of them. */
#include "dtrain/obs.h"
#include "dtrain/rl.h"
#include "io/json_file.h"
#include "obs/run_json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

dt_status dt_rl_report_prepare(const char *dir, dt_rl_config *c, char *metrics, char *policy, size_t cap) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return dt_error(DT_ERR_IO, "--report %s: cannot make the directory: %s", dir, strerror(errno));
    if (snprintf(metrics, cap, "%s/metrics.jsonl", dir) >= (int)cap || snprintf(policy, cap, "%s/policy.safetensors", dir) >= (int)cap)
        return dt_error(DT_ERR_ARG, "--report %s: the path is too long", dir);
    if (!c->metrics) c->metrics = metrics;
    if (!c->save) c->save = policy;
    return DT_OK;
}

static void add_settings(cJSON *j, const dt_rl_config *c, const char *env_id, int ranks) {
    cJSON *s = cJSON_AddObjectToObject(j, "settings");
    int impala = c->algo == DT_RL_IMPALA;
    cJSON_AddStringToObject(s, "algo", impala ? "impala" : c->algo == DT_RL_REINFORCE ? "reinforce" : "ppo");
    cJSON_AddStringToObject(s, "env", env_id);
    cJSON_AddNumberToObject(s, "envs", c->num_envs);
    cJSON_AddNumberToObject(s, "ranks", ranks);
    cJSON_AddNumberToObject(s, "rollout_steps", c->num_steps);
    cJSON_AddNumberToObject(s, "minibatches", c->minibatches);
    cJSON_AddNumberToObject(s, "epochs", c->epochs);
    cJSON_AddNumberToObject(s, "total_steps", (double)c->total_steps);
    cJSON_AddNumberToObject(s, "lr", c->lr);
    cJSON_AddBoolToObject(s, "anneal_lr", c->anneal_lr != 0);
    cJSON_AddNumberToObject(s, "gamma", c->gamma);
    cJSON_AddNumberToObject(s, "gae_lambda", c->gae_lambda);
    cJSON_AddNumberToObject(s, "clip", c->clip_coef);
    cJSON_AddNumberToObject(s, "ent_coef", c->ent_coef);
    cJSON_AddNumberToObject(s, "hidden", c->hidden);
    cJSON_AddNumberToObject(s, "seed", (double)c->seed);
    if (impala) {
        cJSON_AddNumberToObject(s, "actors", c->actors);
        cJSON_AddNumberToObject(s, "refresh", c->refresh);
        cJSON_AddBoolToObject(s, "sync", c->sync != 0);
        cJSON_AddNumberToObject(s, "rho_bar", c->rho_bar);
        cJSON_AddNumberToObject(s, "c_bar", c->c_bar);
    }
}

dt_status dt_rl_report_write(const char *dir, const dt_rl_config *c, const dt_rl_result *r, int ranks, int argc, char **argv,
                             double wall_s) {
    const char *id = dt_env_id(c->env);
    if (!id) return dt_error(DT_ERR_ARG, "rl report: environment '%s' is not one dtrain has: %s", c->env, dt_env_list());
    char cpu[256], path[4200], film[4200];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kind", "rl");
    dt_run_json_command(j, argc, argv);
    add_settings(j, c, id, ranks);
    cJSON *m = cJSON_AddObjectToObject(j, "machine");
    cJSON_AddStringToObject(m, "cpu", dt_cpu_model(cpu, sizeof cpu));
    cJSON_AddNumberToObject(j, "wall_s", wall_s);
    cJSON_AddNumberToObject(j, "updates", r->updates);
    cJSON_AddNumberToObject(j, "env_steps", (double)r->env_steps);
    cJSON_AddNumberToObject(j, "episodes", r->episodes);
    cJSON_AddNumberToObject(j, "mean_return", r->mean_return);
    /* the trained policy's greedy episode from reset(seed), filmed (a bridged environment has no picture here) */
    int bridged = dt_env_bridged(c->env) != NULL;
    snprintf(film, sizeof film, "%s/film.svg", dir);
    double ret;
    int len;
    dt_rl_eval_config ev = { .policy = c->save, .env = c->env, .hidden = c->hidden, .episodes = 1, .seed = c->seed, .greedy = 1,
                              .film = bridged ? NULL : film, .bridge = c->bridge };
    dt_status st = dt_rl_eval(&ev, &ret, &len);
    if (!st && !bridged) {
        cJSON *f = cJSON_AddObjectToObject(j, "film");
        cJSON_AddStringToObject(f, "file", film);
        cJSON_AddNumberToObject(f, "return", ret);
        cJSON_AddNumberToObject(f, "steps", len);
    }
    snprintf(path, sizeof path, "%s/run.json", dir);
    if (st) cJSON_Delete(j);
    else st = dt_json_write_file(j, 1, path);
    snprintf(path, sizeof path, "%s/report.html", dir);
    return st ? st : dt_report_write(dir, path);
}
