/* Word-wise FNV-1a: not cryptographic, only to notice that two stores (or a
 * file and what was written) differ. */
#include "dtrain/base.h"

#include <string.h>

uint64_t dt_hash_words(uint64_t h, const void *words, size_t n) {
    const unsigned char *b = words;
    for (size_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, b + 4 * i, 4);
        h = (h ^ w) * 1099511628211ull;
    }
    return h;
}
