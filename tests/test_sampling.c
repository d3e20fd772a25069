/* The sampler's filters (the repetition penalty, temperature, top-k, top-p, min-p) against Hugging Face's logits
 * processors in generate's order, and OpenAI's logit_bias and presence/frequency penalties as its API reference
 * defines them in vLLM's order (tests/fixtures/sampling/cases.safetensors, scripts/make_sampling_fixture.py): the
 * penalized logits exactly, the same tokens kept, and draws that land only on them, each of a case's few reached. */
#include "dtrain/infer.h"
#include "fixture_checks.h"

enum { ROWS = 3, V = 64, DRAWS = 4000 };

static int by_id(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

/* A case's row, biased and penalized as its "logit_bias", "repetition_penalty" with "ids" (the sequence's tokens) and
 * presence and frequency penalties with "drawn" say, as the batcher does: whether it is the fixture's "penalized.<k>"
 * bit for bit (true without any). */
static bool penalized(dt_safetensors *f, int k, const cJSON *c, const dt_sampling *s, float *row) {
    uint64_t seen[(V + 63) / 64] = { 0 };
    int32_t counts[V] = { 0 };
    const cJSON *id;
    float want[V];
    char key[32];
    if (s->repetition_penalty == 0 && s->presence_penalty == 0 && s->frequency_penalty == 0 && !s->nlogit_bias) return true;
    cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(c, "ids")) dt_token_set_add(seen, id->valueint);
    cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(c, "drawn")) counts[id->valueint]++;
    dt_sample_bias(row, V, s);
    dt_sample_penalize(row, V, s->repetition_penalty, seen);
    dt_sample_penalize_counts(row, V, s->presence_penalty, s->frequency_penalty, counts);
    snprintf(key, sizeof key, "penalized.%d", k);
    return !dt_safetensors_read(f, key, 1, (const int[]){ V }, 0, want) && !memcmp(want, row, sizeof want);
}

/* One case: the kept set's and the draws' verdicts into *set_ok, *draw_ok. */
static dt_status one_case(dt_safetensors *f, int k, const float *logits, const cJSON *c, bool *set_ok, bool *draw_ok) {
    double pen = fixture_number(c, "repetition_penalty"), pres = fixture_number(c, "presence_penalty"),
           freq = fixture_number(c, "frequency_penalty");
    dt_logit_bias bias[V];
    int nbias = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(c, "logit_bias"))
        if (nbias < V) bias[nbias++] = (dt_logit_bias){ atoi(b->string), (float)b->valuedouble };
    dt_sampling s = { .temperature = (float)fixture_number(c, "temperature"), .top_k = (int)fixture_number(c, "top_k"),
                      .top_p = (float)fixture_number(c, "top_p"), .min_p = (float)fixture_number(c, "min_p"),
                      .repetition_penalty = isnan(pen) ? 0 : (float)pen, .presence_penalty = isnan(pres) ? 0 : (float)pres,
                      .frequency_penalty = isnan(freq) ? 0 : (float)freq, .logit_bias = bias, .nlogit_bias = nbias };
    float row[V];
    memcpy(row, logits + (int)fixture_number(c, "row") * V, sizeof row);
    bool pen_ok = penalized(f, k, c, &s, row);
    int n = (int)fixture_number(c, "kept"), seen[V] = { 0 };
    int32_t want[V], got[V];
    char key[32];
    void *scratch = malloc(dt_sample_scratch_bytes(V));
    snprintf(key, sizeof key, "kept.%d", k);
    dt_status st = scratch ? dt_sampling_check(&s) : dt_error(DT_ERR_NOMEM, "out of memory");
    if (!st && !(n >= 1 && n <= V)) st = dt_error(DT_ERR_IO, "case %d: a count of %d kept tokens", k, n);
    if (!st) st = dt_safetensors_read_i32(f, key, (size_t)n, want);
    int kept = st ? 0 : dt_sample_candidates(row, V, &s, scratch, got);
    qsort(got, (size_t)kept, sizeof *got, by_id);
    *set_ok = !st && pen_ok && kept == n && !memcmp(got, want, sizeof *got * (size_t)n);
    uint64_t rng = 1234 + (uint64_t)k;
    bool inside = true;
    for (int d = 0; !st && d < DRAWS; d++) {
        int32_t t = dt_sample_token(row, V, &s, &rng, scratch);
        bool in = false;
        for (int i = 0; i < n; i++) in |= want[i] == t;
        inside &= in, seen[t] = 1;
    }
    int reached = 0;
    for (int i = 0; i < n; i++) reached += seen[want[i]];
    *draw_ok = inside && (n > 8 || reached == n); /* (a few tokens each at least min_p of the most likely: every one drawn) */
    if (!*set_ok || !*draw_ok)
        printf("   case %d: penalized as HF's %d, %d tokens kept against Hugging Face's %d; draws inside %d, %d of them reached\n", k, pen_ok,
               kept, n, inside, reached);
    free(scratch);
    return st;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    char path[600];
    snprintf(path, sizeof path, "%s/sampling/cases.safetensors", dir);
    dt_safetensors *f = NULL;
    cJSON *cases = NULL;
    float logits[ROWS * V];
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = fixture_settings(f, path, "cases", &cases);
    if (!st) st = dt_safetensors_read(f, "logits", 2, (const int[]){ ROWS, V }, 0, logits);
    int k = 0, sets = 0, draws = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        bool set_ok = false, draw_ok = false;
        if (!st) st = one_case(f, k, logits, c, &set_ok, &draw_ok);
        sets += set_ok, draws += draw_ok, k++;
    }
    char what[160], detail[96];
    snprintf(what, sizeof what, "%d cases (logit bias, repetition, presence and frequency penalties, temperature, top-k, top-p, "
             "min-p): the logits and tokens kept are the oracle's", k);
    snprintf(detail, sizeof detail, "%d of %d", sets, k);
    if (!st) check(what, k >= 14 && sets == k, detail);
    snprintf(what, sizeof what, "%d draws a case land only on them (each of a few reached)", DRAWS);
    snprintf(detail, sizeof detail, "%d of %d", draws, k);
    if (!st) check(what, k >= 14 && draws == k, detail);
    dt_logit_bias inf = { 3, INFINITY };
    dt_sampling bad = { .temperature = 1, .top_p = 1, .min_p = 1.5f }, neg = { .temperature = 1, .top_p = 1, .repetition_penalty = -1 },
                nanp = { .temperature = 1, .top_p = 1, .presence_penalty = NAN },
                infb = { .temperature = 1, .top_p = 1, .logit_bias = &inf, .nlogit_bias = 1 };
    bool refused = dt_sampling_check(&bad) && strstr(dt_last_error(), "min_p");
    check("refused: min_p above 1", refused, dt_last_error());
    refused = dt_sampling_check(&neg) && strstr(dt_last_error(), "repetition_penalty");
    check("refused: a negative repetition penalty", refused, dt_last_error());
    refused = dt_sampling_check(&nanp) && strstr(dt_last_error(), "presence_penalty");
    check("refused: a presence penalty of NaN", refused, dt_last_error());
    refused = dt_sampling_check(&infb) && strstr(dt_last_error(), "logit_bias of token 3");
    check("refused: an infinite logit bias", refused, dt_last_error());
    if (st) printf("FAIL sampling: %s\n", dt_last_error()), failed++;
    cJSON_Delete(cases);
    dt_safetensors_close(f);
    printf("%s\n", failed ? "test_sampling: FAILED" : "test_sampling: all passed");
    return failed != 0;
}
