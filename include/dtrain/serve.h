/* dtrain serve layer: a trained model behind OpenAI's completions API
 * (POST /v1/completions, streamed or whole; GET /health, /metrics,
 * /v1/models), many requests decoding together through the infer layer's
 * batcher. */
#ifndef DTRAIN_SERVE_H
#define DTRAIN_SERVE_H

#include "dtrain/comm.h"
#include "dtrain/infer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The default context: today's models read 32k-128k positions, and 8 slots of that many in f32 (Qwen3-0.6B's 40960:
 * 75 GB) would not fit where the model does; llama.cpp's server holds 4096 unless told. */
#define DT_SERVE_CONTEXT 4096

typedef struct {
    const char *model;               /* a weights file, an HF folder or a checkpoint directory */
    const char *lora;                /* PEFT's adapter folder (or a LoRA run's --save DIR) merged into it; NULL: none */
    const char *host;                /* the address to listen on ("127.0.0.1") */
    int port;                        /* 0: any free port (printed) */
    int threads;                     /* compute threads (0: OMP_NUM_THREADS, or the cores it may use, dt_comm_default_threads) */
    int slots;                       /* requests decoding together */
    int context;                     /* positions a request holds, each slot's cache (0: the model's, at most
                                      * DT_SERVE_CONTEXT; more than the model's: the model's) */
    int budget;                      /* rows a step (prompt chunks and decode rows) */
    int queue;                       /* requests waiting for a slot at most; more get 503 */
    dt_quant quant;
    const char *bpe_encoder, *bpe_vocab; /* GPT-2's BPE files, or a tokenizer.json and NULL (NULL, NULL: the model's own or bytes) */
    size_t max_body;                 /* bytes a request body may have */
    double upload_seconds;           /* a request body must arrive within this */
    dt_comm *comm;                   /* tensor parallelism over its ranks (NULL: one process): rank 0 serves, the others follow */
    int cuda;                        /* the decoder on NVIDIA GPU cuda - 1 (0: the CPU) */
} dt_serve_options;

/* Loads the model, listens, and serves until SIGINT or SIGTERM; then takes
 * no new request, finishes the ones it has, and returns. A model that does
 * not load, a quantization it cannot do, or an address it cannot listen on
 * fail before anything is served. With comm, each rank holds its
 * tensor-parallel part: rank 0 serves and leads, the others run its steps;
 * a rank that dies stops the server with a message naming it. */
dt_status dt_serve_run(const dt_serve_options *o);

#ifdef __cplusplus
}
#endif
#endif
