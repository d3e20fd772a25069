/* Memory before a run: ZeRO's accounting of model states (parameters P,
 * gradients G, optimizer state O; a stage splits O, then G, then P over the
 * N data-parallel ranks) plus activations, communication buffers and the
 * token files, per rank and per machine, against what the machine has. */
#include "dtrain/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Floats of optimizer state per parameter (dt_optim_create's buffers). */
static const char *stage_name(int stage, int dp) {
    static const char *const names[4] = { "ddp", "--zero 1", "--zero 2", "--zero 3" };
    return dp <= 1 && stage == 0 ? "this run" : names[stage & 3];
}

static int optim_floats(const dt_optim_config *o) {
    return o->kind == DT_OPT_ADAMW || o->kind == DT_OPT_LAMB ? 2 : 1;
}

/* One rank holding psi parameters and acts bytes of activations. */
static void estimate_rank(const dt_plan_job *j, double psi, double acts, dt_plan_memory *m) {
    double n = j->dp > 0 ? j->dp : 1, f = 4;
    memset(m, 0, sizeof *m);
    /* on one machine ZeRO's ranks share one copy of the parameters (a rank's share: its shard) */
    int shared = j->stage >= 1 && n > 1 && j->shared_params;
    m->params = f * psi / (j->stage >= 3 || shared ? n : 1);
    /* mixed precision: every rank's 16-bit copy of the whole model (not sharded yet) */
    if (j->precision != DT_F32) m->params += 2 * psi;
    m->grads = j->stage >= 2 ? f * psi / n : f * psi;
    m->optim = f * optim_floats(&j->opt) * psi / (j->stage >= 1 ? n : 1);
    /* DDP: the tied embedding's rows of every rank (C floats per token) and the tokens;
     * ZeRO: the parameters' allgather staged 4M floats per rank at a time; stages 2
     * and 3, the pool of pages for two buckets in flight, at most the head's
     * (the tied embedding) and the next */
    double BT = (double)j->batch * j->seq, C = j->model.channels;
    double piece = psi / n < (1 << 22) ? psi / n : (1 << 22);
    m->comm = (n > 1 ? (n + 1) * BT * (C * f + 4) : 0) + (j->stage >= 1 && j->stage < 3 && n > 1 && !shared ? f * (n + 1) * piece : 0) +
              (j->stage >= 2 && n > 1 ? f * (double)j->model.padded_vocab_size * C + (double)j->bucket_bytes : 0);
    /* context parallelism's attention work space (dt_ring_work_floats, dt_ulysses_work_floats) */
    if (j->cp > 1) m->comm += f * (j->cp_ulysses ? 14 : 10) * BT * C / (j->tp > 1 ? j->tp : 1);
    m->acts = acts;
    m->data = (double)j->data_bytes;
    m->runtime = (double)j->process_bytes;
    m->per_rank = m->params + m->grads + m->optim + m->comm + m->acts + m->data + m->runtime;
    m->per_machine = m->per_rank * (j->local_ranks > 0 ? j->local_ranks : 1);
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
    /* each stage's rank (a tensor-parallel rank's share: 1/tp of the split tensors, the replicated ones whole), the
     * activations of each micro-batch in flight; the largest counts for every rank (conservative) */
    memset(m, 0, sizeof *m);
    for (int s = 0; s < p; s++) {
        int cap = j->gpipe ? j->micro : j->zb ? p : v > 1 ? (v - 1) * p + 2 * (p - 1) + 1 : p - s;
        int slots = p == 1 ? 1 : cap < j->micro ? cap : j->micro;
        /* a stage's chunks: s, s+p, .. (each slot holds every chunk's activations) */
        double psi = 0, acts = 0;
        for (int k = 0; k < v; k++) {
            int a = first[k * p + s], b = first[k * p + s + 1];
            psi += (double)dt_gpt2_units_num_params(c, a, b, j->tp);
            acts += (double)dt_gpt2_units_activation_bytes(c, a, b, j->tp, j->sp, j->batch, j->seq, j->recompute, j->attention, j->precision,
                                                           j->zb) * (slots > 0 ? slots : 1);
        }
        dt_plan_memory one;
        estimate_rank(j, psi, acts, &one);
        if (one.per_rank > m->per_rank) *m = one;
    }
}

size_t dt_plan_available_memory(void) {
    /* a debugging switch: pretend the machine has this much (tests of the refusal) */
    const char *env = getenv("DTRAIN_MEMORY_AVAILABLE");
    size_t forced;
    if (env && *env && !dt_parse_size(env, &forced)) return forced;
    size_t kb = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    if (f) fclose(f);
    size_t avail = kb * 1024;
    /* a container's limit (cgroup v2), if it is the lower */
    f = fopen("/sys/fs/cgroup/memory.max", "r");
    unsigned long long lim;
    if (f && fscanf(f, "%llu", &lim) == 1 && lim > 0 && lim < avail) avail = (size_t)lim;
    if (f) fclose(f);
    return avail;
}

/* "26.5 GB", or "12 MB" below a gigabyte. */
static const char *fmt(double bytes, char *buf, size_t cap) {
    if (bytes >= 1e9) snprintf(buf, cap, "%.1f GB", bytes / 1e9);
    else snprintf(buf, cap, "%.0f MB", bytes / 1e6);
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
                                fmt(a.per_machine, a1, sizeof a1), a.per_machine <= avail ? " (fits" : " (does not fit",
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
                                "needs %s%s", alt.batch, (job->batch + alt.batch - 1) / alt.batch, fmt(a.per_machine, a1, sizeof a1),
                                a.per_machine <= avail ? " (fits)" : " (does not fit)");
    }
    if (!job->recompute && len < sizeof others) {
        dt_plan_job alt = *job;
        dt_plan_memory a;
        alt.recompute = 1;
        dt_plan_memory_estimate(&alt, &a);
        char a1[32];
        len += (size_t)snprintf(others + len, sizeof others - len, "; --recompute needs %s%s", fmt(a.per_machine, a1, sizeof a1),
                                a.per_machine <= avail ? " (fits)" : " (does not fit)");
    }
    char b[7][32];
    return dt_error(DT_ERR_ARG, "%s needs %s on this machine (%d rank%s x %s: parameters %s, gradients %s, optimizer %s, "
                    "activations %s, buffers %s, tokens %s, the process %s), %s available%s",
                    stage_name(job->stage, job->dp), fmt(m.per_machine, b[0], 32), job->local_ranks, job->local_ranks == 1 ? "" : "s",
                    fmt(m.per_rank, b[1], 32), fmt(m.params, b[2], 32), fmt(m.grads, b[3], 32), fmt(m.optim, b[4], 32),
                    fmt(m.acts, b[5], 32), fmt(m.comm, b[6], 32), fmt(m.data, (char[32]){ 0 }, 32), fmt(m.runtime, (char[32]){ 0 }, 32), fmt(avail, (char[32]){ 0 }, 32), others);
}
