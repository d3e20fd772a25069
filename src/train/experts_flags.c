/* A mixture of experts from the command line: --experts, --experts-top-k, --moe-aux-loss, the router's flags and the
 * capacity's, over a preset's or a file's config; train and plan read a model's shape through it alike. */
#include "dtrain/train.h"

/* --router sigmoid-bias (DeepSeek-V3's, its groups, scale and bias update rate: 0.001 unless given); a file's router is
 * its own (its biases would be new). */
static dt_status take_router(const dt_train_config *c, bool from_file, dt_gpt2_config *cfg) {
    const dt_gpt2_config *o = &c->shape;
    /* (a resumed run's shape holds the checkpoint's values, given or not) */
    bool given = !o->family && (o->expert_groups || o->group_top_k || o->routed_scale > 0 || o->bias_rate >= 0);
    if (o->router && !cfg->experts) return dt_error(DT_ERR_ARG, "--router sets a mixture of experts' router: %s has no experts (--experts E)", c->model);
    if (o->router && from_file && o->router != cfg->router)
        return dt_error(DT_ERR_ARG, "--router: %s routes as it was trained (its router is its own)", c->model);
    if (o->router) cfg->router = o->router;
    if (given && cfg->router != DT_ROUTER_SIGMOID_BIAS)
        return dt_error(DT_ERR_ARG, "--expert-groups, --group-top-k, --routed-scale and --bias-update set the sigmoid router's: give "
                        "--router sigmoid-bias");
    if (cfg->router != DT_ROUTER_SIGMOID_BIAS) return DT_OK;
    if (o->expert_groups) cfg->expert_groups = o->expert_groups;
    if (o->group_top_k) cfg->group_top_k = o->group_top_k;
    if (o->routed_scale > 0) cfg->routed_scale = o->routed_scale;
    if (o->bias_rate >= 0) cfg->bias_rate = o->bias_rate;
    else if (!from_file && !o->family) cfg->bias_rate = 0.001f; /* DeepSeek-V3's gamma */
    return DT_OK;
}

/* --experts, --experts-top-k, --moe-aux-loss: a GPT-2's MLP made a mixture of GELU experts, a Llama's Mixtral's mixture,
 * a Qwen 3's Qwen 3 MoE's; a file's experts stay its own. */
dt_status dt_train_take_experts(const dt_train_config *c, bool from_file, dt_gpt2_config *cfg) {
    const dt_gpt2_config *o = &c->shape;
    if (o->experts && from_file && o->experts != cfg->experts)
        return dt_error(DT_ERR_ARG, "%s: the file has %d experts but --experts says %d", c->model, cfg->experts, o->experts);
    /* (a resumed run's shape names its family: its mixture is its own, taken whole by model_config) */
    if (o->experts && !from_file && !cfg->experts && !o->family) {
        bool gpt2 = !cfg->family || cfg->family == dt_family_find("gpt2");
        bool qwen3 = cfg->family == dt_family_find("qwen3");
        if (!gpt2 && !qwen3 && cfg->family != dt_family_find("llama"))
            return dt_error(DT_ERR_ARG, "--experts %d: a mixture of experts replaces a GPT-2's MLP (GELU experts), a Llama's (Mixtral's "
                            "SwiGLU experts) or a Qwen 3's (Qwen 3 MoE's), not %s's (%s)", o->experts, c->model, dt_family_name(cfg->family));
        cfg->family = dt_family_find(gpt2 ? "gpt2_moe" : qwen3 ? "qwen3_moe" : "mixtral"), cfg->norm_topk = 1;
    }
    if (o->experts) cfg->experts = o->experts;
    if (c->shared_experts && (from_file || !cfg->experts || cfg->family != dt_family_find("mixtral")))
        return dt_error(DT_ERR_ARG, "--shared-experts %d: DeepSeek's ungated shared experts beside a new mixture's routed ones (--model "
                        "llama-tiny --experts E); %s", c->shared_experts, from_file ? "a file's mixture is its own" : "this model's is not one");
    if (c->shared_experts) cfg->family = dt_family_find("deepseek_moe"), cfg->shared_ffn = c->shared_experts * cfg->ffn;
    if ((o->experts_top_k || o->aux_coef > 0) && !cfg->experts)
        return dt_error(DT_ERR_ARG, "--experts-top-k and --moe-aux-loss set a mixture of experts: %s has none (--experts E)", c->model);
    if (o->experts_top_k) cfg->experts_top_k = o->experts_top_k;
    if (o->aux_coef >= 0 && cfg->experts) cfg->aux_coef = o->aux_coef; /* 0: off */
    if ((o->capacity_factor > 0 || o->drop_policy) && !cfg->experts)
        return dt_error(DT_ERR_ARG, "--capacity-factor and --drop-policy set a mixture of experts' capacity: %s has none", c->model);
    if (o->capacity_factor > 0) cfg->capacity_factor = o->capacity_factor, cfg->drop_policy = o->drop_policy;
    /* which layers are mixtures: a new model's choice (a file's and a resumed run's are their own) */
    bool placed = !o->family && (o->moe_every || o->first_dense || o->dense_ffn);
    if (placed && (!cfg->experts || from_file))
        return dt_error(DT_ERR_ARG, "--moe-every, --first-dense and --dense-ffn place a new mixture's layers among dense ones: %s",
                        from_file ? "a file's layers are its own" : "this model has no experts (--experts E)");
    if (placed) cfg->moe_every = o->moe_every, cfg->first_dense = o->first_dense, cfg->dense_ffn = o->dense_ffn;
    return take_router(c, from_file, cfg);
}
