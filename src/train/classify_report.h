/* An image model's --report DIR (classify.c): run.json (kind "images") and report.html, the page dt_report_write
 * makes of it and the run's metrics. */
#ifndef DTRAIN_TRAIN_CLASSIFY_REPORT_H
#define DTRAIN_TRAIN_CLASSIFY_REPORT_H

#include "dtrain/train.h"

typedef struct {
    const char *metrics;       /* the metrics file the run wrote */
    size_t params;
    int ranks, steps_per_epoch, steps_done, images_per_step;
    double test_accuracy, img_per_s, wall_s; /* img/s: all ranks, the epochs' mean */
} dt_classify_outcome;

/* DIR made (a first step before the run, which also names the metrics file there when --metrics gives none: cap
 * bytes at metrics). */
dt_status dt_classify_report_prepare(const char *dir, char *metrics, size_t cap);
dt_status dt_classify_report_write(const char *dir, const dt_train_config *c, const dt_classify_outcome *o);

#endif
