/* Bad files give clear errors naming the file and the field or offset, and
 * a save that fails part-way leaves the previous file whole. */
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/model.h"
#include "dtrain/train.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static int passed, failed;
static char dir[256];

/* st must fail and the message must contain every word. */
static void expect_error(const char *what, dt_status st, const char *w1, const char *w2) {
    const char *m = dt_last_error();
    if (st != DT_OK && strstr(m, w1) && (!w2 || strstr(m, w2))) { passed++; printf("ok   %-34s %s\n", what, m); }
    else { failed++; printf("FAIL %-34s status %d, message: %s\n", what, (int)st, st ? m : "(none)"); }
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc(*n);
    if (fread(p, 1, *n, f) != *n) { free(p); p = NULL; }
    fclose(f);
    return p;
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/dtrain-bad-input-%d", (int)getpid());
    char cmd[512], path[512], other[512];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd)) return 1;
    dt_gpt2_config cfg = { 16, 50, 64, 2, 2, 16 };
    dt_gpt2 *m, *m2, *loaded = NULL;
    dt_gpt2_create(&cfg, &m);
    dt_gpt2_init_random(m, 1);
    snprintf(path, sizeof path, "%s/model.bin", dir);
    if (dt_llmc_save(path, m)) { printf("FAIL save: %s\n", dt_last_error()); return 1; }
    size_t n;
    char *good = slurp(path, &n);

    /* model files */
    snprintf(other, sizeof other, "%s/truncated.bin", dir);
    write_bytes(other, good, n - 100);
    expect_error("truncated model", dt_llmc_load(other, &loaded), "truncated.bin", "truncated");
    write_bytes(other, good, 500);
    expect_error("truncated model header", dt_llmc_load(other, &loaded), "truncated.bin", "header");
    char *bad = malloc(n);
    memcpy(bad, good, n);
    ((int32_t *)bad)[0] = 12345;
    write_bytes(other, bad, n);
    expect_error("bad magic", dt_llmc_load(other, &loaded), "magic", "offset 0");
    memcpy(bad, good, n);
    ((int32_t *)bad)[1] = 4;
    write_bytes(other, bad, n);
    expect_error("bad version", dt_llmc_load(other, &loaded), "version 4", "offset 4");
    memcpy(bad, good, n);
    ((int32_t *)bad)[6] = 15; /* C not divisible by NH */
    write_bytes(other, bad, n);
    expect_error("impossible shape", dt_llmc_load(other, &loaded), "channels", "heads");
    bad = realloc(bad, n + 8);
    memcpy(bad, good, n);
    write_bytes(other, bad, n + 8);
    expect_error("trailing bytes", dt_llmc_load(other, &loaded), "trailing", NULL);
    dt_gpt2_config c2 = cfg;
    c2.num_layers = 3;
    dt_gpt2_create(&c2, &m2);
    expect_error("shape differs from the model", dt_llmc_load_into(path, m2), "L 2", "L 3");
    snprintf(other, sizeof other, "%s/missing.bin", dir);
    expect_error("missing file", dt_llmc_load(other, &loaded), "missing.bin", "cannot open");

    /* token files */
    uint32_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = (uint32_t)(i % 50);
    toks[77] = 60;
    snprintf(other, sizeof other, "%s/tokens.bin", dir);
    dt_tokens_write(other, toks, 100);
    dt_tokens *t = NULL;
    if (dt_tokens_open(other, &t)) { failed++; printf("FAIL tokens open: %s\n", dt_last_error()); }
    else expect_error("token outside the vocabulary", dt_tokens_check_vocab(t, 50), "token 60 at index 77", "byte offset 1178");
    dt_tokens_close(t);
    size_t tn;
    char *tb = slurp(other, &tn);
    write_bytes(other, tb, tn - 10);
    expect_error("truncated tokens", dt_tokens_open(other, &t), "tokens.bin", "truncated");
    ((int32_t *)tb)[0] = 7;
    write_bytes(other, tb, tn);
    expect_error("tokens bad magic", dt_tokens_open(other, &t), "magic", "offset 0");
    ((int32_t *)tb)[0] = 20240520;
    ((int32_t *)tb)[1] = 7;
    write_bytes(other, tb, tn);
    expect_error("tokens version/magic", dt_tokens_open(other, &t), "version 7", "offset 4");

    /* A save that fails part-way (file size limit) leaves the old file whole and no temporary. */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim = { 4096, 4096 };
    getrlimit(RLIMIT_FSIZE, &old);
    lim.rlim_max = old.rlim_max;
    setrlimit(RLIMIT_FSIZE, &lim);
    dt_gpt2_init_random(m, 2); /* different weights */
    expect_error("save fails part-way", dt_llmc_save(path, m), "model.bin", "previous file is untouched");
    setrlimit(RLIMIT_FSIZE, &old);
    size_t n2;
    char *after = slurp(path, &n2);
    if (after && n2 == n && !memcmp(after, good, n)) { passed++; printf("ok   the previous model file is intact\n"); }
    else { failed++; printf("FAIL the previous model file changed after a failed save\n"); }
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp > /dev/null", dir);
    if (system(cmd) != 0) { passed++; printf("ok   no temporary file left behind\n"); }
    else { failed++; printf("FAIL a temporary file was left in %s\n", dir); }

    /* DeepSpeed-style config: values land, bad values and bad JSON fail naming what */
    snprintf(other, sizeof other, "%s/ds.json", dir);
    const char *good_json = "{\"train_micro_batch_size_per_gpu\": 6, \"gradient_accumulation_steps\": 3, "
                            "\"optimizer\": {\"type\": \"LAMB\", \"params\": {\"lr\": 0.002, \"betas\": [0.8, 0.99]}}, "
                            "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 7, \"total_num_steps\": 70}}, "
                            "\"gradient_clipping\": 0.5, \"unknown_key\": 1}";
    write_bytes(other, good_json, strlen(good_json));
    dt_train_config tc;
    dt_train_defaults(&tc);
    dt_status cst = dt_train_config_load(other, &tc);
    if (!cst && tc.batch == 6 && tc.grad_accum == 3 && tc.opt.kind == DT_OPT_LAMB && tc.sched.lr == 0.002f && tc.opt.beta1 == 0.8f &&
        tc.opt.beta2 == 0.99f && tc.sched.kind == DT_SCHED_DS_WARMUP_COSINE && tc.sched.warmup == 7 && tc.sched.total == 70 && tc.steps == 70 && tc.grad_clip == 0.5f) {
        passed++;
        printf("ok   config values land where they belong\n");
    } else { failed++; printf("FAIL config: %s (batch %d accum %d lr %g)\n", cst ? dt_last_error() : "values differ", tc.batch, tc.grad_accum, tc.sched.lr); }
    const char *bad_json = "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9, 1.5]}}}";
    write_bytes(other, bad_json, strlen(bad_json));
    expect_error("config value out of range", dt_train_config_load(other, &tc), "ds.json", "optimizer.params.betas");
    write_bytes(other, "{\"steps\": -3}", 13);
    expect_error("config negative steps", dt_train_config_load(other, &tc), "\"steps\"", NULL);
    write_bytes(other, "{\"steps\": 3,", 12);
    expect_error("config not JSON", dt_train_config_load(other, &tc), "not valid JSON", "byte");

    /* plot: a metrics file becomes an SVG with the curve; a bad line is named */
    snprintf(other, sizeof other, "%s/m.jsonl", dir);
    const char *metrics = "{\"step\":1,\"loss\":5.0}\n{\"step\":2,\"loss\":4.0,\"val_loss\":4.5}\n";
    write_bytes(other, metrics, strlen(metrics));
    snprintf(path, sizeof path, "%s/loss.svg", dir);
    size_t sn = 0;
    char *svg = dt_plot_losses(other, path, 0) == DT_OK ? slurp(path, &sn) : NULL;
    if (svg && strstr(svg, "<polyline") && strstr(svg, "<circle")) { passed++; printf("ok   plot draws the curve and the validation point\n"); }
    else { failed++; printf("FAIL plot: %s\n", svg ? "no curve" : dt_last_error()); }
    free(svg);
    write_bytes(other, "{\"step\":1,\"loss\":5.0}\n{\"oops\":1}\n", 34);
    expect_error("plot on a bad metrics line", dt_plot_losses(other, path, 0), "m.jsonl", "line 2");

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    free(good); free(bad); free(tb); free(after);
    dt_gpt2_destroy(m);
    dt_gpt2_destroy(m2);
    printf("bad input: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
