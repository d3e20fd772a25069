/* dtrain report: one self-contained HTML page of a run directory. The data
 * (run.json, the metrics, the trace's intervals, scaling.json) is checked
 * here and embedded as JSON; the page draws it with Chart.js, inlined from
 * Debian's libjs-chart.js, so the page needs nothing else and works offline.
 * Chart.js because it is kept up in Debian, draws hoverable line, stacked and
 * floating-bar (timeline) charts on a canvas, and is one file; the page adds
 * drag-to-zoom (report_page.js). */
#include "dtrain/obs.h"
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const char dt_report_page_js[], dt_report_page_css[];

enum { MAX_POINTS = 5000, MAX_INTERVALS = 40000 };
static const size_t MAX_FILE = (size_t)1 << 30;

static const char *chartjs_path(void) {
    const char *env = getenv("DTRAIN_CHARTJS");
    if (env && *env) return env;
    return "/usr/share/javascript/chart.js/chart.min.js";
}

/* An optional JSON file of the run: NULL when absent, an error when damaged. */
static dt_status read_json(const char *path, cJSON **out) {
    *out = NULL;
    if (access(path, F_OK) != 0) return DT_OK;
    char *t;
    dt_status st = dt_file_read_text(path, MAX_FILE, &t, NULL);
    if (st) return st;
    *out = cJSON_Parse(t);
    free(t);
    return *out ? DT_OK : dt_error(DT_ERR_IO, "%s: not valid JSON", path);
}

/* The metrics: one object per line with a numeric step; thinned to MAX_POINTS
 * (every k-th line, the validation losses all kept). */
static dt_status read_metrics(const char *path, cJSON **out) {
    char *t;
    size_t n;
    *out = NULL;
    dt_status st = dt_file_read_text(path, MAX_FILE, &t, &n);
    if (st) return st;
    size_t lines = 0;
    for (size_t i = 0; i < n; i++) lines += t[i] == '\n';
    size_t every = lines / MAX_POINTS + 1, k = 0;
    cJSON *arr = cJSON_CreateArray();
    int lineno = 0;
    for (char *line = t, *next; !st && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        if (!line[strspn(line, " \t\r")]) continue;
        cJSON *j = cJSON_Parse(line);
        cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
        /* an image model's epoch summary has its epoch, not a step (the page places it by the epoch's steps) */
        bool summary = !cJSON_IsNumber(s) && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "epoch")) &&
                       cJSON_GetObjectItemCaseSensitive(j, "train_loss");
        if (!cJSON_IsObject(j) || (!cJSON_IsNumber(s) && !summary)) {
            st = dt_error(DT_ERR_IO, "%s: line %d is not a metrics record (a JSON object with a numeric \"step\")", path, lineno);
            cJSON_Delete(j);
            break;
        }
        /* evaluations are kept whatever the thinning */
        if (k++ % every == 0 || summary || cJSON_GetObjectItemCaseSensitive(j, "val_loss") || cJSON_GetObjectItemCaseSensitive(j, "test_accuracy"))
            cJSON_AddItemToArray(arr, j);
        else cJSON_Delete(j);
    }
    free(t);
    if (!st && cJSON_GetArraySize(arr) == 0) st = dt_error(DT_ERR_IO, "%s: no steps recorded", path);
    if (st) { cJSON_Delete(arr); return st; }
    *out = arr;
    return DT_OK;
}

/* The trace's begin/end pairs as intervals [rank, track, start ms, end ms,
 * name, args] for the timeline (the first MAX_INTERVALS). */
static dt_status trace_intervals(const char *path, const cJSON *trace, cJSON **out) {
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(trace, "traceEvents");
    if (!cJSON_IsArray(ev)) return dt_error(DT_ERR_IO, "%s: no \"traceEvents\" array (not a dtrain trace)", path);
    enum { DEPTH = 64, TRACKS = 8 };
    typedef struct { const cJSON *b[DEPTH]; int n; } stack;
    int ranks = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
        if (cJSON_IsNumber(pid) && pid->valueint >= ranks && pid->valueint < 4096) ranks = pid->valueint + 1;
    }
    stack *open = calloc((size_t)(ranks ? ranks : 1) * TRACKS, sizeof *open);
    if (!open) return dt_error(DT_ERR_NOMEM, "report: out of memory");
    cJSON *arr = cJSON_CreateArray();
    int kept = 0;
    cJSON_ArrayForEach(e, ev) {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph"), *pid = cJSON_GetObjectItemCaseSensitive(e, "pid"),
                    *tid = cJSON_GetObjectItemCaseSensitive(e, "tid"), *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
        if (!cJSON_IsString(ph) || !cJSON_IsNumber(pid) || !cJSON_IsNumber(tid) || !cJSON_IsNumber(ts)) continue;
        if (pid->valueint < 0 || pid->valueint >= ranks || tid->valueint < 1 || tid->valueint > TRACKS) continue;
        stack *s = &open[(size_t)pid->valueint * TRACKS + (size_t)(tid->valueint - 1)];
        if (!strcmp(ph->valuestring, "B") && s->n < DEPTH) s->b[s->n++] = e;
        else if (!strcmp(ph->valuestring, "E") && s->n > 0 && kept < MAX_INTERVALS) {
            const cJSON *b = s->b[--s->n];
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name"), *args = cJSON_GetObjectItemCaseSensitive(b, "args");
            char *a = args ? cJSON_PrintUnformatted(args) : NULL;
            cJSON *iv = cJSON_CreateArray();
            cJSON_AddItemToArray(iv, cJSON_CreateNumber(pid->valueint));
            cJSON_AddItemToArray(iv, cJSON_CreateNumber(tid->valueint - 1));
            cJSON_AddItemToArray(iv, cJSON_CreateNumber(cJSON_GetObjectItemCaseSensitive(b, "ts")->valuedouble / 1e3));
            cJSON_AddItemToArray(iv, cJSON_CreateNumber(ts->valuedouble / 1e3));
            cJSON_AddItemToArray(iv, cJSON_CreateString(cJSON_IsString(name) ? name->valuestring : "?"));
            cJSON_AddItemToArray(iv, cJSON_CreateString(a ? a : ""));
            free(a);
            cJSON_AddItemToArray(arr, iv);
            kept++;
        }
    }
    free(open);
    *out = arr;
    return DT_OK;
}

/* JSON text that may sit inside <script>: "</" would end it. */
static void put_json(FILE *f, const char *var, const cJSON *j) {
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    fprintf(f, "const %s = ", var);
    if (!t) fputs("null", f);
    for (const char *p = t; p && *p; p++) {
        if (p[0] == '<' && p[1] == '/') fputs("<\\", f);
        else fputc(*p, f);
    }
    fputs(";\n", f);
    free(t);
}

typedef struct {
    cJSON *run, *metrics, *intervals, *scaling, *film; /* film: an episode's SVG (dtrain rl --report), a string */
    char *chartjs;
    size_t chartjs_len;
} report_data;

static void data_free(report_data *d) {
    cJSON_Delete(d->run);
    cJSON_Delete(d->metrics);
    cJSON_Delete(d->intervals);
    cJSON_Delete(d->scaling);
    cJSON_Delete(d->film);
    free(d->chartjs);
}

/* Where run.json says a file is, else DIR/name. */
static void locate(const char *dir, const cJSON *run, const char *key, const char *name, char *out, size_t cap) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(run, key);
    if (cJSON_IsString(p) && *p->valuestring && access(p->valuestring, R_OK) == 0) snprintf(out, cap, "%s", p->valuestring);
    else snprintf(out, cap, "%s/%s", dir, name);
}

static dt_status gather_data(const char *dir, report_data *d) {
    char path[4200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    dt_status st = read_json(path, &d->run);
    if (st) return st;
    if (d->run && !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(d->run, "settings")))
        return dt_error(DT_ERR_IO, "%s: not a dtrain run record (no \"settings\" object)", path);
    locate(dir, d->run, "metrics", "metrics.jsonl", path, sizeof path);
    if (access(path, R_OK) != 0)
        return dt_error(DT_ERR_IO, "%s: no metrics there (%s): a run directory is what dtrain train --report DIR writes, "
                        "or any directory with a metrics.jsonl from --metrics", dir, path);
    if ((st = read_metrics(path, &d->metrics))) return st;
    locate(dir, d->run, "trace", "trace.json", path, sizeof path);
    cJSON *trace = NULL;
    if ((st = read_json(path, &trace))) return st;
    if (trace) st = trace_intervals(path, trace, &d->intervals);
    cJSON_Delete(trace);
    if (st) return st;
    snprintf(path, sizeof path, "%s/scaling.json", dir);
    if ((st = read_json(path, &d->scaling))) return st;
    snprintf(path, sizeof path, "%s/film.svg", dir);
    char *svg;
    size_t svg_len;
    if (access(path, R_OK) == 0) {
        if ((st = dt_file_read_text(path, MAX_FILE, &svg, &svg_len))) return st;
        d->film = cJSON_CreateString(svg);
        free(svg);
        if (!d->film) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    st = dt_file_read_text(chartjs_path(), 16 << 20, &d->chartjs, &d->chartjs_len);
    if (st) return dt_error(DT_ERR_IO, "the chart library is missing (%s): install Debian's libjs-chart.js "
                            "(scripts/install-deps.sh does), or point DTRAIN_CHARTJS at chart.min.js", dt_last_error());
    return DT_OK;
}

static void put_page(FILE *f, const char *dir, const report_data *d) {
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n", f);
    fputs("<title>dtrain run: ", f);
    for (const char *p = dir; *p; p++) {
        if (*p == '<') fputs("&lt;", f);
        else if (*p == '&') fputs("&amp;", f);
        else fputc(*p, f);
    }
    fprintf(f, "</title>\n<style>\n%s</style>\n</head><body>\n", dt_report_page_css);
    fputs("<header><h1>dtrain run</h1><p id=\"command\"></p></header>\n<main id=\"page\"></main>\n"
          "<pre id=\"errors\"></pre>\n<footer><span id=\"render-status\">not rendered (JavaScript is off?)</span></footer>\n", f);
    /* the library, as shipped (MIT licence); its own "</script>"-free text */
    fputs("<script>\n", f);
    fwrite(d->chartjs, 1, d->chartjs_len, f);
    fputs("\n</script>\n<script>\n", f);
    put_json(f, "RUN", d->run);
    put_json(f, "METRICS", d->metrics);
    put_json(f, "INTERVALS", d->intervals);
    put_json(f, "SCALING", d->scaling);
    put_json(f, "FILM", d->film);
    fprintf(f, "%s</script>\n</body></html>\n", dt_report_page_js);
}

dt_status dt_report_write(const char *dir, const char *html_path) {
    report_data d = { 0 };
    dt_status st = gather_data(dir, &d);
    if (!st && strstr(d.chartjs, "</script")) st = dt_error(DT_ERR_IO, "%s: contains </script> and cannot be inlined", chartjs_path());
    char *page = NULL;
    size_t len = 0;
    FILE *f = st ? NULL : open_memstream(&page, &len);
    if (!st && !f) st = dt_error(DT_ERR_NOMEM, "report: out of memory");
    if (f) {
        put_page(f, dir, &d);
        if (fclose(f) != 0) st = dt_error(DT_ERR_NOMEM, "report: out of memory");
    }
    data_free(&d);
    if (!st) {
        const void *parts[1] = { page };
        st = dt_file_write_atomic(html_path, parts, &len, 1);
    }
    free(page);
    return st;
}
