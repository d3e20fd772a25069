/* dtrain ckpt info|export: flag parsing only. */
#include "cli.h"
#include "dtrain/io.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dtrain ckpt info DIR                      what DIR's latest checkpoint holds: step, layout (the\n"
               "                                                 strategy and ranks that saved it, each rank's piece), tensors\n"
               "       dtrain ckpt export DIR model.safetensors  its weights as one file (HF GPT-2 layout; .bin: llm.c's)\n");
}

int dt_cli_ckpt(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) { usage(stdout); return 0; }
    if (argc == 3 && !strcmp(argv[1], "info")) {
        if (dt_checkpoint_describe(argv[2], stdout)) { dt_log(DT_LOG_ERROR, "ckpt info: %s", dt_last_error()); return 1; }
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "export")) {
        const char *out = argv[3];
        size_t n = strlen(out);
        dt_gpt2 *m;
        int step;
        if (dt_checkpoint_load_model(argv[2], &m, &step)) { dt_log(DT_LOG_ERROR, "ckpt export: %s", dt_last_error()); return 1; }
        dt_status st = n > 4 && !strcmp(out + n - 4, ".bin") ? dt_llmc_save(out, m) : dt_safetensors_save(out, m, DT_F32);
        dt_gpt2_destroy(m);
        if (st) { dt_log(DT_LOG_ERROR, "ckpt export: %s", dt_last_error()); return 1; }
        printf("wrote %s (step %d of %s)\n", out, step, argv[2]);
        return 0;
    }
    usage(stderr);
    dt_log(DT_LOG_ERROR, "ckpt: expected info DIR or export DIR FILE");
    return 2;
}
