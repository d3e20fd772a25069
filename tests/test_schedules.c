/* Hugging Face's learning-rate schedules: dtrain's --schedule linear and wsd
 * give, at every step of the cases in fixtures/schedules.txt (written by
 * scripts/make_schedule_fixture.py from transformers' own
 * get_linear_schedule_with_warmup and get_wsd_schedule driving an
 * optimizer), the rate transformers ran that step at, steps past the end
 * included. */
#include "dtrain/optim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int passed, failed;

/* One case's header: its schedule and how many rates follow. 0 at the end of the file. */
static int read_case(FILE *f, dt_schedule *s, char *name, size_t name_len) {
    char line[256], kind[16], type[16];
    double lr, lr_min;
    int steps;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "case %15s %lf %lf %d %d %d %15s %d", kind, &lr, &lr_min, &s->warmup, &s->total, &s->decay, type, &steps) == 8) {
            s->kind = !strcmp(kind, "linear") ? DT_SCHED_LINEAR : DT_SCHED_WSD;
            s->lr = (float)lr, s->lr_min = (float)lr_min;
            s->decay_type = !strcmp(type, "linear") ? DT_DECAY_LINEAR : !strcmp(type, "1-sqrt") ? DT_DECAY_SQRT : DT_DECAY_COSINE;
            snprintf(name, name_len, "%s lr %g min %g, warm-up %d of %d, decay %d %s", kind, lr, lr_min, s->warmup, s->total, s->decay, type);
            return steps;
        }
    return 0;
}

int main(int argc, char **argv) {
    char path[4096], name[160];
    snprintf(path, sizeof path, "%s/schedules.txt", argc > 1 ? argv[1] : "tests/fixtures");
    FILE *f = fopen(path, "r");
    if (!f) { printf("FAIL: %s: cannot open\n", path); return 1; }
    int cases = 0, kinds[2] = { 0, 0 };
    dt_schedule s;
    for (int steps; dt_schedule_defaults(&s), (steps = read_case(f, &s, name, sizeof name)) > 0;) {
        int wrong = -1, read = 0;
        double want = 0, got = 0;
        for (int k = 0; k < steps && fscanf(f, "%lf", &want) == 1; k++, read++) {
            got = dt_lr_at(&s, s.total, k);
            if (fabs(got - want) > 1e-12 + 2e-7 * fabs(want) && wrong < 0) wrong = k;
            if (wrong == k) break;
        }
        cases++, kinds[s.kind == DT_SCHED_WSD]++;
        if (wrong < 0 && read == steps) passed++, printf("ok   %s: %d steps as transformers'\n", name, steps);
        else if (wrong < 0) failed++, printf("FAIL %s: %d of %d rates in the fixture\n", name, read, steps);
        else failed++, printf("FAIL %s: step %d runs at %.9g, transformers' at %.9g\n", name, wrong, got, want);
    }
    fclose(f);
    if (kinds[0] >= 2 && kinds[1] >= 3) passed++;
    else failed++, printf("FAIL the fixture holds %d linear and %d wsd cases\n", kinds[0], kinds[1]);
    printf("schedules: %d cases, %d passed, %d failed\n", cases, passed, failed);
    return failed ? 1 : 0;
}
