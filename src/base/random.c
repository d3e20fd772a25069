/* Deterministic random numbers: splitmix64, and normals from it. */
#include "dtrain/base.h"

#include <math.h>

uint64_t dt_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void dt_rng_shuffle(int *perm, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) perm[i] = i;
    uint64_t s = seed ? seed : 1;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(dt_rng_next(&s) % (uint64_t)(i + 1));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* A Feistel network over 2h bits (2^2h >= n), its round a splitmix of the half and the round's key, walked until the
 * value falls below n (each try lands there with odds above 1/4): a bijection of [0, n) with no table. 8 rounds: with
 * 4, where one place lands over many seeds was visibly uneven for small n. */
uint64_t dt_rng_permute(uint64_t i, uint64_t n, uint64_t seed) {
    if (n < 2) return 0;
    int h = 1;
    while (h < 32 && (1ull << (2 * h)) < n) h++;
    uint64_t mask = (1ull << h) - 1, x = i;
    do {
        uint64_t l = x >> h, r = x & mask;
        for (uint64_t round = 0; round < 8; round++) {
            uint64_t s = seed ^ (round * 0xd6e8feb86659fd93ull) ^ (r * 0x9e3779b97f4a7c15ull);
            uint64_t f = dt_rng_next(&s) & mask, t = r;
            r = l ^ f;
            l = t;
        }
        x = (l << h) | r;
    } while (x >= n);
    return x;
}

float dt_rng_uniform(uint64_t *s) { return (float)((dt_rng_next(s) >> 40) * (1.0 / 16777216.0)); }

double dt_rng_double(uint64_t *s) { return (double)(dt_rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

float dt_rng_normal(uint64_t *s) {
    double u1 = ((dt_rng_next(s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = dt_rng_double(s);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* splitmix64's state only adds a constant per draw, so the k-th normal
 * (two draws each) of a stream is reachable without drawing those before:
 * initialisation can run in parallel and in pieces, with the same values. */
float dt_rng_normal_at(uint64_t seed, uint64_t k) {
    uint64_t s = seed + 2 * k * 0x9e3779b97f4a7c15ull;
    return dt_rng_normal(&s);
}
