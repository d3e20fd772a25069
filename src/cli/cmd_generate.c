/* dtrain generate: flag parsing and printing only. */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/gpu_lm.h"
#include "dtrain/infer.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void emit_byte(int token, void *ctx) {
    (void)ctx;
    if (token < 256) putchar(token);
    else printf("<%d>", token);
    fflush(stdout);
}

static void emit_none(int token, void *ctx) { (void)token; (void)ctx; }

static void emit_number(int token, void *ctx) {
    (void)ctx;
    printf(" %d", token);
    fflush(stdout);
}

/* --ids: the prompt as token ids, separated by commas or spaces. */
static dt_status parse_ids(const char *text, int V, int32_t **ids, int *n) {
    size_t len = strlen(text);
    *n = 0;
    if (!(*ids = malloc(sizeof(int32_t) * (len / 2 + 1)))) return dt_error(DT_ERR_NOMEM, "generate: out of memory");
    for (const char *s = text; *s;) {
        if (*s == ',' || *s == ' ') { s++; continue; }
        char *end;
        errno = 0;
        long t = strtol(s, &end, 10);
        if (end == s || errno || t < 0 || t >= V)
            return dt_error(DT_ERR_ARG, "generate --ids: '%.20s' at character %d of the prompt is not a token id from 0 to %d", s,
                            (int)(s - text), V - 1);
        (*ids)[(*n)++] = (int32_t)t;
        s = end;
    }
    return *n ? DT_OK : dt_error(DT_ERR_ARG, "generate --ids: the prompt holds no token id");
}

static void emit_id(int token, void *ctx) {
    dt_bpe *b = ctx;
    size_t len;
    const char *t = b ? dt_bpe_token_bytes(b, (uint32_t)token, &len) : NULL;
    if (t) fwrite(t, 1, len, stdout);
    else printf("<%d>", token);
    fflush(stdout);
}

static const dt_cli_flag flags[] = {
    { "--model", "a model file, an HF folder or a checkpoint directory" }, { "--lora", "PEFT's adapter folder (or a LoRA run's --save DIR)" }, { "--prompt", "a text" }, { "--tokens", "a whole number from 1 to 1e6" },
    { "--temperature", "a number from 0 to 100" }, { "--top-k", "a whole number from 0 (all) to 1e7" },
    { "--seed", "a whole number from 0 to 1e18" }, { "--bpe", "ENCODER.json VOCAB.bpe (two files)" }, { "--help", "" },
    { "--nproc", "a whole number of local ranks from 1 to 256" }, { "--pp", "a whole number of stages from 1 to 65536" },
    { "--top-p", "a number above 0 and at most 1" }, { "--min-p", "a number from 0 to 1" }, { "--repetition-penalty", "a number from 0.001 to 1000" }, { "--no-cache", "" }, { "--quantize", "int8 (or none)" },
    { "--tp", "a whole number of tensor-parallel ranks from 1 to 256" }, { "--ids", "" }, { "--tokenizer", "a tokenizer.json" },
    { "--device", "cpu, cuda or cuda:N" }, { "--ignore-eos", "" }, { NULL, NULL },
};

/* dtrain generate --model FILE --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S] [--nproc N --pp N] */
static void usage(void) {
    printf("usage: dtrain generate --model FILE|DIR --prompt TEXT [--tokens 200] [--temperature 0.8] [--top-k 40] [--seed 42]\n"
           "                       [--top-p 1] [--min-p 0] [--repetition-penalty 1] [--quantize int8] [--no-cache] [--tokenizer tokenizer.json | --bpe ENCODER.json VOCAB.bpe | --ids]\n"
           "                       [--lora DIR] [--nproc N --pp N|--tp N] [--device cuda[:N]] [--ignore-eos]\n"
           "--lora DIR: PEFT's LoRA adapter folder (a LoRA run's --save DIR holds one) merged into the model.\n"
           "Byte-level models (vocabulary 256) read and print bytes; with --tokenizer, a Hugging Face tokenizer.json\n"
           "(byte-level BPE; an HF folder's own is read without it); with --bpe, GPT-2 BPE; with --ids, the prompt\n"
           "is token ids (\"1,2,3\") and the tokens print as ids.\n"
           "The text ends early at the tokenizer's end of text (its tokenizer_config.json's eos_token; GPT-2's\n"
           "<|endoftext|>) or another eos_token_id of the model folder's generation_config.json, as Hugging Face's\n"
           "generate stops; --ignore-eos writes --tokens tokens whatever they are.\n"
           "The prompt is read once into a key/value cache and each token costs one row through the model;\n"
           "--no-cache runs each token's whole window through forward instead (the reference the cache is checked\n"
           "against). --quantize int8: the Linears and the head in int8, a scale per output channel.\n"
           "--pp N: the model split into N pipeline stages, one per rank (--nproc N local ranks, or mpirun's),\n"
           "each context through the stages in turn; the last prints. --tp N: into N tensor-parallel parts\n"
           "(Megatron's split), the cache's decoder on each; rank 0 prints.\n"
           "--device cuda[:N]: the cache's decoder on NVIDIA GPU N (0 by default), the weights and the cache there\n"
           "in f32; one process, the whole model (not with --pp, --tp, --no-cache or --quantize int8).\n"
           "Threads: OMP_NUM_THREADS where the environment sets it, else the cores this process may use (with --nproc,\n"
           "its share of them).\n");
}

/* generate's settings. */
typedef struct {
    const char *model, *lora, *prompt, *enc, *merges;
    int count, topk, nproc, npp, ntp, cache, ids, cuda, cuda_named, ignore_eos;
    float temp, topp, minp, rep;
    uint64_t seed;
    dt_quant quant;
} gen_cli;

/* The flags into x: -1 good, else the exit code (0 after --help). */
static int gen_parse(int argc, char **argv, gen_cli *x) {
    const dt_cli_num_flag nums[] = {
        { "--tokens", 1, 1e6, 1, &x->count, 'i' }, { "--temperature", 0, 100, 0, &x->temp, 'f' }, { "--top-k", 0, 1e7, 1, &x->topk, 'i' },
        { "--seed", 0, 1e18, 1, &x->seed, 'u' }, { "--top-p", 1e-9, 1, 0, &x->topp, 'f' }, { "--min-p", 0, 1, 0, &x->minp, 'f' }, { "--repetition-penalty", 1e-3, 1e3, 0, &x->rep, 'f' }, { "--tp", 1, 256, 1, &x->ntp, 'i' },
        { "--nproc", 1, 256, 1, &x->nproc, 'i' }, { "--pp", 1, 65536, 1, &x->npp, 'i' },
    };
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(); return 0; }
        if (!strcmp(f, "--no-cache")) { x->cache = 0; continue; }
        if (!strcmp(f, "--ids")) { x->ids = 1; continue; }
        if (!strcmp(f, "--ignore-eos")) { x->ignore_eos = 1; continue; }
        if (!strcmp(f, "--bpe")) {
            if (i + 2 >= argc) return dt_cli_flag_error("generate", flags, f, NULL);
            x->enc = argv[i + 1], x->merges = argv[i + 2], i += 2;
            continue;
        }
        i++;
        int r = !v ? 0 : dt_cli_number_flag(nums, sizeof nums / sizeof nums[0], f, v);
        if (r < 0) {
            r = 1;
            if (!strcmp(f, "--model")) x->model = v;
            else if (!strcmp(f, "--lora")) x->lora = v;
            else if (!strcmp(f, "--prompt")) x->prompt = v;
            else if (!strcmp(f, "--tokenizer")) x->enc = v, x->merges = NULL;
            else if (!strcmp(f, "--quantize")) r = !dt_quant_parse(v, &x->quant);
            else if (!strcmp(f, "--device")) r = dt_cli_device(v, &x->cuda, &x->cuda_named);
            else r = 0;
        }
        if (r != 1) return dt_cli_flag_error("generate", flags, f, v);
    }
    if (!x->model || !x->prompt) { dt_log(DT_LOG_ERROR, "generate: --model FILE and --prompt TEXT are required"); return 2; }
    if (x->quant != DT_QUANT_NONE && (!x->cache || x->npp > 1)) {
        dt_log(DT_LOG_ERROR, "generate: --quantize works through the cache (not with --no-cache or --pp)");
        return 2;
    }
    if (x->cuda && (x->npp > 1 || x->ntp > 1 || x->nproc > 1 || !x->cache || x->quant != DT_QUANT_NONE)) {
        dt_log(DT_LOG_ERROR, "generate: --device cuda runs the cache's decoder on one GPU in f32 (not with --pp, --tp, --nproc, "
               "--no-cache or --quantize int8)");
        return 2;
    }
    if (x->ntp > 1 && (x->npp > 1 || !x->cache)) {
        dt_log(DT_LOG_ERROR, "generate: --tp runs the cache's decoder on each rank's part (not with --pp or --no-cache)");
        return 2;
    }
    return -1;
}

/* The tokens that end the text: tokenizer b's end of text (GPT-2's vocabulary's <|endoftext|>; a tokenizer.json's:
 * its tokenizer_config.json's eos_token, where it has one) and the model folder's generation_config.json's. */
static dt_status text_ends(const gen_cli *x, dt_bpe *b, int V, dt_token_ends *e) {
    int eos = b && dt_bpe_vocab_size(b) == 50257 ? 50256 : -1; /* (as the server reads it) */
    char found[4200];
    snprintf(found, sizeof found, "%s/tokenizer.json", x->model);
    dt_status st = b && !x->merges ? dt_tokenizer_config_read(x->enc ? x->enc : found, b, NULL, &eos, NULL) : DT_OK;
    return st ? st : dt_token_ends_read(x->model, V, eos, e);
}

/* The model loaded on this rank, the prompt encoded and the tokens generated (printed by the printer rank). */
static dt_status gen_run(const gen_cli *x, dt_comm *w, bool tp, bool printer) {
    dt_gpt2 *m;
    dt_tp_ops ops;
    dt_status st = dt_generate_load(x->model, x->lora, w, tp, &ops, &m);
    if (st) return st;
    int V = dt_gpt2_get_config(m)->vocab_size, n = 0;
    dt_bpe *b = NULL;
    int32_t *p = NULL;
    if (x->ids && x->enc) st = dt_error(DT_ERR_ARG, "generate: --ids and --bpe both given (the prompt is one or the other)");
    else if (x->ids) st = parse_ids(x->prompt, V, &p, &n);
    else st = dt_bpe_for_model(x->enc, x->merges, V, 256, x->model, "generate", printer, &b);
    if (!st && !x->ids) st = dt_bpe_prompt(b, x->prompt, strlen(x->prompt), true, &p, &n);
    dt_token_ends ends = { .n = 0 };
    if (!st && !x->ignore_eos) st = text_ends(x, b, V, &ends);
    if (!st && x->cuda) st = dt_gpu_api_probe(x->cuda - 1); /* before the prompt is printed */
    if (!st) {
        if (printer) printf("%s", x->prompt);
        dt_generate_options o = { x->count, { .temperature = x->temp, .top_k = x->topk, .top_p = x->topp, .min_p = x->minp, .repetition_penalty = x->rep }, x->seed, x->cache, x->quant, x->cuda, &ends };
        dt_emit_fn emit = !printer ? emit_none : x->ids ? emit_number : b || V != 256 ? emit_id : emit_byte;
        st = dt_generate(&m, tp ? NULL : w, p, n, &o, emit, b); /* m is NULL after, with the cache */
        if (printer) printf("\n");
    }
    free(p);
    dt_bpe_destroy(b);
    dt_gpt2_destroy(m);
    return st;
}

int dt_cli_generate(int argc, char **argv) {
    gen_cli x = { .count = 200, .temp = 0.8f, .topk = 40, .seed = 42, .nproc = 1, .topp = 1, .cache = 1, .quant = DT_QUANT_NONE };
    int rc = gen_parse(argc, argv, &x);
    if (rc >= 0) return rc;
    bool tp = x.ntp > 1;
    int split = tp ? x.ntp : x.npp, launched;
    dt_comm *w;
    rc = dt_cli_join("generate", "one pipeline stage or tensor-parallel part per rank (--pp N or --tp N)", x.nproc, split, argv, &w,
                     &launched);
    if (rc || launched >= 0) return rc ? rc : launched;
    /* a pipeline's last stage has the logits; tensor-parallel ranks all do, and rank 0 prints */
    bool printer = !w || dt_comm_rank(w) == (tp ? 0 : dt_comm_size(w) - 1);
    dt_kernels_set_threads(dt_comm_default_threads(w)); /* as training's ranks: teams of every core spin on each other's */
    dt_status st = gen_run(&x, w, tp, printer);
    dt_comm_destroy(w);
    if (st) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    return 0;
}
