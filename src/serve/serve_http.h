/* The HTTP side's state and its two libmicrohttpd callbacks (http.c); the
 * server (server.c) starts the daemon with them. */
#ifndef DTRAIN_SERVE_HTTP_H
#define DTRAIN_SERVE_HTTP_H

#include "serve_internal.h"

#include <microhttpd.h>
#include <stdatomic.h>

/* libmicrohttpd's idle timeout for a connection: a body's upload time and 5 s more (a slow client's 408 goes first). */
static inline unsigned serve_http_idle_seconds(double upload_seconds) { return (unsigned)upload_seconds + 5; }

typedef struct {
    serve_engine *engine;
    const serve_vocab *vocab;
    const char *model_name;
    int context;
    size_t max_body;       /* bytes a request body may have */
    double upload_seconds; /* a request body must arrive within this */
    atomic_bool draining;  /* set by the main thread on SIGTERM, read by the connections' */
    pthread_mutex_t mu;
    long next_id, errors_4xx, errors_5xx;
} serve_http;

enum MHD_Result serve_http_handle(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *data, size_t *size, void **con_cls);
void serve_http_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why);

#endif
