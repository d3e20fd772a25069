/* A completion's reward for reinforcement learning on a language model: a rule (contains:WORD, count:WORD) or a
 * program the user writes (cmd:COMMAND). The program runs once per scoring (sh -c COMMAND), reads one JSON line a
 * completion, {"prompt": text, "completion": text} (bytes that are not UTF-8 as U+FFFD) or for a conversational prompt
 * {"prompt": [messages], "completion": [{"role": "assistant", "content": text}]} (TRL's form; one that called tools:
 * its answers with their tool_calls and the tools' results), and writes one number a
 * line; dtrain writes and reads at once (poll), so a program that answers as it reads and one that answers at its
 * end both work. Its standard error is the run's. A program that fails, answers too few or too many lines, answers
 * something that is not a finite number, or says nothing for a minute is an error naming it and the line. */
#include "dtrain/train.h"
#include "cmd_exchange.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_CONTAINS, KIND_COUNT, KIND_CMD };

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
                      const char *const *turns, size_t *out_len) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        bool chat = messages && messages[i], tools = chat && turns && turns[i];
        ok = put(&b, &len, &cap, "{\"prompt\": ") &&
             (chat ? put(&b, &len, &cap, messages[i]) : put_string(&b, &len, &cap, prompts[i], strlen(prompts[i])));
        if (ok && tools) ok = put(&b, &len, &cap, ", \"completion\": ") && put(&b, &len, &cap, turns[i]) && put(&b, &len, &cap, "}\n");
        else if (ok)
            ok = put(&b, &len, &cap, chat ? ", \"completion\": [{\"role\": \"assistant\", \"content\": " : ", \"completion\": ") &&
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

static dt_status run_program(const dt_reward *r, int n, const char *const *prompts, const char *const *messages,
                             const char *const *completions, const size_t *lens, const char *const *turns, float *out) {
    size_t nin = 0, nout = 0;
    char *in = requests(n, prompts, messages, completions, lens, turns, &nin), *got = NULL;
    dt_status st = in ? dt_cmd_exchange("--reward", r->arg, in, nin, &got, &nout) : dt_error(DT_ERR_NOMEM, "--reward: out of memory");
    if (!st) st = answers(r, got, n, out);
    free(in);
    free(got);
    return st;
}

dt_status dt_reward_score(dt_reward *r, int n, const char *const *prompts, const char *const *messages, const char *const *completions,
                          const size_t *lens, const char *const *turns, float *out) {
    if (r->kind == KIND_CMD) return run_program(r, n, prompts, messages, completions, lens, turns, out);
    for (int i = 0; i < n; i++) {
        int k = occurrences(completions[i], lens[i], r->arg);
        out[i] = r->kind == KIND_COUNT ? (float)k : k > 0;
    }
    return DT_OK;
}
