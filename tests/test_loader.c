/* The token loader with rows shuffled (--shuffle-rows): each row is T tokens of the file from a row's start, its
 * targets the next T; a pass reads every row the batches fill once; two ranks read what one process reads; each
 * pass draws anew; a seek lands where reading through does; a global batch is not a run of neighbouring rows. */
#include "dtrain/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { T = 4, ROWS = 100, B = 3, RANKS = 2, PER = B * RANKS, BATCHES = ROWS / PER };

static int passed, failed;
static void check(const char *what, int ok) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

/* A pass of one rank (epoch's rows of the BATCHES global batches, this rank's B of each, into rows[batch][B]); 0 if a
 * row's tokens are not a row of the file. */
static int read_pass(dt_loader *l, size_t rows[BATCHES][B]) {
    int32_t in[B * T], tg[B * T];
    int whole = 1;
    for (int b = 0; b < BATCHES; b++) {
        dt_loader_next(l, in, tg);
        for (int i = 0; i < B; i++) {
            rows[b][i] = (size_t)in[i * T] / T;
            for (int t = 0; t < T; t++) whole &= in[i * T + t] == (int32_t)(rows[b][i] * T + t) && tg[i * T + t] == in[i * T + t] + 1;
            whole &= in[i * T] % T == 0;
        }
    }
    return whole;
}

int main(void) {
    char path[] = "/tmp/dtrain_loader_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    close(fd);
    uint32_t tok[ROWS * T + 1];
    for (int i = 0; i <= ROWS * T; i++) tok[i] = (uint32_t)i;
    dt_tokens *t = NULL;
    dt_loader *one = NULL, *rank[RANKS] = { NULL };
    if (dt_tokens_write(path, tok, ROWS * T + 1) || dt_tokens_open(path, &t) || dt_loader_create(t, PER, T, 0, 1, 7, true, &one)) {
        printf("FAIL setup: %s\n", dt_last_error());
        return 1;
    }
    for (int r = 0; r < RANKS; r++)
        if (dt_loader_create(t, B, T, r, RANKS, 7, true, &rank[r])) {
            printf("FAIL rank %d's loader: %s\n", r, dt_last_error());
            return 1;
        }
    size_t (*first)[B] = calloc(RANKS * BATCHES, sizeof *first), (*second)[B] = calloc(RANKS * BATCHES, sizeof *second);
    size_t (*whole)[PER] = calloc(2 * BATCHES, sizeof *whole);
    int rows_ok = 1;
    for (int r = 0; r < RANKS; r++) rows_ok &= read_pass(rank[r], first + r * BATCHES) & read_pass(rank[r], second + r * BATCHES);
    {
        size_t (*w)[B] = (size_t(*)[B])whole; /* one process's batches, PER rows each: read in pieces of B */
        int32_t in[PER * T], tg[PER * T];
        for (int b = 0; b < 2 * BATCHES; b++) {
            dt_loader_next(one, in, tg);
            for (int i = 0; i < PER; i++) w[b * RANKS + i / B][i % B] = (size_t)in[i * T] / T;
        }
    }
    check("each row read is T tokens from a row's start, its targets the next T", rows_ok);
    int same = 1, seen[ROWS] = { 0 }, once = 1, moved = 0, apart = 0;
    for (int b = 0; b < BATCHES; b++)
        for (int r = 0; r < RANKS; r++)
            for (int i = 0; i < B; i++) {
                size_t a = first[r * BATCHES + b][i], c = second[r * BATCHES + b][i];
                same &= whole[b][r * B + i] == a && whole[BATCHES + b][r * B + i] == c;
                once &= !seen[a]++;
                moved += a != c;
                if (i && a != first[r * BATCHES + b][i - 1] + 1) apart++;
            }
    check("2 ranks x batch 3 read one process x batch 6's rows, two passes", same);
    check("a pass reads each row once (96 of the 100: the batches' rows)", once);
    char what[160];
    snprintf(what, sizeof what, "the second pass draws anew: %d of 96 places hold another row", moved);
    check(what, moved > 80);
    snprintf(what, sizeof what, "a batch's rows come from across the file: %d of 64 neighbours in a batch not next in the file", apart);
    check(what, apart > 50);
    dt_loader_seek(rank[1], 1, 5);
    int32_t in[B * T], tg[B * T];
    dt_loader_next(rank[1], in, tg);
    check("a seek to pass 1, batch 5 reads what reading through did", (size_t)in[0] / T == second[BATCHES + 5][0] && (size_t)in[2 * T] / T == second[BATCHES + 5][2]);
    free(first), free(second), free(whole);
    for (int r = 0; r < RANKS; r++) dt_loader_destroy(rank[r]);
    dt_loader_destroy(one);
    dt_tokens_close(t);
    unlink(path);
    printf("loader: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
