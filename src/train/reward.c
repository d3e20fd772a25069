/* A completion's reward for reinforcement learning on a language model: a rule (contains:WORD, count:WORD) or a
 * program the user writes (cmd:COMMAND). The program runs once per scoring (sh -c COMMAND), reads one JSON line a
 * completion, {"prompt": text, "completion": text} (bytes that are not UTF-8 as U+FFFD) or for a conversational prompt
 * {"prompt": [messages], "completion": [{"role": "assistant", "content": text}]} (TRL's form), and writes one number a
 * line; dtrain writes and reads at once (poll), so a program that answers as it reads and one that answers at its
 * end both work. Its standard error is the run's. A program that fails, answers too few or too many lines, answers
 * something that is not a finite number, or says nothing for a minute is an error naming it and the line. */
#include "dtrain/train.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { KIND_CONTAINS, KIND_COUNT, KIND_CMD };
enum { QUIET_MS = 60000 };

struct dt_reward {
    int kind;
    char *arg; /* the word, or the command */
};

dt_status dt_reward_create(const char *spec, dt_reward **out) {
    static const char *const prefix[] = { "contains:", "count:", "cmd:" };
    *out = NULL;
    int kind = -1;
    for (int k = 0; k < 3 && spec; k++)
        if (!strncmp(spec, prefix[k], strlen(prefix[k]))) kind = k;
    const char *arg = kind >= 0 ? spec + strlen(prefix[kind]) : "";
    if (kind < 0 || !*arg)
        return dt_error(DT_ERR_ARG, "--reward %s: contains:WORD, count:WORD or cmd:COMMAND (a program reading {\"prompt\", \"completion\"} "
                        "lines and writing a number a line)", spec ? spec : "(none)");
    dt_reward *r = calloc(1, sizeof *r);
    if (r) r->arg = strdup(arg);
    if (!r || !r->arg) { dt_reward_destroy(r); return dt_error(DT_ERR_NOMEM, "--reward: out of memory"); }
    r->kind = kind;
    *out = r;
    return DT_OK;
}

void dt_reward_destroy(dt_reward *r) {
    if (!r) return;
    free(r->arg);
    free(r);
}

static int occurrences(const char *s, size_t n, const char *word) {
    size_t w = strlen(word);
    int k = 0;
    for (size_t i = 0; i + w <= n; i++)
        if (!memcmp(s + i, word, w)) k++, i += w - 1;
    return k;
}

/* Room for more bytes in a growing buffer. */
static bool room(char **buf, size_t len, size_t *cap, size_t more) {
    if (len + more <= *cap) return true;
    size_t c = (len + more) * 2;
    char *b = realloc(*buf, c);
    if (!b) return false;
    *buf = b, *cap = c;
    return true;
}

static bool put(char **buf, size_t *len, size_t *cap, const char *s) {
    size_t n = strlen(s);
    if (!room(buf, *len, cap, n)) return false;
    memcpy(*buf + *len, s, n);
    *len += n;
    return true;
}

/* s (n bytes) as a JSON string: made UTF-8, quotes, backslashes and control bytes escaped. */
static bool put_string(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    size_t m;
    char *u = dt_utf8_clean(s, n, &m);
    if (!u || !room(buf, *len, cap, 6 * m + 2)) { free(u); return false; }
    char *o = *buf + *len;
    *o++ = '"';
    for (size_t i = 0; i < m; i++) {
        unsigned char ch = (unsigned char)u[i];
        if (ch == '"' || ch == '\\') *o++ = '\\', *o++ = (char)ch;
        else if (ch < 0x20) o += sprintf(o, "\\u%04x", ch);
        else *o++ = (char)ch;
    }
    *o++ = '"';
    *len = (size_t)(o - *buf);
    free(u);
    return true;
}

/* The lines the program reads, one a completion. */
static char *requests(int n, const char *const *prompts, const char *const *messages, const char *const *completions, const size_t *lens,
                      size_t *out_len) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        bool chat = messages && messages[i];
        ok = put(&b, &len, &cap, "{\"prompt\": ") &&
             (chat ? put(&b, &len, &cap, messages[i]) : put_string(&b, &len, &cap, prompts[i], strlen(prompts[i]))) &&
             put(&b, &len, &cap, chat ? ", \"completion\": [{\"role\": \"assistant\", \"content\": " : ", \"completion\": ") &&
             put_string(&b, &len, &cap, completions[i], lens[i]) && put(&b, &len, &cap, chat ? "}]}\n" : "}\n");
    }
    if (!ok || !b) { free(b); return NULL; }
    *out_len = len;
    return b;
}

/* The program's answers into out[n]: the whole of its output parsed at its end. */
static dt_status answers(const dt_reward *r, const char *text, int n, float *out) {
    const char *s = text;
    int k = 0;
    while (*s) {
        const char *eol = strchr(s, '\n');
        size_t len = eol ? (size_t)(eol - s) : strlen(s);
        char line[64], *end;
        snprintf(line, sizeof line, "%.*s", (int)(len < 63 ? len : 63), s);
        double v = strtod(line, &end);
        while (*end == ' ' || *end == '\r' || *end == '\t') end++;
        if (k >= n) return dt_error(DT_ERR_IO, "--reward cmd:%s: more than %d lines of answers for %d completions", r->arg, n, n);
        if (end == line || *end || !isfinite(v))
            return dt_error(DT_ERR_IO, "--reward cmd:%s: answer line %d is \"%s\", not a finite number", r->arg, k + 1, line);
        out[k++] = (float)v;
        s = eol ? eol + 1 : s + len;
    }
    if (k < n) return dt_error(DT_ERR_IO, "--reward cmd:%s: %d answer line%s for %d completions", r->arg, k, k == 1 ? "" : "s", n);
    return DT_OK;
}

/* Writes in[0..n) to fd_in and reads fd_out to its end, whichever is ready; a minute of silence is an error. */
static dt_status exchange(const dt_reward *r, int fd_in, int fd_out, const char *in, size_t n, char **got, size_t *got_len) {
    size_t sent = 0, len = 0, cap = 4096;
    char *buf = malloc(cap);
    if (!buf) return dt_error(DT_ERR_NOMEM, "--reward: out of memory");
    while (fd_out >= 0) {
        struct pollfd p[2] = { { fd_out, POLLIN, 0 }, { sent < n ? fd_in : -1, POLLOUT, 0 } };
        int k = poll(p, 2, QUIET_MS);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { free(buf); return dt_error(DT_ERR_IO, "--reward cmd:%s: nothing from it for %d s", r->arg, QUIET_MS / 1000); }
        if (p[1].revents & (POLLOUT | POLLERR | POLLHUP)) {
            ssize_t w = write(fd_in, in + sent, n - sent);
            if (w < 0 && errno != EINTR && errno != EAGAIN) sent = n; /* it stopped reading: its answers say the rest */
            else if (w > 0) sent += (size_t)w;
            if (sent == n) close(fd_in), fd_in = -1;
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (len + 2048 > cap) {
                char *b = realloc(buf, cap *= 2);
                if (!b) { free(buf); return dt_error(DT_ERR_NOMEM, "--reward: out of memory"); }
                buf = b;
            }
            ssize_t rd = read(fd_out, buf + len, cap - len - 1);
            if (rd > 0) len += (size_t)rd;
            else if (rd == 0 || errno != EINTR) fd_out = -1; /* its end */
        }
    }
    if (fd_in >= 0) close(fd_in);
    buf[len] = 0;
    *got = buf, *got_len = len;
    return DT_OK;
}

static dt_status run_program(const dt_reward *r, int n, const char *const *prompts, const char *const *messages,
                             const char *const *completions, const size_t *lens, float *out) {
    size_t nin = 0, nout = 0;
    char *in = requests(n, prompts, messages, completions, lens, &nin), *got = NULL;
    int to[2] = { -1, -1 }, from[2] = { -1, -1 };
    if (!in || pipe(to) || pipe(from)) {
        free(in);
        for (int i = 0; i < 2; i++) { if (to[i] >= 0) close(to[i]); if (from[i] >= 0) close(from[i]); }
        return dt_error(DT_ERR_IO, "--reward cmd:%s: %s", r->arg, in ? strerror(errno) : "out of memory");
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(to[0], 0), dup2(from[1], 1);
        close(to[0]), close(to[1]), close(from[0]), close(from[1]);
        execl("/bin/sh", "sh", "-c", r->arg, (char *)NULL);
        _exit(127);
    }
    close(to[0]), close(from[1]);
    void (*was)(int) = signal(SIGPIPE, SIG_IGN); /* a program that stops reading is its answers' to explain */
    dt_status st = pid < 0 ? dt_error(DT_ERR_IO, "--reward cmd:%s: fork: %s", r->arg, strerror(errno))
                           : exchange(r, to[1], from[0], in, nin, &got, &nout);
    if (pid < 0) close(to[1]);
    close(from[0]);
    int status = 0;
    if (pid > 0 && st) kill(pid, SIGKILL);
    if (pid > 0) waitpid(pid, &status, 0);
    signal(SIGPIPE, was);
    if (!st && (!WIFEXITED(status) || WEXITSTATUS(status)))
        st = WIFEXITED(status) ? dt_error(DT_ERR_IO, "--reward cmd:%s: exited with status %d%s", r->arg, WEXITSTATUS(status),
                                          WEXITSTATUS(status) == 127 ? " (not found?)" : "")
                               : dt_error(DT_ERR_IO, "--reward cmd:%s: killed by signal %d", r->arg, WTERMSIG(status));
    if (!st) st = answers(r, got, n, out);
    free(in);
    free(got);
    return st;
}

dt_status dt_reward_score(dt_reward *r, int n, const char *const *prompts, const char *const *messages, const char *const *completions,
                          const size_t *lens, float *out) {
    if (r->kind == KIND_CMD) return run_program(r, n, prompts, messages, completions, lens, out);
    for (int i = 0; i < n; i++) {
        int k = occurrences(completions[i], lens[i], r->arg);
        out[i] = r->kind == KIND_COUNT ? (float)k : k > 0;
    }
    return DT_OK;
}
