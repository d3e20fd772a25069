/* IDX image files, gzip-compressed or plain: magic, dimensions, data length. */
#include "dtrain/data.h"
#include "memfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    dt_idx x;
    if (dt_idx_load(dt_fuzz_file(0, data, n), &x) == DT_OK) dt_idx_free(&x);
    return 0;
}
