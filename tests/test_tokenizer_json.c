/* Hugging Face tokenizer.json files read by dtrain's BPE against the `tokenizers` library
 * (scripts/make_tokenizer_fixtures.py): a GPT-2-style, a Llama 3-style and a Qwen 2-style tokenizer (their
 * pre-tokenizer patterns through PCRE2, added tokens, ignore_merges, a begin-of-text template, NFC) give the library's ids for short strings and
 * for a 1.2 MB text in many scripts (compared block by block of 4096 ids), and decode back to the text; files asking
 * for what the encoder does not do are refused naming the file and the field.
 * usage: test_tokenizer_json FIXTURE_DIR/tokenizer */
#include "dtrain/data.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uninorm.h>
#include <unistd.h>
#include <zlib.h>

static int passed, failed;

static void check(int ok, const char *what, const char *detail) {
    if (ok) passed++;
    else failed++;
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail ? ": " : "", detail ? detail : "");
}

static uint64_t fnv(const uint32_t *ids, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) h = (h ^ ((ids[i] >> (8 * k)) & 0xFF)) * 1099511628211ull;
    return h;
}

/* The gzipped text whole (*n bytes). */
static char *read_gz(const char *path, size_t *n) {
    gzFile f = gzopen(path, "rb");
    size_t cap = 1 << 21;
    char *t = malloc(cap);
    *n = 0;
    int got;
    while (f && t && (got = gzread(f, t + *n, (unsigned)(cap - *n))) > 0) {
        *n += (size_t)got;
        if (*n == cap) {
            char *g = realloc(t, cap *= 2);
            if (!g) { free(t); t = NULL; }
            t = g;
        }
    }
    if (f) gzclose(f);
    return t;
}

static void short_strings(dt_bpe *b, const char *name, const cJSON *want) {
    int same = 0, all = 0;
    for (const cJSON *it = want->child; it; it = it->next, all++) {
        uint32_t *ids = NULL;
        size_t n = 0, cap = 0;
        int ok = !dt_bpe_encode(b, it->string, strlen(it->string), &ids, &n, &cap) && n == (size_t)cJSON_GetArraySize(it);
        for (size_t i = 0; ok && i < n; i++) ok = ids[i] == (uint32_t)cJSON_GetArrayItem(it, (int)i)->valueint;
        if (!ok) printf("  %s: \"%s\" differs (%zu ids, the library's %d)\n", name, it->string, n, cJSON_GetArraySize(it));
        same += ok;
        free(ids);
    }
    char d[96];
    snprintf(d, sizeof d, "%d of %d equal", same, all);
    check(same == all, "short strings' ids", d);
}

/* The text's ids block by block against the library's hashes, and decoded back to the text (normalized, nfc: its
 * Unicode NFC, as the tokenizer reads it). */
static void whole_text(dt_bpe *b, const char *name, const cJSON *want, const char *text, size_t len, int nfc) {
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    dt_status st = dt_bpe_encode(b, text, len, &ids, &n, &cap);
    size_t count = (size_t)cJSON_GetNumberValue(cJSON_GetObjectItem(want, "text_ids")), block = 4096;
    const cJSON *hashes = cJSON_GetObjectItem(want, "hashes");
    int bad = -1, k = 0;
    for (size_t at = 0; !st && at < n && bad < 0; at += block, k++) {
        char h[24];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)fnv(ids + at, n - at < block ? n - at : block));
        const char *ref = cJSON_GetStringValue(cJSON_GetArrayItem(hashes, k));
        if (!ref || strcmp(ref, h)) bad = k;
    }
    char d[160];
    snprintf(d, sizeof d, "%s: %zu ids of %zu bytes, the library's %zu%s", name, n, len, count, st ? dt_last_error() : "");
    if (bad >= 0) snprintf(d + strlen(d), sizeof d - strlen(d), "; block %d (ids %zu..) differs", bad, (size_t)bad * block);
    check(!st && n == count && bad < 0, "a 1.2 MB text's ids equal the library's", d);
    size_t at = 0;
    uint8_t *normal = NULL;
    if (nfc) {
        size_t nn = 0;
        normal = u8_normalize(UNINORM_NFC, (const uint8_t *)text, len, NULL, &nn);
        text = (const char *)normal, len = normal ? nn : 0;
    }
    int round = !st && text;
    for (size_t i = 0; round && i < n; i++) {
        size_t l;
        const char *t = dt_bpe_token_bytes(b, ids[i], &l);
        round = t && at + l <= len && !memcmp(text + at, t, l);
        at += l;
    }
    check(round && at == len, nfc ? "decoded back to the text in NFC" : "decoded back to the text", name);
    free(normal);
    free(ids);
}

/* A copy of good with from replaced by to is refused, the message naming want. */
static void refused(const char *good, const char *what, const char *from, const char *to, const char *want) {
    size_t n;
    FILE *f = fopen(good, "rb");
    char *t = malloc(1 << 20), path[] = "/tmp/test_tokenizer_XXXXXX";
    n = f && t ? fread(t, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    t[n] = 0;
    char *at = strstr(t, from);
    int fd = mkstemp(path);
    FILE *o = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (at && o) {
        fwrite(t, 1, (size_t)(at - t), o);
        fputs(to, o);
        fputs(at + strlen(from), o);
    }
    if (o) fclose(o);
    dt_bpe *b = NULL;
    dt_status st = at && o ? dt_bpe_load_json(path, &b) : DT_ERR_IO;
    int ok = st != DT_OK && strstr(dt_last_error(), want) && strstr(dt_last_error(), path);
    check(ok, what, st ? dt_last_error() : "loaded");
    dt_bpe_destroy(b);
    unlink(path);
    free(t);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char path[1024];
    snprintf(path, sizeof path, "%s/expected.json", argv[1]);
    FILE *f = fopen(path, "rb");
    char *js = malloc(1 << 20);
    size_t n = f && js ? fread(js, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    if (!js) return 1;
    js[n] = 0;
    cJSON *exp = cJSON_Parse(js);
    free(js);
    snprintf(path, sizeof path, "%s/text.txt.gz", argv[1]);
    size_t len;
    char *text = read_gz(path, &len);
    check(exp && text && len >= 1000000, "fixtures: expected.json, a text of at least 1 MB", path);
    const char *names[] = { "gpt2", "llama3", "qwen2" };
    for (int i = 0; exp && text && i < 3; i++) {
        dt_bpe *b = NULL;
        snprintf(path, sizeof path, "%s/%s.json", argv[1], names[i]);
        dt_status st = dt_bpe_load_json(path, &b);
        check(!st, names[i], st ? dt_last_error() : "loaded");
        if (st) continue;
        const cJSON *want = cJSON_GetObjectItem(exp, names[i]);
        short_strings(b, names[i], cJSON_GetObjectItem(want, "short"));
        whole_text(b, names[i], want, text, len, !strcmp(names[i], "qwen2"));
        const cJSON *bos = cJSON_GetObjectItem(want, "bos");
        int32_t *p = NULL;
        int np = 0;
        st = dt_bpe_prompt(b, "x", 1, true, &p, &np);
        check(!st && (cJSON_IsNumber(bos) ? np >= 1 && p[0] == bos->valueint && dt_bpe_bos(b) == bos->valueint : dt_bpe_bos(b) < 0),
              "a prompt starts with the template's begin-of-text token where it has one", names[i]);
        free(p);
        dt_bpe_destroy(b);
    }
    snprintf(path, sizeof path, "%s/llama3.json", argv[1]);
    refused(path, "an unknown pre-tokenizer", "\"type\": \"Split\"", "\"type\": \"Metaspace\"",
            "pre_tokenizer.pretokenizers[0].type \"Metaspace\": not a pre-tokenizer");
    refused(path, "a normalizer other than NFC", "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}", "normalizer \"NFKC\"");
    refused(path, "byte fallback (SentencePiece's BPE)", "\"byte_fallback\": false", "\"byte_fallback\": true", "model.byte_fallback true");
    refused(path, "a pattern that does not compile", "(?i:'s|", "(?i:'s|(", "does not compile");
    refused(path, "another model", "\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model.type \"WordPiece\"");
    cJSON_Delete(exp);
    free(text);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
