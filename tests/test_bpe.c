/* GPT-2 BPE against Hugging Face tokenizers (scripts/make_bpe_fixtures.py):
 * the same ids for every test string, and decoding gives the text back.
 * usage: test_bpe FIXTURE_DIR/bpe */
#include "dtrain/data.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    printf("bpe: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
