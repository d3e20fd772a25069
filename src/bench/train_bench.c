/* dtrain bench train: synthetic GPT-2 training throughput in the manner of
 * the Horovod synthetic benchmark ("Iter #k: N tok/s"), as model GFLOP/s
 * and as a fraction of the sgemm rate measured on the spot, optionally
 * against PyTorch training the same architecture from the same weights
 * (bench/torch_gpt2.py), alternating in the same invocation.
 * Model FLOPs per token: dt_gpt2_flops_per_token (6 N + 12 L T C). */
#include "dtrain/bench.h"
#include "measure.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/model.h"
#include "dtrain/obs.h"
#include "dtrain/optim.h"
#include "dtrain/train.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void dt_bench_train_defaults(dt_bench_train_opts *o) {
    *o = (dt_bench_train_opts){ .model = "124M", .batch = 4, .seq = 64, .steps = 10, .warmup = 2, .threads = 1, .rounds = 1 };
}


/* Median ms per step of dtrain on the model. */
static int run_dtrain(dt_gpt2 *m, const dt_bench_train_opts *o, int round, double *ms_out, double *loss_out) {
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    size_t BT = (size_t)o->batch * o->seq, np = dt_gpt2_num_params(m);
    int32_t *in = malloc(BT * 4), *tg = malloc(BT * 4);
    uint64_t s = 1;
    for (size_t i = 0; i < BT; i++) {
        in[i] = (int32_t)(dt_rng_next(&s) % (uint64_t)c->vocab_size);
        tg[i] = (int32_t)(dt_rng_next(&s) % (uint64_t)c->vocab_size);
    }
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    dt_optim *opt;
    if (dt_optim_create(&oc, np, NULL, 0, &opt)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    double *t = malloc(sizeof(double) * (size_t)o->steps);
    float loss = 0;
    dt_gpt2_zero_grad(m);
    for (int k = 0; k < o->warmup + o->steps; k++) {
        double t0 = dt_time_now();
        dt_gpt2_forward(m, in, tg, o->batch, o->seq, &loss);
        dt_gpt2_backward(m, 1.0f);
        dt_optim_step(opt, dt_gpt2_params(m), dt_gpt2_grads(m), 3e-4f, 1);
        double ms = (dt_time_now() - t0) * 1e3;
        if (k >= o->warmup) {
            t[k - o->warmup] = ms;
            if (!o->json)
                printf("Iter #%d: %.1f tok/s (%.1f ms) [dtrain %s, round %d]\n", k - o->warmup, BT / (ms / 1e3), ms,
                       dt_precision_name(dt_gpt2_precision(m)), round + 1);
        }
    }
    *ms_out = dt_bench_median(t, o->steps);
    *loss_out = loss;
    free(t);
    free(in);
    free(tg);
    dt_optim_destroy(opt);
    return 0;
}

/* weights: an llm.c file (GPT-2: bench/torch_gpt2.py, Debian's torch), or, llama, an HF folder (bench/torch_llama.py:
 * transformers' LlamaForCausalLM, from the baselines' environment) */
static int run_torch(const dt_bench_train_opts *o, const char *weights, bool llama, int round, double *ms_out) {
    char cmd[PATH_MAX * 2 + 256];
    if (llama ? dt_bench_venv_cmd(cmd, sizeof cmd, "torch_llama.py", o->threads) : dt_bench_python_cmd(cmd, sizeof cmd, "torch_gpt2.py", o->threads))
        return 1;
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, "%s %s --batch %d --seq %d --steps %d --warmup %d --threads %d%s", llama ? "--folder" : "--weights",
             weights, o->batch, o->seq, o->steps, o->warmup, o->threads,
             o->precision == DT_BF16 ? " --autocast bf16" : o->precision == DT_F16 ? " --autocast fp16" : "");
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    char line[512];
    double *t = malloc(sizeof(double) * (size_t)o->steps);
    int k = 0;
    while (fgets(line, sizeof line, p) && k < o->steps) {
        cJSON *j = cJSON_Parse(line);
        cJSON *ms = j ? cJSON_GetObjectItemCaseSensitive(j, "ms") : NULL;
        if (cJSON_IsNumber(ms)) {
            t[k] = ms->valuedouble;
            if (!o->json)
                printf("Iter #%d: %.1f tok/s (%.1f ms) [torch%s, round %d]\n", k, (double)o->batch * o->seq / (t[k] / 1e3), t[k],
                       o->precision ? " autocast" : "", round + 1);
            k++;
        }
        cJSON_Delete(j);
    }
    int rc = pclose(p);
    if (rc != 0 || k < o->steps) {
        dt_log(DT_LOG_ERROR, "bench train: the PyTorch baseline failed (exit %d, %d steps): is python3-torch installed?", rc, k);
        free(t);
        return 1;
    }
    *ms_out = dt_bench_median(t, o->steps);
    free(t);
    return 0;
}

/* The weights the baseline reads (an HF folder for a Llama, an llm.c file for GPT-2) written to a scratch path; and removed. */
static int write_shared_weights(dt_gpt2 *m, bool llama, char *weights) {
    if (llama ? !mkdtemp(weights) || dt_hf_folder_save(weights, m) : 0) {
        dt_log(DT_LOG_ERROR, "bench train: cannot write the shared weights: %s", dt_last_error());
        return 1;
    }
    int fd = llama ? 0 : mkstemp(weights);
    if (fd < 0 || (!llama && dt_llmc_save(weights, m))) { dt_log(DT_LOG_ERROR, "bench train: cannot write the shared weights"); return 1; }
    if (!llama) close(fd);
    return 0;
}

static void remove_shared_weights(bool llama, const char *weights) {
    if (!llama) {
        unlink(weights);
        return;
    }
    char f[PATH_MAX];
    snprintf(f, sizeof f, "%s/config.json", weights), unlink(f);
    snprintf(f, sizeof f, "%s/model.safetensors", weights), unlink(f);
    rmdir(weights);
}

/* The rounds, alternating: dtrain fp32, dtrain in 16 bits (a second model), PyTorch; every one from the same weights. Each
 * round's ms a step into dms, lms, tms. */
static int run_rounds(dt_gpt2 *m, const dt_gpt2_config *cfg, const dt_bench_train_opts *o, const char *weights, bool llama, int rounds,
                      double *dms, double *lms, double *tms) {
    dt_gpt2 *lp = NULL;
    size_t np = dt_gpt2_num_params(m);
    float *init = malloc(np * sizeof(float));
    double loss = 0;
    int rc = 0;
    if (!init) {
        dt_log(DT_LOG_ERROR, "bench train: out of memory");
        rc = 1;
    } else {
        memcpy(init, dt_gpt2_params(m), np * sizeof(float));
    }
    if (!rc && o->precision != DT_F32 && (dt_gpt2_create(cfg, &lp) || dt_gpt2_set_precision(lp, o->precision))) {
        dt_log(DT_LOG_ERROR, "bench train: %s", dt_last_error());
        rc = 1;
    }
    for (int r = 0; r < rounds && !rc; r++) {
        if (r > 0) memcpy(dt_gpt2_params(m), init, np * sizeof(float));
        rc = run_dtrain(m, o, r, &dms[r], &loss);
        if (!rc && lp) {
            memcpy(dt_gpt2_params(lp), init, np * sizeof(float));
            rc = run_dtrain(lp, o, r, &lms[r], &loss);
        }
        if (!rc && o->baseline) rc = run_torch(o, weights, llama, r, &tms[r]);
    }
    free(init);
    dt_gpt2_destroy(lp);
    return rc;
}

/* The medians: a JSON line or the table's lines, against the sgemm rate and the baseline. */
static void report(const dt_bench_train_opts *o, int rounds, double flops, double gemm, double *dms, double *lms,
                   double *tms) {
    double d = dt_bench_median(dms, rounds), tok = o->batch * o->seq / (d / 1e3), gf = flops / (d / 1e3) / 1e9;
    double l = o->precision != DT_F32 ? dt_bench_median(lms, rounds) : 0, t = o->baseline ? dt_bench_median(tms, rounds) : 0;
    const char *prec = dt_precision_name(o->precision);
    if (o->json) {
        printf("{\"model\":\"%s\",\"batch\":%d,\"seq\":%d,\"threads\":%d,\"ms\":%.2f,\"tok_per_s\":%.1f,\"gflops\":%.2f,"
               "\"sgemm_gflops\":%.2f,\"sgemm_fraction\":%.3f", o->model, o->batch, o->seq, o->threads, d, tok, gf, gemm, gf / gemm);
        if (o->precision != DT_F32) {
            printf(",\"precision\":\"%s\",\"lp_ms\":%.2f,\"lp_speedup_over_fp32\":%.3f", prec, l, d / l);
            if (o->baseline) printf(",\"torch_autocast_ms\":%.2f,\"lp_speedup_over_torch\":%.3f", t, t / l);
        } else if (o->baseline) {
            printf(",\"torch_ms\":%.2f,\"speedup\":%.3f", t, t / d);
        }
        printf("}\n");
        return;
    }
    printf("dtrain: %.1f ms/step, %.1f tok/s, %.1f model GFLOP/s = %.0f%% of the sgemm rate (%.1f GFLOP/s, best of "
           "before and after; peak memory %.0f MiB)\n", d, tok, gf, 100 * gf / gemm, gemm, dt_peak_memory() / 1048576.0);
    if (o->precision != DT_F32) {
        printf("dtrain %s: %.1f ms/step, %.1f tok/s: %.2fx fp32's step rate (medians of %d rounds, alternating)\n", prec, l,
               o->batch * o->seq / (l / 1e3), d / l, rounds);
        if (o->baseline) printf("torch autocast %s: %.1f ms/step; dtrain %s is %.2fx PyTorch's %s step\n", prec, t, prec, t / l, prec);
    } else if (o->baseline) {
        printf("torch:  %.1f ms/step, %.1f tok/s, %.1f model GFLOP/s = %.0f%% of the sgemm rate\n", t, o->batch * o->seq / (t / 1e3),
               flops / (t / 1e3) / 1e9, 100 * flops / (t / 1e3) / 1e9 / gemm);
        printf("dtrain is %.2fx PyTorch (medians of %d rounds of %d steps, alternating)\n", t / d, rounds, o->steps);
    }
}

int dt_bench_train(const dt_bench_train_opts *o) {
    if (!strncmp(o->model, "resnet", 6)) return dt_bench_train_images(o);
    if (o->zero) return dt_bench_train_zero(o);
    if (o->nnprocs) return dt_bench_train_ddp(o);
    dt_gpt2_config cfg;
    dt_gpt2 *m = NULL;
    if (dt_gpt2_preset(o->model, &cfg) || dt_gpt2_create(&cfg, &m)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    dt_gpt2_init_random(m, 1337);
    char weights[] = "/tmp/dtrain-bench-weights-XXXXXX";
    bool llama = cfg.family && cfg.family != dt_family_find("gpt2"); /* its baseline reads an HF folder */
    if (o->baseline && write_shared_weights(m, llama, weights)) return 1;
    double gemm = dt_peak_measure(o->threads);
    dt_kernels_set_threads(o->threads);
    double flops = dt_gpt2_flops_per_token(&cfg, o->seq) * o->batch * o->seq;
    if (!o->json)
        printf("# dtrain bench train: %s %s, batch %d x seq %d, AdamW, %d thread(s) (BLAS and OpenMP together); "
               "sgemm rate %.1f GFLOP/s; %.1f GFLOP per step\n", llama ? "" : "GPT-2", o->model, o->batch, o->seq, o->threads, gemm,
               flops / 1e9);
    int rounds = o->rounds < 1 ? 1 : o->rounds > 16 ? 16 : o->rounds;
    double dms[16], lms[16], tms[16];
    int rc = run_rounds(m, &cfg, o, weights, llama, rounds, dms, lms, tms);
    if (o->baseline) remove_shared_weights(llama, weights);
    if (rc) { dt_gpt2_destroy(m); return rc; }
    /* The ceiling is the better of two measurements, before and after: a
     * disturbed sgemm sample must not flatter the fraction. */
    double gemm2 = dt_peak_measure(o->threads);
    if (gemm2 > gemm) gemm = gemm2;
    dt_kernels_set_threads(o->threads);
    report(o, rounds, flops, gemm, dms, lms, tms);
    dt_gpt2_destroy(m);
    return 0;
}
