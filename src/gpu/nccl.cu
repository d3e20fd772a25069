/* NCCL for device buffers: data parallelism's gradients averaged on the GPUs when every rank of a job has its own GPU
 * on one machine (src/gpu/strategy.c decides). NCCL is loaded when first asked (dlopen libnccl.so.2: PyTorch's
 * nvidia-nccl wheel has it), so the plugin loads without it; its types come from nccl.h, its functions through the
 * library's own symbols. */
#include "gpu_internal.h"

#include <stdlib.h>
#include <string.h>

#if __has_include(<nccl.h>)
#include <dlfcn.h>
#include <nccl.h>

static_assert(sizeof(ncclUniqueId) == DT_GPU_NCCL_ID_BYTES, "NCCL's unique id is 128 bytes");

struct dt_gpu_nccl {
    ncclComm_t comm;
};

static struct {
    void *lib;
    ncclResult_t (*get_id)(ncclUniqueId *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*error)(ncclResult_t);
} nccl;

/* libnccl.so.2 and the five functions dtrain calls, once a process */
static dt_status load(void) {
    if (nccl.lib) return DT_OK;
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        return dt_error(DT_ERR_UNSUPPORTED, "NCCL (libnccl.so.2) is not on the library path (%s); PyTorch's nvidia-nccl wheel has it, "
                        "its nvidia/nccl/lib on LD_LIBRARY_PATH", dlerror());
    nccl.get_id = (ncclResult_t(*)(ncclUniqueId *))dlsym(lib, "ncclGetUniqueId");
    nccl.init_rank = (ncclResult_t(*)(ncclComm_t *, int, ncclUniqueId, int))dlsym(lib, "ncclCommInitRank");
    nccl.all_reduce = (ncclResult_t(*)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))dlsym(lib, "ncclAllReduce");
    nccl.destroy = (ncclResult_t(*)(ncclComm_t))dlsym(lib, "ncclCommDestroy");
    nccl.error = (const char *(*)(ncclResult_t))dlsym(lib, "ncclGetErrorString");
    if (!nccl.get_id || !nccl.init_rank || !nccl.all_reduce || !nccl.destroy || !nccl.error) {
        dlclose(lib);
        memset(&nccl, 0, sizeof nccl);
        return dt_error(DT_ERR_UNSUPPORTED, "NCCL: libnccl.so.2 lacks ncclGetUniqueId, ncclCommInitRank, ncclAllReduce, ncclCommDestroy "
                        "or ncclGetErrorString");
    }
    nccl.lib = lib;
    return DT_OK;
}

dt_status dt_gpu_nccl_id(void *id) {
    dt_status st = load();
    ncclResult_t r = st ? ncclSuccess : nccl.get_id((ncclUniqueId *)id);
    return st ? st : r == ncclSuccess ? DT_OK : dt_error(DT_ERR_SYS, "NCCL: a unique id: %s", nccl.error(r));
}

dt_status dt_gpu_nccl_open(dt_gpu *g, const void *id, int nranks, int rank, dt_gpu_nccl **out) {
    *out = NULL;
    dt_status st = load();
    if (st) return st;
    dt_gpu_nccl *c = (dt_gpu_nccl *)calloc(1, sizeof *c);
    if (!c) return dt_error(DT_ERR_NOMEM, "NCCL: out of memory");
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    cudaSetDevice(g->ordinal); /* NCCL takes the calling thread's device */
    ncclResult_t r = nccl.init_rank(&c->comm, nranks, u, rank);
    if (r != ncclSuccess) {
        free(c);
        return dt_error(DT_ERR_SYS, "NCCL: rank %d of %d on GPU %d: %s", rank, nranks, g->ordinal, nccl.error(r));
    }
    *out = c;
    return DT_OK;
}

void dt_gpu_nccl_allreduce(dt_gpu *g, dt_gpu_nccl *c, float *x, size_t n, int mean) {
    ncclResult_t r = nccl.all_reduce(x, x, n, ncclFloat32, mean ? ncclAvg : ncclSum, c->comm, g->stream);
    if (r != ncclSuccess) dt_gpu_fail(g, "NCCL allreduce", nccl.error(r));
}

void dt_gpu_nccl_close(dt_gpu_nccl *c) {
    if (!c) return;
    nccl.destroy(c->comm);
    free(c);
}

#else /* a CUDA without NCCL's header: each call says so */

struct dt_gpu_nccl {
    int unused;
};

static dt_status unbuilt(void) { return dt_error(DT_ERR_UNSUPPORTED, "NCCL: this build found no nccl.h"); }
dt_status dt_gpu_nccl_id(void *id) { return (void)id, unbuilt(); }
dt_status dt_gpu_nccl_open(dt_gpu *g, const void *id, int nranks, int rank, dt_gpu_nccl **out) {
    (void)g, (void)id, (void)nranks, (void)rank, *out = NULL;
    return unbuilt();
}
void dt_gpu_nccl_allreduce(dt_gpu *g, dt_gpu_nccl *c, float *x, size_t n, int mean) {
    (void)c, (void)x, (void)n, (void)mean, dt_gpu_fail(g, "NCCL allreduce", "this build found no nccl.h");
}
void dt_gpu_nccl_close(dt_gpu_nccl *c) { (void)c; }

#endif
