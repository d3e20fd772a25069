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
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { printf("usage: dtrain plot METRICS.jsonl [-o loss.svg]\n"); return 0; }
        else in = argv[i];
    }
    if (!in) { dt_log(DT_LOG_ERROR, "plot: which metrics file? (dtrain plot METRICS.jsonl -o loss.svg)"); return 2; }
    if (dt_plot_losses(in, out)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    printf("wrote %s\n", out);
    return 0;
}
