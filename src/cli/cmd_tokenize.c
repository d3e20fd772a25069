/* dtrain tokenize: flag parsing only. */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *in, *out, *val, *enc, *merges;
    double frac;
    int bytes;
} tokenize_args;

static int tokenize_usage(void) {
    printf("usage: dtrain tokenize (--bytes | --bpe ENCODER.json VOCAB.bpe | --tokenizer tokenizer.json) INPUT.txt OUTPUT.bin\n"
           "                       [--val VAL.bin --val-fraction 0.1]\n"
           "Byte-level tokens (vocabulary 256), GPT-2 BPE (the encoder.json + vocab.bpe pair GPT-2's\n"
           "tokenizer is distributed as) or a Hugging Face tokenizer.json of byte-level BPE (GPT-2's, Llama 3's,\n"
           "Qwen 2's with its NFC: the tokenizers library's ids); the last fraction of the text goes to --val.\n");
    return 0;
}

/* The command line into a; -1: go on, else the exit code (help, or a bad flag said). */
static int tokenize_parse(int argc, char **argv, tokenize_args *a) {
    *a = (tokenize_args){ .frac = 0.1 };
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bytes")) a->bytes = 1;
        else if (!strcmp(argv[i], "--bpe") && i + 2 < argc) { a->enc = argv[++i]; a->merges = argv[++i]; }
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) { a->enc = argv[++i]; a->merges = NULL; }
        else if (!strcmp(argv[i], "--val") && i + 1 < argc) a->val = argv[++i];
        else if (!strcmp(argv[i], "--val-fraction") && i + 1 < argc) {
            if (!dt_cli_number(argv[++i], 0, 0.9, &a->frac)) {
                dt_log(DT_LOG_ERROR, "tokenize: --val-fraction %s is not valid: expected a number from 0 to 0.9", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return tokenize_usage();
        else if (argv[i][0] == '-' && argv[i][1]) {
            static const dt_cli_flag flags[] = { { "--bytes", "" }, { "--bpe", "ENCODER.json VOCAB.bpe" }, { "--tokenizer", "a tokenizer.json" }, { "--val", "a file" },
                                                 { "--val-fraction", "a number from 0 to 0.9" }, { "--help", "" }, { NULL, NULL } };
            return dt_cli_flag_error("tokenize", flags, argv[i], i + 1 < argc ? argv[i + 1] : NULL);
        } else if (!a->in) a->in = argv[i];
        else if (!a->out) a->out = argv[i];
        else {
            dt_log(DT_LOG_ERROR, "tokenize: unexpected argument '%s' (INPUT and OUTPUT are %s and %s)", argv[i], a->in, a->out);
            return 2;
        }
    }
    if (a->frac != 0.1 && !a->val) dt_log(DT_LOG_WARN, "tokenize: --val-fraction does nothing without --val FILE");
    if (a->bytes == (a->enc != NULL) || !a->in || !a->out) {
        dt_log(DT_LOG_ERROR, "tokenize: expected --bytes, --bpe ENCODER.json VOCAB.bpe or --tokenizer tokenizer.json, then INPUT and OUTPUT");
        return 2;
    }
    return -1;
}

/* The text's tokens: its bytes, or the BPE's ids (said with its vocabulary). */
static dt_status encode(const tokenize_args *a, const char *text, size_t len, uint32_t **tok, size_t *n) {
    size_t cap = 0;
    *tok = NULL, *n = 0;
    if (a->bytes) {
        if (!(*tok = malloc((len + 1) * 4))) return dt_error(DT_ERR_NOMEM, "tokenize: out of memory");
        for (size_t i = 0; i < len; i++) (*tok)[(*n)++] = (unsigned char)text[i];
        return DT_OK;
    }
    dt_bpe *b;
    dt_status st = a->merges ? dt_bpe_load(a->enc, a->merges, &b) : dt_bpe_load_json(a->enc, &b);
    if (st) return st;
    st = dt_bpe_encode(b, text, len, tok, n, &cap);
    if (!st) printf("%s BPE, vocabulary %d: ", a->merges ? "GPT-2" : a->enc, dt_bpe_vocab_size(b));
    dt_bpe_destroy(b);
    return st;
}

/* dtrain tokenize (--bytes | --bpe ENCODER.json VOCAB.bpe) IN OUT [--val OUT2 --val-fraction F] */
int dt_cli_tokenize(int argc, char **argv) {
    tokenize_args a;
    int rc = tokenize_parse(argc, argv, &a);
    if (rc >= 0) return rc;
    char *text;
    size_t len, n = 0;
    uint32_t *tok = NULL;
    dt_status st = dt_file_read_text(a.in, SIZE_MAX, &text, &len);
    if (st) {
        dt_log(DT_LOG_ERROR, "tokenize: %s", dt_last_error());
        return 1;
    }
    st = encode(&a, text, len, &tok, &n);
    free(text);
    if (!st && n == 0) st = dt_error(DT_ERR_ARG, "%s is empty: no tokens to write (a token file needs at least one batch)", a.in);
    size_t nval = a.val ? (size_t)(n * a.frac) : 0;
    if (!st) st = dt_tokens_write(a.out, tok, n - nval);
    if (!st && a.val) st = dt_tokens_write(a.val, tok + n - nval, nval);
    free(tok);
    if (st) { dt_log(DT_LOG_ERROR, "tokenize: %s", dt_last_error()); return 1; }
    printf("%zu tokens -> %s", n - nval, a.out);
    if (a.val) printf(", %zu -> %s", nval, a.val);
    printf("\n");
    return 0;
}
