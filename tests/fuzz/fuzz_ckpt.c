/* Checkpoint manifests (--resume): the input is a checkpoint's
 * manifest.json, beside well-formed parameter and optimizer files (zeros) of
 * the harness's tiny model (T 4, V 16, L 1, NH 2, C 8, AdamW), in a
 * directory of its own under /dev/shm (or /tmp), removed at exit. */
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[128], manifest[256];
static dt_gpt2 *model;
static dt_engine *engine;
static dt_train_config cfg;

static void put(const char *name, const void *data, size_t n) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (f) { fwrite(data, 1, n, f); fclose(f); }
}

static void cleanup(void) {
    static const char *const files[] = { "step-00000001/manifest.json", "step-00000001/params.f32", "step-00000001/optim.f32",
                                         "latest", "step-00000001" };
    char p[256];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (unlink(p) != 0) rmdir(p);
    }
    rmdir(dir);
    dt_engine_destroy(engine);
    dt_gpt2_destroy(model);
}

static void setup(void) {
    snprintf(dir, sizeof dir, "%s/dtrain-fuzz-ckpt.%d", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
    mkdir(dir, 0755);
    snprintf(manifest, sizeof manifest, "%s/step-00000001", dir);
    mkdir(manifest, 0755);
    snprintf(manifest, sizeof manifest, "%s/step-00000001/manifest.json", dir);
    put("latest", "step-00000001\n", 14);
    const dt_gpt2_config shape = { .max_seq_len = 4, .vocab_size = 16, .padded_vocab_size = 16, .num_layers = 1, .num_heads = 2, .channels = 8 };
    dt_train_defaults(&cfg);
    dt_engine_config ec = { .opt = cfg.opt };
    if (dt_gpt2_create(&shape, &model)) abort();
    dt_gpt2_model(model, &ec.model);
    if (dt_engine_create(&ec, &engine)) abort();
    size_t n = dt_gpt2_num_params(model);
    float *zeros = calloc(2 * n, sizeof(float));
    put("step-00000001/params.f32", zeros, n * sizeof(float));
    put("step-00000001/optim.f32", zeros, 2 * n * sizeof(float));
    free(zeros);
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (!model) setup();
    FILE *f = fopen(manifest, "wb");
    if (!f) return 0;
    fwrite(data, 1, n, f);
    fclose(f);
    dt_checkpoint_position pos;
    dt_checkpoint_model cm;
    dt_checkpoint_gpt2(model, &cm);
    dt_status st = dt_checkpoint_resume(dir, NULL, &cfg, &cm, engine, &pos);
    /* DTRAIN_FUZZ_VERBOSE=1: each input's outcome (the seed must resume) */
    if (getenv("DTRAIN_FUZZ_VERBOSE")) printf("%s\n", st ? dt_last_error() : "resumed");
    return 0;
}
