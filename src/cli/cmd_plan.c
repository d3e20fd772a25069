/* dtrain plan [TRAIN'S FLAGS] [--hardware H] [--json] [--search [--ties PCT]] [--params N] [--nodes K]: flag parsing only. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain plan [TRAIN'S FLAGS] [--hardware H] [--json] [--search [--ties PCT]] [--params N] [--nodes K]\n"
            "  Any dtrain train command becomes a plan by changing its first word: per rank, memory by category\n"
            "  and the predicted step time by part, before anything is allocated. The layout rules are train's.\n"
            "  --model M          as train's (d6, 124M, 350M, 774M, 1558M, a model file), or a published shape dtrain\n"
            "                     describes but does not build: llama3.1-8b, llama3.1-70b, gpt3-175b,\n"
            "                     mixtral-8x7b, deepseek-v3 (3 dense layers, 58 mixtures; MLA as 16 K/V heads),\n"
            "                     qwen3-30b-a3b\n"
            "  --params N         a GPT-style transformer of N parameters (1.5e9, 7.5B) with ZeRO's mixed-precision\n"
            "                     Adam (2 + 2 + K bytes a parameter, K = 12), as the ZeRO paper counts model states\n"
            "  --hardware H       this (default: measured here: GEMM at the job's shapes, bandwidth, attention, the\n"
            "                     communication calibration), a100-40g, h100-80g, or FILE.json (docs/planner.md)\n"
            "  --nproc N          the job's ranks (or --dp x --tp x --pp x --cp); --nodes K: the machines they span\n"
            "  --json             one JSON object: params, grads, optimizer, preconditioner (K-FAC's, Shampoo's, SOAP's\n"
            "                     state), activations, buffers, total (bytes, the largest rank), fits, step_ms,\n"
            "                     tok_per_s, and the breakdown\n"
            "  --search           every layout of the ranks (dp x tp x pp x cp, ZeRO stage, micro-batch, --recompute,\n"
            "                     precision) at the same global batch, the ones that fit ranked by tok/s, and why\n"
            "                     each other one does not run\n"
            "  --ties PCT         with --search: layouts within PCT%% of a group's fastest share its rank (default 3:\n"
            "                     the plan's own figure moves by 2-3%% between runs on a busy machine; docs/planner.md)\n"
            "  --device cuda[:N]  one NVIDIA GPU's plan, from the GPU: the bytes the run's pre-flight counts, and the step\n"
            "                     timed there at the job's batch with the model's 1 and 2 layers (the step is linear\n"
            "                     in them); one process (docs/gpu.md)\n"
            "  --expert-load X[,K]  with --ep: each layer's busiest rank's routed rows over the mean, averaged over the\n"
            "                     layers (1, balanced, by default; a run's metrics say it: expert_rank_load_max_mean),\n"
            "                     whose experts' work the step waits for and the exchange's buffers grow to; K: the\n"
            "                     busiest rank's rows summed over its layers over the mean, which it keeps for backward\n"
            "                     (1 by default; expert_rank_rows_max_mean)\n");
}

static const dt_cli_flag flags[] = {
    { "--hardware", "this, a100-40g, h100-80g or a JSON file" }, { "--params", "a parameter count above 0 (1.5e9, 7.5B)" },
    { "--nodes", "a whole number of machines from 1 to 65536" }, { "--ties", "a percentage from 0 to 100" },
    { "--expert-load", "a number from 1 to 1000, or two joined by a comma (X,K)" }, { NULL, NULL },
};

/* "7.5B", "350M", "1.5e9" */
static int parse_count(const char *s, double *out) {
    char *end;
    double v = strtod(s, &end);
    double k = !*end ? 1 : !strcmp(end, "K") ? 1e3 : !strcmp(end, "M") ? 1e6 : !strcmp(end, "B") ? 1e9 : !strcmp(end, "T") ? 1e12 : 0;
    if (!(k > 0 && v > 0 && v * k < 1e16)) return 0;
    *out = v * k;
    return 1;
}

/* --expert-load X or X,K, each from 1 to 1000 */
static int expert_load(const char *v, dt_plan_request *rq) {
    char x[64];
    const char *comma = v ? strchr(v, ',') : NULL;
    snprintf(x, sizeof x, "%.*s", comma ? (int)(comma - v) : 63, v ? v : "");
    double a, b = 1;
    if (!dt_cli_number(x, 1, 1000, &a) || (comma && !dt_cli_number(comma + 1, 1, 1000, &b))) return 0;
    rq->expert_load = a, rq->expert_rows = b;
    return 1;
}

int dt_cli_plan(int argc, char **argv) {
    dt_plan_request rq = { .hardware = "this", .ties = 0.03 };
    char **rest = malloc(sizeof(char *) * ((size_t)argc + 1));
    if (!rest) return 1;
    int n = 0, ties = 0;
    rest[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        double x;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); free(rest); return 0; }
        if (!strcmp(f, "--json")) rq.json = 1;
        else if (!strcmp(f, "--search")) rq.search = 1;
        else if (!strcmp(f, "--hardware")) ok = v != NULL, rq.hardware = v, i++;
        else if (!strcmp(f, "--params")) ok = v && parse_count(v, &rq.params), i++;
        else if (!strcmp(f, "--ties")) ok = dt_cli_number(v, 0, 100, &x), rq.ties = x / 100, ties = 1, i++;
        else if (!strcmp(f, "--nodes")) ok = dt_cli_number(v, 1, 65536, &x) && x == (int)x, rq.nodes = (int)x, i++;
        else if (!strcmp(f, "--expert-load")) ok = expert_load(v, &rq), i++;
        else { rest[n++] = argv[i]; continue; }
        if (!ok) { free(rest); return dt_cli_flag_error("plan", flags, f, v); }
    }
    rest[n] = NULL;
    if (ties && !rq.search) {
        free(rest);
        fprintf(stderr, "dtrain error: plan: --ties ranks the layouts of --search, and this plan has no --search\n");
        return 2;
    }
    dt_train_config c;
    int rc = dt_cli_train_parse(n, rest, "plan", &c);
    rq.argc = n, rq.argv = rest;
    if (rc < 0) rc = dt_train_plan(&c, &rq, stdout);
    free(rest);
    return rc;
}
