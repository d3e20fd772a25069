/* Runs a fuzz harness without libFuzzer (any compiler): every file named on
 * the command line (directories are walked one level), then `--mutate N`
 * deterministic mutations of each (bit flips, byte overwrites with boundary
 * values, truncations, duplicated and removed spans). This is the smoke run
 * that `make test` does; `make fuzz` runs the real, coverage-guided fuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static long inputs;

static void mutate_and_run(const uint8_t *seed, size_t n, int count) {
    static const uint8_t boundary[] = { 0x00, 0xff, 0x7f, 0x80, 0x01, '"', '{', '}', '[', ']', ':', ',', '-', '9', 'e', 0xc3 };
    uint8_t *buf = malloc(2 * n + 64);
    if (!buf) return;
    for (int k = 0; k < count; k++) {
        size_t len = n;
        memcpy(buf, seed, n);
        int edits = 1 + (int)(next() % 4);
        for (int e = 0; e < edits && len; e++) {
            size_t at = next() % len;
            switch (next() % 6) {
            case 0: buf[at] ^= (uint8_t)(1u << (next() % 8)); break;
            case 1: buf[at] = boundary[next() % sizeof boundary]; break;
            case 2: len = at; break; /* truncate */
            case 3: { /* a 4-byte field set to a large or negative value */
                static const uint32_t big[] = { 0xffffffffu, 0x7fffffffu, 0x80000000u, 0x10000000u, 0 };
                uint32_t v = big[next() % 5];
                if (at + 4 <= len) memcpy(buf + at, &v, 4);
                break;
            }
            case 4: { /* duplicate a span */
                size_t span = 1 + next() % 16;
                if (at + span <= len && len + span <= 2 * n + 64) {
                    memmove(buf + at + span, buf + at, len - at);
                    len += span;
                }
                break;
            }
            default: { /* remove a span */
                size_t span = 1 + next() % 16;
                if (at + span <= len) { memmove(buf + at, buf + at + span, len - at - span); len -= span; }
            }
            }
        }
        LLVMFuzzerTestOneInput(buf, len);
        inputs++;
    }
    free(buf);
}

static void run_file(const char *path, int mutations) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "%s: cannot open\n", path); exit(2); }
    uint8_t *data = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n == cap && !(data = realloc(data, cap = cap ? 2 * cap : 4096))) exit(2);
        got = fread(data + n, 1, cap - n, f);
        n += got;
    } while (got);
    fclose(f);
    LLVMFuzzerTestOneInput(data, n);
    inputs++;
    mutate_and_run(data, n, mutations);
    free(data);
}

int main(int argc, char **argv) {
    int mutations = 0, files = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mutate") && i + 1 < argc) { mutations = atoi(argv[++i]); continue; }
        struct stat sb;
        if (stat(argv[i], &sb) != 0) { fprintf(stderr, "%s: not found\n", argv[i]); return 2; }
        if (!S_ISDIR(sb.st_mode)) { run_file(argv[i], mutations); files++; continue; }
        DIR *d = opendir(argv[i]);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            run_file(p, mutations);
            files++;
        }
        if (d) closedir(d);
    }
    if (!files) { fprintf(stderr, "no inputs\n"); return 2; }
    printf("%s: %d files, %ld inputs run, no crash\n", argv[0], files, inputs);
    return 0;
}
