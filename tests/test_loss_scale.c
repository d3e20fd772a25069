/* The loss scaler against DeepSpeed's DynamicLossScaler: the sequences of
 * overflowing and clean steps in fixtures/loss_scale.txt (written by
 * scripts/make_loss_scale_fixture.py from DeepSpeed itself) give the same
 * scale and hysteresis after every step, and the same stop at the floor;
 * the messages use DeepSpeed's words; a static scale never moves; bad
 * configurations are refused naming the key. */
#include "dtrain/optim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

static void replay(const char *path) {
    FILE *f = fopen(path, "r");
    EXPECT(f != NULL, "%s: cannot open", path);
    if (!f) return;
    char line[256], msg[256];
    dt_loss_scale_config c;
    dt_loss_scale s;
    int seqs = 0, steps = 0, wrong = 0, overflows = 0, halvings = 0, doublings = 0, raises = 0, in_seq = 0, stopped = 0;
    while (fgets(line, sizeof line, f)) {
        double a, b;
        int w, h, k, ov;
        if (sscanf(line, "config %lf %d %lf %d %d", &a, &w, &b, &h, &k) == 5) {
            dt_loss_scale_defaults(&c);
            c.scale = a, c.window = w, c.min_scale = b, c.hysteresis = h, c.consecutive_hysteresis = k;
            EXPECT(dt_loss_scale_check(&c, "fixture") == DT_OK, "sequence %d: config refused: %s", seqs, dt_last_error());
            dt_loss_scale_init(&s, &c);
            seqs++;
            in_seq = 1;
            stopped = 0;
        } else if (in_seq && sscanf(line, "step %d %lf %d", &ov, &a, &h) == 3) {
            double before = s.scale;
            dt_status st = stopped ? DT_ERR_NUMERIC : dt_loss_scale_update(&s, &c, ov, msg, sizeof msg);
            steps++;
            overflows += ov;
            halvings += s.scale < before;
            doublings += s.scale > before;
            if (st || s.scale != a || s.hysteresis != h) {
                if (wrong++ < 5) printf("sequence %d step %lld: DeepSpeed has scale %g hysteresis %d, dtrain %g %d (%s)\n", seqs,
                                        (long long)s.iter, a, h, s.scale, s.hysteresis, st ? dt_last_error() : "ok");
                stopped = st != DT_OK;
            }
            if (ov && !st && !strstr(msg, "OVERFLOW! Skipping step. Attempted loss scale: ")) wrong++;
        } else if (in_seq && sscanf(line, "raise %d", &k) == 1) {
            dt_status st = dt_loss_scale_update(&s, &c, 1, msg, sizeof msg);
            char want[32];
            snprintf(want, sizeof want, "step %d: ", k);
            EXPECT(st == DT_ERR_NUMERIC && !strncmp(dt_last_error(), want, strlen(want)), "sequence %d: DeepSpeed stopped at step %d, dtrain: %s", seqs, k,
                   st ? dt_last_error() : "went on");
            raises++;
            in_seq = 0;
        }
    }
    fclose(f);
    EXPECT(seqs >= 5 && steps > 1000 && overflows > 100 && halvings > 20 && doublings > 5 && raises >= 2,
           "the fixture exercises too little: %d sequences, %d steps, %d overflows, %d halvings, %d doublings, %d stops", seqs, steps,
           overflows, halvings, doublings, raises);
    EXPECT(wrong == 0, "%d of %d steps differ from DeepSpeed's", wrong, steps);
    printf("%d sequences, %d steps (%d overflows, %d halvings, %d doublings, %d stops at the floor): %d differ from DeepSpeed's\n", seqs,
           steps, overflows, halvings, doublings, raises, wrong);
}

int main(int argc, char **argv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/loss_scale.txt", argc > 1 ? argv[1] : "tests/fixtures");
    replay(path);

    /* the seeds' words, with DeepSpeed's defaults: 2^16, hysteresis 2 */
    dt_loss_scale_config c;
    dt_loss_scale s;
    char msg[256];
    dt_loss_scale_defaults(&c);
    dt_loss_scale_init(&s, &c);
    dt_loss_scale_update(&s, &c, 1, msg, sizeof msg);
    EXPECT(!strcmp(msg, "OVERFLOW! Skipping step. Attempted loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1"), "%s", msg);
    dt_loss_scale_update(&s, &c, 1, msg, sizeof msg);
    EXPECT(!strcmp(msg, "OVERFLOW! Skipping step. Attempted loss scale: 65536, reducing to 32768") && s.scale == 32768, "%s", msg);
    dt_loss_scale_update(&s, &c, 0, msg, sizeof msg);
    EXPECT(msg[0] == 0, "a clean step says '%s'", msg);

    /* a static scale never moves, and an overflow there only skips */
    c.dynamic = 0;
    c.scale = 128;
    dt_loss_scale_init(&s, &c);
    for (int i = 0; i < 50; i++) EXPECT(dt_loss_scale_update(&s, &c, i % 3 == 0, msg, sizeof msg) == DT_OK && s.scale == 128, "static");

    /* out of range: refused naming the key */
    dt_loss_scale_defaults(&c); c.window = 0;
    EXPECT(dt_loss_scale_check(&c, "cfg") && strstr(dt_last_error(), "loss_scale_window"), "window 0: %s", dt_last_error());
    dt_loss_scale_defaults(&c); c.hysteresis = 0;
    EXPECT(dt_loss_scale_check(&c, "cfg") && strstr(dt_last_error(), "hysteresis"), "hysteresis 0: %s", dt_last_error());
    dt_loss_scale_defaults(&c); c.min_scale = 1e9;
    EXPECT(dt_loss_scale_check(&c, "cfg") && strstr(dt_last_error(), "min_loss_scale"), "min above the start: %s", dt_last_error());
    dt_loss_scale_defaults(&c); c.scale = -1;
    EXPECT(dt_loss_scale_check(&c, "cfg") && strstr(dt_last_error(), "loss scale"), "scale -1: %s", dt_last_error());

    printf("loss scale: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
