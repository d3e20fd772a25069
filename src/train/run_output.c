/* What a run writes as it goes and at its end: a metrics line per step,
 * every rank's memory and I/O, the trace, run.json and the report. */
#include "run.h"
#include "dtrain/io.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The balancing losses' names in the metrics (TensorBoard's: moe/ and the name past "moe_"), in dt_program_moe_terms' order. */
static const char *const moe_terms[DT_MOE_TERMS] = { "moe_balance_loss", "moe_z_loss", "moe_seq_aux_loss", "moe_global_aux_loss" };

/* A mixture of experts' load over the last evaluation's batches, on an evaluation's metrics row (none without experts). */
static void val_load_json(FILE *f, const run *r) {
    if (r->moe_val_worst > 0) fprintf(f, ",\"val_expert_load_max_mean\":%.4f,\"val_expert_load_max_mean_avg\":%.4f", r->moe_val_worst, r->moe_val_mean);
}

/* A JSON number, or null when it is not finite (JSON has no NaN). */
static void json_num(FILE *f, const char *key, const char *fmt, double v) {
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}

/* The DPO figures (DT_TRAIN_DPO_*) by the metrics' names and TensorBoard's (TRL's, "/" as "_"). */
static const char *const dpo_json[DT_TRAIN_DPO_NFIGS] = { "reward_accuracy", "reward_margin", "reward_chosen", "reward_rejected",
                                                          "logps_chosen", "logps_rejected" };
static const char *const dpo_tb[DT_TRAIN_DPO_NFIGS] = { "rewards_accuracies", "rewards_margins", "rewards_chosen", "rewards_rejected",
                                                        "logps_chosen", "logps_rejected" };

static void dpo_figures(FILE *f, const char *prefix, const float *v) {
    for (int i = 0; i < DT_TRAIN_DPO_NFIGS; i++) {
        char key[48];
        snprintf(key, sizeof key, "%s%s", prefix, dpo_json[i]);
        json_num(f, key, i == DT_TRAIN_DPO_ACCURACY ? "%.4f" : "%.6f", v[i]);
    }
}

void dt_train_write_tensorboard(run *r, int step, float lr, const dt_step_result *s, double ms, double tps, bool eval, float val) {
    dt_tb_writer *w = r->tb;
    if (isfinite(s->loss)) dt_tb_scalar(w, "train/loss", s->loss);
    if (eval && isfinite(val)) dt_tb_scalar(w, "val/loss", val);
    dt_tb_scalar(w, "train/lr", lr);
    if (isfinite(s->norm)) dt_tb_scalar(w, "train/grad_norm", s->norm);
    dt_tb_scalar(w, "perf/tokens_per_s", tps);
    if (r->peak_gflops > 0) dt_tb_scalar(w, "perf/mfu", r->flops_per_step / (ms / 1e3) / 1e9 / r->peak_gflops);
    if (r->pipe) {
        dt_tb_scalar(w, "pipeline/bubble", r->bubble);
        dt_tb_scalar(w, "pipeline/bubble_model", r->bubble_model);
    }
    if (dt_engine_loss_scale(r->e)) dt_tb_scalar(w, "train/loss_scale", s->loss_scale);
    if (r->moe_worst > 0) dt_tb_scalar(w, "moe/load_max_mean", r->moe_worst), dt_tb_scalar(w, "moe/load_max_mean_avg", r->moe_mean);
    if (r->moe_dropped >= 0 && r->moe_worst > 0) dt_tb_scalar(w, "moe/choices_dropped", r->moe_dropped);
    for (int i = 0; r->moe_worst > 0 && i < DT_MOE_TERMS; i++) {
        char tag[48];
        snprintf(tag, sizeof tag, "moe/%s", moe_terms[i] + 4);
        if (r->moe_term[i] >= 0) dt_tb_scalar(w, tag, r->moe_term[i]);
    }
    if (eval && r->moe_val_worst > 0)
        dt_tb_scalar(w, "moe/val_load_max_mean", r->moe_val_worst), dt_tb_scalar(w, "moe/val_load_max_mean_avg", r->moe_val_mean);
    /* DPO's (TRL's names: rewards/accuracies, rewards/margins) */
    if (r->grpo) dt_tb_scalar(w, "train/reward", r->grpo_step.reward), dt_tb_scalar(w, "train/kl", r->grpo_step.kl);
    for (int i = 0; r->dpo && i < DT_TRAIN_DPO_NFIGS; i++) { /* (TRL's names, "/" as "_") */
        char tag[48];
        snprintf(tag, sizeof tag, "train/%s", dpo_tb[i]);
        if (isfinite(r->dpo_step[i])) dt_tb_scalar(w, tag, r->dpo_step[i]);
        snprintf(tag, sizeof tag, "val/%s", dpo_tb[i]);
        if (eval && isfinite(r->dpo_val[i])) dt_tb_scalar(w, tag, r->dpo_val[i]);
    }
    if (dt_tb_step(w, step + 1)) {
        dt_log(DT_LOG_WARN, "%s; TensorBoard's events stop here", dt_last_error());
        dt_tb_destroy(r->tb);
        r->tb = NULL;
    }
}

void dt_train_write_eval_metrics(run *r, float val) {
    const dt_train_config *c = &r->c;
    fprintf(r->metrics, "{\"val_loss\":");
    fprintf(r->metrics, isfinite(val) ? "%.9g" : "null", val);
    if (r->dpo) dpo_figures(r->metrics, "val_", r->dpo_val);
    val_load_json(r->metrics, r);
    if (r->model_step >= 0) fprintf(r->metrics, ",\"step\":%d", r->model_step);
    fprintf(r->metrics, ",\"tokens\":%lld,\"batches\":%d}\n", (long long)c->eval_batches * c->batch * c->seq * r->dp_size, c->eval_batches);
    dt_metrics_flush(&r->metrics, c->metrics, r->model_step);
}

void dt_train_write_metrics(run *r, int step, float lr, const dt_step_result *s, double ms, double tps, bool eval, float val) {
    FILE *f = r->metrics;
    /* context parallelism's attention this step; its waits on the group are exposed communication */
    double cw = 0, ca = r->cp ? dt_cp_attention_seconds(r->cp, &cw) : 0;
    fprintf(f, "{\"step\":%d", step + 1);
    json_num(f, "loss", "%.6f", s->loss);
    fprintf(f, ",\"lr\":%.6g", lr);
    json_num(f, "grad_norm", "%.6f", s->norm);
    fprintf(f, ",\"ms\":%.3f,\"tok_per_s\":%.1f,\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"optimizer_ms\":%.3f,"
            "\"compute_ms\":%.3f,\"comm_exposed_ms\":%.3f,\"data_ms\":%.3f", ms, tps, r->fwd * 1e3, r->bwd * 1e3, s->update_ms,
            (r->fwd + r->bwd - r->tp_comm - cw) * 1e3 - s->exposed_in_backward_ms + s->update_ms, s->exposed_ms + (r->tp_comm + cw) * 1e3,
            r->data * 1e3);
    if (r->tp_comm > 0) fprintf(f, ",\"tp_comm_ms\":%.3f", r->tp_comm * 1e3);
    if (s->precondition_ms > 0) /* its own phase: of it, what forward and backward held (K-FAC's factors); the rest in optimizer_ms */
        fprintf(f, ",\"precondition_ms\":%.3f,\"precondition_in_forward_ms\":%.3f,\"precondition_in_backward_ms\":%.3f", s->precondition_ms,
                s->precondition_in_forward_ms, s->precondition_in_backward_ms);
    if (r->cp) fprintf(f, ",\"cp_attention_ms\":%.3f,\"cp_wait_ms\":%.3f", ca * 1e3, cw * 1e3);
    if (r->pipe) fprintf(f, ",\"bubble\":%.4f,\"bubble_model\":%.4f", r->bubble, r->bubble_model);
    if (r->wgt > 0) fprintf(f, ",\"weight_grad_ms\":%.3f", r->wgt * 1e3);
    double gflops = r->flops_per_step / (ms / 1e3) / 1e9;
    fprintf(f, ",\"model_gflops\":%.2f", gflops);
    if (r->peak_gflops > 0) fprintf(f, ",\"mfu\":%.8f", gflops / r->peak_gflops); /* 8 decimals: a small MFU keeps its precision */
    /* this rank's I/O so far (each rank's totals are in run.json) */
    uint64_t b[2];
    double t[2];
    dt_io_get(DT_IO_DATA_READ, &b[0], &t[0]);
    dt_io_get(DT_IO_CKPT_WRITE, &b[1], &t[1]);
    fprintf(f, ",\"data_read_bytes\":%llu,\"data_read_ms\":%.3f,\"ckpt_write_bytes\":%llu,\"ckpt_write_ms\":%.3f",
            (unsigned long long)b[0], t[0] * 1e3, (unsigned long long)b[1], t[1] * 1e3);
    /* the share of the update done inside backward (the rest is in optimizer_ms) */
    if (r->nranks > 1) fprintf(f, ",\"updated_in_backward\":%.3f", s->updated_in_backward);
    if (s->grad_bytes > 0) fprintf(f, ",\"grad_sent_bytes\":%.0f,\"compress_ratio\":%.4f", s->grad_bytes, s->compress_ratio);
    if (s->grad_recv_bytes > 0) fprintf(f, ",\"grad_recv_bytes\":%.0f", s->grad_recv_bytes);
    if (eval) json_num(f, "val_loss", "%.6f", val);
    if (r->dpo) dpo_figures(f, "", r->dpo_step);
    if (r->grpo) { /* TRL's GRPO figures: reward, reward_std, kl, entropy, completions/mean_length, clip_ratio, frac_reward_zero_std */
        const dt_grpo_step_stats *g = &r->grpo_step;
        json_num(f, "reward", "%.6f", g->reward), json_num(f, "reward_std", "%.6f", g->reward_std), json_num(f, "kl", "%.6g", g->kl);
        json_num(f, "entropy", "%.6f", g->entropy);
        if (r->c.grpo.entropy_coef != 0 || r->c.grpo.adaptive) json_num(f, "entropy_coef", "%.6g", g->entropy_coef); /* (the next step's) */
        json_num(f, "completion_len", "%.2f", g->completion), json_num(f, "clip_ratio", "%.6f", g->clipped);
        json_num(f, "frac_reward_zero_std", "%.4f", g->flat), json_num(f, "rollout_s", "%.3f", g->decode_s);
        json_num(f, "rollout_tok_per_s", "%.1f", g->rollout_tps), json_num(f, "rollout_prompt_cached", "%.4f", g->cached);
        if (g->tool_calls >= 0) json_num(f, "tool_calls", "%.4f", g->tool_calls); /* (TRL's tools/call_frequency) */
        if (g->tool_failures >= 0) json_num(f, "tool_failures", "%.4f", g->tool_failures); /* (its tools/failure_frequency) */
        for (int k = 0; g->nrewards > 1 && k < g->nrewards; k++) { /* (TRL's rewards/NAME/mean, by --reward's order) */
            char name[24];
            snprintf(name, sizeof name, "reward_%d", k + 1);
            json_num(f, name, "%.6f", g->each[k]);
        }
    }
    if (r->moe_worst > 0) fprintf(f, ",\"expert_load_max_mean\":%.4f,\"expert_load_max_mean_avg\":%.4f", r->moe_worst, r->moe_mean);
    if (r->moe_dropped >= 0 && r->moe_worst > 0) fprintf(f, ",\"expert_choices_dropped\":%.6f", r->moe_dropped);
    for (int i = 0; r->moe_worst > 0 && i < DT_MOE_TERMS; i++) /* each balancing loss on, before its coefficient */
        if (r->moe_term[i] >= 0) json_num(f, moe_terms[i], "%.6f", r->moe_term[i]);
    if (eval) val_load_json(f, r);
    if (r->ep)
        fprintf(f, ",\"expert_exchange_bytes\":%.0f,\"expert_rank_load_max_mean\":%.4f,\"expert_rank_rows_max_mean\":%.4f", r->moe_ep_bytes,
                r->moe_rank_load, r->moe_rank_rows);
    if (r->dpo && eval) dpo_figures(f, "val_", r->dpo_val);
    if (s->skipped) fprintf(f, ",\"skipped\":true");
    if (dt_engine_loss_scale(r->e)) fprintf(f, ",\"loss_scale\":%.17g", s->loss_scale);
    fprintf(f, "}\n");
    dt_metrics_flush(&r->metrics, r->c.metrics, step + 1);
}

/* Bytes of parameters (with mixed precision's 16-bit copy) and gradients this rank holds. */
static void held(const run *r, size_t *params, size_t *grads) {
    dt_engine_held(r->e, params, grads);
    *params += dt_gpt2_lp_params_bytes(r->m);
}

/* Every rank's I/O counters and memory, on every rank (collective). */
static dt_status gather_ranks(run *r, double *all) {
    double mine[DT_RUN_RANK_FIELDS];
    for (int k = 0; k < 3; k++) {
        uint64_t b;
        dt_io_get((dt_io_kind)k, &b, &mine[2 * k + 1]);
        mine[2 * k] = (double)b;
    }
    size_t hp, hg;
    held(r, &hp, &hg);
    const double mem[6] = { (double)hp, (double)hg, (double)dt_train_optim_bytes(r), (double)(dt_engine_buffer_bytes(r->e) + dt_pipeline_buffer_bytes(r->pipe)),
                            (double)dt_gpt2_activation_memory(r->m), (double)dt_peak_memory() };
    memcpy(mine + 6, mem, sizeof mem);
    static const dt_mesh_dim dims[4] = { DT_MESH_DP, DT_MESH_TP, DT_MESH_PP, DT_MESH_CP };
    for (int i = 0; i < 4; i++) mine[12 + i] = r->mesh ? dt_mesh_coord(r->mesh, dims[i]) : 0;
    if (r->nranks == 1) { memcpy(all, mine, sizeof mine); return DT_OK; }
    return dt_comm_allgather(r->w, mine, all, DT_RUN_RANK_FIELDS, DT_F64);
}

size_t dt_train_optim_bytes(const run *r) {
    return dt_optim_state_bytes(dt_engine_optim(r->e)) + dt_train_precond_bytes(&r->pre);
}

/* run.json and report.html into --report DIR (rank 0). */
static void write_report(run *r, int steps_done, const double *ranks) {
    const dt_train_config *c = &r->c;
    size_t np = dt_gpt2_config_num_params(dt_gpt2_get_config(r->m)); /* the whole model's, under TP too */
    dt_run_record rec = { .model = *dt_gpt2_get_config(r->m), .params = np, .nranks = r->nranks, .steps_done = steps_done,
                          .strategy = dt_engine_strategy_name(r->e), .metrics = c->metrics, .trace = c->trace,
                          .peak_source = r->peak_source, .peak_gflops = r->peak_gflops, .flops_per_step = r->flops_per_step,
                          .wall_s = dt_time_now() - r->t_start, .ranks = ranks };
    double used = 0, total = 0;
    if ((rec.device = dt_train_device_name(&r->dev, &used, &total))) {
        rec.device_ordinal = r->dev.ordinal, rec.device_flash = dt_train_device_flash(&r->dev);
        rec.device_used = used * 1073741824.0, rec.device_total = total * 1073741824.0;
    }
    size_t hp, hg;
    held(r, &hp, &hg);
    double mem[5] = { (double)hp, (double)hg, (double)dt_gpt2_activation_memory(r->m), (double)dt_train_optim_bytes(r),
                      (double)dt_peak_memory() };
    memcpy(rec.memory, mem, sizeof mem);
    char path[4200], html[4200];
    snprintf(path, sizeof path, "%s/run.json", c->report);
    snprintf(html, sizeof html, "%s/report.html", c->report);
    if (dt_run_record_write(path, c, &rec) || dt_report_write(c->report, html))
        dt_log(DT_LOG_WARN, "the report was not written (the training is done and saved): %s", dt_last_error());
    else if (!c->quiet) printf("report: %s\n", html);
}

/* After the last step: the trace, every rank's I/O, the report. A failure
 * here warns: the training itself is done. */
void dt_train_observe_end(run *r, int steps_done) {
    const dt_train_config *c = &r->c;
    if (r->trace && dt_trace_file_write(r->trace)) dt_log(DT_LOG_WARN, "the trace was not written: %s", dt_last_error());
    else if (r->trace && r->rank == 0 && !c->quiet) printf("trace: %s (steps %d to %d)\n", c->trace, c->trace_first, c->trace_last);
    double *all = calloc((size_t)r->nranks * DT_RUN_RANK_FIELDS, sizeof *all);
    if (!all || gather_ranks(r, all)) { dt_log(DT_LOG_WARN, "per-rank figures: %s", all ? dt_last_error() : "out of memory"); free(all); return; }
    if (r->rank == 0 && !c->quiet) {
        printf("memory per rank (MiB): parameters, gradients, optimizer state, communication buffers, activations; peak resident\n");
        for (int k = 0; k < r->nranks; k++) {
            const double *v = all + (size_t)k * DT_RUN_RANK_FIELDS, M = 1048576.0;
            printf("  rank %d: %.1f, %.1f, %.1f, %.1f, %.1f; peak %.1f\n", k, v[6] / M, v[7] / M, v[8] / M, v[9] / M, v[10] / M, v[11] / M);
        }
        printf("activations kept from forward for backward (rank 0): %.1f MiB; the rest of them is one block's working set, "
               "the gradients in flight and scratch\n", dt_gpt2_activation_kept(r->m) / 1048576.0);
        for (int k = 0; k < r->nranks; k++) {
            const double *v = all + (size_t)k * DT_RUN_RANK_FIELDS;
            printf("I/O rank %d: read %.2f MiB of tokens in %.1f ms, wrote %.2f MiB of checkpoints in %.1f ms\n", k, v[0] / 1048576.0,
                   v[1] * 1e3, v[2] / 1048576.0, v[3] * 1e3);
        }
    }
    if (r->rank == 0 && c->report) write_report(r, steps_done, all);
    free(all);
}
