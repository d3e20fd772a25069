/* The GPU planner (src/gpu/plan.c) on the host's kernels: its count of the whole model's bytes, made from the models
 * with one layer and two, equals the pre-flight's count of the whole model (dt_gpu_lm_count) to the byte, for GPT-2
 * and a Llama, f32 and bf16; where the T x T probabilities do not fit the GPU's free memory and flash attention does,
 * it counts and times flash as the pre-flight would choose; where nothing fits it says so and times nothing; where it
 * fits, the step is timed (the time's accuracy is bench/gpu_check.sh's to show, on a GPU).
 * usage: test_gpu_plan */
#include "gpu_check.h"

#include "dtrain/gpu_lm.h"

#include <stdlib.h>

/* A preset with a vocabulary of 512 (the head's work is not what is checked). */
static int preset(const char *name, dt_lm_config *cfg) {
    if (dt_lm_preset(name, cfg)) return 1;
    cfg->vocab_size = cfg->padded_vocab_size = 512;
    return 0;
}

/* The pre-flight's count for the whole model of cfg. */
static size_t whole(dt_gpu *g, const dt_lm_config *cfg, dt_dtype prec, dt_attn_mode att, int B, int T, int *flash) {
    dt_program *p = NULL;
    size_t need = 0, state = 0;
    if (dt_program_create(cfg, &p) || (prec != DT_F32 && dt_program_set_precision(p, prec))) return 0;
    dt_program_set_attention(p, att);
    if (dt_gpu_lm_count(g, p, B, T, &need, &state, flash)) need = 0;
    dt_program_destroy(p);
    return need;
}

static int one(dt_gpu *g, const char *name, dt_dtype prec, int B, int T) {
    dt_lm_config cfg;
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    dt_gpu_plan p;
    int flash = 0;
    if (preset(name, &cfg) || dt_gpu_lm_plan(g, &cfg, prec, DT_ATTN_AUTO, B, T, &oc, &p)) {
        printf("FAIL %s: %s\n", name, dt_last_error());
        return 1;
    }
    size_t want = whole(g, &cfg, prec, DT_ATTN_FULL, B, T, &flash);
    int ok = want && p.need == want && p.fits && p.timed && p.step_ms > 0 && !p.flash;
    printf("%s %s: %s %zu bytes planned, %zu counted whole; step timed %.1f ms (a block %.2f)\n", name, prec == DT_BF16 ? "bf16" : "f32",
           ok ? "ok  " : "FAIL", p.need, want, p.step_ms, p.block_ms);
    return !ok;
}

/* T x T probabilities that do not fit, flash that does: the plan takes flash, as the pre-flight would. */
static int flash_choice(dt_gpu *g) {
    dt_lm_config cfg;
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    preset("d6", &cfg);
    int fl_full = 0, fl_flash = 0, B = 2, T = 256;
    size_t full = whole(g, &cfg, DT_BF16, DT_ATTN_FULL, B, T, &fl_full), flash = whole(g, &cfg, DT_BF16, DT_ATTN_BLOCKWISE, B, T, &fl_flash);
    char mb[32];
    snprintf(mb, sizeof mb, "%zu", ((full + flash) / 2) >> 20); /* between the two */
    setenv("DTRAIN_GPU_HOST_FREE_MB", mb, 1);
    dt_gpu_plan p;
    int fails = 0;
    if (dt_gpu_lm_plan(g, &cfg, DT_BF16, DT_ATTN_AUTO, B, T, &oc, &p)) return printf("FAIL flash: %s\n", dt_last_error()), 1;
    int ok = fl_flash && !fl_full && full > flash && p.flash && p.need == flash && p.fits && p.timed;
    printf("d6 bf16 T 256 with %s MB free: %s flash planned (%zu bytes; T x T %zu, flash %zu counted whole)\n", mb, ok ? "ok  " : "FAIL",
           p.need, full, flash);
    fails += !ok;
    setenv("DTRAIN_GPU_HOST_FREE_MB", "1", 1);
    if (dt_gpu_lm_plan(g, &cfg, DT_BF16, DT_ATTN_AUTO, B, T, &oc, &p)) return printf("FAIL: %s\n", dt_last_error()), 1;
    ok = !p.fits && !p.timed && p.need == flash;
    printf("d6 bf16 T 256 with 1 MB free: %s does not fit, nothing timed (%zu bytes counted)\n", ok ? "ok  " : "FAIL", p.need);
    unsetenv("DTRAIN_GPU_HOST_FREE_MB");
    return fails + !ok;
}

int main(void) {
    dt_gpu *g = NULL;
    if (dt_gpu_open(0, &g)) {
        fprintf(stderr, "test_gpu_plan: %s\n", dt_last_error());
        return 1;
    }
    int fails = one(g, "d6", DT_F32, 2, 32) + one(g, "d6", DT_BF16, 2, 32) + one(g, "llama-tiny", DT_F32, 3, 32) + flash_choice(g);
    dt_gpu_close(g);
    return fails ? 1 : 0;
}
