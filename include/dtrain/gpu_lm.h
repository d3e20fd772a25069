/* dtrain: the model program on a GPU: trained (src/gpu/lm.c: a host program's spec and parameters on the device,
 * forward, backward and AdamW there, in the host store's layout), decoded (decode.c) and planned (plan.c); and the
 * plugin's table that carries them to dtrain. One process, the whole model, f32 or the program's bf16 (autocast's),
 * GPT-2's and the Llama family's ops; what it cannot run (a mixture of experts, a split model) is refused by name at
 * create. */
#ifndef DTRAIN_GPU_LM_H
#define DTRAIN_GPU_LM_H

#include "dtrain/gpu.h"
#include "dtrain/infer.h"
#include "dtrain/optim.h"
#include "dtrain/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_gpu_lm dt_gpu_lm;

/* p's spec and current parameters for micro-batches of B x T on g (p stays the caller's; the device copy is apart). */
dt_status dt_gpu_lm_create(dt_gpu *g, dt_program *p, int B, int T, dt_gpu_lm **out);
void dt_gpu_lm_destroy(dt_gpu_lm *m);
/* The parameters to the device; the parameters and gradients from it (either NULL: not wanted). */
dt_status dt_gpu_lm_upload(dt_gpu_lm *m, const float *params);
dt_status dt_gpu_lm_download(dt_gpu_lm *m, float *params, float *grads);
dt_status dt_gpu_lm_zero_grad(dt_gpu_lm *m);
/* Forward on host tokens [B*T]; with targets, the mean cross-entropy over the scored ones (targets below 0 are not;
 * divided by loss_tokens when above 0: a step's share of its global count) into *loss, and the logits' gradient made
 * for backward, which adds into the gradients (times grad_scale). */
dt_status dt_gpu_lm_forward(dt_gpu_lm *m, const int32_t *inputs, const int32_t *targets, double loss_tokens, float *loss);
dt_status dt_gpu_lm_backward(dt_gpu_lm *m, float grad_scale);
/* The update, as the engine's on the host (dt_optim_step_clipped): the gradients' L2 norm into *norm, scaled to clip
 * when above it (clip 0: never), AdamW (c's betas, eps, weight decay over every parameter, as dt_optim without spans)
 * at lr; a non-finite norm with skip_nonfinite changes nothing (*skipped 1). The gradients are zeroed after. */
dt_status dt_gpu_lm_step(dt_gpu_lm *m, const dt_optim_config *c, float lr, float clip, int skip_nonfinite, double *norm, int *skipped);
/* The parameters and AdamW's moments (each NULL: not moved) and its steps, to the host (to_host 1) or from it. */
dt_status dt_gpu_lm_state(dt_gpu_lm *m, float *params, float *m1, float *m2, long *steps, int to_host);
/* The gradients to the host (to_host 1) or from it (data parallelism's staging through host memory). */
dt_status dt_gpu_lm_grads(dt_gpu_lm *m, float *host, int to_host);
/* The gradients averaged over c's ranks on the GPUs (NCCL), waited for. */
dt_status dt_gpu_lm_grads_nccl(dt_gpu_lm *m, dt_gpu_nccl *c);
/* The GPU the model is on. */
dt_gpu *dt_gpu_lm_gpu(const dt_gpu_lm *m);
/* Whether attention keeps each row's log-sum-exp (flash.cu: asked by DT_ATTN_BLOCKWISE, or by DT_ATTN_AUTO where the
 * T x T probabilities do not fit; in bf16 or TF32, heads of dt_gpu_flash_supported's sizes; or cuDNN's, asked by
 * DT_ATTN_CUDNN), not T x T probabilities. */
int dt_gpu_lm_flash(const dt_gpu_lm *m);
/* Forward and backward for dt_program_set_device (the batch B x T the model was made for). */
void dt_gpu_lm_device(dt_gpu_lm *m, dt_program_device *out);
/* What dt_gpu_lm_create would take of the GPU for p at B x T (the pre-flight's count, whether or not it fits: bytes
 * in all, of them the parameters', gradients', AdamW's and bf16's copy), and whether attention would be flash's;
 * nothing is allocated. */
dt_status dt_gpu_lm_count(dt_gpu *g, dt_program *p, int B, int T, size_t *need, size_t *state, int *flash);

/* The planner on a GPU (src/gpu/plan.c): the model of cfg at B x T in precision prec (DT_F32 or DT_BF16; the GPU's
 * TF32 setting as it is) and attention att, without building it: its bytes on the GPU counted as the pre-flight
 * counts them, and where it fits, a training step (forward, backward, AdamW under opt) timed on the device with one
 * layer and with two, the whole step their line at num_layers. */
typedef struct {
    size_t need, state, free_bytes; /* bytes: the whole model's, of them its state's; the GPU's free */
    int fits, flash, timed;         /* flash: attention keeps log-sum-exps; timed: the steps were (it fits) */
    double step_ms, block_ms, rest_ms; /* a step; a block's share of it; the rest (embedding, head, loss, update) */
} dt_gpu_plan;
dt_status dt_gpu_lm_plan(dt_gpu *g, const dt_lm_config *cfg, dt_dtype prec, dt_attn_mode att, int B, int T, const dt_optim_config *opt,
                         dt_gpu_plan *out);

/* Decoding on the GPU (src/gpu/decode.c): p's spec and current parameters copied to the device with a key/value
 * cache of nslots sequences of context positions (0, or more than the model's: max_seq_len), f32, for steps of at most max_rows rows (p stays the
 * caller's). A step runs the block ops as the CPU decoder does (src/infer/decoder_step.c) on rows the caller has
 * checked (dt_decoder_step checks them: dt_decoder_create_gpu puts this behind a dt_decoder): logits [m, V] for the m
 * rows that want them, in order. The whole model in one process; a mixture of experts or a split model is refused. */
typedef struct dt_gpu_decoder dt_gpu_decoder;
dt_status dt_gpu_decoder_create(dt_gpu *g, dt_program *p, int nslots, int max_rows, int context, dt_gpu_decoder **out);
void dt_gpu_decoder_destroy(dt_gpu_decoder *d);
dt_status dt_gpu_decoder_run(dt_gpu_decoder *d, const int32_t *rows, int n, float *logits);
/* d as a dt_decoder's device (dt_decoder_create_on), destroyed with that decoder. */
dt_decoder_device dt_gpu_decoder_device(dt_gpu_decoder *d);

/* The GPU plugin (libdtrain_gpu.so, built with the CUDA path): dtrain loads it when --device cuda asks for it, so that
 * a dtrain built with CUDA runs where there is none, and a machine without it is told so by name. Its one export,
 * dt_gpu_plugin, gives this table; abi says which build's. */
#define DT_GPU_ABI 5
struct dt_strategy;
typedef struct {
    int abi;
    int (*count)(void);
    dt_status (*open)(int ordinal, dt_gpu **out);
    void (*close)(dt_gpu *g);
    const char *(*name)(const dt_gpu *g);
    void (*set_tf32)(dt_gpu *g, int on);
    dt_status (*mem_info)(dt_gpu *g, size_t *free_bytes, size_t *total);
    dt_status (*measure_gemm)(dt_gpu *g, int bf16, int M, int N, int K, double *tflops);
    dt_status (*lm_create)(dt_gpu *g, dt_program *p, int B, int T, dt_gpu_lm **out);
    void (*lm_destroy)(dt_gpu_lm *m);
    void (*lm_device)(dt_gpu_lm *m, dt_program_device *out);
    int (*lm_flash)(const dt_gpu_lm *m);
    const struct dt_strategy *strategy; /* the engine's "gpu" strategy: its dt_engine_config.device is a dt_gpu_lm */
    dt_status (*decoder_create)(dt_gpu *g, dt_program *p, int nslots, int max_rows, int context, dt_gpu_decoder **out);
    void (*decoder_destroy)(dt_gpu_decoder *d);
    dt_status (*decoder_run)(dt_gpu_decoder *d, const int32_t *rows, int n, float *logits);
    dt_status (*lm_plan)(dt_gpu *g, const dt_lm_config *cfg, dt_dtype prec, dt_attn_mode att, int B, int T, const dt_optim_config *opt,
                         dt_gpu_plan *out);
} dt_gpu_api;
const dt_gpu_api *dt_gpu_plugin(void);
/* dtrain's side: the plugin from DTRAIN_GPU_PLUGIN, else beside the executable; a clear error when this build has
 * no CUDA path, the file is missing, or it cannot load (no CUDA runtime libraries, another build's). */
dt_status dt_gpu_api_load(const dt_gpu_api **out);
/* Whether GPU `ordinal` opens (the plugin loaded, the GPU opened and closed): a command checks before its first output. */
dt_status dt_gpu_api_probe(int ordinal);

#ifdef __cplusplus
}
#endif
#endif
