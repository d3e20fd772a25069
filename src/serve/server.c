/* dtrain serve from start to stop: the model, its vocabulary, the decoder
 * and the engine made (any failure said before listening), the address
 * bound (a port in use said as such), libmicrohttpd started on it, then
 * SIGINT/SIGTERM: no new requests (503), the queued and running ones
 * finished and sent, and a summary. */
#include "dtrain/kernels.h"
#include "dtrain/parallel.h"
#include "dtrain/serve.h"
#include "dtrain/train.h"
#include "serve_http.h"

#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A listening socket on host:port (port 0: the system picks; *bound says which). */
static dt_status listen_on(const char *host, int port, int *fd_out, int *bound, bool *v6) {
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *res;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc) return dt_error(DT_ERR_ARG, "serve: --host %s: %s", host, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, err = 0;
    if (fd < 0) err = errno;
    else {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 256)) err = errno;
    }
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    if (err) {
        if (fd >= 0) close(fd);
        if (err == EADDRINUSE) return dt_error(DT_ERR_SYS, "serve: port %d on %s is in use (another server? give --port)", port, host);
        return dt_error(DT_ERR_SYS, "serve: cannot listen on %s:%d: %s", host, port, strerror(err));
    }
    struct sockaddr_storage a;
    socklen_t n = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &n);
    *bound = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port : ((struct sockaddr_in *)&a)->sin_port);
    *fd_out = fd;
    return DT_OK;
}

static dt_status load_vocab(const dt_serve_options *o, const dt_gpt2_config *c, serve_vocab *v) {
    *v = (serve_vocab){ .bpe = NULL, .vocab = c->vocab_size, .eot = -1, .chat = DT_CHAT_NONE };
    /* (a byte-level model of fewer than 256 tokens serves: params.c refuses a prompt's bytes beyond its vocabulary) */
    dt_status st = dt_bpe_for_model(o->bpe_encoder, o->bpe_vocab, c->vocab_size, 1, o->model, "serve", true, &v->bpe);
    if (!st && v->bpe && dt_bpe_vocab_size(v->bpe) == 50257) v->eot = 50256; /* GPT-2's <|endoftext|> */
    if (!st && v->bpe && !o->bpe_vocab) { /* a tokenizer.json: its tokenizer_config.json's chat template and end of text */
        char found[4200];
        snprintf(found, sizeof found, "%s/tokenizer.json", o->model);
        const char *tj = o->bpe_encoder ? o->bpe_encoder : found;
        st = dt_tokenizer_config_read(tj, v->bpe, &v->chat, &v->eot, NULL);
        if (st == DT_ERR_UNSUPPORTED) { /* completions still serve; chats go by the plain template */
            dt_log(DT_LOG_WARN, "serve: chats by dtrain's plain template: %s", dt_last_error());
            v->chat = DT_CHAT_NONE;
            st = DT_OK;
        }
        if (!st && v->chat != DT_CHAT_NONE)
            dt_log(DT_LOG_INFO, "serve: chats by the model's %s template", dt_chat_template_of(v->chat)->name);
    }
    if (!st) st = dt_token_ends_read(o->model, v->vocab, v->eot, &v->ends);
    if (!st) st = serve_vocab_mark_special(v);
    return st;
}

/* Until SIGINT/SIGTERM, or a decoding step fails (a tensor-parallel rank died): the engine has said which. */
static void wait_for_stop(serve_engine *e) {
    struct timespec t = { 0, 100000000 };
    while (!dt_train_interrupted() && !serve_engine_stats(e).broken) nanosleep(&t, NULL);
}

/* Drain: new requests refused, the engine's work finished, the last bytes sent (a few seconds' grace for idle keep-alives). */
static void drain(serve_http *h, serve_engine *e, struct MHD_Daemon *d) {
    struct timespec t = { 0, 50000000 };
    h->draining = true;
    serve_engine_drain(e);
    while (!serve_engine_idle(e)) nanosleep(&t, NULL);
    for (int i = 0; i < 100; i++) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!di || di->num_connections == 0) break;
        nanosleep(&t, NULL);
    }
}

static dt_status run(const dt_serve_options *o, dt_decoder *d, serve_vocab *v) {
    const dt_gpt2_config *c = dt_decoder_config(d);
    serve_engine *e = NULL;
    int fd = -1, port = 0;
    bool v6 = false;
    dt_status st = o->comm && dt_comm_size(o->comm) > 1 ? dt_decoder_lead(d) : DT_OK;
    if (!st) st = serve_engine_create(d, v, o->budget, o->queue, &e);
    if (!st) st = listen_on(o->host, o->port, &fd, &port, &v6);
    serve_http h = { e, v, o->model, c->max_seq_len, o->max_body, o->upload_seconds, false, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0 };
    struct MHD_Daemon *md = NULL;
    if (!st) {
        unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | (v6 ? MHD_USE_IPv6 : 0);
        md = MHD_start_daemon(flags, 0, NULL, NULL, serve_http_handle, &h, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED,
                              serve_http_completed, &h, MHD_OPTION_CONNECTION_LIMIT, 1024u, MHD_OPTION_CONNECTION_TIMEOUT,
                              serve_http_idle_seconds(o->upload_seconds), MHD_OPTION_END);
        if (!md) st = dt_error(DT_ERR_SYS, "serve: the HTTP server did not start on %s:%d", o->host, port);
    }
    if (!st) {
        char where[64];
        if (o->cuda) snprintf(where, sizeof where, "f32 weights on GPU %d", o->cuda - 1);
        else snprintf(where, sizeof where, "%s weights (%.1f MB)", dt_quant_name(o->quant), dt_decoder_weight_bytes(d) / 1e6);
        printf("dtrain serve: %s (%d layers, %d channels, vocabulary %d, context %d), %s, %d slots, %d rows a step, "
               "%d threads; listening on http://%s%s%s:%d\n", o->model, c->num_layers, c->channels, c->vocab_size, c->max_seq_len,
               where, o->slots, o->budget, dt_kernels_threads(), v6 ? "[" : "", o->host, v6 ? "]" : "", port);
        fflush(stdout);
        wait_for_stop(e);
        bool broken = serve_engine_stats(e).broken;
        printf("dtrain serve: stopping: %s\n", broken ? "a decoding step failed" : "finishing the requests in hand");
        fflush(stdout);
        drain(&h, e, md);
        serve_stats s = serve_engine_stats(e);
        MHD_stop_daemon(md);
        printf("dtrain serve: served %ld requests (%ld completed, %ld cancelled, %ld turned away), %ld tokens generated from %ld "
               "prompt tokens (%ld of them from a cache slot) in %.1f s of decoding\n", s.requests, s.completed, s.cancelled, s.rejected,
               s.tokens, s.prompt_tokens, s.cached_tokens, s.busy_s);
        if (broken) st = dt_error(DT_ERR_PEER, "serve: stopped: a decoding step failed (the error above names why)");
    } else if (fd >= 0) {
        close(fd);
    }
    serve_engine_destroy(e);
    if (dt_decoder_release(d) && !st) st = dt_error(DT_ERR_PEER, "serve: %s", dt_last_error()); /* the followers return */
    return st;
}

dt_status dt_serve_run(const dt_serve_options *o) {
    dt_kernels_set_threads(o->threads > 0 ? o->threads : dt_comm_default_threads(o->comm));
    dt_gpt2 *m = NULL;
    dt_decoder *d = NULL;
    dt_tp_ops ops;
    bool tp = o->comm && dt_comm_size(o->comm) > 1;
    dt_status st = dt_generate_load(o->model, o->lora, o->comm, tp, &ops, &m);
    int T = st ? 0 : dt_gpt2_get_config(m)->max_seq_len, ctx = o->context > 0 ? o->context : T < DT_SERVE_CONTEXT ? T : DT_SERVE_CONTEXT;
    if (!st && o->cuda) { /* the weights on the GPU: the host's copy is let go */
        st = dt_decoder_create_gpu(m, o->cuda - 1, o->slots, o->budget, ctx, &d);
        dt_gpt2_destroy(m);
    } else if (!st) { /* m is the decoder's: the weights held once */
        st = dt_decoder_create_taking(m, o->quant, o->slots, o->budget, ctx, &d);
    }
    if (st == DT_ERR_NOMEM)
        st = dt_error(st, "serve: %s (--context N: fewer positions a slot; --slots N: fewer slots)", dt_last_error());
    else if (!st && ctx < T && (!tp || dt_comm_rank(o->comm) == 0)) /* (the serving rank says it) */
        printf("dtrain serve: a request holds %d positions (--context N: up to the model's %d)\n", ctx, T);
    serve_vocab v = { 0 };
    if (!st && tp && dt_comm_rank(o->comm) > 0) st = dt_decoder_follow(d); /* the leader's steps, until it releases us */
    else {
        if (!st) st = load_vocab(o, dt_decoder_config(d), &v);
        if (!st) {
            signal(SIGPIPE, SIG_IGN);
            dt_train_catch_signals();
            st = run(o, d, &v);
        }
    }
    serve_vocab_free(&v);
    dt_decoder_destroy(d); /* and the model with it */
    return st;
}
