/* The engine's preconditioner for --optimizer kfac, shampoo or soap (precond_setup.h). */
#include "precond_setup.h"

#include <stdio.h>

/* K-FAC over the model's Linears (and convolutions), its base optimizer (c->opt) under it. */
static dt_status make_kfac(const dt_train_config *c, dt_engine_config *ec, const dt_model *m, dt_comm *stages, int rank, const char *others,
                           dt_train_precond *out) {
    if (c->lora.rank > 0 || c->lora_from) return dt_error(DT_ERR_ARG, "--optimizer kfac with LoRA: K-FAC preconditions the base Linears, which LoRA freezes");
    dt_status st = dt_kfac_create(&c->kfac, m, ec->comm, &out->kfac);
    if (st) return st;
    /* a pipeline's stage may hold no block (the embeddings alone); a whole model without a Linear has nothing for it */
    if (!stages && dt_kfac_layers(out->kfac) == 0)
        return dt_error(DT_ERR_ARG, "--optimizer kfac: the %s model has no Linear or convolution to precondition", m->kind);
    dt_kfac_preconditioner(out->kfac, &out->inner);
    if (stages) dt_kfac_set_stages(out->kfac, stages);
    if (rank == 0 && !c->quiet)
        dt_log(DT_LOG_INFO, "K-FAC (%s) preconditions %d layers (%zu parameters) before %s, its factors and decompositions %.3f MiB "
               "on the rank holding most; the other %zu parameters (%s) take %s's step as they are", dt_kfac_layout(out->kfac),
               dt_kfac_layers(out->kfac), dt_kfac_params(out->kfac), dt_optim_kind_name(c->opt.kind),
               dt_kfac_state_bytes_most(out->kfac) / 1048576.0, m->nparams - dt_kfac_params(out->kfac), others,
               dt_optim_kind_name(c->opt.kind));
    return DT_OK;
}

/* Shampoo over the whole store, SGD under it; its blocks shared by the replicas. */
static dt_status make_shampoo(const dt_train_config *c, dt_engine_config *ec, const dt_model *m, int rank, dt_train_precond *out) {
    if (c->lora.rank > 0 || c->lora_from) return dt_error(DT_ERR_ARG, "--optimizer shampoo with LoRA: not yet (Shampoo would precondition every tensor, the frozen ones too)");
    dt_status st = dt_shampoo_create(&c->shampoo, m->tensors, m->ntensors, ec->comm, &out->shampoo);
    if (st) return st;
    dt_shampoo_preconditioner(out->shampoo, &out->inner);
    if (rank == 0 && !c->quiet)
        dt_log(DT_LOG_INFO, "Shampoo: %d blocks of at most %d, roots every %d steps from step %d, grafted onto Adam, SGD under it; "
               "its state %.3f MiB on the rank holding most, the directions allgathered in %s", dt_shampoo_blocks(out->shampoo),
               c->shampoo.block, c->shampoo.every, c->shampoo.start ? c->shampoo.start : c->shampoo.every,
               dt_shampoo_state_bytes_most(out->shampoo) / 1048576.0, c->shampoo.wire == DT_BF16 ? "bf16" : "fp32");
    return DT_OK;
}

/* SOAP over the whole store, SGD under it (its weight decay SOAP's decoupled one, soap.h); its matrices shared by the
 * replicas. */
static dt_status make_soap(const dt_train_config *c, dt_engine_config *ec, const dt_model *m, int rank, dt_train_precond *out) {
    if (c->lora.rank > 0 || c->lora_from) return dt_error(DT_ERR_ARG, "--optimizer soap with LoRA: not yet (SOAP would step every tensor, the frozen ones too)");
    dt_status st = dt_soap_create(&c->opt, m->tensors, m->ntensors, ec->comm, &out->soap);
    if (st) return st;
    dt_soap_preconditioner(out->soap, &out->inner);
    ec->opt.kind = DT_OPT_SGD, ec->opt.momentum = 0, ec->opt.nesterov = 0;
    if (rank == 0 && !c->quiet) {
        char line[256];
        dt_soap_describe(out->soap, line, sizeof line);
        dt_log(DT_LOG_INFO, "%s", line);
    }
    return DT_OK;
}

dt_status dt_train_precond_create(const dt_train_config *c, dt_engine_config *ec, dt_comm *stages, dt_comm *tp, int rank,
                                  const char *others, dt_train_precond *out) {
    *out = (dt_train_precond){ 0 };
    if (!c->kfac_on && !c->shampoo_on && c->opt.kind != DT_OPT_SOAP) return DT_OK;
    /* under tensor parallelism they see the whole tensors, made whole on every rank of the group */
    dt_model m = ec->model;
    dt_status st = tp ? dt_tp_whole_create(&ec->model, tp, &out->whole) : DT_OK;
    if (st) return st;
    if (out->whole) dt_tp_whole_model(out->whole, &m);
    st = c->kfac_on ? make_kfac(c, ec, &m, stages, rank, others, out)
         : c->shampoo_on ? make_shampoo(c, ec, &m, rank, out) : make_soap(c, ec, &m, rank, out);
    if (st) return st;
    if (out->whole) dt_tp_whole_preconditioner(out->whole, &out->inner, &out->pc);
    else out->pc = out->inner;
    ec->precond = &out->pc;
    return DT_OK;
}

void dt_train_precond_destroy(dt_train_precond *p) {
    dt_kfac_destroy(p->kfac);
    dt_shampoo_destroy(p->shampoo);
    dt_soap_destroy(p->soap);
    dt_tp_whole_destroy(p->whole); /* after K-FAC, which leaves the model's observer through it */
    *p = (dt_train_precond){ 0 };
}

size_t dt_train_precond_bytes(const dt_train_precond *p) {
    return (p->kfac ? dt_kfac_state_bytes(p->kfac) : 0) + (p->shampoo ? dt_shampoo_state_bytes(p->shampoo) : 0) +
           dt_soap_state_bytes(p->soap);
}
