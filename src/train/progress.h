/* The progress line of a training run (GPT-2's and the image models'). */
#ifndef DT_TRAIN_PROGRESS_H
#define DT_TRAIN_PROGRESS_H

#include <stdbool.h>

typedef struct {
    int step, steps, first;  /* the step just done (0-based), the run's steps, the first this process ran */
    float loss, lr;
    double norm;
    bool skipped;            /* no update: the norm overflowed (fp16) or was not finite */
    double ms, rate;         /* the step's time; tokens or images a second */
    const char *unit;        /* "tok/s", "img/s" */
    double mfu;              /* 0: not shown */
    double bubble;           /* a pipeline's idle share of the step (NAN: no pipeline, not shown) */
    double experts;          /* a mixture of experts' most loaded expert over the mean, the worst layer's (0: not shown) */
    double dropped;          /* and the share of its choices a capacity dropped (below 0 or 0 with no experts: not shown) */
    double elapsed;          /* seconds since this process's first step */
    const char *prefix;      /* before the fields ("epoch 2/5"), or NULL */
    float val;               /* a validation loss to print after it (NAN: none) */
    double val_experts;      /* and the experts' load over its batches, the worst layer's (0: not shown) */
    bool grpo;               /* GRPO's step: its mean reward and KL estimate shown */
    double reward, kl;
} dt_progress;

/* One line per print_every steps (and the last) where stdout is not our
 * terminal; on a terminal one line redrawn in place, fitted to its width. */
void dt_progress_print(bool tty, int print_every, const dt_progress *p);

#endif
