/* Supervised fine-tuning's data and loss against TRL's SFTTrainer (scripts/make_sft_fixtures.py): for chats (ChatML,
 * the loss on the assistant's turns; Qwen 3's template, its tokens and scored targets, and the server's prompts) and for prompts and completions (the loss on the completion and its end-of-text),
 * each example's tokens and scored targets are TRL's, one batch's loss and every gradient are TRL's; the same batch in
 * two micro-batches, each dividing by the batch's count (dt_program_set_loss_tokens), gives the same gradients; bad
 * lines are refused naming the file and line. */
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/program.h"
#include "fixture_checks.h"
#include "io/json_text.h"           /* (the fixtures' floats kept: 1.0 stays a float, as Python wrote it) */
#include "serve/serve_internal.h" /* (the server's chat prompt, against Qwen 3's template) */
#include "train/grpo_prompts.h"       /* (GRPO's conversational prompts, against apply_chat_template) */

#include <cjson/cJSON.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { T = 64, MAXB = 8, TMAX = 1024 }; /* (TMAX: the fixtures' longest rows, the chats with tools) */

/* Row k (of seq positions, at most TMAX) against TRL's ids.k and labels.k (labels unshifted: the target of input t is
 * label t + 1). */
static bool rows_match(const dt_sft *d, dt_safetensors *f, size_t rows, int seq) {
    bool ok = dt_sft_rows(d) == rows && seq <= TMAX && dt_sft_seq(d) == seq;
    for (size_t k = 0; ok && k < rows; k++) {
        char name[32];
        int32_t ids[TMAX + 1], labels[TMAX + 1], in[TMAX], tg[TMAX];
        snprintf(name, sizeof name, "ids.%zu", k);
        size_t n = 0;
        for (n = (size_t)seq + 1; n > 0 && dt_safetensors_read_i32(f, name, n, ids); n--) {} /* the example's length: the size that reads */
        snprintf(name, sizeof name, "labels.%zu", k);
        ok = n > 0 && !dt_safetensors_read_i32(f, name, n, labels);
        dt_sft_row(d, k, in, tg);
        for (int t = 0; ok && t < seq; t++) {
            int32_t want_in = (size_t)t < n ? ids[t] : 0, want_tg = (size_t)t + 1 < n ? labels[t + 1] : DT_IGNORE_INDEX;
            if ((size_t)t < n && in[t] != want_in) ok = false;
            if (tg[t] != (want_tg < 0 ? DT_IGNORE_INDEX : want_tg)) ok = false;
            if (!ok) printf("   row %zu position %d: input %d target %d, TRL's %d %d\n", k, t, in[t], tg[t], want_in, want_tg);
        }
    }
    return ok;
}

static dt_status load_tokenizer(const char *dir, dt_bpe **tok, dt_chat_kind *chat, int *eos) {
    char path[600], *text = NULL;
    snprintf(path, sizeof path, "%s/sft/tokenizer.json", dir);
    dt_status st = dt_bpe_load_json(path, tok);
    snprintf(path, sizeof path, "%s/sft/tokenizer_config.json", dir);
    if (!st) st = dt_file_read_text(path, 1 << 20, &text, NULL);
    if (!st) st = dt_chat_kind_of_template(text, path, chat); /* the file holds its chat_template: its markers say which */
    free(text);
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (!st) st = dt_bpe_encode(*tok, "<|endoftext|>", 13, &ids, &n, &cap);
    *eos = n == 1 ? (int)ids[0] : -1;
    free(ids);
    return st;
}

/* The loader's count of the next steps' scored targets (a loss's denominator) is what those batches then hold, shuffled
 * or not, steps of two batches running across the epochs' ends (B 1: an epoch of as many batches as rows). */
static void check_counts(const char *name, const dt_sft *d) {
    bool ok = true;
    for (uint64_t seed = 0; seed < 3 && ok; seed++) {
        dt_loader *l = NULL;
        ok = !dt_loader_create_rows(d, 1, 0, 1, seed, &l);
        for (int step = 0; ok && step < 7; step++) {
            size_t want = dt_loader_scored(l, 2), got = 0;
            int32_t in[T], tg[T];
            for (int b = 0; b < 2; b++) {
                dt_loader_next(l, in, tg);
                for (int t = 0; t < T; t++) got += tg[t] >= 0;
            }
            if (got != want) printf("   seed %llu step %d: counted %zu, the batches hold %zu\n", (unsigned long long)seed, step, want, got);
            ok = got == want;
        }
        dt_loader_destroy(l);
    }
    char what[120];
    snprintf(what, sizeof what, "%s: a step's scored count is its batches', across epochs, shuffled or not", name);
    check(what, ok, NULL);
}

static void check_case(const char *dir, const char *name, size_t rows) {
    char path[600], what[160];
    dt_bpe *tok = NULL;
    dt_chat_kind chat;
    int eos;
    dt_sft *d = NULL;
    dt_safetensors *f = NULL;
    dt_program *p = NULL;
    dt_lm_config cfg;
    dt_status st = load_tokenizer(dir, &tok, &chat, &eos);
    snprintf(path, sizeof path, "%s/sft/%s.jsonl", dir, name);
    if (!st) st = dt_sft_load(path, tok, strcmp(name, "chat") ? DT_CHAT_NONE : chat, eos, T, &d);
    snprintf(path, sizeof path, "%s/sft/%s.safetensors", dir, name);
    if (!st) st = dt_safetensors_open(path, &f);
    if (!st) st = fixture_program(f, path, &cfg, &p);
    dt_model m;
    if (!st) dt_program_model(p, &m);
    if (st) {
        printf("FAIL %s: %s\n", name, dt_last_error());
        failed++;
        goto out;
    }
    snprintf(what, sizeof what, "%s: %zu examples' tokens and scored targets are TRL's", name, rows);
    check(what, rows_match(d, f, rows, T), NULL);
    int32_t in[MAXB * T], tg[MAXB * T];
    size_t scored = 0;
    for (size_t k = 0; k < rows; k++) dt_sft_row(d, k, in + k * T, tg + k * T), scored += dt_sft_scored(d, k);
    float loss = 0, ref = 0, *g = malloc(m.nparams * sizeof(float)), *g2 = malloc(m.nparams * sizeof(float));
    int one = 1;
    dt_program_zero_grad(p);
    if (!(st = dt_program_forward(p, in, tg, (int)rows, T, &loss)) && !(st = dt_program_backward(p, 1.0f)) &&
        !(st = dt_safetensors_read(f, "loss", 1, &one, 0, &ref))) {
        char detail[64];
        snprintf(detail, sizeof detail, "%.7f vs %.7f (%.1e)", loss, ref, fabs(loss - ref) / ref);
        snprintf(what, sizeof what, "%s: the batch's loss is TRL's within 1e-6 (%zu scored tokens)", name, scored);
        check(what, fabs(loss - ref) / ref <= 1e-6, detail);
        double worst = 0;
        st = grads_err(f, &m, cfg.vocab_size, &worst);
        snprintf(detail, sizeof detail, "worst %.1e", worst);
        snprintf(what, sizeof what, "%s: every gradient is TRL's within 1e-5", name);
        if (!st) check(what, worst <= 1e-5, detail);
    }
    /* two micro-batches, each dividing by the whole batch's count over its two parts */
    if (!st && rows >= 2) {
        memcpy(g, m.grads(m.self), m.nparams * sizeof(float));
        dt_program_zero_grad(p);
        dt_program_set_loss_tokens(p, (double)scored / 2);
        int b1 = (int)rows / 2, b2 = (int)rows - b1;
        float l1, l2;
        if (!(st = dt_program_forward(p, in, tg, b1, T, &l1)) && !(st = dt_program_backward(p, 0.5f)) &&
            !(st = dt_program_forward(p, in + b1 * T, tg + b1 * T, b2, T, &l2)) && !(st = dt_program_backward(p, 0.5f))) {
            memcpy(g2, m.grads(m.self), m.nparams * sizeof(float));
            char detail[64];
            snprintf(detail, sizeof detail, "loss %.1e, gradients %.1e", fabs((l1 + l2) / 2 - loss) / loss, rel_err(g2, g, m.nparams));
            snprintf(what, sizeof what, "%s: two micro-batches of %d and %d rows give the batch's loss and gradients", name, b1, b2);
            check(what, fabs((l1 + l2) / 2 - loss) / loss <= 1e-6 && rel_err(g2, g, m.nparams) <= 1e-6, detail);
        }
        dt_program_set_loss_tokens(p, 0);
    }
    if (!st) check_counts(name, d);
    if (st) {
        printf("FAIL %s: %s\n", name, dt_last_error());
        failed++;
    }
    free(g), free(g2);
out:
    dt_program_destroy(p);
    dt_safetensors_close(f);
    dt_sft_destroy(d);
    dt_bpe_destroy(tok);
}

/* Packing (packed.jsonl, TRL's packing=True): the packed rows, their scored targets and positions are TRL's; the loss
 * over every row, each example attending within itself, and every gradient are TRL's; the loss is the unpacked
 * examples' too. */
static void check_packed(const char *dir) {
    char path[600], what[160], detail[96];
    dt_bpe *tok = NULL;
    dt_chat_kind chat;
    int eos, one = 1;
    dt_sft *d = NULL;
    dt_safetensors *f = NULL;
    dt_program *p = NULL;
    dt_lm_config cfg;
    dt_status st = load_tokenizer(dir, &tok, &chat, &eos);
    snprintf(path, sizeof path, "%s/sft/packed.jsonl", dir);
    if (!st) st = dt_sft_load(path, tok, DT_CHAT_NONE, eos, T, &d);
    size_t examples = d ? dt_sft_rows(d) : 0;
    if (!st) st = dt_sft_pack(d);
    snprintf(path, sizeof path, "%s/sft/packed.safetensors", dir);
    if (!st) st = dt_safetensors_open(path, &f);
    if (!st) st = fixture_program(f, path, &cfg, &p);
    dt_model m;
    if (!st) dt_program_model(p, &m);
    size_t rows = st ? 0 : dt_sft_rows(d);
    if (!st && rows > MAXB) st = dt_error(DT_ERR_ARG, "%zu packed rows", rows);
    int32_t in[MAXB * T], tg[MAXB * T], pos[MAXB * T];
    bool pos_ok = !st;
    for (size_t k = 0; !st && k < rows; k++) {
        int32_t want[T + 1];
        char name[32];
        snprintf(name, sizeof name, "pos.%zu", k);
        size_t n = 0;
        for (n = T; n > 0 && dt_safetensors_read_i32(f, name, n, want); n--) {}
        dt_sft_row(d, k, in + k * T, tg + k * T);
        dt_sft_row_positions(d, k, pos + k * T);
        for (size_t t = 0; t < n; t++) pos_ok &= pos[k * T + t] == want[t];
        pos_ok &= n > 0;
    }
    if (st) {
        printf("FAIL packed: %s\n", dt_last_error());
        failed++;
        goto out;
    }
    snprintf(what, sizeof what, "packed: %zu examples in %zu rows, their tokens and scored targets are TRL's", examples, rows);
    check(what, rows_match(d, f, rows, T), NULL);
    check("packed: each example's positions from 0, as TRL's position_ids", pos_ok, NULL);
    float loss = 0, ref = 0, unpacked = 0;
    if (!(st = dt_program_set_positions(p, pos)) && !(st = dt_program_forward(p, in, tg, (int)rows, T, &loss)) &&
        !(st = dt_program_backward(p, 1.0f)) && !(st = dt_safetensors_read(f, "loss", 1, &one, 0, &ref)) &&
        !(st = dt_safetensors_read(f, "loss_unpacked", 1, &one, 0, &unpacked))) {
        snprintf(detail, sizeof detail, "%.7f vs %.7f (%.1e); unpacked %.7f", loss, ref, fabs(loss - ref) / ref, unpacked);
        check("packed: the loss is TRL's within 1e-6 (and the examples' unpacked)", fabs(loss - ref) <= 1e-6 * ref &&
              fabs(loss - unpacked) <= 1e-6 * unpacked, detail);
        double worst = 0;
        st = grads_err(f, &m, cfg.vocab_size, &worst);
        snprintf(detail, sizeof detail, "worst %.1e", worst);
        if (!st) check("packed: every gradient is TRL's within 1e-5", worst <= 1e-5, detail);
    }
    if (st) {
        printf("FAIL packed: %s\n", dt_last_error());
        failed++;
    }
out:
    dt_program_destroy(p);
    dt_safetensors_close(f);
    dt_sft_destroy(d);
    dt_bpe_destroy(tok);
}

/* The tokenization cache (a temporary XDG_CACHE_HOME): a first load tokenizes and keeps the rows, a second takes them
 * from the cache, the same; another T tokenizes again; a cache file cut short is ignored (tokenized again, the same). */
static void check_cache(const char *dir) {
    char tmp[] = "/tmp/dtrain_sft_cache_XXXXXX", path[600], files[700];
    if (!mkdtemp(tmp)) { check("cache: a temporary folder", false, NULL); return; }
    const char *old = getenv("XDG_CACHE_HOME");
    char *saved = old ? strdup(old) : NULL;
    setenv("XDG_CACHE_HOME", tmp, 1);
    dt_bpe *tok = NULL;
    dt_chat_kind chat;
    int eos;
    dt_sft *a = NULL, *b = NULL, *c = NULL, *e = NULL;
    snprintf(path, sizeof path, "%s/sft/chat.jsonl", dir);
    dt_status st = load_tokenizer(dir, &tok, &chat, &eos);
    if (!st) st = dt_sft_load(path, tok, chat, eos, T, &a);
    if (!st) st = dt_sft_load(path, tok, chat, eos, T, &b);
    if (!st) st = dt_sft_load(path, tok, chat, eos, T - 1, &c);
    bool same = !st && dt_sft_rows(a) == dt_sft_rows(b);
    for (size_t k = 0; same && k < dt_sft_rows(a); k++) {
        int32_t i1[T], t1[T], i2[T], t2[T];
        dt_sft_row(a, k, i1, t1), dt_sft_row(b, k, i2, t2);
        same = !memcmp(i1, i2, sizeof i1) && !memcmp(t1, t2, sizeof t1) && dt_sft_scored(a, k) == dt_sft_scored(b, k);
    }
    check("cache: a first load tokenizes, a second takes the same rows from the cache", !st && !dt_sft_cached(a) && dt_sft_cached(b) && same,
          st ? dt_last_error() : NULL);
    check("cache: another --seq tokenizes again", !st && !dt_sft_cached(c), NULL);
    /* every cache file cut to half: ignored, the rows tokenized again (and kept again) */
    snprintf(files, sizeof files, "for f in %s/dtrain/sft/*.rows; do truncate -s $(( $(stat -c %%s \"$f\") / 2 )) \"$f\"; done", tmp);
    bool cut = system(files) == 0;
    if (!st) st = dt_sft_load(path, tok, chat, eos, T, &e);
    same = !st && dt_sft_rows(e) == dt_sft_rows(a);
    for (size_t k = 0; same && k < dt_sft_rows(a); k++) same = dt_sft_scored(a, k) == dt_sft_scored(e, k);
    check("cache: a cache file cut short is ignored (tokenized again, the same rows)", cut && !st && !dt_sft_cached(e) && same,
          st ? dt_last_error() : NULL);
    dt_sft_destroy(a), dt_sft_destroy(b), dt_sft_destroy(c), dt_sft_destroy(e);
    dt_bpe_destroy(tok);
    if (saved) setenv("XDG_CACHE_HOME", saved, 1);
    else unsetenv("XDG_CACHE_HOME");
    free(saved);
    snprintf(files, sizeof files, "rm -rf %s", tmp);
    if (system(files) != 0) printf("   (could not remove %s)\n", tmp);
}

/* A file of one line that must be refused with a message holding needle (and the file:line). */
static void refused(const char *dir, const char *what, const char *line, dt_chat_kind chat, const char *needle) {
    char path[] = "/tmp/dtrain_sft_XXXXXX", tp[600];
    int fd = mkstemp(path);
    FILE *fp = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fp) fprintf(fp, "%s\n", line), fclose(fp);
    dt_bpe *tok = NULL;
    dt_sft *d = NULL;
    snprintf(tp, sizeof tp, "%s/sft/tokenizer.json", dir);
    dt_status st = dt_bpe_load_json(tp, &tok);
    if (!st) st = dt_sft_load(path, tok, chat, -1, T, &d);
    char loc[640];
    snprintf(loc, sizeof loc, "%s:1", path);
    bool ok = st && strstr(dt_last_error(), needle) && (!*line || strstr(dt_last_error(), loc));
    check(what, ok, st ? dt_last_error() : "accepted");
    dt_sft_destroy(d);
    dt_bpe_destroy(tok);
    unlink(path);
}

/* Qwen 3's and Qwen 2.5's templates (<name>_prompts.json holds TRL's copy of each): its markers name it; the chats'
 * tokens and scored targets are TRL's (SFTTrainer with its training form: Qwen 3's every answer's think block scored,
 * and the newline after <|im_end|>; Qwen 2.5's the newline after the head too, and its system turn where a chat has
 * none); each generation prompt (thinking on and off) is the template's text to the byte. */
/* v as JSON text that keeps a float a float (1.0: tojson's form; cJSON's printer writes 1), or NULL. */
static char *json_text(const cJSON *v) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (dt_chat_tojson(v, &buf, &len, &cap)) free(buf), buf = NULL;
    return buf;
}

/* A prompt case as the server takes it, a chat request (its messages and chat_template_kwargs): its prompt's tokens
 * against the case's ids, apply_chat_template's (the template's own begin-of-text, not the tokenizer's in front too). */
static bool request_ids_match(const cJSON *c, dt_bpe *tok, dt_chat_kind chat) {
    cJSON *req = cJSON_CreateObject(), *kw = cJSON_CreateObject();
    const cJSON *date = cJSON_GetObjectItemCaseSensitive(c, "date_string"), *ids = cJSON_GetObjectItemCaseSensitive(c, "ids");
    cJSON_AddItemToObject(req, "messages", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(c, "messages"), 1));
    cJSON_AddBoolToObject(kw, "enable_thinking", cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "enable_thinking")));
    if (cJSON_IsString(date)) cJSON_AddStringToObject(kw, "date_string", date->valuestring);
    const cJSON *in_user = cJSON_GetObjectItemCaseSensitive(c, "tools_in_user_message");
    if (in_user) cJSON_AddBoolToObject(kw, "tools_in_user_message", cJSON_IsTrue(in_user));
    const cJSON *builtin = cJSON_GetObjectItemCaseSensitive(c, "builtin_tools");
    if (builtin) cJSON_AddItemToObject(kw, "builtin_tools", cJSON_Duplicate(builtin, 1));
    cJSON_AddItemToObject(req, "chat_template_kwargs", kw);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(c, "tools"); /* (a request's own field, as OpenAI's API has it) */
    if (tools) cJSON_AddItemToObject(req, "tools", cJSON_Duplicate(tools, 1));
    cJSON_AddNumberToObject(req, "max_tokens", 1);
    char *body = json_text(req);
    serve_vocab v = { .bpe = tok, .vocab = dt_bpe_vocab_size(tok), .eot = -1, .chat = chat };
    serve_params p = { 0 };
    const char *param = NULL;
    bool ok = body && !serve_params_parse(body, strlen(body), &v, 4096, true, &p, &param) && p.nprompt == cJSON_GetArraySize(ids);
    for (int i = 0; ok && i < p.nprompt; i++) ok = p.prompt[i] == cJSON_GetArrayItem(ids, i)->valueint;
    if (!ok) printf("   request %s: %d tokens (the first %d), apply_chat_template's %d (the first %d)\n", body ? body : "?", p.nprompt,
                    p.nprompt ? p.prompt[0] : -1, cJSON_GetArraySize(ids), cJSON_GetArraySize(ids) ? cJSON_GetArrayItem(ids, 0)->valueint : -1);
    serve_params_free(&p);
    free(body);
    cJSON_Delete(req);
    return ok;
}

/* GRPO's conversational prompts ({"prompt": [messages]}, TRL's form) through dt_grpo_prompts_read: each case's text
 * against the template's and its tokens against its ids where it has them (apply_chat_template's), read with the
 * case's chat_template_kwargs (enable_thinking, date_string, tools_in_user_message, as --chat-template-kwargs gives
 * them) and its tools in the line; *n: how many. */
static bool grpo_prompts_match(const cJSON *cases, dt_bpe *tok, dt_chat_kind chat, int *n) {
    const cJSON *c;
    bool ok = true;
    *n = 0;
    cJSON_ArrayForEach(c, cases) {
        char path[] = "/tmp/dtrain_grpo_chat_XXXXXX.jsonl";
        int fd = mkstemps(path, 6);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        char *line = json_text(cJSON_GetObjectItemCaseSensitive(c, "messages"));
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(c, "tools");
        char *tl = tools ? json_text(tools) : NULL; /* (as a data set's line has them; TRL's GRPO takes the trainer's) */
        if (f) fprintf(f, "{\"prompt\": %s%s%s}\n", line ? line : "null", tl ? ", \"tools\": " : "", tl ? tl : ""), fclose(f);
        free(line), free(tl);
        const cJSON *date = cJSON_GetObjectItemCaseSensitive(c, "date_string"), *want = cJSON_GetObjectItemCaseSensitive(c, "ids"),
                    *text = cJSON_GetObjectItemCaseSensitive(c, "text");
        dt_chat_kwargs kw = { .thinking = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "enable_thinking")),
                              .date = cJSON_IsString(date) ? date->valuestring : NULL,
                              .tools_in_system = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c, "tools_in_user_message")),
                              .training = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "training")),
                              .builtin = cJSON_GetObjectItemCaseSensitive(c, "builtin_tools") };
        dt_grpo_prompts gp = { 0 };
        ok = f && cJSON_IsString(text) && !dt_grpo_prompts_read(&gp, path, tok, chat, &kw, 4096) && gp.n == 1 &&
             !strcmp(gp.text[0], text->valuestring) && (!want || gp.len[0] == cJSON_GetArraySize(want));
        for (int k = 0; ok && want && k < gp.len[0]; k++) ok = gp.toks[0][k] == cJSON_GetArrayItem(want, k)->valueint;
        if (!ok) printf("   GRPO prompt %d: %s, %d tokens (apply_chat_template's %d) (%s)\n", *n, gp.n ? gp.text[0] : "none",
                        gp.n ? gp.len[0] : -1, cJSON_GetArraySize(want), dt_last_error());
        dt_grpo_prompts_free(&gp);
        unlink(path);
        if (!ok) break;
        (*n)++;
    }
    return ok && *n > 0;
}

/* GRPO's conversational prompts where tools run (sft/qwen3_grpo_tools.json): by Qwen 3's training form, as TRL's
 * GRPOTrainer renders them then (every earlier answer with its think block), text and tokens. */
static void check_grpo_training_prompts(const char *dir) {
    char path[600], *text = NULL;
    dt_bpe *tok = NULL;
    snprintf(path, sizeof path, "%s/sft/qwen3_grpo_tools.json", dir);
    dt_status st = dt_file_read_text(path, 1 << 20, &text, NULL);
    cJSON *j = st ? NULL : dt_json_parse_whole(text);
    snprintf(path, sizeof path, "%s/sft/tokenizer.json", dir);
    if (!st) st = dt_bpe_load_json(path, &tok);
    int n = 0;
    bool ok = !st && grpo_prompts_match(cJSON_GetObjectItemCaseSensitive(j, "cases"), tok, DT_CHAT_QWEN3, &n);
    check("GRPO's prompts with tools by Qwen 3's training form (each earlier answer's think block) are TRL's", ok && n == 4,
          st ? dt_last_error() : NULL);
    cJSON_Delete(j);
    free(text);
    dt_bpe_destroy(tok);
}

/* A template's fixtures (<name>_*): the kind its markers name; its chats' rows (by the fixture's tokenizer and rows'
 * length) TRL's; the server's generation prompts (thinking on and off, a date given or not) the template's. */
static void check_template(const char *dir, const char *name, dt_chat_kind want, size_t nchats, int nprompts) {
    char path[600], what[200], *text = NULL;
    dt_bpe *tok = NULL;
    dt_chat_kind chat = DT_CHAT_NONE, ignored;
    int eos;
    dt_sft *d = NULL;
    dt_safetensors *f = NULL;
    snprintf(path, sizeof path, "%s/sft/%s_prompts.json", dir, name);
    dt_status st = dt_file_read_text(path, 1 << 20, &text, NULL);
    cJSON *j = st ? NULL : dt_json_parse_whole(text);
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(j, "chat_template"), *cases = cJSON_GetObjectItemCaseSensitive(j, "cases"), *c;
    const cJSON *tj = cJSON_GetObjectItemCaseSensitive(j, "tokenizer"), *sj = cJSON_GetObjectItemCaseSensitive(j, "seq");
    int seq = cJSON_IsNumber(sj) ? sj->valueint : T;
    if (!st && (!cJSON_IsString(tmpl) || !cJSON_IsArray(cases))) st = dt_error(DT_ERR_IO, "%s: no chat_template or cases", path);
    if (!st && cJSON_IsString(tj)) {
        char tpath[700];
        snprintf(tpath, sizeof tpath, "%s/%s", dir, tj->valuestring);
        if (!(st = dt_bpe_load_json(tpath, &tok))) eos = -1; /* (chats only: no completion's end-of-text) */
    } else if (!st) {
        st = load_tokenizer(dir, &tok, &ignored, &eos);
    }
    if (!st) st = dt_chat_kind_of_template(tmpl->valuestring, path, &chat);
    snprintf(what, sizeof what, "%s: the template's markers name it", name);
    if (!st) check(what, chat == want, NULL);
    snprintf(path, sizeof path, "%s/sft/%s_chat.jsonl", dir, name);
    if (!st) st = dt_sft_load(path, tok, chat, eos, seq, &d);
    snprintf(path, sizeof path, "%s/sft/%s_chat.safetensors", dir, name);
    if (!st) st = dt_safetensors_open(path, &f);
    snprintf(what, sizeof what, "%s: %zu chats' tokens and scored targets are TRL's (its training form of the template)", name, nchats);
    if (!st) check(what, rows_match(d, f, nchats, seq), NULL);
    int k = 0, good = 0, ided = 0, same_ids = 0, tooled = 0;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *want_text = cJSON_GetObjectItemCaseSensitive(c, "text"), *date = cJSON_GetObjectItemCaseSensitive(c, "date_string");
        dt_chat_kwargs kw = { .thinking = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "enable_thinking")),
                              .date = cJSON_IsString(date) ? date->valuestring : NULL, .tools = cJSON_GetObjectItemCaseSensitive(c, "tools"),
                              .tools_in_system = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c, "tools_in_user_message")),
                              .builtin = cJSON_GetObjectItemCaseSensitive(c, "builtin_tools") };
        tooled += kw.tools != NULL || kw.builtin;
        char *got = NULL;
        size_t n = 0;
        if (st || !cJSON_IsString(want_text)) break;
        st = serve_chat_prompt(cJSON_GetObjectItemCaseSensitive(c, "messages"), chat, &kw, &got, &n);
        if (!st && strcmp(got, want_text->valuestring)) printf("   case %d: %s\n   the template's: %s\n", k, got, want_text->valuestring);
        good += !st && !strcmp(got, want_text->valuestring);
        free(got);
        if (!st && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(c, "ids"))) ided++, same_ids += request_ids_match(c, tok, chat);
        k++;
    }
    snprintf(what, sizeof what, "%s: %d of %d generation prompts (thinking on and off, dates, %d with tools) are the template's", name, good, k,
             tooled);
    if (!st) check(what, k == nprompts && good == k, NULL);
    snprintf(what, sizeof what, "%s: %d of %d chat requests' prompt tokens are apply_chat_template's", name, same_ids, ided);
    if (!st && ided) check(what, same_ids == ided, NULL);
    int ngrpo = 0;
    bool grpo = !st && grpo_prompts_match(cases, tok, chat, &ngrpo);
    snprintf(what, sizeof what, "%s: %d GRPO conversational prompts are the template's (%s)", name, ngrpo,
             ided ? "text and apply_chat_template's tokens" : "text");
    if (!st) check(what, grpo && ngrpo == k, NULL);
    if (st) {
        printf("FAIL %s: %s\n", name, dt_last_error());
        failed++;
    }
    cJSON_Delete(j);
    free(text);
    dt_safetensors_close(f);
    dt_sft_destroy(d);
    dt_bpe_destroy(tok);
}

/* <name>_completion.jsonl's conversational prompts and completions (by template kind, with tokenizer; rows of seq)
 * against TRL's rows of them: the completion scored from where the prompt's generation prompt and prompt + completion
 * diverge, as SFTTrainer's completion_only_loss scores it. */
static void check_chat_completions(const char *dir, const char *name, dt_chat_kind kind, const char *tokenizer, int seq, size_t n) {
    char file[96], fixture[96], what[200];
    dt_bpe *tok = NULL;
    dt_sft *d = NULL;
    dt_safetensors *f = NULL;
    snprintf(file, sizeof file, "sft/%s_completion.jsonl", name);
    snprintf(fixture, sizeof fixture, "sft/%s_completion.safetensors", name);
    dt_status st = fixture_sft_open(dir, tokenizer, kind, seq, file, fixture, &tok, &d, &f);
    snprintf(what, sizeof what, "%s: %zu conversational prompts and completions: tokens and scored targets are TRL's", name, n);
    if (!st) check(what, rows_match(d, f, n, seq), NULL);
    else printf("FAIL %s: %s\n", what, dt_last_error()), failed++;
    dt_safetensors_close(f);
    dt_sft_destroy(d);
    dt_bpe_destroy(tok);
}

/* What GRPO's rollouts append after an answer whose calls ran (dt_chat_tool_suffix) against what TRL's GRPOTrainer
 * appends (sft/tool_suffix.json: its _get_tool_suffix_ids' text), each template's, one result and two. */
static void check_tool_suffix(const char *dir) {
    char path[600], *text = NULL, detail[200] = "";
    snprintf(path, sizeof path, "%s/sft/tool_suffix.json", dir);
    dt_status st = dt_file_read_text(path, 1 << 20, &text, NULL);
    cJSON *j = st ? NULL : cJSON_Parse(text), *c;
    int n = 0, good = 0;
    cJSON_ArrayForEach(c, j) {
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(c, "kind"), *want = cJSON_GetObjectItemCaseSensitive(c, "text");
        const cJSON *think = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "kwargs"), "enable_thinking");
        dt_chat_kind k = DT_CHAT_NONE;
        dt_chat_kwargs kw = { .thinking = !cJSON_IsFalse(think) };
        char *got = NULL;
        n++;
        if (!cJSON_IsString(kind) || !cJSON_IsString(want) || dt_chat_kind_parse(kind->valuestring, &k) ||
            dt_chat_tool_suffix(dt_chat_template_of(k), cJSON_GetObjectItemCaseSensitive(c, "results"), &kw, &got))
            snprintf(detail, sizeof detail, "case %d: %s", n, dt_last_error());
        else if (strcmp(got, want->valuestring))
            snprintf(detail, sizeof detail, "case %d (%s): %.80s", n, kind->valuestring, got);
        else
            good++;
        free(got);
    }
    char what[160];
    snprintf(what, sizeof what, "%d of %d tool results appended after an answer as TRL's GRPOTrainer appends them", good, n);
    check(what, !st && n == 10 && good == n, detail[0] ? detail : st ? dt_last_error() : NULL);
    cJSON_Delete(j);
    free(text);
}

/* GRPO's prompts file of these lines, read by the fixture tokenizer and template chat: refused with needle in the error. */
static void grpo_refused(const char *dir, const char *what, const char *lines, dt_chat_kind chat, const char *needle) {
    char path[] = "/tmp/dtrain_grpo_bad_XXXXXX.jsonl";
    int fd = mkstemps(path, 6);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f) fputs(lines, f), fclose(f);
    dt_grpo_prompts gp = { 0 };
    dt_bpe *tok = NULL;
    dt_chat_kind ignored;
    int eos;
    bool refused = f && !load_tokenizer(dir, &tok, &ignored, &eos) && dt_grpo_prompts_read(&gp, path, tok, chat, &(dt_chat_kwargs){ .thinking = true }, 64) &&
                   strstr(dt_last_error(), needle);
    check(what, refused, dt_last_error());
    dt_grpo_prompts_free(&gp);
    dt_bpe_destroy(tok);
    unlink(path);
}

/* Llama 3.2's server prompt names today's date where a request names none (its template's strftime_now("%d %b %Y"),
 * local time): the date asked just before the prompt or just after (a prompt made across midnight names either). */
static void check_today(void) {
    cJSON *m = cJSON_Parse("[{\"role\": \"user\", \"content\": \"Hi\"}]");
    dt_chat_kwargs kw = { .thinking = true };
    char *got = NULL, before[32], after[32], want[2][64];
    size_t n;
    dt_chat_today(before);
    dt_status st = serve_chat_prompt(m, DT_CHAT_LLAMA32, &kw, &got, &n);
    dt_chat_today(after);
    snprintf(want[0], sizeof want[0], "Today Date: %s\n\n", before);
    snprintf(want[1], sizeof want[1], "Today Date: %s\n\n", after);
    bool dated = !st && (strstr(got, want[0]) || strstr(got, want[1])) && strlen(before) == 11;
    check("serve: Llama 3.2's prompt names today's date (as 07 Dec 2026) where the request names none", dated, got);
    free(got);
    cJSON_Delete(m);
}

/* The server's split of a thinking model's answer (vLLM's Qwen 3 parser's: the bytes between <think> and </think> the
 * reasoning, the rest the content), whole and as a stream fed a byte at a time and 3 at a time: what is sent is at every
 * step the start of the whole answer's reasoning and content (no piece of a marker sent as text), and at the end all of
 * them. */
static bool stream_matches(const char *text, size_t step, const char *want_r, const char *want_c) {
    size_t n = strlen(text), sent_r = 0, sent_c = 0;
    char r[256] = "", c[256] = "";
    for (size_t upto = 0; upto <= n; upto = upto == n ? n + 1 : upto + step > n ? n : upto + step) {
        serve_split s;
        size_t r_at, r_n, c_at, c_n;
        serve_reasoning_split(text, upto, upto == n, &s);
        serve_reasoning_next(&s, sent_r, sent_c, &r_at, &r_n, &c_at, &c_n);
        strncat(r, text + r_at, r_n), strncat(c, text + c_at, c_n);
        if (strncmp(r, want_r, strlen(r)) || strncmp(c, want_c, strlen(c))) return false; /* (what was sent is never taken back) */
        sent_r += r_n, sent_c += c_n;
    }
    return !strcmp(r, want_r) && !strcmp(c, want_c);
}

static void check_reasoning_split(void) {
    static const struct { const char *text, *reasoning, *content; bool thinks; } cases[] = {
        { "<think>\nTwo and two.\n</think>\n\n4.", "\nTwo and two.\n", "\n\n4.", true },
        { "Plain words.", "", "Plain words.", false },
        { "<think>cut short </thi", "cut short </thi", "", true },
        { "<thi", "", "<thi", false },
        { "<think></think>Yes", "", "Yes", true },
        { "a <think>b</think> c", "", "a <think>b</think> c", false },
    };
    int good = 0, n = (int)(sizeof cases / sizeof *cases);
    for (int k = 0; k < n; k++) {
        serve_split s;
        const char *t = cases[k].text;
        serve_reasoning_split(t, strlen(t), true, &s);
        bool ok = s.thinks == cases[k].thinks && s.r1 - s.r0 == strlen(cases[k].reasoning) && !strncmp(t + s.r0, cases[k].reasoning, s.r1 - s.r0) &&
                  !strcmp(t + s.c0, cases[k].content) && stream_matches(t, 1, cases[k].reasoning, cases[k].content) &&
                  stream_matches(t, 3, cases[k].reasoning, cases[k].content);
        if (!ok) printf("   case %d (%s) differs\n", k, t);
        good += ok;
    }
    char what[120];
    snprintf(what, sizeof what, "serve: %d of %d thinking answers split into reasoning and content, whole and streamed", good, n);
    check(what, good == n, NULL);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    /* a cache of this run's own: rows kept by an earlier build would hide what this one's rendering makes */
    char cache[] = "/tmp/dtrain_sft_run_XXXXXX", rm[64];
    if (!mkdtemp(cache) || setenv("XDG_CACHE_HOME", cache, 1)) return printf("test_sft: no temporary cache folder\n"), 1;
    check_case(dir, "chat", 4);
    check_case(dir, "completion", 3);
    check_packed(dir);
    check_cache(dir);
    check_template(dir, "qwen3", DT_CHAT_QWEN3, 6, 18);
    check_template(dir, "qwen2_5", DT_CHAT_QWEN25, 6, 14);
    check_template(dir, "qwen2", DT_CHAT_QWEN2, 4, 6);
    check_template(dir, "smollm2", DT_CHAT_SMOLLM2, 4, 6);
    check_template(dir, "llama3", DT_CHAT_LLAMA3, 3, 6);
    check_template(dir, "llama3_1", DT_CHAT_LLAMA31, 5, 36);
    check_template(dir, "llama3_2", DT_CHAT_LLAMA32, 5, 28);
    check_chat_completions(dir, "chatml", DT_CHAT_CHATML, "tokenizer.json", T, 2);
    check_tool_suffix(dir);
    check_grpo_training_prompts(dir);
    check_chat_completions(dir, "qwen3", DT_CHAT_QWEN3, "tokenizer.json", TMAX - 1, 4);
    check_chat_completions(dir, "llama3_1", DT_CHAT_LLAMA31, "llama3_tokenizer.json", TMAX - 1, 4);
    /* each row's chat_template_kwargs: Qwen 3's thinking off, Llama 3.1's date and its tools in the system turn */
    check_chat_completions(dir, "qwen3_kwargs", DT_CHAT_QWEN3, "tokenizer.json", TMAX - 1, 4);
    check_chat_completions(dir, "llama3_1_kwargs", DT_CHAT_LLAMA31, "llama3_tokenizer.json", TMAX - 1, 4);
    /* Llama 3.1's built-in tools: a call of one (<|python_tag|>NAME.call(...)<|eom_id|>) scored, a custom one ending so too */
    check_chat_completions(dir, "llama3_1_builtin", DT_CHAT_LLAMA31, "llama3_tokenizer.json", TMAX - 1, 4);
    check_today();
    grpo_refused(dir, "refused: a GRPO conversational prompt without a chat template (its line named)",
                 "{\"prompt\": \"a text\"}\n{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n", DT_CHAT_NONE,
                 ":2: a conversational prompt needs a tokenizer and a chat template");
    grpo_refused(dir, "refused: a GRPO text prompt with tools (its line named)", "{\"prompt\": \"a text\", \"tools\": []}\n", DT_CHAT_QWEN25,
                 ":1: \"tools\" is a list of the tools a conversational prompt's model may call");
    grpo_refused(dir, "refused: a GRPO prompt's tools that are not a list",
                 "{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tools\": \"{}\"}\n", DT_CHAT_QWEN25, ":1: \"tools\" is a list");
    grpo_refused(dir, "refused: a GRPO prompt's tools for a template that renders none",
                 "{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tools\": [{\"type\": \"function\"}]}\n", DT_CHAT_CHATML,
                 ":1: 'tools': the ChatML template renders no tool calls");
    check_reasoning_split();
    refused(dir, "refused: a line that is not JSON", "{\"messages\": [", DT_CHAT_CHATML, "not JSON");
    refused(dir, "refused: a line without messages or prompt and completion", "{\"text\": \"hi\"}", DT_CHAT_CHATML, "neither");
    refused(dir, "refused: a line's chat_template_kwargs of a key no template here reads",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}], "
            "\"chat_template_kwargs\": {\"add_vision_id\": true}}", DT_CHAT_QWEN3, "\"chat_template_kwargs\" holds 'add_vision_id'");
    refused(dir, "refused: built-in tools for a template without them (Qwen 3's)",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}], "
            "\"chat_template_kwargs\": {\"builtin_tools\": [\"brave_search\"]}}", DT_CHAT_QWEN3, "has no built-in tools (Llama 3.1's has)");
    refused(dir, "refused: builtin_tools that are not a list of names",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}], "
            "\"chat_template_kwargs\": {\"builtin_tools\": \"brave_search\"}}", DT_CHAT_QWEN3, "holds 'builtin_tools'");
    refused(dir, "refused: chat_template_kwargs beside a text prompt and completion",
            "{\"prompt\": \"a\", \"completion\": \"b\", \"chat_template_kwargs\": {\"enable_thinking\": false}}", DT_CHAT_QWEN3,
            "\"chat_template_kwargs\" go to a chat template");
    refused(dir, "refused: a role that is not system, user or assistant",
            "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", DT_CHAT_CHATML, "role \"tool\"");
    refused(dir, "refused: a chat without a template", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", DT_CHAT_NONE,
            "need a chat template");
    refused(dir, "refused: a chat with no assistant turn", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", DT_CHAT_CHATML,
            "no assistant message");
    refused(dir, "refused: an empty file", "", DT_CHAT_CHATML, "no examples");
    refused(dir, "refused: tools beside a prompt and completion (texts)", "{\"prompt\": \"a\", \"completion\": \"b\", \"tools\": []}",
            DT_CHAT_CHATML, "\"tools\" is a list of the tools");
    refused(dir, "refused: tools whose JSON text is not JSON",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"y\"}], \"tools\": \"[x\"}",
            DT_CHAT_QWEN25, "\"tools\" is a list of the tools");
    refused(dir, "refused: a chat with tools by a template that renders none",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"y\"}], \"tools\": "
            "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}", DT_CHAT_CHATML, "'tools': the ChatML template renders no tool calls");
    refused(dir, "refused: an answer's calls by a template that renders none",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
            "[{\"function\": {\"name\": \"f\", \"arguments\": {}}}]}]}", DT_CHAT_LLAMA3, "'messages' [1]: the Llama 3 template renders no");
    dt_chat_kind k;
    check("refused: a chat_template this build cannot render (named)",
          dt_chat_kind_of_template("{% for m in messages %}[INST] {{ m.content }}{% endfor %}", "x/tokenizer_config.json", &k) &&
          strstr(dt_last_error(), "x/tokenizer_config.json"), dt_last_error());
    /* Qwen 2's template with another default system text: not plain ChatML (which would leave the turn out) */
    const char *own = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
                      "You are a pirate.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                      "'<|im_end|>' + '\\n'}}{% endfor %}";
    check("refused: a ChatML template with a system turn of its own this build does not know (its text named)",
          dt_chat_kind_of_template(own, "x/tokenizer_config.json", &k) && strstr(dt_last_error(), "(\"You are a pirate.\")"),
          dt_last_error());
    check("a ChatML template whose system turn comes from the chat is ChatML",
          !dt_chat_kind_of_template("{%- if tools %}{{- '<|im_start|>system\\n' }}{%- endif %}{{'<|im_start|>' + message['role'] + "
                                    "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}", "x", &k) && k == DT_CHAT_CHATML,
          NULL);
    snprintf(rm, sizeof rm, "rm -rf %s", cache);
    if (system(rm) != 0) printf("   (could not remove %s)\n", cache);
    printf("%s\n", failed ? "test_sft: FAILED" : "test_sft: all passed");
    return failed != 0;
}
