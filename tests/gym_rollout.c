/* A rollout of a pool through the bridge, written for gym_bridge.sh to
 * compare with Gymnasium's own vector environment: ENV N SEED STEPS OUT.
 * Environment i's action at step t is a fixed function of (t, i): the
 * same on both sides. Each step's record: observations [N, obs_dim] f32,
 * rewards [N] f32, then terminated, truncated and reset [N] bytes.
 * With a fifth argument "bad-action": one step with an action outside the
 * space, which must be refused (exit 0 when it is, printing the message). */
#include "dtrain/rl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float action(const dt_env_info *in, int t, int i, int j) {
    if (in->actions) return (float)((t * 7 + i * 3 + t / 5) % in->actions);
    float lo = dt_env_act_low(in, j), hi = dt_env_act_high(in, j);
    return lo + (hi - lo) * (float)((t * 7 + i * 3 + j) % 9) / 8.0f; /* exact steps: numpy's float32 gives the same */
}

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: gym_rollout ENV N SEED STEPS OUT|bad-action\n"); return 2; }
    int n = atoi(argv[2]), T = atoi(argv[4]);
    dt_env_pool *p;
    if (dt_env_pool_create(argv[1], n, 0, strtoull(argv[3], NULL, 10), NULL, &p)) { fprintf(stderr, "%s\n", dt_last_error()); return 1; }
    const dt_env_info *in = dt_env_pool_info(p);
    float *obs = malloc(sizeof(float) * (size_t)n * in->obs_dim), *a = malloc(sizeof(float) * (size_t)n * in->act_dim);
    float *r = malloc(sizeof(float) * (size_t)n);
    uint8_t *f = malloc(3 * (size_t)n);
    dt_status st = dt_env_pool_reset(p, obs);
    if (!strcmp(argv[5], "bad-action")) {
        for (int i = 0; i < n * in->act_dim; i++) a[i] = in->actions ? (float)in->actions : dt_env_act_high(in, i % in->act_dim) + 1;
        st = st ? st : dt_env_pool_step(p, a, obs, r, f, f + n, f + 2 * n);
        printf("%s\n", st ? dt_last_error() : "accepted");
        free(obs); free(a); free(r); free(f);
        dt_env_pool_destroy(p);
        return st == DT_ERR_ARG ? 0 : 1;
    }
    FILE *out = fopen(argv[5], "wb");
    if (!out) return 1;
    fwrite(obs, sizeof(float), (size_t)n * in->obs_dim, out);
    for (int t = 0; t < T && !st; t++) {
        for (int i = 0; i < n; i++)
            for (int j = 0; j < in->act_dim; j++) a[i * in->act_dim + j] = action(in, t, i, j);
        if ((st = dt_env_pool_step(p, a, obs, r, f, f + n, f + 2 * n))) break;
        fwrite(obs, sizeof(float), (size_t)n * in->obs_dim, out);
        fwrite(r, sizeof(float), (size_t)n, out);
        fwrite(f, 1, 3 * (size_t)n, out);
    }
    if (st) fprintf(stderr, "%s\n", dt_last_error());
    printf("%s: %d environments, %d observation floats, %d steps\n", in->id, n, in->obs_dim, T);
    fclose(out);
    free(obs); free(a); free(r); free(f);
    dt_env_pool_destroy(p);
    return st ? 1 : 0;
}
