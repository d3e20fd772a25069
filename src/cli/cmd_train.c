/* dtrain train [FLAGS]: flag parsing only. */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/train.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain train --data FILE [FLAGS]\n"
            "  --model M          preset d6 (default), 124M, 350M, 774M, 1558M, or a model file\n"
            "                     (llm.c .bin, f32 or bf16; or HF GPT-2 .safetensors, f32/bf16/f16);\n"
            "                     mlp or mlp:H1,H2,..: image classification (hidden sizes; 256,128 by default) on\n"
            "                     --data DIR with MNIST-style IDX files (default /usr/share/datasets/fashion-mnist),\n"
            "                     --epochs N (5); test accuracy and img/s per worker and in total each epoch\n"
            "  --layers/--heads/--channels/--vocab/--max-seq N   shape overrides (any shape)\n"
            "  --data FILE        training tokens (llm.c format)\n"
            "  --val-data FILE    validation tokens; --eval-every N steps, --eval-batches N (8)\n"
            "  --batch B (4)  --seq T (64)  --steps N (10)  --grad-accum K (1)\n"
            "  --optimizer sgd|adamw|lamb|lars (adamw)  --lr X (3e-4)  --betas B1,B2 (0.9,0.999)\n"
            "  --eps X (1e-8)  --weight-decay X (0)  --momentum X (0)  --nesterov  --trust-coef X (0.001)\n"
            "  --grad-clip X      clip the global gradient norm (0 = off, the default)\n"
            "  --schedule constant|cosine (constant)  --warmup N (0)  --lr-min X (0)\n"
            "  --shuffle SEED     shuffle batch order (default: file order, as llm.c)\n"
            "  --save FILE        model file at the end, written atomically: FILE.safetensors in HF\n"
            "                     layout, anything else in llm.c's format; --save-every N: also every N steps\n"
            "  --metrics FILE     one JSON line per step\n"
            "  --threads N        threads per rank for BLAS and OpenMP (0 = all cores, the default)\n"
            "  --nproc N          data parallelism over N local ranks (1); under mpirun/srun, the job's ranks\n"
            "  --step-at-end      DDP: run the optimizer after backward; by default SGD and AdamW without\n"
            "                     --grad-clip update each bucket inside backward once its allreduce is done\n"
            "  --bucket-mb X      DDP gradient bucket cap in MiB (25; the first bucket is 1 MiB)\n"
            "  --seed N (1337)    initialisation\n"
            "  --recompute        activation checkpointing: recompute each block in backward (less memory)\n"
            "  --attention MODE   auto (default: blockwise from T >= 256), full (keep T x T rows), blockwise\n"
            "  --config FILE      DeepSpeed-style JSON (train_micro_batch_size_per_gpu, gradient_accumulation_steps,\n"
            "                     optimizer {type, params}, scheduler {type, params}, gradient_clipping, steps);\n"
            "                     flags override it\n");
}

int dt_cli_train(int argc, char **argv) {
    dt_train_config c;
    dt_train_defaults(&c);
    /* The config file first, so that flags override it. */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--config") && dt_train_config_load(argv[i + 1], &c)) {
            dt_log(DT_LOG_ERROR, "%s", dt_last_error());
            return 2;
        }
    dt_optim_kind kind = c.opt.kind;
    double betas[2] = { c.opt.beta1, c.opt.beta2 }, eps = c.opt.eps, wd = c.opt.weight_decay, mom = c.opt.momentum,
           trust = c.opt.trust_coef;
    int nesterov = c.opt.nesterov;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); return 0; }
        if (!strcmp(f, "--nesterov")) { nesterov = 1; continue; }
        if (!strcmp(f, "--quiet")) { c.quiet = 1; continue; }
        if (!strcmp(f, "--recompute")) { c.recompute = 1; continue; }
        if (!strcmp(f, "--step-at-end")) { c.step_at_end = 1; continue; }
        i++;
        if (!strcmp(f, "--config") && v) continue; /* read above */
        if (!strcmp(f, "--model") && v) c.model = v;
        else if (!strcmp(f, "--data") && v) c.data = v;
        else if (!strcmp(f, "--val-data") && v) c.val_data = v;
        else if (!strcmp(f, "--save") && v) c.save = v;
        else if (!strcmp(f, "--metrics") && v) c.metrics = v;
        else if (!strcmp(f, "--optimizer") && v) { if (dt_optim_parse_kind(v, &kind)) return dt_cli_bad(f, v); }
        else if (!strcmp(f, "--attention") && v) {
            if (!strcmp(v, "auto")) c.attention = 0;
            else if (!strcmp(v, "full")) c.attention = 1;
            else if (!strcmp(v, "blockwise")) c.attention = 2;
            else return dt_cli_bad(f, v);
        } else if (!strcmp(f, "--schedule") && v) {
            if (!strcmp(v, "constant")) c.sched.kind = DT_SCHED_CONSTANT;
            else if (!strcmp(v, "cosine")) c.sched.kind = DT_SCHED_COSINE;
            else return dt_cli_bad(f, v);
        } else if (!strcmp(f, "--betas") && v) {
            if (sscanf(v, "%lf,%lf", &betas[0], &betas[1]) != 2 || !(betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1))
                return dt_cli_bad(f, v);
        } else if (!dt_cli_number(v, 0, 1e9, &x)) return dt_cli_bad(f, v);
        else if (!strcmp(f, "--batch") && x >= 1) c.batch = (int)x;
        else if (!strcmp(f, "--seq") && x >= 1) c.seq = (int)x;
        else if (!strcmp(f, "--steps") && x >= 1) c.steps = (int)x;
        else if (!strcmp(f, "--epochs") && x >= 1) c.epochs = (int)x;
        else if (!strcmp(f, "--save-every")) c.save_every = (int)x;
        else if (!strcmp(f, "--grad-accum") && x >= 1) c.grad_accum = (int)x;
        else if (!strcmp(f, "--eval-every")) c.eval_every = (int)x;
        else if (!strcmp(f, "--eval-batches") && x >= 1) c.eval_batches = (int)x;
        else if (!strcmp(f, "--threads")) c.threads = (int)x;
        else if (!strcmp(f, "--nproc") && x >= 1 && x <= 256) c.nproc = (int)x;
        else if (!strcmp(f, "--bucket-mb") && x > 0) c.bucket_mb = x;
        else if (!strcmp(f, "--seed")) c.seed = (uint64_t)x;
        else if (!strcmp(f, "--shuffle") && x >= 1) c.shuffle_seed = (uint64_t)x;
        else if (!strcmp(f, "--lr") && x > 0 && x < 10) c.sched.lr = (float)x;
        else if (!strcmp(f, "--lr-min") && x < 10) c.sched.lr_min = (float)x;
        else if (!strcmp(f, "--warmup")) c.sched.warmup = (int)x;
        else if (!strcmp(f, "--grad-clip")) c.grad_clip = (float)x;
        else if (!strcmp(f, "--eps") && x > 0 && x < 1) eps = x;
        else if (!strcmp(f, "--weight-decay") && x < 10) wd = x;
        else if (!strcmp(f, "--momentum") && x < 1) mom = x;
        else if (!strcmp(f, "--trust-coef") && x > 0) trust = x;
        else if (!strcmp(f, "--layers") && x >= 1) c.shape.num_layers = (int)x;
        else if (!strcmp(f, "--heads") && x >= 1) c.shape.num_heads = (int)x;
        else if (!strcmp(f, "--channels") && x >= 1) c.shape.channels = (int)x;
        else if (!strcmp(f, "--vocab") && x >= 1) c.shape.vocab_size = (int)x;
        else if (!strcmp(f, "--max-seq") && x >= 1) c.shape.max_seq_len = (int)x;
        else return dt_cli_bad(f, v);
    }
    dt_optim_defaults(kind, &c.opt);
    c.opt.beta1 = (float)betas[0];
    c.opt.beta2 = (float)betas[1];
    c.opt.eps = (float)eps;
    c.opt.weight_decay = (float)wd;
    c.opt.momentum = (float)mom;
    c.opt.nesterov = nesterov;
    c.opt.trust_coef = (float)trust;
    /* the whole command line ("dtrain train ..."), re-run once per rank by --nproc */
    c.argc = argc + 1;
    c.argv = argv - 1;
    return dt_train_run(&c);
}
