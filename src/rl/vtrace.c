/* V-trace's targets and advantages by the paper's recursion (see rl.h):
 * v_s - V(x_s) = delta_s + discount_s c_s (v_{s+1} - V(x_{s+1})), with
 * delta_s = rho_s (r_s + discount_s V(x_{s+1}) - V(x_s)), from the last
 * step back, in double. */
#include "dtrain/rl.h"

#include <math.h>

void dt_vtrace(int T, int B, float rho_bar, float c_bar, const float *log_rho, const float *values, const float *rewards,
               const float *discount, const uint8_t *valid, float *vs, float *pg_adv) {
    for (int b = 0; b < B; b++) {
        double acc = 0; /* v_{s+1} - V(x_{s+1}): 0 at the bootstrap row */
        for (int s = T - 1; s >= 0; s--) {
            size_t k = (size_t)s * B + b;
            double V = values[k], Vn = values[k + B];
            if (!valid[k]) {
                vs[k] = (float)V;
                pg_adv[k] = 0;
                acc = 0;
                continue;
            }
            double w = exp((double)log_rho[k]), rho = w < rho_bar ? w : rho_bar, c = w < c_bar ? w : c_bar, g = discount[k];
            double delta = rho * (rewards[k] + g * Vn - V);
            pg_adv[k] = (float)(rho * (rewards[k] + g * (Vn + acc) - V));
            acc = delta + g * c * acc;
            vs[k] = (float)(V + acc);
        }
    }
}
