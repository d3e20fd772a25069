/* A model's hook subscribers: a data-parallel strategy (its gradient hook),
 * ZeRO-3 (its gather before each unit) and a model-parallel strategy can
 * each subscribe without replacing another. */
#include "dtrain/model.h"

dt_status dt_hook_list_set(dt_hook_list *l, dt_unit_hook event0, dt_unit_hook event1, void *ctx) {
    int k = 0;
    while (k < l->n && l->ctx[k] != ctx) k++;
    if (!event0 && !event1) { /* unsubscribe: the later ones move up, keeping their order */
        for (; k + 1 < l->n; k++) l->fn[k][0] = l->fn[k + 1][0], l->fn[k][1] = l->fn[k + 1][1], l->ctx[k] = l->ctx[k + 1];
        if (k < l->n) l->n--;
        return DT_OK;
    }
    if (k == l->n && l->n == DT_HOOKS_MAX) return dt_error(DT_ERR_ARG, "model: more than %d hook subscribers", DT_HOOKS_MAX);
    if (k == l->n) l->n++;
    l->fn[k][0] = event0;
    l->fn[k][1] = event1;
    l->ctx[k] = ctx;
    return DT_OK;
}

void dt_hook_list_call(const dt_hook_list *l, int event, int unit) {
    for (int k = 0; k < l->n; k++) {
        dt_unit_hook f = l->fn[k][event != 0];
        if (f) f(unit, l->ctx[k]);
    }
}
