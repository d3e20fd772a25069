/* A token's log-probability and the most likely alternatives, as a server's
 * logprobs answer them: log softmax over the whole vocabulary, its sum in
 * double so that a vocabulary of 150k adds no rounding of its own. */
#include "dtrain/infer.h"

#include <math.h>

float dt_logprob_top(const float *l, int V, int32_t token, int k, int32_t *top, float *top_lp) {
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) if (l[v] > mx) mx = l[v];
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)l[v] - mx);
    double lse = mx + log(sum);
    if (k > V) k = V;
    int n = 0; /* top[0..n) kept in descending order; a later id enters only above an equal */
    for (int v = 0; v < V && k > 0; v++) {
        if (n == k && !(l[v] > l[top[k - 1]])) continue;
        int i = n < k ? n++ : k - 1;
        while (i > 0 && l[v] > l[top[i - 1]]) top[i] = top[i - 1], i--;
        top[i] = v;
    }
    for (int i = 0; i < n; i++) top_lp[i] = (float)(l[top[i]] - lse);
    return token >= 0 && token < V ? (float)(l[token] - lse) : NAN;
}
