/* dtrain: the command. Each subcommand parses its own flags and calls the
 * library; nothing here decides anything else, but for starting again with
 * the BLAS's kernels the CPU has (they are chosen as the library loads). */
#include "cli.h"
#include "dtrain/base.h"
#include "dtrain/kernels.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Flag helpers shared by the subcommands. */

/* Edit distance (insertions, deletions, substitutions, adjacent swaps), for "did you mean". */
static int distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 62 || m > 62) return 99;
    int d[64][64];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best) best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

int dt_cli_flag_error(const char *cmd, const dt_cli_flag *flags, const char *flag, const char *v) {
    for (const dt_cli_flag *f = flags; f->name; f++)
        if (!strcmp(f->name, flag)) {
            if (!v) dt_log(DT_LOG_ERROR, "%s: %s needs a value: %s", cmd, flag, f->value);
            else dt_log(DT_LOG_ERROR, "%s: %s %s is not valid: expected %s", cmd, flag, v, f->value);
            return 2;
        }
    const char *best = NULL;
    int bd = 99;
    for (const dt_cli_flag *f = flags; f->name; f++) {
        int d = distance(flag, f->name);
        if (d < bd) { bd = d; best = f->name; }
    }
    if (best && bd <= 2 + (int)strlen(flag) / 8)
        dt_log(DT_LOG_ERROR, "%s: unknown flag %s (did you mean %s?)", cmd, flag, best);
    else dt_log(DT_LOG_ERROR, "%s: unknown flag %s (see dtrain %s --help)", cmd, flag, cmd);
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

int dt_cli_numbers(const char *s, double *out, int max) {
    int n = 0;
    for (const char *p = s; p && *p; n++) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || (*end && *end != ',') || errno || !isfinite(v) || n == max) return 0;
        out[n] = v;
        p = *end ? end + 1 : end;
        if (*end && !*p) return 0; /* (a trailing comma) */
    }
    return n;
}

int dt_cli_device(const char *v, int *cuda, int *named) {
    int n = 0, used = 0;
    *cuda = 0;
    if (!strcmp(v, "cuda")) *cuda = 1;
    else if (sscanf(v, "cuda:%d%n", &n, &used) == 1 && !v[used] && n >= 0 && n < 1024) *cuda = n + 1, *named = 1;
    return *cuda > 0 || !strcmp(v, "cpu");
}

int dt_cli_number_flag(const dt_cli_num_flag *table, size_t n, const char *f, const char *v) {
    const dt_cli_num_flag *nf = NULL;
    for (size_t k = 0; k < n && !nf; k++)
        if (!strcmp(f, table[k].name)) nf = &table[k];
    if (!nf) return -1;
    double x;
    if (!dt_cli_number(v, nf->lo, nf->hi, &x) || (nf->whole && x != (double)(int64_t)x)) return 0;
    if (nf->kind == 'i') *(int *)nf->out = (int)x;
    if (nf->kind == 'f') *(float *)nf->out = (float)x;
    if (nf->kind == 'd') *(double *)nf->out = x;
    if (nf->kind == 'l') *(int64_t *)nf->out = (int64_t)x;
    if (nf->kind == 'u') *(uint64_t *)nf->out = (uint64_t)x;
    return 1;
}


static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain COMMAND [ARGS]   (dtrain COMMAND --help for each command's flags)\n"
            "\n"
            "commands:\n"
            "  train --data FILE [FLAGS]           train GPT-2, a Llama or a mixture of experts (pretraining, SFT, DPO,\n"
            "                                      GRPO, LoRA), or an MLP or ResNet on images; --nproc N local ranks\n"
            "  plan [TRAIN'S FLAGS]                memory and step time of a layout before launch (--hardware, --search, --json)\n"
            "  tokenize --bytes IN OUT             text to a token file, one token per byte\n"
            "  tokenize --bpe ENC VOCAB IN OUT     text to a token file with GPT-2's BPE (encoder.json, vocab.bpe)\n"
            "  eval --model M [--data FILE]        the validation loss of a checkpoint (on its own settings), model or HF folder\n"
            "  generate --model F --prompt T       sample text from a trained model\n"
            "  rl --env cartpole [--nproc N]       reinforcement learning (PPO, IMPALA, REINFORCE) on dtrain's environments\n"
            "  serve MODEL [--port P]              serve it over HTTP (OpenAI's completions and chat API, continuous batching)\n"
            "  plot METRICS.jsonl -o loss.svg      draw the loss curve (--log: log scale)\n"
            "  report RUN_DIR -o report.html       one HTML page of a run (charts, timeline; see train --report)\n"
            "  ckpt info|verify DIR                what a checkpoint holds; every kept one checked against its hashes\n"
            "  ckpt export DIR FILE|FOLDER/        its weights as .safetensors, .bin, .gguf or an HF folder\n"
            "  ckpt merge MODEL ADAPTERS OUT       MODEL with PEFT's LoRA adapters merged, written as export writes\n"
            "  launch -n N [--] PROGRAM [ARGS]     run N local ranks of PROGRAM over shared memory\n"
            "  bench comm [FLAGS]                  collective latency and bandwidth, against MPI (--baseline mpi)\n"
            "  bench train [FLAGS]                 training throughput, against PyTorch (--baseline torch); --nproc 1,2,4\n"
            "  bench infer [FLAGS]                 prefill and decoding tokens/s, against HF and llama.cpp (--baseline)\n"
            "  bench serve [FLAGS]                 a server's throughput and latency under offered load\n"
            "  bench rl [FLAGS]                    environment steps/s of dtrain's env pools, against Gymnasium's\n"
            "  bench gemm [THREADS]                the BLAS sgemm ceiling\n"
            "  help, --help                        this text\n"
            "  --version                           the version\n"
            "\n"
            "Under mpirun/srun (srun --mpi=pmix), programs built on dtrain use MPI between\n"
            "machines and shared memory inside each.\n");
}

/* "--flag=value" as "--flag value" (argparse's form, the one users type),
 * up to a bare "--": what follows it is another program's. One allocation
 * holds the new array and the flags' names (free it once). */
static char **split_equals(int *argc, char **argv) {
    size_t names = 0;
    for (int i = 1; i < *argc; i++) names += strlen(argv[i]) + 1;
    char **out = malloc(sizeof(char *) * (2 * (size_t)*argc + 1) + names);
    if (!out) return NULL;
    char *store = (char *)(out + 2 * (size_t)*argc + 1);
    int n = 0, rest = 0;
    for (int i = 0; i < *argc; i++) {
        char *a = argv[i], *eq = strchr(a, '=');
        rest |= !strcmp(a, "--");
        if (rest || i == 0 || strncmp(a, "--", 2) || !eq || eq == a + 2) { out[n++] = a; continue; }
        size_t len = (size_t)(eq - a);
        memcpy(store, a, len);
        store[len] = 0;
        out[n++] = store;
        store += len + 1;
        out[n++] = eq + 1;
    }
    out[n] = NULL;
    *argc = n;
    return out;
}

static int dispatch(int argc, char **argv) {
    const char *cmd = argv[1];
    if (!strcmp(cmd, "launch")) return dt_cli_launch(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return dt_cli_bench(argc, argv);
    if (!strcmp(cmd, "train")) return dt_cli_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return dt_cli_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return dt_cli_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return dt_cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return dt_cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "rl")) return dt_cli_rl(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return dt_cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot")) return dt_cli_plot(argc - 1, argv + 1);
    if (!strcmp(cmd, "report")) return dt_cli_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "ckpt")) return dt_cli_ckpt(argc - 1, argv + 1);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) { usage(stdout); return 0; }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) { printf("dtrain %s\n", DT_VERSION); return 0; }
    dt_log(DT_LOG_ERROR, "unknown command '%s'", cmd);
    usage(stderr);
    return 2;
}

/* OpenBLAS picks its kernels as it loads, before main: where its pick is below this CPU's vector level and the user named
 * none ($OPENBLAS_CORETYPE), the command runs again with the kernels the CPU has (execvp keeps the process, its
 * environment and mpirun's place for it; MPI is not yet started). Failing that, it goes on with OpenBLAS's pick. */
static void blas_kernels(char **argv) {
    const char *want = getenv("OPENBLAS_CORETYPE") ? NULL : dt_kernels_blas_core_wanted();
    if (!want || setenv("OPENBLAS_CORETYPE", want, 1) != 0) return;
    fflush(NULL);
    execvp(argv[0], argv);
    unsetenv("OPENBLAS_CORETYPE");
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    blas_kernels(argv);
    dt_kernels_flush_denormals(); /* before any thread or worker starts: they inherit it */
    char **split = split_equals(&argc, argv);
    if (!split) { dt_log(DT_LOG_ERROR, "out of memory"); return 1; }
    /* a line at a time into a pipe too (| tee, mpirun): the start lines show before step 1 */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = dispatch(argc, split);
    free(split);
    return rc;
}
