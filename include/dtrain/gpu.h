/* dtrain gpu layer: an NVIDIA GPU through the CUDA runtime and cuBLAS: the device, its memory, and the kernels the
 * model program's ops need (the CPU's kernels.h, one for one, on device buffers), checked against those CPU kernels
 * (tests/test_gpu_kernels.c). Built when nvcc is found (CMake's CUDA language); without it every call says so.
 *
 * Kernels are queued on the device's stream and return nothing; the first failure among them (a launch, a cuBLAS
 * call) is kept and dt_gpu_sync returns it, naming the call. */
#ifndef DTRAIN_GPU_H
#define DTRAIN_GPU_H

#include "dtrain/base.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_gpu dt_gpu;

/* Whether this build has the CUDA path (nvcc was found when it was built). */
int dt_gpu_built(void);
/* The GPUs this process sees (0: none, or no driver). */
int dt_gpu_count(void);
/* Device `ordinal`: its stream and cuBLAS handle. A clear error where the build has no CUDA, the machine no driver,
 * or no such device. */
dt_status dt_gpu_open(int ordinal, dt_gpu **out);
void dt_gpu_close(dt_gpu *g);
int dt_gpu_ordinal(const dt_gpu *g);
/* With on, f32 matmuls run on the tensor cores in TF32 (inputs rounded to 10-bit mantissas, f32 sums: PyTorch's
 * allow_tf32); off (the default), plain f32. */
void dt_gpu_set_tf32(dt_gpu *g, int on);
int dt_gpu_tf32(const dt_gpu *g);
/* The device's name, multiprocessors, memory (bytes) and compute capability (major * 10 + minor). */
const char *dt_gpu_name(const dt_gpu *g);
void dt_gpu_props(const dt_gpu *g, int *sms, size_t *memory, int *capability);
/* Free and total device memory now. */
dt_status dt_gpu_mem_info(dt_gpu *g, size_t *free_bytes, size_t *total);

dt_status dt_gpu_alloc(dt_gpu *g, size_t bytes, void **out); /* refused, saying how much and what is free, when it does not fit */
void dt_gpu_free(dt_gpu *g, void *p);
/* Host memory the device copies to and from at the bus's rate (page-locked; plain memory where that is refused: *pinned
 * says which); freed by dt_gpu_host_free with the same pinned. */
dt_status dt_gpu_host_alloc(dt_gpu *g, size_t bytes, void **out, int *pinned);
void dt_gpu_host_free(dt_gpu *g, void *p, int pinned);
/* Existing host memory page-locked for the device's copies (on 1) or let go (0): 1 where it is locked, 0 where the
 * runtime refused (the copies work either way, slower). */
int dt_gpu_host_pin(dt_gpu *g, void *p, size_t bytes, int on);
dt_status dt_gpu_upload(dt_gpu *g, void *dst, const void *src, size_t bytes);
dt_status dt_gpu_download(dt_gpu *g, void *dst, const void *src, size_t bytes);
void dt_gpu_zero(dt_gpu *g, void *p, size_t bytes);
/* Waits for the queued work; the first failure since the last call (DT_OK: none). */
dt_status dt_gpu_sync(dt_gpu *g);
/* Device events around queued work: a mark now, and the milliseconds between two marks (after a sync). */
dt_status dt_gpu_mark(dt_gpu *g, int slot);
double dt_gpu_elapsed_ms(dt_gpu *g, int from, int to);
#define DT_GPU_MARKS 256 /* a step's units (forward and backward) and the update, traced */

/* The kernels, on device pointers, with the CPU kernels' meaning (kernels.h) unless said. Matmuls in f32 (cuBLAS's
 * plain f32, no TF32). A forward kernel's bits (NULL: none): its outputs rounded to bf16 as they are written, their
 * bits kept there too (bf16's values that a Linear reads, so that it need not pack them). */
void dt_gpu_matmul_forward(dt_gpu *g, float *out, const float *inp, const float *w, const float *bias, int BT, int C, int OC);
void dt_gpu_matmul_backward(dt_gpu *g, float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                            int BT, int C, int OC);
void dt_gpu_layernorm_forward(dt_gpu *g, float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                              int C, uint16_t *bits);
/* round_in: inp read as its bf16 values (bf16's block keeps its norms' inputs in 16 bits for backward) */
void dt_gpu_layernorm_backward(dt_gpu *g, float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C, int round_in);
/* RMSNorm (Llama's): rstd kept for backward, which adds into dinp and dw. */
void dt_gpu_rmsnorm_forward(dt_gpu *g, float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps, uint16_t *bits);
void dt_gpu_rmsnorm_backward(dt_gpu *g, float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                             int N, int C, int round_in);
/* SwiGLU on rows of [gate | up]: out[N, F] = silu(gate) * up; backward adds into dgu [N, 2F]. */
void dt_gpu_swiglu_forward(dt_gpu *g, float *out, const float *gu, int N, int F, uint16_t *bits);
void dt_gpu_swiglu_backward(dt_gpu *g, float *dgu, const float *gu, const float *dout, int N, int F);
/* Rotary positions in place (dt_rope_forward's turn; backward: the opposite angle): rows of `heads` heads of d
 * channels, rows row_stride floats apart, row r at position r % T; inv_freq: d / 2 device floats. */
void dt_gpu_rope(dt_gpu *g, float *x, const float *inv_freq, int rows, int T, int heads, int d, size_t row_stride, int backward);
/* Attention's q|k|v of all NH heads [BT, 3 Q] from q, the KVH K/V heads and v side by side (in [BT, Q + 2 KV]; head
 * h reads K/V head h / (NH / KVH)); unpack adds d(packed) back into d(in), each K/V head the sum of its heads'. */
void dt_gpu_attention_pack(dt_gpu *g, float *packed, const float *in, int BT, int NH, int KVH, int hd);
void dt_gpu_attention_unpack(dt_gpu *g, float *din, const float *dpacked, int BT, int NH, int KVH, int hd);
void dt_gpu_gelu_forward(dt_gpu *g, float *out, const float *inp, size_t n, uint16_t *bits);
void dt_gpu_gelu_backward(dt_gpu *g, float *dinp, const float *inp, const float *dout, size_t n);
void dt_gpu_residual_forward(dt_gpu *g, float *out, const float *a, const float *b, size_t n);
/* dst += src. */
void dt_gpu_accumulate(dt_gpu *g, float *dst, const float *src, size_t n);
void dt_gpu_embedding_forward(dt_gpu *g, float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C);
void dt_gpu_embedding_backward(dt_gpu *g, float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C);
/* Causal attention on qkv[B, T, 3C] into out[B, T, C]; att[B, NH, T, T] keeps the probabilities (0 above the
 * diagonal). Backward adds into dqkv; scratch holds [NH, T, T] floats. */
void dt_gpu_attention_forward(dt_gpu *g, float *out, float *att, const float *qkv, int B, int T, int C, int NH);
void dt_gpu_attention_backward(dt_gpu *g, float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att, int B,
                               int T, int C, int NH);
/* The same attention without the T x T probabilities (flash.cu; the CPU's dt_attention_forward_lse and
 * _backward_lse): forward keeps lse[B, NH, T], each row's log-sum-exp; backward computes the probabilities again from
 * it and D = dout . out a row (scratch: B x NH x T floats), adding into dqkv. The products in TF32 on the tensor
 * cores; heads of the sizes dt_gpu_flash_supported says. */
int dt_gpu_flash_supported(int head_dim);
void dt_gpu_attention_forward_lse(dt_gpu *g, float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void dt_gpu_attention_backward_lse(dt_gpu *g, float *dqkv, float *scratch, const float *dout, const float *out, const float *qkv,
                                   const float *lse, int B, int T, int C, int NH);
/* The same attention through cuDNN's fused kernel (its graph API's SDPA, src/gpu/attention_cudnn.cpp), for bf16 runs:
 * q, k and v (bf16 values) packed to 16 bits in work16, the probabilities' products in bf16 with f32 sums (P rounded
 * to bf16 for P V, as PyTorch's bf16 attention does), out rounded to bf16; stats[B, NH, T] kept for backward (cuDNN's
 * own log-sum-exps), which adds d(q|k|v), each rounded to bf16, into dqkv. work16: B T x 8 C bf16 (B T x 4 C in
 * forward); out16 (NULL: in work16): where forward's output bits go, kept for the Linear that reads them. cuDNN (libcudnn.so.9) is loaded at the first call, from the library path; a build without cuDNN's
 * frontend headers (scripts/get-cudnn-frontend.sh), or a machine without cuDNN, fails the call by name.
 * dt_gpu_cudnn_supported: whether this build has the path, for a head of head_dim channels. */
int dt_gpu_cudnn_supported(int head_dim);
#define DT_GPU_CUDNN_WORKSPACE ((size_t)256 << 20) /* the most workspace cuDNN's graphs take by default */
void dt_gpu_attention_forward_cudnn(dt_gpu *g, float *out, float *stats, const float *qkv, int B, int T, int C, int NH, uint16_t *work16,
                                    uint16_t *out16);
void dt_gpu_attention_backward_cudnn(dt_gpu *g, float *dqkv, const float *dout, const float *out, const float *qkv, const float *stats,
                                     int B, int T, int C, int NH, uint16_t *work16);
/* dt_crossentropy_fused's: losses[BT] (0 where a target is below 0), and the logits overwritten by d(loss)/d(logits)
 * times dscale (0 in the padded columns and the unscored rows). The mean is the caller's (it reads the losses). */
void dt_gpu_crossentropy_fused(dt_gpu *g, float *logits, float *losses, const int32_t *targets, int BT, int V, int Vp, float dscale);
/* AdamW as dt_optim's (PyTorch's), on the gradients times gscale (clipping): decay = 1 - lr wd, step = lr / (1 -
 * b1^t), sbc2 = sqrt(1 - b2^t). */
void dt_gpu_adamw(dt_gpu *g, float *p, const float *grad, float gscale, float *m, float *v, size_t n, float b1, float b2, float eps,
                  float decay, float step, float sbc2);
/* *ss += the sum of squares of x[0..n) (a device double); x *= f. */
void dt_gpu_sumsq(dt_gpu *g, const float *x, size_t n, double *ss);
void dt_gpu_scale(dt_gpu *g, float *x, size_t n, float f);

/* Mixed precision (bf16, as torch.autocast and the CPU's --precision bf16): src rounded to bf16 values into dst
 * (dst == src: in place; to nearest even, dt_f32_to_bf16's bits; with bits, those kept there too); src's bf16 bits
 * into dst. */
void dt_gpu_round_bf16(dt_gpu *g, float *dst, const float *src, size_t n, uint16_t *bits);
void dt_gpu_pack_bf16(dt_gpu *g, uint16_t *dst, const float *src, size_t n);
/* dst = src's bf16 values widened to f32 (add: dst += them). */
void dt_gpu_widen_bf16(dt_gpu *g, float *dst, const uint16_t *src, size_t n, int add);
/* dt_matmul_forward_lp's and dt_matmul_backward_lp's bf16 Linear on the tensor cores: w and bias bf16 (the
 * parameters' 16-bit copy), products bf16 with f32 sums; forward's out (bias added) rounded to bf16; backward reads
 * dout rounded (autocast's linear receives it so; dout itself is left as it was), dinp += dout w then rounded whole, and dw and dbias each add
 * this use's gradient rounded to bf16. inp16: inp's bf16 bits where its producer kept them (NULL: packed here into
 * work16). work16: BT x (C + OC) bf16 in backward (BT x C in forward); work: OC x C + OC floats. */
void dt_gpu_matmul_forward_bf16(dt_gpu *g, float *out, const float *inp, const uint16_t *inp16, const uint16_t *w, const uint16_t *bias,
                                int BT, int C, int OC, uint16_t *work16);
void dt_gpu_matmul_backward_bf16(dt_gpu *g, float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const uint16_t *inp16,
                                 const uint16_t *w, int BT, int C, int OC, uint16_t *work16, float *work);
/* The two halves of those without the rounding of forward's output and backward's dout (the head, whose
 * cross-entropy reads its sums rounded and writes its gradient as bf16 bits): out = the products' f32 sums; and
 * backward from dout's bf16 bits d16 (no bias), d16 at work16's start or elsewhere. */
void dt_gpu_matmul_sums_bf16(dt_gpu *g, float *out, const float *inp, const uint16_t *inp16, const uint16_t *w, int BT, int C, int OC,
                             uint16_t *work16);
void dt_gpu_matmul_backward_bf16_from(dt_gpu *g, float *dinp, float *dw, const uint16_t *d16, const float *inp, const uint16_t *inp16,
                                      const uint16_t *w, int BT, int C, int OC, uint16_t *work16, float *work);
/* The head's cross-entropy in bf16 (autocast's): the logits read as their bf16 values (the head's output rounded),
 * forward the losses (as dt_gpu_crossentropy_fused's) and each row's maximum and sum of exponentials into stats[2 BT];
 * backward, from those, d(loss)/d(logits) times dscale (the engine's gradient scale over the scored tokens), as the
 * CPU's dt_crossentropy_grad_lp makes it, rounded to bf16 bits into dlogits [BT, Vp] (0 in the padded columns and
 * the unscored rows). The logits are not written. */
void dt_gpu_crossentropy_forward_bf16(dt_gpu *g, const float *logits, float *losses, float *stats, const int32_t *targets, int BT, int V,
                                      int Vp);
void dt_gpu_crossentropy_backward_bf16(dt_gpu *g, uint16_t *dlogits, const float *logits, const float *stats, const int32_t *targets,
                                       int BT, int V, int Vp, float dscale);

/* Decoding (src/gpu/decode.c, decode_kernels.cu): rows are a step's dt_infer_row as four int32 words each (slot,
 * position, token, wants logits) on the device. A cache holds every slot's keys and values, f32: slot s, layer l,
 * keys (kv 0) or values (1), position t, K/V head h at cache + s * slot_elems + ((l * 2 + kv) * P + t) * KVH * hd
 * + h * hd. */
typedef struct {
    float *cache;
    size_t slot_elems;
    int P, KVH, hd;
    int chunk; /* positions attention scores at a time in shared memory (0: 2048); any context is taken a chunk at a time */
} dt_gpu_kv;
/* out[r] = wte[token] (+ wpe[position], wpe not NULL), C channels a row. */
void dt_gpu_embed_rows(dt_gpu *g, float *out, const int32_t *rows, const float *wte, const float *wpe, int n, int C);
/* dt_gpu_rope's turn at each row's own position (rows' second word). */
void dt_gpu_rope_rows(dt_gpu *g, float *x, const float *inv_freq, const int32_t *rows, int n, int heads, int d, size_t row_stride);
/* Attention of n rows at layer l: in [n, q of NH heads | k, v of the KVH K/V heads] (win floats a row); every row's k
 * and v stored at its slot and position first, then each row's q (head h reads K/V head h / (NH / KVH)) over its
 * slot's positions 0..pos into out [n, NH hd], the positions a chunk at a time (the softmax's running maximum and sum
 * carried between chunks). Heads of at most DT_GPU_DECODE_HEAD_MAX channels. */
#define DT_GPU_DECODE_HEAD_MAX 512
void dt_gpu_attention_cached(dt_gpu *g, float *out, const dt_gpu_kv *kv, const float *in, const int32_t *rows, int n, int l, int NH,
                             int win);
/* out[i] = in[idx[i]] for m rows of C floats (idx on the device). */
void dt_gpu_gather_rows(dt_gpu *g, float *out, const float *in, const int32_t *idx, int m, int C);

/* NCCL (src/gpu/nccl.cu; libnccl.so.2 loaded at the first call, from the library path): a communicator of nranks
 * ranks, each on its own GPU, made from one unique id that rank 0 draws (dt_gpu_nccl_id) and every rank is given
 * (DT_GPU_NCCL_ID_BYTES; dtrain's collectives carry it); an allreduce of device floats on the GPU's stream (mean: the
 * average, else the sum), its failure kept as a kernel's is. */
typedef struct dt_gpu_nccl dt_gpu_nccl;
#define DT_GPU_NCCL_ID_BYTES 128
dt_status dt_gpu_nccl_id(void *id);
dt_status dt_gpu_nccl_open(dt_gpu *g, const void *id, int nranks, int rank, dt_gpu_nccl **out);
void dt_gpu_nccl_allreduce(dt_gpu *g, dt_gpu_nccl *c, float *x, size_t n, int mean);
void dt_gpu_nccl_close(dt_gpu_nccl *c);

/* The device's ceilings, measured: an M x N x K product's TFLOP/s in f32 (TF32 when set) and in bf16 (tensor
 * cores, f32 accumulation), and a device-to-device copy's GB/s (bytes read and written). */
dt_status dt_gpu_measure_gemm(dt_gpu *g, int bf16, int M, int N, int K, double *tflops);
dt_status dt_gpu_measure_copy(dt_gpu *g, size_t bytes, double *gbs);

#ifdef __cplusplus
}
#endif
#endif
