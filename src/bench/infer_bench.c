/* dtrain bench infer: the decoder's speed (prefill tokens/s, decode
 * tokens/s at batch 1 and batch B) in f32 and int8 on 1..N threads, and
 * the same figures from HF transformers' generate (PyTorch) and llama.cpp
 * (llama-bench, f32 and Q8_0) on the same weights, each measured in this
 * run; medians of --reps repetitions, and with --rounds, of the rounds that
 * alternate dtrain and the baselines. */
#include "dtrain/bench.h"
#include "dtrain/data.h"
#include "dtrain/infer.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/obs.h"
#include "dtrain/train.h"
#include "measure.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_REPS 32
#define MAX_ROUNDS 16 /* --rounds at most */

static dt_status load(const char *model, dt_gpt2 **m) {
    dt_gpt2_config c;
    if (!dt_gpt2_preset(model, &c)) {
        dt_status st = dt_gpt2_create(&c, m);
        if (!st) dt_gpt2_init_random(*m, 1337);
        return st;
    }
    return dt_checkpoint_load_weights(model, 0, m, NULL);
}

/* Median seconds of prefilling P tokens into a fresh slot. */
static double time_prefill(dt_decoder *d, int P, int reps, float *logits) {
    dt_infer_row *rows = malloc(sizeof *rows * (size_t)P);
    double t[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < P; i++) rows[i] = (dt_infer_row){ 0, i, (int32_t)((i * 7919 + r) % 50000 % dt_decoder_config(d)->vocab_size), i == P - 1 };
        double t0 = dt_time_now();
        if (dt_decoder_step(d, rows, P, logits)) { free(rows); return -1; }
        t[r] = dt_time_now() - t0;
    }
    free(rows);
    return dt_bench_median(t, reps);
}

/* Median seconds a step of decoding b sequences (each at position ctx and on), one row each. */
static double time_decode(dt_decoder *d, int b, int ctx, int steps, int reps, float *logits) {
    dt_infer_row rows[64];
    int V = dt_decoder_config(d)->vocab_size;
    double t[MAX_REPS];
    dt_infer_row *pre = malloc(sizeof *pre * (size_t)(ctx > 0 ? ctx : 1));
    for (int s = 0; s < b; s++) { /* each slot's context first */
        for (int p = 0; p < ctx; p++) pre[p] = (dt_infer_row){ s, p, (int32_t)((p * 31 + s) % V), 0 };
        if (ctx && dt_decoder_step(d, pre, ctx, logits)) { free(pre); return -1; }
    }
    free(pre);
    for (int r = 0; r < reps; r++) {
        double t0 = dt_time_now();
        for (int k = 0; k < steps; k++) {
            for (int s = 0; s < b; s++) rows[s] = (dt_infer_row){ s, ctx + k, (int32_t)((k * 131 + s) % V), 1 };
            if (dt_decoder_step(d, rows, b, logits)) return -1;
        }
        t[r] = (dt_time_now() - t0) / steps;
    }
    return dt_bench_median(t, reps);
}

/* Bytes a second read from memory on `threads` threads (sums over 512 MiB in four independent vector accumulators, the
 * best of 5): decode at batch 1 reads every weight once a token, so this over the weights' bytes is the machine's
 * ceiling for it. */
typedef uint32_t v8u __attribute__((vector_size(32)));

static double read_bandwidth(int threads) {
    size_t n = (size_t)16 << 20; /* vectors of 32 bytes */
    v8u *a = dt_alloc_aligned(n * sizeof *a);
    double best = 0;
    if (!a) return 0;
    dt_kernels_set_threads(threads);
    memset(a, 1, n * sizeof *a);
    for (int k = 0; k < 5; k++) {
        uint32_t sum = 0;
        double t0 = dt_time_now();
        #pragma omp parallel reduction(+ : sum)
        {
            v8u s0 = { 0 }, s1 = { 0 }, s2 = { 0 }, s3 = { 0 };
            #pragma omp for schedule(static)
            for (size_t i = 0; i < n; i += 4) { s0 += a[i]; s1 += a[i + 1]; s2 += a[i + 2]; s3 += a[i + 3]; }
            v8u t = s0 + s1 + s2 + s3;
            for (int j = 0; j < 8; j++) sum += t[j];
        }
        double r = (double)(n * sizeof *a) / (dt_time_now() - t0);
        if (r > best && sum) best = r;
    }
    dt_free_aligned(a);
    return best;
}

/* The other ceiling: every weight is a multiply-add per token at any batch, so the core's multiply-add rate (at the
 * decoder's vector width; int8's products at bf16 pairs' rate where the CPU multiplies those, else in f32 as well)
 * bounds decoding at large batches. Over the memory-bound batch-1 ceiling it says how much batching can ever gain
 * here: int8 reads a quarter of f32's bytes, so at the same arithmetic its gain is a quarter of f32's, at twice
 * the arithmetic half. sgemm's rate beside it, which a BLAS built for narrower vectors than the core's keeps below
 * the ceiling. */
static void compute_ceiling(int threads, const size_t wb[2], double bw) {
    double flops = 2.0 * (double)(wb[0] / sizeof(float)), peak = dt_kernels_fma_peak(threads) * 1e9,
           q8 = dt_kernels_int8_peak(threads) * 1e9, sgemm = dt_peak_measure(threads) * 1e9;
    if (!wb[0] || !wb[1] || peak <= 0 || q8 <= 0 || bw <= 0) return;
    char blas[128];
    dt_kernels_blas_name(blas, sizeof blas);
    printf("# multiply-adds at %.1f GFLOP/s on %d thread(s) (sgemm %.1f through %s): the weights' %.2f GFLOP a token allow f32 at "
           "most %.1f tokens/s at any batch, %.2fx its batch-1 ceiling; int8's products at %.1f GFLOP/s (%s) at most %.1f, %.2fx its "
           "batch-1 ceiling\n", peak / 1e9, threads, sgemm / 1e9, blas, flops / 1e9, peak / flops, peak / flops / (bw / (double)wb[0]),
           q8 / 1e9, q8 > 1.5 * peak ? "bf16 pairs" : "f32", q8 / flops, q8 / flops / (bw / (double)wb[1]));
}

/* Perplexity over up to `windows` windows of the context's length from a token file, each read in one step with every
 * row's logits: exp of the mean cross-entropy of the next token. */
static dt_status perplexity(dt_gpt2 *m, dt_quant q, const char *path, int windows, double *ppl, long *ntok) {
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    int T = c->max_seq_len < 256 ? c->max_seq_len : 256, V = c->vocab_size;
    dt_tokens *t = NULL;
    dt_decoder *d = NULL;
    dt_status st = dt_tokens_open(path, &t);
    if (!st) st = dt_tokens_check_vocab(t, V);
    if (!st) st = dt_decoder_create(m, q, 1, T, 0, &d);
    float *logits = st ? NULL : malloc(sizeof(float) * (size_t)T * V);
    dt_infer_row *rows = st ? NULL : malloc(sizeof *rows * (size_t)T);
    if (!st && (!logits || !rows)) st = dt_error(DT_ERR_NOMEM, "bench infer: out of memory for perplexity");
    double nll = 0;
    *ntok = 0;
    size_t n = st ? 0 : dt_tokens_count(t);
    for (int w = 0; !st && w < windows && (size_t)(w + 1) * T + 1 <= n; w++) {
        size_t at = (size_t)w * T;
        for (int i = 0; i < T; i++) rows[i] = (dt_infer_row){ 0, i, (int32_t)dt_tokens_get(t, at + i), 1 };
        st = dt_decoder_step(d, rows, T, logits);
        for (int i = 0; !st && i < T; i++) {
            const float *l = logits + (size_t)i * V;
            double mx = l[0], sum = 0;
            for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
            for (int v = 0; v < V; v++) sum += exp(l[v] - mx);
            nll += mx + log(sum) - l[dt_tokens_get(t, at + i + 1)];
            (*ntok)++;
        }
    }
    *ppl = *ntok ? exp(nll / (double)*ntok) : 0;
    free(logits);
    free(rows);
    dt_decoder_destroy(d);
    dt_tokens_close(t);
    return st;
}

typedef struct { double prefill, decode1, decodeb; } speeds; /* tokens/s */

static int measure(dt_gpt2 *m, dt_quant q, int threads, const dt_bench_infer_opts *o, speeds *out) {
    int Tmax = dt_gpt2_get_config(m)->max_seq_len;
    if (o->prompt + o->steps > Tmax) {
        dt_log(DT_LOG_ERROR, "bench infer: --prompt %d and --steps %d need %d positions; %s holds %d", o->prompt, o->steps,
               o->prompt + o->steps, o->model, Tmax);
        return 1;
    }
    dt_kernels_set_threads(threads);
    int rows = o->prompt > o->batch ? o->prompt : o->batch;
    dt_decoder *d = NULL;
    if (dt_decoder_create(m, q, o->batch, rows, o->prompt + o->steps, &d)) { /* (the positions it reads, not a 40960 context's) */ dt_log(DT_LOG_ERROR, "bench infer: %s", dt_last_error()); return 1; }
    float *logits = malloc(sizeof(float) * (size_t)rows * (size_t)dt_gpt2_get_config(m)->vocab_size);
    double pre = time_prefill(d, o->prompt, 1, logits); /* warm-up: pages touched, caches filled */
    if (pre >= 0) pre = time_prefill(d, o->prompt, o->reps, logits);
    double d1 = pre >= 0 ? time_decode(d, 1, o->prompt, o->steps, o->reps, logits) : -1;
    double db = d1 >= 0 ? time_decode(d, o->batch, o->prompt, o->steps, o->reps, logits) : -1;
    *out = (speeds){ o->prompt / pre, 1 / d1, o->batch / db };
    free(logits);
    dt_decoder_destroy(d);
    if (db < 0) dt_log(DT_LOG_ERROR, "bench infer: %s", dt_last_error());
    return db < 0;
}

/* Lines of other runs ({"impl", "prec", "threads", "prefill", "decode1", "decodeb"}) into rows; the greedy checks printed;
 * anything else passed on to stderr. */
static void collect(FILE *p, cJSON *rows) {
    char line[4096];
    while (p && fgets(line, sizeof line, p)) {
        cJSON *j = cJSON_Parse(line);
        if (j && cJSON_GetObjectItem(j, "check")) {
            const char *what = cJSON_GetStringValue(cJSON_GetObjectItem(j, "check"));
            printf("# %s (theirs against dtrain generate's) on these weights: %s, %d of %d tokens agree (%d distinct)\n", what ? what : "?",
                   cJSON_IsTrue(cJSON_GetObjectItem(j, "same")) ? "the same tokens" : "DIFFERENT",
                   (int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "agree")), (int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "tokens")),
                   (int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "distinct")));
            cJSON_Delete(j);
        } else if (j && cJSON_GetObjectItem(j, "impl")) cJSON_AddItemToArray(rows, j);
        else { cJSON_Delete(j); fputs(line, stderr); }
    }
}

/* The baselines' lines from bench/infer_baselines.py, on the weights in dir: an HF folder (hf/) and a GGUF. */
static void baselines(const dt_bench_infer_opts *o, const char *weights, cJSON *rows) { /* weights: the folder */
    char cmd[8192];
    if (dt_bench_venv_cmd(cmd, sizeof cmd, "infer_baselines.py", 1)) return;
    size_t n = strlen(cmd);
    char self[4096];
    if (dt_bench_self_dir(self, sizeof self)) return;
    /* first each baseline's 64 greedy tokens against dtrain generate's on the same weights */
    snprintf(cmd + n, sizeof cmd - n, "--weights %s/hf --gguf %s/model.gguf --threads %s --prompt %d --steps %d --batch %d --reps %d "
             "--which %s --check %d --dtrain %s/dtrain", weights, weights, o->threads_list, o->prompt, o->steps, o->batch, o->reps,
             o->baseline, 64, self);
    FILE *p = popen(cmd, "r");
    collect(p, rows);
    if (p && pclose(p)) dt_log(DT_LOG_WARN, "bench infer: the baselines' script failed (its messages are above)");
}

/* A rank of `dtrain launch -n tp -- dtrain bench infer --tp N`: the decoder over its tensor-parallel part on one
 * thread, every rank stepping together; rank 0 prints the rows collect() reads. */
static int tp_rank(const dt_bench_infer_opts *o) {
    dt_comm *w = NULL;
    dt_gpt2 *whole = NULL, *m = NULL;
    dt_tp_ops ops;
    dt_status st = dt_comm_init(&w);
    if (!st && dt_comm_size(w) != o->tp) st = dt_error(DT_ERR_ARG, "bench infer --tp %d: the job has %d ranks", o->tp, dt_comm_size(w));
    if (!st) st = load(o->model, &whole);
    if (!st) st = dt_generate_split(whole, w, true, &ops, &m);
    int rc = st != DT_OK;
    if (st) dt_log(DT_LOG_ERROR, "bench infer: %s", dt_last_error());
    for (int q = 0; !rc && q < 2; q++) {
        speeds s;
        rc = measure(m, q ? DT_QUANT_INT8 : DT_QUANT_NONE, 1, o, &s);
        if (!rc && dt_comm_rank(w) == 0)
            printf("{\"impl\": \"dtrain TP%d\", \"prec\": \"%s\", \"threads\": %d, \"prefill\": %.3f, \"decode1\": %.3f, "
                   "\"decodeb\": %.3f}\n", o->tp, q ? "int8" : "f32", o->tp, s.prefill, s.decode1, s.decodeb);
        fflush(stdout);
    }
    dt_gpt2_destroy(m);
    dt_comm_destroy(w);
    return rc;
}

/* The tensor-parallel rows, from this program under dtrain launch. */
static void tp_rows(const dt_bench_infer_opts *o, cJSON *rows) {
    char self[4096], cmd[12288];
    if (dt_bench_self_dir(self, sizeof self)) return;
    snprintf(cmd, sizeof cmd, "%s/dtrain launch -n %d -- %s/dtrain bench infer --model '%s' --prompt %d --steps %d --batch %d --reps %d "
             "--tp %d", self, o->tp, self, o->model, o->prompt, o->steps, o->batch, o->reps, o->tp);
    FILE *p = popen(cmd, "r");
    collect(p, rows);
    if (!p || pclose(p)) dt_log(DT_LOG_WARN, "bench infer: the tensor-parallel run failed (its messages are above)");
}

/* ratio: dtrain's speed over this row's (NULL: none) */
static void print_row(const char *impl, const char *prec, int t, speeds s, const speeds *ratio) {
    printf("%-10s %-5s %7d %10.0f %10.1f %12.1f %11.2f", impl, prec, t, s.prefill, s.decode1, s.decodeb, s.decodeb / s.decode1);
    if (ratio) printf("   %5.2fx %6.2fx %6.2fx", ratio->prefill, ratio->decode1, ratio->decodeb);
    printf("\n");
}

static speeds speeds_of(const cJSON *r) {
    return (speeds){ cJSON_GetNumberValue(cJSON_GetObjectItem(r, "prefill")), cJSON_GetNumberValue(cJSON_GetObjectItem(r, "decode1")),
                     cJSON_GetNumberValue(cJSON_GetObjectItem(r, "decodeb")) };
}

/* Round r's row of the same implementation, precision and threads as row `like` (NULL: none). */
static const cJSON *same_row(const cJSON *rows, const cJSON *like) {
    const cJSON *r;
    cJSON_ArrayForEach(r, rows) {
        int same = 1;
        for (int k = 0; k < 3 && same; k++) {
            const char *key = k == 0 ? "impl" : k == 1 ? "prec" : "threads";
            const cJSON *a = cJSON_GetObjectItem(r, key), *b = cJSON_GetObjectItem(like, key);
            same = a && b && (cJSON_IsString(a) ? cJSON_IsString(b) && !strcmp(a->valuestring, b->valuestring)
                                                : cJSON_GetNumberValue(a) == cJSON_GetNumberValue(b));
        }
        if (same) return r;
    }
    return NULL;
}

/* The median over the rounds of each figure (ratios: of each round's own ratio); with rounds, each ratio's rounds. */
static void print_table(const int *ts, int nt, speeds (*mine)[2][8], cJSON *const *rows, int R) {
    printf("%-10s %-5s %7s %10s %10s %12s %11s%s\n", "impl", "prec", "threads", "prefill/s", "decode/s", "decode b/s", "b over 1",
           cJSON_GetArraySize(rows[0]) ? "   dtrain's speed over it: prefill, decode 1, decode b" : "");
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < nt; i++) {
            double v[3][MAX_ROUNDS];
            for (int r = 0; r < R; r++) v[0][r] = mine[r][q][i].prefill, v[1][r] = mine[r][q][i].decode1, v[2][r] = mine[r][q][i].decodeb;
            print_row("dtrain", q ? "int8" : "f32", ts[i], (speeds){ dt_median(v[0], R), dt_median(v[1], R), dt_median(v[2], R) }, NULL);
            if (R > 1) printf("%*s(decode 1 by round:", 10, "");
            for (int r = 0; R > 1 && r < R; r++) printf("%s %.1f", r ? "," : "", mine[r][q][i].decode1);
            if (R > 1) printf(")\n");
        }
    const cJSON *row;
    cJSON_ArrayForEach(row, rows[0]) {
        const char *impl = cJSON_GetStringValue(cJSON_GetObjectItem(row, "impl")), *prec = cJSON_GetStringValue(cJSON_GetObjectItem(row, "prec"));
        int t = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(row, "threads")), k = 0, q = prec && !strcmp(prec, "f32") ? 0 : 1, n = 0;
        while (k < nt && ts[k] != t) k++;
        double v[3][MAX_ROUNDS], x[3][MAX_ROUNDS];
        for (int r = 0; r < R; r++) {
            const cJSON *their = r ? same_row(rows[r], row) : row;
            if (!their) continue;
            speeds s = speeds_of(their);
            v[0][n] = s.prefill, v[1][n] = s.decode1, v[2][n] = s.decodeb;
            if (k < nt)
                x[0][n] = mine[r][q][k].prefill / s.prefill, x[1][n] = mine[r][q][k].decode1 / s.decode1,
                x[2][n] = mine[r][q][k].decodeb / s.decodeb;
            n++;
        }
        char by_round[512] = "";
        for (int r = 0, len = 0; R > 1 && k < nt && r < n && len < (int)sizeof by_round; r++)
            len += snprintf(by_round + len, sizeof by_round - (size_t)len, "%s %.1f (dtrain's %.2fx)", r ? "," : "", v[1][r], x[1][r]);
        /* dt_median sorts: the rounds are listed first */
        speeds med = { dt_median(v[0], n), dt_median(v[1], n), dt_median(v[2], n) }, ratio = { 0, 0, 0 };
        if (k < nt) ratio = (speeds){ dt_median(x[0], n), dt_median(x[1], n), dt_median(x[2], n) };
        print_row(impl, prec, t, med, k < nt ? &ratio : NULL);
        if (*by_round) printf("%*s(decode 1 by round:%s)\n", 10, "", by_round);
    }
}

/* What the machine allows decoding at each thread count: its memory's read rate over the weights' bytes (f32, int8),
 * and its arithmetic's ceiling. */
static void print_ceilings(dt_gpt2 *m, const int *ts, int nt) {
    size_t wb[2] = { 0, 0 }; /* the weights' bytes, f32 and int8 */
    for (int q = 0; q < 2; q++) {
        dt_decoder *probe = NULL;
        if (!dt_decoder_create(m, q ? DT_QUANT_INT8 : DT_QUANT_NONE, 1, 1, 0, &probe)) wb[q] = dt_decoder_weight_bytes(probe);
        dt_decoder_destroy(probe);
    }
    for (int i = 0; i < nt; i++) {
        double bw = read_bandwidth(ts[i]);
        printf("# memory read at %.1f GB/s on %d thread(s): decode at batch 1 reads the %.0f MB of f32 weights (%.0f MB int8) a token, "
               "so at most %.1f (%.1f) tokens/s\n", bw / 1e9, ts[i], wb[0] / 1e6, wb[1] / 1e6, wb[0] ? bw / (double)wb[0] : 0,
               wb[1] ? bw / (double)wb[1] : 0);
        compute_ceiling(ts[i], wb, bw);
    }
}

/* --eval-data: the perplexity of f32 and int8 decoding over it; 1 if it could not be measured (said). */
static int print_perplexity(dt_gpt2 *m, const char *data) {
    double p[2];
    long nt = 0;
    for (int q = 0; q < 2; q++)
        if (perplexity(m, q ? DT_QUANT_INT8 : DT_QUANT_NONE, data, 16, &p[q], &nt)) {
            dt_log(DT_LOG_ERROR, "bench infer: %s", dt_last_error());
            return 1;
        }
    printf("# perplexity over %ld tokens of %s: f32 %.4f, int8 %.4f (%+.2f%%)\n", nt, data, p[0], p[1], 100 * (p[1] / p[0] - 1));
    return 0;
}

/* The weights the baselines read, in a new folder weights (made here): an HF folder (transformers) and a GGUF (llama.cpp),
 * as ckpt export writes them; false (said) where they could not be written. */
static bool write_baseline_weights(dt_gpt2 *m, char *weights) {
    char hf[64], gguf[64];
    bool made = mkdtemp(weights) != NULL;
    snprintf(hf, sizeof hf, "%s/hf", weights);
    snprintf(gguf, sizeof gguf, "%s/model.gguf", weights);
    if (made && !dt_hf_folder_save(hf, m) && !dt_gguf_save(gguf, m, NULL)) return true;
    dt_log(DT_LOG_ERROR, "bench infer: cannot write the weights for the baselines: %s", made ? dt_last_error() : "no temporary folder");
    return false;
}

static void remove_baseline_weights(const char *weights) {
    char path[96];
    const char *files[] = { "hf/config.json", "hf/generation_config.json", "hf/model.safetensors", "hf", "model.gguf" };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", weights, files[i]);
        remove(path);
    }
    rmdir(weights);
}

int dt_bench_infer(const dt_bench_infer_opts *o) {
    dt_launch_kind kind;
    if (o->tp > 1 && !dt_comm_detect_launch(&kind) && kind != DT_LAUNCH_NONE) return tp_rank(o);
    dt_gpt2 *m = NULL;
    if (load(o->model, &m)) { dt_log(DT_LOG_ERROR, "bench infer: %s", dt_last_error()); return 1; }
    char cpu[128];
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    printf("# dtrain bench infer: %s (%d layers, %d channels, vocabulary %d), %s\n", o->model, c->num_layers, c->channels, c->vocab_size,
           dt_cpu_model(cpu, sizeof cpu));
    printf("# prefill: a %d-token prompt in one pass; decode: %d steps after it, batch 1 and %d; medians of %d\n", o->prompt,
           o->steps, o->batch, o->reps);
    int nt = 0, ts[8];
    for (const char *s = o->threads_list; *s && nt < 8; s += strcspn(s, ",") + (s[strcspn(s, ",")] == ',')) ts[nt++] = atoi(s);
    print_ceilings(m, ts, nt);
    if (o->eval_data && print_perplexity(m, o->eval_data)) {
        dt_gpt2_destroy(m);
        return 1;
    }
    /* with a baseline and --rounds: dtrain's rows and the baselines' in turn, the order reversed every other round */
    int R = o->baseline && o->rounds > 1 ? (o->rounds < MAX_ROUNDS ? o->rounds : MAX_ROUNDS) : 1;
    speeds(*mine)[2][8] = calloc((size_t)R, sizeof *mine);
    cJSON *rows[MAX_ROUNDS] = { 0 };
    char weights[] = "/tmp/dtrain-infer-XXXXXX";
    bool have_weights = o->baseline && write_baseline_weights(m, weights);
    int rc = !mine;
    for (int r = 0; r < R && !rc; r++) {
        rows[r] = cJSON_CreateArray();
        if (r % 2 && have_weights) baselines(o, weights, rows[r]);
        for (int q = 0; q < 2 && !rc; q++)
            for (int i = 0; i < nt && !rc; i++) rc = measure(m, q ? DT_QUANT_INT8 : DT_QUANT_NONE, ts[i], o, &mine[r][q][i]);
        if (!(r % 2) && have_weights && !rc) baselines(o, weights, rows[r]);
        if (R > 1) fprintf(stderr, "# round %d of %d done\n", r + 1, R);
    }
    if (o->baseline) remove_baseline_weights(weights);
    if (!rc && o->tp > 1) tp_rows(o, rows[0]);
    if (!rc) print_table(ts, nt, mine, rows, R);
    for (int r = 0; r < R; r++) cJSON_Delete(rows[r]);
    free(mine);
    dt_gpt2_destroy(m);
    return rc;
}

