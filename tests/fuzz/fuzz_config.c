/* The DeepSpeed-style JSON config (--config). */
#include "dtrain/train.h"
#include "memfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    dt_train_config c;
    dt_train_defaults(&c);
    if (dt_train_config_load(dt_fuzz_file(0, data, n), &c) == DT_OK)
        for (int s = 0; s < 4; s++) dt_lr_at(&c.sched, c.steps, (int)((long long)s * c.steps / 4)); /* steps up to INT_MAX: no int overflow */
    return 0;
}
