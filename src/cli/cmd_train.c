/* dtrain train [FLAGS] and dtrain tokenize: flag parsing only. */
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
            "                     (llm.c .bin, f32 or bf16; or HF GPT-2 .safetensors, f32/bf16/f16)\n"
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
            "                     layout, anything else in llm.c's format\n"
            "  --metrics FILE     one JSON line per step\n"
            "  --threads N        threads per rank for BLAS and OpenMP (0 = all cores, the default)\n"
            "  --nproc N          data parallelism over N local ranks (1); under mpirun/srun, the job's ranks\n"
            "  --bucket-mb X      DDP gradient bucket cap in MiB (25; the first bucket is 1 MiB)\n"
            "  --seed N (1337)    initialisation\n"
            "  --recompute        activation checkpointing: recompute each block in backward (less memory)\n"
            "  --attention MODE   auto (default: blockwise from T >= 256), full (keep T x T rows), blockwise\n"
            "  --config FILE      DeepSpeed-style JSON (train_micro_batch_size_per_gpu, gradient_accumulation_steps,\n"
            "                     optimizer {type, params}, scheduler {type, params}, gradient_clipping, steps);\n"
            "                     flags override it\n");
}

static int bad(const char *flag, const char *v) {
    dt_log(DT_LOG_ERROR, "train: %s %s is not valid (see dtrain train --help)", flag, v ? v : "(missing)");
    return 2;
}

static int num(const char *s, double lo, double hi, double *out) {
    if (!s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
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
        i++;
        if (!strcmp(f, "--config") && v) continue; /* read above */
        if (!strcmp(f, "--model") && v) c.model = v;
        else if (!strcmp(f, "--data") && v) c.data = v;
        else if (!strcmp(f, "--val-data") && v) c.val_data = v;
        else if (!strcmp(f, "--save") && v) c.save = v;
        else if (!strcmp(f, "--metrics") && v) c.metrics = v;
        else if (!strcmp(f, "--optimizer") && v) { if (dt_optim_parse_kind(v, &kind)) return bad(f, v); }
        else if (!strcmp(f, "--attention") && v) {
            if (!strcmp(v, "auto")) c.attention = 0;
            else if (!strcmp(v, "full")) c.attention = 1;
            else if (!strcmp(v, "blockwise")) c.attention = 2;
            else return bad(f, v);
        } else if (!strcmp(f, "--schedule") && v) {
            if (!strcmp(v, "constant")) c.schedule = DT_SCHED_CONSTANT;
            else if (!strcmp(v, "cosine")) c.schedule = DT_SCHED_COSINE;
            else return bad(f, v);
        } else if (!strcmp(f, "--betas") && v) {
            if (sscanf(v, "%lf,%lf", &betas[0], &betas[1]) != 2 || !(betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1))
                return bad(f, v);
        } else if (!num(v, 0, 1e9, &x)) return bad(f, v);
        else if (!strcmp(f, "--batch") && x >= 1) c.batch = (int)x;
        else if (!strcmp(f, "--seq") && x >= 1) c.seq = (int)x;
        else if (!strcmp(f, "--steps") && x >= 1) c.steps = (int)x;
        else if (!strcmp(f, "--grad-accum") && x >= 1) c.grad_accum = (int)x;
        else if (!strcmp(f, "--eval-every")) c.eval_every = (int)x;
        else if (!strcmp(f, "--eval-batches") && x >= 1) c.eval_batches = (int)x;
        else if (!strcmp(f, "--threads")) c.threads = (int)x;
        else if (!strcmp(f, "--nproc") && x >= 1 && x <= 256) c.nproc = (int)x;
        else if (!strcmp(f, "--bucket-mb") && x > 0) c.bucket_mb = x;
        else if (!strcmp(f, "--seed")) c.seed = (uint64_t)x;
        else if (!strcmp(f, "--shuffle") && x >= 1) c.shuffle_seed = (uint64_t)x;
        else if (!strcmp(f, "--lr") && x > 0 && x < 10) c.lr = (float)x;
        else if (!strcmp(f, "--lr-min") && x < 10) c.lr_min = (float)x;
        else if (!strcmp(f, "--warmup")) c.warmup = (int)x;
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
        else return bad(f, v);
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

/* dtrain tokenize (--bytes | --bpe ENCODER.json VOCAB.bpe) IN OUT [--val OUT2 --val-fraction F] */
int dt_cli_tokenize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *val = NULL, *enc = NULL, *merges = NULL;
    double frac = 0.1;
    int bytes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bytes")) bytes = 1;
        else if (!strcmp(argv[i], "--bpe") && i + 2 < argc) { enc = argv[++i]; merges = argv[++i]; }
        else if (!strcmp(argv[i], "--val") && i + 1 < argc) val = argv[++i];
        else if (!strcmp(argv[i], "--val-fraction") && i + 1 < argc) { if (!num(argv[++i], 0, 0.9, &frac)) return bad("--val-fraction", argv[i]); }
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dtrain tokenize (--bytes | --bpe ENCODER.json VOCAB.bpe) INPUT.txt OUTPUT.bin\n"
                   "                       [--val VAL.bin --val-fraction 0.1]\n"
                   "Byte-level tokens (vocabulary 256) or GPT-2 BPE (the encoder.json + vocab.bpe pair GPT-2's\n"
                   "tokenizer is distributed as); the last fraction of the text goes to --val.\n");
            return 0;
        } else if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else return bad("tokenize", argv[i]);
    }
    if (bytes == (enc != NULL) || !in || !out) {
        dt_log(DT_LOG_ERROR, "tokenize: expected --bytes or --bpe ENCODER.json VOCAB.bpe, then INPUT and OUTPUT");
        return 2;
    }
    FILE *f = fopen(in, "rb");
    if (!f) { dt_log(DT_LOG_ERROR, "tokenize: %s: %s", in, strerror(errno)); return 1; }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) { fclose(f); free(text); dt_log(DT_LOG_ERROR, "tokenize: cannot read %s", in); return 1; }
    fclose(f);
    uint32_t *tok = NULL;
    size_t n = 0, cap = 0;
    dt_status st = DT_OK;
    if (bytes) {
        tok = malloc(((size_t)len + 1) * 4);
        for (long i = 0; tok && i < len; i++) tok[n++] = (unsigned char)text[i];
        if (!tok) st = dt_error(DT_ERR_NOMEM, "tokenize: out of memory");
    } else {
        dt_bpe *b;
        st = dt_bpe_load(enc, merges, &b);
        if (!st) {
            st = dt_bpe_encode(b, text, (size_t)len, &tok, &n, &cap);
            if (!st) printf("GPT-2 BPE, vocabulary %d: ", dt_bpe_vocab_size(b));
            dt_bpe_destroy(b);
        }
    }
    free(text);
    size_t nval = val ? (size_t)(n * frac) : 0;
    if (!st) st = dt_tokens_write(out, tok, n - nval);
    if (!st && val) st = dt_tokens_write(val, tok + n - nval, nval);
    free(tok);
    if (st) { dt_log(DT_LOG_ERROR, "tokenize: %s", dt_last_error()); return 1; }
    printf("%zu tokens -> %s", n - nval, out);
    if (val) printf(", %zu -> %s", nval, val);
    printf("\n");
    return 0;
}

static void emit_byte(int token, void *ctx) {
    (void)ctx;
    if (token < 256) putchar(token);
    else printf("<%d>", token);
    fflush(stdout);
}

static void emit_id(int token, void *ctx) {
    dt_bpe *b = ctx;
    size_t len;
    const char *t = b ? dt_bpe_token_bytes(b, (uint32_t)token, &len) : NULL;
    if (t) fwrite(t, 1, len, stdout);
    else printf("<%d>", token);
    fflush(stdout);
}

/* dtrain generate --model FILE --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S] */
int dt_cli_generate(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *enc = NULL, *merges = NULL;
    double count = 200, temp = 0.8, topk = 40, seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("usage: dtrain generate --model FILE --prompt TEXT [--tokens 200] [--temperature 0.8] [--top-k 40] [--seed 42]\n"
                   "                       [--bpe ENCODER.json VOCAB.bpe]\n"
                   "Byte-level models (vocabulary 256) read and print bytes; with --bpe, GPT-2 BPE.\n");
            return 0;
        }
        if (!strcmp(f, "--bpe") && i + 2 < argc) { enc = argv[i + 1]; merges = argv[i + 2]; i += 2; continue; }
        i++;
        if (!strcmp(f, "--model") && v) model = v;
        else if (!strcmp(f, "--prompt") && v) prompt = v;
        else if (!strcmp(f, "--tokens") && num(v, 1, 1e6, &count)) {}
        else if (!strcmp(f, "--temperature") && num(v, 0, 100, &temp)) {}
        else if (!strcmp(f, "--top-k") && num(v, 0, 1e7, &topk)) {}
        else if (!strcmp(f, "--seed") && num(v, 0, 1e18, &seed)) {}
        else return bad(f, v);
    }
    if (!model || !prompt) { dt_log(DT_LOG_ERROR, "generate: --model FILE and --prompt TEXT are required"); return 2; }
    dt_gpt2 *m;
    if (dt_model_load(model, 0, &m)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    int V = dt_gpt2_get_config(m)->vocab_size;
    dt_bpe *b = NULL;
    int32_t *p = NULL;
    int n = 0;
    dt_status st = DT_OK;
    if (enc) {
        uint32_t *ids = NULL;
        size_t nid = 0, cap = 0;
        st = dt_bpe_load(enc, merges, &b);
        if (!st && dt_bpe_vocab_size(b) > V)
            st = dt_error(DT_ERR_ARG, "generate: the tokenizer has %d tokens, the model only %d", dt_bpe_vocab_size(b), V);
        if (!st) st = dt_bpe_encode(b, prompt, strlen(prompt), &ids, &nid, &cap);
        p = malloc(sizeof(int32_t) * (nid ? nid : 1));
        for (size_t i = 0; p && i < nid; i++) p[i] = (int32_t)ids[i];
        n = (int)nid;
        free(ids);
    } else if (V < 256) {
        st = dt_error(DT_ERR_ARG, "generate: %s has a vocabulary of %d; byte prompts need 256 (or give --bpe)", model, V);
    } else {
        n = (int)strlen(prompt);
        p = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        for (int i = 0; i < n; i++) p[i] = (unsigned char)prompt[i];
    }
    if (!st) {
        printf("%s", prompt);
        st = dt_generate(m, p, n, (int)count, (float)temp, (int)topk, (uint64_t)seed, b || V != 256 ? emit_id : emit_byte, b);
        printf("\n");
    }
    free(p);
    dt_bpe_destroy(b);
    dt_gpt2_destroy(m);
    if (st) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    return 0;
}

/* dtrain plot METRICS.jsonl -o loss.svg */
int dt_cli_plot(int argc, char **argv) {
    const char *in = NULL, *out = "loss.svg";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { printf("usage: dtrain plot METRICS.jsonl [-o loss.svg]\n"); return 0; }
        else in = argv[i];
    }
    if (!in) { dt_log(DT_LOG_ERROR, "plot: which metrics file? (dtrain plot METRICS.jsonl -o loss.svg)"); return 2; }
    if (dt_plot_losses(in, out)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    printf("wrote %s\n", out);
    return 0;
}
