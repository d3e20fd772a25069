/* dtrain plan: a train command's job priced before launch. The layout rules
 * (layout.c) and the memory plan (plan/memory.c) are the ones train itself
 * refuses by and sizes from; this file resolves the model and hardware,
 * prints one plan, or searches every layout of the ranks. */
#include "device_setup.h"
#include "dtrain/train.h"
#include "dtrain/obs.h"
#include "dtrain/pipeline.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The model: --params N, a file's shape, or a preset; train's shape flags over it. */
static dt_status resolve_model(dt_train_config *c, const dt_plan_request *rq, dt_gpt2_config *cfg) {
    dt_status st = DT_OK;
    if (rq->params > 0) dt_plan_shape_for_params(rq->params, cfg);
    else if (access(c->model, R_OK) == 0) {
        dt_gpt2 *g = NULL;
        int step;
        if ((st = dt_checkpoint_load_weights(c->model, c->shape.num_heads, &g, &step))) return st;
        *cfg = *dt_gpt2_get_config(g);
        dt_gpt2_destroy(g);
    } else if ((st = dt_plan_model_preset(c->model, cfg))) return st;
    const dt_gpt2_config *o = &c->shape;
    if (o->num_layers) cfg->num_layers = o->num_layers;
    if (o->num_heads) cfg->num_heads = o->num_heads;
    if (o->channels) cfg->channels = o->channels;
    if (o->max_seq_len) cfg->max_seq_len = o->max_seq_len;
    if (o->vocab_size) cfg->vocab_size = o->vocab_size, cfg->padded_vocab_size = o->padded_vocab_size ? o->padded_vocab_size : (o->vocab_size + 63) / 64 * 64;
    if (o->kv_heads) cfg->kv_heads = o->kv_heads;
    if (o->ffn) cfg->ffn = o->ffn;
    if ((st = dt_train_take_experts(c, access(c->model, R_OK) == 0, cfg))) return st;
    if (dt_plan_gpt2_block(cfg) && cfg->channels % cfg->num_heads) return dt_error(DT_ERR_ARG, "--channels %d does not split into %d heads", cfg->channels, cfg->num_heads);
    return DT_OK;
}

/* The ranks the command asks for: --nproc, else the product of the axes given. */
static int job_ranks(const dt_train_config *c) {
    if (c->nproc > 1) return c->nproc;
    return (c->dp ? c->dp : 1) * (c->tp ? c->tp : 1) * (c->pp ? c->pp : 1) * (c->cp ? c->cp : 1);
}

typedef struct {
    dt_train_config c;
    dt_plan_job job;
    dt_plan_memory mem;
    dt_plan_time time;
    int fits, nodes;
} plan_result;

/* One layout: refused with train's message, or priced. */
/* The resident growth the timings left in this process (the BLAS's buffers at the job's shapes, and the head's part
 * of it): measured here, it is kept in the machine's cache beside them; read from there, so were the timings, which
 * then never ran here, and it is read too. Read (all, or some: another plan shared shapes with this one) and not in
 * the cache, the growth here would be none or part of it: every timing runs here again (once a process), and the
 * growth is whole. */
static void resident_of_timings(size_t process, plan_result *r, const dt_plan_hardware *hw, size_t *now, size_t *head) {
    bool measured, read;
    uint64_t h = dt_plan_timings_asked(&measured, &read);
    char key[2][64];
    snprintf(key[0], sizeof key[0], "plan_resident_mb_%016llx", (unsigned long long)h);
    snprintf(key[1], sizeof key[1], "plan_head_resident_mb_%016llx", (unsigned long long)h);
    double mb[2];
    bool cached = dt_peak_lookup(key[0], &mb[0]) && dt_peak_lookup(key[1], &mb[1]);
    static bool again; /* once a process: a search prices many layouts, and the first's growth is the process's since */
    if (read && !cached && process && !again) {
        again = true;
        dt_plan_timings_fresh(true);
        dt_plan_step_time(&r->job, hw, &r->time);
        dt_plan_timings_fresh(false);
        *now = dt_resident_memory();
        *head = r->time.head_resident;
        measured = true, read = false;
    }
    if (measured && !read) {
        if (!process) return;
        dt_peak_save_rate(key[0], *now > process ? (double)(*now - process) / 1e6 : 0);
        dt_peak_save_rate(key[1], (double)*head / 1e6);
    } else if (process && cached) {
        *now = process + (size_t)(mb[0] * 1e6);
        *head = (size_t)(mb[1] * 1e6);
    }
}

static dt_status plan_one(const dt_train_config *c, const dt_plan_request *rq, const dt_gpt2_config *cfg,
                          const dt_plan_hardware *h, int nranks, size_t process, plan_result *r) {
    int paper = strcmp(h->name, "this") != 0;
    dt_status st = dt_train_check_mesh(c, nranks, paper);
    if (st) return st;
    int tp = c->tp ? c->tp : 1, pp = c->pp ? c->pp : 1, cp = c->cp ? c->cp : 1;
    int nodes = rq->nodes > 0 ? rq->nodes : h->shared_memory ? 1 : (nranks + h->devices_per_node - 1) / h->devices_per_node;
    const char *priv = getenv("DTRAIN_ZERO_PRIVATE_PARAMS");
    dt_train_dims d = { .dp = nranks / (tp * pp * cp), .tp = tp, .pp = pp, .cp = cp, .ep = c->ep, .local_ranks = (nranks + nodes - 1) / nodes };
    d.shared_params = h->shared_memory && nodes == 1 && nranks > 1 && !(priv && atoi(priv) > 0);
    if ((st = dt_train_check_model(c, cfg, &d))) return st;
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->nodes = nodes;
    dt_train_plan_job(c, cfg, &d, &r->job);
    r->job.params_override = rq->params;
    r->job.expert_load = rq->expert_load, r->job.expert_rows = rq->expert_rows;
    r->job.paper_states = rq->params > 0 || !h->shared_memory;
    r->job.paper_acts = !h->shared_memory;
    /* the threads a run from this shell takes (train.c: --threads, else OMP_NUM_THREADS, else its share of the cores) */
    r->job.threads = c->threads > 0 || paper ? c->threads : dt_comm_threads_asked();
    r->job.nodes = nodes;
    r->job.process_bytes = process;
    dt_plan_step_time(&r->job, h, &r->time);
    /* after the GEMMs at the job's shapes ran here: the BLAS's buffers are part of a rank's process too */
    size_t now = dt_resident_memory();
    resident_of_timings(process, r, h, &now, &r->time.head_resident);
    if (process && now > process) r->job.process_bytes = now, r->job.head_process_bytes = r->time.head_resident;
    dt_plan_memory_estimate(&r->job, &r->mem);
    r->fits = (h->shared_memory ? r->mem.per_machine : r->mem.per_rank) <= h->memory - h->reserved;
    return DT_OK;
}

static const char *gb(double bytes, char *buf) { return dt_plan_bytes_text(bytes, buf, 32); }

static const char *stage_name(int s) { return s == 0 ? "ddp" : s == 1 ? "zero1" : s == 2 ? "zero2" : "zero3"; }

/* "dp 2 x tp 1 x pp 1 x cp 1, zero1, bf16, micro-batch 4 x 2 a step, recompute": c's layout over dp (the DP axis) x tp x pp x cp */
/* A codec's train flags (none: empty). */
static void codec_flags(const dt_codec_config *k, char *out, size_t cap) {
    *out = 0;
    if (k->kind == DT_CODEC_NONE) return;
    int n = snprintf(out, cap, "--compress %s", dt_codec_name(k->kind));
    if (n > 0 && (size_t)n < cap && k->kind == DT_CODEC_POWERSGD) n += snprintf(out + n, cap - (size_t)n, " --compress-rank %d", k->rank);
    if (n > 0 && (size_t)n < cap && (k->kind == DT_CODEC_TOPK || k->kind == DT_CODEC_DGC))
        n += snprintf(out + n, cap - (size_t)n, " --compress-density %g", k->density);
    if (n > 0 && (size_t)n < cap && k->warmup) n += snprintf(out + n, cap - (size_t)n, " --compress-warmup %d", k->warmup);
    if (n > 0 && (size_t)n < cap && k->exchange) n += snprintf(out + n, cap - (size_t)n, " --compress-exchange %s", dt_codec_exchange_name(k->exchange));
    if (n > 0 && (size_t)n < cap && k->start) snprintf(out + n, cap - (size_t)n, " --compress-start %d", k->start);
}

static void describe(const dt_train_config *c, int dp, int tp, int pp, int cp, int stage, char *out, size_t cap) {
    char ep[24] = "", codec[96];
    if (c->ep > 1) snprintf(ep, sizeof ep, " (ep %d)", c->ep);
    codec_flags(&c->codec, codec, sizeof codec);
    snprintf(out, cap, "dp %d%s x tp %d x pp %d x cp %d, %s, %s, micro-batch %d x %d a step%s%s%s%s%s", dp, ep, tp, pp, cp,
             dp * cp > 1 ? stage_name(stage) : "one replica", c->precision == DT_F32 ? "fp32" : dt_precision_name(c->precision), c->batch,
             c->grad_accum, c->recompute ? ", recompute" : "", pp > 1 ? ", " : "", pp > 1 ? dt_pp_kind_name((dt_pp_kind)c->pp_schedule) : "",
             *codec ? ", " : "", codec);
}

static void describe_result(const plan_result *r, char *out, size_t cap) {
    const dt_plan_job *j = &r->job;
    int cp = j->cp > 1 ? j->cp : 1;
    describe(&r->c, j->dp / cp, j->tp > 1 ? j->tp : 1, j->pp > 1 ? j->pp : 1, cp, j->stage, out, cap);
}

/* The layout's own train flags (with the command's other flags they reproduce it): what --search prints for each fit. */
static void layout_flags(const plan_result *r, char *out, size_t cap) {
    const dt_plan_job *j = &r->job;
    int cp = j->cp > 1 ? j->cp : 1, tp = j->tp > 1 ? j->tp : 1, pp = j->pp > 1 ? j->pp : 1, dp = j->dp / cp;
    int n = snprintf(out, cap, "--nproc %d --dp %d --tp %d --pp %d --cp %d --batch %d --grad-accum %d", dp * tp * pp * cp, dp, tp, pp, cp,
                     r->c.batch, r->c.grad_accum);
    if (n > 0 && (size_t)n < cap && r->c.ep > 1) n += snprintf(out + n, cap - (size_t)n, " --ep %d", r->c.ep);
    if (n > 0 && (size_t)n < cap && dp * cp > 1 && j->stage) n += snprintf(out + n, cap - (size_t)n, " --zero %d", j->stage);
    if (n > 0 && (size_t)n < cap && r->c.precision != DT_F32) n += snprintf(out + n, cap - (size_t)n, " --precision %s", dt_precision_name(r->c.precision));
    if (n > 0 && (size_t)n < cap && r->c.recompute) n += snprintf(out + n, cap - (size_t)n, " --recompute");
    if (n > 0 && (size_t)n < cap && pp > 1) n += snprintf(out + n, cap - (size_t)n, " --pp-schedule %s", dt_pp_kind_name((dt_pp_kind)r->c.pp_schedule));
    char codec[96];
    codec_flags(&r->c.codec, codec, sizeof codec);
    if (n > 0 && (size_t)n < cap && *codec) snprintf(out + n, cap - (size_t)n, " %s", codec);
}

/* The plan's first lines: the model and its layout, the hardware and how it counts. */
static void print_header(const plan_result *r, const dt_plan_hardware *h, const dt_gpt2_config *cfg, FILE *f) {
    const dt_plan_memory *m = &r->mem;
    const dt_plan_time *t = &r->time;
    char b[12][32], lay[256];
    describe_result(r, lay, sizeof lay);
    double np = dt_plan_model_params(&r->job);
    dt_gpt2_config rc = dt_lm_config_resolve(cfg);
    char experts[64] = "";
    if (rc.experts) snprintf(experts, sizeof experts, ", %d experts (top-%d)", rc.experts, rc.experts_top_k);
    bool gpt2 = rc.family == dt_family_find("gpt2"); /* (named unless plain GPT-2) */
    fprintf(f, "plan: %s%s%.3gB parameters (%d layers, %d channels, %d heads%s), %s x %d positions\n", gpt2 ? "" : dt_family_name(rc.family),
            gpt2 ? "" : ", ", np / 1e9, cfg->num_layers, cfg->channels, cfg->num_heads, experts, lay, r->c.seq);
    int ranks = r->job.dp * (r->job.tp > 1 ? r->job.tp : 1) * (r->job.pp > 1 ? r->job.pp : 1);
    char threads[48] = "";
    if (h->shared_memory) snprintf(threads, sizeof threads, ", %d thread%s a rank", t->threads, t->threads == 1 ? "" : "s");
    fprintf(f, "hardware: %s, %d %s%s on %d machine%s%s; model states as %s; activations as %s\n", h->name, ranks,
            h->shared_memory ? "rank" : "device", ranks > 1 ? "s" : "", r->nodes, r->nodes == 1 ? "" : "s", threads,
            r->job.paper_states ? "ZeRO's anatomy (16-bit parameters and gradients, K = 12)" : "dtrain allocates them",
            r->job.paper_acts ? "Megatron-LM keeps them (Korthikanti et al. 2022, scores not kept)" : "dtrain's arenas hold them");
    if (t->oversubscribed > 1)
        fprintf(f, "  (%.3g threads for each of the machine's cores: every rank computes %.3gx slower)\n", t->oversubscribed, t->oversubscribed);
    if (t->beside > 1)
        fprintf(f, "  (the other ranks keep the machine's other cores busy: compute %.1f%% slower, as a GEMM measured beside them)\n",
                100 * (t->beside - 1));
    if (m->not_at_once > 0)
        fprintf(f, "  (the total counts the 16-bit copy by unit and the pool's pages at their largest moment together, %s less than "
                "their sum: the head's copy is held as backward starts, the pages fill as it ends)\n", gb(m->not_at_once, b[11]));
    if (m->mapped > 0)
        fprintf(f, "  (and %s of pages the rank maps beside its own, held once by the machine: ZeRO's one parameter copy, the "
                "gradients the shared-memory reduction reads in place, or ZeRO 2 and 3's pool mapped again over the store and the part of "
                "each peer's shard its reductions write)\n",
                gb(m->mapped, b[11]));
}

/* What a rank (or device) holds, and whether the machine holds it. */
static void print_memory(const plan_result *r, const dt_plan_hardware *h, FILE *f) {
    const dt_plan_memory *m = &r->mem;
    char b[12][32];
    fprintf(f, "memory per %s (the largest):\n  parameters %s (16-bit copy %s)\n  gradients %s\n  optimizer %s\n  activations %s\n"
               "  buffers %s\n", h->shared_memory ? "rank" : "device", gb(m->params + m->lowp, b[0]), gb(m->lowp, b[1]), gb(m->grads, b[2]),
            gb(m->optim, b[3]), gb(m->acts, b[4]), gb(m->comm, b[5]));
    if (m->precond > 0)
        fprintf(f, "  preconditioner %s (%s %s on the rank holding most, scratch %s)\n", gb(m->precond, b[6]),
                r->job.kfac_on ? "K-FAC's factors and decompositions" : r->job.shampoo_on ? "Shampoo's factors, roots and moments"
                                                                         : "SOAP's statistics and bases",
                gb(m->precond - m->precond_scratch, b[7]), gb(m->precond_scratch, b[8]));
    if (h->shared_memory) /* a CPU machine: its ranks share its memory, token files and processes included */
        fprintf(f, "  token files %s\n  the process %s\n  total %s; x %d rank%s a machine = %s: %s %s\n", gb(m->data, b[6]),
                gb(m->runtime, b[7]), gb(m->per_rank, b[8]), r->job.local_ranks, r->job.local_ranks == 1 ? "" : "s",
                gb(m->per_machine, b[9]), r->fits ? "fits in" : "does NOT fit in", gb(h->memory, b[10]));
    else /* a device: its own memory, less what the runtime keeps of it */
        fprintf(f, "  total %s a device: %s the %s of a %s device less %s kept for the CUDA context, NCCL's buffers and the "
                "allocator's fragmentation (%.0f%% of the usable memory)\n", gb(m->per_rank, b[8]), r->fits ? "fits in" : "does NOT fit in",
                gb(h->memory - h->reserved, b[9]), gb(h->memory, b[10]), gb(h->reserved, b[11]),
                100 * m->per_rank / (h->memory - h->reserved));
}

/* The step's predicted time by part. */
static void print_time(const plan_result *r, FILE *f) {
    const dt_plan_time *t = &r->time;
    char b[2][32];
    /* where the update runs (dt_engine_updates_in_backward): with several data-parallel ranks it is the engine's choice */
    const char *when = r->job.dp <= 1 ? "" : dt_plan_update_in_backward(&r->job) ? " (inside backward, the ranks by turns)" : " (after backward)";
    fprintf(f, "step time (predicted, ms): matmul %.1f, attention %.1f, elementwise %.1f, optimizer %.1f%s, 16-bit copies by unit %.1f, "
               "gradient pages %.1f, data-parallel %.1f (%.1f exposed; the link's processing on the cores %.1f; waiting for the slower rank %.1f), tensor-parallel %.1f (%.1f of it waiting for the slower rank), context-parallel %.1f, expert-parallel %.1f, pipeline transfers %.1f, bubble %.1f\n"
               "  step %.1f ms, %.0f tokens/s\n",
            1e3 * t->matmul, 1e3 * t->attention, 1e3 * t->elementwise, 1e3 * t->optimizer, when, 1e3 * t->lp_units, 1e3 * t->grad_pages, 1e3 * t->dp_comm, 1e3 * t->dp_exposed,
            1e3 * t->link_compute, 1e3 * t->dp_waits, 1e3 * t->tp_comm, 1e3 * t->tp_waits, 1e3 * t->cp_comm, 1e3 * t->ep_comm, 1e3 * t->pp_comm, 1e3 * t->bubble, 1e3 * t->step, t->tok_per_s);
    if (t->precond + t->precond_comm > 0)
        fprintf(f, "  preconditioning %.1f ms of the step on the busiest rank (factors, decompositions at their interval, the "
                "preconditioned gradients), its collectives %.1f\n", 1e3 * t->precond, 1e3 * t->precond_comm);
    if (r->job.codec.kind != DT_CODEC_NONE)
        fprintf(f, "  --compress %s: %s sent a step a rank (the gradients hold %s), its compression %.1f ms on the rank\n",
                dt_codec_name(r->job.codec.kind), gb(t->codec_bytes, b[0]), gb(4 * dt_plan_model_params(&r->job), b[1]), 1e3 * t->codec);
}

static void print_plan(const plan_result *r, const dt_plan_hardware *h, const dt_gpt2_config *cfg, FILE *f) {
    print_header(r, h, cfg, f);
    print_memory(r, h, f);
    print_time(r, f);
}

static cJSON *plan_json(const plan_result *r) {
    const dt_plan_memory *m = &r->mem;
    const dt_plan_time *t = &r->time;
    char lay[256];
    describe_result(r, lay, sizeof lay);
    cJSON *o = cJSON_CreateObject(), *br = cJSON_CreateObject(), *mem = cJSON_CreateObject(), *tm = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "layout", lay);
    layout_flags(r, lay, sizeof lay);
    cJSON_AddStringToObject(o, "flags", lay);
    cJSON_AddNumberToObject(o, "params", m->params + m->lowp);
    cJSON_AddNumberToObject(o, "grads", m->grads);
    cJSON_AddNumberToObject(o, "optimizer", m->optim);
    cJSON_AddNumberToObject(o, "preconditioner", m->precond);
    cJSON_AddNumberToObject(o, "activations", m->acts);
    cJSON_AddNumberToObject(o, "buffers", m->comm);
    cJSON_AddNumberToObject(o, "total", m->per_rank);
    cJSON_AddBoolToObject(o, "fits", r->fits);
    cJSON_AddNumberToObject(o, "step_ms", 1e3 * t->step);
    cJSON_AddNumberToObject(o, "tok_per_s", t->tok_per_s);
    cJSON_AddNumberToObject(mem, "lowp_copy", m->lowp);
    cJSON_AddNumberToObject(mem, "mapped_from_peers", m->mapped);
    cJSON_AddNumberToObject(mem, "not_at_once", m->not_at_once);
    cJSON_AddNumberToObject(mem, "token_files", m->data);
    cJSON_AddNumberToObject(mem, "process", m->runtime);
    cJSON_AddNumberToObject(mem, "precond_state", m->precond - m->precond_scratch);
    cJSON_AddNumberToObject(mem, "precond_scratch", m->precond_scratch);
    cJSON_AddNumberToObject(mem, "per_machine", m->per_machine);
    const double ms[] = { t->matmul, t->attention, t->elementwise, t->optimizer, t->lp_units, t->grad_pages, t->dp_comm, t->dp_exposed, t->tp_comm, t->tp_waits, t->cp_comm,
                          t->ep_comm, t->pp_comm, t->bubble, t->codec, t->precond, t->precond_comm, t->link_compute, t->dp_waits };
    static const char *const names[] = { "matmul", "attention", "elementwise", "optimizer", "lp_units", "grad_pages", "dp_comm", "dp_exposed", "tp_comm", "tp_waits",
                                         "cp_comm", "ep_comm", "pp_comm", "bubble", "codec", "precond", "precond_comm", "link_compute", "dp_waits" };
    _Static_assert(sizeof names / sizeof *names == sizeof ms / sizeof *ms, "a name for each part of the step");
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) cJSON_AddNumberToObject(tm, names[i], 1e3 * ms[i]);
    cJSON_AddNumberToObject(br, "threads", t->threads);
    cJSON_AddNumberToObject(br, "grad_sent_bytes", t->codec_bytes); /* a rank's gradients on the wire a step (a codec's) */
    cJSON_AddNumberToObject(br, "oversubscribed", t->oversubscribed);
    cJSON_AddNumberToObject(br, "beside", t->beside);
    cJSON_AddBoolToObject(br, "update_in_backward", dt_plan_update_in_backward(&r->job)); /* the ranks by turns (ddp.c) */
    /* the buckets the reduction's overlap was priced by: [share of the gradients, share of backward run when it closes] */
    cJSON *bk = cJSON_AddArrayToObject(br, "buckets");
    for (int k = 0; bk && k < t->buckets; k++) {
        const double pair[2] = { t->bucket_share[k], t->bucket_ready[k] };
        cJSON_AddItemToArray(bk, cJSON_CreateDoubleArray(pair, 2));
    }
    cJSON_AddItemToObject(br, "memory", mem);
    cJSON_AddItemToObject(br, "time_ms", tm);
    cJSON_AddItemToObject(o, "breakdown", br);
    return o;
}

static void emit_json(cJSON *o, FILE *f) {
    char *s = cJSON_Print(o);
    if (s) fprintf(f, "%s\n", s);
    free(s);
    cJSON_Delete(o);
}

static int search(const dt_train_config *c, const dt_plan_request *rq, const dt_gpt2_config *cfg,
                  const dt_plan_hardware *h, int nranks, size_t process, FILE *f);

/* The train command a plan stands for: the plan's train flags, less those of a layout when a search's layout replaces
 * them (its flags then after them), each word quoted where the shell would split it. */
static void print_train_command(const dt_plan_request *rq, const char *layout, FILE *f) {
    static const char *const layout_flags_given[] = { "--nproc", "--dp", "--tp", "--pp", "--cp", "--batch", "--grad-accum",
                                                      "--micro-batches", "--zero", "--strategy", "--precision", NULL };
    fprintf(f, "%s: dtrain train", layout ? "the first, as a train command" : "to run it");
    for (int i = 1; i < rq->argc; i++) {
        const char *a = rq->argv[i];
        bool drop = false;
        for (int k = 0; layout && layout_flags_given[k]; k++) drop |= !strcmp(a, layout_flags_given[k]);
        if (layout && !strcmp(a, "--recompute")) continue;
        if (drop) { i++; continue; }
        fprintf(f, strpbrk(a, " \t'\"$") ? " '%s'" : " %s", a);
    }
    fprintf(f, "%s%s\n", layout ? " " : "", layout ? layout : "");
}

/* This machine's rates are measured once per CPU and cached. The first time, measure them in a child: the buffers a measurement
 * leaves resident (the sgemm 2048^3 peak's packing, ~28 MB, and ~10 MB more) are not a rank's, and the plan counts this
 * process's resident size as a rank's (the first plan on a machine said 56 MB for it where a rank holds 18). The child says
 * nothing; the parent then reads the cache, or measures itself, and says what is to be said (a warning once, not twice). */
static void measure_this_machine_apart(const char *hardware) {
    if (hardware && strcmp(hardware, "this")) return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dt_plan_hardware h;
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, STDERR_FILENO);
        _exit(dt_plan_hardware_get(hardware, &h) ? 1 : 0);
    }
    if (pid > 0) while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
}

int dt_train_plan(const dt_train_config *c0, const dt_plan_request *rq, FILE *f) {
    size_t process = dt_resident_memory();
    dt_train_config c = *c0;
    dt_gpt2_config cfg;
    dt_plan_hardware h;
    /* ZeRO's mixed-precision Adam for --params (the paper's accounting) */
    if (rq->params > 0 && c.precision == DT_F32) c.precision = DT_F16;
    dt_status st = resolve_model(&c, rq, &cfg);
    if (!st && c.cuda) {
        int rc = dt_train_plan_gpu(&c, rq, &cfg, job_ranks(&c), f);
        if (!rc && !rq->json && rq->argv) print_train_command(rq, NULL, f);
        return rc;
    }
    if (!st) measure_this_machine_apart(rq->hardware), st = dt_plan_hardware_get(rq->hardware, &h);
    if (st) {
        dt_log(DT_LOG_ERROR, "plan: %s", dt_last_error());
        return 2;
    }
    if (strcmp(h.name, "this")) process = 0; /* another machine's process: not modelled (a GPU's context is not counted) */
    int nranks = job_ranks(&c);
    if (rq->search) return search(&c, rq, &cfg, &h, nranks, process, f);
    plan_result r;
    if ((st = plan_one(&c, rq, &cfg, &h, nranks, process, &r))) {
        dt_log(DT_LOG_ERROR, "plan: %s", dt_last_error());
        return 2;
    }
    if (rq->json) emit_json(plan_json(&r), f);
    else print_plan(&r, &h, &cfg, f);
    if (!rq->json && rq->argv) print_train_command(rq, NULL, f);
    return 0;
}

/* ---- --search ---- */

static int by_speed(const void *a, const void *b) {
    double x = ((const plan_result *)a)->time.tok_per_s, y = ((const plan_result *)b)->time.tok_per_s;
    return (x < y) - (x > y);
}

static int search(const dt_train_config *c, const dt_plan_request *rq, const dt_gpt2_config *cfg,
                  const dt_plan_hardware *h, int nranks, size_t process, FILE *f) {
    /* the global batch in sequences: the command's micro-batch x micro-batches x data-parallel ranks */
    int tp0 = c->tp ? c->tp : 1, pp0 = c->pp ? c->pp : 1, cp0 = c->cp ? c->cp : 1;
    long global = (long)c->batch * c->grad_accum * (nranks / (tp0 * pp0 * cp0) > 0 ? nranks / (tp0 * pp0 * cp0) : 1);
    size_t cap = 4096, n = 0, nrej = 0;
    plan_result *ok = malloc(cap * sizeof *ok);
    cJSON *rejected = cJSON_CreateArray();
    if (!ok || !rejected) { free(ok); cJSON_Delete(rejected); return 1; }
    static const dt_dtype precs[] = { DT_F32, DT_BF16 };
    /* a codec changes what training computes: the search weighs one only where the command names it (--compress) */
    int ncodec = c->codec.kind != DT_CODEC_NONE ? 2 : 1;
    for (int tp = 1; tp <= nranks; tp++)
        for (int pp = 1; tp * pp <= nranks; pp++)
            for (int cp = 1; tp * pp * cp <= nranks; cp++) {
                if (nranks % (tp * pp * cp)) continue;
                int dp = nranks / (tp * pp * cp);
                for (int stage = 0; stage <= (dp * cp > 1 ? 3 : 0); stage++)
                    for (long b = 1; b <= global / dp && b <= 1024; b *= 2)
                        for (int rc = 0; rc <= 1; rc++)
                            for (int pi = 0; pi < 2 * ncodec; pi++) {
                                if (global % (dp * b)) continue;
                                /* the command's codec, and none: it compresses data parallelism's (and ZeRO's) f32
                                 * gradients, so it is tried where that is all the layout has */
                                int coded = pi / 2 == 1;
                                if (coded && (dp * cp < 2 || tp > 1 || pp > 1 || cp > 1 || c->grad_comm != DT_F32)) continue;
                                dt_train_config t = *c;
                                if (!coded) t.codec.kind = DT_CODEC_NONE;
                                t.nproc = nranks, t.dp = dp, t.tp = tp, t.pp = pp, t.cp = cp, t.batch = (int)b;
                                t.grad_accum = (int)(global / (dp * b)), t.recompute = rc, t.precision = precs[pi % 2];
                                t.strategy = stage ? (const char *[]){ "", "zero1", "zero2", "zero3" }[stage] : NULL;
                                if (t.grad_store != DT_F32 && t.precision == DT_F32) t.grad_store = DT_F32;
                                if (pp > 1 && t.pp_schedule == DT_PP_INTERLEAVED && t.grad_accum % pp) t.pp_schedule = DT_PP_1F1B;
                                plan_result r;
                                dt_status st = plan_one(&t, rq, cfg, h, nranks, process, &r);
                                char lay[256], why[600];
                                if (!st && !r.fits) {
                                    char b1[32], b2[32];
                                    snprintf(why, sizeof why, "needs %s a %s, %s available%s", gb(h->shared_memory ? r.mem.per_machine : r.mem.per_rank, b1),
                                             h->shared_memory ? "machine" : "device", gb(h->memory - h->reserved, b2),
                                             h->reserved > 0 ? " (the runtime's headroom left out)" : "");
                                } else if (st) snprintf(why, sizeof why, "%s", dt_last_error());
                                if (st || !r.fits) {
                                    describe(&t, dp, tp, pp, cp, stage, lay, sizeof lay);
                                    cJSON *o = cJSON_CreateObject();
                                    cJSON_AddStringToObject(o, "layout", lay);
                                    cJSON_AddStringToObject(o, "reason", why);
                                    cJSON_AddItemToArray(rejected, o);
                                    nrej++;
                                    continue;
                                }
                                if (n == cap) {
                                    plan_result *g = realloc(ok, 2 * cap * sizeof *ok);
                                    if (!g) break;
                                    ok = g, cap *= 2;
                                }
                                ok[n++] = r;
                            }
            }
    qsort(ok, n, sizeof *ok, by_speed);
    /* ranks: a group is a layout and every next one within --ties of it; the plan does not order layouts inside one */
    int *group = malloc((n ? n : 1) * sizeof *group);
    if (!group) { free(ok); cJSON_Delete(rejected); return 1; }
    for (size_t i = 0, first = 0; i < n; i++) {
        if (i && ok[i].time.step > ok[first].time.step * (1 + rq->ties)) first = i;
        group[i] = i == first ? (i ? group[i - 1] + 1 : 1) : group[first];
    }
    if (rq->json) {
        cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++) {
            cJSON *one = plan_json(&ok[i]);
            cJSON_AddNumberToObject(one, "rank", group[i]);
            cJSON_AddItemToArray(arr, one);
        }
        cJSON_AddNumberToObject(o, "global_batch", (double)global);
        cJSON_AddNumberToObject(o, "ties", rq->ties);
        cJSON_AddItemToObject(o, "fits", arr);
        cJSON_AddItemToObject(o, "rejected", rejected);
        emit_json(o, f);
    } else {
        char b1[32];
        fprintf(f, "search: %d ranks on %s, global batch %ld sequences of %d: %zu layouts fit, %zu do not\n", nranks, h->name, global,
                c->seq, n, nrej);
        fprintf(f, "(a rank is shared by the layouts within %g%% of its first: the plan does not order those; --ties)\n", 100 * rq->ties);
        for (size_t i = 0; i < n; i++) {
            char lay[256];
            describe_result(&ok[i], lay, sizeof lay);
            fprintf(f, "%4d%c %9.0f tok/s  step %9.1f ms  %s a %s  %s\n", group[i], i && group[i] == group[i - 1] ? '=' : '.',
                    ok[i].time.tok_per_s, 1e3 * ok[i].time.step, gb(h->shared_memory ? ok[i].mem.per_machine : ok[i].mem.per_rank, b1),
                    h->shared_memory ? "machine" : "device", lay);
        }
        if (nrej) fprintf(f, "do not run or fit:\n");
        for (cJSON *it = rejected->child; it; it = it->next)
            fprintf(f, "  %s: %s\n", cJSON_GetObjectItem(it, "layout")->valuestring, cJSON_GetObjectItem(it, "reason")->valuestring);
        cJSON_Delete(rejected);
        if (n && rq->argv) {
            char lay[512];
            layout_flags(&ok[0], lay, sizeof lay);
            print_train_command(rq, lay, f);
        }
    }
    free(group);
    free(ok);
    return 0;
}
