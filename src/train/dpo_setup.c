/* Preference tuning in a training run: --data FILE.jsonl of {"prompt", "chosen", "rejected"} pairs trains by DPO
 * (train/dpo.c). Before the first step, the reference's log-probabilities of every row this rank will read are
 * recorded by forward passes of the starting model (LoRA's base: the adapters off, as PEFT's disable_adapter; so a
 * resumed LoRA run has its reference still); each batch a loader gives is queued for the loss; an evaluation says the
 * pairs' reward accuracy and margin. */
#include "run.h"

#include <math.h>
#include <stdio.h>

static dt_status check(const run *r) {
    const dt_train_config *c = &r->c;
    bool pairs = r->sft && dt_sft_pairs(r->sft), val_pairs = r->sft_val && dt_sft_pairs(r->sft_val);
    const dt_dpo_config *o = &c->dpo;
    const char *flag = o->beta > 0 ? "--dpo-beta" : o->nloss ? "--dpo-loss" : o->nweights ? "--dpo-loss-weights"
                     : o->label_smoothing > 0 ? "--dpo-label-smoothing" : o->discopop_tau > 0 ? "--dpo-discopop-tau"
                     : o->divergence != DT_DPO_REVERSE_KL ? "--dpo-f-divergence" : o->f_alpha > 0 ? "--dpo-f-alpha" : o->ld ? "--dpo-ld-alpha"
                     : o->wpo ? "--dpo-wpo" : NULL;
    if (!pairs && flag) return dt_error(DT_ERR_ARG, "%s: --data %s holds no preference pairs ({\"prompt\", \"chosen\", \"rejected\"})", flag, c->data);
    if (r->sft_val && pairs != val_pairs)
        return dt_error(DT_ERR_ARG, "--val-data %s holds %s, --data %s %s", c->val_data, val_pairs ? "preference pairs" : "examples", c->data,
                        pairs ? "preference pairs" : "examples");
    if (pairs && c->cuda) /* (the GPU's head computes the mean cross-entropy alone, never a token loss) */
        return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: DPO's loss (over each pair's log-probabilities) runs in the CPU's head, "
                        "not yet on the GPU's");
    if (pairs && c->resume && !c->lora.rank)
        return dt_error(DT_ERR_UNSUPPORTED, "--resume %s: a DPO run's reference is the model it started from, which a checkpoint of "
                        "every weight no longer holds (with --lora-rank the base is the reference, and resuming works)", c->resume);
    return DT_OK;
}

/* Forwards over every batch of rows this rank reads, recording their log-probabilities. */
static dt_status reference_of(run *r, const dt_sft *d) {
    dt_loader *l = NULL;
    float ignored;
    dt_status st = dt_loader_create_rows(d, r->c.batch, r->dp_rank, r->dp_size, 0, &l);
    if (!st) st = dt_train_forward_batches(r, l, (int)dt_loader_batches(l), &ignored);
    if (!st) st = dt_train_moe_val_load(r); /* the reference's passes: not the first step's load */
    dt_loader_destroy(l);
    return st;
}

dt_status dt_train_setup_dpo(run *r) {
    const dt_train_config *c = &r->c;
    dt_status st = check(r);
    if (st || !r->sft || !dt_sft_pairs(r->sft)) return st;
    size_t rows = dt_sft_rows(r->sft) + (r->sft_val ? dt_sft_rows(r->sft_val) : 0);
    dt_program *p = dt_gpt2_program(r->m);
    if ((st = dt_dpo_create(&c->dpo, rows, &r->dpo))) return st;
    if ((st = dt_program_set_token_loss(p, dt_dpo_token_loss, r->dpo, c->dpo.wpo))) return dt_error(st, "--data %s: %s", c->data, dt_last_error());
    double t0 = dt_time_now();
    dt_dpo_set_reference(r->dpo, true);
    dt_program_set_lora_enabled(p, false);
    st = reference_of(r, r->sft);
    if (!st && r->sft_val) st = reference_of(r, r->sft_val);
    dt_program_set_lora_enabled(p, true);
    dt_dpo_set_reference(r->dpo, false);
    if (st) return dt_error(st, "DPO's reference log-probabilities: %s", dt_last_error());
    if (r->rank == 0 && !c->quiet) {
        char loss[256];
        dt_dpo_config_describe(dt_dpo_config_of(r->dpo), loss, sizeof loss);
        printf("preference pairs: %zu from %s, DPO with beta %g (%s); the reference (%s) scored %zu rows in %.1f s\n", dt_sft_rows(r->sft) / 2,
               c->data, dt_dpo_beta(r->dpo), loss, c->lora.rank || c->lora_from ? "the base, adapters off" : "the starting model", rows,
               dt_time_now() - t0);
    }
    return DT_OK;
}

dt_status dt_train_dpo_queue(run *r, dt_loader *l) {
    size_t offset = dt_loader_rows(l) == r->sft_val && r->sft_val ? dt_sft_rows(r->sft) : 0; /* --val-data's rows follow */
    return dt_dpo_queue(r->dpo, dt_loader_last_row(l) + offset);
}

dt_status dt_train_dpo_stats(run *r, bool say, float out[DT_TRAIN_DPO_NFIGS]) {
    double s[DT_DPO_NSTATS];
    dt_dpo_stats(r->dpo, s, true);
    /* every tensor-parallel rank computes each pair: the first of them counts it */
    bool counts = !r->mesh || dt_mesh_coord(r->mesh, DT_MESH_TP) == 0;
    float v[DT_DPO_NSTATS];
    for (int i = 0; i < DT_DPO_NSTATS; i++) v[i] = counts ? (float)s[i] : 0;
    dt_status st = r->nranks > 1 ? dt_comm_allreduce(r->w, v, v, DT_DPO_NSTATS, DT_F32, DT_SUM) : DT_OK;
    double n = v[DT_DPO_PAIRS];
    double fig[DT_TRAIN_DPO_NFIGS] = { v[DT_DPO_ACCURATE], v[DT_DPO_CHOSEN] - v[DT_DPO_REJECTED], v[DT_DPO_CHOSEN], v[DT_DPO_REJECTED],
                                       v[DT_DPO_LOGPS_CHOSEN], v[DT_DPO_LOGPS_REJECTED] };
    for (int i = 0; i < DT_TRAIN_DPO_NFIGS; i++) out[i] = n > 0 ? (float)(fig[i] / n) : NAN;
    if (!st && say && r->rank == 0 && !r->c.quiet && n > 0)
        printf("  preference pairs evaluated: %.0f, reward accuracy %.1f%%, margin %+.4f (chosen %+.4f, rejected %+.4f)\n", n,
               100.0 * v[DT_DPO_ACCURATE] / n, (v[DT_DPO_CHOSEN] - v[DT_DPO_REJECTED]) / n, v[DT_DPO_CHOSEN] / n, v[DT_DPO_REJECTED] / n);
    return st;
}
