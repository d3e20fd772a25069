/* The algorithm a run names (dtrain rl --algo). */
#include "dtrain/rl.h"

dt_status dt_rl_run(const dt_rl_config *c, dt_comm *comm, dt_rl_observer after_update, void *ctx, dt_rl_result *r) {
    switch (c->algo) {
    case DT_RL_IMPALA: return dt_impala_run(c, comm, after_update, ctx, r);
    case DT_RL_REINFORCE: return dt_reinforce_run(c, comm, after_update, ctx, r);
    default: return dt_ppo_run(c, comm, after_update, ctx, r);
    }
}
