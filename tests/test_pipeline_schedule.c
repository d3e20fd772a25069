/* The pipeline schedules as lists: for every p <= 8 and m <= 16, each
 * schedule is built and runs deadlock-free in the simulator with sends that
 * wait for their receiver; every stage computes F and B of each micro-batch
 * once, its backwards in micro-batch order, a B after its own F; the
 * activation slots are GPipe's m, 1F1B's min(p - s, m), ZB-H1's min(p, m)
 * and interleaved's min(m, 2p, (v+1)p - 1 - 2s), what the memory plan
 * counts (dt_plan_pp_slots); the simulated bubble is theory's ((p-1)/(m+p-1); ZB-H1's
 * (p-1)/(3m+p-1)). A list with an exchange split into a
 * send and then a receive is refused as a deadlock, one that receives the
 * wrong micro-batch as a mismatch, naming both. */
#include "dtrain/pipeline.h"
#include "dtrain/plan.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* Every stage: m F, m B (and with a split backward m W), B and W in micro
 * order, each B after its F, each W after its B; the last flag on the last
 * gradient computation (B, or W). */
static int well_formed(const dt_pp_schedule *s, char *why, size_t n) {
    int split = s->kind == DT_PP_ZB1, v = s->virt;
    for (int st = 0; st < s->stages; st++) {
        /* per chunk: forwards and backwards counted, backwards in micro-batch order (interleaved: chunk j's) */
        int f = 0, b = 0, w = 0, seen[8][64] = { { 0 } }, bc[8] = { 0 }, nb = 0;
        for (int i = 0; i < s->n[st]; i++) {
            const dt_pp_action *a = &s->act[st][i];
            if (a->op == DT_PP_F) { seen[a->chunk][a->micro] = 1; f++; }
            if (a->op == DT_PP_B) {
                if (a->micro != bc[a->chunk] || !seen[a->chunk][a->micro]) {
                    snprintf(why, n, "stage %d: B%d.%d at %d", st, a->micro, a->chunk, i);
                    return 0;
                }
                nb++;
                if (a->last != (!split && nb == v * s->micro)) { snprintf(why, n, "stage %d: B%d's last flag", st, a->micro); return 0; }
                bc[a->chunk]++;
                b++;
            }
            if (a->op == DT_PP_W) {
                if (!split || a->micro != w || a->micro >= b) { snprintf(why, n, "stage %d: W%d at %d", st, a->micro, i); return 0; }
                if (a->last != (w == s->micro - 1)) { snprintf(why, n, "stage %d: W%d's last flag", st, a->micro); return 0; }
                w++;
            }
        }
        if (f != v * s->micro || b != v * s->micro || w != (split ? s->micro : 0)) {
            snprintf(why, n, "stage %d: %d F, %d B, %d W", st, f, b, w);
            return 0;
        }
    }
    return 1;
}

/* The bubble of a replay in which each action of stage st's chunk j takes t[3 (st v + j) + op] (F, B, W). */
static double replay(dt_pp_kind kind, int p, int v, int m, const double *t) {
    dt_pp_schedule *s;
    if (dt_pp_schedule_create(kind, p, v, m, &s)) return -1;
    size_t n = 0;
    for (int st = 0; st < p; st++) n += (size_t)s->n[st];
    double d[4096], b = -1;
    if (n <= sizeof d / sizeof *d) {
        n = 0;
        for (int st = 0; st < p; st++)
            for (int i = 0; i < s->n[st]; i++) {
                const dt_pp_action *a = &s->act[st][i];
                d[n++] = a->op == DT_PP_COMM ? 0 : t[3 * (st * v + a->chunk) + a->op];
            }
        b = dt_pp_schedule_bubble_replay(s, d);
    }
    dt_pp_schedule_destroy(s);
    return b;
}

/* The micro-batches in flight the memory plan counts on stage k (dt_plan_pp_slots). */
static int plan_slots(dt_pp_kind kind, int p, int v, int m, int k) {
    dt_plan_job j = { .pp = p, .virt = v, .micro = m, .gpipe = kind == DT_PP_GPIPE, .zb = kind == DT_PP_ZB1 };
    return dt_plan_pp_slots(&j, k);
}

/* Stage k's chunk areas (each chunk's micro-batches held at once) against its action list walked here, the planner's
 * count (dt_pp_chunk_areas) and the slots: a chunk never holds more than the slots do, and all chunks together no
 * more than v whole slots would. */
static void check_areas(const dt_pp_schedule *s, int k) {
    int v = s->virt, held[8] = { 0 }, most[8] = { 0 }, plan[8], total = 0;
    for (int i = 0; i < s->n[k]; i++) {
        const dt_pp_action *a = &s->act[k][i];
        if (a->op == DT_PP_F && ++held[a->chunk] > most[a->chunk]) most[a->chunk] = held[a->chunk];
        if (a->op == DT_PP_B) held[a->chunk]--;
    }
    EXPECT(!dt_pp_chunk_areas(s->kind, s->stages, v, s->micro, k, plan), "interleaved p=%d v=%d m=%d: no chunk areas", s->stages, v, s->micro);
    for (int j = 0; j < v; j++) {
        const int got = s->areas[k * v + j];
        total += got;
        EXPECT(got == most[j] && got == plan[j] && got <= s->slots[k], "interleaved p=%d v=%d m=%d stage %d chunk %d: %d areas, the list's %d, "
               "the plan's %d, %d slots", s->stages, v, s->micro, k, j, got, most[j], plan[j], s->slots[k]);
    }
    EXPECT(total <= v * s->slots[k], "interleaved p=%d v=%d m=%d stage %d: %d areas, more than %d whole slots", s->stages, v, s->micro, k, total, s->slots[k]);
}

int main(void) {
    int built = 0;
    for (int kind = 0; kind < 3; kind++)
        for (int p = 1; p <= 8; p++)
            for (int m = 1; m <= 16; m++) {
                dt_pp_schedule *s;
                dt_status st = dt_pp_schedule_create(kind, p, 1, m, &s);
                if (st) { EXPECT(0, "%s p=%d m=%d: %s", dt_pp_kind_name(kind), p, m, dt_last_error()); continue; }
                built++;
                char why[128] = "";
                EXPECT(well_formed(s, why, sizeof why), "%s p=%d m=%d: %s", dt_pp_kind_name(kind), p, m, why);
                /* one stage is no pipeline: a run without --pp has the one arena the plan counts */
                for (int k = 0; k < p && p > 1; k++) {
                    int want = plan_slots(kind, p, 1, m, k);
                    EXPECT(s->slots[k] == want, "%s p=%d m=%d stage %d: %d slots, the plan's %d", dt_pp_kind_name(kind), p, m, k, s->slots[k],
                           want);
                }
                /* ZB-H1's (p-1)(TF+TB-TW) idle per stage, TF = TB = TW: (p-1)/(3m+p-1), where m >= p; fewer micro-batches
                 * cannot fill the pipeline, but still idle less than 1F1B */
                double b = dt_pp_schedule_bubble(s), theory = (double)(p - 1) / (m + p - 1);
                if (kind == DT_PP_ZB1 && m >= p) theory = (double)(p - 1) / (3 * m + p - 1);
                if (kind == DT_PP_ZB1 && m < p)
                    EXPECT(b < theory - 1e-12 || p == 1, "zb1 p=%d m=%d: bubble %.4f, not below 1f1b's %.4f", p, m, b, theory);
                else
                    EXPECT(fabs(b - theory) < 1e-12, "%s p=%d m=%d: bubble %.4f, theory %.4f", dt_pp_kind_name(kind), p, m, b, theory);
                dt_pp_schedule_destroy(s);
            }
    /* interleaved: every p, v and m (a multiple of p) it takes, theory's (p-1)/(vm+p-1) */
    for (int p = 2; p <= 8; p++)
        for (int v = 2; v <= 4; v++)
            for (int m = p; m <= 16; m += p) {
                dt_pp_schedule *s;
                dt_status st = dt_pp_schedule_create(DT_PP_INTERLEAVED, p, v, m, &s);
                if (st) { EXPECT(0, "interleaved p=%d v=%d m=%d: %s", p, v, m, dt_last_error()); continue; }
                built++;
                char why[128] = "";
                EXPECT(well_formed(s, why, sizeof why), "interleaved p=%d v=%d m=%d: %s", p, v, m, why);
                for (int k = 0; k < p; k++) {
                    int want = plan_slots(DT_PP_INTERLEAVED, p, v, m, k);
                    EXPECT(s->slots[k] == want, "interleaved p=%d v=%d m=%d stage %d: %d slots, the plan's %d", p, v, m, k, s->slots[k], want);
                    check_areas(s, k);
                }
                double b = dt_pp_schedule_bubble(s), theory = (double)(p - 1) / (v * m + p - 1);
                EXPECT(fabs(b - theory) < 1e-12, "interleaved p=%d v=%d m=%d: bubble %.4f, theory %.4f", p, v, m, b, theory);
                dt_pp_schedule_destroy(s);
            }
    printf("%d schedules built and checked\n", built);

    /* Megatron's count, by hand: p 2, v 2, m 8; stage 0 warms up with 4 forwards (micro-batches 0, 1 on chunk 0, then
     * on chunk 1), then runs F and B in turn: chunk 0 holds 4 micro-batches at most, chunk 1 2 (6 of the 8 whole
     * slots' 2 x 4); stage 1 (2 forwards first) 3 and 1 (4 of 2 x 3) */
    {
        dt_pp_schedule *s;
        if (!dt_pp_schedule_create(DT_PP_INTERLEAVED, 2, 2, 8, &s)) {
            const int *a = s->areas;
            EXPECT(a[0] == 4 && a[1] == 2 && a[2] == 3 && a[3] == 1 && s->slots[0] == 4 && s->slots[1] == 3,
                   "interleaved p=2 v=2 m=8: areas %d+%d and %d+%d, slots %d and %d (not 4+2 and 3+1 of 4 and 3)", a[0], a[1], a[2], a[3], s->slots[0],
                   s->slots[1]);
            dt_pp_schedule_destroy(s);
        }
    }

    /* a replay with given durations: equal stages give theory's; 1F1B, p = 2, m = 4 with stage 1 twice as slow: it
     * computes 24 of a span of 1 (stage 0's first F) + 24 + 2 (stage 0's last B), stage 0 12: 1 - 36/54 = 1/3 */
    {
        double equal[6] = { 1, 2, 0, 1, 2, 0 }, slow[6] = { 1, 2, 0, 2, 4, 0 };
        double be = replay(DT_PP_1F1B, 2, 1, 4, equal), bs = replay(DT_PP_1F1B, 2, 1, 4, slow);
        EXPECT(fabs(be - 0.2) < 1e-12, "1f1b p=2 m=4, equal stages: bubble %.4f, not theory's 0.2", be);
        EXPECT(fabs(bs - 1.0 / 3) < 1e-12, "1f1b p=2 m=4, stage 1 twice as slow: bubble %.4f, not 1/3", bs);
        /* interleaved, p = 2, v = 2, m = 4 (stage 0 chunks 0, 1, stage 1 chunks 0, 1), equal: theory's 1/9; the last
         * chunk (the head's) heavier: more */
        double eq4[12] = { 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0 }, head[12] = { 1, 2, 0, 1, 2, 0, 1, 2, 0, 1.5, 3, 0 };
        double bi = replay(DT_PP_INTERLEAVED, 2, 2, 4, eq4), bh = replay(DT_PP_INTERLEAVED, 2, 2, 4, head);
        EXPECT(fabs(bi - 1.0 / 9) < 1e-12, "interleaved p=2 v=2 m=4, equal chunks: bubble %.4f, not theory's 1/9", bi);
        EXPECT(bh > bi + 0.01, "interleaved p=2 v=2 m=4, the head's chunk 1.5x: bubble %.4f, not above %.4f", bh, bi);
    }

    /* exchanges split into a send and then a receive on both sides deadlock (one side alone still pairs with the
     * other's exchange): 1F1B, p=2, m=2, "send a1 + receive g0" against "send g0 + receive a1" */
    dt_pp_schedule *s;
    if (!dt_pp_schedule_create(DT_PP_1F1B, 2, 1, 2, &s)) {
        dt_pp_schedule_print(s, stdout);
        int split = 0;
        for (int st = 0; st < 2; st++) {
            dt_pp_action *a = s->act[st];
            int i = 0;
            while (i < s->n[st] && !(a[i].op == DT_PP_COMM && a[i].send.peer >= 0 && a[i].recv.peer >= 0)) i++;
            if (i == s->n[st]) continue;
            dt_pp_action both = a[i];
            /* the list has room (6m actions): the rest one to the right */
            memmove(&a[i + 2], &a[i + 1], sizeof *a * (size_t)(s->n[st] - i - 1));
            a[i].recv.peer = -1;
            a[i + 1] = both;
            a[i + 1].send.peer = -1;
            s->n[st]++;
            split++;
        }
        EXPECT(split == 2, "1f1b p=2 m=2: %d exchanges found, not 2", split);
        dt_status e = dt_pp_schedule_check(s);
        EXPECT(e && strstr(dt_last_error(), "deadlocks"), "split exchanges: %s", e ? dt_last_error() : "accepted");
        if (e) printf("refused as expected: %s\n", dt_last_error());
        dt_pp_schedule_destroy(s);
    }
    /* a receive of the wrong micro-batch */
    if (!dt_pp_schedule_create(DT_PP_GPIPE, 3, 1, 2, &s)) {
        for (int i = 0; i < s->n[1]; i++)
            if (s->act[1][i].op == DT_PP_COMM && s->act[1][i].recv.peer == 0) { s->act[1][i].recv.micro = 1; break; }
        dt_status e = dt_pp_schedule_check(s);
        EXPECT(e && strstr(dt_last_error(), "stage 0 sends the activations of micro-batch 0 where stage 1 receives the activations of micro-batch 1"),
               "a wrong micro-batch: %s", e ? dt_last_error() : "accepted");
        dt_pp_schedule_destroy(s);
    }
    /* zb1: printed; a receive taken out leaves a send nobody receives */
    if (!dt_pp_schedule_create(DT_PP_ZB1, 4, 1, 8, &s)) {
        dt_pp_schedule_print(s, stdout);
        dt_pp_schedule_destroy(s);
    }
    if (!dt_pp_schedule_create(DT_PP_ZB1, 2, 1, 2, &s)) {
        int i = s->n[0] - 1;
        while (i >= 0 && !(s->act[0][i].op == DT_PP_COMM && s->act[0][i].recv.peer == 1)) i--;
        if (i >= 0) {
            memmove(&s->act[0][i], &s->act[0][i + 1], sizeof **s->act * (size_t)(s->n[0] - i - 1));
            s->n[0]--;
        }
        dt_status e = dt_pp_schedule_check(s);
        EXPECT(i >= 0 && e && strstr(dt_last_error(), "the gradient of micro-batch 1 that stage 0 never receives"),
               "zb1 without a receive: %s", e ? dt_last_error() : "accepted");
        dt_pp_schedule_destroy(s);
    }
    if (!dt_pp_schedule_create(DT_PP_INTERLEAVED, 2, 2, 4, &s)) {
        dt_pp_schedule_print(s, stdout);
        dt_pp_schedule_destroy(s);
    }
    EXPECT(dt_pp_schedule_create(DT_PP_INTERLEAVED, 4, 2, 6, &s) != DT_OK && strstr(dt_last_error(), "multiple"),
           "interleaved with 6 micro-batches on 4 stages: %s", dt_last_error());
    EXPECT(dt_pp_schedule_create(DT_PP_1F1B, 4, 2, 8, &s) != DT_OK && strstr(dt_last_error(), "interleaved"),
           "1f1b with 2 virtual stages: %s", dt_last_error());
    EXPECT(dt_pp_schedule_create(DT_PP_1F1B, 0, 1, 4, &s) != DT_OK, "0 stages accepted");
    printf("pipeline schedules: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
