/* dtrain's side of the GPU plugin (gpu_lm.h): found, loaded and checked only when --device cuda asks for it. */
#include "dtrain/gpu_lm.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Where the plugin is: DTRAIN_GPU_PLUGIN (any build: a test's plugin too), else libdtrain_gpu.so beside the executable. */
static void plugin_path(char *out, size_t cap) {
    const char *env = getenv("DTRAIN_GPU_PLUGIN");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(out, cap, "%s/libdtrain_gpu.so", slash ? self : ".");
}

dt_status dt_gpu_api_load(const dt_gpu_api **out) {
    static const dt_gpu_api *loaded;
    *out = NULL;
    if (loaded) return *out = loaded, DT_OK;
#ifndef DT_GPU_PLUGIN_BUILT
    const char *env = getenv("DTRAIN_GPU_PLUGIN");
    if (!env || !*env)
        return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: this dtrain was built without CUDA (no nvcc was found when it was built; "
                                            "install the CUDA toolkit and build again)");
#endif
    char path[PATH_MAX + 32];
    plugin_path(path, sizeof path);
    if (access(path, R_OK) != 0)
        return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: no GPU plugin at %s (DTRAIN_GPU_PLUGIN names another)", path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: the GPU plugin %s does not load (no CUDA runtime here?): %s", path, dlerror());
    const dt_gpu_api *(*entry)(void) = (const dt_gpu_api *(*)(void))dlsym(h, "dt_gpu_plugin");
    const dt_gpu_api *api = entry ? entry() : NULL;
    if (!api || api->abi != DT_GPU_ABI) {
        dlclose(h);
        return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: %s is not this dtrain's GPU plugin (%s)", path,
                        api ? "another build's" : "no dt_gpu_plugin in it");
    }
    return *out = loaded = api, DT_OK;
}

dt_status dt_gpu_api_probe(int ordinal) {
    const dt_gpu_api *api = NULL;
    dt_gpu *g = NULL;
    dt_status st = dt_gpu_api_load(&api);
    if (!st) st = api->open(ordinal, &g);
    if (g) api->close(g);
    return st;
}
