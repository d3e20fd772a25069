/* dtrain launch -n N [--] PROGRAM [ARGS...] */
#include "cli.h"
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dt_cli_launch(int argc, char **argv) {
    int n = -1, i = 1;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        if ((!strcmp(argv[i], "-n") || !strcmp(argv[i], "--nproc")) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 100000) {
                dt_log(DT_LOG_ERROR, "launch: -n expects a positive number of ranks, got '%s'", argv[i]);
                return 2;
            }
            n = (int)v;
            continue;
        }
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dtrain launch -n N [--] PROGRAM [ARGS...]\n"
                   "Runs N ranks of PROGRAM on this machine, wired over shared memory.\n"
                   "Exits non-zero, naming the rank, as soon as any rank fails.\n"
                   "Each rank gets OMP_NUM_THREADS = its share of the cores (cores / N, at least 1)\n"
                   "unless the environment sets it; dtrain's own commands take that count.\n");
            return 0;
        }
        if (argv[i][0] == '-') { dt_log(DT_LOG_ERROR, "launch: unknown flag '%s'", argv[i]); return 2; }
        break;
    }
    if (n < 0) { dt_log(DT_LOG_ERROR, "launch: -n N is required"); return 2; }
    if (i >= argc) { dt_log(DT_LOG_ERROR, "launch: no program given"); return 2; }
    return dt_comm_launch(n, argv + i);
}
