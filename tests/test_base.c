/* Base layer: dtype conversions against exact values, size parsing, errors. */
#include "dtrain/base.h"

#include <math.h>
#include <stdio.h>
#include <unistd.h>
#include <string.h>
#include <stdlib.h>
#include <sys/wait.h>

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* Stop requests: copies of one Ctrl-C (the terminal's and a wrapper's) are one; the same sender again is a second. */
static void stop_requests(void) {
    siginfo_t term = { .si_code = SI_KERNEL }, wrapper = { .si_code = SI_USER }, other = { .si_code = SI_USER };
    wrapper.si_pid = 4242;
    other.si_pid = 777;
    int a = dt_stop_request_classify(&term), b = dt_stop_request_classify(&wrapper), c = dt_stop_request_classify(&other);
    int d = dt_stop_request_classify(&term);
    usleep(1100 * 1000);
    int e = dt_stop_request_classify(&wrapper);
    EXPECT(a == 1 && b == 0 && c == 0, "the first request and its copies from other senders: %d %d %d (want 1 0 0)", a, b, c);
    EXPECT(d == 2, "the terminal again: %d (want 2, a second request)", d);
    EXPECT(e == 2, "another sender more than a second later: %d (want 2)", e);
}

/* dt_rng_permute: a bijection of [0, n) for sizes of every shape, that moves most places far, whose image of one place
 * spreads over every place as the seed changes, and that another seed draws anew. */
static void permutations(void) {
    const uint64_t sizes[] = { 1, 2, 3, 5, 64, 1000, 65539, (1u << 20) + 7 };
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        uint64_t n = sizes[k], near = 0, same = 0;
        unsigned char *seen = calloc(n, 1);
        int bad = 0;
        for (uint64_t i = 0; i < n && !bad; i++) {
            uint64_t p = dt_rng_permute(i, n, 7);
            if (p >= n || seen[p]) bad = 1;
            else seen[p] = 1;
            near += (p > i ? p - i : i - p) * 100 < n;
            same += p == dt_rng_permute(i, n, 8);
        }
        free(seen);
        EXPECT(!bad, "dt_rng_permute: not a permutation of %llu places", (unsigned long long)n);
        if (n >= 1000)
            EXPECT(near * 20 < n && same * 100 < n, "dt_rng_permute over %llu: %llu places within 1%% of where they were, %llu the same "
                   "under another seed (want under 5%% and 1%%)", (unsigned long long)n, (unsigned long long)near, (unsigned long long)same);
    }
    int count[8] = { 0 };
    for (uint64_t seed = 1; seed <= 8000; seed++) count[dt_rng_permute(3, 8, seed)]++;
    int lo = 8000, hi = 0;
    for (int i = 0; i < 8; i++) lo = count[i] < lo ? count[i] : lo, hi = count[i] > hi ? count[i] : hi;
    EXPECT(lo > 900 && hi < 1100, "dt_rng_permute: place 3 of 8 under 8000 seeds lands %d to %d times a place (want 900-1100)", lo, hi);
}

/* Writes text into root/rel, making its folders. */
static void put(const char *root, const char *rel, const char *text) {
    char path[512], cmd[600];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    if (system(cmd) != 0) return;
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

/* Control groups' limits from made trees: v2 and v1, the tightest of a group and its parents, the root counted,
 * "max" and -1 as none, a controller named exactly (cpuacct and cpuset are not cpu). */
static void cgroups(void) {
    char root[] = "/tmp/dt_cgroupXXXXXX", self[64];
    if (!mkdtemp(root)) { EXPECT(0, "mkdtemp failed"); return; }
    snprintf(self, sizeof self, "%s/self", root);
    put(root, "self", "0::/a/b\n");
    put(root, "cpu.max", "max 100000\n");
    put(root, "a/cpu.max", "250000 100000\n");
    put(root, "a/b/cpu.max", "max 100000\n");
    put(root, "a/memory.max", "max\n");
    put(root, "a/b/memory.max", "1073741824\n");
    double cpu = dt_cgroup_cpu_limit(root, self);
    size_t mem = dt_cgroup_memory_limit(root, self);
    EXPECT(cpu == 2.5, "v2, a parent's cpu.max 250000 100000 under the group's max: %g cores (want 2.5)", cpu);
    EXPECT(mem == 1073741824u, "v2, the group's memory.max 1 GiB under its parent's max: %zu bytes", mem);
    put(root, "cpu.max", "50000 100000\n"); /* a container's root, tighter still */
    EXPECT((cpu = dt_cgroup_cpu_limit(root, self)) == 0.5, "v2, the root's cpu.max 50000 100000: %g cores (want 0.5)", cpu);

    put(root, "cpu.max", "max 100000\n");
    put(root, "self", "6:cpuacct:/j\n5:cpuset:/j\n4:memory:/j/step\n3:cpu,cpuacct:/j/step\n0::/\n");
    put(root, "cpuacct/j/cpu.cfs_quota_us", "100000\n");
    put(root, "cpuacct/j/cpu.cfs_period_us", "100000\n");
    put(root, "cpuset/j/cpu.cfs_quota_us", "100000\n");
    put(root, "cpuset/j/cpu.cfs_period_us", "100000\n");
    put(root, "cpu,cpuacct/j/step/cpu.cfs_quota_us", "-1\n");
    put(root, "cpu,cpuacct/j/step/cpu.cfs_period_us", "100000\n");
    put(root, "cpu,cpuacct/j/cpu.cfs_quota_us", "300000\n");
    put(root, "cpu,cpuacct/j/cpu.cfs_period_us", "200000\n");
    put(root, "memory/j/memory.limit_in_bytes", "2147483648\n");
    put(root, "memory/memory.limit_in_bytes", "9223372036854771712\n");
    EXPECT((cpu = dt_cgroup_cpu_limit(root, self)) == 1.5, "v1, the parent's cfs quota 300000 over 200000 (cpuacct's and "
           "cpuset's files not read): %g cores (want 1.5)", cpu);
    EXPECT((mem = dt_cgroup_memory_limit(root, self)) == 2147483648u, "v1, the parent's memory.limit_in_bytes 2 GiB: %zu", mem);

    put(root, "self", "4:memory:/j\n3:cpu:/j\n");
    EXPECT((cpu = dt_cgroup_cpu_limit(root, self)) == 0, "no cpu files on the path: %g cores (want 0: none)", cpu);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    EXPECT(system(cmd) == 0, "removing %s", root);
}

/* dt_utf8_clean: an ill-formed sequence's maximal subparts each one U+FFFD, as Python's bytes.decode("utf-8",
 * "replace") gives them (its answers written out here). */
static void utf8_clean(void) {
    static const struct { const char *in, *want; } cases[] = {
        { "\xe6\x97" "a", "\xEF\xBF\xBD" "a" },                    /* a truncated three-byte character: one */
        { "\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD" },                /* lone continuation bytes: one each */
        { "\xf0\x9f\x98", "\xEF\xBF\xBD" },                      /* a truncated four-byte character at the end */
        { "\xe0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" },   /* an overlong form: its second byte starts none */
        { "\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" },   /* a UTF-16 surrogate */
        { "\xf0\x9f" "a\x98", "\xEF\xBF\xBD" "a\xEF\xBF\xBD" },         /* cut by an ASCII byte */
        { "\xc3\xa9\xe2\x82\xac", "\xc3\xa9\xe2\x82\xac" },       /* whole characters kept */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n;
        char *o = dt_utf8_clean(cases[i].in, strlen(cases[i].in), &n);
        EXPECT(o && n == strlen(cases[i].want) && !memcmp(o, cases[i].want, n), "dt_utf8_clean case %zu: %zu bytes", i, o ? n : 0);
        free(o);
    }
}

int main(void) {
    utf8_clean();
    cgroups();
    stop_requests();
    permutations();
    /* bf16: round to nearest even, exact for 8-bit mantissas. */
    EXPECT(dt_f32_to_bf16(1.0f) == 0x3f80, "bf16(1) = %04x", dt_f32_to_bf16(1.0f));
    EXPECT(dt_bf16_to_f32(0xc0a0) == -5.0f, "bf16 c0a0 = %g", dt_bf16_to_f32(0xc0a0));
    EXPECT(dt_bf16_to_f32(dt_f32_to_bf16(1.00390625f)) == 1.0f, "tie rounds to even");
    EXPECT(dt_bf16_to_f32(dt_f32_to_bf16(1.01171875f)) == 1.015625f, "tie rounds up to even");
    EXPECT(isnan(dt_bf16_to_f32(dt_f32_to_bf16(NAN))), "bf16 keeps NaN");
    /* f16: every integer up to 2048 is exact; limits; subnormals. */
    int bad = -1;
    for (int i = -2048; i <= 2048 && bad < 0; i++) if (dt_f16_to_f32(dt_f32_to_f16((float)i)) != (float)i) bad = i;
    EXPECT(bad < 0, "f16 round trip of %d", bad);
    EXPECT(dt_f32_to_f16(65504.0f) == 0x7bff, "f16 max = %04x", dt_f32_to_f16(65504.0f));
    EXPECT(dt_f32_to_f16(1e6f) == 0x7c00, "f16 overflow -> inf");
    EXPECT(dt_f16_to_f32(0x0001) == ldexpf(1.0f, -24), "f16 smallest subnormal = %g", dt_f16_to_f32(0x0001));
    EXPECT(dt_f32_to_f16(ldexpf(1.0f, -24)) == 0x0001, "f32 2^-24 -> f16 %04x", dt_f32_to_f16(ldexpf(1.0f, -24)));
    EXPECT(dt_f32_to_f16(ldexpf(3.0f, -26)) == 0x0001, "subnormal rounding");
    EXPECT(dt_f16_to_f32(dt_f32_to_f16(0.1f)) == 0.0999755859375f, "f16(0.1) = %.12g", dt_f16_to_f32(dt_f32_to_f16(0.1f)));
    /* Every f16 value survives f16 -> f32 -> f16. */
    bad = -1;
    for (int h = 0; h < 0x10000 && bad < 0; h++) {
        float f = dt_f16_to_f32((uint16_t)h);
        if (!isnan(f) && dt_f32_to_f16(f) != h) bad = h;
    }
    EXPECT(bad < 0, "f16 %04x does not round-trip", bad);
    size_t s = 0;
    EXPECT(dt_parse_size("64K", &s) == DT_OK && s == 65536, "64K = %zu", s);
    EXPECT(dt_parse_size("1M", &s) == DT_OK && s == 1048576, "1M = %zu", s);
    EXPECT(dt_parse_size("2GiB", &s) == DT_OK && s == (2ull << 30), "2GiB = %zu", s);
    EXPECT(dt_parse_size("3T", &s) == DT_OK && s == (3ull << 40), "3T = %zu", s);
    EXPECT(dt_parse_size("8", &s) == DT_OK && s == 8, "8 = %zu", s);
    EXPECT(dt_parse_size("12Q", &s) == DT_ERR_ARG && strstr(dt_last_error(), "12Q"), "bad size names the input: %s", dt_last_error());
    EXPECT(dt_parse_size("99999999999999999999G", &s) != DT_OK, "overflow rejected");
    /* medians: the middle one, or the mean of the two middle ones (two rounds are their mean, not the better one) */
    double m3[3] = { 3, 1, 2 }, m2[2] = { 0.9, 1.3 }, m4[4] = { 4, 1, 3, 2 };
    double a3 = dt_median(m3, 3), a2 = dt_median(m2, 2), a4 = dt_median(m4, 4);
    EXPECT(a3 == 2 && fabs(a2 - 1.1) < 1e-12 && a4 == 2.5, "medians %g %g %g (want 2, 1.1, 2.5)", a3, a2, a4);
    dt_dtype t;
    EXPECT(dt_dtype_parse("bf16", &t) == DT_OK && t == DT_BF16, "parse bf16");
    EXPECT(dt_dtype_parse("f8", &t) == DT_ERR_ARG, "unknown dtype rejected");
    /* CPU flags: whole words of the first flags line, not prefixes of them */
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192], first[64] = "";
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5) && sscanf(strchr(line, ':') + 1, "%63s", first) == 1) break;
    if (f) fclose(f);
    if (first[0]) {
        EXPECT(dt_cpu_has(first), "the CPU's first flag '%s' not found", first);
        size_t n = strlen(first);
        if (n > 1) {
            first[n - 1] = 0; /* a prefix of a flag is no flag, unless it is a flag of its own too */
            char word[80];
            snprintf(word, sizeof word, " %s ", first);
            if (!strstr(line, word)) EXPECT(!dt_cpu_has(first), "prefix '%s' of a flag taken for a flag", first);
        }
    }
    EXPECT(!dt_cpu_has("no_such_flag"), "a flag no CPU has was found");

    /* CRC-32C: the standard check value of "123456789" (RFC 3720's polynomial), the same in pieces, and the CPU's
     * instruction and the portable path agreeing on every length and alignment of random bytes (the path is chosen
     * at first use: the portable one runs in a child that has not used it yet) */
    unsigned char bytes[300];
    uint64_t rs = 7;
    for (int i = 0; i < 300; i++) bytes[i] = (unsigned char)(dt_rng_next(&rs) >> 24);
    uint32_t fast[65], slow[65] = { 0 };
    int fds[2];
    if (pipe(fds) == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            setenv("DTRAIN_CRC32C", "portable", 1);
            for (int n = 0; n < 64; n++) slow[n] = dt_crc32c(0, bytes + n % 8, (size_t)(n * 4 + n % 3));
            slow[64] = dt_crc32c(0, "123456789", 9);
            _exit(write(fds[1], slow, sizeof slow) != (ssize_t)sizeof slow);
        }
        close(fds[1]);
        ssize_t got = read(fds[0], slow, sizeof slow);
        close(fds[0]);
        waitpid(pid, NULL, 0);
        EXPECT(got == (ssize_t)sizeof slow, "crc32c: the portable path's child sent %zd bytes", got);
    }
    for (int n = 0; n < 64; n++) fast[n] = dt_crc32c(0, bytes + n % 8, (size_t)(n * 4 + n % 3));
    fast[64] = dt_crc32c(0, "123456789", 9);
    EXPECT(fast[64] == 0xe3069283u && slow[64] == 0xe3069283u, "crc32c(\"123456789\") = %08x / %08x (portable), not e3069283",
           fast[64], slow[64]);
    EXPECT(dt_crc32c(dt_crc32c(0, "1234", 4), "56789", 5) == 0xe3069283u, "crc32c in two pieces differs");
    EXPECT(!memcmp(fast, slow, sizeof fast), "crc32c: the portable path differs from the instruction's on random bytes");
    /* dt_rng_double: the stream's top 53 bits, so [0, 1) covered evenly (mean 0.5 within 1%, both ends reached
     * within 1e-4 over 10^5 draws of one seed) */
    uint64_t ud = 11;
    double umin = 1, umax = 0, usum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = dt_rng_double(&ud);
        umin = u < umin ? u : umin, umax = u > umax ? u : umax, usum += u;
    }
    EXPECT(umin >= 0 && umin < 1e-4 && umax < 1 && umax > 1 - 1e-4 && fabs(usum / 100000 - 0.5) < 0.005,
           "dt_rng_double: min %g, max %g, mean %g over 10^5 draws", umin, umax, usum / 100000);
    printf("base: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
