/* dtrain eval: a model's validation loss, printed with enough digits to set
 * beside another framework's and written to --metrics. It is train --steps 0
 * (the same flags and checks); a checkpoint directory's own batch, sequence
 * length and validation settings are the defaults, so that its loss is the
 * one the run printed at that step. */
#include "cli.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dtrain eval --model M [--data FILE] [FLAGS]\n"
               "  --model M          a checkpoint directory, a model file (llm.c .bin, HF .safetensors) or HF folder,\n"
               "                     or a preset (random weights)\n"
               "  --data FILE        the tokens to evaluate on (a checkpoint: its --val-data by default)\n"
               "  --batch N --seq T  sequences of T tokens, N at a time (a checkpoint: its micro-batch x data-parallel\n"
               "                     ranks and its --seq, so the loss is the one its run printed; else 4 x 64)\n"
               "  --eval-batches K   batches evaluated (a checkpoint: its own; else 20)\n"
               "  --metrics FILE     the loss as a JSON line (val_loss, tokens, batches)\n"
               "  --nproc N, --tp N, --pp N, --threads N, --precision P, --device D   as for train (dtrain train --help)\n"
               "The loss is the mean cross-entropy in nats per token over the batches, printed with 6 decimals.\n");
}

static const char *flag_value(int argc, char **argv, const char *flag) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], flag)) return argv[i + 1];
    return NULL;
}

/* The flags a checkpoint's own evaluation used that argv does not give, into extra (values kept in store); how many
 * words were added. */
static int checkpoint_defaults(int argc, char **argv, const char *dir, char **extra, char store[4][32]) {
    dt_train_config c;
    dt_train_defaults(&c);
    if (dt_checkpoint_read_settings(dir, &c) || !c.resume_batch || c.grad_accum < 1) return 0;
    int n = 0;
    long batch = c.resume_batch / c.grad_accum; /* micro-batch x data-parallel ranks: the sequences of one validation batch */
    if (!flag_value(argc, argv, "--batch")) {
        snprintf(store[0], sizeof store[0], "%ld", batch);
        extra[n++] = "--batch", extra[n++] = store[0];
    }
    if (!flag_value(argc, argv, "--seq")) {
        snprintf(store[1], sizeof store[1], "%d", c.seq);
        extra[n++] = "--seq", extra[n++] = store[1];
    }
    if (!flag_value(argc, argv, "--eval-batches")) {
        snprintf(store[2], sizeof store[2], "%d", c.eval_batches);
        extra[n++] = "--eval-batches", extra[n++] = store[2];
    }
    static char val[4096];
    if (!flag_value(argc, argv, "--data") && !flag_value(argc, argv, "--val-data") && c.val_data &&
        strlen(c.val_data) < sizeof val) {
        memcpy(val, c.val_data, strlen(c.val_data) + 1);
        extra[n++] = "--data", extra[n++] = val;
    }
    return n;
}

int dt_cli_eval(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 0; }
    const char *model = flag_value(argc, argv, "--model");
    char *extra[8], store[4][32];
    int nextra = model && dt_checkpoint_is_checkpoint(model) ? checkpoint_defaults(argc, argv, model, extra, store) : 0;
    /* argv[-1] is the program: train re-runs the whole command line once per rank */
    char **a = malloc(sizeof(char *) * ((size_t)argc + (size_t)nextra + 4));
    if (!a) return 1;
    a[0] = argv[-1];
    a[1] = "train";
    memcpy(a + 2, argv + 1, sizeof(char *) * (size_t)(argc - 1));
    memcpy(a + 1 + argc, extra, sizeof(char *) * (size_t)nextra);
    int n = 1 + argc + nextra;
    a[n++] = "--steps";
    a[n++] = "0";
    a[n] = NULL;
    int rc = dt_cli_train(n - 1, a + 1);
    free(a);
    return rc;
}
