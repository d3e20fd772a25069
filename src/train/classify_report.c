/* An image model's --report DIR: its run.json (kind "images": the settings, the machine, the outcome) and report.html.
 * The page (obs/report_page.js) draws the loss, the learning rate and gradient norm, and the test accuracy by step. */
#include "classify_report.h"

#include "dtrain/obs.h"
#include "io/json_file.h"
#include "obs/run_json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

dt_status dt_classify_report_prepare(const char *dir, char *metrics, size_t cap) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return dt_error(DT_ERR_IO, "--report %s: cannot make the directory: %s", dir, strerror(errno));
    if (snprintf(metrics, cap, "%s/metrics.jsonl", dir) >= (int)cap) return dt_error(DT_ERR_ARG, "--report %s: the path is too long", dir);
    return DT_OK;
}

dt_status dt_classify_report_write(const char *dir, const dt_train_config *c, const dt_classify_outcome *o) {
    char cpu[256], path[4200];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "kind", "images");
    dt_run_json_command(j, c->argc, c->argv);
    cJSON *s = cJSON_AddObjectToObject(j, "settings");
    cJSON_AddStringToObject(s, "model", c->model);
    cJSON_AddNumberToObject(s, "parameters", (double)o->params);
    cJSON_AddStringToObject(s, "data", c->synthetic ? "synthetic" : c->data ? c->data : "");
    cJSON_AddNumberToObject(s, "batch", c->batch);
    cJSON_AddNumberToObject(s, "grad_accum", c->grad_accum);
    cJSON_AddNumberToObject(s, "images_per_step", o->images_per_step);
    cJSON_AddNumberToObject(s, "ranks", o->ranks);
    cJSON_AddStringToObject(s, "strategy", c->strategy ? c->strategy : o->ranks > 1 ? "ddp" : "single");
    cJSON_AddStringToObject(s, "optimizer", dt_optim_kind_name(c->opt.kind));
    cJSON_AddNumberToObject(s, "lr", c->sched.lr);
    cJSON_AddNumberToObject(s, "epochs", c->epochs);
    cJSON_AddNumberToObject(s, "steps_per_epoch", o->steps_per_epoch);
    cJSON_AddNumberToObject(s, "steps_done", o->steps_done);
    cJSON *m = cJSON_AddObjectToObject(j, "machine");
    cJSON_AddStringToObject(m, "cpu", dt_cpu_model(cpu, sizeof cpu));
    cJSON_AddNumberToObject(j, "wall_s", o->wall_s);
    cJSON_AddNumberToObject(j, "test_accuracy", o->test_accuracy);
    cJSON_AddNumberToObject(j, "img_per_s", o->img_per_s);
    cJSON_AddStringToObject(j, "metrics", o->metrics);
    snprintf(path, sizeof path, "%s/run.json", dir);
    dt_status st = dt_json_write_file(j, 1, path);
    snprintf(path, sizeof path, "%s/report.html", dir);
    return st ? st : dt_report_write(dir, path);
}
