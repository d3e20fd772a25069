/* dtrain generate: flag parsing and printing only. */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
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

static void emit_id(int token, void *ctx) {
    dt_bpe *b = ctx;
    size_t len;
    const char *t = b ? dt_bpe_token_bytes(b, (uint32_t)token, &len) : NULL;
    if (t) fwrite(t, 1, len, stdout);
    else printf("<%d>", token);
    fflush(stdout);
}

static const dt_cli_flag flags[] = {
    { "--model", "a model file, an HF folder or a checkpoint directory" }, { "--prompt", "a text" }, { "--tokens", "a whole number from 1 to 1e6" },
    { "--temperature", "a number from 0 to 100" }, { "--top-k", "a whole number from 0 (all) to 1e7" },
    { "--seed", "a whole number from 0 to 1e18" }, { "--bpe", "ENCODER.json VOCAB.bpe (two files)" }, { "--help", "" },
    { NULL, NULL },
};

/* dtrain generate --model FILE --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S] */
int dt_cli_generate(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *enc = NULL, *merges = NULL;
    double count = 200, temp = 0.8, topk = 40, seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("usage: dtrain generate --model FILE|DIR --prompt TEXT [--tokens 200] [--temperature 0.8] [--top-k 40] [--seed 42]\n"
                   "                       [--bpe ENCODER.json VOCAB.bpe]\n"
                   "Byte-level models (vocabulary 256) read and print bytes; with --bpe, GPT-2 BPE.\n");
            return 0;
        }
        if (!strcmp(f, "--bpe")) {
            if (i + 2 >= argc) return dt_cli_flag_error("generate", flags, f, NULL);
            enc = argv[i + 1]; merges = argv[i + 2]; i += 2; continue;
        }
        i++;
        if (!strcmp(f, "--model") && v) model = v;
        else if (!strcmp(f, "--prompt") && v) prompt = v;
        else if (!strcmp(f, "--tokens") && dt_cli_number(v, 1, 1e6, &count)) {}
        else if (!strcmp(f, "--temperature") && dt_cli_number(v, 0, 100, &temp)) {}
        else if (!strcmp(f, "--top-k") && dt_cli_number(v, 0, 1e7, &topk)) {}
        else if (!strcmp(f, "--seed") && dt_cli_number(v, 0, 1e18, &seed)) {}
        else return dt_cli_flag_error("generate", flags, f, v);
    }
    if (!model || !prompt) { dt_log(DT_LOG_ERROR, "generate: --model FILE and --prompt TEXT are required"); return 2; }
    dt_gpt2 *m;
    if (dt_checkpoint_load_weights(model, 0, &m, NULL)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
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
    if (!st && !p) st = dt_error(DT_ERR_NOMEM, "generate: out of memory for the prompt");
    if (!st && !b && V != 256)
        dt_log(DT_LOG_WARN, "generate: %s has a vocabulary of %d, not 256: tokens print as <id> (for GPT-2 tokens give "
               "--bpe ENCODER.json VOCAB.bpe; a byte-level model is trained with --vocab 256)", model, V);
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
