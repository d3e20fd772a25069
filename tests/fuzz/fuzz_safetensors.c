/* safetensors with HF GPT-2 names: the JSON header, shapes, dtypes, offsets. */
#include "dtrain/io.h"
#include "memfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    dt_gpt2 *m = NULL;
    if (dt_safetensors_load(dt_fuzz_file(0, data, n), 0, &m) == DT_OK) dt_gpt2_destroy(m);
    return 0;
}
