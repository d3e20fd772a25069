/* Memory before a run: ZeRO's accounting of model states (parameters P,
 * gradients G, optimizer state O; a stage splits O, then G, then P over the
 * N data-parallel ranks) plus activations, communication buffers and the
 * token files, per rank and per machine, against what the machine has. */
#include "plan_internal.h"
#include "dtrain/context.h"
#include "dtrain/program.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *stage_name(int stage, int dp) {
    static const char *const names[4] = { "ddp", "--zero 1", "--zero 2", "--zero 3" };
    return dp <= 1 && stage == 0 ? "this run" : names[stage & 3];
}

/* Floats of optimizer state per parameter (dt_optim_create's buffers; 0/1 Adam's local steps add their accumulation
 * and the interval's first weights, made at the first local step: counted from the start, the run's peak). */
static int optim_floats(const dt_plan_job *j) {
    const dt_optim_config *o = &j->opt;
    return (o->kind == DT_OPT_ADAMW || o->kind == DT_OPT_LAMB ? 2 : 1) + (j->codec.kind == DT_CODEC_ZEROONE ? 2 : 0);
}

/* Over more than one micro-batch a step (accumulation, a pipeline's micro-batches), ZeRO 2 and 3 and a 16-bit gradient
 * store: a micro-step that does not synchronise adds into the f32 store's own pages, the whole store, and the step keeps
 * them, zeroed (dt_ddp_finish), and reduces without the pool, as ZeRO-1 does. A 16-bit store then holds its averages
 * beside the whole f32 store, and lowers no peak. */
static int accumulates(const dt_plan_job *j) {
    return !j->paper_states && (j->stage >= 2 || dt_plan_lp_store(j)) && j->dp > 1 && j->micro > 1;
}

/* Model states of psi parameters over n data-parallel ranks. ZeRO's anatomy
 * (paper_states): 16-bit parameters and gradients, K = 12 bytes of f32 master
 * weights and Adam moments under mixed precision (fp32: 4 + 4 + 8), each split
 * by its stage. dtrain's: f32 parameters, with mixed precision a 16-bit copy
 * of the whole model beside them (but for f32_only parameters, which have
 * none); ZeRO 1 and 2 keep the f32 master only in
 * the shard when mixed (or when the machine shares one copy); gradients in
 * f32 or --grad-store's 16 bits. */
static void model_states(const dt_plan_job *j, double psi, double psi_sh, double tied, double f32_only, const double unit_lp[2],
                         double adapters, dt_plan_memory *m) {
    double n = j->dp > 0 ? j->dp : 1;
    int mixed = j->precision != DT_F32, s = j->stage;
    if (j->lora.rank) { /* the frozen base whole on every rank; the strategy shards the adapters, which train */
        m->params = 4 * psi + 4 * adapters / (s >= 3 ? n : 1);
        m->grads = 4 * adapters / (s >= 2 ? n : 1);
        m->optim = 4 * optim_floats(j) * adapters / (s >= 1 ? n : 1);
        return;
    }
    /* psi_sh: what n shards split (the experts, whose states shard over the n/ep ranks holding the same ones, ep times) */
    if (j->paper_states) {
        double k = (mixed ? 4 : 0) + 4 * optim_floats(j), w = mixed ? 2 : 4;
        m->params = w * (s >= 3 ? psi_sh / n : psi);
        m->grads = w * (s >= 2 ? psi_sh / n : psi);
        m->optim = k * (s >= 1 ? psi_sh / n : psi);
        return;
    }
    int shared = s >= 1 && n > 1 && j->shared_params;
    /* what the shards tile: ZeRO leaves a last stage's tied copy out (its gradient goes to the first stage, whose values
     * come back), but for a sharded f32 master (ZeRO 1 and 2, mixed, each rank its own parameters), whose 16-bit copy they
     * gather; stage 3 with each rank its own parameters holds it whole beside its shard */
    double left = s >= 1 && n > 1 && (s >= 3 || !mixed || shared) ? tied : 0, shard = psi_sh - left;
    m->params = 4 * (s >= 3 || shared || (mixed && s >= 1 && n > 1) ? shard / n + (shared ? 0 : left) : psi);
    /* the machine's one copy: every rank maps and reads all of it (its resident size counts it), the machine holds it once */
    if (shared) m->mapped = 4 * psi - m->params;
    if (mixed) m->lowp = 2 * (psi - f32_only);
    /* made unit by unit (ZeRO-3; ZeRO 1 and 2 with each rank's own parameters): one unit's copy at a time, the largest */
    if (mixed && n > 1 && (s >= 3 || (s >= 1 && !shared))) m->lowp = 2 * unit_lp[0];
    /* no data-parallel axis: f32 */
    m->grads = dt_plan_lp_store(j) ? 2 * (s >= 2 ? shard / n : psi) + (accumulates(j) ? 4 * psi : 0)
                                   : 4 * (s >= 2 && !accumulates(j) ? shard / n : psi);
    /* a last stage's tied copy has no optimizer state */
    m->optim = 4 * optim_floats(j) * (s >= 1 && n > 1 ? shard / n : psi - tied);
}

/* One rank holding psi parameters and acts bytes of activations; stage_bufs of its pipeline stage's own buffers, and
 * runtime bytes of process. */
static void estimate_rank(const dt_plan_job *j, double psi, double psi_sh, double tied, double f32_only, const double unit_lp[2],
                          double gathered, double adapters, double acts, double stage_bufs, double runtime, const dt_plan_units *on,
                          dt_plan_memory *m) {
    double n = j->dp > 0 ? j->dp : 1, f = 4;
    memset(m, 0, sizeof *m);
    model_states(j, psi, psi_sh, tied, f32_only, unit_lp, adapters, m);
    int shared = j->stage >= 1 && n > 1 && j->shared_params;
    /* DDP: the tied embedding's rows of every rank (C floats per token) and the tokens;
     * ZeRO: the parameters' allgather staged 4M floats per rank at a time; stages 2
     * and 3, and a 16-bit gradient store at any stage, the pool of pages for
     * two buckets in flight, at most the head's (the tied embedding) and the next */
    double BT = (double)j->batch * j->seq, C = j->model.channels;
    double piece = psi / n < (1 << 22) ? psi / n : (1 << 22), staging = (n + 1) * piece;
    if (j->ep > 1) { /* by region: the shared tensors' shards over n ranks, this rank's experts' over the n/ep holding them */
        double x = (psi_sh - psi) / (j->ep - 1), pd = fmin((psi - x) / n, 1 << 22), px = fmin(x * j->ep / n, 1 << 22);
        piece = fmax(pd, px);
        staging = piece + fmax(pd * n, px * n / j->ep);
    }
    /* (with experts spread over ranks no pool: the pages outside a shard of runs go back to the system) */
    int pool = n > 1 && (j->stage >= 2 || dt_plan_lp_store(j)) && !accumulates(j) && j->ep <= 1;
    double pool_bytes = pool ? f * (double)j->model.padded_vocab_size * C + fmin((double)j->bucket_bytes, f * psi) : 0;
    /* ZeRO 2 and 3: the store's bytes outside this rank's shard ((n - 1) shards) go through the pool, whose pages come when
     * first lent: no more of it is resident than that range; a 16-bit store: the whole f32 store goes through it */
    double outside = !pool ? 0 : dt_plan_lp_store(j) ? 4 * psi : j->stage >= 2 ? 4 * psi - m->grads : 0;
    if (outside > 0) pool_bytes = fmin(pool_bytes, outside);
    /* with experts spread over ranks no pool: backward writes the store's own pages outside the shard, each bucket's
     * given back once its reductions are done */
    if (j->ep > 1 && j->stage >= 2 && n > 1 && !accumulates(j)) outside = 4 * psi - m->grads;
    /* the token table's rows deferred and exchanged (none where a codec runs from the first step: it takes that gradient
     * whole) */
    const dt_codec_config *k = &j->codec;
    int codec_first = k->kind != DT_CODEC_NONE && (k->start == 0 || k->kind == DT_CODEC_ONEBIT || k->kind == DT_CODEC_ZEROONE);
    m->comm = (n > 1 && !codec_first ? (n + 1) * BT * (C * f + 4) : 0) +
              (j->stage >= 1 && j->stage < 3 && n > 1 && !shared ? f * staging : 0) + pool_bytes;
    /* with experts spread over ranks (each rank its own parameter copy) ZeRO-3 gathers the unit running and the next:
     * the largest block's, at worst wholly another rank's (a region's contiguous shards over few ranks give whole
     * layers' experts to one), its experts only where other ranks hold the same ones */
    if (j->ep > 1 && j->stage >= 3 && n > 1 && !j->paper_states) m->comm += 2 * f * gathered;
    /* LoRA: the adapters' buckets (no token table's rows deferred, no pool for a head that does not train) */
    if (j->lora.rank) {
        m->comm = n > 1 ? 2 * fmin((double)j->bucket_bytes, f * adapters) : 0;
        outside = 0;
        pool = 0;
    }
    /* ZeRO's implementation on devices of their own (DeepSpeed's): two gradient buckets in flight, and at stage 3 the unit
     * being gathered and the next (the largest block's 16-bit parameters, twice) */
    if (j->paper_states) {
        double block = dt_program_block_matmul_params(&j->model, -1);
        m->comm = (n > 1 ? 2.0 * (double)j->bucket_bytes : 0) + (j->stage >= 3 && n > 1 ? 2 * 2 * block / (j->tp > 1 ? j->tp : 1) : 0);
    }
    /* The gradients the replicas on this machine reduce in place in the shared segment: each rank reads (R-1)/R of them from
     * its R-1 peers' pages (measured with smaps at R = 2 and 4), which its resident size counts and the machine holds once. */
    int tpp = (j->tp > 1 ? j->tp : 1) * (j->pp > 1 ? j->pp : 1), local = j->local_ranks > 0 ? j->local_ranks : 1;
    double R = fmin(n * (j->cp > 1 ? j->cp : 1), (double)(local / tpp > 0 ? local / tpp : 1));
    /* ZeRO 2 and 3 reduce through the pool instead: as backward fills the buckets, the pool's pages are mapped a second time
     * over that outside range (RssShmem sampled through 124M's steps rose 245 MB during backward, over a range of 249), each
     * page counted again by the resident size until the step gives them back; and each rank reduces its slice of every
     * piece straight into the owner's store (shm_direct's push), so it maps 1/R of each of its R-1 peers' shards too (its
     * slices of the peers' pools, with its own, are the pool's bytes above) */
    /* (a 16-bit wire reduces the first half of each piece's bytes in place: of the peers' pages, half are read) */
    /* A codec from the first step reduces nothing in the store (its exchanges go through buffers of its own; 1-bit Adam's
     * warm-up too): no peer's pages are read there, and a lent page is touched at the store's address only, not at the
     * pool's too (d6 on 2 ranks, PowerSGD: 232.5 MiB at the peak under ZeRO-1 and 232.2 under ZeRO-2, 20.7 less than
     * either counted) */
    if (codec_first) R = 1, outside = 0;
    if (!j->paper_states && outside > 0)
        m->mapped += outside + (R > 1 ? (R - 1) / R * m->grads : 0);
    else if (!j->paper_states && R > 1)
        m->mapped += (R - 1) / R * (pool ? pool_bytes : (dt_plan_lp_store(j) ? 4 * psi : m->grads) / (dt_plan_lp_wire(j) ? 2 : 1));
    /* context parallelism's attention work space, as the run sizes it (a coded wire's messages in it) */
    if (j->cp > 1) {
        int tp = j->tp > 1 ? j->tp : 1;
        dt_cp_config cc = { NULL, j->batch, j->seq, j->model.channels / tp, j->model.num_heads / tp, NULL, (dt_pp_wire)j->cp_wire, j->cp };
        m->comm += f * (double)(j->cp_ulysses ? dt_ulysses_work_floats(&cc) : dt_ring_work_floats(&cc));
    }
    m->comm += stage_bufs;
    /* a codec's state: the stage's residuals (and more) on every rank; and its buckets' buffers */
    if (n > 1 && j->codec.kind != DT_CODEC_NONE) {
        double state, work;
        dt_plan_codec_floats(j, on, NULL, &state, &work);
        m->comm += 4 * state + work;
    }
    m->acts = acts;
    m->data = (double)j->data_bytes;
    m->runtime = runtime;
    /* a second-order optimizer's state and scratch (they run on the whole store: DDP and one process) */
    m->precond = dt_plan_second_order_bytes(j, &m->precond_scratch) + m->precond_scratch;
    /* made unit by unit beside ZeRO 2 and 3's pool, the two do not peak at once: the head's copy (the tied wte) is held as
     * backward starts, when of the outside range only the head's gradients' pages are mapped; by the time the pool's pages
     * fill the whole range, as backward ends, the unit held is a block. The larger of the two moments counts: at 124M bf16
     * ZeRO-3 the end (the resident size at the peak counted no 16-bit copy beyond a block's, sampled at every unit), on one
     * block with GPT-2's vocabulary the head's (plan_checks) */
    /* (not so with a 16-bit gradient store, whose pool covers the whole f32 store: 124M bf16 on 2 ranks, DDP and ZeRO 1
     * and 2, peaked 6-10% over the plan that left it out, and within 2% of one that does not) */
    if (outside > 0 && m->lowp > 2 * unit_lp[1] && !j->paper_states && !dt_plan_lp_store(j)) {
        double start = m->lowp + fmin(outside, 4 * unit_lp[0]), end = 2 * unit_lp[1] + outside;
        m->not_at_once = m->lowp + outside - fmax(start, end);
    }
    m->per_rank = m->params + m->mapped + m->lowp - m->not_at_once + m->grads + m->optim + m->precond + m->comm + m->acts + m->data +
                  m->runtime;
    m->per_machine = (m->per_rank - m->mapped) * local;
}

/* A pipeline stage's parameters: its chunks' (s, s+p, ..: a[k], b[k], filled), their experts', a later stage's copy of
 * the tied embedding (its gradient goes to the first stage, which alone updates it) and the largest unit's and block's
 * 16-bit copy (the embedding reads f32; the head's unit reads the tied wte). */
typedef struct {
    double psi, experts, tied, unit_lp[2];
    double gathered; /* ZeRO-3 under expert parallelism: the most of a block another rank may hold (its experts only where
                      * other ranks hold them too) */
} stage_params;

static void params_of_stage(const dt_plan_job *j, int s, int p, int v, const int *first, int *a, int *b, stage_params *out) {
    const dt_gpt2_config *c = &j->model;
    *out = (stage_params){ 0 };
    for (int k = 0; k < v; k++) {
        a[k] = first[k * p + s], b[k] = first[k * p + s + 1];
        out->psi += dt_plan_units_params(j, a[k], b[k]);
        out->experts += dt_plan_units_expert_params(j, a[k], b[k]);
        for (int u = a[k] > 1 ? a[k] : 1; u < b[k]; u++) {
            double x = dt_plan_units_params(j, u, u + 1);
            out->unit_lp[0] = fmax(out->unit_lp[0], x);
            if (u <= c->num_layers) out->unit_lp[1] = fmax(out->unit_lp[1], x);
            bool alone = j->ep > 1 && j->dp <= j->ep; /* each rank's experts its own: never gathered */
            if (u <= c->num_layers) out->gathered = fmax(out->gathered, x - (alone ? dt_plan_units_expert_params(j, u, u + 1) : 0));
        }
        if (p > 1 && a[k] > 0 && b[k] == c->num_layers + 2 && !c->untied)
            out->tied = ceil((double)c->padded_vocab_size / (j->tp > 1 ? j->tp : 1)) * c->channels;
    }
}

/* LoRA on a stage: its adapters (a tensor-parallel rank's share; the count returned) and the bytes each micro-batch's
 * slot holds more (their x A^T) or less (the inputs of frozen Linears without adapters) added to *acts. */
static size_t lora_of_stage(const dt_plan_job *j, int s, int p, int v, const int *a, const int *b, double *acts) {
    size_t adapters = 0;
    double per_token = 0;
    dt_model_part part = { .ua = a[0], .ub = b[v - 1], .tp_size = j->tp > 1 ? j->tp : 1, .tp_rank = 0 };
    static const dt_tp_ops none = { 0 };
    part.tp = part.tp_size > 1 ? &none : NULL;
    if (v > 1) {
        part.nchunks = v;
        for (int k = 0; k < v; k++) part.chunk_a[k] = a[k], part.chunk_b[k] = b[k];
    }
    if (dt_program_lora_sizes(&j->model, &part, &j->lora, j->recompute, &adapters, &per_token)) return 0;
    *acts += 4.0 * per_token * j->batch * j->seq * (p > 1 ? dt_plan_pp_slots(j, s) : 1);
    return adapters;
}

/* Stage s's rank (a tensor-parallel rank's share: 1/tp of the split tensors, the replicated ones whole), the
 * activations of each micro-batch in flight. */
static void stage_memory(const dt_plan_job *j, int s, int p, int v, const int *first, dt_plan_memory *one) {
    const dt_gpt2_config *c = &j->model;
    int a[v], b[v];
    stage_params sp;
    params_of_stage(j, s, p, v, first, a, b, &sp);
    double experts = 0; /* (a stage of dense layers alone makes no exchanges: their buffers are never grown) */
    for (int k = 0; k < v; k++) experts += dt_plan_units_expert_params(j, a[k], b[k]);
    double acts = dt_plan_stage_activations(j, s, v, a, b) + dt_plan_rank_scratch(j, b[v - 1] == c->num_layers + 2, experts > 0);
    /* a first stage's embedding tables have no 16-bit copy: the lookup reads f32, and no head there reads wte */
    double f32_only = p > 1 && s == 0 ? dt_plan_units_params(j, 0, 1) : 0;
    /* --params N: the model states of N parameters, split as the shape's are */
    if (j->params_override > 0) {
        double f = j->params_override / dt_plan_model_params(&(dt_plan_job){ .model = j->model });
        sp.psi *= f, sp.experts *= f, f32_only *= f, sp.unit_lp[0] *= f, sp.unit_lp[1] *= f, sp.gathered *= f;
    }
    /* a stage without the head holds no BLAS panel of its weight gradient (the planner's process, which timed it,
     * does; nor does LoRA's, whose head is frozen); the first and last stages hold the tied wte's gradient on its way
     * between them (dt_pipeline's wte_recv, wte_send: 124M's first stage was 4.7% under without it) */
    double process = (double)j->process_bytes;
    if (b[v - 1] != c->num_layers + 2 || j->lora.rank) process -= fmin((double)j->head_process_bytes, process);
    double wte = p > 1 && !c->untied && (s == 0 || s == p - 1) ? 4 * ceil((double)c->padded_vocab_size / (j->tp > 1 ? j->tp : 1)) * c->channels : 0;
    size_t adapters = 0;
    if (j->lora.rank) {
        adapters = lora_of_stage(j, s, p, v, a, b, &acts);
        wte = 0; /* the tied table is frozen: nothing travels between the first and last stage */
    }
    dt_plan_units on = dt_plan_stage_units(first, p, v, s);
    estimate_rank(j, sp.psi, sp.psi + (j->ep > 1 ? j->ep - 1 : 0) * sp.experts, sp.tied, f32_only, sp.unit_lp, sp.gathered, (double)adapters, acts, wte,
                  process, &on, one);
}

void dt_plan_memory_estimate(const dt_plan_job *job, dt_plan_memory *m) {
    /* context parallelism: a rank's job is its positions, with blockwise attention */
    dt_plan_job cpj = *job;
    if (job->cp > 1) cpj.seq = job->seq / job->cp, cpj.attention = DT_ATTN_BLOCKWISE;
    const dt_plan_job *j = &cpj;
    const dt_gpt2_config *c = &j->model;
    int p = j->pp > 1 ? j->pp : 1, v = j->virt > 1 && p > 1 ? j->virt : 1, first[p * v + 1];
    int ok = p > 1 && !dt_gpt2_split_stages(c, j->seq, p * v, first);
    if (!ok) { first[0] = 0, first[1] = c->num_layers + 2, p = 1, v = 1; }
    /* each stage's rank; the largest counts for every rank (conservative) */
    memset(m, 0, sizeof *m);
    for (int s = 0; s < p; s++) {
        dt_plan_memory one;
        stage_memory(j, s, p, v, first, &one);
        if (one.per_rank > m->per_rank) *m = one;
    }
}

size_t dt_plan_available_memory(void) {
    /* a debugging switch: pretend the machine has this much (tests of the refusal) */
    const char *env = getenv("DTRAIN_MEMORY_AVAILABLE");
    size_t forced;
    if (env && *env) {
        if (!dt_parse_size(env, &forced)) return forced;
        dt_log(DT_LOG_WARN, "DTRAIN_MEMORY_AVAILABLE=%s ignored: %s", env, dt_last_error());
    }
    size_t kb = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    if (f) fclose(f);
    size_t avail = kb * 1024, lim = dt_cgroup_memory_limit(NULL, NULL);
    return lim < avail ? lim : avail;
}

const char *dt_plan_bytes_text(double bytes, char *buf, size_t cap) {
    const double Mi = 1048576.0, Gi = 1073741824.0;
    if (bytes >= 10 * Gi) snprintf(buf, cap, "%.1f GiB", bytes / Gi);
    else if (bytes >= Gi) snprintf(buf, cap, "%.2f GiB", bytes / Gi);
    else snprintf(buf, cap, "%.1f MiB", bytes / Mi);
    return buf;
}

dt_status dt_plan_check_memory(const dt_plan_job *job, int stage_built) {
    dt_plan_memory m;
    dt_plan_memory_estimate(job, &m);
    double avail = (double)dt_plan_available_memory();
    if (avail <= 0 || m.per_machine <= avail) return DT_OK;
    char others[1024] = "";
    size_t len = 0;
    for (int s = 0; s <= 3 && job->dp > 1; s++) {
        if (s == job->stage) continue;
        dt_plan_job alt = *job;
        alt.stage = s;
        dt_plan_memory a;
        dt_plan_memory_estimate(&alt, &a);
        char a1[32];
        len += (size_t)snprintf(others + len, sizeof others - len, "; %s needs %s%s%s", stage_name(s, job->dp),
                                dt_plan_bytes_text(a.per_machine, a1, sizeof a1), a.per_machine <= avail ? " (fits" : " (does not fit",
                                s > stage_built ? ", not built yet)" : ")");
        if (len >= sizeof others) break;
    }
    /* what the batch's activations can give back: the same global batch in smaller micro-batches, or recomputed blocks */
    if (job->batch > 1 && len < sizeof others) {
        dt_plan_job alt = *job;
        dt_plan_memory a;
        do {
            alt.batch = (alt.batch + 1) / 2;
            dt_plan_memory_estimate(&alt, &a);
        } while (a.per_machine > avail && alt.batch > 1);
        char a1[32];
        len += (size_t)snprintf(others + len, sizeof others - len, "; --batch %d with %dx the --grad-accum (the same global batch) "
                                "needs %s%s", alt.batch, (job->batch + alt.batch - 1) / alt.batch, dt_plan_bytes_text(a.per_machine, a1, sizeof a1),
                                a.per_machine <= avail ? " (fits)" : " (does not fit)");
    }
    if (!job->recompute && len < sizeof others) {
        dt_plan_job alt = *job;
        dt_plan_memory a;
        alt.recompute = 1;
        dt_plan_memory_estimate(&alt, &a);
        char a1[32];
        len += (size_t)snprintf(others + len, sizeof others - len, "; --recompute needs %s%s", dt_plan_bytes_text(a.per_machine, a1, sizeof a1),
                                a.per_machine <= avail ? " (fits)" : " (does not fit)");
    }
    char b[7][32];
    return dt_error(DT_ERR_ARG, "%s needs %s on this machine (%d rank%s x %s: parameters %s, gradients %s, optimizer %s, "
                    "activations %s, buffers %s, tokens %s, the process %s), %s available%s",
                    stage_name(job->stage, job->dp), dt_plan_bytes_text(m.per_machine, b[0], 32), job->local_ranks, job->local_ranks == 1 ? "" : "s",
                    dt_plan_bytes_text(m.per_rank, b[1], 32), dt_plan_bytes_text(m.params, b[2], 32), dt_plan_bytes_text(m.grads, b[3], 32), dt_plan_bytes_text(m.optim, b[4], 32),
                    dt_plan_bytes_text(m.acts, b[5], 32), dt_plan_bytes_text(m.comm, b[6], 32), dt_plan_bytes_text(m.data, (char[32]){ 0 }, 32), dt_plan_bytes_text(m.runtime, (char[32]){ 0 }, 32), dt_plan_bytes_text(avail, (char[32]){ 0 }, 32), others);
}
