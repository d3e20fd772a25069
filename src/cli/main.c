/* dtrain: the command. Each subcommand parses its own flags and calls the
 * library; nothing here decides anything else. */
#include "cli.h"
#include "dtrain/base.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Flag helpers shared by the subcommands. */
int dt_cli_bad(const char *flag, const char *v) {
    dt_log(DT_LOG_ERROR, "%s %s is not valid (see --help)", flag, v ? v : "(missing)");
    return 2;
}

int dt_cli_number(const char *s, double lo, double hi, double *out) {
    if (!s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
}


static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain COMMAND [ARGS]\n"
            "\n"
            "commands:\n"
            "  launch -n N [--] PROGRAM [ARGS]  run N local ranks of PROGRAM over shared memory\n"
            "  bench comm [FLAGS]               collective latency and bandwidth (see dtrain bench comm --help)\n"
            "  train --data FILE [FLAGS]        train a GPT-2 on one process (see dtrain train --help)\n"
            "  tokenize --bytes IN OUT          text to a token file\n"
            "  generate --model F --prompt T    sample text from a trained model\n"
            "  plot METRICS.jsonl -o loss.svg   draw the loss curve\n"
            "  help                             this text\n"
            "\n"
            "Under mpirun/srun, programs built on dtrain use MPI between machines and\n"
            "shared memory inside each.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "launch")) return dt_cli_launch(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return dt_cli_bench(argc, argv);
    if (!strcmp(cmd, "train")) return dt_cli_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return dt_cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return dt_cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot")) return dt_cli_plot(argc - 1, argv + 1);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) { usage(stdout); return 0; }
    dt_log(DT_LOG_ERROR, "unknown command '%s'", cmd);
    usage(stderr);
    return 2;
}
