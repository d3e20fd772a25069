/* The tools a GRPO rollout's completions call (--grpo-tools cmd:COMMAND or proc:COMMAND), run by the user's program:
 * started once a round of calls (cmd:, sh -c) or once for the run and kept (proc:, which must then write and flush a
 * line a call as it reads them), it reads one JSON line a call (as Python's json.dumps writes it: a float 2.0 stays one),
 * {"name": NAME, "arguments": {...}, "completion": K} (K the
 * completion's number in the run, its prompt's place in the stream times the group plus its place in the group: the
 * same on every layout, so a program can keep each rollout's state by it), and writes one line a
 * call, the call's result as the model will read it (any text; TRL's str() of a tool's return), in order; a call
 * that fails is answered {"error": "WHY"}, which the model reads and the metrics count (TRL's result where a tool
 * raises). A program that fails, answers too few or too many lines, or says nothing for a minute is an error naming
 * it: the run ends. */
#include "grpo_tools.h"
#include "cmd_exchange.h"
#include "cmd_proc.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_grpo_tools {
    const char *spec, *command;
    dt_cmd_proc *proc; /* proc:'s program (NULL: cmd:, a process a round) */
};

dt_status dt_grpo_tools_check(const char *spec) {
    if (spec && ((!strncmp(spec, "cmd:", 4) && spec[4]) || (!strncmp(spec, "proc:", 5) && spec[5]))) return DT_OK;
    return dt_error(DT_ERR_ARG, "--grpo-tools %s: cmd:COMMAND (a program a round, reading {\"name\", \"arguments\"} lines and writing "
                    "a result a line) or proc:COMMAND (one program for the run, a result line written and flushed a call)",
                    spec ? spec : "(none)");
}

dt_status dt_grpo_tools_create(const char *spec, dt_grpo_tools **out) {
    dt_status st = dt_grpo_tools_check(spec);
    dt_grpo_tools *t = st ? NULL : calloc(1, sizeof *t);
    *out = NULL;
    if (st) return st;
    if (!t) return dt_error(DT_ERR_NOMEM, "--grpo-tools: out of memory");
    bool proc = !strncmp(spec, "proc:", 5);
    t->spec = spec, t->command = spec + (proc ? 5 : 4);
    if (proc && (st = dt_cmd_proc_create("--grpo-tools", t->command, &t->proc))) {
        free(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

void dt_grpo_tools_destroy(dt_grpo_tools *t) {
    if (!t) return;
    dt_cmd_proc_destroy(t->proc);
    free(t);
}

dt_status dt_grpo_tools_run(dt_grpo_tools *t, const cJSON *calls, char ***results) {
    int n = cJSON_GetArraySize(calls), k = 0;
    char *in = NULL, *got = NULL, **out = calloc((size_t)n + 1, sizeof *out);
    size_t nin = 0, nout = 0, cap = 0;
    dt_status st = out ? DT_OK : dt_error(DT_ERR_NOMEM, "--grpo-tools: out of memory");
    /* each call as Python's json.dumps writes it (its arguments' floats kept: 2.0, as TRL hands a tool a float) */
    for (const cJSON *c = calls->child; !st && c; c = c->next)
        if (!(st = dt_chat_tojson(c, &in, &nin, &cap))) st = dt_chat_append(&in, &nin, &cap, "\n", 1);
    if (!st) st = t->proc ? dt_cmd_proc_lines(t->proc, in, nin, n, &got, &nout) : dt_cmd_exchange("--grpo-tools", t->command, in, nin, &got, &nout);
    for (char *s = got; !st && s && *s;) {
        char *eol = strchr(s, '\n'), *next = eol ? eol + 1 : s + strlen(s);
        if (eol) *eol = 0;
        if (eol && eol > s && eol[-1] == '\r') eol[-1] = 0;
        if (k == n) st = dt_error(DT_ERR_IO, "--grpo-tools %s: more than %d result lines for %d calls", t->spec, n, n);
        else if (!(out[k++] = strdup(s))) st = dt_error(DT_ERR_NOMEM, "--grpo-tools: out of memory");
        s = next;
    }
    if (!st && k < n) st = dt_error(DT_ERR_IO, "--grpo-tools %s: %d result line%s for %d calls", t->spec, k, k == 1 ? "" : "s", n);
    if (st) {
        for (int i = 0; out && i < n; i++) free(out[i]);
        free(out), out = NULL;
    }
    free(in), free(got);
    *results = out;
    return st;
}
