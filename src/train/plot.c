/* dtrain plot: the loss curve of a metrics file (one JSON object per step)
 * as a small self-contained SVG: training loss as a line, validation loss as
 * dots, steps along x, loss along y with gridlines. */
#include "dtrain/io.h"
#include "dtrain/train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { double step, loss, val; } point;

dt_status dt_plot_losses(const char *in, const char *out) {
    FILE *f = fopen(in, "r");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", in, strerror(errno));
    size_t cap = 1024, n = 0;
    point *pts = malloc(cap * sizeof *pts);
    char line[4096];
    int lineno = 0;
    dt_status st = DT_OK;
    while (!st && fgets(line, sizeof line, f)) {
        lineno++;
        cJSON *j = cJSON_Parse(line);
        cJSON *s = j ? cJSON_GetObjectItem(j, "step") : NULL, *l = j ? cJSON_GetObjectItem(j, "loss") : NULL;
        cJSON *v = j ? cJSON_GetObjectItem(j, "val_loss") : NULL;
        if (!cJSON_IsNumber(s) || !cJSON_IsNumber(l)) st = dt_error(DT_ERR_IO, "%s: line %d has no numeric step and loss", in, lineno);
        else {
            if (n == cap) pts = realloc(pts, (cap *= 2) * sizeof *pts);
            pts[n++] = (point){ s->valuedouble, l->valuedouble, cJSON_IsNumber(v) ? v->valuedouble : NAN };
        }
        cJSON_Delete(j);
    }
    fclose(f);
    if (!st && n == 0) st = dt_error(DT_ERR_IO, "%s: no steps to plot", in);
    if (st) { free(pts); return st; }
    double x0 = pts[0].step, x1 = pts[n - 1].step, y0 = INFINITY, y1 = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        y0 = fmin(y0, pts[i].loss); y1 = fmax(y1, pts[i].loss);
        if (!isnan(pts[i].val)) { y0 = fmin(y0, pts[i].val); y1 = fmax(y1, pts[i].val); }
    }
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + 1;
    double pad = (y1 - y0) * 0.05;
    y0 -= pad;
    y1 += pad;
    const double W = 720, H = 420, L = 60, R = 20, Tp = 30, B = 45;
    size_t bufcap = 64 * n + 8192, len = 0;
    char *svg = malloc(bufcap);
#define OUT(...) len += (size_t)snprintf(svg + len, bufcap - len, __VA_ARGS__)
#define X(v) (L + ((v) - x0) / (x1 - x0) * (W - L - R))
#define Y(v) (Tp + (y1 - (v)) / (y1 - y0) * (H - Tp - B))
    OUT("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    OUT("<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    for (int k = 0; k <= 5; k++) {
        double yv = y0 + (y1 - y0) * k / 5, xv = x0 + (x1 - x0) * k / 5;
        OUT("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>", L, Y(yv), W - R, Y(yv));
        OUT("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", L - 6, Y(yv) + 4, yv);
        OUT("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", X(xv), H - B + 18, xv);
    }
    OUT("<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
    for (size_t i = 0; i < n; i++) OUT("%.1f,%.1f ", X(pts[i].step), Y(pts[i].loss));
    OUT("\"/>\n");
    for (size_t i = 0; i < n; i++)
        if (!isnan(pts[i].val)) OUT("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#d62728\"/>\n", X(pts[i].step), Y(pts[i].val));
    OUT("<text x=\"%.1f\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">loss (blue: training, red: validation)</text>\n", W / 2);
    OUT("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n</svg>\n", W / 2, H - 8);
#undef OUT
#undef X
#undef Y
    const void *parts[1] = { svg };
    size_t sizes[1] = { len };
    st = dt_file_write_atomic(out, parts, sizes, 1);
    free(svg);
    free(pts);
    return st;
}
