/* The models the planner describes: any shape of the model program's families
 * (GPT-2's and Llama's presets, published ones: Llama 3.1 8B and 70B), counted
 * by the model layer itself, the same functions the runtime sizes its stores
 * with; and --params N (a GPT-style shape of about N parameters). */
#include "dtrain/parallel.h"
#include "dtrain/pipeline.h"
#include "dtrain/plan.h"
#include "dtrain/program.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    const char *name, *family;
    dt_gpt2_config c;
} preset;

/* Published shapes: Llama 3.1 (Meta's model cards: 8B, 70B, vocabulary 128256, 128K positions, 8 K/V heads, rotary base
 * 500000), GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, 2048 positions; GPT-2's
 * architecture and vocabulary), Mixtral 8x7B (its config.json: 32 layers, 4096 wide, 8 experts of 14336, top-2, 8 K/V
 * heads), DeepSeek-V3 as this build's families can state it (the paper's Table and config.json: 7168 wide, 256 routed
 * experts of 2048 and one shared, top-8 within 4 of 8 groups, sigmoid scores scaled by 2.5, vocabulary 129280, 4096
 * positions in pre-training): its 61 layers, the first 3 with a dense SwiGLU MLP of 18432 (first_k_dense_replace), 58 of
 * mixtures; its multi-head latent attention as 128 heads of 128 with 16 K/V heads (264M a layer against MLA's 187M: 4.7B
 * more over the 61 layers, 0.7% of the whole); no multi-token prediction. Qwen3-30B-A3B (its config.json: 48 layers,
 * 2048 wide, 32 heads of 128 with 4 K/V heads, 128 experts of 768, top-8 renormalised, vocabulary 151936 untied, 40960
 * positions, rotary base 1e6). */
static const preset presets[] = {
    { "llama3.1-8b", "llama", { .max_seq_len = 131072, .vocab_size = 128256, .padded_vocab_size = 128256, .num_layers = 32, .num_heads = 32,
                                .channels = 4096, .kv_heads = 8, .ffn = 14336, .rope_theta = 500000, .untied = 1 } },
    { "llama3.1-70b", "llama", { .max_seq_len = 131072, .vocab_size = 128256, .padded_vocab_size = 128256, .num_layers = 80, .num_heads = 64,
                                 .channels = 8192, .kv_heads = 8, .ffn = 28672, .rope_theta = 500000, .untied = 1 } },
    { "gpt3-175b", "gpt2", { .max_seq_len = 2048, .vocab_size = 50257, .padded_vocab_size = 50304, .num_layers = 96, .num_heads = 96, .channels = 12288 } },
    { "mixtral-8x7b", "mixtral", { .max_seq_len = 32768, .vocab_size = 32000, .padded_vocab_size = 32000, .num_layers = 32, .num_heads = 32,
                                   .channels = 4096, .kv_heads = 8, .ffn = 14336, .rope_theta = 1e6, .untied = 1, .experts = 8,
                                   .experts_top_k = 2, .norm_topk = 1 } },
    { "deepseek-v3", "deepseek_moe", { .max_seq_len = 4096, .vocab_size = 129280, .padded_vocab_size = 129280, .num_layers = 61, .num_heads = 128,
                                    .channels = 7168, .kv_heads = 16, .head_dim = 128, .ffn = 2048, .rope_theta = 10000, .untied = 1,
                                    .experts = 256, .experts_top_k = 8, .norm_topk = 1, .shared_ffn = 2048, .router = DT_ROUTER_SIGMOID_BIAS,
                                    .expert_groups = 8, .group_top_k = 4, .routed_scale = 2.5f, .bias_rate = 0.001f, .first_dense = 3,
                                    .dense_ffn = 18432 } },
    { "qwen3-30b-a3b", "qwen3_moe", { .max_seq_len = 40960, .vocab_size = 151936, .padded_vocab_size = 151936, .num_layers = 48, .num_heads = 32,
                                     .channels = 2048, .kv_heads = 4, .head_dim = 128, .ffn = 768, .rope_theta = 1e6, .norm_eps = 1e-6f,
                                     .untied = 1, .experts = 128, .experts_top_k = 8, .norm_topk = 1 } },
};

const char *dt_plan_model_names(void) { return DT_LM_PRESETS ", llama3.1-8b, llama3.1-70b, gpt3-175b, mixtral-8x7b, deepseek-v3, qwen3-30b-a3b"; }

dt_status dt_plan_model_preset(const char *name, dt_gpt2_config *c) {
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (!strcasecmp(name, presets[i].name)) {
            *c = presets[i].c;
            c->family = dt_family_find(presets[i].family);
            return DT_OK;
        }
    if (!dt_gpt2_preset(name, c)) return DT_OK;
    return dt_error(DT_ERR_ARG, "--model %s: not a model the planner knows (%s, a model file, or --params N)", name, dt_plan_model_names());
}

void dt_plan_shape_for_params(double n, dt_gpt2_config *c) {
    /* GPT-3's family keeps d_model near 128 x layers (Table 2.1): 12 L C^2 = n with C = 128 L, heads of 128 channels */
    int L = (int)lround(cbrt(n / (12.0 * 128 * 128)));
    if (L < 1) L = 1;
    int C = (int)lround(sqrt(n / (12.0 * L)) / 128) * 128;
    if (C < 128) C = 128;
    *c = (dt_gpt2_config){ .max_seq_len = 2048, .vocab_size = 50257, .padded_vocab_size = 50304, .num_layers = L,
                           .num_heads = C / 128, .channels = C };
}

/* The mixtures among units [a, b)'s blocks. */
static int units_moe_layers(const dt_gpt2_config *r, int a, int b) {
    int L = r->num_layers, n = 0;
    for (int u = a > 1 ? a : 1; u < b && u <= L; u++) n += dt_lm_layer_moe(r, u - 1);
    return n;
}

double dt_plan_units_expert_params(const dt_plan_job *j, int a, int b) {
    dt_gpt2_config r = dt_lm_config_resolve(&j->model);
    int ep = j->ep > 1 ? j->ep : 1;
    /* each mixture's experts: gate, up and down of F x C (GELU experts: up and down), E of them, E/ep on a rank */
    double mats = dt_family_moe_gated(r.family) ? 3.0 : 2.0;
    return r.experts ? (double)units_moe_layers(&r, a, b) * mats * r.ffn * r.channels * r.experts / ep : 0;
}

double dt_plan_units_params(const dt_plan_job *j, int a, int b) {
    double ep = j->ep > 1 ? j->ep : 1;
    return (double)dt_gpt2_units_num_params(&j->model, a, b, j->tp) - (ep - 1) * dt_plan_units_expert_params(j, a, b);
}

double dt_plan_model_params(const dt_plan_job *j) {
    if (j->params_override > 0) return j->params_override;
    dt_plan_job whole = *j;
    whole.tp = 1, whole.ep = 1;
    return dt_plan_units_params(&whole, 0, j->model.num_layers + 2);
}

/* Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", section 4 and Table 2), a layer's
 * bytes a token at 16 bits with attention's s x s scores not kept (selective recompute, or FlashAttention): whole on every
 * tensor-parallel rank (1/t of the rows with sequence parallelism) the two norms' inputs, the QKV and MLP inputs, and GPT's two
 * dropout masks of a byte (10h); split over the t ranks Q, K, V, the projection's input and the MLP's inner activations (GPT:
 * GELU's input and output, 24h; Llama: K and V at the key/value heads' width, SwiGLU's gate, up and their product). Full
 * recompute keeps the layer's input: 2h (2h/t with sequence parallelism). */
double dt_plan_paper_layer_bytes(const dt_plan_job *j, int recompute, bool moe_layer) {
    const dt_gpt2_config *c = &j->model;
    double t = j->tp > 1 ? j->tp : 1, rows = j->sp && t > 1 ? t : 1, h = c->channels, w = j->precision != DT_F32 ? 2 : 4;
    if (recompute) return w * h / rows;
    dt_gpt2_config r = dt_lm_config_resolve(c);
    bool gpt = dt_plan_gpt2_block(c), sparse = r.experts && moe_layer;
    /* (a dense layer among mixtures: its MLP dense_ffn wide) */
    double kvc = (double)r.head_dim * r.kv_heads, F = r.experts && !moe_layer ? r.dense_ffn : r.ffn;
    /* a mixture's: each token's k experts' SwiGLU activations (GELU's: up and its output) and its dispatched copy (on the
     * experts' ranks under EP), the router's probabilities, in place of the dense MLP's; a shared expert's, split as an MLP */
    double xa = dt_family_moe_gated(r.family) ? 3.0 : 2.0, dense = gpt ? 2.0 : 3.0;
    double moe = sparse ? w * (r.experts_top_k * (xa * F + h) + r.experts - dense * F) : 0, shared = sparse ? w * 3.0 * r.shared_ffn : 0;
    double whole = 4 * w * h + (gpt ? 2 * h : 0) + moe, split = w * (2 * h + 2 * kvc + (gpt ? 2 : 3) * F) + shared;
    return whole / rows + split / t;
}

/* paper_acts: one micro-batch's bytes through units [a, b): the layers', the embedding's dropout mask (GPT), and the head's
 * final norm input, its input and the f32 logits the loss's backward reads (4 s b V / t). */
static double paper_units_activations(const dt_plan_job *j, int a, int b, double tokens) {
    const dt_gpt2_config *c = &j->model;
    double t = j->tp > 1 ? j->tp : 1, rows = j->sp && t > 1 ? t : 1, h = c->channels, w = j->precision != DT_F32 ? 2 : 4;
    int L = c->num_layers, first = a > 1 ? a : 1, last = b - 1 < L ? b - 1 : L, nl = last >= first ? last - first + 1 : 0;
    dt_gpt2_config r = dt_lm_config_resolve(c);
    int sparse = units_moe_layers(&r, a, b);
    double head = b == L + 2 ? w * h / rows + w * h + 4 * ceil(c->padded_vocab_size / t) : 0;
    return tokens * (sparse * dt_plan_paper_layer_bytes(j, j->recompute, true) + (nl - sparse) * dt_plan_paper_layer_bytes(j, j->recompute, false) +
                     head + (a == 0 && dt_plan_gpt2_block(c) ? h / rows : 0));
}

double dt_plan_rank_scratch(const dt_plan_job *j, int head, bool mixtures) {
    if (j->paper_acts)
        return j->recompute ? (double)j->batch * j->seq * fmax(dt_plan_paper_layer_bytes(j, 0, true), dt_plan_paper_layer_bytes(j, 0, false)) : 0;
    dt_gpt2_config r = dt_lm_config_resolve(&j->model);
    /* expert parallelism's exchange buffers (program_moe_ep.c): rows of C + 1 floats out and in, and the grouped rows'
     * SwiGLU, outputs, their gradients and weights' (as many rows as this rank's tokens' choices times the load: the
     * buffers grow to the most rows a layer routed here) */
    double ep = j->ep > 1 && mixtures
                  ? 4.0 * j->batch * j->seq * r.experts_top_k * dt_plan_ep_load(j) * (2.0 * (r.channels + 1) + r.channels + 4.0 * r.ffn + 3)
                  : 0;
    return ep + (j->precision != DT_F32 ? (double)dt_gpt2_part_lp_work_bytes(&j->model, j->tp, head) : 0);
}

/* Expert parallelism's part of a slot: what the experts' rank keeps of the micro-batch's routed rows. */
static double ep_slot_bytes(const dt_plan_job *j, int n, const int *a, const int *b, int batch, int seq) {
    dt_gpt2_config r = dt_lm_config_resolve(&j->model);
    /* expert parallelism keeps, on the experts' rank, every layer's rows routed there, their weights and gate|up products,
     * recomputing or not: as many as its own tokens' choices, summed over its layers, times the busiest rank's rows
     * summed so over the mean (the job's expert_rows: near 1 where the busiest rank moves from layer to layer, the
     * expert load where one rank is the busiest at every layer); the slot (counted without EP) keeps none of its own
     * pairs' gate|up (each layer's, or recomputing the one block's) and its room for them runs no SwiGLU (the experts'
     * rank runs it in its own buffers: dt_plan_rank_scratch) */
    double pairs = j->ep > 1 && r.experts ? (double)batch * seq * r.experts_top_k : 0, kept = dt_plan_ep_rows(j);
    int held = 0; /* (the mixtures among the blocks held) */
    for (int k = 0; pairs > 0 && k < n; k++) held += units_moe_layers(&r, a[k], b[k]);
    return pairs > 0 ? 4.0 * pairs * (kept * held * (r.channels + 1 + 2.0 * r.ffn) - (j->recompute ? 1 : held) * 2.0 * r.ffn - 4.0 * r.ffn) : 0;
}

double dt_plan_slot_activations(const dt_plan_job *j, int n, const int *a, const int *b, int batch, int seq) {
    if (j->paper_acts) {
        double s = 0;
        for (int k = 0; k < n; k++) s += paper_units_activations(j, a[k], b[k], (double)batch * seq);
        return s;
    }
    return ep_slot_bytes(j, n, a, b, batch, seq) +
           (double)dt_gpt2_chunks_activation_bytes(&j->model, n, a, b, j->tp, j->sp, batch, seq, j->recompute, j->attention, j->precision, j->zb);
}

double dt_plan_stage_activations(const dt_plan_job *j, int s, int n, const int *a, const int *b) {
    int slots = j->pp > 1 ? dt_plan_pp_slots(j, s) : 1, held[DT_GPT2_MAX_CHUNKS];
    if (n < 2 || n > DT_GPT2_MAX_CHUNKS || j->paper_acts || dt_pp_chunk_areas(DT_PP_INTERLEAVED, j->pp, n, j->micro, s, held))
        return dt_plan_slot_activations(j, n, a, b, j->batch, j->seq) * slots;
    /* several chunks: a slot's own bytes each micro-batch in flight, each chunk's kept ones as often as the schedule
     * holds that chunk at once */
    size_t area[DT_GPT2_MAX_CHUNKS];
    double acts = (ep_slot_bytes(j, n, a, b, j->batch, j->seq) +
                   (double)dt_gpt2_chunks_activation_split(&j->model, n, a, b, j->tp, j->sp, j->batch, j->seq, j->recompute, j->attention,
                                                           j->precision, j->zb, area)) * slots;
    for (int k = 0; k < n; k++) acts += (double)area[k] * held[k];
    return acts;
}

int dt_plan_pp_slots(const dt_plan_job *j, int s) {
    int p = j->pp > 1 ? j->pp : 1, v = j->virt > 1 ? j->virt : 1, m = j->micro > 0 ? j->micro : 1;
    if (p == 1) return 1;
    /* interleaved: a micro-batch holds its slot from its first chunk's forward to its chunk 0's backward */
    int cap = j->gpipe ? m : j->zb ? p : v > 1 ? ((v + 1) * p - 1 - 2 * s < 2 * p ? (v + 1) * p - 1 - 2 * s : 2 * p) : p - s;
    return cap < m ? cap : m;
}

/* A block's Linears as a TP rank runs them ([outputs, inputs] each, the spec's order); their count. */
int dt_plan_block_linears(const dt_plan_job *j, int l, int (*shape)[2], int max) {
    dt_model_part part = { .ua = 1, .ub = 2, .tp_size = j->tp > 1 ? j->tp : 1 };
    static const dt_tp_ops none = { 0 };
    part.tp = part.tp_size > 1 ? &none : NULL;
    return dt_program_linear_shapes(&j->model, &part, l, shape, max);
}

double dt_plan_ep_load(const dt_plan_job *j) { return j->ep > 1 && j->expert_load > 1 ? j->expert_load : 1; }
double dt_plan_ep_rows(const dt_plan_job *j) { return j->ep > 1 && j->expert_rows > 1 ? j->expert_rows : 1; }

/* GPT-2's block (LayerNorms with biases, learned positions), its MLP dense or a mixture of GELU experts */
bool dt_plan_gpt2_block(const dt_gpt2_config *c) {
    return !c->family || c->family == dt_family_find("gpt2") || c->family == dt_family_find("gpt2_moe");
}

/* Multiply-adds a token costs forward in the units' Linears (the head's too), per TP rank. */
double dt_plan_units_matmul_params(const dt_plan_job *j, int a, int b) {
    const dt_gpt2_config *c = &j->model;
    double t = j->tp > 1 ? j->tp : 1, C = c->channels, V = c->padded_vocab_size / t, block = 0;
    int L = c->num_layers, first = a > 1 ? a : 1, last = b - 1 < L ? b - 1 : L, shape[8][2];
    dt_gpt2_config r = dt_lm_config_resolve(c);
    double layer[2] = { -1, -1 }; /* a dense layer's Linears, a mixture's: each counted once */
    for (int l = first - 1; l < last; l++) {
        int moe = dt_lm_layer_moe(&r, l);
        if (layer[moe] < 0) {
            int n = dt_plan_block_linears(j, l, shape, 8);
            layer[moe] = 0;
            for (int i = 0; i < n; i++) layer[moe] += (double)shape[i][0] * shape[i][1];
        }
        block += layer[moe];
    }
    return block + (b == L + 2 ? V * C : 0);
}

dt_program *dt_plan_model_table(const dt_plan_job *j, dt_model *m) {
    dt_lm_config cfg = dt_lm_config_resolve(&j->model);
    dt_program *p = NULL;
    if (dt_program_create_table(&cfg, NULL, &p)) return NULL;
    dt_program_base_model(p, m);
    return p;
}

/* The run's buckets over the job's table m (its first, then --bucket-mb, 25 MiB unless given): dt_ddp_bucket_lens. */
static int run_buckets(const dt_plan_job *j, const dt_model *m, bool coded, size_t *lens, int *units, int cap) {
    return dt_ddp_bucket_lens(m, DT_DDP_FIRST_BUCKET, j->bucket_bytes ? j->bucket_bytes : 25u << 20, !coded, lens, units, cap);
}

int dt_plan_buckets(const dt_plan_job *j, bool coded, double *share, double *ready, int cap) {
    dt_model m;
    dt_program *p = dt_plan_model_table(j, &m);
    if (!p) return 0;
    size_t lens[DT_PLAN_BUCKETS];
    int units[DT_PLAN_BUCKETS], L = j->model.num_layers;
    int nb = run_buckets(j, &m, coded, lens, units, DT_PLAN_BUCKETS);
    dt_program_destroy(p);
    if (nb <= 0 || nb > cap || nb > DT_PLAN_BUCKETS) return 0;
    double all = 0, work = dt_plan_units_matmul_params(j, 0, L + 2);
    for (int k = 0; k < nb; k++) all += (double)lens[k];
    for (int k = 0; k < nb; k++) {
        share[k] = all > 0 ? (double)lens[k] / all : 1.0 / nb;
        /* backward has run units L+1 down to the bucket's last (unit 0, the embedding, has no Linear: all of it) */
        ready[k] = units[k] <= 0 || !(work > 0) ? 1 : fmin(1, dt_plan_units_matmul_params(j, units[k], L + 2) / work);
    }
    return nb;
}

/* A codec's exchanges for the job (DDP or ZeRO over the whole model): the floats a rank sends a step, and of the
 * gradients, the elements PowerSGD approximates (its GEMMs' size), from the model's own table (codec_powersgd.c's rule:
 * a tensor seen as [first dimension, the rest], compressed where (n + m) r x min_rate < n m). Top-k: an index and a
 * value for each of its share of the entries. 1-bit Adam (after its warm-up): a bit an entry into the alltoall and a
 * bit for each of the rank's chunk's entries into the allgather, a scale for each piece of a tensor in a chunk. And the
 * floats of state it keeps on every rank (dt_codec_state_bytes): a residual an entry, PowerSGD's Qs, DGC's velocity,
 * 1-bit Adam's momentum and server error; and its buffers' bytes, the codec's own count for the model as one bucket. */
dt_plan_units dt_plan_stage_units(const int *first, int p, int v, int s) {
    dt_plan_units on = { p > 1 ? v : 0, { 0 }, { 0 } };
    for (int k = 0; k < on.n; k++) on.a[k] = first[k * p + s], on.b[k] = first[k * p + s + 1];
    return on;
}

/* Whether units on hold tensor t (the tied head's copy on a last stage is not in the table: the first stage's wte). */
static bool holds(const dt_plan_units *on, const dt_tensor_info *t) {
    for (int k = 0; on && k < on->n; k++)
        if (t->unit >= on->a[k] && t->unit < on->b[k]) return true;
    return !on || on->n == 0;
}

double dt_plan_codec_floats(const dt_plan_job *j, const dt_plan_units *on, double *approximated, double *state, double *work) {
    double approx_here = 0, state_here = 0, work_here = 0; /* where the caller asks for none */
    if (!approximated) approximated = &approx_here;
    if (!state) state = &state_here;
    if (!work) work = &work_here;
    *approximated = *state = *work = 0;
    const dt_codec_config *k = &j->codec;
    if (k->kind == DT_CODEC_NONE) return 0;
    dt_model whole;
    dt_program *p = dt_plan_model_table(j, &whole);
    dt_tensor_info *mine = p ? malloc((size_t)whole.ntensors * sizeof *mine) : NULL;
    if (!mine) { dt_program_destroy(p); return 0; }
    /* the stage's tensors (each stage's in one run of the store), as its own table has them */
    dt_model m = whole;
    m.tensors = mine, m.ntensors = 0;
    for (int i = 0; i < whole.ntensors; i++)
        if (holds(on, &whole.tensors[i])) mine[m.ntensors++] = whole.tensors[i];
    /* the run's buckets (its first, then --bucket-mb; more than 256 counted as one) */
    size_t lens[256];
    int nb = run_buckets(j, &m, true, lens, NULL, 256);
    dt_codec_place at = { j->dp > 1 ? j->dp : 1, j->nodes > 1 ? j->nodes : 1, lens, nb > 0 && nb <= 256 ? nb : 0 };
    *work = (double)dt_codec_work_bytes_for(k, m.tensors, m.ntensors, &at);
    double sent = 0;
    for (int i = 0; i < m.ntensors; i++) {
        const dt_tensor_info *t = &m.tensors[i];
        /* a sign a bit, to the chunk's rank and back from it (and a scale a piece); 0/1 Adam's steps that send signs
         * (its variance's steps send the gradient whole, its local steps nothing but an interval's end) */
        if (k->kind == DT_CODEC_ONEBIT || k->kind == DT_CODEC_ZEROONE) {
            double p = j->dp > 1 ? j->dp : 1;
            sent += ceil((double)t->count / 32) * (1 + 1 / p) + 2 * p;
            *state += (k->kind == DT_CODEC_ONEBIT ? 3.0 : 2.0) * (double)t->count;
            continue;
        }
        if (k->kind == DT_CODEC_TOPK || k->kind == DT_CODEC_DGC) { /* DGC: top-k's exchange */
            sent += 2.0 * ceil((double)k->density * (double)t->count);
            *state += (k->kind == DT_CODEC_DGC ? 2.0 : 1.0) * (double)t->count;
            continue;
        }
        double n = t->ndim ? t->shape[0] : 1, c = (double)t->count, mm = n > 0 ? c / n : 0, r = fmin(k->rank, fmin(n, mm));
        bool gain = (n + mm) * r * k->min_rate < n * mm;
        sent += gain ? (n + mm) * r : c;
        *state += c + (gain ? mm * r : 0);
        if (gain) *approximated += c;
    }
    free(mine);
    dt_program_destroy(p);
    return sent;
}
