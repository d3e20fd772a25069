/* A /v1/completions body (OpenAI's legacy completions API) read and checked:
 * every field this server does not honour is refused rather than ignored,
 * so a client never gets silently different sampling than it asked for. */
#include "serve_internal.h"
#include "io/json_text.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void *copy_of(const void *a, size_t n) {
    void *b = malloc(n ? n : 1);
    if (b && n) memcpy(b, a, n);
    return b;
}

dt_status serve_params_copy(const serve_params *a, serve_params *out) {
    *out = *a;
    out->prompt = NULL, out->bias = NULL, out->stop_ids = NULL, out->suppress = NULL, out->nstop = 0;
    bool ok = (out->prompt = copy_of(a->prompt, sizeof(int32_t) * (size_t)a->nprompt)) != NULL;
    if (ok && a->nbias) ok = (out->bias = copy_of(a->bias, sizeof *a->bias * (size_t)a->nbias)) != NULL;
    if (ok && a->nstop_ids) ok = (out->stop_ids = copy_of(a->stop_ids, sizeof(int32_t) * (size_t)a->nstop_ids)) != NULL;
    if (ok && a->sampling.nsuppress) ok = (out->suppress = copy_of(a->suppress, sizeof(int32_t) * (size_t)a->sampling.nsuppress)) != NULL;
    out->sampling.logit_bias = out->bias, out->sampling.suppress = out->suppress;
    for (int i = 0; ok && i < a->nstop; i++) ok = (out->stop[out->nstop++] = strdup(a->stop[i])) != NULL;
    if (ok) return DT_OK;
    serve_params_free(out);
    return dt_error(DT_ERR_NOMEM, "out of memory for a request's copy");
}

void serve_params_free(serve_params *p) {
    free(p->prompt);
    free(p->bias);
    free(p->stop_ids);
    free(p->suppress);
    for (int i = 0; i < p->nstop; i++) free(p->stop[i]);
    memset(p, 0, sizeof *p);
}

static dt_status bad(const char **param, const char *name, const char *fmt, const char *what) {
    *param = name;
    return dt_error(DT_ERR_ARG, fmt, name, what);
}

/* A number field in [lo, hi] (whole if integral), or its default when absent or null. */
static dt_status number(const cJSON *o, const char *name, double lo, double hi, bool integral, double def, double *out,
                        const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = def;
    if (!f || cJSON_IsNull(f)) return DT_OK;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble)) return bad(param, name, "'%s' must be a number%s", "");
    double v = f->valuedouble;
    if (v < lo || v > hi || (integral && v != floor(v))) {
        *param = name;
        return dt_error(DT_ERR_ARG, "'%s' is %g: expected %s from %g to %g", name, v, integral ? "a whole number" : "a number", lo, hi);
    }
    *out = v;
    return DT_OK;
}

static dt_status read_prompt(const cJSON *o, const serve_vocab *v, serve_params *p, const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!f) return bad(param, "prompt", "'%s' is required%s", "");
    if (cJSON_IsArray(f) && cJSON_GetArraySize(f) == 1 && !cJSON_IsNumber(cJSON_GetArrayItem(f, 0)))
        f = cJSON_GetArrayItem(f, 0); /* ["text"] or [[ids]]: one prompt */
    if (cJSON_IsString(f)) return dt_bpe_prompt(v->bpe, f->valuestring, strlen(f->valuestring), true, &p->prompt, &p->nprompt);
    if (!cJSON_IsArray(f))
        return bad(param, "prompt", "'%s' must be a string or an array of token ids (one prompt a request)%s", "");
    int n = cJSON_GetArraySize(f);
    /* ["a", "b"] or [[1], [2]]: OpenAI's batch of prompts, which dtrain takes as one request each */
    if (n > 1 && (cJSON_IsString(cJSON_GetArrayItem(f, 0)) || cJSON_IsArray(cJSON_GetArrayItem(f, 0))))
        return bad(param, "prompt", "'%s' holds several prompts: one prompt a request (send each as its own request; they are "
                   "batched together as they run)%s", "");
    p->prompt = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!p->prompt) return dt_error(DT_ERR_NOMEM, "out of memory for %d prompt tokens", n);
    const cJSON *t;
    cJSON_ArrayForEach(t, f) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= v->vocab)
            return bad(param, "prompt", "'%s' holds something other than token ids below the vocabulary's size%s", "");
        p->prompt[p->nprompt++] = (int32_t)t->valuedouble;
    }
    return DT_OK;
}

static dt_status read_stop(const cJSON *o, serve_params *p, const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "stop"), *s;
    if (!f || cJSON_IsNull(f)) return DT_OK;
    if (cJSON_IsString(f)) {
        if (!*f->valuestring) return bad(param, "stop", "'%s' holds an empty string%s", "");
        if (!(p->stop[p->nstop++] = strdup(f->valuestring))) return dt_error(DT_ERR_NOMEM, "out of memory");
        return DT_OK;
    }
    if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) > SERVE_MAX_STOP)
        return bad(param, "stop", "'%s' must be a string or an array of at most 4 strings%s", "");
    cJSON_ArrayForEach(s, f) {
        if (!cJSON_IsString(s) || !*s->valuestring) return bad(param, "stop", "'%s' holds something other than a non-empty string%s", "");
        if (!(p->stop[p->nstop++] = strdup(s->valuestring))) return dt_error(DT_ERR_NOMEM, "out of memory");
    }
    return DT_OK;
}

/* A boolean field into *out, which keeps its default (false in the zeroed params, or the caller's) where it is absent. */
static dt_status read_flag(const cJSON *o, const char *name, bool *out, const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!f || cJSON_IsNull(f)) return DT_OK;
    if (!cJSON_IsBool(f)) return bad(param, name, "'%s' must be true or false%s", "");
    *out = cJSON_IsTrue(f);
    return DT_OK;
}

/* Fields OpenAI's API (and vLLM's extensions of it) has that change the output and that this server does not do:
 * refused unless at their neutral value (a number's; false; an empty list or object). */
static dt_status refuse_unsupported(const cJSON *o, const char **param) {
    static const struct { const char *name; double neutral; } nums[] = {
        { "best_of", 1 }, { "length_penalty", 1 }, { "truncate_prompt_tokens", 0 } };
    static const char *flags[] = { "include_stop_str_in_output", "use_beam_search", "continue_final_message" };
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, flags[i]);
        if (f && !cJSON_IsNull(f) && !cJSON_IsFalse(f)) return bad(param, flags[i], "'%s' is not supported by this server%s", " (only false)");
    }
    static const char *lists[] = { "bad_words", "allowed_token_ids", "guided_json", "guided_regex", "guided_choice",
                                   "guided_grammar", "structured_outputs", "documents" };
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, lists[i]);
        if (f && !cJSON_IsNull(f) && !((cJSON_IsArray(f) || cJSON_IsObject(f)) && !f->child))
            return bad(param, lists[i], "'%s' is not supported by this server%s", "");
    }
    /* a chat's prompt is the model's own template's, ending in the assistant's turn (vLLM's chat_template and
     * add_generation_prompt: false would change it) */
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(o, "chat_template"), *gen = cJSON_GetObjectItemCaseSensitive(o, "add_generation_prompt");
    if (tpl && !cJSON_IsNull(tpl)) return bad(param, "chat_template", "'%s' is not supported by this server%s", " (the model's own is used)");
    if (gen && !cJSON_IsNull(gen) && !cJSON_IsTrue(gen)) return bad(param, "add_generation_prompt", "'%s' is not supported by this server%s", " (only true)");
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, nums[i].name);
        if (f && !cJSON_IsNull(f) && !(cJSON_IsNumber(f) && f->valuedouble == nums[i].neutral))
            return bad(param, nums[i].name, "'%s' is not supported by this server%s", " (only its default)");
    }
    static const char *absent[] = { "suffix" };
    for (size_t i = 0; i < sizeof absent / sizeof *absent; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, absent[i]);
        if (f && !cJSON_IsNull(f) && !(cJSON_IsObject(f) && !f->child))
            return bad(param, absent[i], "'%s' is not supported by this server%s", "");
    }
    return DT_OK;
}

/* stream_options (OpenAI's): include_usage, a stream's usage in a last chunk of no choices; refused without stream. */
static dt_status read_stream_options(const cJSON *o, serve_params *p, const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "stream_options"), *e;
    if (!f || cJSON_IsNull(f)) return DT_OK;
    if (!cJSON_IsObject(f)) return bad(param, "stream_options", "'%s' must be an object%s", "");
    if (!p->stream) return bad(param, "stream_options", "'%s' is only for a stream%s", " (\"stream\": true)");
    cJSON_ArrayForEach(e, f) {
        if (strcmp(e->string, "include_usage") || !cJSON_IsBool(e))
            return bad(param, "stream_options", "'%s' takes include_usage (true or false) alone%s", "");
        p->stream_usage = cJSON_IsTrue(e);
    }
    return DT_OK;
}

/* response_format: text only (no decoding guided by a grammar or schema here: json_object and json_schema refused, not
 * answered unguided). */
static dt_status read_response_format(const cJSON *o, const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "response_format"), *t;
    if (!f || cJSON_IsNull(f)) return DT_OK;
    t = cJSON_GetObjectItemCaseSensitive(f, "type");
    if (cJSON_IsObject(f) && cJSON_IsString(t) && !strcmp(t->valuestring, "text")) return DT_OK;
    return bad(param, "response_format", "'%s' other than {\"type\": \"text\"} is not supported by this server%s",
               " (no decoding guided by a JSON schema)");
}

/* vLLM's cache_salt: a non-empty string, hashed (its length, then its bytes as words; never 0, which is none). */
static dt_status read_salt(const cJSON *o, serve_params *p, const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "cache_salt");
    if (!f || cJSON_IsNull(f)) return DT_OK;
    if (!cJSON_IsString(f) || !*f->valuestring) return bad(param, "cache_salt", "'%s' must be a non-empty string%s", "");
    size_t n = strlen(f->valuestring);
    uint32_t *w = calloc(n / 4 + 2, sizeof(uint32_t));
    if (!w) return dt_error(DT_ERR_NOMEM, "out of memory");
    w[0] = (uint32_t)n;
    memcpy(w + 1, f->valuestring, n);
    uint64_t h = dt_hash_words(DT_HASH_INIT, w, n / 4 + 2);
    free(w);
    p->salt = h ? h : 1;
    return DT_OK;
}

/* One logit_bias entry: its token id (below the vocabulary's size, not named before: seen) and its bias into out. */
static dt_status bias_entry(const cJSON *e, int vocab, uint64_t *seen, dt_logit_bias *out) {
    char *end;
    long id = strtol(e->string, &end, 10);
    if (!*e->string || *end || id < 0 || id >= vocab)
        return dt_error(DT_ERR_ARG, "'logit_bias' names \"%.40s\": expected a token id from 0 to %d", e->string, vocab - 1);
    if (!cJSON_IsNumber(e) || !(e->valuedouble >= -100 && e->valuedouble <= 100))
        return dt_error(DT_ERR_ARG, "'logit_bias' of token %ld: expected a number from -100 to 100", id);
    if (seen[id >> 6] >> (id & 63) & 1) /* (JSON's duplicate keys: which bias would be meant?) */
        return dt_error(DT_ERR_ARG, "'logit_bias' names token %ld twice", id);
    dt_token_set_add(seen, (int32_t)id);
    *out = (dt_logit_bias){ (int32_t)id, (float)e->valuedouble };
    return DT_OK;
}

/* logit_bias: {"token id": bias from -100 to 100} (OpenAI's), each id below the vocabulary's size. */
static dt_status read_bias(const cJSON *o, const serve_vocab *v, serve_params *p, const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "logit_bias"), *e;
    if (!f || cJSON_IsNull(f)) return DT_OK;
    if (!cJSON_IsObject(f)) return bad(param, "logit_bias", "'%s' must be an object of {\"token id\": bias}%s", "");
    int n = cJSON_GetArraySize(f);
    if (n > v->vocab) return bad(param, "logit_bias", "'%s' has more entries than the vocabulary has tokens%s", "");
    if (!n) return DT_OK;
    uint64_t *seen = calloc(dt_token_set_words(v->vocab), sizeof *seen);
    dt_status st = seen && (p->bias = malloc(sizeof *p->bias * (size_t)n)) ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory");
    for (e = f->child; !st && e; e = e->next)
        if (!(st = bias_entry(e, v->vocab, seen, &p->bias[p->nbias]))) p->nbias++;
    if (st == DT_ERR_ARG) *param = "logit_bias";
    free(seen);
    return st;
}

/* vLLM's stop_token_ids (up to 64 ids below the vocabulary's size: each ends the completion, its text kept) and
 * min_tokens (0 to max_tokens: before that many are drawn, neither the ends nor those ids can be). */
static dt_status read_stop_ids(const cJSON *o, const serve_vocab *v, int max_tokens, serve_params *p, const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "stop_token_ids"), *e;
    double mt;
    int n = f && !cJSON_IsNull(f) && cJSON_IsArray(f) ? cJSON_GetArraySize(f) : 0;
    if (f && !cJSON_IsNull(f) && (!cJSON_IsArray(f) || n > 64))
        return bad(param, "stop_token_ids", "'%s' must be an array of at most 64 token ids%s", "");
    if (n && !(p->stop_ids = malloc(sizeof(int32_t) * (size_t)n))) return dt_error(DT_ERR_NOMEM, "out of memory");
    for (e = n ? f->child : NULL; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble >= v->vocab)
            return bad(param, "stop_token_ids", "'%s' holds something other than token ids below the vocabulary's size%s", "");
        p->stop_ids[p->nstop_ids++] = (int32_t)e->valuedouble;
    }
    dt_status st = number(o, "min_tokens", 0, max_tokens, true, 0, &mt, param);
    if (st || mt == 0) return st;
    if (!(p->suppress = malloc(sizeof(int32_t) * (size_t)(v->ends.n + p->nstop_ids + 1)))) return dt_error(DT_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < v->ends.n; i++) p->suppress[k++] = v->ends.ids[i];
    for (int i = 0; i < p->nstop_ids; i++) p->suppress[k++] = p->stop_ids[i];
    p->sampling.min_tokens = (int)mt, p->sampling.suppress = p->suppress, p->sampling.nsuppress = k;
    return DT_OK;
}

/* vLLM's prompt_logprobs: N (0 to 20) of a whole completion's answer (a stream's chunks have no field for them, nor a
 * chat's answer here). */
static dt_status read_prompt_logprobs(const cJSON *o, bool chat, serve_params *p, const char **param) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "prompt_logprobs");
    double n;
    if (!f || cJSON_IsNull(f)) return DT_OK;
    if (chat || p->stream)
        return bad(param, "prompt_logprobs", "'%s' is not supported by this server %s", chat ? "for a chat" : "in a stream (a whole completion's answer has them)");
    dt_status st = number(o, "prompt_logprobs", 0, SERVE_MAX_TOP, true, 0, &n, param);
    if (!st) p->prompt_lps = true, p->prompt_top = (int)n;
    return st;
}

/* Log-probabilities: a completion's "logprobs": N (each token's, with its N most likely alternatives; null: none); a
 * chat's "logprobs": true with "top_logprobs": N (0 by default; refused without logprobs, as OpenAI does). */
static dt_status read_logprobs(const cJSON *o, bool chat, serve_params *p, const char **param) {
    double n;
    dt_status st;
    if (!chat) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
        p->logprobs = f && !cJSON_IsNull(f);
        if (!p->logprobs) return DT_OK;
        if (cJSON_IsBool(f)) return bad(param, "logprobs", "'%s' of a completion is a count of alternatives, 0 to 20%s", " (true is the chat API's)");
        st = number(o, "logprobs", 0, SERVE_MAX_TOP, true, 0, &n, param);
    } else {
        const cJSON *top = cJSON_GetObjectItemCaseSensitive(o, "top_logprobs");
        if ((st = read_flag(o, "logprobs", &p->logprobs, param))) return st;
        if (top && !cJSON_IsNull(top) && !p->logprobs) return bad(param, "top_logprobs", "'%s' needs \"logprobs\": true%s", "");
        st = number(o, "top_logprobs", 0, SERVE_MAX_TOP, true, 0, &n, param);
    }
    p->top = (int)n;
    return st;
}

/* chat_template_kwargs (vLLM's and SGLang's field): enable_thinking, whether Qwen 3 thinks (true unless said), and
 * date_string, the date Llama 3.1's and 3.2's system turn names. */
static dt_status read_template_kwargs(const cJSON *o, dt_chat_kwargs *kw, const char **param) {
    if (!dt_chat_kwargs_read(cJSON_GetObjectItemCaseSensitive(o, "chat_template_kwargs"), kw)) return DT_OK;
    return bad(param, "chat_template_kwargs", "'%s' %s", dt_last_error()); /* (dt_error formats before it writes) */
}

/* tools (OpenAI's {"type": "function", "function": {...}} objects) for a template that renders them, and tool_choice:
 * "auto" (their default) or "none" (the tools left out of the prompt, as vLLM's --exclude-tools-when-tool-choice-none
 * does). */
static dt_status read_tools(const cJSON *o, const serve_vocab *v, serve_params *p, dt_chat_kwargs *kw, const char **param) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools"), *choice = cJSON_GetObjectItemCaseSensitive(o, "tool_choice");
    const dt_chat_template *t = dt_chat_template_of(v->chat);
    if (!tools || cJSON_IsNull(tools)) return DT_OK;
    if (!cJSON_IsArray(tools)) return bad(param, "tools", "'%s' must be an array of {\"type\": \"function\", \"function\"} objects%s", "");
    if (choice && !cJSON_IsNull(choice) && !(cJSON_IsString(choice) && (!strcmp(choice->valuestring, "auto") || !strcmp(choice->valuestring, "none"))))
        return bad(param, "tool_choice", "'%s' is not supported by this server%s", " (auto or none)");
    if (!dt_chat_has_tools(tools) || (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none"))) return DT_OK;
    if (!t || !t->tools)
        return bad(param, "tools", "'%s': this model's chat template (%s) renders no tool calls in this build (Qwen 2.5's, Qwen 3's, Llama 3.1's and 3.2's do)",
                   t ? t->name : "dtrain's plain one");
    kw->tools = tools, p->tools = true;
    return DT_OK;
}

/* A chat request's messages, rendered and encoded as its prompt; its answer also stops at the next turn. */
static dt_status read_messages(const cJSON *o, const serve_vocab *v, serve_params *p, const char **param) {
    char *text;
    size_t n;
    dt_chat_kwargs kw;
    dt_status st = read_template_kwargs(o, &kw, param);
    if (!st) st = read_tools(o, v, p, &kw, param);
    if (st) return st;
    *param = "messages";
    st = serve_chat_prompt(cJSON_GetObjectItemCaseSensitive(o, "messages"), v->chat, &kw, &text, &n);
    if (st) return st;
    /* a model's own template writes its begin-of-text (Llama 3's): tokenized as apply_chat_template does, without the
     * tokenizer's own in front (which would make it two); dtrain's plain one is a text as any prompt */
    const dt_chat_template *t = dt_chat_template_of(v->chat);
    st = dt_bpe_prompt(v->bpe, text, n, !t, &p->prompt, &p->nprompt);
    free(text);
    /* the answer ends at the template's end of turn, or where the plain template's next turn begins */
    if (!st && p->nstop < SERVE_MAX_STOP && !(p->stop[p->nstop++] = strdup(t ? t->end : SERVE_CHAT_STOP))) st = dt_error(DT_ERR_NOMEM, "out of memory");
    if (!st) *param = NULL;
    return st;
}

static dt_status read_all(const cJSON *o, const serve_vocab *v, int context, bool chat, serve_params *p, const char **param) {
    double mt, temp, topp, topk, minp, rep, pres, freq, seed, n;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (model && !cJSON_IsString(model)) return bad(param, "model", "'%s' must be a string%s", "");
    /* chat's newer name for max_tokens */
    const char *max_name = chat && cJSON_GetObjectItemCaseSensitive(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    dt_status st = refuse_unsupported(o, param);
    if (!st) st = read_stop(o, p, param); /* before a chat's own stop */
    if (!st) st = chat ? read_messages(o, v, p, param) : read_prompt(o, v, p, param);
    if (!st && p->nprompt < 1) st = bad(param, "prompt", "'%s' is empty%s", "");
    for (int i = 0; !st && i < p->nprompt; i++) /* (text read as bytes by a model of fewer than 256 tokens) */
        if (p->prompt[i] >= v->vocab) {
            *param = chat ? "messages" : "prompt";
            st = dt_error(DT_ERR_ARG, "the prompt's byte %d (0x%02x) is outside this model's vocabulary of %d", i, (unsigned)p->prompt[i], v->vocab);
        }
    /* a completion of max_tokens 0 reads its prompt alone (with echo and logprobs: the prompt's scores) */
    if (!st) st = number(o, max_name, chat ? 1 : 0, 1e9, true, chat ? context : 16, &mt, param);
    if (!st && chat && mt > context - p->nprompt && !cJSON_GetObjectItemCaseSensitive(o, max_name)) mt = context - p->nprompt;
    if (!st) st = number(o, "temperature", 0, 100, false, 1, &temp, param);
    if (!st) st = number(o, "top_p", 0, 1, false, 1, &topp, param);
    if (!st && topp <= 0) st = bad(param, "top_p", "'%s' must be above 0%s", "");
    if (!st) st = number(o, "top_k", 0, 1e9, true, 0, &topk, param);
    if (!st) st = number(o, "min_p", 0, 1, false, 0, &minp, param); /* (vLLM's) */
    if (!st) st = number(o, "repetition_penalty", 0, 1000, false, 1, &rep, param); /* (vLLM's) */
    if (!st && rep <= 0) st = bad(param, "repetition_penalty", "'%s' must be above 0%s", "");
    if (!st) st = number(o, "presence_penalty", -2, 2, false, 0, &pres, param); /* (OpenAI's ranges) */
    if (!st) st = number(o, "frequency_penalty", -2, 2, false, 0, &freq, param);
    if (!st) st = read_bias(o, v, p, param);
    if (!st) st = number(o, "seed", 0, 9007199254740991.0, true, 0, &seed, param);
    if (!st) st = number(o, "n", 1, 128, true, 1, &n, param); /* (OpenAI's most) */
    if (!st) st = read_flag(o, "stream", &p->stream, param);
    if (!st && !chat) st = read_flag(o, "echo", &p->echo, param);
    if (!st && chat && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "echo"))) /* (vLLM's: the last message echoed) */
        st = bad(param, "echo", "'%s' is not supported by this server for a chat%s", " (a completion's echo is)");
    if (!st) st = read_logprobs(o, chat, p, param);
    if (!st) st = read_prompt_logprobs(o, chat, p, param);
    if (!st) st = read_stream_options(o, p, param);
    if (!st) st = read_flag(o, "ignore_eos", &p->ignore_eos, param); /* (vLLM's) */
    bool skip = true; /* (vLLM's skip_special_tokens: true unless given) */
    if (!st) st = read_flag(o, "skip_special_tokens", &skip, param);
    /* (with tools, as vLLM's tool parsers ask: a call may open with a special token, Llama 3.1's <|python_tag|>) */
    p->keep_special = !skip || p->tools;
    if (!st) st = read_response_format(o, param);
    if (!st) st = read_salt(o, p, param);
    if (st) return st;
    if ((double)p->nprompt + mt > context || (chat && mt < 1)) {
        *param = chat && mt < 1 ? "messages" : max_name;
        if (mt < 1)
            return dt_error(DT_ERR_ARG, "the server's context (--context) holds %d tokens and the messages take %d: shorten them", context, p->nprompt);
        return dt_error(DT_ERR_ARG, "the server's context (--context) holds %d tokens; the prompt has %d and %s asks for %.0f more "
                        "(%.0f in all): shorten the prompt or lower %s", context, p->nprompt, max_name, mt, p->nprompt + mt, max_name);
    }
    p->max_tokens = (int)mt;
    p->sampling = (dt_sampling){ .temperature = (float)temp, .top_k = (int)topk, .top_p = (float)topp, .min_p = (float)minp,
                                 .repetition_penalty = (float)rep, .presence_penalty = (float)pres, .frequency_penalty = (float)freq,
                                 .logit_bias = p->bias, .nlogit_bias = p->nbias };
    p->seed = (uint64_t)seed;
    p->n = (int)n;
    return read_stop_ids(o, v, p->max_tokens, p, param); /* (its min_tokens and suppressed tokens into the sampling) */
}

dt_status serve_params_parse(const char *body, size_t len, const serve_vocab *v, int context, bool chat, serve_params *p,
                             const char **param) {
    memset(p, 0, sizeof *p);
    *param = NULL;
    /* cJSON would end a string at it, cutting a prompt short unseen */
    if (dt_json_holds_nul(body, len)) return dt_error(DT_ERR_ARG, "the body holds a NUL character (\\u0000), which this server cannot take");
    /* JSON text is UTF-8 (RFC 8259): other bytes, which a byte-level model would take as text, are refused */
    size_t bad = dt_utf8_find_invalid(body, len);
    if (bad < len)
        return dt_error(DT_ERR_ARG, "the body is not UTF-8, which JSON must be: byte %zu of %zu (0x%02x) starts no character", bad, len,
                        (unsigned)(unsigned char)body[bad]);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (o) dt_json_mark_floats(o, body, (size_t)(end - body)); /* (a tool's 1.0 rendered as the template's tojson writes it) */
    while (o && end < body + len && isspace((unsigned char)*end)) end++;
    if (o && end < body + len && *end) { /* a second value, or text after the first: not one JSON object */
        cJSON_Delete(o);
        return dt_error(DT_ERR_ARG, "the body holds more than one JSON value (text at byte %zu of %zu)", (size_t)(end - body), len);
    }
    if (!o || !cJSON_IsObject(o)) {
        size_t at = o ? 0 : (size_t)(end ? end - body : 0);
        cJSON_Delete(o);
        if (!o) return dt_error(DT_ERR_ARG, "the body is not valid JSON (at byte %zu of %zu)", at, len);
        return dt_error(DT_ERR_ARG, "the body must be a JSON object");
    }
    dt_status st = read_all(o, v, context, chat, p, param);
    p->chat = chat;
    cJSON_Delete(o);
    if (st) serve_params_free(p);
    return st;
}
