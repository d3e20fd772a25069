/* llm.c model files: header checks, size against the shape, f32 and bf16 bodies. */
#include "dtrain/io.h"
#include "memfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    dt_gpt2 *m = NULL;
    if (dt_llmc_load(dt_fuzz_file(0, data, n), &m) == DT_OK) dt_gpt2_destroy(m);
    return 0;
}
