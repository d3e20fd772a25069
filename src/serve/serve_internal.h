/* dtrain serve's insides: a job (one completion request from its parsing to
 * its last byte sent), the vocabulary that turns text into tokens and back,
 * and the engine thread that runs the batcher over the queued jobs. The
 * HTTP side (http.c) and the engine (engine.c) meet only in a job, under
 * its lock. */
#ifndef DTRAIN_SERVE_INTERNAL_H
#define DTRAIN_SERVE_INTERNAL_H

#include "dtrain/data.h"
#include "dtrain/infer.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* Text <-> tokens: bytes (a vocabulary of 256) or GPT-2's BPE. */
typedef struct {
    dt_bpe *bpe; /* NULL: bytes */
    int vocab;
    int eot;     /* the end-of-text token (GPT-2's 50256); -1: none */
    dt_token_ends ends; /* the tokens that end a completion: eot and generation_config.json's eos_token_id */
    dt_chat_kind chat; /* the model's chat template (its tokenizer_config.json's; DT_CHAT_NONE: dtrain's plain one) */
    uint64_t *special; /* the tokenizer's special tokens (dt_token_set_add; NULL: none) */
} serve_vocab;
/* Token id's bytes appended to a growing buffer. */
dt_status serve_vocab_append(const serve_vocab *v, int32_t id, char **buf, size_t *len, size_t *cap);
/* v's special tokens marked from its tokenizer's added tokens ("special": true); freed by serve_vocab_free (and the
 * tokenizer with it). */
dt_status serve_vocab_mark_special(serve_vocab *v);
void serve_vocab_free(serve_vocab *v);
/* Whether a completion leaves token id's text out unless asked to keep it (vLLM's skip_special_tokens, its default):
 * a special token of the tokenizer, or an end. */
bool serve_vocab_special(const serve_vocab *v, int32_t id);


#define SERVE_MAX_STOP 4
#define SERVE_MAX_TOP 20 /* logprobs' alternatives a token (vLLM's default --max-logprobs) */

/* A completion request as the client sent it, checked. */
typedef struct {
    int32_t *prompt;
    int nprompt, max_tokens;
    dt_sampling sampling; /* its logit_bias: bias; its suppressed tokens (min_tokens): suppress */
    dt_logit_bias *bias;
    int nbias;
    int32_t *stop_ids;   /* vLLM's stop_token_ids: tokens that end the completion, their text kept (as vLLM's) */
    int nstop_ids;
    int32_t *suppress;   /* min_tokens' tokens: the ends and stop_ids */
    uint64_t seed;
    char *stop[SERVE_MAX_STOP];
    int nstop;
    bool stream, echo;
    bool stream_usage;   /* stream_options.include_usage: a stream's last chunk before [DONE] holds the usage alone */
    int n;               /* choices: completions of the prompt, choice i drawn with seed + i */
    bool ignore_eos;     /* vLLM's: the end of text drawn does not end the completion (nor shows in its text) */
    uint64_t salt;       /* vLLM's cache_salt, hashed (0: none): prefix reuse only between requests of the same salt */
    bool keep_special;   /* vLLM's skip_special_tokens false (or tools, whose calls a special token may open): their text kept */
    bool logprobs;       /* each token's log-probability (a completion's "logprobs": N, a chat's "logprobs": true) */
    bool prompt_lps;     /* vLLM's prompt_logprobs: each prompt token's log-probability, rank and prompt_top likeliest */
    int prompt_top;
    int top;             /* and its top alternatives (0 to SERVE_MAX_TOP: N, or a chat's "top_logprobs") */
    bool chat;           /* /v1/chat/completions: messages in, a chat.completion out */
    bool tools;          /* with tools the model may call (tool_choice auto): its answer's tool calls read (tool_calls.c) */
} serve_params;
void serve_params_free(serve_params *p);
/* A deep copy of a (its prompt, stops and biases its own; DT_ERR_NOMEM). */
dt_status serve_params_copy(const serve_params *a, serve_params *out);
/* Parses and checks a /v1/completions body (chat: a /v1/chat/completions one) against the model's context and
 * vocabulary; on a bad request returns DT_ERR_ARG with the message and sets *param to the field at fault (or NULL). */
dt_status serve_params_parse(const char *body, size_t len, const serve_vocab *v, int context, bool chat, serve_params *p,
                             const char **param);
/* Chat messages as one prompt by the model's template (chat, DT_CHAT_NONE: dtrain's plain one; chat.c; caller frees
 * *out). */
struct cJSON;
dt_status serve_chat_prompt(const struct cJSON *messages, dt_chat_kind chat, const dt_chat_kwargs *kw, char **out, size_t *len);
/* An answer's (n bytes of text) tool calls in the template's form (form: its dt_chat_template.tools), as OpenAI's
 * tool_calls (ids call_<id>_<k>; the caller deletes it), *content the bytes before them; NULL (and *content n) where
 * it makes none. */
struct cJSON *serve_tool_calls(int form, const char *text, size_t n, long id, size_t *content);
/* A thinking model's answer split (reasoning.c): its reasoning [r0, r1) (thinks: it opened with <think>) and its
 * content from c0; the first settled bytes are known (final: the answer is whole; before that a stream holds back what
 * could still be a marker). */
typedef struct {
    bool thinks;
    size_t r0, r1, c0, settled;
} serve_split;
void serve_reasoning_split(const char *text, size_t n, bool final, serve_split *s);
/* A stream's next pieces by split s, sent_r and sent_c bytes of the reasoning and the content sent before: the
 * reasoning's r_n new bytes at text + r_at, the content's c_n at text + c_at. */
void serve_reasoning_next(const serve_split *s, size_t sent_r, size_t sent_c, size_t *r_at, size_t *r_n, size_t *c_at, size_t *c_n);
/* The stop sequence a chat answer gets beside the request's own: the model starting the next turn. */
#define SERVE_CHAT_STOP "\nUser:"

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE } job_state;

/* A token of a job's text with its log-probability (NAN: none, the echoed prompt's first) and the top alternatives. */
typedef struct {
    int32_t token;
    float logprob;
    size_t at;  /* where its bytes start in the job's text */
    int rank;   /* the token's place in its distribution, 1 the likeliest (prompt_logprobs') */
    bool textless; /* an end, or a special token whose text is left out: none in the text; sent when its text would be,
                    * or last (as vLLM's, an entry a token drawn) */
    int32_t top[SERVE_MAX_TOP];
    float top_lp[SERVE_MAX_TOP];
} serve_logprob;

/* The lock and condition of a request's jobs (its n choices share one, so that the HTTP thread waits on all at once);
 * each job holds a reference. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* under mu */
} serve_lock;

/* One completion in flight (a request's choice). The engine writes text and
 * the state; the HTTP thread reads them and sends; both hold a reference,
 * the last frees. */
typedef struct serve_job {
    serve_params p;
    serve_lock *lock;
    job_state state;
    dt_finish why;
    char *text;          /* the completion's bytes so far (a stop sequence cut off) */
    size_t len, cap;
    size_t visible;      /* of those, the bytes that can go out: not a possible start of a stop sequence nor half a character */
    size_t base;         /* the echoed prompt's bytes at the start (stop sequences are looked for after them) */
    int generated;
    int cached;          /* of the prompt's tokens, those whose keys and values a cache slot gave (prefix reuse) */
    serve_logprob *lp;   /* with logprobs: an entry a token of text (the echoed prompt's, then the answer's) */
    serve_logprob *plp;  /* with prompt_logprobs: an entry a prompt token (the first's logprob NAN: none) */
    int nlp, caplp;
    bool cancelled;      /* the client left: the engine ends it at its next token */
    bool failed;         /* the engine could not run it (error in message) */
    char message[256];
    int refs;
    double t_queued, t_first, t_done;
    long id;
    struct serve_job *next;      /* in the queue */
    struct serve_engine *engine; /* the engine running it */
} serve_job;

/* Takes p's contents; refs 2 (engine and HTTP); under lock (NULL: a lock of its own). */
serve_job *serve_job_create(serve_params *p, long id, serve_lock *lock);
/* Under the job's lock (or before it is submitted): an entry for token, its text starting at byte at (NULL: out of
 * memory). */
serve_logprob *serve_job_add_logprob(serve_job *j, int32_t token, size_t at);
void serve_job_release(serve_job *j);
void serve_job_cancel(serve_job *j);

/* The engine: a bounded queue and a thread that admits queued jobs into the
 * batcher's free slots and steps it while anything runs. */
typedef struct serve_engine serve_engine;
typedef struct {
    long requests, rejected, completed, cancelled, prompt_tokens, cached_tokens, tokens, steps, rows;
    int running, slots, queued, queue_cap;
    double tokens_per_s; /* over the last second or more of work */
    double busy_s;       /* time spent stepping */
    bool broken;         /* a decoding step failed: the engine takes no more work and the server stops */
} serve_stats;
dt_status serve_engine_create(dt_decoder *d, const serve_vocab *v, int budget, int queue_cap, serve_engine **out);
/* Queues j (DT_ERR_UNSUPPORTED: the queue is full or the engine drains). */
dt_status serve_engine_submit(serve_engine *e, serve_job *j);
serve_stats serve_engine_stats(serve_engine *e);
/* Stop taking jobs; finish the queued and running ones; then the thread ends (destroy joins it). */
void serve_engine_drain(serve_engine *e);
bool serve_engine_idle(serve_engine *e);
void serve_engine_destroy(serve_engine *e);

double serve_now(void);

/* A response being made (answer.c): its n choices, each a job and what of it has gone out, and the bytes ready. */
typedef struct {
    serve_job *job;
    size_t sent;             /* of the job's text, the bytes sent (a stream) */
    size_t sent_r, sent_c;   /* a thinking model's stream: the reasoning's and the content's */
    int chunks;              /* chunks made (a chat stream's first names the role) */
    int lp_sent;             /* logprobs entries sent */
    size_t lp_byte, lp_char; /* a byte of the text and the characters before it (text_offset counts characters) */
    bool ended;              /* its last chunk made (a stream), or its part of the whole response */
    struct cJSON *whole;     /* a whole response's choice, once its job is done */
} serve_choice;

typedef struct {
    const serve_vocab *vocab;
    const char *model_name;
    long id, created;
    serve_choice *ch;
    int n;
    bool chat, stream;
    char *out;               /* the bytes ready for the client */
    size_t out_len;
    bool finished;           /* the last of them are in out */
} serve_answer;
/* Under the jobs' lock: whether produce has something to add (a choice's new text or its end; a failed job). */
bool serve_answer_ready(const serve_answer *a);
/* Under the jobs' lock: the next bytes into out (a stream's new chunks, each of one choice; the whole response once
 * every job is done; a failed job's error), finished set with the last. */
void serve_answer_produce(serve_answer *a);
void serve_answer_free(serve_answer *a);
/* OpenAI's error object for an answer of status (5xx: server_error, else invalid_request_error): message (UTF-8
 * cleaned), param (NULL: null), code null. */
struct cJSON *serve_error_object(unsigned status, const char *param, const char *message);

#endif
