/* A step's time before it runs: compute by kernel class from a roofline
 * (the Linears at the GEMM rate of the job's own shapes, attention at its
 * measured rate, the elementwise kernels and the optimizer at the memory
 * bandwidth), communication by the alpha-beta(-gamma) cost of each
 * collective the layout makes, the pipeline's bubble by its schedule. The
 * largest stage's rank sets the step. */
#include "plan_internal.h"

#include "dtrain/base.h"
#include "dtrain/comm.h"
#include "dtrain/kernels.h"
#include "dtrain/pipeline.h"
#include "dtrain/strategy.h"

#include <math.h>
#include <string.h>

/* The Linears' rate for this job: this machine's fixed rate if it has one ($DTRAIN_LINEAR_GFLOPS), else measured here at its
 * shape (M tokens, N outputs, K inputs), else the peak x efficiency.
 * Beyond 4096 tokens at 4096: the rate has stopped growing with M there (d6's MLP 61 against 72 GFLOP/s at 16384, its head 70
 * against 67, this VM's drift), and a long sequence's head timed whole took minutes a plan. */
static double gemm_rate(const dt_plan_job *j, const dt_plan_hardware *h, int threads, double tokens, int N, int K) {
    int lowp = j->precision != DT_F32;
    double peak = (lowp ? h->flops_lowp : h->flops_f32) * (h->cores_per_device ? threads : 1) * h->gemm_efficiency;
    if (!h->attention_rate || (double)N * K > 1e8) return peak; /* another machine, or too large to time here */
    if (h->linear_rate > 0) return h->linear_rate * threads;
    double r = dt_plan_time_linear((int)fmin(tokens, 4096), N, K, threads, j->precision, dt_gpt2_lp_work_floats(&j->model, false));
    return r > 0 ? r : peak;
}

/* The blocks' Linears' rate: each of a block's Linears as the spec has them (GPT-2's qkv, projection and the MLP's two;
 * Llama's q|k|v, o, gate|up and down; a tensor-parallel rank's share of each) timed at its shape, weighted by its
 * FLOPs. The MLP's first, which the plan used for all four, is the fastest of them; the others have a side of C (C/tp
 * under tensor parallelism). */
static double blocks_rate(const dt_plan_job *j, const dt_plan_hardware *h, int threads, double tokens) {
    int shape[8][2], n = dt_plan_block_linears(j, -1, shape, 8); /* outputs, inputs */
    double flops = 0, secs = 0;
    for (int i = 0; i < n; i++) {
        double f = (double)shape[i][0] * shape[i][1];
        flops += f, secs += f / gemm_rate(j, h, threads, tokens, shape[i][0], shape[i][1]);
    }
    return flops / secs;
}


typedef struct { double mm, att, ew, fwd_share; } stage_cost;

/* A block's elementwise bytes a token (forward's; backward's twice) with an MLP F wide, and in *lowp mixed precision's passes
 * besides. */
static double layer_ew(const dt_plan_job *j, const dt_gpt2_config *r, double F, double Q, double KVl, double *lowp) {
    double tp = j->tp > 1 ? j->tp : 1, C = r->channels, rows = j->sp && tp > 1 ? tp : 1;
    bool gpt = dt_plan_gpt2_block(&j->model);
    /* Llama: two RMSNorms and two residuals as GPT-2's; q|k|v of every head packed from the K/V heads (Q + 2 KV read on a rank,
     * 3 Q written) and q, k turned by position (4 Q); SwiGLU reads gate and up and writes their product; no biases */
    double block = 4 * (gpt ? 10 * C / rows + 4 * C / tp + 4 * F / tp : 10 * C / rows + 8 * Q / tp + 2 * KVl + 3 * F / tp);
    /* dtrain's mixed precision (gpt2_run.c) passes over a block's activations besides: forward rounds the LayerNorms', attention's
     * and GELU's outputs to 16 bits in place (8 bytes an element), backward each Linear's output gradient; without --recompute
     * the block's eight kept activations are packed to 16 bits after forward and unpacked before backward (6 bytes an element
     * each way). d6's bf16 blocks ran 10% over the plan without them (362 ms a step against 328): these are 32 of it. */
    *lowp = j->precision == DT_F32 || j->paper_acts ? 0
            : gpt ? 8 * (2 * C / rows + C / tp + F / tp) * (j->recompute ? 2 : 1) + 8 * (2 * C + 3 * C / tp + F / tp) +
                        (j->recompute ? 0 : 12 * (4 * C / rows + 4 * C / tp + 2 * F / tp))
                  /* Llama's the same passes: the norms', attention's (and its packed q|k|v) and SwiGLU's outputs
                   * rounded, each Linear's output gradient, the kept values packed and unpacked */
                  : 8 * (2 * C / rows + 4 * Q / tp + F / tp) * (j->recompute ? 2 : 1) + 8 * (2 * C + (Q + 2 * F) / tp + 2 * KVl) +
                        (j->recompute ? 0 : 12 * (4 * C / rows + (2 * Q + 3 * F) / tp + 2 * KVl));
    return block;
}

/* One micro-batch's forward and backward through units [a, b) on one rank. */
static stage_cost stage_compute(const dt_plan_job *j, int a, int b, double tokens, double T, double rmm, double rhead, double rmoe,
                                double load, double ratt, double bw, double hloss) {
    const dt_gpt2_config *c = &j->model;
    dt_gpt2_config r = dt_lm_config_resolve(c);
    double tp = j->tp > 1 ? j->tp : 1, C = c->channels, F = r.ffn, V = c->padded_vocab_size / tp;
    /* q's channels, and this rank's K/V channels (with fewer K/V heads than ranks, each rank keeps one) */
    double Q = (double)r.num_heads * r.head_dim, KVl = (r.kv_heads >= tp ? r.kv_heads / tp : 1) * (double)r.head_dim;
    /* (recomputing: forward again before backward; under zb1 before W too) */
    double passes = 3 + (j->recompute ? (j->zb ? 2 : 1) : 0);
    int L = c->num_layers, first = a > 1 ? a : 1, last = b - 1 < L ? b - 1 : L, nl = last >= first ? last - first + 1 : 0;
    stage_cost s;
    /* the blocks' Linears at the MLP's rate, the head's at its own (once each way whatever --recompute says) */
    double head = b == L + 2 ? V * C : 0;
    /* LoRA's frozen base makes no weight gradients: a pass fewer (the adapters' own few FLOPs are left out) */
    double lin = passes - (j->lora.rank ? 1 : 0), hp = j->lora.rank ? 2 : 3;
    s.mm = 2 * (dt_plan_units_matmul_params(j, a, b) - head) * tokens * lin / rmm + 2 * head * tokens * hp / rhead;
    /* causal attention: a query meets T/2 keys on average (the balanced chunks under CP too): 2 T C per query forward, twice that backward */
    s.att = nl * 2.0 * tokens * T * (Q / tp) * passes / ratt;
    /* the elementwise kernels, forward and twice backward: LayerNorms, residuals, biases, GELU (bytes a token and block), the head's
     * softmax and loss over the vocabulary (where measured, hloss: the 16-bit head's seconds a token besides its GEMMs); a dense
     * layer's (its MLP dense_ffn wide among mixtures) and a mixture's */
    int nmoe = 0;
    for (int l = first - 1; l < last; l++) nmoe += dt_lm_layer_moe(&r, l);
    double ew = 0;
    for (int moe = 0; moe < 2; moe++) {
        double n = moe ? nmoe : nl - nmoe, lowp, block = layer_ew(j, &r, moe ? F : r.experts ? r.dense_ffn : F, Q, KVl, &lowp);
        if (moe && r.experts) { /* a mixture of experts: each token's k experts (gate, up, down; GELU's up, down) at their rows' rate,
                                 * the router, a shared expert */
            double K = r.experts_top_k, E = r.experts, Fs = r.shared_ffn, xa = dt_family_moe_gated(r.family) ? 3 : 2;
            /* under EP the busiest rank runs load times the mean rows (step_rates), and its group waits for it */
            s.mm += n * 2 * tokens * (xa * K * F * C * lin * load / rmoe + (3 * Fs / tp * C * lin + E * C * passes) / rmm);
            /* in place of the dense MLP's activation (GPT-2's GELU, Llama's SwiGLU): the pairs' (and the shared expert's), the
             * pairs' inputs gathered and outputs combined, the router's softmax and choice */
            block += 4 * (xa * K * F * load + 3 * Fs / tp - (dt_plan_gpt2_block(c) ? 4 : 3) * F / tp + 4 * K * C + 3 * E);
        }
        ew += n * (block * passes + lowp);
    }
    s.ew = (ew + (b == L + 2 && !hloss ? 4 * 4 * V : 0) + (a == 0 ? 3 * 4 * C : 0)) * tokens / bw;
    if (b == L + 2) s.ew += hloss * tokens;
    s.fwd_share = 1.0 / passes;
    return s;
}

/* What of a reduction taking `comm` is left after a backward of `bwd` that overlaps it bucket by bucket: bucket k (share[k]
 * of the gradients, in backward's order) is ready once backward has run ready[k] of itself, and the link sends one
 * bucket after another, each its share of the time. Taking the link to start with backward said -18.5% of the exposed
 * time at 1 Gbit/s across the cluster rig (258.6 ms against 317.4 measured): d6's first bucket of two is ready only 58%
 * of the way through backward. */
static double overlapped(double comm, double bwd, const double *share, const double *ready, int nb) {
    if (nb <= 0) return fmax(0, comm - bwd);
    double end = 0;
    for (int k = 0; k < nb; k++) end = fmax(end, bwd * ready[k]) + comm * share[k];
    return fmax(0, end - bwd);
}

/* Buckets of `bucket` bytes of the `bytes` (the last the rest) where the model's own are not known, each ready when
 * backward has produced its bytes (at most cap: finer than that changes nothing a plan shows). */
static int equal_buckets(double bytes, double bucket, double *share, double *ready, int cap) {
    if (!(bytes > 0) || !(bucket > 0)) return 0;
    if (bytes / bucket > cap) bucket = bytes / cap;
    int nb = 0;
    for (double done = 0; done < bytes && nb < cap; nb++) {
        double b = fmin(bucket, bytes - done);
        done += b;
        share[nb] = b / bytes, ready[nb] = done / bytes;
    }
    return nb;
}

/* What the parts of a step's time share: the job as asked and as a context-parallel rank sees it (its share of the
 * positions), the hardware, the mesh's sizes, the links and the rank's bandwidth, the stages' split and the slowest
 * stage's costs and parameters. */
typedef struct {
    const dt_plan_job *job, *j;
    const dt_plan_hardware *h;
    int tp, cp, n, local, cores, p, v, m, *first; /* first: each of the p x v chunks' first unit, and the end */
    double tokens, w, bw, g, ia, ib, xa, xb, ep;
    double psi, pexp, tall, tworst; /* the slowest stage's parameters (of them experts); all stages' compute, the slowest's */
    stage_cost worst;
    dt_plan_units on; /* the units of the stage whose codec sends the most (n 0: one stage) */
    double codec_sent, codec_approx; /* its codec's floats sent a step and gradient elements approximated (0: none) */
} step_ctx;

/* The rates: the threads, their slowdowns beside the other ranks, the Linears', the experts', the head's and attention's. */
typedef struct { double rmm, rmoe, rhead, hloss, ratt, load; } step_rates;

static step_rates rates(step_ctx *x, dt_plan_time *o) {
    const dt_plan_job *j = x->j, *job = x->job;
    const dt_plan_hardware *h = x->h;
    const dt_gpt2_config *c = &j->model;
    int tp = x->tp, local = x->local, cores = x->cores, C = c->channels, F = dt_lm_config_resolve(c).ffn;
    double tokens = x->tokens;
    o->threads = h->cores_per_device ? (job->threads > 0 ? job->threads : (cores / local > 0 ? cores / local : 1)) : 1;
    /* the 16-bit head multiplies a chunk of its rows by a block of tokens at a time (dt_matmul_*_lp16): timed at that shape */
    int Vr = c->padded_vocab_size / tp, hrows = Vr;
    double htok = tokens;
    if (j->precision != DT_F32) {
        double part = (double)dt_gpt2_lp_work_floats(c, true) / 3;
        hrows = (int)fmin(part / C, Vr), htok = fmin(tokens, floor(part / hrows));
    }
    /* more threads on a CPU machine than it has cores (--nproc 4 --threads 1 on two): each computes that much of the time (the
     * bandwidth-bound kernels and the optimizer need nothing more: a rank's share of the bandwidth is already at most 1/local) */
    o->oversubscribed = h->shared_memory && h->cores_per_device && local * o->threads > cores ? (double)local * o->threads / cores : 1;
    /* the other ranks' cores busy beside this one's: compute slowed by the measured all-busy slowdown, in the share of the other
     * cores they keep busy (the job's own threads are in the timings already) */
    int others = (local - 1) * o->threads < cores - o->threads ? (local - 1) * o->threads : cores - o->threads;
    o->beside = h->shared_memory && h->busy_slowdown > 1 && cores > 1 && others > 0 ? 1 + (h->busy_slowdown - 1) * others / (cores - 1) : 1;
    /* ranks sharing cores (this machine): the extra work of their switches, measured at the job's largest block Linear (which
     * includes the busy neighbours) */
    if (o->oversubscribed > 1 && h->attention_rate && (double)F / tp * C <= 1e8)
        o->beside = dt_plan_time_shared((int)fmin(tokens, 4096), F / tp, C, j->precision, dt_gpt2_lp_work_floats(c, false),
                                   local * o->threads, cores);
    double slow = o->oversubscribed * o->beside;
    step_rates r;
    r.rmm = blocks_rate(j, h, o->threads, tokens) / slow;
    dt_lm_config rc = dt_lm_config_resolve(c); /* an expert's rows: its share of the tokens' choices (balanced) */
    /* under EP an expert's rows come from the ep ranks routing to it */
    r.rmoe = rc.experts ? gemm_rate(j, h, o->threads, fmax(1, x->ep * tokens * rc.experts_top_k / rc.experts), rc.ffn, C) / slow : r.rmm;
    /* the busiest EP rank's rows over the mean, as the step waits for them: with more ranks than cores the ranks waiting
     * for it give it their cores, so it runs its load times the mean on a core of its own while the cores' share of
     * every rank's work takes `oversubscribed` times it: the larger of the two (4 ranks of DP 2 x EP 2 on 2 cores at a
     * load of 1.59 ran the balanced plan's step, -0.5%, where the load times the oversubscribed step said +35.8%) */
    r.load = fmax(1, dt_plan_ep_load(j) / o->oversubscribed);
    size_t before = dt_resident_memory();
    r.rhead = gemm_rate(j, h, o->threads, htok, hrows, C) / slow;
    /* the 16-bit head's loss and narrowing, timed here as it runs (one rank's vocabulary slice, its loss as one process's) */
    r.hloss = j->precision != DT_F32 && h->attention_rate && (double)Vr * C <= 1e8
                  ? dt_plan_time_head_lp((int)fmin(tokens, 4096), Vr, C, dt_gpt2_lp_work_floats(c, true), o->threads, j->precision,
                                         r.rhead * slow) * slow
                  : 0;
    size_t after = dt_resident_memory();
    o->head_resident = after > before ? after - before : 0;
    /* attention here: timed at the sequences a rank's kernel sees (a context-parallel rank's share) and the heads' width,
     * unless the machine's rate is fixed ($DTRAIN_ATTENTION_GFLOPS) */
    double att = h->attention_rate;
    if (att > 0 && !h->attention_fixed) {
        double timed = dt_plan_time_attention(x->job->seq / (x->cp > 0 ? x->cp : 1), rc.head_dim);
        att = timed > 0 ? timed : att;
    }
    r.ratt = (att > 0 ? att * o->threads : (j->precision != DT_F32 ? h->flops_lowp : h->flops_f32) * h->attention_efficiency) / slow;
    /* a CPU rank's share of the machine's bandwidth; a GPU's own */
    x->bw = h->shared_memory ? h->mem_bw * (double)(o->threads < cores ? o->threads : cores) / cores : h->mem_bw;
    if (h->shared_memory && x->bw > h->mem_bw / local) x->bw = h->mem_bw / local;
    x->g = 1 / (h->mem_bw > 0 ? x->bw : 1e12);
    return r;
}

/* The stage whose data-parallel group's codec sends the most a step (each stage's group compresses its own tensors, at
 * once; one stage: the whole model): its units and its codec's figures in x. */
static void codec_stage(step_ctx *x) {
    const dt_plan_job *j = x->j;
    x->on.n = 0, x->codec_sent = x->codec_approx = 0;
    for (int s = 0; j->codec.kind != DT_CODEC_NONE && x->n > 1 && s < x->p; s++) {
        dt_plan_units on = dt_plan_stage_units(x->first, x->p, x->v, s);
        double approx, sent = dt_plan_codec_floats(j, &on, &approx, NULL, NULL);
        if (s == 0 || sent > x->codec_sent) x->codec_sent = sent, x->codec_approx = approx, x->on = on;
    }
}

/* Each stage's compute (its chunks'), the slowest's parameters. */
static void stages(step_ctx *x, const step_rates *r) {
    const dt_plan_job *j = x->j;
    const dt_gpt2_config *c = &j->model;
    int p = x->p, v = x->v;
    x->worst = (stage_cost){ 0, 0, 0, 1.0 / 3 };
    x->psi = 0, x->pexp = 0, x->tworst = -1, x->tall = 0;
    for (int s = 0; s < p; s++) {
        stage_cost sc = { 0, 0, 0, 0 };
        double sp = 0, se = 0;
        for (int k = 0; k < v; k++) {
            int a = x->first[k * p + s], b = x->first[k * p + s + 1];
            stage_cost y = stage_compute(j, a, b, x->tokens, x->job->seq, r->rmm, r->rhead, r->rmoe, r->load, r->ratt, x->bw, r->hloss);
            sc.mm += y.mm, sc.att += y.att, sc.ew += y.ew, sc.fwd_share = y.fwd_share;
            sp += dt_plan_units_params(j, a, b);
            se += dt_plan_units_expert_params(j, a, b);
        }
        x->tall += sc.mm + sc.att + sc.ew;
        if (sc.mm + sc.att + sc.ew > x->tworst) x->tworst = sc.mm + sc.att + sc.ew, x->worst = sc, x->psi = sp, x->pexp = se;
    }
    codec_stage(x);
    if (j->params_override > 0) {
        double f = j->params_override / dt_plan_model_params(&(dt_plan_job){ .model = *c });
        x->psi *= f, x->pexp *= f;
    }
}

int dt_plan_update_in_backward(const dt_plan_job *j) {
    /* the engine's model-parallel group: TP's, a pipeline's, expert parallelism's under DDP (ZeRO's shards span it) */
    bool mp = j->tp > 1 || j->pp > 1 || (j->ep > 1 && j->stage == 0);
    return j->dp > 1 && dt_engine_updates_in_backward(&(dt_update_facts){
        .opt = j->opt.kind, .codec = j->codec.kind, .grad_clip = j->grad_clip, .skip_nonfinite = j->skip_nonfinite,
        .step_at_end = j->step_at_end, .model_parallel = mp, .loss_scaled = j->precision == DT_F16,
        .lp_store = j->grad_store != DT_F32, .precond = j->kfac_on || j->shampoo_on });
}

/* The optimizer over the parameters this rank updates, and mixed precision's 16-bit copies made unit by unit. */
static void optimizer_terms(const step_ctx *x, dt_plan_time *o) {
    const dt_plan_job *j = x->j;
    const dt_plan_hardware *h = x->h;
    int n = x->n, tp = x->tp, p = x->p, m = x->m, local = x->local;
    double w = x->w, bw = x->bw, psi = x->psi, ep = x->ep, pexp = x->pexp;
    /* the optimizer over the parameters this rank updates: AdamW reads a parameter, its gradient and two moments and writes three
     * back (28 bytes; SGD 16), gradients zeroed (4), mixed precision's 16-bit copy written (2); split over model-parallel ranks,
     * the global norm's own pass first (engine.c's update: 4; 124M bf16 TP 2 traced 69 ms against 55 planned without it) */
    int stage = j->stage, shared = h->shared_memory && j->shared_params && stage >= 1;
    double psi_sh = psi + (ep - 1) * pexp; /* what the shards split: the experts' over the n/ep ranks holding them */
    double own = stage >= 1 || shared ? psi_sh / n : psi,
           per = (j->opt.kind == DT_OPT_SGD ? 16 : 28) + 4 + (w == 2 ? 2 : 0) + (tp > 1 || p > 1 ? 4 : 0);
    /* at its own measured rate where there is one: a rank's threads' share of one core's, at most its share of all cores'.
     * Inside backward (the engine's rule) the ranks take turns, one unit boundary each (ddp.c), a rank's update streaming
     * memory while the others compute: one core's rate (d6 DDP 2 at T 64 was planned 12 ms a step over with the shared rate) */
    bool turns = dt_plan_update_in_backward(j); /* (several data-parallel ranks, as it asks) */
    double obw = h->optim_bw_one > 0 ? turns ? h->optim_bw_one * o->threads : fmin(h->optim_bw_one * o->threads, h->optim_bw_all / local) : bw;
    if (j->lora.rank) { /* the adapters alone: this rank's tensor-parallel share, a stage's of them */
        dt_model_part part = { .ua = 0, .ub = j->model.num_layers + 2, .tp_size = tp > 1 ? (int)tp : 1 };
        static const dt_tp_ops none = { 0 };
        part.tp = tp > 1 ? &none : NULL;
        size_t ad = 0;
        double kept = 0;
        if (!dt_program_lora_sizes(&j->model, &part, &j->lora, j->recompute, &ad, &kept)) own = (double)ad / p / (stage >= 1 ? n : 1);
    }
    o->optimizer = own * per / obw;
    /* mixed precision with unit hooks on dtrain's runtime (ZeRO-3; ZeRO 1 and 2 with each rank's own parameters): each unit's
     * 16-bit copy is made as its forward starts and again as its backward does, into pages given back after each (so that no
     * rank holds the whole 16-bit model), each page zeroed anew: at the measured rate of that copy (f32 bytes read a second),
     * at most half the rank's bandwidth (each f32 byte read moves two: the read, the 16-bit write and the page's zeroing) */
    if (w == 2 && n > 1 && h->shared_memory && !j->paper_states && (stage >= 3 || (stage >= 1 && !shared)))
        o->lp_units = m * 2 * psi * 4 / (h->lp_fresh_bw > 0 ? fmin(h->lp_fresh_bw * o->threads, bw / 2) : bw / 2);
}

/* ZeRO's gradient pages outside a rank's shard (dp_nodes: the group spans machines). */
static void grad_pages(const step_ctx *x, dt_plan_time *o, int dp_nodes) {
    const dt_plan_job *j = x->j;
    const dt_plan_hardware *h = x->h;
    int n = x->n, m = x->m, stage = j->stage;
    double bw = x->bw, psi = x->psi;
    /* ZeRO's f32 gradients outside a rank's shard, every step (a 16-bit gradient store: the whole f32 store, at every stage):
     * stage 1 zeroes them after the update (zero.c), and so do stages 2 and 3 after accumulating micro-steps (ddp.c); a step
     * of one micro-batch on a machine's shared arena instead has the pool lend them, its pages mapped and zeroed bucket by
     * bucket (ZeRO-2 on 2 ranks, 124M bf16: 25 ms a step, 2-4% slower than ZeRO-1) at their measured rate */
    int lp_store = dt_plan_lp_store(j);
    if (n > 1 && (stage >= 1 || lp_store) && h->shared_memory && !dp_nodes && !j->paper_states) {
        double outside = (lp_store ? 1 : (n - 1.0) / n) * psi * 4;
        int lent = (stage >= 2 || lp_store) && m == 1 && h->pool_lend_bw > 0;
        o->grad_pages = lent ? outside / fmin(h->pool_lend_bw * o->threads, bw) : outside / bw;
    }
}

/* A codec's part (sent: the floats a rank sends, approx: those it approximates): its exchanges a bucket and its work
 * on the rank. */
static void codec_terms(const step_ctx *x, dt_plan_time *o, double sent, double approx, int dp_nodes, double da, double db, int nb) {
    const dt_plan_job *j = x->j, *job = x->job;
    const dt_plan_hardware *h = x->h;
    int n = x->n;
    double bw = x->bw, g = x->g, psi = x->psi, ia = x->ia, ib = x->ib, xa = x->xa, xb = x->xb;
    /* a codec: its exchanges a bucket (PowerSGD two allreduces, top-k one allgather of every rank's pairs), and its
     * compression on the rank, at the rate measured here (at rank 4: a higher rank's GEMMs at the peak beyond it), else
     * its passes over the gradients at the bandwidth (PowerSGD about 8, top-k 12) */
    double buckets = nb > 0 ? nb : 1 + ceil(fmax(0, psi * 4 - 1048576.0) / fmax(1.0, (double)job->bucket_bytes));
    bool psgd = j->codec.kind == DT_CODEC_POWERSGD, onebit = j->codec.kind == DT_CODEC_ONEBIT || j->codec.kind == DT_CODEC_ZEROONE;
    o->codec_bytes = sent * 4;
    /* 1-bit Adam: an alltoall of a rank's signs (each rank sends all but its own chunk's) and an allgather of the
     * chunks' (the whole model's signs in all): each a gather's cost of the signs' bytes, two a bucket */
    o->dp_comm = psgd     ? dt_plan_allreduce(sent * 4, n, da, db, g) + (2 * buckets - 1) * 2.0 * (n - 1) * da
                 : onebit ? 2 * dt_plan_gather(sent * 4 / (1 + 1.0 / n), n, da, db) + (2 * buckets - 2) * (n - 1) * da
                          : dt_plan_gather(sent * 4 * n, n, da, db) + (buckets - 1) * (n - 1) * da;
    /* top-k's pairs by Ok-TopK or the hierarchical exchange where named, or where auto would take one (the run's
     * rule, bucket by bucket: here the model's share of a bucket; hier where the group spans machines of equal ranks) */
    double tg, tok, th = INFINITY, kb = sent / 2 / buckets, l = dp_nodes ? n / job->nodes : n, q = dp_nodes ? job->nodes : 1;
    dt_codec_sparse_times(n, kb, da, db, &tg, &tok);
    bool sparse = !psgd && !onebit, dgc = j->codec.kind == DT_CODEC_DGC;
    if (sparse && !dgc && (j->codec.exchange == DT_SPARSE_HIER || (dp_nodes && n % job->nodes == 0)))
        th = dt_codec_hier_time(l, q, psi / buckets, kb, ia, ib, xa, xb);
    dt_sparse_exchange pick = j->codec.exchange;
    if (pick == DT_SPARSE_AUTO) pick = th < tg && th < tok ? DT_SPARSE_HIER : tok < tg ? DT_SPARSE_OKTOPK : DT_SPARSE_ALLGATHER;
    if (sparse && pick == DT_SPARSE_OKTOPK) o->dp_comm = buckets * tok;
    if (sparse && pick == DT_SPARSE_HIER) o->dp_comm = buckets * th, o->codec_bytes = sent * 4 / l;
    double rate = psgd ? h->powersgd_rate : onebit ? h->onebit_rate : h->topk_rate;
    /* 1-bit Adam's passes: x made and read for its scales and signs, e_w written, the server's chunk, m decoded */
    o->codec = rate > 0 ? psi / rate : (psgd ? 8 : onebit ? 7 : 12) * psi * 4 / bw;
    if (psgd && j->codec.rank > 4) o->codec += 6.0 * approx * (j->codec.rank - 4) / (h->flops_f32 * h->gemm_efficiency);
}

/* 0/1 Adam over the run's steps (known): a step's exchange as the mean of its plan's, the variance's steps averaging the
 * gradient whole (dense: that allreduce's seconds), the momentum's steps and the local intervals' ends sending signs (as
 * codec_terms priced them), the other local steps nothing. */
static void zeroone_mix(const dt_plan_job *j, dt_plan_time *o, double dense, double dense_bytes) {
    long whole, signs;
    dt_codec_zeroone_mix(&j->codec, j->steps, &whole, &signs);
    double fw = (double)whole / (double)j->steps, fs = (double)signs / (double)j->steps;
    o->dp_comm = fw * dense + fs * o->dp_comm;
    o->codec *= fs;
    o->codec_bytes = fw * dense_bytes + fs * o->codec_bytes;
}

/* Data parallelism's part: ZeRO's gradient pages, the reductions and gathers, and what backward does not hide. */
static void dp_terms(const step_ctx *x, dt_plan_time *o) {
    const dt_plan_job *j = x->j, *job = x->job;
    const dt_plan_hardware *h = x->h;
    int n = x->n, tp = x->tp, p = x->p, m = x->m, local = x->local, stage = j->stage;
    int shared = h->shared_memory && j->shared_params && stage >= 1;
    double w = x->w, bw = x->bw, g = x->g, psi = x->psi, ia = x->ia, ib = x->ib, xa = x->xa, xb = x->xb;
    stage_cost worst = x->worst;
    /* data parallelism: the gradients' reduction, ZeRO-3's gathers (none where a machine shares one copy), the 16-bit copy's
     * allgather of ZeRO 1 and 2 (mixed, private copies) */
    /* links: inside one machine while the group fits in the job's ranks there */
    int dp_nodes = job->nodes > 1 && n > local / (tp * p > 0 ? tp * p : 1) ? 1 : 0, lp_store = dt_plan_lp_store(j);
    grad_pages(x, o, dp_nodes);
    /* gradients travel in 16 bits with --grad-comm, and with a 16-bit store (the wire is its type) */
    int wire16 = dt_plan_lp_wire(j);
    double da = dp_nodes ? xa : ia, db = dp_nodes ? xb : ib, gb = wire16 ? 2 : 4;
    double gathers = 0, approx = x->codec_approx, sent = x->codec_sent;
    o->codec_bytes = n > 1 ? psi * gb : 0;
    /* the run's buckets where the rank holds the whole model's gradients as the table lays them out, else equal ones */
    double *share = o->bucket_share, *ready = o->bucket_ready;
    bool whole = x->p == 1 && tp == 1 && x->ep <= 1 && !j->lora.rank, wanted = n > 1 && (sent > 0 || dp_nodes || !h->shared_memory);
    int own = whole && wanted ? dt_plan_buckets(j, sent > 0, share, ready, DT_PLAN_BUCKETS) : 0;
    int nb = own > 0 ? own : n > 1 ? equal_buckets(psi * gb, (double)job->bucket_bytes, share, ready, DT_PLAN_BUCKETS) : 0;
    o->buckets = nb;
    if (sent > 0) codec_terms(x, o, sent, approx, dp_nodes, da, db, own);
    if (sent > 0 && j->codec.kind == DT_CODEC_ZEROONE && j->steps > 0) zeroone_mix(j, o, dt_plan_allreduce(psi * gb, n, da, db, g), psi * gb);
    if (n > 1) {
        if (!(sent > 0)) o->dp_comm = dt_plan_allreduce(psi * gb, n, da, db, g);
        /* and are narrowed in place first (4 bytes read, 2 written), then widened back where the average lands (an f32
         * store: the rank's part) or copied into the 16-bit store (its window), at the bandwidth */
        double part = stage >= (lp_store ? 1 : 2) ? psi / n : psi;
        if (wire16) o->dp_comm += (6 * psi + (lp_store ? 4 : 6) * part) / bw;
        /* forward and backward gather each unit; zb1's W a third time where it runs the forward again */
        if (stage >= 3 && !shared) o->dp_comm += gathers = (j->zb && j->recompute ? 3 : 2) * m * dt_plan_gather(psi * 4, n, da, db);
        if (stage >= 1 && stage < 3 && !shared && w == 2) o->dp_comm += dt_plan_gather(psi * 2, n, da, db);
    }
    /* a CPU's collectives inside a machine move memory on the same cores and bandwidth backward uses: nothing hides them; a
     * GPU's, and a network's between machines, overlap with backward bucket by bucket */
    double bwd = (o->matmul + o->attention + o->elementwise) * (1 - worst.fwd_share);
    /* across machines the link's processing shares the ranks' cores: backward runs that much slower while the reduction
     * overlaps it (DDP across the rig: a step's compute 53-67 ms over one process's, unpriced before; docs/planner.md) */
    if (dp_nodes && n > 1 && h->inter_slowdown > 0) o->link_compute = h->inter_slowdown * fmin(o->dp_comm, bwd), bwd += o->link_compute;
    /* ZeRO-3's gathers run ahead of forward as well as backward, which the buckets do not describe: there the reduction is
     * hidden under backward but for the last bucket, as before */
    double last = job->bucket_bytes > 0 && psi * gb > 0 ? o->dp_comm * fmin(1, (double)job->bucket_bytes / (psi * gb)) : 0;
    /* a codec's exchanges follow the buckets as the gradients' would (their bytes a bucket shrink alike) */
    o->dp_exposed = h->shared_memory && !dp_nodes ? o->dp_comm
                    : gathers > 0             ? fmax(last, o->dp_comm - bwd)
                                              : overlapped(o->dp_comm, bwd, share, ready, nb);
}

/* Context parallelism: the ring sends keys and values N-1 times forward, and those and their gradients backward (about half
 * hidden under the blocks, measured); all-to-all moves q, k, v and the output forward, again with the gradients backward,
 * each of those 12 rows' worth copied into a send buffer and out of the received one (ulysses.c: 16 bytes a float) */
static void cp_terms(const step_ctx *x, dt_plan_time *o, int nl) {
    const dt_plan_job *j = x->j;
    const dt_gpt2_config *c = &j->model;
    int tp = x->tp, cp = x->cp, m = x->m;
    double tokens = x->tokens, bw = x->bw, ia = x->ia, ib = x->ib;
    double kv = tokens * c->channels / tp * 4;
    /* a coded wire (--cp-wire) sends 2 (bf16) or 1 byte and a scale a row (int8: of C in the ring, of a rank's head
     * channels in the all-to-all) a value, each message coded and decoded (a pass over its f32 values each way, at
     * the bandwidth) */
    double row = j->cp_ulysses ? c->channels / tp / cp : c->channels;
    double cw = j->cp_wire == DT_PP_WIRE_BF16 ? 2 : j->cp_wire == DT_PP_WIRE_INT8 ? 1 + 4.0 / row : 4;
    double coding = j->cp_wire != DT_PP_WIRE_F32 ? 2 * kv / bw : 0;
    o->cp_comm = j->cp_ulysses ? m * nl * 12 * (dt_plan_gather(kv * cp / 4 * cw, cp, ia, ib) + 4 * kv / bw + coding)
                               : m * nl * 0.5 * 6 * (cp - 1) * (ia + kv / 4 * cw * ib + coding);
}

/* The pipeline: each micro-batch's activations forward and gradient back; the bubble by schedule. A pipeline's step is m of the slowest stage's micro-batches plus one of every other stage's (filling and draining, as a flow
 * shop's makespan): (p-1) of the slowest's overstated it by the difference, d6's head-only last stage against its blocks 6-9% */
static void pp_terms(const step_ctx *x, dt_plan_time *o, int pp_nodes) {
    const dt_plan_job *j = x->j;
    const dt_gpt2_config *c = &j->model;
    int p = x->p, v = x->v, m = x->m;
    double tokens = x->tokens, ia = x->ia, ib = x->ib, tall = x->tall, tworst = x->tworst;
    /* the stream crosses in f32 whatever the precision (a bf16 run's too), or as --pp-wire codes it */
    double wire = j->pp_wire == DT_PP_WIRE_BF16 ? 2 : j->pp_wire == DT_PP_WIRE_INT8 ? 1 + 4.0 / c->channels : 4;
    o->pp_comm = 2.0 * m * ((pp_nodes ? x->xa : ia) + tokens * c->channels * wire * (pp_nodes ? x->xb : ib));
    o->bubble = (tall - tworst) * (j->zb ? 1.0 / 3 : 1.0 / v);
    /* more threads than cores: a stage's idle time is another rank's turn on its core, so the step's compute is the
     * machine's work over its cores (m of the mean stage at the shared rate), or the schedule at a core's own rate where
     * that is longer; the busiest stage at the shared rate plus the bubble put d6 DP 2 x PP 2 on 4 ranks of 2 cores +37%
     * over its run, PP 4 more */
    double busy = o->matmul + o->attention + o->elementwise, s = o->oversubscribed;
    if (s > 1) {
        double need = fmax(m * tall / p, (busy + o->bubble) / s);
        o->bubble = fmax(0, need - busy);
        if (need < busy) o->matmul *= need / busy, o->attention *= need / busy, o->elementwise *= need / busy;
    }
}

/* The model-parallel axes' part: tensor, context and expert parallelism's collectives, the pipeline's transfers and
 * bubble. */
static void mp_terms(const step_ctx *x, dt_plan_time *o) {
    const dt_plan_job *j = x->j, *job = x->job;
    const dt_plan_hardware *h = x->h;
    const dt_gpt2_config *c = &j->model;
    dt_lm_config rc = dt_lm_config_resolve(c);
    int tp = x->tp, cp = x->cp, p = x->p, m = x->m, local = x->local, cores = x->cores, C = c->channels, F = rc.ffn;
    double tokens = x->tokens, w = x->w, g = x->g, ia = x->ia, ib = x->ib, xa = x->xa, xb = x->xb, ep = x->ep;
    /* tensor parallelism: two allreduces of a micro-batch's rows each way per block (with --recompute forward's again), f32 */
    int nl = c->num_layers / p + 1;
    double fmoe = rc.experts ? (double)dt_lm_moe_layers(&rc) / c->num_layers : 0; /* (the mixtures' share of the layers) */
    double rowsb = tokens * c->channels * 4;
    /* and at each of them the wait for the slower rank, measured here where the ranks have a core each */
    double meeting = tp > 1 && h->attention_rate && local * o->threads <= cores && (double)F / tp * C <= 1e8
                         ? dt_plan_time_meeting((int)fmin(tokens, 4096), F / tp, C, j->precision, dt_gpt2_lp_work_floats(c, false), tp)
                         : 0;
    /* the mesh puts a tensor-parallel group inside a machine where it fits, a pipeline's stages next (pp outside tp): a
     * group of more ranks than a machine holds crosses the link between machines */
    int tp_nodes = job->nodes > 1 && tp > local, pp_nodes = job->nodes > 1 && tp * p > local;
    if (tp > 1) {
        /* a block's collectives in allreduces' worth: attention's two (and forward's again); an MLP's two likewise; a
         * mixture, whole on each rank, none without SP and under SP its rows gathered forward, d(output) and the rows again
         * backward (an allgather is half an allreduce's bytes) */
        /* (a mixture's shared expert, split as an MLP: its output summed forward, its d(input) backward) */
        double again = j->recompute ? (j->zb ? 2 : 1) : 0, moe_mlp = (j->sp ? 1.5 + 0.5 * again : 0) + (rc.shared_ffn > 0 ? 2 + again : 0);
        double per = 2 + again + (1 - fmoe) * (2 + again) + fmoe * moe_mlp;
        o->tp_waits = m * nl * per * meeting;
        o->tp_comm = m * nl * per * dt_plan_allreduce(rowsb, tp, tp_nodes ? x->xa : ia, tp_nodes ? x->xb : ib, g) + o->tp_waits;
    }
    if (cp > 1) cp_terms(x, o, nl);
    /* expert parallelism: a layer's rows to their experts' ranks and back, forward and backward (recomputing: forward's again),
     * (ep-1)/ep of each rank's choices crossing (balanced), a row its C values (and the weight dtrain sends beside it, in f32;
     * Megatron's in 16 bits); the ranks inside one machine while ep fits there. dtrain waits for each exchange. On one
     * machine a pair's turn each; across machines the counts go to every rank at once (one latency), with the blocks
     * where they are small, else the blocks in a second round of pairs */
    if (ep > 1 && rc.experts) {
        int ep_nodes = job->nodes > 1 && ep > local / (tp * p > 0 ? tp * p : 1) ? 1 : 0;
        double rows = tokens * rc.experts_top_k * (ep - 1) / ep, bytes = rows * (j->paper_states ? w * C : 4 * (C + 1.0));
        double lat = !ep_nodes ? (ep - 1) * ia : xa * (1 + (bytes / (ep - 1) > (double)dt_comm_alltoallv_ride(ep) ? ep - 1 : 0));
        o->ep_comm = m * nl * fmoe * (4 + (j->recompute ? 2 : 0)) * (lat + bytes * (ep_nodes ? xb : ib) + 2 * bytes * g);
    }
    if (p > 1) pp_terms(x, o, pp_nodes);
}

/* Data-parallel ranks meet at each step's reduction (at every bucket): a step lasts as long as the slowest rank's work, which
 * is above the mean rate the rest prices by the share of waiting over working that ranks meeting here measure (the job's
 * MLP Linear at up to 512 tokens, 20 ms of it or more between meetings: the share did not depend on how often they met
 * from 0.02 to 1 s apart). Where the ranks have a core each on one machine and no model-parallel group meets in between
 * (tensor parallelism's meetings are priced one by one; a pipeline's, context and expert parallelism's are not). */
static void dp_waits(const step_ctx *x, dt_plan_time *o) {
    const dt_plan_job *j = x->j;
    const dt_gpt2_config *c = &j->model;
    if (x->n <= 1 || x->tp > 1 || x->p > 1 || x->cp > 1 || x->ep > 1 || x->job->nodes > 1 || !x->h->attention_rate ||
        x->local * o->threads > x->cores)
        return;
    double share = dt_plan_time_straggle((int)fmin(x->tokens, 512), dt_lm_config_resolve(c).ffn, c->channels, j->precision,
                                         dt_gpt2_lp_work_floats(c, false), x->n);
    o->dp_waits = share * (o->matmul + o->attention + o->elementwise + o->optimizer);
}

void dt_plan_step_time(const dt_plan_job *job, const dt_plan_hardware *h, dt_plan_time *o) {
    memset(o, 0, sizeof *o);
    dt_plan_job cj = *job; /* a context-parallel rank's positions */
    step_ctx ctx = { .job = job, .j = &cj, .h = h }, *x = &ctx;
    x->cp = job->cp > 1 ? job->cp : 1, x->tp = job->tp > 1 ? job->tp : 1, x->n = job->dp > 0 ? job->dp : 1;
    x->local = job->local_ranks > 0 ? job->local_ranks : 1, x->cores = h->devices_per_node > 0 ? h->devices_per_node : 1;
    if (x->cp > 1) cj.seq = job->seq / x->cp;
    const dt_gpt2_config *c = &cj.model;
    x->tokens = (double)cj.batch * cj.seq, x->w = cj.precision != DT_F32 ? 2 : 4, x->ep = cj.ep > 1 ? cj.ep : 1;
    x->ia = h->intra_alpha, x->ib = h->intra_beta, x->xa = h->inter_alpha, x->xb = h->inter_beta;
    step_rates r = rates(x, o);
    int p = cj.pp > 1 ? cj.pp : 1, v = cj.virt > 1 && p > 1 ? cj.virt : 1, first[p * v + 1];
    if (p == 1 || dt_gpt2_split_stages(c, job->seq, p * v, first)) first[0] = 0, first[1] = c->num_layers + 2, p = 1, v = 1;
    x->p = p, x->v = v, x->first = first, x->m = cj.micro > 0 ? cj.micro : 1;
    stages(x, &r);
    o->matmul = x->m * x->worst.mm, o->attention = x->m * x->worst.att, o->elementwise = x->m * x->worst.ew;
    optimizer_terms(x, o);
    dp_terms(x, o);
    mp_terms(x, o);
    dp_waits(x, o);
    dt_plan_second_order_time(&cj, h, r.rmm, o->threads, o->oversubscribed * o->beside, o->matmul + o->attention + o->elementwise, &o->precond,
                              &o->precond_comm);
    o->step = o->matmul + o->attention + o->elementwise + o->optimizer + o->lp_units + o->grad_pages + o->link_compute + o->dp_exposed + o->dp_waits + o->tp_comm + o->cp_comm +
              o->ep_comm + o->pp_comm + o->bubble + o->codec + o->precond + o->precond_comm;
    o->tok_per_s = (double)x->n / x->cp * x->m * cj.batch * (double)job->seq / o->step;
}
