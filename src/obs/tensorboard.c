/* TensorBoard event files: `--tensorboard DIR` writes
 * DIR/events.out.tfevents.<time>.<host>.<pid>, which `tensorboard --logdir
 * DIR` shows. A file is a sequence of records (TFRecord's framing: the
 * length as 8 bytes, its masked CRC-32C, the data, the data's masked
 * CRC-32C); each record's data is an Event protobuf (tensorboard_event.proto,
 * packed by protobuf-c): the first names the format ("brain.Event:2"), each
 * later one holds a step's scalars. Written and flushed a step at a time, so
 * a live TensorBoard follows the run. */
#include "dtrain/obs.h"
#include "tensorboard_event.pb-c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_SCALARS 16

struct dt_tb_writer {
    FILE *f;
    char path[4400];
    Dtrain__Tb__SummaryValue values[MAX_SCALARS];
    char tags[MAX_SCALARS][48];
    int n;
    long step;
};

static uint32_t masked_crc(const void *p, size_t n) {
    uint32_t c = dt_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_u32(unsigned char *b, uint32_t v) { for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> 8 * i); }

/* One Event as one record. */
static dt_status write_event(dt_tb_writer *w, const Dtrain__Tb__Event *ev) {
    size_t n = dtrain__tb__event__get_packed_size(ev);
    unsigned char head[12], tail[4], *data = malloc(n ? n : 1);
    if (!data) return dt_error(DT_ERR_NOMEM, "%s: out of memory for an event", w->path);
    dtrain__tb__event__pack(ev, data);
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)n >> 8 * i);
    put_u32(head + 8, masked_crc(head, 8));
    put_u32(tail, masked_crc(data, n));
    bool ok = fwrite(head, 1, 12, w->f) == 12 && fwrite(data, 1, n, w->f) == n && fwrite(tail, 1, 4, w->f) == 4 && fflush(w->f) == 0;
    free(data);
    return ok ? DT_OK : dt_error(DT_ERR_IO, "%s: cannot write: %s", w->path, strerror(errno));
}

static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

dt_status dt_tb_create(const char *dir, dt_tb_writer **out) {
    *out = NULL;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return dt_error(DT_ERR_IO, "--tensorboard %s: cannot create the folder: %s", dir, strerror(errno));
    dt_tb_writer *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_NOMEM, "--tensorboard: out of memory");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%ld.%s.%d", dir, (long)time(NULL), host, (int)getpid());
    if (!(w->f = fopen(w->path, "wb"))) {
        dt_status st = dt_error(DT_ERR_IO, "--tensorboard: cannot write %s: %s", w->path, strerror(errno));
        free(w);
        return st;
    }
    Dtrain__Tb__Event ev = DTRAIN__TB__EVENT__INIT;
    ev.wall_time = wall_now();
    ev.what_case = DTRAIN__TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    dt_status st = write_event(w, &ev);
    if (st) { dt_tb_destroy(w); return st; }
    *out = w;
    return DT_OK;
}

void dt_tb_scalar(dt_tb_writer *w, const char *tag, double value) {
    if (!w || w->n == MAX_SCALARS) return;
    Dtrain__Tb__SummaryValue *v = &w->values[w->n];
    dtrain__tb__summary_value__init(v);
    snprintf(w->tags[w->n], sizeof w->tags[w->n], "%s", tag);
    v->tag = w->tags[w->n];
    v->simple_value = (float)value;
    w->n++;
}

dt_status dt_tb_step(dt_tb_writer *w, long step) {
    if (!w || w->n == 0) return DT_OK;
    Dtrain__Tb__SummaryValue *vs[MAX_SCALARS];
    for (int i = 0; i < w->n; i++) vs[i] = &w->values[i];
    Dtrain__Tb__Summary sum = DTRAIN__TB__SUMMARY__INIT;
    sum.n_value = (size_t)w->n;
    sum.value = vs;
    Dtrain__Tb__Event ev = DTRAIN__TB__EVENT__INIT;
    ev.wall_time = wall_now();
    ev.step = step;
    ev.what_case = DTRAIN__TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    w->n = 0;
    return write_event(w, &ev);
}

const char *dt_tb_path(const dt_tb_writer *w) { return w ? w->path : ""; }

void dt_tb_destroy(dt_tb_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w);
}
