/* Films of episodes: the frames a kind draws (env_internal.h's sketches),
 * kept as their points, written as one animated SVG whose moving shapes
 * step through their frames with SMIL (<animate> of "points"), which every
 * browser plays without script. */
#include "dtrain/io.h"
#include "env_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_env_film {
    const dt_env_kind *k;
    dt_env_sketch first; /* the shapes' kinds, colours and counts, and the first frame's points */
    int points;          /* in a frame, all shapes together */
    int frames, cap;
    float *xy;           /* [cap][points][2] */
};

dt_sketch_shape *dt_sketch_add(dt_env_sketch *sk, uint32_t rgb, float width) {
    if (sk->n >= DT_SKETCH_SHAPES) return NULL;
    dt_sketch_shape *sh = &sk->shape[sk->n++];
    sh->n = 0, sh->rgb = rgb, sh->width = width;
    return sh;
}

void dt_sketch_point(dt_sketch_shape *sh, double x, double y) {
    if (!sh || sh->n >= DT_SKETCH_POINTS) return;
    sh->xy[2 * sh->n] = (float)x, sh->xy[2 * sh->n + 1] = (float)y;
    sh->n++;
}

void dt_sketch_box(dt_env_sketch *sk, uint32_t rgb, double cx, double cy, double w, double h, double angle) {
    dt_sketch_shape *sh = dt_sketch_add(sk, rgb, 0);
    const double c = cos(angle), s = sin(angle), corner[4][2] = { { -1, -1 }, { 1, -1 }, { 1, 1 }, { -1, 1 } };
    for (int i = 0; i < 4; i++) {
        double x = corner[i][0] * w / 2, y = corner[i][1] * h / 2;
        dt_sketch_point(sh, cx + c * x - s * y, cy + s * x + c * y);
    }
}

dt_status dt_env_film_create(const dt_env *e, int max_frames, dt_env_film **out) {
    *out = NULL;
    const dt_env_kind *k = dt_env_kind_of(e);
    if (!k->draw) return dt_error(DT_ERR_UNSUPPORTED, "%s has no picture to film", k->info.id);
    if (max_frames < 1) return dt_error(DT_ERR_ARG, "a film of %d frames", max_frames);
    dt_env_film *f = calloc(1, sizeof *f);
    if (!f) return dt_error(DT_ERR_NOMEM, "film of %s: out of memory", k->info.id);
    f->k = k;
    f->cap = max_frames;
    *out = f;
    return DT_OK;
}

void dt_env_film_destroy(dt_env_film *f) {
    if (!f) return;
    free(f->xy);
    free(f);
}

dt_status dt_env_film_add(dt_env_film *f, const dt_env *e) {
    const void *state = dt_env_state(e);
    if (dt_env_kind_of(e) != f->k) return dt_error(DT_ERR_ARG, "a film of %s given a frame of %s", f->k->info.id, dt_env_get_info(e)->id);
    if (!state) return dt_error(DT_ERR_ARG, "film of %s: a frame before the environment's first reset", f->k->info.id);
    if (f->frames >= f->cap) return DT_OK;
    dt_env_sketch sk;
    memset(&sk, 0, sizeof sk);
    f->k->draw(state, &sk);
    if (!f->frames) { /* the first frame fixes the shapes: a kind draws the same ones every frame */
        f->first = sk;
        for (int i = 0; i < sk.n; i++) f->points += sk.shape[i].n;
        f->xy = malloc(sizeof(float) * 2 * (size_t)f->points * (size_t)f->cap + 1);
        if (!f->xy) return dt_error(DT_ERR_NOMEM, "film of %s: out of memory for %d frames", f->k->info.id, f->cap);
    }
    float *at = f->xy + (size_t)f->frames * 2 * (size_t)f->points;
    for (int i = 0, k = 0; i < f->first.n; k += f->first.shape[i].n, i++)
        memcpy(at + 2 * k, sk.shape[i].xy, sizeof(float) * 2 * (size_t)f->first.shape[i].n);
    f->frames++;
    return DT_OK;
}

int dt_env_film_frames(const dt_env_film *f) { return f->frames; }

/* frame t's points of the shape whose first point is point k, y flipped into SVG's downward axis */
static void points(FILE *o, const dt_env_film *f, int t, int k, int n, int prec) {
    const float *p = f->xy + ((size_t)t * (size_t)f->points + (size_t)k) * 2;
    for (int j = 0; j < n; j++)
        fprintf(o, "%s%.*f,%.*f", j ? " " : "", prec, (double)p[2 * j], prec, (double)(f->first.y0 + f->first.y1 - p[2 * j + 1]));
}

static int moves(const dt_env_film *f, int k, int n) {
    for (int t = 1; t < f->frames; t++)
        if (memcmp(f->xy + ((size_t)t * (size_t)f->points + (size_t)k) * 2, f->xy + (size_t)k * 2, sizeof(float) * 2 * (size_t)n))
            return 1;
    return 0;
}

dt_status dt_env_film_svg(const dt_env_film *f, const char *title, char **svg, size_t *len) {
    *svg = NULL;
    if (!f->frames) return dt_error(DT_ERR_ARG, "film of %s: no frames", f->k->info.id);
    FILE *o = open_memstream(svg, len);
    if (!o) return dt_error(DT_ERR_NOMEM, "film of %s: out of memory", f->k->info.id);
    const dt_env_sketch *s = &f->first;
    double w = s->x1 - s->x0, h = s->y1 - s->y0;
    int prec = w <= 0 ? 3 : (int)fmax(0, 3 - floor(log10(w)));
    fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"%g %g %g %g\" width=\"600\" height=\"%.0f\">\n", (double)s->x0,
            (double)s->y0, w, h, 600 * h / w);
    fputs("<title>", o);
    for (const char *c = title ? title : f->k->info.id; *c; c++)
        fputs(*c == '<' ? "&lt;" : *c == '>' ? "&gt;" : *c == '&' ? "&amp;" : (char[2]){ *c, 0 }, o);
    fputs("</title>\n", o);
    for (int i = 0, k = 0; i < s->n; k += s->shape[i].n, i++) {
        const dt_sketch_shape *sh = &s->shape[i];
        if (sh->n < 2) continue;
        if (sh->width > 0)
            fprintf(o, "<polyline fill=\"none\" stroke=\"#%06x\" stroke-width=\"%g\" stroke-linecap=\"round\" points=\"", sh->rgb & 0xffffff,
                    (double)sh->width);
        else
            fprintf(o, "<polygon fill=\"#%06x\" points=\"", sh->rgb & 0xffffff);
        points(o, f, 0, k, sh->n, prec);
        if (!moves(f, k, sh->n)) {
            fputs("\"/>\n", o);
            continue;
        }
        fprintf(o, "\"><animate attributeName=\"points\" dur=\"%gs\" repeatCount=\"indefinite\" calcMode=\"discrete\" values=\"",
                (double)f->frames / f->k->fps);
        for (int t = 0; t < f->frames; t++) {
            if (t) fputc(';', o);
            points(o, f, t, k, sh->n, prec);
        }
        fprintf(o, "\"/></%s>\n", sh->width > 0 ? "polyline" : "polygon");
    }
    fputs("</svg>\n", o);
    if (fclose(o)) { free(*svg); *svg = NULL; return dt_error(DT_ERR_NOMEM, "film of %s: out of memory", f->k->info.id); }
    return DT_OK;
}

dt_status dt_env_film_write(const dt_env_film *f, const char *title, const char *path) {
    char *svg;
    size_t len;
    dt_status st = dt_env_film_svg(f, title, &svg, &len);
    if (st) return st;
    const void *parts[1] = { svg };
    st = dt_file_write_atomic(path, parts, &len, 1);
    free(svg);
    return st;
}
