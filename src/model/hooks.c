/* A model's hook subscribers: a data-parallel strategy (its gradient hook),
 * ZeRO-3 (its gather before each unit) and a model-parallel strategy can
 * each subscribe without replacing another. */
#include "dtrain/model.h"

dt_status dt_hook_list_set(dt_hook_list *l, dt_grad_hook first, dt_grad_hook second, void *ctx) {
    int k = 0;
    while (k < l->n && l->ctx[k] != ctx) k++;
    if (!first && !second) { /* unsubscribe: the later ones move up, keeping their order */
        for (; k + 1 < l->n; k++) l->first[k] = l->first[k + 1], l->second[k] = l->second[k + 1], l->ctx[k] = l->ctx[k + 1];
        if (k < l->n) l->n--;
        return DT_OK;
    }
    if (k == l->n && l->n == DT_HOOKS_MAX) return dt_error(DT_ERR_ARG, "model: more than %d hook subscribers", DT_HOOKS_MAX);
    if (k == l->n) l->n++;
    l->first[k] = first;
    l->second[k] = second;
    l->ctx[k] = ctx;
    return DT_OK;
}

void dt_hook_list_call(const dt_hook_list *l, int which, int unit) {
    for (int k = 0; k < l->n; k++) {
        dt_grad_hook f = which ? l->second[k] : l->first[k];
        if (f) f(unit, l->ctx[k]);
    }
}
