/* dtrain tokenize: flag parsing only. */
#include "cli.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/train.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* dtrain tokenize (--bytes | --bpe ENCODER.json VOCAB.bpe) IN OUT [--val OUT2 --val-fraction F] */
int dt_cli_tokenize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *val = NULL, *enc = NULL, *merges = NULL;
    double frac = 0.1;
    int bytes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bytes")) bytes = 1;
        else if (!strcmp(argv[i], "--bpe") && i + 2 < argc) { enc = argv[++i]; merges = argv[++i]; }
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) { enc = argv[++i]; merges = NULL; }
        else if (!strcmp(argv[i], "--val") && i + 1 < argc) val = argv[++i];
        else if (!strcmp(argv[i], "--val-fraction") && i + 1 < argc) {
            if (!dt_cli_number(argv[++i], 0, 0.9, &frac)) {
                dt_log(DT_LOG_ERROR, "tokenize: --val-fraction %s is not valid: expected a number from 0 to 0.9", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dtrain tokenize (--bytes | --bpe ENCODER.json VOCAB.bpe | --tokenizer tokenizer.json) INPUT.txt OUTPUT.bin\n"
                   "                       [--val VAL.bin --val-fraction 0.1]\n"
                   "Byte-level tokens (vocabulary 256), GPT-2 BPE (the encoder.json + vocab.bpe pair GPT-2's\n"
                   "tokenizer is distributed as) or a Hugging Face tokenizer.json of byte-level BPE (GPT-2's, Llama 3's,\n"
                   "Qwen 2's with its NFC: the tokenizers library's ids); the last fraction of the text goes to --val.\n");
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            static const dt_cli_flag flags[] = { { "--bytes", "" }, { "--bpe", "ENCODER.json VOCAB.bpe" }, { "--tokenizer", "a tokenizer.json" }, { "--val", "a file" },
                                                 { "--val-fraction", "a number from 0 to 0.9" }, { "--help", "" }, { NULL, NULL } };
            return dt_cli_flag_error("tokenize", flags, argv[i], i + 1 < argc ? argv[i + 1] : NULL);
        } else if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else {
            dt_log(DT_LOG_ERROR, "tokenize: unexpected argument '%s' (INPUT and OUTPUT are %s and %s)", argv[i], in, out);
            return 2;
        }
    }
    if (frac != 0.1 && !val) dt_log(DT_LOG_WARN, "tokenize: --val-fraction does nothing without --val FILE");
    if (bytes == (enc != NULL) || !in || !out) {
        dt_log(DT_LOG_ERROR, "tokenize: expected --bytes, --bpe ENCODER.json VOCAB.bpe or --tokenizer tokenizer.json, then INPUT and OUTPUT");
        return 2;
    }
    FILE *f = fopen(in, "rb");
    if (!f) { dt_log(DT_LOG_ERROR, "tokenize: %s: %s", in, strerror(errno)); return 1; }
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    fseek(f, 0, SEEK_SET);
    char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
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
        st = merges ? dt_bpe_load(enc, merges, &b) : dt_bpe_load_json(enc, &b);
        if (!st) {
            st = dt_bpe_encode(b, text, (size_t)len, &tok, &n, &cap);
            if (!st) printf("%s BPE, vocabulary %d: ", merges ? "GPT-2" : enc, dt_bpe_vocab_size(b));
            dt_bpe_destroy(b);
        }
    }
    free(text);
    if (!st && n == 0) st = dt_error(DT_ERR_ARG, "%s is empty: no tokens to write (a token file needs at least one batch)", in);
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
