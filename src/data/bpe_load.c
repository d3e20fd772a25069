/* Byte-level BPE's files: GPT-2's pair (encoder.json: token -> id; vocab.bpe: one merge a line, by rank) and
 * Hugging Face's tokenizer.json (model.vocab, model.merges, added_tokens, the pre-tokenizer: ByteLevel with GPT-2's
 * pattern, or a Split by a pattern before a ByteLevel, as Llama 3's and Qwen 2's; a template's begin-of-text token).
 * What the encoder does not do is refused naming the file and the field, never guessed. */
#include "bpe_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* path's text, refused (naming the line and column) where it is not UTF-8, as Python's json and HF's tokenizers
 * refuse it. */
static dt_status check_utf8(const char *path, const char *text, size_t n) {
    long at = bpe_utf8_bad((const unsigned char *)text, n);
    if (at < 0) return DT_OK;
    int line = 1;
    long col = at;
    for (long i = 0; i < at; i++)
        if (text[i] == '\n') line++, col = at - i - 1;
    return dt_error(DT_ERR_IO, "%s: not valid UTF-8 at byte %ld (line %d, column %ld: byte 0x%02x)", path, at, line, col + 1,
                    (unsigned char)text[at]);
}

/* path read whole and checked to be UTF-8 (*text freed by the caller). */
static dt_status slurp(const char *path, char **text, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    long sz = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    fseek(f, 0, SEEK_SET);
    char *p = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) { free(p); p = NULL; }
    fclose(f);
    if (!p) return dt_error(DT_ERR_IO, "%s: cannot read it whole", path);
    p[sz] = 0;
    *n = (size_t)sz;
    dt_status st = check_utf8(path, p, *n);
    if (st) free(p);
    else *text = p;
    return st;
}

/* A JSON object of token -> id into b->vocab; *maxid the largest id. */
static dt_status read_vocab(dt_bpe *b, const cJSON *j, const char *path, const char *field, int *maxid) {
    /* ids index a table: they must be whole numbers below a bound that keeps it small */
    for (const cJSON *it = j->child; it; it = it->next) {
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0 && it->valuedouble < DT_BPE_MAX_VOCAB) || it->valuedouble != (double)it->valueint)
            return dt_error(DT_ERR_IO, "%s: %s: token \"%s\" needs a whole-number id from 0 to %d", path, field, it->string, DT_BPE_MAX_VOCAB - 1);
        if (bpe_utf8_bad((const unsigned char *)it->string, strlen(it->string)) >= 0) /* a \u escape of a lone surrogate */
            return dt_error(DT_ERR_IO, "%s: %s: token with id %d is not valid UTF-8 once its escapes are read", path, field, it->valueint);
        if (bpe_map_put(&b->vocab, it->string, strlen(it->string), it->valueint)) return dt_error(DT_ERR_NOMEM, "bpe: out of memory");
        if (it->valueint > *maxid) *maxid = it->valueint;
    }
    return DT_OK;
}

/* Each id's raw bytes: a vocabulary token's characters mapped back, an added token's content as it is. */
static dt_status token_table(dt_bpe *b, const cJSON *vocab, const char *path) {
    b->token_bytes = calloc((size_t)b->nvocab + 1, sizeof(char *));
    b->token_text = calloc((size_t)b->nvocab + 1, sizeof(char *));
    b->token_len = calloc((size_t)b->nvocab + 1, sizeof(size_t));
    if (!b->token_bytes || !b->token_text || !b->token_len) return dt_error(DT_ERR_NOMEM, "bpe: out of memory for %d tokens", b->nvocab);
    for (const cJSON *it = vocab->child; it; it = it->next) {
        if (b->token_bytes[it->valueint])
            return dt_error(DT_ERR_IO, "%s: id %d is given to two tokens (\"%s\" is the second)", path, it->valueint, it->string);
        size_t n = strlen(it->string) + 1;
        if (!(b->token_bytes[it->valueint] = malloc(n)) || !(b->token_text[it->valueint] = malloc(n)))
            return dt_error(DT_ERR_NOMEM, "bpe: out of memory");
        b->token_len[it->valueint] = bpe_unmap(b, it->string, b->token_bytes[it->valueint]);
        memcpy(b->token_text[it->valueint], it->string, n);
    }
    for (int i = 0; i < b->nadded; i++) {
        bpe_added *a = &b->added[i];
        if (b->token_bytes[a->id]) continue; /* also in the vocabulary (GPT-2's <|endoftext|>) */
        if (!(b->token_bytes[a->id] = malloc(a->len + 1)) || !(b->token_text[a->id] = malloc(a->len + 1)))
            return dt_error(DT_ERR_NOMEM, "bpe: out of memory");
        memcpy(b->token_bytes[a->id], a->content, a->len);
        memcpy(b->token_text[a->id], a->content, a->len + 1);
        b->token_len[a->id] = a->len;
    }
    return DT_OK;
}

/* path's JSON object (*j, the caller's to delete), or an error saying what it should have been. */
static dt_status read_object(const char *path, const char *what, cJSON **j) {
    char *text = NULL;
    size_t n;
    dt_status st = slurp(path, &text, &n);
    if (st) return st;
    *j = cJSON_Parse(text);
    free(text);
    if (cJSON_IsObject(*j)) return DT_OK;
    cJSON_Delete(*j);
    *j = NULL;
    return dt_error(DT_ERR_IO, "%s: not a JSON object %s", path, what);
}

static dt_bpe *new_bpe(void) {
    dt_bpe *b = calloc(1, sizeof *b);
    if (b) bpe_byte_table(b), b->bos = -1;
    return b;
}

dt_status dt_bpe_load(const char *encoder_json, const char *vocab_bpe, dt_bpe **out) {
    *out = NULL;
    cJSON *j = NULL;
    size_t n;
    dt_status st = read_object(encoder_json, "of token -> id", &j);
    if (st) return st;
    dt_bpe *b = new_bpe();
    if (!b) { cJSON_Delete(j); return dt_error(DT_ERR_NOMEM, "bpe: out of memory"); }
    int maxid = -1;
    st = read_vocab(b, j, encoder_json, "the vocabulary", &maxid);
    b->nvocab = maxid + 1;
    if (!st) st = token_table(b, j, encoder_json);
    cJSON_Delete(j);
    char *merges = NULL;
    if (!st) st = slurp(vocab_bpe, &merges, &n);
    int rank = 0, line = 0;
    for (char *p = merges, *e; !st && p && *p; p = e + (*e ? 1 : 0)) {
        e = strchr(p, '\n');
        if (!e) e = p + strlen(p);
        size_t len = (size_t)(e - p);
        if (len && p[len - 1] == '\r') len--;
        line++;
        if (len == 0 || (line == 1 && p[0] == '#')) continue; /* "#version: 0.2" */
        if (!memchr(p, ' ', len)) st = dt_error(DT_ERR_IO, "%s: line %d is not \"left right\"", vocab_bpe, line);
        else st = bpe_add_merge(b, p, len), rank++;
    }
    free(merges);
    if (!st) st = bpe_compile(b, dt_bpe_gpt2_pattern, "GPT-2's pre-tokenizer");
    if (st) { dt_bpe_destroy(b); return st; }
    *out = b;
    return DT_OK;
}

/* ---- tokenizer.json ---- */

static const char *str_of(const cJSON *j, const char *key) { return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, key)); }
static bool true_at(const cJSON *j, const char *key) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, key)); }

/* model.merges: "left right" strings (older files) or [left, right] pairs, by rank. */
static dt_status read_merges(dt_bpe *b, const cJSON *m, const char *path) {
    if (!cJSON_IsArray(m)) return dt_error(DT_ERR_IO, "%s: model.merges is not a list", path);
    int rank = 0;
    char key[1024];
    for (const cJSON *it = m->child; it; it = it->next, rank++) {
        const char *s = cJSON_GetStringValue(it), *l = cJSON_GetStringValue(cJSON_GetArrayItem(it, 0)),
                   *r = cJSON_GetStringValue(cJSON_GetArrayItem(it, 1));
        int len = s ? snprintf(key, sizeof key, "%s", s) : l && r ? snprintf(key, sizeof key, "%s %s", l, r) : -1;
        if (len < 0 || (size_t)len >= sizeof key || !strchr(key, ' '))
            return dt_error(DT_ERR_IO, "%s: model.merges[%d] is not \"left right\" nor a pair of strings", path, rank);
        dt_status st = bpe_add_merge(b, key, (size_t)len);
        if (st) return st;
    }
    return DT_OK;
}

/* model: a byte-level BPE (no unknown token, byte fallback, word prefixes or suffixes: SentencePiece's kind of BPE is
 * not this encoder's). */
static dt_status read_model(dt_bpe *b, const cJSON *m, const char *path, int *maxid) {
    const char *type = str_of(m, "type");
    if (!cJSON_IsObject(m) || !type) return dt_error(DT_ERR_IO, "%s: no \"model\" object with a \"type\"", path);
    if (strcmp(type, "BPE")) return dt_error(DT_ERR_UNSUPPORTED, "%s: model.type \"%s\": only byte-level BPE is read", path, type);
    if (true_at(m, "byte_fallback"))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: model.byte_fallback true (SentencePiece's BPE, Llama 2's): only byte-level BPE is read", path);
    static const char *const none[] = { "continuing_subword_prefix", "end_of_word_suffix", "unk_token" };
    for (int i = 0; i < 3; i++)
        if (str_of(m, none[i]) && *str_of(m, none[i]))
            return dt_error(DT_ERR_UNSUPPORTED, "%s: model.%s \"%s\": a byte-level BPE has none", path, none[i], str_of(m, none[i]));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    if (!cJSON_IsObject(v)) return dt_error(DT_ERR_IO, "%s: model.vocab is not an object of token -> id", path);
    b->ignore_merges = true_at(m, "ignore_merges");
    dt_status st = read_vocab(b, v, path, "model.vocab", maxid);
    return st ? st : read_merges(b, cJSON_GetObjectItemCaseSensitive(m, "merges"), path);
}

static int longest_first(const void *x, const void *y) {
    const bpe_added *a = x, *b = y;
    return (a->len < b->len) - (a->len > b->len);
}

/* added_tokens: matched in the raw text as they are (stripping or word-bound ones refused). */
static dt_status read_added(dt_bpe *b, const cJSON *list, const char *path, int *maxid) {
    int n = cJSON_GetArraySize(list), i = 0;
    if (list && !cJSON_IsArray(list)) return dt_error(DT_ERR_IO, "%s: added_tokens is not a list", path);
    if (n && !(b->added = calloc((size_t)n, sizeof *b->added))) return dt_error(DT_ERR_NOMEM, "bpe: out of memory");
    for (const cJSON *it = list ? list->child : NULL; it; it = it->next, i++) {
        const char *c = str_of(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!c || !*c || !cJSON_IsNumber(id) || id->valueint < 0 || id->valueint >= DT_BPE_MAX_VOCAB)
            return dt_error(DT_ERR_IO, "%s: added_tokens[%d] needs a \"content\" and an \"id\" from 0 to %d", path, i, DT_BPE_MAX_VOCAB - 1);
        static const char *const flags[] = { "lstrip", "rstrip", "single_word" };
        for (int k = 0; k < 3; k++)
            if (true_at(it, flags[k]))
                return dt_error(DT_ERR_UNSUPPORTED, "%s: added_tokens[%d] (\"%s\"): %s true is not supported", path, i, c, flags[k]);
        bpe_added *a = &b->added[b->nadded++];
        a->len = strlen(c);
        a->id = id->valueint;
        a->special = true_at(it, "special");
        if (!(a->content = malloc(a->len + 1))) return dt_error(DT_ERR_NOMEM, "bpe: out of memory");
        memcpy(a->content, c, a->len + 1);
        b->added_first[(unsigned char)c[0]] = true;
        if (a->id > *maxid) *maxid = a->id;
    }
    if (b->nadded) qsort(b->added, (size_t)b->nadded, sizeof *b->added, longest_first);
    return DT_OK;
}

/* One pre-tokenizer: ByteLevel (its pattern GPT-2's where use_regex) or a Split by a pattern that isolates its matches.
 * *bytes: a ByteLevel was met. */
static dt_status read_pre_one(dt_bpe *b, const cJSON *p, const char *path, const char *field, bool *bytes) {
    const char *type = str_of(p, "type");
    if (!type) return dt_error(DT_ERR_IO, "%s: %s has no \"type\"", path, field);
    if (!strcmp(type, "ByteLevel")) {
        *bytes = true;
        b->prefix_space = true_at(p, "add_prefix_space");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        if (!re || cJSON_IsTrue(re)) {
            if (b->re) return dt_error(DT_ERR_UNSUPPORTED, "%s: %s: a second pattern (ByteLevel's, after a Split): not supported", path, field);
            return bpe_compile(b, dt_bpe_gpt2_pattern, path);
        }
        return DT_OK;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = str_of(pat, "Regex"), *lit = str_of(pat, "String"), *behavior = str_of(p, "behavior");
        if (!re && !lit) return dt_error(DT_ERR_IO, "%s: %s.pattern has no \"Regex\" or \"String\"", path, field);
        if (!behavior || strcmp(behavior, "Isolated") || true_at(p, "invert"))
            return dt_error(DT_ERR_UNSUPPORTED, "%s: %s: behavior \"%s\"%s: only Isolated, not inverted, is supported", path, field,
                            behavior ? behavior : "(none)", true_at(p, "invert") ? ", inverted" : "");
        if (b->re) return dt_error(DT_ERR_UNSUPPORTED, "%s: %s: a second Split: one pattern is supported", path, field);
        if (re) return bpe_compile(b, re, path);
        char quoted[1024]; /* a literal: \Q...\E */
        if (strstr(lit, "\\E") || snprintf(quoted, sizeof quoted, "\\Q%s\\E", lit) >= (int)sizeof quoted)
            return dt_error(DT_ERR_UNSUPPORTED, "%s: %s.pattern.String cannot be quoted", path, field);
        return bpe_compile(b, quoted, path);
    }
    return dt_error(DT_ERR_UNSUPPORTED, "%s: %s \"%s\": not a pre-tokenizer this BPE reads (ByteLevel, Split, a Sequence of them)", path,
                    field, type);
}

static dt_status read_pre(dt_bpe *b, const cJSON *p, const char *path) {
    const char *type = str_of(p, "type");
    bool bytes = false;
    dt_status st = DT_OK;
    if (!cJSON_IsObject(p)) return dt_error(DT_ERR_UNSUPPORTED, "%s: pre_tokenizer is null: only byte-level BPE (a ByteLevel pre-tokenizer) is read", path);
    if (type && !strcmp(type, "Sequence")) {
        int i = 0;
        char field[64];
        for (const cJSON *it = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers") ? cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")->child : NULL;
             it && !st; it = it->next, i++) {
            snprintf(field, sizeof field, "pre_tokenizer.pretokenizers[%d].type", i);
            st = read_pre_one(b, it, path, field, &bytes);
        }
    } else st = read_pre_one(b, p, path, "pre_tokenizer.type", &bytes);
    if (!st && !bytes) st = dt_error(DT_ERR_UNSUPPORTED, "%s: pre_tokenizer has no ByteLevel: only byte-level BPE is read", path);
    return st;
}

/* post_processor: a TemplateProcessing whose single sequence starts with a special token: a prompt's first token. */
static dt_status read_post(dt_bpe *b, const cJSON *p, const char *path) {
    const char *type = str_of(p, "type");
    if (!type || strcmp(type, "TemplateProcessing")) return DT_OK; /* ByteLevel's (offsets only) or none */
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "single"), 0);
    const char *name = str_of(cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id");
    if (!name) return DT_OK;
    for (int i = 0; i < b->nadded; i++)
        if (!strcmp(b->added[i].content, name)) b->bos = b->added[i].id;
    if (b->bos < 0) return dt_error(DT_ERR_IO, "%s: post_processor.single names \"%s\", which is not an added token", path, name);
    return DT_OK;
}

dt_status dt_bpe_load_json(const char *path, dt_bpe **out) {
    *out = NULL;
    cJSON *j = NULL;
    dt_status st = read_object(path, "(a tokenizer.json)", &j);
    if (st) return st;
    dt_bpe *b = new_bpe();
    if (!b) { cJSON_Delete(j); return dt_error(DT_ERR_NOMEM, "bpe: out of memory"); }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(j, "normalizer");
    int maxid = -1;
    if (norm && !cJSON_IsNull(norm) && !(str_of(norm, "type") && !strcmp(str_of(norm, "type"), "NFC")))
        st = dt_error(DT_ERR_UNSUPPORTED, "%s: normalizer \"%s\": only NFC (Qwen 2's) or none is read", path,
                      str_of(norm, "type") ? str_of(norm, "type") : "?");
    b->nfc = !st && norm && !cJSON_IsNull(norm);
    if (!st) st = read_model(b, cJSON_GetObjectItemCaseSensitive(j, "model"), path, &maxid);
    if (!st) st = read_added(b, cJSON_GetObjectItemCaseSensitive(j, "added_tokens"), path, &maxid);
    if (!st) st = read_pre(b, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"), path);
    if (!st) st = read_post(b, cJSON_GetObjectItemCaseSensitive(j, "post_processor"), path);
    b->nvocab = maxid + 1;
    if (!st) st = token_table(b, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "vocab"), path);
    cJSON_Delete(j);
    if (st) { dt_bpe_destroy(b); return st; }
    *out = b;
    return DT_OK;
}

dt_status dt_bpe_for_model(const char *encoder_json, const char *vocab_bpe, int vocab, int min_bytes, const char *model,
                           const char *who, bool say, dt_bpe **out) {
    *out = NULL;
    char found[4200];
    struct stat sb;
    /* an HF folder's own tokenizer.json when none is given */
    if (!encoder_json && model && snprintf(found, sizeof found, "%s/tokenizer.json", model) < (int)sizeof found && stat(found, &sb) == 0) {
        encoder_json = found;
        vocab_bpe = NULL;
        if (say) dt_log(DT_LOG_INFO, "%s: the tokenizer %s", who, found);
    }
    if (!encoder_json) {
        if (vocab < min_bytes)
            return dt_error(DT_ERR_ARG, "%s: %s has a vocabulary of %d; byte prompts need 256 (or give --tokenizer or --bpe)", who, model, vocab);
        if (vocab < 256 && say)
            dt_log(DT_LOG_WARN, "%s: %s has a vocabulary of %d and no tokenizer: prompts are token ids, or text whose bytes are below %d",
                   who, model, vocab, vocab);
        else if (vocab != 256 && say)
            dt_log(DT_LOG_WARN, "%s: %s has a vocabulary of %d and no tokenizer was given: prompts are read as bytes and tokens from "
                   "256 up come back as <id> (give --tokenizer tokenizer.json, or --bpe ENCODER.json VOCAB.bpe for GPT-2's; a byte-level model is trained with "
                   "--vocab 256)", who, model, vocab);
        return DT_OK;
    }
    dt_status st = vocab_bpe ? dt_bpe_load(encoder_json, vocab_bpe, out) : dt_bpe_load_json(encoder_json, out);
    if (!st && dt_bpe_vocab_size(*out) > vocab)
        st = dt_error(DT_ERR_ARG, "%s: the tokenizer has %d tokens, the model only %d", who, dt_bpe_vocab_size(*out), vocab);
    if (st) { dt_bpe_destroy(*out); *out = NULL; }
    return st;
}
