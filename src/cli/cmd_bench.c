/* dtrain bench comm [FLAGS] */
#include "cli.h"
#include "dtrain/bench.h"
#include "dtrain/kernels.h"
#include "dtrain/obs.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The flags of bench comm and bench train and what each takes, for error messages. */
static const dt_cli_flag comm_flags[] = {
    { "--op", "a collective (allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, gather, scatter, barrier)" },
    { "--algo", "auto or an algorithm (shm_direct, ring, tree, rd, rabenseifner, bruck, pairwise, hier)" },
    { "--dtype", "f32, f64, bf16, f16, i32 or i64" }, { "--redop", "sum, avg, max, min or prod" },
    { "--nproc", "a whole number from 1 to 4096" }, { "--reps", "a whole number from 1 to 4096" },
    { "--warmup", "a whole number from 0 to 4096" }, { "--rounds", "a whole number from 1 to 4096" },
    { "--seconds", "a number above 0 and below 60" }, { "--buffers", "arena or private" }, { "--baseline", "mpi or mpich" },
    { "--sizes", "a list of sizes like 8,1M,64M" }, { "--json", "" }, { "--calibrate", "" }, { "--help", "" }, { NULL, NULL },
};
static const dt_cli_flag train_flags[] = {
    { "--model", "a preset (d6, 124M, ...)" }, { "--batch", "a whole number from 1 to 99999" },
    { "--seq", "a whole number from 1 to 99999" }, { "--steps", "a whole number from 1 to 99999" },
    { "--warmup", "a whole number from 0 to 99999" }, { "--threads", "a whole number from 0 to 99999" },
    { "--rounds", "a whole number from 1 to 99999" }, { "--baseline", "torch, or with --zero: fsdp, deepspeed or all" }, { "--precision", "fp32, bf16 or fp16" }, { "--nproc", "a list like 1,2,4" },
    { "--zero", "1, 2 or 3" }, { "--tp", "a whole number of ranks from 2 to 256" }, { "--pp", "a whole number of stages from 2 to 256" }, { "--cp", "a whole number of ranks from 2 to 256" },
    { "--micro-batches", "a whole number from 1 to 1e6" },
    { "--train-flags", "flags for dtrain train, in one argument" }, { "--synthetic", "" }, { "--sp", "" }, { "--report", "a directory" }, { "--json", "" }, { "--help", "" }, { NULL, NULL },
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain bench comm [FLAGS]   (also: bench train, bench infer, bench serve, bench rl, bench gemm: each with --help)\n"
            "  --op COLL          allreduce (default), reduce_scatter, allgather, broadcast, reduce,\n"
            "                     alltoall, gather, scatter, barrier\n"
            "  --algo ALGO        auto (default), shm_direct, ring, tree, rd, rabenseifner, bruck,\n"
            "                     pairwise, hier\n"
            "  --nproc N          local ranks (default 2)\n"
            "  --sizes LIST       e.g. 8,1M,64M (default 8B, then 16B to 256MiB by x4); nccl-tests sizes\n"
            "  --buffers KIND     arena (default: dt_comm_alloc, zero-copy) or private (malloc)\n"
            "  --dtype T          f32 (default), f64, bf16, f16, i32, i64\n"
            "  --redop OP         sum (default), avg, max, min, prod\n"
            "  --reps N           timed repetitions per size, median reported (default 7)\n"
            "  --warmup N         warm-up repetitions (default 2)\n"
            "  --seconds S        length of one repetition (default 0.05)\n"
            "  --baseline LIB     also time the MPI library's collective in the same invocation:\n"
            "                     mpi (the one dtrain was built with, Open MPI) or mpich\n"
            "  --rounds N         alternate dtrain and baseline N times, median of rounds (default 1)\n"
            "  --json             one JSON object per line\n"
            "  --calibrate        measure the cost model's parameters (alpha, beta, gamma) on this\n"
            "                     machine, save them where algo=auto reads them\n"
            "                     ($DTRAIN_CALIBRATION or ~/.cache/dtrain/comm-calibration.txt),\n"
            "                     and print what auto then picks by size; across machines MPI's\n"
            "                     alpha and beta, and how much slower a core computes beside the\n"
            "                     link (the planner's link_compute)\n");
}

static void train_help(void) {
    printf("usage: dtrain bench train [--model 124M] [--batch 4] [--seq 64] [--steps 10] [--warmup 2]\n"
           "                          [--threads 1] [--rounds 1] [--baseline torch] [--json]\n"
           "                          [--precision bf16|fp16]  one process: that mixed precision against fp32,\n"
           "                          alternating (and PyTorch under torch.autocast of that type)\n"
           "                          [--nproc 1,2,4]  data parallel: dtrain train --nproc N for each N\n"
           "                          (threads per rank), against PyTorch DDP over gloo with --baseline torch,\n"
           "                          and against N independent 1-rank runs side by side (the machine's ceiling)\n"
           "                          [--train-flags \"--step-at-end\"]  more flags for dtrain train\n"
           "                          [--report DIR]  with --nproc: a run of the largest N into DIR and its\n"
           "                          report with the scaling chart (DIR/report.html)\n"
           "                          [--tp N [--sp] [--baseline torch]]  tensor (and sequence) parallelism on N ranks against one process\n"
           "                          with N threads and N data-parallel ranks (batch / N each), alternating, and\n"
           "                          PyTorch's tensor parallelism (DTensor over gloo; the baselines' venv)\n"
           "                          [--pp N [--micro-batches M] [--baseline torch]]  pipeline parallelism, GPipe, 1F1B, zb1 and interleaved,\n"
           "                          on N stages (M micro-batches of --batch a step, 2N by default) against one process with N\n"
           "                          threads and N data-parallel ranks, and PyTorch's pipelining (the baselines' venv)\n"
           "                          [--cp N]  context parallelism on N ranks by ring and by all-to-all against one\n"
           "                          process with N threads (--batch sequences of --seq; the model's positions grow to --seq)\n"
           "                          [--nproc 2 --zero 1|2|3 [--baseline fsdp|deepspeed|all]]  that ZeRO stage against\n"
           "                          dtrain's DDP and PyTorch's (ZeroRedundancyOptimizer, FSDP2) or DeepSpeed's at the\n"
           "                          stage (their virtual environment: scripts/make-baselines-venv.sh)\n"
           "                          [--model resnet50|resnet18|resnet34|resnet:small --synthetic [--nproc 1,2]]\n"
           "                          Horovod's synthetic benchmark: img/sec per worker (mean +- 1.96 sd) and in total,\n"
           "                          --steps iterations of --batch images per worker (default 64); --baseline torch:\n"
           "                          torchvision's model under PyTorch 2.x (the virtual environment) and Debian's PyTorch\n");
}

/* --nproc's list (1,2,4) into o; 0 where it is not one. */
static int nproc_list(const char *v, dt_bench_train_opts *o) {
    o->nnprocs = 0;
    for (const char *q = v; *q;) {
        char *e;
        long k = strtol(q, &e, 10);
        if (e == q || k < 1 || k > 256 || o->nnprocs == 16 || (*e && *e != ',')) return 0;
        o->nprocs[o->nnprocs++] = (int)k;
        q = *e ? e + 1 : e;
    }
    return 1;
}

/* A flag taking a value: 1 taken, 0 not one of bench train's (or a bad value). */
static int train_flag(const char *f, const char *v, dt_bench_train_opts *o, bool *batch_given) {
    char *end;
    long n = strtol(v, &end, 10);
    bool isnum = *end == 0 && n >= 0 && n < 100000;
    if (!strcmp(f, "--model")) o->model = v;
    else if (!strcmp(f, "--train-flags")) o->train_flags = v;
    else if (!strcmp(f, "--report")) o->report = v;
    else if (!strcmp(f, "--precision") && (!strcmp(v, "bf16") || !strcmp(v, "fp16") || !strcmp(v, "fp32")))
        o->precision = !strcmp(v, "bf16") ? DT_BF16 : !strcmp(v, "fp16") ? DT_F16 : DT_F32;
    else if (!strcmp(f, "--baseline") && (!strcmp(v, "torch") || !strcmp(v, "fsdp") || !strcmp(v, "deepspeed") || !strcmp(v, "all")))
        o->baseline = v;
    else if (isnum && n >= 1 && n <= 3 && !strcmp(f, "--zero")) o->zero = (int)n;
    else if (isnum && n >= 2 && n <= 256 && !strcmp(f, "--tp")) o->tp = (int)n;
    else if (isnum && n >= 2 && n <= 256 && !strcmp(f, "--pp")) o->pp = (int)n;
    else if (isnum && n >= 2 && n <= 256 && !strcmp(f, "--cp")) o->cp = (int)n;
    else if (isnum && n >= 1 && n <= 1e6 && !strcmp(f, "--micro-batches")) o->micro = (int)n;
    else if (isnum && n >= 1 && !strcmp(f, "--batch")) o->batch = (int)n, *batch_given = true;
    else if (isnum && n >= 1 && !strcmp(f, "--seq")) o->seq = (int)n;
    else if (isnum && n >= 1 && !strcmp(f, "--steps")) o->steps = (int)n;
    else if (isnum && !strcmp(f, "--warmup")) o->warmup = (int)n;
    else if (isnum && !strcmp(f, "--threads")) o->threads = (int)n;
    else if (isnum && n >= 1 && !strcmp(f, "--rounds")) o->rounds = (int)n;
    else return 0;
    return 1;
}

/* The flags' combination: 0 where bench train runs it, else 2 (said). */
static int train_combination(dt_bench_train_opts *o, bool synthetic, bool batch_given) {
    bool image = !strncmp(o->model, "resnet", 6);
    if (image != synthetic) {
        dt_log(DT_LOG_ERROR, "bench train: %s", image ? "an image model is benchmarked on synthetic images: give --synthetic"
                                                       : "--synthetic benchmarks an image model (--model resnet50, resnet18, ...)");
        return 2;
    }
    if (image && (o->zero || o->precision != DT_F32 || o->report || (o->baseline && strcmp(o->baseline, "torch")))) {
        dt_log(DT_LOG_ERROR, "bench train: --model %s --synthetic takes --nproc, --batch, --steps, --warmup, --threads, --rounds, "
               "--baseline torch and --train-flags", o->model);
        return 2;
    }
    if (image && !batch_given) o->batch = 64; /* Horovod's default */
    if (o->baseline && strcmp(o->baseline, "torch") && !o->zero) {
        dt_log(DT_LOG_ERROR, "bench train: --baseline %s compares a ZeRO stage (give --zero 1, 2 or 3)", o->baseline);
        return 2;
    }
    if (o->zero && o->baseline && !strcmp(o->baseline, "torch")) {
        dt_log(DT_LOG_ERROR, "bench train: --zero %d compares with fsdp, deepspeed or all (dtrain's DDP runs anyway)", o->zero);
        return 2;
    }
    if (o->precision != DT_F32 && (o->nnprocs || o->zero)) {
        dt_log(DT_LOG_ERROR, "bench train: --precision compares one process's fp32 and mixed-precision steps; for ranks give "
               "--train-flags \"--precision bf16\"");
        return 2;
    }
    if (o->report && !o->nnprocs) {
        dt_log(DT_LOG_ERROR, "bench train: --report DIR charts the scaling of --nproc 1,2,4 (give --nproc)");
        return 2;
    }
    if (o->sp && !o->tp) {
        dt_log(DT_LOG_ERROR, "bench train: --sp compares sequence parallelism: give --tp N");
        return 2;
    }
    if (o->tp && (image || o->zero || o->nnprocs || o->precision != DT_F32 || o->report || (o->baseline && strcmp(o->baseline, "torch")))) {
        dt_log(DT_LOG_ERROR, "bench train: --tp N compares GPT-2 layouts on N cores; it takes --model, --batch, --seq, --steps, "
               "--warmup, --rounds, --baseline torch and --train-flags");
        return 2;
    }
    if (o->pp && (o->tp || image || o->zero || o->nnprocs || o->precision != DT_F32 || o->report || (o->baseline && strcmp(o->baseline, "torch")))) {
        dt_log(DT_LOG_ERROR, "bench train: --pp N compares GPT-2 layouts on N cores; it takes --model, --batch, --micro-batches, --seq, "
               "--steps, --warmup, --rounds, --baseline torch and --train-flags");
        return 2;
    }
    if (o->cp && (o->tp || o->pp || image || o->zero || o->nnprocs || o->precision != DT_F32 || o->report || o->baseline)) {
        dt_log(DT_LOG_ERROR, "bench train: --cp N compares GPT-2 layouts on N cores; it takes --model, --batch, --seq, --steps, "
               "--warmup, --rounds and --train-flags");
        return 2;
    }
    return 0;
}

static int bench_train(int argc, char **argv) {
    dt_bench_train_opts o;
    dt_bench_train_defaults(&o);
    bool synthetic = false, batch_given = false;
    for (int i = 3; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            train_help();
            return 0;
        }
        if (!strcmp(f, "--json")) { o.json = 1; continue; }
        if (!strcmp(f, "--synthetic")) { synthetic = true; continue; }
        if (!strcmp(f, "--sp")) { o.sp = 1; continue; }
        if (!v) return dt_cli_flag_error("bench train", train_flags, f, NULL);
        i++;
        if (!strcmp(f, "--nproc") && !nproc_list(v, &o)) {
            dt_log(DT_LOG_ERROR, "bench train: --nproc %s: expected a list like 1,2,4 (1..256, at most 16)", v);
            return 2;
        }
        if (strcmp(f, "--nproc") && !train_flag(f, v, &o, &batch_given)) return dt_cli_flag_error("bench train", train_flags, f, v);
    }
    int bad = train_combination(&o, synthetic, batch_given);
    if (bad) return bad;
    if (o.cp) return dt_bench_train_cp(&o);
    return o.pp ? dt_bench_train_pp(&o) : o.tp ? dt_bench_train_tp(&o) : dt_bench_train(&o);
}

/* argv is the whole command line ("dtrain bench comm ..."): the benchmark
 * re-executes it for each rank. */
static int bench_infer(int argc, char **argv) {
    static const dt_cli_flag flags[] = {
        { "--model", "a GPT-2 preset (124M, ...) or a weights file" }, { "--threads", "a list such as 1,2" },
        { "--prompt", "a whole number of tokens from 1 to 65536" }, { "--steps", "a whole number from 1 to 100000" }, { "--batch", "a whole number from 2 to 64" },
        { "--reps", "a whole number from 1 to 32" }, { "--baseline", "hf, llama or all" },
        { "--eval-data", "a token file" }, { "--tp", "a whole number of tensor-parallel ranks from 2 to 64" },
        { "--rounds", "a whole number from 1 to 16" }, { NULL, NULL } };
    dt_bench_infer_opts o = { "124M", "1,2", 128, 32, 8, 5, NULL, NULL, 0, 1 };
    double prompt = o.prompt, steps = o.steps, batch = o.batch, reps = o.reps, tp = 0, rounds = 1;
    for (int i = 3; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("usage: dtrain bench infer [--model 124M|smollm-135m|...] [--threads 1,2] [--prompt 128] [--steps 32] [--batch 8]\n"
                   "                          [--reps 5] [--baseline hf|llama|all] [--rounds 1] [--eval-data TOKENS] [--tp N]\n"
                   "  the decoder's prefill (a --prompt-token prompt) and decode tokens/s after it (--steps tokens, batch 1 and\n"
                   "  --batch) in f32 and int8 (any family: a preset is random weights); with --baseline, HF\n"
                   "  transformers' generate (the baselines' venv) and llama.cpp's llama-batched-bench (scripts/build-llama-cpp.sh;\n"
                   "  f32 and Q8_0) on the same weights (an HF folder and dtrain's GGUF), in the same run, each first\n"
                   "  checked for dtrain's 64 greedy tokens; --rounds R: dtrain's rows and the baselines' R times in\n"
                   "  turn (the order reversed every other round), each speed the median of its rounds and each ratio the median of\n"
                   "  the rounds' own, so that the machine's drift moves both sides of a ratio alike;\n"
                   "  --eval-data: int8's perplexity against f32's;\n"
                   "  --tp N: also N tensor-parallel ranks of one thread each (dtrain launch -n N), against one process\n");
            return 0;
        }
        i++;
        if (!strcmp(f, "--model") && v) o.model = v;
        else if (!strcmp(f, "--threads") && v && strspn(v, "0123456789,") == strlen(v) && atoi(v) > 0) o.threads_list = v;
        else if (!strcmp(f, "--prompt") && dt_cli_number(v, 1, 65536, &prompt) && prompt == (int)prompt) {}
        else if (!strcmp(f, "--steps") && dt_cli_number(v, 1, 100000, &steps) && steps == (int)steps) {}
        else if (!strcmp(f, "--batch") && dt_cli_number(v, 2, 64, &batch) && batch == (int)batch) {}
        else if (!strcmp(f, "--reps") && dt_cli_number(v, 1, 32, &reps) && reps == (int)reps) {}
        else if (!strcmp(f, "--baseline") && v && (!strcmp(v, "hf") || !strcmp(v, "llama") || !strcmp(v, "all"))) o.baseline = v;
        else if (!strcmp(f, "--eval-data") && v) o.eval_data = v;
        else if (!strcmp(f, "--tp") && dt_cli_number(v, 2, 64, &tp) && tp == (int)tp) {}
        else if (!strcmp(f, "--rounds") && dt_cli_number(v, 1, 16, &rounds) && rounds == (int)rounds) {}
        else return dt_cli_flag_error("bench infer", flags, f, v);
    }
    o.tp = (int)tp;
    o.prompt = (int)prompt;
    o.steps = (int)steps;
    o.batch = (int)batch;
    o.reps = (int)reps;
    o.rounds = (int)rounds;
    return dt_bench_infer(&o);
}

static int bench_serve(int argc, char **argv) {
    static const dt_cli_flag flags[] = {
        { "--model", "a weights file or checkpoint directory to serve" }, { "--url", "a running server's /v1/completions URL" },
        { "--clients", "a whole number from 1 to 1024" }, { "--seconds", "a number from 1 to 86400" },
        { "--max-tokens", "a whole number from 1 to 100000" }, { "--slots", "a whole number from 1 to 1024" },
        { "--threads", "a whole number from 0 (OMP_NUM_THREADS, or the cores it may use) to 1024" }, { "--quantize", "int8 or none" },
        { "--shared-prefix", "a whole number of bytes from 0 to 100000" }, { NULL, NULL } };
    dt_bench_serve_opts o = { NULL, NULL, "none", 16, 32, 8, 0, 20, 0 };
    double clients = o.clients, secs = o.seconds, mt = o.max_tokens, slots = o.slots, threads = 0, prefix = 0;
    for (int i = 3; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("usage: dtrain bench serve --model M | --url URL [--clients 16] [--seconds 20] [--max-tokens 32]\n"
                   "                          [--slots 8] [--threads N] [--quantize int8] [--shared-prefix BYTES]\n"
                   "  offered load: each client sends streamed completions back to back; requests done and failed,\n"
                   "  tokens/s, time to first token and inter-token latency percentiles, the prompt tokens a cache\n"
                   "  slot gave, the server's peak memory. --shared-prefix: every prompt starts with the same text\n"
                   "  (a system prompt); a server the bench starts runs twice, reusing prefixes and reading each\n"
                   "  prompt whole (DTRAIN_PREFIX_REUSE=off), the ratios printed\n");
            return 0;
        }
        i++;
        if (!strcmp(f, "--model") && v) o.model = v;
        else if (!strcmp(f, "--url") && v) o.url = v;
        else if (!strcmp(f, "--clients") && dt_cli_number(v, 1, 1024, &clients) && clients == (int)clients) {}
        else if (!strcmp(f, "--seconds") && dt_cli_number(v, 1, 86400, &secs)) {}
        else if (!strcmp(f, "--max-tokens") && dt_cli_number(v, 1, 100000, &mt) && mt == (int)mt) {}
        else if (!strcmp(f, "--slots") && dt_cli_number(v, 1, 1024, &slots) && slots == (int)slots) {}
        else if (!strcmp(f, "--threads") && dt_cli_number(v, 0, 1024, &threads) && threads == (int)threads) {}
        else if (!strcmp(f, "--quantize") && v && (!strcmp(v, "int8") || !strcmp(v, "none"))) o.quant = v;
        else if (!strcmp(f, "--shared-prefix") && dt_cli_number(v, 0, 100000, &prefix) && prefix == (int)prefix) {}
        else return dt_cli_flag_error("bench serve", flags, f, v);
    }
    if (!o.model == !o.url) { dt_log(DT_LOG_ERROR, "bench serve: give --model M (the bench serves it) or --url URL (a running server)"); return 2; }
    o.clients = (int)clients;
    o.seconds = secs;
    o.max_tokens = (int)mt;
    o.slots = (int)slots;
    o.threads = (int)threads;
    o.shared_prefix = (int)prefix;
    return dt_bench_serve(&o);
}

/* --envs 1,2,4,8: whole numbers from 1 to hi, at most cap of them */
static int parse_counts(const char *v, int hi, int *out, int *n, int cap) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    *n = 0;
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        double x;
        if (*n == cap || !dt_cli_number(t, 1, hi, &x) || x != (int)x) return 0;
        out[(*n)++] = (int)x;
    }
    return *n > 0;
}

static const dt_cli_flag rl_flags[] = {
    { "--env", "an environment (dtrain rl --help lists them)" }, { "--envs", "environments a worker: a list like 1,2,4,8 (1 to 4096)" },
    { "--workers", "worker processes: a list like 1,2 (1 to 256)" }, { "--steps", "a whole number of steps from 1000 to 1e10" },
    { "--slow-steps", "a whole number of steps from 1000 to 1e10" }, { "--async", "worker threads of the asynchronous pool (1 to 256)" },
    { "--python", "a Python interpreter that has gymnasium" }, { "--baseline", "" }, { "--help", "" }, { NULL, NULL },
};

static int bench_rl(int argc, char **argv) {
    dt_bench_rl_opts o = { .env = "cartpole", .envs = { 1, 2, 4, 8 }, .nenvs = 4, .workers = { 1, 2 }, .nworkers = 2, .steps = 1000000,
                           .slow_steps = 200000 };
    for (int i = 3; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("usage: dtrain bench rl [--env cartpole] [--envs 1,2,4,8] [--workers 1,2] [--steps 1000000] [--async T] [--baseline]\n"
                   "  environment steps/s under random actions: dtrain's env pools, --envs environments a worker process;\n"
                   "  --env gym:ID: the bridge to Gymnasium, one Python process a worker (--python python3);\n"
                   "  --async T: then the asynchronous pool of each --envs count, T threads, receiving half of them at a time;\n"
                   "  --baseline: then Gymnasium's SyncVectorEnv, AsyncVectorEnv (--slow-steps 200000 of it), its own\n"
                   "  vectorised CartPole and EnvPool (2 threads; with --async its asynchronous mode too, batches of half),\n"
                   "  from the baselines' virtual environment\n");
            return 0;
        }
        if (!strcmp(f, "--baseline")) { o.baseline = 1; continue; }
        int ok = v != NULL;
        if (!ok) {}
        else if (!strcmp(f, "--env")) o.env = v;
        else if (!strcmp(f, "--python")) o.python = v;
        else if (!strcmp(f, "--envs")) ok = parse_counts(v, 4096, o.envs, &o.nenvs, 16);
        else if (!strcmp(f, "--workers")) ok = parse_counts(v, 256, o.workers, &o.nworkers, 8);
        else if (!strcmp(f, "--steps") && dt_cli_number(v, 1000, 1e10, &x)) o.steps = (int64_t)x;
        else if (!strcmp(f, "--slow-steps") && dt_cli_number(v, 1000, 1e10, &x)) o.slow_steps = (int64_t)x;
        else if (!strcmp(f, "--async") && dt_cli_number(v, 1, 256, &x) && x == (int)x) o.async_threads = (int)x;
        else ok = 0;
        if (!ok) return dt_cli_flag_error("bench rl", rl_flags, f, v);
        i++;
    }
    return dt_bench_rl(&o);
}

/* dtrain bench gemm [--threads N]: sgemm's ceiling, the one-thread rate cached as MFU's peak. */
static int bench_gemm(int argc, char **argv) {
    double t = 1;
    if (argc >= 4 && (!strcmp(argv[3], "-h") || !strcmp(argv[3], "--help"))) {
        printf("usage: dtrain bench gemm [--threads N]\n  sgemm 2048^3 through BLAS: the machine's matmul ceiling in GFLOP/s;\n"
               "  the 1-thread rate is kept as the peak per thread that train's MFU divides by\n");
        return 0;
    }
    if (argc >= 4 && (argc != 5 || strcmp(argv[3], "--threads") || !dt_cli_number(argv[4], 1, 1024, &t))) {
        dt_log(DT_LOG_ERROR, "bench gemm: expected --threads N (1 to 1024), got %s%s%s", argv[3], argc >= 5 ? " " : "",
               argc >= 5 ? argv[4] : "");
        return 2;
    }
    int threads = (int)t;
    double one = dt_peak_measure(1), all = threads > 1 ? dt_peak_measure(threads) : one;
    char blas[128];
    dt_kernels_blas_name(blas, sizeof blas);
    if (threads > 1) printf("sgemm 2048^3 on 1 thread (%s): %.1f GFLOP/s\n", blas, one);
    printf("sgemm 2048^3 on %d thread(s) (%s): %.1f GFLOP/s\n", threads, blas, all);
    if (dt_peak_save(one)) dt_log(DT_LOG_WARN, "%s", dt_last_error());
    else printf("peak per thread for MFU: %.1f GFLOP/s (cached)\n", one);
    return 0;
}

/* One of bench comm's flags that take a word (f, v): 0 taken, else the exit code (said). */
static int comm_flag(const char *f, const char *v, dt_bench_comm_opts *o) {
    dt_status st = DT_OK;
    if (!strcmp(f, "--op")) {
        st = dt_coll_parse(v, &o->coll);
        if (!st && (o->coll == DT_COLL_SENDRECV || o->coll == DT_COLL_ALLTOALLV))
            st = dt_error(DT_ERR_ARG, "--op %s: bench comm times collectives of equal blocks (alltoallv: bench/alltoallv_mpi.sh)", v);
    }
    else if (!strcmp(f, "--algo")) st = dt_algo_parse(v, &o->algo);
    else if (!strcmp(f, "--dtype")) st = dt_dtype_parse(v, &o->dtype);
    else if (!strcmp(f, "--redop")) st = dt_op_parse(v, &o->op);
    else if (!strcmp(f, "--nproc") || !strcmp(f, "--reps") || !strcmp(f, "--warmup") || !strcmp(f, "--rounds")) {
        char *end;
        long n = strtol(v, &end, 10);
        if (*end || n < (strcmp(f, "--warmup") ? 1 : 0) || n > 4096) {
            dt_log(DT_LOG_ERROR, "bench comm: %s %s is not a valid count", f, v);
            return 2;
        }
        if (!strcmp(f, "--nproc")) o->nproc = (int)n;
        else if (!strcmp(f, "--reps")) o->reps = (int)n;
        else if (!strcmp(f, "--warmup")) o->warmup = (int)n;
        else o->rounds = (int)n;
    } else if (!strcmp(f, "--seconds")) {
        char *end;
        o->rep_seconds = strtod(v, &end);
        if (*end || !(o->rep_seconds > 0 && o->rep_seconds < 60)) { dt_log(DT_LOG_ERROR, "bench comm: bad --seconds %s", v); return 2; }
    } else if (!strcmp(f, "--buffers")) {
        if (!strcmp(v, "arena")) o->arena = 1;
        else if (!strcmp(v, "private")) o->arena = 0;
        else { dt_log(DT_LOG_ERROR, "bench comm: --buffers expects arena or private, got '%s'", v); return 2; }
    } else if (!strcmp(f, "--baseline")) {
        if (strcmp(v, "mpi") && strcmp(v, "mpich")) { dt_log(DT_LOG_ERROR, "bench comm: --baseline expects mpi or mpich, got '%s'", v); return 2; }
        o->baseline = v;
    } else if (!strcmp(f, "--sizes")) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", v);
        o->nsizes = 0;
        for (char *tok = strtok(buf, ","); tok && !st; tok = strtok(NULL, ",")) {
            if (o->nsizes == 64) { dt_log(DT_LOG_ERROR, "bench comm: at most 64 sizes"); return 2; }
            st = dt_parse_size(tok, &o->sizes[o->nsizes++]);
            if (!st && !o->sizes[o->nsizes - 1]) { dt_log(DT_LOG_ERROR, "bench comm: --sizes %s: a size of 0 bytes measures nothing", v); return 2; }
        }
        if (!o->nsizes) { dt_log(DT_LOG_ERROR, "bench comm: --sizes '%s' lists no size", v); return 2; }
    } else return dt_cli_flag_error("bench comm", comm_flags, f, v);
    if (st) { dt_log(DT_LOG_ERROR, "bench comm: %s", dt_last_error()); return 2; }
    return 0;
}

int dt_cli_bench(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[2], "rl")) return bench_rl(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "serve")) return bench_serve(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "train")) return bench_train(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "infer")) return bench_infer(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "gemm")) return bench_gemm(argc, argv);
    if (argc < 3 || strcmp(argv[2], "comm") != 0) {
        if (argc >= 3 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help"))) { usage(stdout); return 0; }
        dt_log(DT_LOG_ERROR, "bench: expected comm, train, infer, serve, rl or gemm");
        return 2;
    }
    dt_bench_comm_opts o;
    dt_bench_comm_defaults(&o);
    for (int i = 3; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(f, "--json")) { o.json = 1; continue; }
        else if (!strcmp(f, "--calibrate")) { o.calibrate = 1; continue; }
        if (!v) return dt_cli_flag_error("bench comm", comm_flags, f, NULL);
        i++;
        int rc = comm_flag(f, v, &o);
        if (rc) return rc;
    }
    return dt_bench_comm(&o, argc, argv);
}
