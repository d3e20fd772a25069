/* dtrain plot: the loss curve of a metrics file (one JSON object per step)
 * as a small self-contained SVG: training loss as a line, validation loss as
 * dots, steps along x, loss in nats along y (linear or log) with gridlines at
 * round values. Steps whose loss is null (not finite) leave a gap. An image
 * model's file also holds each epoch's summary and --eval-every's accuracy
 * lines: they are not a step's loss, and are passed over. */
#include "dtrain/io.h"
#include "dtrain/train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { double step, loss, val; } point;

static double num_or_nan(const cJSON *v) { return cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : NAN; }

/* Whether a line without a step's loss is one an image model writes beside its steps: an epoch's summary ("epoch",
 * "train_loss") or an evaluation ("step", "test_accuracy"). */
static bool image_summary(const cJSON *j) {
    return (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "epoch")) && cJSON_GetObjectItemCaseSensitive(j, "train_loss")) ||
           (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "step")) && cJSON_GetObjectItemCaseSensitive(j, "test_accuracy"));
}

static dt_status read_points(const char *in, point **out, size_t *count) {
    FILE *f = fopen(in, "r");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", in, strerror(errno));
    size_t cap = 1024, n = 0;
    point *pts = malloc(cap * sizeof *pts);
    char *line = NULL;
    size_t lcap = 0;
    int lineno = 0;
    dt_status st = pts ? DT_OK : dt_error(DT_ERR_NOMEM, "%s: out of memory", in);
    while (!st && getline(&line, &lcap, f) > 0) {
        lineno++;
        cJSON *j = cJSON_Parse(line);
        cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step"), *l = cJSON_GetObjectItemCaseSensitive(j, "loss");
        bool point_line = cJSON_IsNumber(s) && isfinite(s->valuedouble) && (cJSON_IsNumber(l) || cJSON_IsNull(l));
        if (!point_line && !image_summary(j))
            st = dt_error(DT_ERR_IO, "%s: line %d has no numeric step and loss (or null loss)", in, lineno);
        else if (point_line) {
            if (n == cap) {
                point *g = realloc(pts, (cap *= 2) * sizeof *pts);
                if (!g) st = dt_error(DT_ERR_NOMEM, "%s: out of memory at line %d", in, lineno);
                else pts = g;
            }
            if (!st) pts[n++] = (point){ s->valuedouble, num_or_nan(l), num_or_nan(cJSON_GetObjectItemCaseSensitive(j, "val_loss")) };
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    if (!st && n == 0) st = dt_error(DT_ERR_IO, "%s: no steps to plot", in);
    if (st) { free(pts); return st; }
    *out = pts;
    *count = n;
    return DT_OK;
}

/* A round tick spacing (1, 2 or 5 times a power of ten) giving about `want` ticks over span. */
static double tick_step(double span, int want) {
    double raw = span / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

typedef struct { char *buf; size_t len, cap; } text;

static void out(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(text *t, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (t->buf && t->len + (size_t)n < t->cap) { t->len += (size_t)n; return; }
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *g = realloc(t->buf, cap);
        if (!g) return; /* the caller sees a short document as out of memory */
        t->buf = g;
        t->cap = cap;
    }
}

/* The plot's frame: the steps' range on x, the losses' (log10 of them on a log axis) on y, and the page's margins. */
typedef struct {
    double x0, x1, ty0, ty1;
    bool log_y;
} frame;

static const double W = 720, H = 420, ML = 70, MR = 20, MT = 30, MB = 45;

static double ty(const frame *f, double v) { return f->log_y ? log10(v) : v; }
static double px(const frame *f, double step) { return ML + (step - f->x0) / (f->x1 - f->x0) * (W - ML - MR); }
static double py(const frame *f, double v) { return MT + (f->ty1 - ty(f, v)) / (f->ty1 - f->ty0) * (H - MT - MB); }

static bool drawn(const frame *f, double v) { return !isnan(v) && !(f->log_y && v <= 0); }

/* The frame around every point's step and finite losses (positive ones on a log axis), 5% of room above and below. */
static frame frame_of(const point *pts, size_t n, bool log_y) {
    frame f = { .x0 = pts[0].step, .x1 = pts[n - 1].step, .log_y = log_y };
    double y0 = INFINITY, y1 = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        f.x0 = fmin(f.x0, pts[i].step), f.x1 = fmax(f.x1, pts[i].step);
        for (int k = 0; k < 2; k++) {
            double v = k ? pts[i].val : pts[i].loss;
            if (drawn(&f, v)) y0 = fmin(y0, v), y1 = fmax(y1, v);
        }
    }
    if (!(y0 <= y1)) y0 = log_y ? 1 : 0, y1 = y0 + 1;
    if (f.x1 <= f.x0) f.x1 = f.x0 + 1;
    f.ty0 = ty(&f, y0), f.ty1 = ty(&f, y1);
    if (f.ty1 - f.ty0 < 1e-9) f.ty0 -= 0.5, f.ty1 += 0.5;
    double pad = (f.ty1 - f.ty0) * 0.05;
    f.ty0 -= pad, f.ty1 += pad;
    return f;
}

static void gridline(text *t, const frame *f, double yv, double label) {
    out(t, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>", ML, py(f, yv), W - MR, py(f, yv));
    out(t, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", ML - 6, py(f, yv) + 4, label);
}

/* y gridlines at round values: 1-2-5 steps, or each power of ten (and 2x, 5x) on a log axis */
static void y_grid(text *t, const frame *f) {
    double ty0 = f->ty0, ty1 = f->ty1;
    if (f->log_y && ty1 - ty0 < 1) {
        /* less than a decade (losses from 11 down to 2.3): round values from a fine 1-2-5 grid, kept where they lie
         * at least 24 px above the last one kept, from the bottom up: dense where the log axis stretches (low
         * losses), sparse where it squeezes */
        double v0 = pow(10, ty0), v1 = pow(10, ty1), dy = tick_step(v1 - v0, 30), k0 = ceil(v0 / dy), last = 1e30;
        for (int k = 0; k <= 200 && (k0 + k) * dy <= v1 * (1 + 1e-9); k++) {
            double yv = (k0 + k) * dy;
            if (last - py(f, yv) < 24) continue;
            last = py(f, yv);
            gridline(t, f, yv, yv);
        }
    } else if (f->log_y) {
        for (double d = pow(10, floor(ty0)), e = 0; d <= pow(10, ceil(ty1)) && e < 40; d *= 10, e++)
            /* 1, 2, 5 per decade; every digit when the axis spans less than a decade */
            for (int m = 1; m <= (ty1 - ty0 < 1 ? 9 : 5); m += ty1 - ty0 < 1 ? 1 : (m == 1 ? 1 : 3)) {
                double yv = d * m;
                if (ty(f, yv) >= ty0 && ty(f, yv) <= ty1) gridline(t, f, yv, yv);
            }
    } else {
        /* ticks counted in whole steps: adding a step far smaller than the values
         * (steps near 1e16) would never move the loop */
        double dy = tick_step(ty1 - ty0, 6), k0 = ceil(ty0 / dy);
        for (int k = 0; k <= 20 && (k0 + k) * dy <= ty1 + dy * 1e-9; k++) {
            double yv = (k0 + k) * dy;
            gridline(t, f, yv, fabs(yv) < dy * 1e-6 ? 0 : yv);
        }
    }
}

/* The steps on x; the training curve, broken where a loss was not drawn; the validation points; the labels. */
static void curves(text *t, const frame *f, const point *pts, size_t n) {
    double dx = tick_step(f->x1 - f->x0, 6), kx = ceil(f->x0 / dx);
    for (int k = 0; k <= 20 && (kx + k) * dx <= f->x1 + dx * 1e-9; k++)
        out(t, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", px(f, (kx + k) * dx), H - MB + 18, (kx + k) * dx);
    bool open = false, has_val = false;
    for (size_t i = 0; i < n; i++) {
        bool ok = drawn(f, pts[i].loss);
        if (ok && !open) { out(t, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\""); open = true; }
        if (ok) out(t, "%.1f,%.1f ", px(f, pts[i].step), py(f, pts[i].loss));
        if (open && (!ok || i + 1 == n)) { out(t, "\"/>\n"); open = false; }
    }
    for (size_t i = 0; i < n; i++) {
        has_val |= !isnan(pts[i].val);
        if (drawn(f, pts[i].val)) out(t, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#d62728\"/>\n", px(f, pts[i].step), py(f, pts[i].val));
    }
    out(t, "<text x=\"%.1f\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">blue: training loss%s</text>\n", W / 2,
        has_val ? ", red: validation loss" : "");
    out(t, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", W / 2, H - 8);
    out(t, "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">loss (nats per token%s)</text>\n",
        (H - MB + MT) / 2, (H - MB + MT) / 2, f->log_y ? ", log scale" : "");
}

dt_status dt_plot_svg(const char *in, int log_y, char **svg, size_t *len) {
    point *pts = NULL;
    size_t n = 0;
    dt_status st = read_points(in, &pts, &n);
    if (st) return st;
    frame f = frame_of(pts, n, log_y != 0);
    text t = { 0 };
    out(&t, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    out(&t, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    y_grid(&t, &f);
    curves(&t, &f, pts, n);
    out(&t, "</svg>\n");
    free(pts);
    if (!t.buf || !strstr(t.buf, "</svg>")) { free(t.buf); return dt_error(DT_ERR_NOMEM, "%s: out of memory drawing the plot", in); }
    *svg = t.buf;
    *len = t.len;
    return DT_OK;
}

dt_status dt_plot_losses(const char *metrics_path, const char *svg_path, int log_y) {
    char *svg;
    size_t len;
    dt_status st = dt_plot_svg(metrics_path, log_y, &svg, &len);
    if (st) return st;
    const void *parts[1] = { svg };
    size_t sizes[1] = { len };
    st = dt_file_write_atomic(svg_path, parts, sizes, 1);
    free(svg);
    return st;
}
