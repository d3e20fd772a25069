/* dtrain plot: flag parsing only. */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/train.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* dtrain plot METRICS.jsonl -o loss.svg */
int dt_cli_plot(int argc, char **argv) {
    const char *in = NULL, *out = "loss.svg";
    int log_y = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--log")) log_y = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dtrain plot METRICS.jsonl [-o loss.svg] [--log]\n  --log  logarithmic loss axis\n");
            return 0;
        } else if (argv[i][0] == '-') {
            dt_log(DT_LOG_ERROR, "plot: unknown flag %s (expected -o FILE or --log)", argv[i]);
            return 2;
        } else in = argv[i];
    }
    if (!in) { dt_log(DT_LOG_ERROR, "plot: which metrics file? (dtrain plot METRICS.jsonl -o loss.svg)"); return 2; }
    if (dt_plot_losses(in, out, log_y)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    printf("wrote %s\n", out);
    return 0;
}
