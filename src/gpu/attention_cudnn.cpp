/* Causal attention through cuDNN's fused kernel: its graph API's scaled dot-product attention (SDPA), described
 * through NVIDIA's frontend headers (PyPI's nvidia-cudnn-frontend, scripts/get-cudnn-frontend.sh). The kernel keeps
 * the probabilities on chip, as FlashAttention does; dtrain's own flash.cu is the portable one. cuDNN is loaded when
 * first asked (dlopen, the frontend's dynamic loading), so the GPU plugin loads without it and a run that does not
 * ask never needs it. A graph (forward or backward, for one B, NH, T and head) is built once and kept: building is
 * slow, running is not. Built only where the frontend's headers were found (DT_GPU_CUDNN); without them each call
 * fails by name. */
#include "gpu_internal.h"

#ifdef DT_GPU_CUDNN

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

namespace fe = cudnn_frontend;

/* the frontend's handle on libcudnn (its dynamic loading reads it) */
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

enum uid : int64_t { Q, K, V, SCALE, O, STATS, DO, DQ, DK, DV };

using key = std::tuple<int, int, int, int, bool>; /* B, NH, T, head, backward */

struct state {
    cudnnHandle_t handle = nullptr;
    std::map<key, std::shared_ptr<fe::graph::Graph>> graphs;
    void *work = nullptr; /* cuDNN's workspace, the largest a graph asked for */
    int64_t work_bytes = 0;
};

/* libcudnn.so.9 from the library path, once a process */
bool load(std::string &why) {
    if (fe::cudnn_dlhandle) return true;
    const char *names[] = { "libcudnn.so.9", "libcudnn.so" };
    for (const char *n : names)
        if ((fe::cudnn_dlhandle = dlopen(n, RTLD_NOW | RTLD_GLOBAL))) return true;
    const char *e = dlerror();
    why = std::string("cuDNN (libcudnn.so.9) is not on the library path (") + (e ? e : "not found") +
          "): --attention cudnn needs it; PyTorch's nvidia-cudnn wheel has it, its nvidia/cudnn/lib on LD_LIBRARY_PATH";
    return false;
}

std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph &gr, const char *name, int64_t id, int B, int NH, int T, int hd,
                                                     int64_t row) {
    return gr.tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(id)
                         .set_dim({ B, NH, T, hd })
                         .set_stride({ (int64_t)T * row, hd, row, 1 }));
}

/* The forward graph: q, k, v read in place from the packed rows [B, T, 3, NH, hd] (a row of 3 C), out [B, T, NH, hd],
 * stats [B, NH, T]; or backward's, from those and dout, writing d(q|k|v) packed as q|k|v are. */
std::shared_ptr<fe::graph::Graph> describe(int B, int NH, int T, int hd, bool backward, bool deterministic) {
    auto gr = std::make_shared<fe::graph::Graph>();
    gr->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    int64_t C = (int64_t)NH * hd;
    auto q = tensor(*gr, "q", Q, B, NH, T, hd, 3 * C), k = tensor(*gr, "k", K, B, NH, T, hd, 3 * C), v = tensor(*gr, "v", V, B, NH, T, hd, 3 * C);
    auto scale = gr->tensor(fe::graph::Tensor_attributes()
                                .set_name("scale")
                                .set_uid(SCALE)
                                .set_dim({ 1, 1, 1, 1 })
                                .set_stride({ 1, 1, 1, 1 })
                                .set_is_pass_by_value(true)
                                .set_data_type(fe::DataType_t::FLOAT));
    if (!backward) {
        auto opts = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_causal_mask(true).set_attn_scale(scale);
        auto [o, stats] = gr->sdpa(q, k, v, opts);
        o->set_output(true).set_uid(O).set_dim({ B, NH, T, hd }).set_stride({ (int64_t)T * C, hd, C, 1 });
        stats->set_output(true).set_uid(STATS).set_data_type(fe::DataType_t::FLOAT).set_dim({ B, NH, T, 1 }).set_stride({ (int64_t)NH * T, T, 1, 1 });
        return gr;
    }
    auto o = tensor(*gr, "o", O, B, NH, T, hd, C), dout = tensor(*gr, "dout", DO, B, NH, T, hd, C);
    auto stats = gr->tensor(fe::graph::Tensor_attributes()
                                .set_name("stats")
                                .set_uid(STATS)
                                .set_dim({ B, NH, T, 1 })
                                .set_stride({ (int64_t)NH * T, T, 1, 1 })
                                .set_data_type(fe::DataType_t::FLOAT));
    /* deterministic: a step's bits do not depend on the order the blocks' sums land in */
    auto opts = fe::graph::SDPA_backward_attributes().set_name("attention backward").set_causal_mask(true).set_attn_scale(scale).set_deterministic_algorithm(deterministic);
    auto [dq, dk, dv] = gr->sdpa_backward(q, k, v, o, dout, stats, opts);
    int64_t ids[3] = { DQ, DK, DV };
    std::shared_ptr<fe::graph::Tensor_attributes> outs[3] = { dq, dk, dv };
    for (int i = 0; i < 3; i++) outs[i]->set_output(true).set_uid(ids[i]).set_dim({ B, NH, T, hd }).set_stride({ (int64_t)T * 3 * C, hd, 3 * C, 1 });
    return gr;
}

/* The graph for these sizes (built, checked and kept at its first use), or null with why. */
fe::graph::Graph *find_graph(dt_gpu *g, state &s, int B, int NH, int T, int hd, bool backward, std::string &why) {
    key k{ B, NH, T, hd, backward };
    auto it = s.graphs.find(k);
    if (it != s.graphs.end()) return it->second.get();
    std::shared_ptr<fe::graph::Graph> gr;
    fe::error_t e;
    /* backward deterministic where this cuDNN and GPU have it, else as it comes (said once) */
    for (int det = backward; det >= 0; det--) {
        gr = describe(B, NH, T, hd, backward, det);
        e = gr->validate();
        if (e.is_good()) e = gr->build_operation_graph(s.handle);
        if (e.is_good()) e = gr->create_execution_plans({ fe::HeurMode_t::A });
        if (e.is_good()) e = gr->check_support(s.handle);
        if (e.is_good()) e = gr->build_plans(s.handle);
        if (e.is_good() || !det) break;
        dt_log(DT_LOG_WARN, "cuDNN attention: no deterministic backward here (%s): its sums land in any order", e.get_message().c_str());
    }
    if (!e.is_good()) {
        why = e.get_message();
        return nullptr;
    }
    int64_t need = gr->get_workspace_size();
    if (need > s.work_bytes) {
        if (s.work) dt_gpu_free(g, s.work);
        s.work = nullptr, s.work_bytes = 0;
        if (dt_gpu_alloc(g, (size_t)need, &s.work)) {
            why = "no room on the GPU for its workspace of " + std::to_string(need) + " bytes";
            return nullptr;
        }
        s.work_bytes = need;
    }
    s.graphs[k] = gr;
    return gr.get();
}

/* The device's cuDNN state, made at the first call (libcudnn loaded, a handle on the device's stream). */
state *device_state(dt_gpu *g, std::string &why) {
    if (g->cudnn) return static_cast<state *>(g->cudnn);
    if (!load(why)) return nullptr;
    auto *s = new state;
    cudnnStatus_t st = fe::detail::create_handle(&s->handle);
    if (st == CUDNN_STATUS_SUCCESS) st = fe::detail::set_stream(s->handle, g->stream);
    if (st != CUDNN_STATUS_SUCCESS) {
        why = std::string("cudnnCreate: status ") + std::to_string((int)st);
        if (s->handle) fe::detail::destroy_handle(s->handle);
        delete s;
        return nullptr;
    }
    g->cudnn = s;
    return s;
}

void run(dt_gpu *g, const char *what, int B, int NH, int T, int hd, bool backward, std::unordered_map<int64_t, void *> &ptrs) {
    std::string why;
    try {
        state *s = device_state(g, why);
        fe::graph::Graph *gr = s ? find_graph(g, *s, B, NH, T, hd, backward, why) : nullptr;
        float scale = 1.0f / sqrtf((float)hd);
        ptrs[SCALE] = &scale;
        if (gr) {
            fe::error_t e = gr->execute(s->handle, ptrs, s->work);
            if (e.is_good()) return;
            why = e.get_message();
        }
    } catch (const std::exception &x) { /* the frontend's dynamic loading throws a missing symbol */
        why = x.what();
    }
    dt_gpu_fail(g, what, why.c_str());
}

} // namespace

int dt_gpu_cudnn_supported(int head_dim) { return head_dim % 8 == 0 && head_dim <= 128; }

void dt_gpu_attention_forward_cudnn(dt_gpu *g, float *out, float *stats, const float *qkv, int B, int T, int C, int NH, uint16_t *work16,
                                    uint16_t *out16) {
    size_t BT = (size_t)B * T;
    uint16_t *q16 = work16, *o16 = out16 ? out16 : work16 + BT * 3 * C;
    dt_gpu_pack_bf16(g, q16, qkv, BT * 3 * C);
    std::unordered_map<int64_t, void *> ptrs = { { Q, q16 }, { K, q16 + C }, { V, q16 + 2 * C }, { O, o16 }, { STATS, stats } };
    run(g, "cuDNN attention", B, NH, T, C / NH, false, ptrs);
    dt_gpu_widen_bf16(g, out, o16, BT * C, 0);
}

void dt_gpu_attention_backward_cudnn(dt_gpu *g, float *dqkv, const float *dout, const float *out, const float *qkv, const float *stats,
                                     int B, int T, int C, int NH, uint16_t *work16) {
    size_t BT = (size_t)B * T;
    uint16_t *q16 = work16, *o16 = q16 + BT * 3 * C, *do16 = o16 + BT * C, *dq16 = do16 + BT * C;
    dt_gpu_pack_bf16(g, q16, qkv, BT * 3 * C);
    dt_gpu_pack_bf16(g, o16, out, BT * C);
    dt_gpu_pack_bf16(g, do16, dout, BT * C);
    std::unordered_map<int64_t, void *> ptrs = { { Q, q16 },     { K, q16 + C },  { V, q16 + 2 * C },   { O, o16 },
                                                 { DO, do16 },   { STATS, (void *)stats }, { DQ, dq16 }, { DK, dq16 + C },
                                                 { DV, dq16 + 2 * C } };
    run(g, "cuDNN attention backward", B, NH, T, C / NH, true, ptrs);
    dt_gpu_widen_bf16(g, dqkv, dq16, BT * 3 * C, 1);
}

void dt_gpu_cudnn_close(dt_gpu *g) {
    auto *s = static_cast<state *>(g->cudnn);
    if (!s) return;
    s->graphs.clear();
    if (s->work) dt_gpu_free(g, s->work);
    if (s->handle) fe::detail::destroy_handle(s->handle);
    delete s;
    g->cudnn = nullptr;
}

#else

int dt_gpu_cudnn_supported(int head_dim) { return (void)head_dim, 0; }

static const char *unbuilt = "this build has no cuDNN attention (scripts/get-cudnn-frontend.sh, then build again)";

void dt_gpu_attention_forward_cudnn(dt_gpu *g, float *out, float *stats, const float *qkv, int B, int T, int C, int NH, uint16_t *work16,
                                    uint16_t *out16) {
    (void)out, (void)stats, (void)qkv, (void)B, (void)T, (void)C, (void)NH, (void)work16, (void)out16;
    dt_gpu_fail(g, "cuDNN attention", unbuilt);
}

void dt_gpu_attention_backward_cudnn(dt_gpu *g, float *dqkv, const float *dout, const float *out, const float *qkv, const float *stats,
                                     int B, int T, int C, int NH, uint16_t *work16) {
    (void)dqkv, (void)dout, (void)out, (void)qkv, (void)stats, (void)B, (void)T, (void)C, (void)NH, (void)work16;
    dt_gpu_fail(g, "cuDNN attention backward", unbuilt);
}

void dt_gpu_cudnn_close(dt_gpu *g) { (void)g; }

#endif
