/* check_trace TRACE.json METRICS.jsonl: what a trace-event parser needs of a
 * dtrain trace, and what it must show of a DDP run.
 *   - valid JSON with a traceEvents array; every event has ph, pid, ts
 *   - on each (rank, track) every begin has its end, nested (no partial overlaps)
 *   - times per rank never go backwards in file order
 *   - at least one bucket allreduce on the communication track starts while
 *     its rank's backward pass is running: after the step's first backward
 *     unit began and before its last one ended (the overlap DDP is for; the
 *     test runs with DTRAIN_DDP_WAIT_IN_BACKWARD=1, so this does not depend
 *     on how the machine schedules the progress thread)
 *   - rank 0's waits (exposed communication) over the traced steps agree with
 *     the metrics' comm_exposed_ms for those steps within 5% (or 0.1 ms a
 *     step: the two read the clock at different places, and a rank the VM
 *     preempts between them drifts by tens of microseconds; a missed wait
 *     is milliseconds)
 * Prints what it found; exits 1 naming the first problem. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define FAIL(...) do { printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); fails++; } while (0)

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = malloc((size_t)n + 1);
    if (t && fread(t, 1, (size_t)n, f) != (size_t)n) { free(t); t = NULL; }
    if (t) t[n] = 0;
    fclose(f);
    return t;
}

enum { RANKS = 64, TRACKS = 8, DEPTH = 64, MAXIV = 200000 };
typedef struct { int rank, track; double b, e; char name[40]; } interval;
static interval iv[MAXIV];
static int niv;

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: check_trace TRACE.json METRICS.jsonl\n"); return 2; }
    char *text = slurp(argv[1]);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    if (!cJSON_IsArray(ev)) { printf("FAIL: %s is not JSON with a traceEvents array\n", argv[1]); return 1; }
    static const cJSON *open[RANKS][TRACKS][DEPTH];
    static int depth[RANKS][TRACKS];
    static double last_ts[RANKS];
    int events = 0, first_step = 1 << 30, last_step = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph"), *pid = cJSON_GetObjectItemCaseSensitive(e, "pid"),
                    *tid = cJSON_GetObjectItemCaseSensitive(e, "tid"), *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
        if (!cJSON_IsString(ph) || !cJSON_IsNumber(pid)) { FAIL("event %d has no ph or pid", events); break; }
        if (!strcmp(ph->valuestring, "M")) continue;
        events++;
        int r = pid->valueint, t = cJSON_IsNumber(tid) ? tid->valueint : -1;
        if (r < 0 || r >= RANKS || t < 1 || t > TRACKS || !cJSON_IsNumber(ts)) { FAIL("event %d: bad pid/tid/ts", events); break; }
        if (ts->valuedouble < last_ts[r]) FAIL("rank %d: time goes back from %.3f to %.3f us", r, last_ts[r], ts->valuedouble);
        last_ts[r] = ts->valuedouble;
        if (!strcmp(ph->valuestring, "B")) {
            if (depth[r][t - 1] == DEPTH) { FAIL("rank %d track %d: nesting deeper than %d", r, t, DEPTH); break; }
            open[r][t - 1][depth[r][t - 1]++] = e;
        } else if (!strcmp(ph->valuestring, "E")) {
            if (depth[r][t - 1] == 0) { FAIL("rank %d track %d: an end at %.3f us without a begin", r, t, ts->valuedouble); continue; }
            const cJSON *b = open[r][t - 1][--depth[r][t - 1]];
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name");
            if (niv < MAXIV) {
                interval *x = &iv[niv++];
                *x = (interval){ r, t - 1, cJSON_GetObjectItemCaseSensitive(b, "ts")->valuedouble, ts->valuedouble, "" };
                snprintf(x->name, sizeof x->name, "%s", cJSON_IsString(name) ? name->valuestring : "");
                const cJSON *args = cJSON_GetObjectItemCaseSensitive(b, "args"), *st = cJSON_GetObjectItemCaseSensitive(args, "step");
                if (!strcmp(x->name, "step") && cJSON_IsNumber(st) && r == 0) {
                    if (st->valueint < first_step) first_step = st->valueint;
                    if (st->valueint > last_step) last_step = st->valueint;
                }
            }
        } else FAIL("event %d: phase %s (expected B, E or M)", events, ph->valuestring);
    }
    for (int r = 0; r < RANKS; r++)
        for (int t = 0; t < TRACKS; t++)
            if (depth[r][t]) FAIL("rank %d track %d: %d begins without their ends", r, t, depth[r][t]);
    printf("%d events, %d intervals, steps %d to %d\n", events, niv, first_step, last_step);
    /* overlap: a bucket allreduce started inside its rank's backward pass (within one step) */
    int overlaps = 0, allreduces = 0;
    for (int i = 0; i < niv; i++) {
        if (iv[i].track != 1 || strcmp(iv[i].name, "allreduce")) continue;
        allreduces++;
        for (int s = 0; s < niv; s++) {
            if (iv[s].rank != iv[i].rank || iv[s].track != 0 || strcmp(iv[s].name, "step") || iv[i].b < iv[s].b || iv[i].b > iv[s].e) continue;
            double first = 1e300, last = -1e300;
            for (int j = 0; j < niv; j++)
                if (iv[j].rank == iv[i].rank && iv[j].track == 0 && !strncmp(iv[j].name, "backward", 8) && iv[j].b >= iv[s].b &&
                    iv[j].e <= iv[s].e) {
                    if (iv[j].b < first) first = iv[j].b;
                    if (iv[j].e > last) last = iv[j].e;
                }
            if (iv[i].b >= first && iv[i].b <= last) overlaps++;
        }
    }
    printf("%d allreduces, %d of them started during backward\n", allreduces, overlaps);
    if (overlaps == 0) FAIL("no allreduce started during backward");
    /* exposed communication: rank 0's waits against the metrics */
    double waits = 0;
    for (int i = 0; i < niv; i++)
        if (iv[i].rank == 0 && iv[i].track == 0 && !strcmp(iv[i].name, "wait")) waits += (iv[i].e - iv[i].b) / 1e3;
    FILE *m = fopen(argv[2], "r");
    char line[8192];
    double exposed = 0;
    int steps = 0;
    while (m && fgets(line, sizeof line, m)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step"), *x = cJSON_GetObjectItemCaseSensitive(j, "comm_exposed_ms");
        if (cJSON_IsNumber(s) && cJSON_IsNumber(x) && s->valueint >= first_step && s->valueint <= last_step) {
            exposed += x->valuedouble;
            steps++;
        }
        cJSON_Delete(j);
    }
    if (m) fclose(m);
    double diff = fabs(waits - exposed), rel = diff / fmax(waits, exposed);
    printf("exposed communication, steps %d to %d: trace %.3f ms, metrics %.3f ms (%d steps): %.1f%% apart\n", first_step,
           last_step, waits, exposed, steps, 100 * rel);
    if (steps != last_step - first_step + 1 || steps == 0) FAIL("the metrics have %d of the traced steps", steps);
    if (rel > 0.05 && diff > 0.1 * steps) FAIL("the trace's exposed communication is more than 5%% (and 0.1 ms a step) from the metrics'");
    cJSON_Delete(root);
    if (!fails) printf("trace ok\n");
    return fails ? 1 : 0;
}
