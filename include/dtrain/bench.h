/* dtrain bench layer: benchmarks that print the machine, the settings, the
 * baseline and the ratio, in the manner of OSU and nccl-tests. */
#ifndef DTRAIN_BENCH_H
#define DTRAIN_BENCH_H

#include "dtrain/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    dt_coll coll;
    dt_algo algo;
    dt_dtype dtype;
    dt_op op;
    int nproc;
    size_t sizes[64];
    int nsizes;
    int arena;        /* 1: buffers from dt_comm_alloc; 0: private malloc */
    int json;         /* one JSON object per line instead of a table */
    int reps;         /* timed repetitions per size (median reported) */
    int warmup;       /* warm-up repetitions */
    double rep_seconds; /* target duration of one repetition */
    const char *baseline; /* NULL, "mpi" (the MPI dtrain was built with) or "mpich" */
    int rounds;       /* dtrain/baseline alternations */
    int calibrate;    /* measure the cost-model parameters and save them */
} dt_bench_comm_opts;

void dt_bench_comm_defaults(dt_bench_comm_opts *o);
/* Runs the benchmark; launches o->nproc local ranks itself unless already
 * inside a job. argv is the command line, re-executed for the ranks.
 * Returns a process exit code. */
int dt_bench_comm(const dt_bench_comm_opts *o, int argc, char **argv);

typedef struct {
    const char *model;     /* GPT-2 preset, or an image model (resnet:small, resnet18, resnet34, resnet50) */
    int batch, seq, steps, warmup, threads, rounds;
    const char *baseline;  /* NULL, "torch" (PyTorch DDP); with zero: "fsdp", "deepspeed" or "all" */
    int zero;              /* data-parallel mode: 1-3, compare that ZeRO stage with DDP and the baselines */
    int json;
    int nprocs[16];        /* data-parallel mode: rank counts to compare (0 entries: one process, in-line) */
    int nnprocs;
    const char *train_flags; /* data-parallel mode: more flags for dtrain train (NULL: none) */
    const char *report;      /* data-parallel mode: a run directory for dtrain report, with scaling.json */
    int tp;                  /* tensor-parallel mode: N > 1 ranks against one process with N threads, N data-parallel ranks
                              * and PyTorch's tensor parallelism (baseline "torch") */
    int sp;                  /* tensor-parallel mode: with sequence parallelism (dtrain's --sp, PyTorch's SequenceParallel) */
    int pp;                  /* pipeline mode: N > 1 stages (GPipe and 1F1B) against one process with N threads, N
                              * data-parallel ranks and PyTorch's pipelining (baseline "torch") */
    int micro;               /* pipeline mode: micro-batches of --batch per step (the global batch: batch x micro) */
    int cp;                  /* context-parallel mode: N > 1 ranks by ring and by all-to-all against one process with N threads */
    dt_dtype precision;      /* one process: DT_BF16 / DT_F16 times that mixed precision against fp32, alternating
                              * (and PyTorch under autocast of that type); DT_F32: fp32 alone */
} dt_bench_train_opts;

void dt_bench_train_defaults(dt_bench_train_opts *o);
/* dtrain bench train --cp N (cp_bench.c). */
int dt_bench_train_cp(const dt_bench_train_opts *o);
/* dtrain bench train --pp N (pp_bench.c). */
int dt_bench_train_pp(const dt_bench_train_opts *o);
/* Synthetic training throughput; returns a process exit code. With nprocs,
 * runs `dtrain train --nproc N` (and PyTorch DDP over gloo for the torch
 * baseline) for each N and reports per-worker and total tok/s, scaling and
 * exposed communication. */
int dt_bench_train(const dt_bench_train_opts *o);
int dt_bench_train_ddp(const dt_bench_train_opts *o);
int dt_bench_train_tp(const dt_bench_train_opts *o);
int dt_bench_train_zero(const dt_bench_train_opts *o);
/* --model resnet...: Horovod's synthetic benchmark (img/s per worker, mean +- 1.96 sd, and in total) for each
 * --nproc N, against torchvision's model under PyTorch 2.x and Debian's PyTorch with --baseline torch. */
int dt_bench_train_images(const dt_bench_train_opts *o);

typedef struct {
    const char *model;        /* a GPT-2 preset (random weights, seed 1337) or a weights file */
    const char *threads_list; /* "1,2" */
    int prompt, steps, batch, reps; /* decode follows a prompt of prompt tokens */
    const char *baseline;     /* NULL, "hf", "llama" or "all" */
    const char *eval_data;    /* a token file: the perplexity of f32 and int8 weights over it (NULL: none) */
    int tp;                   /* > 1: also the decoder over tp tensor-parallel ranks of one thread (dtrain launch -n tp) */
    int rounds;               /* with a baseline: dtrain's rows and the baselines' alternate this many times (0, 1: once) */
} dt_bench_infer_opts;
/* The decoder's prefill and decode tokens/s (batch 1 and batch) in f32 and
 * int8 per thread count, and with a baseline HF transformers' (PyTorch)
 * and llama.cpp's (f32, Q8_0) on the same weights, the ratios printed. */
int dt_bench_infer(const dt_bench_infer_opts *o);

typedef struct {
    const char *model;  /* served by the bench itself (dtrain serve MODEL --port 0) unless url is given */
    const char *url;    /* an already running server's /v1/completions */
    const char *quant;  /* "none" or "int8" for the server the bench starts */
    int clients, max_tokens, slots, threads;
    double seconds;
    int shared_prefix;  /* > 0: every prompt starts with the same text of about this many bytes (a system prompt); a
                         * server the bench starts runs twice, reusing prefixes and reading each prompt whole */
} dt_bench_serve_opts;
/* Offered load: clients threads sending streamed completions back to back
 * for seconds; requests done and failed, tokens/s, time to first token and
 * inter-token latency percentiles, the prompt tokens a cache slot gave, the
 * server's peak memory. Exit code 1 if any request failed. */
int dt_bench_serve(const dt_bench_serve_opts *o);

typedef struct {
    const char *env;
    int envs[16], nenvs;       /* environments a worker */
    int workers[8], nworkers;  /* worker processes */
    int64_t steps;             /* a row's steps, all workers together */
    int baseline;              /* Gymnasium's vector environments and EnvPool too (bench/rl_rollout.py) */
    int64_t slow_steps;        /* the steps of a baseline slower than a million a minute (AsyncVectorEnv) */
    int async_threads;         /* also the asynchronous pool (one process, this many threads, batches of half its
                                * environments; EnvPool's the same way among the baselines); 0: not */
    const char *python;        /* a bridged environment's interpreter (NULL: python3) */
} dt_bench_rl_opts;
/* Environment steps per second under random actions: dtrain's pools, then the baselines. */
int dt_bench_rl(const dt_bench_rl_opts *o);

#ifdef __cplusplus
}
#endif
#endif
