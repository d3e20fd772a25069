/* Bytes made valid UTF-8, as JSON's strings must be (a byte-level model's text, a client's): each byte that does not
 * start a whole character becomes U+FFFD, as Python's errors="replace" decodes it. */
#include "dtrain/base.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

char *dt_utf8_clean(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(n * 3 + 1); /* each bad byte becomes U+FFFD's three */
    size_t k = 0;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4 : 0;
        bool good = need > 0 && i + need <= n;
        for (size_t j = 1; good && j < need; j++) good = ((unsigned char)s[i + j] & 0xC0) == 0x80;
        /* overlong three-byte forms and UTF-16 surrogates are not UTF-8 either */
        if (good && need == 3) {
            unsigned char d = (unsigned char)s[i + 1];
            good = !(c == 0xE0 && d < 0xA0) && !(c == 0xED && d >= 0xA0);
        }
        if (good && need == 4) {
            unsigned char d = (unsigned char)s[i + 1];
            good = !(c == 0xF0 && d < 0x90) && !(c == 0xF4 && d >= 0x90);
        }
        if (good && c == 0) good = false; /* JSON strings may hold it escaped, but C strings cannot */
        if (!good) { memcpy(o + k, "\xEF\xBF\xBD", 3); k += 3; i++; continue; }
        memcpy(o + k, s + i, need);
        k += need;
        i += need;
    }
    o[k] = 0;
    if (out_len) *out_len = k;
    return o;
}
