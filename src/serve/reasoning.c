/* A thinking model's answer (Qwen 3's template: the answer opens with <think>, its reasoning, </think>, then what it
 * says) split as vLLM's reasoning parser and llama.cpp's server split it: the reasoning (the bytes between the markers,
 * as they are) for the message's reasoning_content, the rest for its content. An answer that does not open with
 * <think> is all content; one cut short before </think> is all reasoning. A stream sends only settled bytes: those a
 * later byte cannot turn into a marker. */
#include "serve_internal.h"

#include <string.h>

#define OPEN "<think>"
#define CLOSE "</think>"

/* The bytes at the end of [a, a + n) that could start CLOSE (a proper prefix of it): held back until known. */
static size_t partial_close(const char *a, size_t n) {
    for (size_t k = n < strlen(CLOSE) - 1 ? n : strlen(CLOSE) - 1; k > 0; k--)
        if (!memcmp(a + n - k, CLOSE, k)) return k;
    return 0;
}

void serve_reasoning_split(const char *t, size_t n, bool final, serve_split *s) {
    size_t o = strlen(OPEN);
    *s = (serve_split){ 0 };
    if (n == 0) return; /* (no text yet: t may be NULL) */
    if (n < o && !memcmp(t, OPEN, n) && !final) return; /* perhaps the opening marker: nothing known yet */
    if (n < o || memcmp(t, OPEN, o)) { /* no reasoning */
        s->settled = n;
        return;
    }
    s->thinks = true, s->r0 = o;
    const char *close = NULL;
    for (const char *p = t + o; p + strlen(CLOSE) <= t + n; p++) /* (the text may hold NULs: no strstr) */
        if (!memcmp(p, CLOSE, strlen(CLOSE))) { close = p; break; }
    if (close) {
        s->r1 = (size_t)(close - t), s->c0 = s->r1 + strlen(CLOSE), s->settled = n;
        return;
    }
    s->r1 = final ? n : n - partial_close(t + o, n - o);
    s->c0 = n, s->settled = s->r1;
}

void serve_reasoning_next(const serve_split *s, size_t sent_r, size_t sent_c, size_t *r_at, size_t *r_n, size_t *c_at, size_t *c_n) {
    size_t r_to = s->settled < s->r1 ? s->settled : s->r1;
    *r_at = s->r0 + sent_r, *c_at = s->c0 + sent_c;
    *r_n = s->thinks && r_to > *r_at ? r_to - *r_at : 0;
    *c_n = s->settled > *c_at ? s->settled - *c_at : 0;
}
