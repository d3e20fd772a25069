/* dtrain serve's request parser (a /v1/completions body, and the same bytes as a /v1/chat/completions one) and its
 * UTF-8 cleaning: any bytes give a request or a message, never a crash; a request taken was UTF-8; cleaned text is
 * valid UTF-8 (cleaning it again changes nothing), and text that was valid, with no NUL, comes out unchanged. */
#include "serve/serve_internal.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    serve_vocab v = { .bpe = NULL, .vocab = 256, .eot = -1, .chat = DT_CHAT_NONE };
    serve_params p;
    const char *param;
    for (int chat = 0; chat < 2; chat++)
        if (serve_params_parse((const char *)data, n, &v, 64, chat, &p, &param) == DT_OK) {
            /* (a completion of max_tokens 0 scores its prompt alone; a chat draws at least one) */
            if (p.nprompt < 1 || p.nprompt + p.max_tokens > 64 || p.max_tokens < !!chat || dt_sampling_check(&p.sampling)) abort();
            if (p.n < 1 || p.n > 128 || p.top < 0 || p.top > SERVE_MAX_TOP || p.nbias < 0 || p.nbias > v.vocab) abort();
            if (p.prompt_top < 0 || p.prompt_top > SERVE_MAX_TOP || (p.prompt_lps && (chat || p.stream))) abort();
            for (int i = 0; i < p.nbias; i++)
                if (p.bias[i].token < 0 || p.bias[i].token >= v.vocab || p.sampling.logit_bias != p.bias) abort();
            if (p.nstop_ids > 64 || p.sampling.min_tokens > p.max_tokens || p.sampling.suppress != p.suppress) abort();
            for (int i = 0; i < p.nstop_ids; i++)
                if (p.stop_ids[i] < 0 || p.stop_ids[i] >= v.vocab) abort();
            if (dt_utf8_find_invalid((const char *)data, n) != n) abort();
            serve_params_free(&p);
        }
    size_t m, m2;
    char *a = dt_utf8_clean((const char *)data, n, &m);
    char *b = a ? dt_utf8_clean(a, m, &m2) : NULL;
    if (a && (!b || m2 != m || memcmp(a, b, m) || dt_utf8_find_invalid(a, m) != m)) abort();
    bool valid = dt_utf8_find_invalid((const char *)data, n) == n && !memchr(data, 0, n);
    if (a && valid && (m != n || memcmp(a, data, n))) abort();
    free(a);
    free(b);
    return 0;
}
