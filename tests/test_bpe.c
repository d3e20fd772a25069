/* GPT-2 BPE against Hugging Face tokenizers (scripts/make_bpe_fixtures.py):
 * the same ids for every test string, and decoding gives the text back.
 * usage: test_bpe FIXTURE_DIR/bpe */
#include "dtrain/data.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A tokenizer file that is not UTF-8 is refused naming the place, as Python's json and HF's tokenizers refuse it. */
static void not_utf8(const char *merges, int *passed, int *failed) {
    static const struct { const char *json, *why, *want; } cases[] = {
        { "{\"ab\xc3\": 0}", "a key ending in a lone lead byte", "not valid UTF-8 at byte 4 (line 1, column 5: byte 0xc3)" },
        { "{\"a\": 0,\n\"\xc0\xaf\": 1}", "an overlong '/' on line 2", "line 2, column 2: byte 0xc0" },
        { "{\"\xed\xa0\x80\": 0}", "an encoded surrogate", "byte 0xed" },
        { "{\"\xe2\x82\xac\": 0, \"\xf0\x9f\x98\x80\": 1}", "a valid 3- and 4-byte character", NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[] = "/tmp/test_bpe_XXXXXX";
        int fd = mkstemp(path);
        FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
        if (!f) { printf("FAIL: cannot write a temporary file\n"); (*failed)++; return; }
        fputs(cases[i].json, f);
        fclose(f);
        dt_bpe *b = NULL;
        dt_status st = dt_bpe_load(path, merges, &b);
        int good = cases[i].want ? st != DT_OK && strstr(dt_last_error(), cases[i].want) != NULL : st == DT_OK;
        if (good) (*passed)++;
        else { (*failed)++; printf("FAIL %s: %s\n", cases[i].why, st ? dt_last_error() : "loaded"); }
        dt_bpe_destroy(b);
        unlink(path);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char enc[1024], merges[1024], exp[1024];
    snprintf(enc, sizeof enc, "%s/encoder.json", argv[1]);
    snprintf(merges, sizeof merges, "%s/vocab.bpe", argv[1]);
    snprintf(exp, sizeof exp, "%s/expected.json", argv[1]);
    dt_bpe *b;
    if (dt_bpe_load(enc, merges, &b)) { printf("FAIL load: %s\n", dt_last_error()); return 1; }
    FILE *f = fopen(exp, "rb");
    static char text[1 << 16];
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = 0;
    cJSON *cases = cJSON_Parse(text);
    if (!cJSON_IsArray(cases)) { printf("FAIL: cannot read %s\n", exp); return 1; }
    int passed = 0, failed = 0;
    for (cJSON *c = cases->child; c; c = c->next) {
        const char *s = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "ids");
        uint32_t *ids = NULL;
        size_t nid = 0, cap = 0;
        if (dt_bpe_encode(b, s, strlen(s), &ids, &nid, &cap)) { printf("FAIL encode \"%s\": %s\n", s, dt_last_error()); failed++; continue; }
        int same = (int)nid == cJSON_GetArraySize(want);
        for (size_t i = 0; same && i < nid; i++) same = (int)ids[i] == cJSON_GetArrayItem(want, (int)i)->valueint;
        char back[4096];
        size_t bl = 0;
        for (size_t i = 0; i < nid; i++) {
            size_t l;
            const char *t = dt_bpe_token_bytes(b, ids[i], &l);
            if (t && bl + l < sizeof back) { memcpy(back + bl, t, l); bl += l; }
        }
        int round = bl == strlen(s) && !memcmp(back, s, bl);
        if (same && round) passed++;
        else {
            failed++;
            printf("FAIL \"%s\": %zu ids (want %d)%s; ids:", s, nid, cJSON_GetArraySize(want), round ? "" : ", decode differs");
            for (size_t i = 0; i < nid; i++) printf(" %u", ids[i]);
            printf("\n");
        }
        free(ids);
    }
    cJSON_Delete(cases);
    dt_bpe_destroy(b);
    not_utf8(merges, &passed, &failed);
    printf("bpe: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
