/* The GPU plugin's one export: the table dtrain loads (gpu_lm.h, dt_gpu_api). */
#include "dtrain/gpu_lm.h"
#include "dtrain/strategy.h"

extern const dt_strategy dt_strategy_gpu;

static const dt_gpu_api api = { DT_GPU_ABI, dt_gpu_count, dt_gpu_open, dt_gpu_close, dt_gpu_name, dt_gpu_set_tf32, dt_gpu_mem_info, dt_gpu_measure_gemm, dt_gpu_lm_create,
                                dt_gpu_lm_destroy, dt_gpu_lm_device, dt_gpu_lm_flash, &dt_strategy_gpu, dt_gpu_decoder_create,
                                dt_gpu_decoder_destroy, dt_gpu_decoder_run, dt_gpu_lm_plan };

__attribute__((visibility("default"))) const dt_gpu_api *dt_gpu_plugin(void) { return &api; }
