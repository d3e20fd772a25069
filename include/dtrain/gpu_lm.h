/* dtrain: the model program on a GPU (src/gpu/lm.c): a host program's spec and parameters on the device, forward,
 * backward and AdamW there, in the host store's layout. One process, the whole model, f32, GPT-2's family's ops so
 * far; what it cannot run is refused by name at create. */
#ifndef DTRAIN_GPU_LM_H
#define DTRAIN_GPU_LM_H

#include "dtrain/gpu.h"
#include "dtrain/optim.h"
#include "dtrain/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_gpu_lm dt_gpu_lm;

/* p's spec and current parameters for micro-batches of B x T on g (p stays the caller's; the device copy is apart). */
dt_status dt_gpu_lm_create(dt_gpu *g, dt_program *p, int B, int T, dt_gpu_lm **out);
void dt_gpu_lm_destroy(dt_gpu_lm *m);
size_t dt_gpu_lm_num_params(const dt_gpu_lm *m);
/* The parameters to the device; the parameters and gradients from it (either NULL: not wanted). */
dt_status dt_gpu_lm_upload(dt_gpu_lm *m, const float *params);
dt_status dt_gpu_lm_download(dt_gpu_lm *m, float *params, float *grads);
dt_status dt_gpu_lm_zero_grad(dt_gpu_lm *m);
/* Forward on host tokens [B*T]; with targets, the mean cross-entropy over the scored ones (targets below 0 are not)
 * into *loss, and the logits' gradient made for backward, which adds into the gradients. */
dt_status dt_gpu_lm_forward(dt_gpu_lm *m, const int32_t *inputs, const int32_t *targets, float *loss);
dt_status dt_gpu_lm_backward(dt_gpu_lm *m);
/* One AdamW step (c's betas, eps, weight decay over every parameter, as dt_optim without spans) at lr; the gradients'
 * L2 norm into *grad_norm (NULL: not wanted). The gradients are left as they were. */
dt_status dt_gpu_lm_adamw(dt_gpu_lm *m, const dt_optim_config *c, float lr, double *grad_norm);

#ifdef __cplusplus
}
#endif
#endif
