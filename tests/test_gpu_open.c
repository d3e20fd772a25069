/* --device cuda where there is no GPU, or no CUDA in the build: a clear error that says which, not a crash; where
 * there is a GPU (an NVIDIA device node), it opens and names itself. Runs in make test on every machine. */
#include "fixture_checks.h"

#include "dtrain/gpu.h"

#include <string.h>
#include <unistd.h>

int main(void) {
    int node = access("/dev/nvidiactl", F_OK) == 0;
    dt_gpu *g = NULL;
    dt_status st = dt_gpu_open(0, &g);
    printf("built with CUDA: %s; NVIDIA device node: %s\n", dt_gpu_built() ? "yes" : "no", node ? "yes" : "no");
    if (!dt_gpu_built()) {
        check("no CUDA in the build: refused, saying so", st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "built without CUDA"),
              dt_last_error());
    } else if (!node) {
        check("no GPU: refused, saying so", st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "--device cuda"),
              st ? dt_last_error() : "opened");
    } else {
        check("a GPU: opened", st == DT_OK, st ? dt_last_error() : dt_gpu_name(g));
        dt_gpu *h = NULL;
        st = dt_gpu_open(99, &h);
        check("a device that is not there: refused, naming the ones there", st == DT_ERR_ARG && strstr(dt_last_error(), "GPUs 0.."),
              dt_last_error());
        void *p = NULL;
        st = g ? dt_gpu_alloc(g, (size_t)1 << 50, &p) : DT_ERR_ARG;
        check("more memory than the GPU has: refused, saying what is free", st == DT_ERR_NOMEM && strstr(dt_last_error(), "free"),
              dt_last_error());
    }
    dt_gpu_close(g);
    return failed != 0;
}
