/* Byte-level BPE (GPT-2's, and any tokenizer.json of its kind: Llama 3, Qwen 2).
 *
 * Every byte maps to a printable unicode character (bytes that print as
 * themselves keep their code, the others get 256 + n), so a token is a
 * string of such characters. Text is first split at the added tokens (each
 * its own id), each segment between them is cut into pieces by the
 * pre-tokenizer's pattern (GPT-2's, or Llama 3's: matched by PCRE2), then
 * each piece's characters are merged pairwise, always the pair with the
 * lowest rank first, until no pair is listed (a piece that is itself a token
 * is taken whole where the tokenizer ignores merges). */
#include "bpe_internal.h"

#include <errno.h>
#include <stdio.h>
#include <uninorm.h>
#include <stdlib.h>
#include <string.h>

const char *const dt_bpe_llama3_pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                           "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char *const dt_bpe_qwen2_pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char *const dt_bpe_gpt2_pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- the string -> int map ---- */
static uint64_t fnv(const char *k, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
    return h;
}

static bool same_key(const char *key, const char *k, size_t n) { return strlen(key) == n && !memcmp(key, k, n); }

int bpe_map_put(bpe_map *m, const char *k, size_t n, int v) {
    if ((m->n + 1) * 2 > m->cap) {
        bpe_map g = { calloc(m->cap ? m->cap * 2 : 1024, sizeof(bpe_slot)), m->cap ? m->cap * 2 : 1024, 0 };
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
    while (m->s[j].key && !same_key(m->s[j].key, k, n)) j = (j + 1) & (m->cap - 1);
    if (!m->s[j].key) {
        if (!(m->s[j].key = malloc(n + 1))) return -1;
        memcpy(m->s[j].key, k, n);
        m->s[j].key[n] = 0;
        m->n++;
    }
    m->s[j].val = v;
    return 0;
}

int bpe_map_get(const bpe_map *m, const char *k, size_t n) {
    if (!m->cap) return -1;
    for (size_t j = fnv(k, n) & (m->cap - 1); m->s[j].key; j = (j + 1) & (m->cap - 1))
        if (same_key(m->s[j].key, k, n)) return m->s[j].val;
    return -1;
}

static void map_free(bpe_map *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->s[i].key);
    free(m->s);
}

/* ---- bytes and characters ---- */
static int utf8_put(char *out, unsigned cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* GPT-2's mapping never exceeds U+0143 */
}

void bpe_byte_table(dt_bpe *b) {
    int extra = 0;
    for (int c = 0; c < 256; c++) {
        int prints = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        unsigned cp = prints ? (unsigned)c : 256u + (unsigned)extra++;
        b->byte_len[c] = (unsigned char)utf8_put(b->byte_utf8[c], cp);
    }
}

void dt_bpe_byte_char(int byte, char out[3]) {
    dt_bpe t;
    bpe_byte_table(&t);
    memcpy(out, t.byte_utf8[byte & 0xFF], t.byte_len[byte & 0xFF]);
    out[t.byte_len[byte & 0xFF]] = 0;
}

/* A character outside the mapping (or a lead byte the string ends after) is dropped, never read past. */
size_t bpe_unmap(const dt_bpe *b, const char *s, char *out) {
    size_t n = 0;
    while (*s) {
        int k = ((unsigned char)*s < 0x80 || !s[1]) ? 1 : 2;
        unsigned cp = k == 1 ? (unsigned char)*s : (((unsigned char)s[0] & 0x1F) << 6) | ((unsigned char)s[1] & 0x3F);
        for (int c = 0; c < 256; c++) {
            char tmp[3];
            int l = utf8_put(tmp, cp);
            if (l == b->byte_len[c] && !memcmp(tmp, b->byte_utf8[c], (size_t)l)) { out[n++] = (char)c; break; }
        }
        s += k;
    }
    return n;
}

/* RFC 3629: no overlong forms, surrogates or code points past U+10FFFF; a lead byte the text ends after is bad. */
long bpe_utf8_bad(const unsigned char *s, size_t n) {
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

dt_status bpe_add_merge(dt_bpe *b, const char *key, size_t len) {
    if (b->nmerges == b->merge_cap) {
        int cap = b->merge_cap ? 2 * b->merge_cap : 1024;
        char **g = realloc(b->merge_list, sizeof *g * (size_t)cap);
        if (!g) return dt_error(DT_ERR_NOMEM, "bpe: out of memory");
        b->merge_list = g, b->merge_cap = cap;
    }
    char *k = malloc(len + 1);
    if (!k || bpe_map_put(&b->merges, key, len, b->nmerges)) { free(k); return dt_error(DT_ERR_NOMEM, "bpe: out of memory"); }
    memcpy(k, key, len);
    k[len] = 0;
    b->merge_list[b->nmerges++] = k;
    return DT_OK;
}

dt_status bpe_compile(dt_bpe *b, const char *pattern, const char *where) {
    free(b->pattern);
    if (!(b->pattern = malloc(strlen(pattern) + 1))) return dt_error(DT_ERR_NOMEM, "bpe: out of memory");
    memcpy(b->pattern, pattern, strlen(pattern) + 1);
    int err;
    PCRE2_SIZE at;
    b->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
    if (!b->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dt_error(DT_ERR_IO, "%s: the pattern does not compile at character %zu (%s): %s", where, (size_t)at, (const char *)msg,
                        pattern);
    }
    pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE); /* where JIT is not built, matching interprets */
    return DT_OK;
}

void dt_bpe_destroy(dt_bpe *b) {
    if (!b) return;
    map_free(&b->vocab);
    map_free(&b->merges);
    for (int i = 0; b->token_bytes && i < b->nvocab; i++) free(b->token_bytes[i]);
    for (int i = 0; b->token_text && i < b->nvocab; i++) free(b->token_text[i]);
    for (int i = 0; i < b->nmerges; i++) free(b->merge_list[i]);
    free(b->token_text);
    free(b->merge_list);
    free(b->pattern);
    for (int i = 0; i < b->nadded; i++) free(b->added[i].content);
    free(b->added);
    free(b->token_bytes);
    free(b->token_len);
    pcre2_code_free(b->re);
    free(b);
}

int dt_bpe_vocab_size(const dt_bpe *b) { return b->nvocab; }
int dt_bpe_bos(const dt_bpe *b) { return b ? b->bos : -1; }

const char *dt_bpe_token_text(const dt_bpe *b, uint32_t id, int *added) {
    *added = 0;
    if ((int)id >= b->nvocab || !b->token_text || !b->token_text[id]) return NULL;
    for (int i = 0; i < b->nadded; i++)
        if (b->added[i].id == (int)id) *added = b->added[i].special ? 2 : 1;
    return b->token_text[id];
}
int dt_bpe_merge_count(const dt_bpe *b) { return b->nmerges; }
const char *dt_bpe_merge(const dt_bpe *b, int rank) { return rank >= 0 && rank < b->nmerges ? b->merge_list[rank] : NULL; }
const char *dt_bpe_pattern(const dt_bpe *b) { return b->pattern; }

const char *dt_bpe_token_bytes(const dt_bpe *b, uint32_t id, size_t *len) {
    if ((int)id >= b->nvocab || !b->token_bytes[id]) return NULL;
    *len = b->token_len[id];
    return b->token_bytes[id];
}

const char *dt_token_text(const dt_bpe *b, int32_t id, char scratch[16], size_t *len) {
    const char *t = b && id >= 0 ? dt_bpe_token_bytes(b, (uint32_t)id, len) : NULL;
    if (t) return t;
    if (!b && id >= 0 && id < 256) { scratch[0] = (char)id, *len = 1; return scratch; }
    *len = (size_t)snprintf(scratch, 16, "<%d>", (int)id);
    return scratch;
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

/* One encode's scratch: a piece's symbols [start, end) into buf (its mapped characters), a pair's key; the ids out. */
typedef struct {
    size_t *start, *end, sym_cap;
    char *buf, *key;
    size_t buf_cap, key_cap;
    uint32_t **ids;
    size_t *n, *cap;
} work;

static dt_status push(work *w, int id) {
    if (*w->n == *w->cap) {
        size_t c = *w->cap ? *w->cap * 2 : 1024;
        uint32_t *g = realloc(*w->ids, c * sizeof **w->ids);
        if (!g) return dt_error(DT_ERR_NOMEM, "bpe: out of memory");
        *w->ids = g;
        *w->cap = c;
    }
    (*w->ids)[(*w->n)++] = (uint32_t)id;
    return DT_OK;
}

/* The lowest-ranked adjacent pair's rank (-1: none listed) and where it is. */
static int best_pair(const dt_bpe *b, work *w, size_t ns, size_t *at) {
    int best = -1;
    for (size_t i = 0; i + 1 < ns; i++) {
        size_t l1 = w->end[i] - w->start[i], l2 = w->end[i + 1] - w->start[i + 1];
        memcpy(w->key, w->buf + w->start[i], l1);
        w->key[l1] = ' ';
        memcpy(w->key + l1 + 1, w->buf + w->start[i + 1], l2);
        int r = bpe_map_get(&b->merges, w->key, l1 + 1 + l2);
        if (r >= 0 && (best < 0 || r < best)) best = r, *at = i;
    }
    return best;
}

/* One piece s[0, len) (at: its offset in the text, for messages): its ids appended. */
static dt_status piece(const dt_bpe *b, work *w, const unsigned char *s, size_t len, size_t at) {
    if ((len * 2 + 1 > w->buf_cap && !grow((void **)&w->buf, &w->buf_cap, len * 2 + 1, 1)) ||
        (len * 4 + 2 > w->key_cap && !grow((void **)&w->key, &w->key_cap, len * 4 + 2, 1)))
        return dt_error(DT_ERR_NOMEM, "bpe: out of memory for a piece of %zu bytes at byte offset %zu", len, at);
    if (len > w->sym_cap) {
        size_t c2 = w->sym_cap;
        if (!grow((void **)&w->start, &w->sym_cap, len, sizeof *w->start) || !grow((void **)&w->end, &c2, len, sizeof *w->end))
            return dt_error(DT_ERR_NOMEM, "bpe: out of memory for a piece of %zu bytes at byte offset %zu", len, at);
    }
    size_t bl = 0, ns = 0;
    for (size_t i = 0; i < len; i++) { /* one symbol per byte */
        w->start[ns] = bl;
        memcpy(w->buf + bl, b->byte_utf8[s[i]], b->byte_len[s[i]]);
        bl += b->byte_len[s[i]];
        w->end[ns++] = bl;
    }
    int whole = b->ignore_merges ? bpe_map_get(&b->vocab, w->buf, bl) : -1;
    if (whole >= 0) return push(w, whole);
    size_t at_pair = 0;
    while (best_pair(b, w, ns, &at_pair) >= 0) { /* symbols are contiguous in buf: merging joins ranges */
        w->end[at_pair] = w->end[at_pair + 1];
        memmove(w->start + at_pair + 1, w->start + at_pair + 2, (ns - at_pair - 2) * sizeof *w->start);
        memmove(w->end + at_pair + 1, w->end + at_pair + 2, (ns - at_pair - 2) * sizeof *w->end);
        ns--;
    }
    for (size_t i = 0; i < ns; i++) {
        int id = bpe_map_get(&b->vocab, w->buf + w->start[i], w->end[i] - w->start[i]);
        if (id < 0) return dt_error(DT_ERR_IO, "bpe: the vocabulary lacks the symbol for byte offset %zu", at);
        dt_status st = push(w, id);
        if (st) return st;
    }
    return DT_OK;
}

/* Valid UTF-8 s[0, len) cut by the pattern: each match a piece, and each gap between matches (HF's "isolated"). */
static dt_status pieces(const dt_bpe *b, work *w, pcre2_match_data *md, const unsigned char *s, size_t len, size_t at) {
    if (!b->re) return len ? piece(b, w, s, len, at) : DT_OK;
    dt_status st = DT_OK;
    for (size_t pos = 0; pos < len && !st;) {
        int rc = pcre2_match(b->re, s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) return dt_error(DT_ERR_IO, "bpe: the pattern failed at byte offset %zu (PCRE2 %d)", at + pos, rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = rc < 0 ? len : ov[0], me = rc < 0 ? len : ov[1];
        if (me == ms && ms < len) /* an empty match: the character there is a piece of its own */
            for (me = ms + 1; me < len && (s[me] & 0xC0) == 0x80; me++) {}
        if (ms > pos) st = piece(b, w, s + pos, ms - pos, at + pos);
        if (!st && me > ms) st = piece(b, w, s + ms, me - ms, at + ms);
        pos = me;
    }
    return st;
}

/* Valid UTF-8 s[0, len) in Unicode NFC (composed: "e" + U+0301 is "\u00e9"), then cut into pieces. */
static dt_status normalized_pieces(const dt_bpe *b, work *w, pcre2_match_data *md, const unsigned char *s, size_t len, size_t at) {
    if (!len) return DT_OK;
    size_t n = 0;
    uint8_t *t = u8_normalize(UNINORM_NFC, s, len, NULL, &n);
    if (!t) return dt_error(errno == ENOMEM ? DT_ERR_NOMEM : DT_ERR_IO, "bpe: NFC of %zu bytes at byte offset %zu failed", len, at);
    dt_status st = pieces(b, w, md, t, n, at);
    free(t);
    return st;
}

/* A segment between added tokens: a space first where ByteLevel adds one; runs of UTF-8 cut into pieces, and a byte
 * that is not UTF-8 a piece of its own (byte-level BPE has a token for every byte). */
static dt_status segment(const dt_bpe *b, work *w, pcre2_match_data *md, const unsigned char *s, size_t len, size_t at) {
    if (!len) return DT_OK;
    if (b->prefix_space && s[0] != ' ') {
        unsigned char *t = malloc(len + 1);
        if (!t) return dt_error(DT_ERR_NOMEM, "bpe: out of memory");
        t[0] = ' ';
        memcpy(t + 1, s, len);
        dt_bpe tmp = *b;
        tmp.prefix_space = false;
        dt_status st = segment(&tmp, w, md, t, len + 1, at);
        free(t);
        return st;
    }
    dt_status st = DT_OK;
    for (size_t pos = 0; pos < len && !st;) {
        long bad = bpe_utf8_bad(s + pos, len - pos);
        size_t run = bad < 0 ? len - pos : (size_t)bad;
        st = b->nfc ? normalized_pieces(b, w, md, s + pos, run, at + pos) : pieces(b, w, md, s + pos, run, at + pos);
        pos += run;
        if (!st && pos < len) st = piece(b, w, s + pos, 1, at + pos), pos++;
    }
    return st;
}

/* The added token (the longest of those that match) at s, or NULL. */
static const bpe_added *added_at(const dt_bpe *b, const unsigned char *s, size_t left) {
    if (!b->added_first[s[0]]) return NULL;
    for (int i = 0; i < b->nadded; i++) /* longest first */
        if (b->added[i].len <= left && !memcmp(s, b->added[i].content, b->added[i].len)) return &b->added[i];
    return NULL;
}

dt_status dt_bpe_encode(dt_bpe *b, const char *text, size_t len, uint32_t **ids, size_t *n, size_t *cap) {
    const unsigned char *s = (const unsigned char *)text;
    work w = { .sym_cap = 64, .buf_cap = 64, .key_cap = 128, .ids = ids, .n = n, .cap = cap };
    w.start = malloc(w.sym_cap * sizeof *w.start);
    w.end = malloc(w.sym_cap * sizeof *w.end);
    w.buf = malloc(w.buf_cap);
    w.key = malloc(w.key_cap);
    pcre2_match_data *md = b->re ? pcre2_match_data_create_from_pattern(b->re, NULL) : NULL;
    dt_status st = w.start && w.end && w.buf && w.key && (md || !b->re) ? DT_OK : dt_error(DT_ERR_NOMEM, "bpe: out of memory");
    size_t from = 0;
    for (size_t i = 0; i < len && !st;) {
        const bpe_added *a = added_at(b, s + i, len - i);
        if (!a) { i++; continue; }
        st = segment(b, &w, md, s + from, i - from, from);
        if (!st) st = push(&w, a->id);
        from = i += a->len;
    }
    if (!st) st = segment(b, &w, md, s + from, len - from, from);
    pcre2_match_data_free(md);
    free(w.start);
    free(w.end);
    free(w.buf);
    free(w.key);
    return st;
}

dt_status dt_bpe_prompt(dt_bpe *b, const char *text, size_t len, bool bos, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    uint32_t *u = NULL;
    size_t nu = 0, cap = 0;
    dt_status st = DT_OK;
    if (bos && b && b->bos >= 0) { /* the tokenizer's template puts its begin-of-text token first */
        if (!(u = malloc(sizeof *u * 16))) return dt_error(DT_ERR_NOMEM, "out of memory for a prompt");
        u[nu++] = (uint32_t)b->bos;
        cap = 16;
    }
    if (b) st = dt_bpe_encode(b, text, len, &u, &nu, &cap);
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
