/* Medians, the executable's directory and the baselines' command lines, for every benchmark. */
#include "measure.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

double dt_bench_median(double *v, int n) { return n > 0 ? dt_median(v, (size_t)n) : 0; }

int dt_bench_self(char *out, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0) return 1;
    out[n] = 0;
    return 0;
}

int dt_bench_self_dir(char *out, size_t cap) {
    if (dt_bench_self(out, cap)) return 1;
    char *slash = strrchr(out, '/');
    if (slash) *slash = 0;
    return 0;
}

int dt_bench_python_cmd(char *out, size_t cap, const char *script, int threads) {
    char self[PATH_MAX];
    if (dt_bench_self_dir(self, sizeof self)) return 1;
    /* build/dtrain -> bench/SCRIPT in the source tree next to build/. Debian's
     * torch calls the system OpenBLAS, which ignores torch.set_num_threads:
     * give both the same budget, or the baseline oversubscribes itself. */
    int n = snprintf(out, cap,
                     "script=%s/../bench/%s; [ -f \"$script\" ] || script=bench/%s; "
                     "OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d /usr/bin/python3 \"$script\" ",
                     self, script, script, threads, threads);
    return n < 0 || (size_t)n >= cap;
}

int dt_bench_venv_cmd(char *out, size_t cap, const char *script, int threads) {
    char self[PATH_MAX], py[PATH_MAX + 64];
    if (dt_bench_self_dir(self, sizeof self)) return 1;
    const char *env = getenv("DTRAIN_VENV");
    snprintf(py, sizeof py, "%s/bin/python", env && *env ? env : "");
    if (!(env && *env)) snprintf(py, sizeof py, "%s/../.venv-baselines/bin/python", self);
    if (access(py, X_OK) != 0) {
        dt_log(DT_LOG_ERROR, "bench: the baselines' virtual environment is missing (%s): create it with "
               "scripts/make-baselines-venv.sh (PyTorch 2.x and DeepSpeed from PyPI, about 5 GB), or point DTRAIN_VENV at one", py);
        return 1;
    }
    int n = snprintf(out, cap,
                     "script=%s/../bench/%s; [ -f \"$script\" ] || script=bench/%s; "
                     "OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d \"%s\" \"$script\" ", self, script, script, threads, threads, py);
    return n < 0 || (size_t)n >= cap;
}

void dt_bench_collect(FILE *f, const char *key, int skip, double *v, int *n, int cap) {
    char line[4096];
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *x = j ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
        if (cJSON_IsNumber(x) && seen++ >= skip && *n < cap) v[(*n)++] = x->valuedouble;
        cJSON_Delete(j);
    }
}

int dt_bench_run_copies(const char *cmd, int copies) {
    size_t n = strlen(cmd) + 256;
    char *sh = malloc(n);
    if (!sh) return -1;
    /* every copy's status, not only the last one's */
    snprintf(sh, n, "pids=; r=0; while [ $r -lt %d ]; do %s & pids=\"$pids $!\"; r=$((r + 1)); done; "
             "rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc", copies, cmd);
    int rc = system(sh);
    free(sh);
    return rc;
}

void dt_bench_print_file(const char *path) {
    FILE *f = fopen(path, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
    if (f) fclose(f);
}

double dt_bench_median_key(FILE *f, const char *key, int skip, int want) {
    double v[4096];
    int n = 0;
    dt_bench_collect(f, key, skip, v, &n, 4096);
    return n < want ? -1 : dt_bench_median(v, n);
}
