/* GPT-2 BPE: encoder.json and vocab.bpe, then encoding a text with them.
 * The input is cut at its first two NUL bytes: encoder.json, vocab.bpe, text. */
#include "dtrain/data.h"
#include "memfile.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const uint8_t *a = data, *end = data + n, *z1 = memchr(a, 0, n), *b = z1 ? z1 + 1 : end;
    const uint8_t *z2 = b < end ? memchr(b, 0, (size_t)(end - b)) : NULL, *t = z2 ? z2 + 1 : end;
    size_t na = (size_t)((z1 ? z1 : end) - a), nb = (size_t)((z2 ? z2 : end) - b), nt = (size_t)(end - t);
    dt_bpe *bpe = NULL;
    if (dt_bpe_load(dt_fuzz_file(0, a, na), dt_fuzz_file(1, b, nb), &bpe) == DT_OK) {
        uint32_t *ids = NULL;
        size_t count = 0, cap = 0;
        if (dt_bpe_encode(bpe, (const char *)t, nt, &ids, &count, &cap) == DT_OK)
            for (size_t i = 0; i < count; i++) {
                size_t len;
                dt_bpe_token_bytes(bpe, ids[i], &len);
            }
        free(ids);
        dt_bpe_destroy(bpe);
    }
    return 0;
}
