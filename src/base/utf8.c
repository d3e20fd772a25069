/* UTF-8 as JSON's strings must be: a client's text checked (the server refuses what is not), and bytes made valid
 * (a byte-level model's text): each maximal subpart of an ill-formed sequence (the longest start of a character that
 * could still have been well formed, else one byte) becomes U+FFFD, as the Unicode standard recommends (its chapter
 * 3, "U+FFFD substitution of maximal subparts") and Python's errors="replace" and Hugging Face's decode do. */
#include "dtrain/base.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The bytes of the whole character that starts at s[i] (of n), or 0 where none does. */
static size_t whole_char(const unsigned char *s, size_t i, size_t n) {
    unsigned char c = s[i];
    size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4 : 0;
    if (need == 0 || i + need > n) return 0;
    for (size_t j = 1; j < need; j++)
        if ((s[i + j] & 0xC0) != 0x80) return 0;
    /* overlong three- and four-byte forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8 either */
    unsigned char d = need > 1 ? s[i + 1] : 0;
    if (need == 3 && ((c == 0xE0 && d < 0xA0) || (c == 0xED && d >= 0xA0))) return 0;
    if (need == 4 && ((c == 0xF0 && d < 0x90) || (c == 0xF4 && d >= 0x90))) return 0;
    return need;
}

/* The bytes of the maximal subpart at s[i] (of n) where no whole character starts there: the lead byte and the
 * continuation bytes that keep it a possible start (Unicode's table 3-7 of well-formed sequences), at least 1. */
static size_t maximal_subpart(const unsigned char *s, size_t i, size_t n) {
    unsigned char c = s[i], lo = 0x80, hi = 0xBF;
    size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    size_t k = 1;
    if (need > 1 && i + 1 < n && s[i + 1] >= lo && s[i + 1] <= hi)
        for (k = 2; k < need && i + k < n && (s[i + k] & 0xC0) == 0x80;) k++;
    return k;
}

size_t dt_utf8_find_invalid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    for (size_t w; i < n && (w = whole_char(u, i, n)) > 0;) i += w;
    return i;
}

char *dt_utf8_clean(const char *s, size_t n, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    char *o = malloc(n * 3 + 1); /* at most each byte becomes U+FFFD's three */
    size_t k = 0;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        size_t need = whole_char(u, i, n);
        if (need == 0 || u[i] == 0) { /* JSON strings may hold a NUL escaped, but C strings cannot */
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i += need ? 1 : maximal_subpart(u, i, n);
            continue;
        }
        memcpy(o + k, s + i, need);
        k += need;
        i += need;
    }
    o[k] = 0;
    if (out_len) *out_len = k;
    return o;
}
