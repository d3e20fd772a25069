/* llm.c token files: header, count against the file's size, the vocabulary check. */
#include "dtrain/data.h"
#include "memfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    dt_tokens *t = NULL;
    if (dt_tokens_open(dt_fuzz_file(0, data, n), &t) == DT_OK) {
        dt_tokens_check_vocab(t, 50257);
        dt_loader *l = NULL;
        if (dt_loader_create(t, 2, 4, 0, 1, 7, false, &l) == DT_OK) {
            int32_t in[8], tg[8];
            dt_loader_next(l, in, tg);
            dt_loader_destroy(l);
        }
        dt_tokens_close(t);
    }
    return 0;
}
