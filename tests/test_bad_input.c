/* Bad files give clear errors naming the file and the field or offset, and
 * a save that fails part-way leaves the previous file whole. */
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/model.h"
#include "dtrain/train.h"

#include <math.h>
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
    dt_gpt2_config cfg = { .max_seq_len = 16, .vocab_size = 50, .padded_vocab_size = 64, .num_layers = 2, .num_heads = 2, .channels = 16 };
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

    /* ---- hostile files found by fuzzing and by hand: each must fail cleanly ---- */
    /* IDX: three dimensions of 2^28 multiply past 2^64 (the count used to wrap to a tiny number) */
    snprintf(other, sizeof other, "%s/huge.idx", dir);
    const uint8_t idx[16 + 8] = { 0, 0, 8, 3, 0x10, 0, 0, 0, 0x10, 0, 0, 0, 0x10, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8 };
    write_bytes(other, idx, sizeof idx);
    dt_idx ix;
    expect_error("IDX dimensions past 2^64", dt_idx_load(other, &ix), "huge.idx", "dimensions multiply past");
    /* an IDX header claiming 4 GiB with 8 bytes of data: refused after reading what is there, not after allocating it */
    const uint8_t idx2[16 + 8] = { 0, 0, 8, 3, 0, 0, 0x40, 0, 0, 0, 0x1, 0, 0, 0, 0x1, 0, 1, 2, 3, 4, 5, 6, 7, 8 };
    write_bytes(other, idx2, sizeof idx2);
    expect_error("IDX claiming more data than it has", dt_idx_load(other, &ix), "huge.idx", "the data ends after 8 of");

    /* llm.c header claiming a huge shape in a 1 KB file: refused by its size before anything is allocated */
    int32_t hdr[256] = { 20240326, 3, 1024, 50257, 48, 25, 1600, 50304 };
    snprintf(other, sizeof other, "%s/huge.bin", dir);
    write_bytes(other, hdr, sizeof hdr);
    expect_error("llm.c header with a huge shape", dt_llmc_load(other, &loaded), "huge.bin", "truncated");

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* a model too large to allocate: a clear error (it used to read the freed model for the message) */
    struct rlimit as_old, as_lim;
    getrlimit(RLIMIT_AS, &as_old);
    as_lim = as_old;
    as_lim.rlim_cur = (rlim_t)2 << 30;
    setrlimit(RLIMIT_AS, &as_lim);
    dt_gpt2_config big = { .max_seq_len = 1024, .vocab_size = 50257, .padded_vocab_size = 50304, .num_layers = 48, .num_heads = 25, .channels = 1600 };
    dt_gpt2 *bm = NULL;
    expect_error("model too large to allocate", dt_gpt2_create(&big, &bm), "cannot allocate", "of parameters and gradients");
    setrlimit(RLIMIT_AS, &as_old);
#endif

    /* safetensors: offsets near 2^64 (the double -> size_t conversion wrapped past the bounds check) and an end
     * offset one tensor too long */
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    dt_safetensors_save(path, m, DT_F32);
    size_t sn0;
    char *st0 = slurp(path, &sn0);
    uint64_t hl;
    memcpy(&hl, st0, 8);
    /* h.0.mlp.c_fc.weight is 16 x 64 f32 = 4096 bytes, the spacing of doubles just below 2^64: [2^64 - 4096, 2^64]
     * has the right length and used to wrap past the end check */
    const char *edits[2][2] = { { "h.0.mlp.c_fc.weight", "[18446744073709547520,18446744073709551616]" },
                                { "wte.weight", "[27396,30596]" } }; /* 4 bytes past the data section */
    const char *why[2] = { "safetensors offsets near 2^64", "safetensors end offset past the file" };
    for (int e = 0; e < 2; e++) {
        char *json = malloc(hl + 64), *at, *open_, *close_;
        memcpy(json, st0 + 8, hl);
        json[hl] = 0;
        if (!(at = strstr(json, edits[e][0])) || !(open_ = strstr(at, "\"data_offsets\":[")) || !(close_ = strchr(open_, ']'))) {
            failed++; printf("FAIL no data_offsets for %s in the saved header\n", edits[e][0]); free(json); continue;
        }
        open_ += strlen("\"data_offsets\":");
        char *edited = malloc(hl + 128);
        snprintf(edited, hl + 128, "%.*s%s%s", (int)(open_ - json), json, edits[e][1], close_ + 1);
        uint64_t nl = strlen(edited);
        snprintf(other, sizeof other, "%s/bad%d.safetensors", dir, e);
        FILE *f = fopen(other, "wb");
        fwrite(&nl, 8, 1, f);
        fwrite(edited, 1, nl, f);
        fwrite(st0 + 8 + hl, 1, sn0 - 8 - hl, f);
        fclose(f);
        expect_error(why[e], dt_safetensors_load(other, 0, &loaded), "data_offsets", "do not match");
        free(json);
        free(edited);
    }
    free(st0);

    /* encoder.json: a key ending in a lone UTF-8 lead byte is refused naming the place (as Python's json and HF's
     * tokenizers refuse it); ids that do not fit fail */
    snprintf(other, sizeof other, "%s/enc.json", dir);
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    write_bytes(path, "#version: 0.2\na b\n", 18);
    const char *encs[3] = { "{\"a\": 0, \"b\": 1, \"x\xc3\": 2}", "{\"a\": 2147483647}", "{\"a\": 1e18}" };
    dt_bpe *bpe = NULL;
    write_bytes(other, encs[0], strlen(encs[0]));
    expect_error("encoder.json key ending in a lead byte", dt_bpe_load(other, path, &bpe), "enc.json", "not valid UTF-8 at byte 19");
    dt_bpe_destroy(bpe);
    bpe = NULL;
    for (int e = 1; e < 3; e++) {
        write_bytes(other, encs[e], strlen(encs[e]));
        expect_error(e == 1 ? "encoder.json id 2^31-1" : "encoder.json id 1e18", dt_bpe_load(other, path, &bpe), "enc.json", "whole-number id");
    }

    /* HF folders: a Llama one whose config.json lacks a field is refused naming the file and the field, also when its
     * model.safetensors is named alone; a folder of an architecture dtrain does not read (Mamba) is named by its
     * config.json, whether it holds model.safetensors or only shards */
    const char *kinds[2] = { "llama", "mamba-shards" };
    for (int e = 0; e < 2; e++) {
        char folder[300];
        snprintf(folder, sizeof folder, "%s/%s", dir, kinds[e]);
        snprintf(cmd, sizeof cmd, "mkdir -p %s", folder);
        if (system(cmd)) return 1;
        snprintf(path, sizeof path, "%s/config.json", folder);
        const char *cj = e ? "{\"architectures\": [\"MambaForCausalLM\"], \"model_type\": \"mamba\", \"hidden_size\": 64}"
                           : "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64}";
        write_bytes(path, cj, strlen(cj));
        snprintf(path, sizeof path, "%s/%s", folder, e ? "model-00001-of-00002.safetensors" : "model.safetensors");
        const char *hj = "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
        unsigned char st[160] = { (unsigned char)strlen(hj) };
        memcpy(st + 8, hj, strlen(hj));
        write_bytes(path, st, 8 + strlen(hj) + 4);
        if (e) {
            expect_error("a sharded Mamba HF folder", dt_model_load(folder, 0, &loaded), "config.json", "MambaForCausalLM (model_type mamba)");
        } else {
            expect_error("a Llama HF folder without vocab_size", dt_model_load(folder, 0, &loaded), "config.json", "\"vocab_size\" is missing");
            expect_error("its model.safetensors alone", dt_model_load(path, 0, &loaded), "config.json", "\"vocab_size\" is missing");
        }
    }

    /* configs whose parts are not objects (strcmp on NULL before) */
    snprintf(other, sizeof other, "%s/c.json", dir);
    const char *cfgs[3][2] = { { "[1]", "top level" }, { "{\"optimizer\": {\"type\": \"SGD\", \"params\": [1]}}", "\"params\"" },
                               { "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": \"x\"}}", "\"params\"" } };
    for (int e = 0; e < 3; e++) {
        write_bytes(other, cfgs[e][0], strlen(cfgs[e][0]));
        dt_train_defaults(&tc);
        expect_error("config part not an object", dt_train_config_load(other, &tc), cfgs[e][1], "object");
    }
    /* keys are case-sensitive: "STEPS" is unknown (warned) and not applied */
    write_bytes(other, "{\"STEPS\": 77}", 13);
    dt_train_defaults(&tc);
    if (!dt_train_config_load(other, &tc) && tc.steps != 77) { passed++; printf("ok   config keys are case-sensitive\n"); }
    else { failed++; printf("FAIL \"STEPS\" was applied as steps\n"); }

    /* DeepSpeed's schedules with DeepSpeed's formulas (values from its lr_schedules.py definitions) */
    dt_schedule sc;
    dt_schedule_defaults(&sc);
    sc.kind = DT_SCHED_DS_WARMUP_DECAY; sc.lr = 1e-3f; sc.lr_min = 0; sc.warmup = 10; sc.total = 100; sc.linear_warmup = 1;
    float got1 = dt_lr_at(&sc, 100, 5), got2 = dt_lr_at(&sc, 100, 55), got3 = dt_lr_at(&sc, 100, 100);
    sc.kind = DT_SCHED_DS_WARMUP; sc.linear_warmup = 0;
    float got4 = dt_lr_at(&sc, 100, 4), got5 = dt_lr_at(&sc, 100, 50);
    sc.kind = DT_SCHED_DS_WARMUP_COSINE; sc.linear_warmup = 1; sc.cos_min_ratio = 0.1f; sc.warmup_min_ratio = 0;
    float got6 = dt_lr_at(&sc, 100, 54); /* (1 + cos(pi * 45/90)) / 2 = 0.5 -> 0.1 + 0.9 * 0.5 */
    sc.kind = DT_SCHED_CONSTANT; sc.warmup = 4;
    float got7 = dt_lr_at(&sc, 100, 1), got8 = dt_lr_at(&sc, 100, 9);
    float want[8] = { 5e-4f, 5e-4f, 0, (float)(1e-3 * log(5) / log(10)), 1e-3f, 1e-3f * 0.55f, 5e-4f, 1e-3f };
    float gotv[8] = { got1, got2, got3, got4, got5, got6, got7, got8 };
    int wrong = -1;
    for (int k = 0; k < 8; k++) if (fabsf(gotv[k] - want[k]) > 1e-9f + 1e-6f * want[k]) wrong = k;
    if (wrong < 0) { passed++; printf("ok   DeepSpeed WarmupLR/WarmupDecayLR/WarmupCosineLR and warm-up with constant\n"); }
    else { failed++; printf("FAIL schedule value %d: got %g, want %g\n", wrong, gotv[wrong], want[wrong]); }

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    free(good); free(bad); free(tb); free(after);
    dt_gpt2_destroy(m);
    dt_gpt2_destroy(m2);
    printf("bad input: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
