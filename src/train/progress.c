/* Progress: one line per step (or per print_every) where stdout is not a
 * terminal of our own (a file, a pipe, or mpirun's pty, whose \r-joined
 * lines would make one huge log line); on a terminal one line redrawn in
 * place, fitted to its width by leaving out whole fields (the learning rate
 * first, then the norm, a pipeline's bubble, MFU, the time per step), never
 * cutting one. */
#include "progress.h"

#include <math.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>

enum { PREFIX, STEP, LOSS, REWARD, LR, NORM, MS, RATE, MFU, BUBBLE, EXPERTS, ETA, NF };

static void fields(const dt_progress *p, char f[NF][48]) {
    int eta = (int)(p->elapsed / (p->step + 1 - p->first) * (p->steps - p->step - 1)); /* this process's pace */
    snprintf(f[PREFIX], 48, "%s", p->prefix ? p->prefix : "");
    snprintf(f[STEP], 48, "step %d/%d", p->step + 1, p->steps);
    snprintf(f[LOSS], 48, "loss %.4f", p->loss);
    f[REWARD][0] = 0;
    if (p->grpo) snprintf(f[REWARD], 48, "reward %.3f kl %.4f", p->reward, p->kl);
    snprintf(f[LR], 48, "lr %.2e", p->lr);
    /* a skipped step's norm overflowed (fp16) or is NaN: say so, not "-nan" */
    if (isfinite(p->norm)) snprintf(f[NORM], 48, "norm %.3f", p->norm);
    else snprintf(f[NORM], 48, "norm %s%s", isnan(p->norm) ? "NaN" : "inf", p->skipped ? " (skipped)" : "");
    snprintf(f[MS], 48, "%.0f ms", p->ms);
    snprintf(f[RATE], 48, "%.0f %s", p->rate, p->unit);
    f[MFU][0] = 0;
    if (p->mfu > 0) snprintf(f[MFU], 48, "MFU %.1f%%", 100 * p->mfu);
    f[BUBBLE][0] = 0;
    if (!isnan(p->bubble)) snprintf(f[BUBBLE], 48, "bubble %.1f%%", 100 * p->bubble);
    f[EXPERTS][0] = 0;
    if (p->experts > 0) snprintf(f[EXPERTS], 48, p->dropped >= 0 ? "load max/mean %.2f dropped %.1f%%" : "load max/mean %.2f", p->experts,
                                 100 * p->dropped);
    snprintf(f[ETA], 48, "ETA %dm%02ds", eta / 60, eta % 60);
}

/* The fields that fit in cols - 1 characters, joined into line; its length. */
static int fit(char f[NF][48], int cols, char *line, size_t cap) {
    static const int drop_order[] = { LR, NORM, EXPERTS, BUBBLE, MFU, MS, RATE };
    bool shown[NF];
    for (int k = 0; k < NF; k++) shown[k] = f[k][0] != 0;
    int n = 0;
    for (int d = 0;; d++) {
        n = 0;
        for (int k = 0; k < NF; k++)
            if (shown[k]) n += snprintf(line + n, cap - (size_t)n, "%s%s", n ? " " : "", f[k]);
        if (n <= cols - 1 || d == (int)(sizeof drop_order / sizeof drop_order[0])) return n;
        shown[drop_order[d]] = false;
    }
}

void dt_progress_print(bool tty, int print_every, const dt_progress *p) {
    char f[NF][48], line[512];
    fields(p, f);
    int cols = 1 << 20;
    struct winsize ws;
    if (tty) cols = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
    int n = fit(f, cols, line, sizeof line);
    if (!tty) {
        if ((p->step + 1) % print_every == 0 || p->step + 1 == p->steps || !isnan(p->val)) printf("%s\n", line);
    } else {
        int width = cols - 1 - n - 3;
        if (width > 24) width = 24;
        char bar[32] = "";
        if (width >= 8) {
            int done = (int)((double)(p->step + 1) / p->steps * width);
            for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
            bar[width] = 0;
        }
        printf("\r%s%s%s%s\033[K", line, bar[0] ? " [" : "", bar, bar[0] ? "]" : "");
    }
    if (!isnan(p->val)) {
        printf("%sval loss %.4f", tty ? "\n" : "", p->val);
        if (p->val_experts > 0) printf(" (experts' load max/mean %.2f)", p->val_experts);
        printf("\n");
    }
    fflush(stdout);
}
