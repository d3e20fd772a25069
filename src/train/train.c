/* The training loop: for each step, grad_accum micro-batches of forward and
 * backward, global gradient norm and clipping, the learning-rate schedule,
 * one optimizer update; progress on the terminal, one JSON line per step in
 * the metrics file, validation every eval_every steps, an atomic save at
 * the end. */
#include "dtrain/train.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void dt_train_defaults(dt_train_config *c) {
    memset(c, 0, sizeof *c);
    c->model = "d6";
    c->batch = 4;
    c->seq = 64;
    c->steps = 10;
    c->grad_accum = 1;
    c->eval_batches = 8;
    c->seed = 1337;
    dt_optim_defaults(DT_OPT_ADAMW, &c->opt);
    c->lr = 3e-4f;
}

size_t dt_peak_memory(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static dt_status build_model(const dt_train_config *c, dt_gpt2 **out) {
    dt_gpt2_config cfg;
    dt_status st;
    bool from_file = access(c->model, R_OK) == 0;
    /* shape flags override a preset; for a file they must agree with it */
    const dt_gpt2_config *o = &c->shape;
    const int v[6] = { o->max_seq_len, o->vocab_size, o->padded_vocab_size, o->num_layers, o->num_heads, o->channels };
    static const char *names[6] = { "--max-seq", "--vocab", "--padded-vocab", "--layers", "--heads", "--channels" };
    if (from_file) {
        if ((st = dt_model_load(c->model, o->num_heads, out))) return st;
        cfg = *dt_gpt2_get_config(*out);
    } else if ((st = dt_gpt2_preset(c->model, &cfg))) {
        return st;
    }
    int *f[6] = { &cfg.max_seq_len, &cfg.vocab_size, &cfg.padded_vocab_size, &cfg.num_layers, &cfg.num_heads, &cfg.channels };
    for (int i = 0; i < 6; i++) {
        if (!v[i]) continue;
        if (from_file && *f[i] != v[i]) {
            dt_gpt2_destroy(*out);
            *out = NULL;
            return dt_error(DT_ERR_ARG, "%s: the file says %d but %s says %d", c->model, *f[i], names[i], v[i]);
        }
        *f[i] = v[i];
    }
    if (!from_file && o->vocab_size && !o->padded_vocab_size) cfg.padded_vocab_size = (cfg.vocab_size + 63) / 64 * 64;
    if (c->seq > cfg.max_seq_len) {
        dt_gpt2_destroy(*out);
        *out = NULL;
        return dt_error(DT_ERR_ARG, "--seq %d is longer than the model's %d positions", c->seq, cfg.max_seq_len);
    }
    if (!from_file) {
        if ((st = dt_gpt2_create(&cfg, out))) return st;
        dt_gpt2_init_random(*out, c->seed);
    }
    dt_gpt2_set_recompute(*out, c->recompute);
    dt_gpt2_set_attention(*out, (dt_attn_mode)c->attention);
    return DT_OK;
}

/* .safetensors (HF layout, f32) or llm.c by the file name. */
static dt_status save_model(const char *path, dt_gpt2 *m) {
    size_t n = strlen(path);
    if (n > 12 && !strcmp(path + n - 12, ".safetensors")) return dt_safetensors_save(path, m, DT_F32);
    return dt_llmc_save(path, m);
}

static float evaluate(dt_gpt2 *m, dt_loader *l, int batches, int B, int T, int32_t *in, int32_t *tg) {
    double sum = 0;
    dt_loader_reset(l);
    for (int i = 0; i < batches; i++) {
        float loss = 0;
        dt_loader_next(l, in, tg);
        dt_gpt2_forward(m, in, tg, B, T, &loss);
        sum += loss;
    }
    return (float)(sum / batches);
}

int dt_train_run(const dt_train_config *c) {
    dt_kernels_set_threads(c->threads);
    dt_gpt2 *m = NULL;
    dt_tokens *train = NULL, *val = NULL;
    dt_loader *tl = NULL, *vl = NULL;
    dt_optim *opt = NULL;
    FILE *metrics = NULL;
    int rc = 1;
    dt_status st = build_model(c, &m);
    if (!st && !c->data) st = dt_error(DT_ERR_ARG, "--data FILE is required (a token file: see dtrain tokenize)");
    if (!st) st = dt_tokens_open(c->data, &train);
    const dt_gpt2_config *mc = m ? dt_gpt2_get_config(m) : NULL;
    if (!st) st = dt_tokens_check_vocab(train, mc->vocab_size);
    if (!st) st = dt_loader_create(train, c->batch, c->seq, 0, 1, c->shuffle_seed, &tl);
    if (!st && c->val_data) {
        st = dt_tokens_open(c->val_data, &val);
        if (!st) st = dt_tokens_check_vocab(val, mc->vocab_size);
        if (!st) st = dt_loader_create(val, c->batch, c->seq, 0, 1, 0, &vl);
    }
    size_t np = m ? dt_gpt2_num_params(m) : 0;
    dt_tensor_span spans[DT_GPT2_NTENSORS];
    for (int i = 0; m && i < DT_GPT2_NTENSORS; i++) dt_gpt2_tensor(m, i, NULL, &spans[i].offset, &spans[i].count);
    if (!st) st = dt_optim_create(&c->opt, np, spans, DT_GPT2_NTENSORS, &opt);
    if (!st && c->metrics && !(metrics = fopen(c->metrics, "w")))
        st = dt_error(DT_ERR_IO, "%s: cannot write the metrics file", c->metrics);
    if (st) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }

    size_t BT = (size_t)c->batch * c->seq;
    int32_t *in = malloc(BT * 4), *tg = malloc(BT * 4);
    bool tty = isatty(STDOUT_FILENO) && !c->quiet;
    if (!c->quiet)
        printf("model %s: %d layers, %d heads, %d channels, vocab %d (padded %d), %.2fM parameters; "
               "batch %d x %d x %d accumulation, %s, %d threads\n",
               c->shape.num_layers || c->shape.channels || c->shape.vocab_size || c->shape.num_heads ? "custom" : c->model,
               mc->num_layers, mc->num_heads, mc->channels, mc->vocab_size, mc->padded_vocab_size, np / 1e6,
               c->batch, c->seq, c->grad_accum, dt_optim_kind_name(c->opt.kind), dt_kernels_threads());
    double t_start = dt_time_now();
    float val_loss = -1;
    for (int step = 0; step < c->steps; step++) {
        double t0 = dt_time_now(); /* gradients start at zero: the optimizer zeroes them as it goes */
        double loss_sum = 0, fwd = 0, bwd = 0;
        for (int k = 0; k < c->grad_accum; k++) {
            float loss = 0;
            dt_loader_next(tl, in, tg);
            double ta = dt_time_now();
            dt_gpt2_forward(m, in, tg, c->batch, c->seq, &loss);
            double tb = dt_time_now();
            dt_gpt2_backward(m, 1.0f / c->grad_accum);
            fwd += tb - ta;
            bwd += dt_time_now() - tb;
            loss_sum += loss;
        }
        double to = dt_time_now();
        float loss = (float)(loss_sum / c->grad_accum);
        double norm = dt_grad_norm(dt_gpt2_grads(m), np);
        dt_grad_clip(dt_gpt2_grads(m), np, norm, c->grad_clip);
        float lr = dt_lr_at(c->schedule, c->lr, c->lr_min, c->warmup, c->steps, step);
        dt_optim_step(opt, dt_gpt2_params(m), dt_gpt2_grads(m), lr, 1);
        double opt_ms = (dt_time_now() - to) * 1e3;
        double ms = (dt_time_now() - t0) * 1e3, tps = BT * c->grad_accum / (ms / 1e3);
        bool eval = vl && c->eval_every > 0 && ((step + 1) % c->eval_every == 0 || step + 1 == c->steps);
        if (eval) val_loss = evaluate(m, vl, c->eval_batches, c->batch, c->seq, in, tg);
        if (metrics) {
            fprintf(metrics, "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6f,\"ms\":%.3f,\"tok_per_s\":%.1f,"
                    "\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"optimizer_ms\":%.3f", step + 1, loss, lr, norm, ms, tps,
                    fwd * 1e3, bwd * 1e3, opt_ms);
            if (eval) fprintf(metrics, ",\"val_loss\":%.6f", val_loss);
            fprintf(metrics, "}\n");
            fflush(metrics);
        }
        if (!c->quiet) {
            double eta = (dt_time_now() - t_start) / (step + 1) * (c->steps - step - 1);
            int width = 24, done = (int)((double)(step + 1) / c->steps * width);
            char bar[32];
            for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
            bar[width] = 0;
            printf("%sstep %d/%d [%s] loss %.4f%s lr %.2e norm %.3f %.0f ms %.0f tok/s ETA %dm%02ds%s", tty ? "\r" : "",
                   step + 1, c->steps, bar, loss, "", lr, norm, ms, tps, (int)eta / 60, (int)eta % 60, tty ? "  " : "\n");
            if (eval) printf("%sval loss %.4f\n", tty ? "\n" : "", val_loss);
            fflush(stdout);
        }
    }
    if (tty) printf("\n");
    free(in);
    free(tg);
    if (c->save) {
        if (save_model(c->save, m)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); goto out; }
        if (!c->quiet) printf("saved %s\n", c->save);
    }
    if (!c->quiet) {
        printf("peak memory %.1f MiB (model %.1f MiB: parameters, gradients, activations%s; optimizer state %.1f MiB)\n",
               dt_peak_memory() / 1048576.0, dt_gpt2_memory(m) / 1048576.0, c->recompute ? " with --recompute" : "",
               dt_optim_state_bytes(opt) / 1048576.0);
    }
    rc = 0;
out:
    if (metrics) fclose(metrics);
    dt_optim_destroy(opt);
    dt_loader_destroy(tl);
    dt_loader_destroy(vl);
    dt_tokens_close(train);
    dt_tokens_close(val);
    dt_gpt2_destroy(m);
    return rc;
}
