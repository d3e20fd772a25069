/* GPT-2's byte-level BPE.
 *
 * Every byte maps to a printable unicode character (bytes that print as
 * themselves keep their code, the others get 256 + n), so a token is a
 * string of such characters, stored UTF-8 in encoder.json. Text is first cut
 * into pieces by GPT-2's pattern ('s 't 're 've 'm 'll 'd, optional space +
 * letters, optional space + digits, optional space + other symbols,
 * whitespace), then each piece's characters are merged pairwise, always the
 * pair with the lowest rank in vocab.bpe first, until no pair is listed. */
#include "dtrain/data.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a string -> int hash map (open addressing, FNV-1a) ---- */
typedef struct { char *key; int val; } slot;
typedef struct { slot *s; size_t cap, n; } strmap;

static uint64_t fnv(const char *k, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
    return h;
}

static int map_put(strmap *m, const char *k, size_t n, int v) {
    if ((m->n + 1) * 2 > m->cap) {
        strmap g = { calloc(m->cap ? m->cap * 2 : 1024, sizeof(slot)), m->cap ? m->cap * 2 : 1024, 0 };
        if (!g.s) return -1;
        for (size_t i = 0; i < m->cap; i++)
            if (m->s[i].key) {
                size_t j = fnv(m->s[i].key, strlen(m->s[i].key)) & (g.cap - 1);
                while (g.s[j].key) j = (j + 1) & (g.cap - 1);
                g.s[j] = m->s[i];
                g.n++;
            }
        free(m->s);
        *m = g;
    }
    size_t j = fnv(k, n) & (m->cap - 1);
    while (m->s[j].key && !(strlen(m->s[j].key) == n && !memcmp(m->s[j].key, k, n))) j = (j + 1) & (m->cap - 1);
    if (!m->s[j].key) {
        m->s[j].key = malloc(n + 1);
        if (!m->s[j].key) return -1;
        memcpy(m->s[j].key, k, n);
        m->s[j].key[n] = 0;
        m->n++;
    }
    m->s[j].val = v;
    return 0;
}

static int map_get(const strmap *m, const char *k, size_t n) {
    if (!m->cap) return -1;
    size_t j = fnv(k, n) & (m->cap - 1);
    while (m->s[j].key) {
        if (strlen(m->s[j].key) == n && !memcmp(m->s[j].key, k, n)) return m->s[j].val;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

static void map_free(strmap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->s[i].key);
    free(m->s);
}

struct dt_bpe {
    strmap vocab, merges;       /* token string -> id; "left right" -> rank */
    char byte_utf8[256][3];     /* each byte's character, UTF-8 */
    unsigned char byte_len[256];
    char **token_bytes;         /* id -> raw bytes */
    size_t *token_len;
    int nvocab;
};

static int utf8_put(char *out, unsigned cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* GPT-2's mapping never exceeds U+0143 */
}

static void byte_table(dt_bpe *b) {
    int extra = 0;
    for (int c = 0; c < 256; c++) {
        int prints = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        unsigned cp = prints ? (unsigned)c : 256u + (unsigned)extra++;
        b->byte_len[c] = (unsigned char)utf8_put(b->byte_utf8[c], cp);
    }
}

/* Decodes one token string (the mapped characters) back to raw bytes; a
 * character outside the mapping (or a lead byte the string ends after) is
 * dropped, never read past. */
static size_t unmap(const dt_bpe *b, const char *s, char *out) {
    size_t n = 0;
    while (*s) {
        unsigned cp;
        int k = ((unsigned char)*s < 0x80 || !s[1]) ? 1 : 2;
        cp = k == 1 ? (unsigned char)*s : (((unsigned char)s[0] & 0x1F) << 6) | ((unsigned char)s[1] & 0x3F);
        for (int c = 0; c < 256; c++) {
            char tmp[3];
            int l = utf8_put(tmp, cp);
            if (l == b->byte_len[c] && !memcmp(tmp, b->byte_utf8[c], (size_t)l)) { out[n++] = (char)c; break; }
        }
        s += k;
    }
    return n;
}

void dt_bpe_destroy(dt_bpe *b) {
    if (!b) return;
    map_free(&b->vocab);
    map_free(&b->merges);
    for (int i = 0; b->token_bytes && i < b->nvocab; i++) free(b->token_bytes[i]);
    free(b->token_bytes);
    free(b->token_len);
    free(b);
}

/* The offset of the first byte of s[0, n) that does not begin a well-formed
 * UTF-8 character (RFC 3629: no overlong forms, surrogates or code points
 * past U+10FFFF; a lead byte the text ends after), or -1 when all are. */
static long utf8_bad(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        int k = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        if (k < 0 || i + (size_t)k >= n) return (long)i;
        unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        for (int j = 1; j <= k; j++)
            if (s[i + j] < (j == 1 ? lo : 0x80) || s[i + j] > (j == 1 ? hi : 0xBF)) return (long)i;
        i += (size_t)k + 1;
    }
    return -1;
}

/* path's text, refused (naming the line and column) where it is not UTF-8,
 * as Python's json and HF's tokenizers refuse it. */
static dt_status check_utf8(const char *path, const char *text, size_t n) {
    long at = utf8_bad((const unsigned char *)text, n);
    if (at < 0) return DT_OK;
    int line = 1;
    long col = at;
    for (long i = 0; i < at; i++)
        if (text[i] == '\n') line++, col = at - i - 1;
    return dt_error(DT_ERR_IO, "%s: not valid UTF-8 at byte %ld (line %d, column %ld: byte 0x%02x)", path, at, line, col + 1,
                    (unsigned char)text[at]);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long sz = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    fseek(f, 0, SEEK_SET);
    char *p = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) { free(p); p = NULL; }
    fclose(f);
    if (p) { p[sz] = 0; *n = (size_t)sz; }
    return p;
}

dt_status dt_bpe_load(const char *encoder_json, const char *vocab_bpe, dt_bpe **out) {
    *out = NULL;
    size_t n;
    char *text = slurp(encoder_json, &n);
    if (!text) return dt_error(DT_ERR_IO, "%s: cannot read: %s", encoder_json, strerror(errno));
    dt_status bad = check_utf8(encoder_json, text, n);
    if (bad) { free(text); return bad; }
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) { cJSON_Delete(j); return dt_error(DT_ERR_IO, "%s: not a JSON object of token -> id", encoder_json); }
    dt_bpe *b = calloc(1, sizeof *b);
    if (!b) { cJSON_Delete(j); return dt_error(DT_ERR_NOMEM, "bpe: out of memory"); }
    byte_table(b);
    int maxid = -1;
    dt_status st = DT_OK;
    /* ids index a table: they must be whole numbers below a bound that keeps it small */
    for (cJSON *it = j->child; it && !st; it = it->next) {
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0 && it->valuedouble < DT_BPE_MAX_VOCAB) ||
            it->valuedouble != (double)it->valueint)
            st = dt_error(DT_ERR_IO, "%s: token \"%s\" needs a whole-number id from 0 to %d", encoder_json, it->string,
                          DT_BPE_MAX_VOCAB - 1);
        else if (utf8_bad((const unsigned char *)it->string, strlen(it->string)) >= 0) /* a \u escape of a lone surrogate */
            st = dt_error(DT_ERR_IO, "%s: token with id %d is not valid UTF-8 once its escapes are read", encoder_json, it->valueint);
        else if (map_put(&b->vocab, it->string, strlen(it->string), it->valueint)) st = dt_error(DT_ERR_NOMEM, "bpe: out of memory");
        else if (it->valueint > maxid) maxid = it->valueint;
    }
    if (!st) {
        b->nvocab = maxid + 1;
        b->token_bytes = calloc((size_t)b->nvocab + 1, sizeof(char *));
        b->token_len = calloc((size_t)b->nvocab + 1, sizeof(size_t));
        if (!b->token_bytes || !b->token_len) st = dt_error(DT_ERR_NOMEM, "bpe: out of memory for %d tokens", b->nvocab);
        for (cJSON *it = j->child; it && !st; it = it->next) {
            if (b->token_bytes[it->valueint]) {
                st = dt_error(DT_ERR_IO, "%s: id %d is given to two tokens (\"%s\" is the second)", encoder_json, it->valueint,
                              it->string);
                break;
            }
            char *raw = malloc(strlen(it->string) + 1);
            if (!raw) { st = dt_error(DT_ERR_NOMEM, "bpe: out of memory"); break; }
            b->token_len[it->valueint] = unmap(b, it->string, raw);
            b->token_bytes[it->valueint] = raw;
        }
    }
    cJSON_Delete(j);
    char *merges = st ? NULL : slurp(vocab_bpe, &n);
    if (!st && !merges) st = dt_error(DT_ERR_IO, "%s: cannot read: %s", vocab_bpe, strerror(errno));
    if (!st) st = check_utf8(vocab_bpe, merges, n);
    int rank = 0, line = 0;
    for (char *p = merges, *e; !st && p && *p; p = e + (*e ? 1 : 0)) {
        e = strchr(p, '\n');
        if (!e) e = p + strlen(p);
        size_t len = (size_t)(e - p);
        if (len && p[len - 1] == '\r') len--;
        line++;
        if (len == 0 || (line == 1 && p[0] == '#')) continue; /* "#version: 0.2" */
        if (!memchr(p, ' ', len)) st = dt_error(DT_ERR_IO, "%s: line %d is not \"left right\"", vocab_bpe, line);
        else if (map_put(&b->merges, p, len, rank++)) st = dt_error(DT_ERR_NOMEM, "bpe: out of memory");
    }
    free(merges);
    if (st) { dt_bpe_destroy(b); return st; }
    *out = b;
    return DT_OK;
}

int dt_bpe_vocab_size(const dt_bpe *b) { return b->nvocab; }

const char *dt_bpe_token_bytes(const dt_bpe *b, uint32_t id, size_t *len) {
    if ((int)id >= b->nvocab || !b->token_bytes[id]) return NULL;
    *len = b->token_len[id];
    return b->token_bytes[id];
}

/* ---- pre-tokenisation ---- */
enum { K_SPACE, K_LETTER, K_DIGIT, K_OTHER };

/* Class and byte length of the character at s (UTF-8). */
static int char_class(const unsigned char *s, size_t left, int *len) {
    unsigned c = s[0];
    if (c < 0x80) {
        *len = 1;
        if (c == ' ' || (c >= '\t' && c <= '\r')) return K_SPACE;
        if ((c | 32) >= 'a' && (c | 32) <= 'z') return K_LETTER;
        if (c >= '0' && c <= '9') return K_DIGIT;
        return K_OTHER;
    }
    int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if ((size_t)n > left) n = (int)left;
    *len = n;
    unsigned cp = n == 2 ? ((c & 0x1F) << 6) | (s[1] & 0x3F)
                : n == 3 ? ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F)
                : n == 4 ? ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F) : c;
    if (cp == 0xA0 || cp == 0x85 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x3000) return K_SPACE;
    if ((cp >= 0xA1 && cp <= 0xBF) || cp == 0xD7 || cp == 0xF7 || (cp >= 0x2010 && cp <= 0x2BFF) || (cp >= 0x3001 && cp <= 0x303F))
        return K_OTHER;
    if ((cp >= 0x660 && cp <= 0x669) || (cp >= 0xFF10 && cp <= 0xFF19)) return K_DIGIT;
    return n == 1 ? K_OTHER : K_LETTER;
}

/* Whitespace: all of it, but the last character is left to a word that
 * follows (GPT-2's \s+(?!\S) before \s+). */
static size_t whitespace_run(const unsigned char *s, size_t left) {
    size_t j = 0;
    int len;
    while (j < left && char_class(s + j, left - j, &len) == K_SPACE) j += (size_t)len;
    if (j < left && j > 1) {
        size_t last = j - 1;
        while (last > 0 && (s[last] & 0xC0) == 0x80) last--;
        return last;
    }
    return j;
}

/* Length of the piece starting at s. */
static size_t next_piece(const unsigned char *s, size_t left) {
    if (s[0] == '\'' && left >= 2) {
        static const char *suf[] = { "s", "t", "re", "ve", "m", "ll", "d" };
        for (int i = 0; i < 7; i++) {
            size_t k = strlen(suf[i]);
            if (left >= 1 + k && !memcmp(s + 1, suf[i], k)) return 1 + k;
        }
    }
    size_t i = s[0] == ' ' && left > 1 ? 1 : 0;
    int len, k = char_class(s + i, left - i, &len);
    if (k != K_SPACE || i == 0) {
        if (k == K_SPACE) return whitespace_run(s, left);
        size_t j = i;
        while (j < left && char_class(s + j, left - j, &len) == k) j += (size_t)len;
        return j;
    }
    return whitespace_run(s, left); /* a space followed by whitespace */
}

/* ---- merging ---- */
/* Grows *p to n elements of size es; 0 (and *p untouched) when memory is out. */
static int grow(void **p, size_t *cap, size_t n, size_t es) {
    void *g = realloc(*p, n * es);
    if (!g) return 0;
    *p = g;
    *cap = n;
    return 1;
}

dt_status dt_bpe_prompt(dt_bpe *b, const char *text, size_t len, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    uint32_t *u = NULL;
    size_t nu = 0, cap = 0;
    dt_status st = b ? dt_bpe_encode(b, text, len, &u, &nu, &cap) : DT_OK;
    size_t count = b ? nu : len;
    int32_t *t = st ? NULL : malloc(sizeof(int32_t) * (count ? count : 1));
    if (!st && !t) st = dt_error(DT_ERR_NOMEM, "out of memory for a prompt of %zu tokens", count);
    for (size_t i = 0; t && i < count; i++) t[i] = b ? (int32_t)u[i] : (unsigned char)text[i];
    free(u);
    if (st) return st;
    *ids = t;
    *n = (int)count;
    return DT_OK;
}

dt_status dt_bpe_encode(dt_bpe *b, const char *text, size_t len, uint32_t **ids, size_t *n, size_t *cap) {
    const unsigned char *s = (const unsigned char *)text;
    size_t pos = 0;
    /* symbols of the current piece: [start, end) into buf */
    size_t sym_cap = 64;
    size_t *start = malloc(sym_cap * sizeof *start), *end = malloc(sym_cap * sizeof *end);
    char *buf = malloc(64), *key = malloc(128);
    size_t buf_cap = 64, key_cap = 128;
    dt_status st = start && end && buf && key ? DT_OK : dt_error(DT_ERR_NOMEM, "bpe: out of memory");
    while (pos < len && !st) {
        size_t plen = next_piece(s + pos, len - pos);
        if (plen == 0) plen = 1;
        /* the piece as mapped characters, one symbol per byte */
        if (plen * 2 + 1 > buf_cap && !grow((void **)&buf, &buf_cap, plen * 2 + 1, 1)) break;
        if (plen > sym_cap) {
            size_t c2 = sym_cap;
            if (!grow((void **)&start, &sym_cap, plen, sizeof *start) || !grow((void **)&end, &c2, plen, sizeof *end)) break;
        }
        if (plen * 4 + 2 > key_cap && !grow((void **)&key, &key_cap, plen * 4 + 2, 1)) break;
        size_t bl = 0, ns = 0;
        for (size_t i = 0; i < plen; i++) {
            unsigned char c = s[pos + i];
            start[ns] = bl;
            memcpy(buf + bl, b->byte_utf8[c], b->byte_len[c]);
            bl += b->byte_len[c];
            end[ns++] = bl;
        }
        /* merge the lowest-ranked adjacent pair until none is listed */
        for (;;) {
            int best = -1;
            size_t at = 0;
            for (size_t i = 0; i + 1 < ns; i++) {
                size_t l1 = end[i] - start[i], l2 = end[i + 1] - start[i + 1];
                memcpy(key, buf + start[i], l1);
                key[l1] = ' ';
                memcpy(key + l1 + 1, buf + start[i + 1], l2);
                int r = map_get(&b->merges, key, l1 + 1 + l2);
                if (r >= 0 && (best < 0 || r < best)) { best = r; at = i; }
            }
            if (best < 0) break;
            /* symbols are contiguous in buf, so merging is joining ranges */
            end[at] = end[at + 1];
            memmove(start + at + 1, start + at + 2, (ns - at - 2) * sizeof *start);
            memmove(end + at + 1, end + at + 2, (ns - at - 2) * sizeof *end);
            ns--;
        }
        for (size_t i = 0; i < ns && !st; i++) {
            int id = map_get(&b->vocab, buf + start[i], end[i] - start[i]);
            if (id < 0) { st = dt_error(DT_ERR_IO, "bpe: the vocabulary lacks the symbol for byte offset %zu", pos); break; }
            if (*n == *cap) {
                *cap = *cap ? *cap * 2 : 1024;
                uint32_t *g = realloc(*ids, *cap * sizeof **ids);
                if (!g) { st = dt_error(DT_ERR_NOMEM, "bpe: out of memory"); break; }
                *ids = g;
            }
            (*ids)[(*n)++] = (uint32_t)id;
        }
        pos += plen;
    }
    free(start);
    free(end);
    free(buf);
    free(key);
    if (!st && pos < len) st = dt_error(DT_ERR_NOMEM, "bpe: out of memory for a piece at byte offset %zu", pos);
    return st;
}

dt_status dt_bpe_for_model(const char *encoder_json, const char *vocab_bpe, int vocab, const char *model, const char *who, bool say,
                           dt_bpe **out) {
    *out = NULL;
    if (!encoder_json) {
        if (vocab < 256) return dt_error(DT_ERR_ARG, "%s: %s has a vocabulary of %d; byte prompts need 256 (or give --bpe)", who, model, vocab);
        if (vocab != 256 && say)
            dt_log(DT_LOG_WARN, "%s: %s has a vocabulary of %d and no tokenizer was given: prompts are read as bytes and tokens from "
                   "256 up come back as <id> (give --bpe ENCODER.json VOCAB.bpe for GPT-2's; a byte-level model is trained with "
                   "--vocab 256)", who, model, vocab);
        return DT_OK;
    }
    dt_status st = dt_bpe_load(encoder_json, vocab_bpe, out);
    if (!st && dt_bpe_vocab_size(*out) > vocab)
        st = dt_error(DT_ERR_ARG, "%s: the tokenizer has %d tokens, the model only %d", who, dt_bpe_vocab_size(*out), vocab);
    if (st) { dt_bpe_destroy(*out); *out = NULL; }
    return st;
}
