/* Supervised fine-tuning data: a JSONL file of examples, each a chat ({"messages": [{"role", "content"}, ...]}) or a
 * prompt and its completion ({"prompt", "completion"}), made into rows of T inputs and T targets, the targets that are
 * not scored (the prompt's, the user's and system's turns, the padding) DT_IGNORE_INDEX, as TRL's SFTTrainer scores
 * them (completion_only_loss; assistant_only_loss with a template that marks the assistant's turns). One example a
 * row, cut at T + 1 tokens or padded after its end (causal attention: the padding changes nothing before it).
 *
 * Chats are rendered by a chat template (chat_template.c: ChatML's, Llama 3's, Qwen 3's); scored: an assistant's
 * content and its end of turn (<|im_end|>, <|eot_id|>; Qwen 3's think block before the content and the newline after);
 * a conversational prompt and completion (lists of messages) are rendered as for generation and scored from where
 * they diverge (render_chat_example). A prompt and completion are tokenized as TRL does: the prompt alone (after the tokenizer's begin-of-text, if it has
 * one), then prompt + completion + end-of-text; the completion's tokens start where the two diverge. A preference pair
 * ({"prompt", "chosen", "rejected"}, DPO's) is two rows tokenized so, chosen then rejected (render_pair). */
#include "sft_internal.h"
#include "dtrain/io.h"
#include "io/json_text.h"
#include "dtrain/kernels.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* An example's tokens and which of them are scored, being built. */
typedef struct {
    int32_t *ids;
    unsigned char *scored;
    size_t n, cap;
} seq;

/* One id more. */
static dt_status push(seq *s, int32_t id, int scored) {
    if (s->n == s->cap) {
        size_t c = s->cap * 2 + 16;
        int32_t *a = realloc(s->ids, c * sizeof *a);
        if (!a) return dt_error(DT_ERR_NOMEM, "sft: out of memory");
        s->ids = a;
        unsigned char *b = realloc(s->scored, c);
        if (!b) return dt_error(DT_ERR_NOMEM, "sft: out of memory");
        s->scored = b, s->cap = c;
    }
    s->ids[s->n] = id, s->scored[s->n++] = (unsigned char)scored;
    return DT_OK;
}

/* text's tokens (tok NULL: its bytes, a byte-level model's), scored or not. */
static dt_status put(seq *s, dt_bpe *tok, const char *text, size_t len, int scored) {
    dt_status st0 = DT_OK;
    for (size_t i = 0; !tok && i < len && !st0; i++) st0 = push(s, (unsigned char)text[i], scored);
    if (!tok) return st0;
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    dt_status st = dt_bpe_encode(tok, text, len, &ids, &n, &cap);
    for (size_t i = 0; !st && i < n; i++) st = push(s, (int32_t)ids[i], scored);
    free(ids);
    return st;
}

static dt_status put_str(seq *s, dt_bpe *tok, const char *text, int scored) { return put(s, tok, text, strlen(text), scored); }

/* The template's own system turn (Qwen 2.5's where a chat has none, Llama 3.1's always, with kw's date or its own;
 * with kw's tools, the turns that hold them) unscored; the chat's first messages written in it skipped (*m moved on,
 * *k counting them). */
static dt_status system_turn(const cJSON *msgs, const dt_chat_kwargs *kw, const dt_chat_template *t, dt_bpe *tok, const char *where, seq *s,
                             const cJSON **m, int *k) {
    const cJSON *r0 = *m ? cJSON_GetObjectItemCaseSensitive(*m, "role") : NULL, *c0 = *m ? cJSON_GetObjectItemCaseSensitive(*m, "content") : NULL;
    bool system0 = cJSON_IsString(r0) && !strcmp(r0->valuestring, "system") && cJSON_IsString(c0);
    char *sys = NULL;
    int used = system0 && t->preamble; /* (Llama 3.1's writes the system message in it) */
    dt_status st = dt_chat_has_tools(kw->tools) ? dt_chat_tools_turn(t, msgs, kw, &sys, &used)
                                                : dt_chat_system_turn(t, system0 ? c0->valuestring : NULL, kw, &sys);
    if (st) return dt_error(st, "%s: %s", where, dt_last_error());
    if (sys) st = put_str(s, tok, sys, 0);
    for (*k = 0; sys && *k < used; (*k)++) *m = (*m)->next; /* written in it */
    free(sys);
    return st;
}

/* A tool's result, unscored. */
static dt_status tool_result(const cJSON *msgs, const cJSON *m, int k, const dt_chat_template *t, dt_bpe *tok, const char *where, seq *s) {
    char *text = NULL;
    dt_status st = dt_chat_tool_result(t, msgs, m, k, &text);
    if (st) return dt_error(st, "%s: %s", where, dt_last_error());
    st = put_str(s, tok, text, 0);
    free(text);
    return st;
}

/* Where a list of messages sits in a conversation that the template renders as for generation (TRL's prompts and
 * completions, DPO's pairs: Qwen 3's think blocks by dt_chat_prompt_block): its first message's index, the
 * conversation's messages and its last query; n 0: as the training form renders a chat (every answer's block). */
typedef struct {
    int at, n, last_query;
} turns_at;

/* msgs' turns by the template's pieces (chat_template.c; tool calls and results by chat_tools.c), after its beginning
 * and its own system turn (with tools, where given) when first: each head unscored, with score an assistant's content
 * (its tool calls too) and end of turn scored (SFT's), else nothing; *assistants counts the assistant's turns. */
static dt_status render_turns(const cJSON *msgs, const dt_chat_kwargs *kw, const dt_chat_template *t, dt_bpe *tok, const char *where, bool first,
                              bool score, turns_at in, seq *s, int *assistants) {
    const cJSON *m = msgs->child;
    int k = 0;
    dt_status st = first ? put_str(s, tok, t->begin, 0) : DT_OK;
    if (!st && first) st = system_turn(msgs, kw, t, tok, where, s, &m, &k);
    for (; m && !st; m = m->next, k++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        bool answer = cJSON_IsString(role) && !strcmp(role->valuestring, "assistant"), calling = answer && dt_chat_has_tools(calls);
        if (!cJSON_IsString(role) || !(cJSON_IsString(content) || (calling && (!content || cJSON_IsNull(content)))))
            return dt_error(DT_ERR_IO, "%s: message %d is not {\"role\": TEXT, \"content\": TEXT}", where, k);
        const char *r = role->valuestring;
        if (!strcmp(r, "tool") && t->tools) {
            st = tool_result(msgs, m, k, t, tok, where, s);
            continue;
        }
        if (strcmp(r, "system") && strcmp(r, "user") && !answer)
            return dt_error(DT_ERR_IO, "%s: message %d's role \"%s\" is not system, user or assistant%s", where, k, r,
                            t->tools ? " (or tool)" : "");
        int scored = score && answer;
        *assistants += answer;
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        const char *c, *text0 = cJSON_IsString(content) ? content->valuestring : "";
        size_t cn;
        char *text = NULL; /* an answer as the template writes it (Qwen 3's: its think block, as TRL's training form; its calls) */
        int block = in.n ? dt_chat_prompt_block(in.at + k, in.n, in.last_query) : DT_CHAT_BLOCK;
        if (answer) st = dt_chat_answer(t, text0, cJSON_IsString(reasoning) ? reasoning->valuestring : NULL, calling ? calls : NULL,
                                        kw->builtin, k, block, &text);
        if (st) return dt_error(st, "%s: %s", where, dt_last_error());
        if (answer) c = text, cn = text ? strlen(text) : 0;
        else dt_chat_content(t, text0, &c, &cn);
        char head[96];
        snprintf(head, sizeof head, t->head, r);
        /* Qwen 2.5's training form scores the newline that ends an answer's head: it goes with the content */
        size_t hn = strlen(head), nl = answer && t->head_nl_scored && hn && head[hn - 1] == '\n';
        char *body = nl ? malloc(cn + 2) : NULL;
        if (!st && nl && body) body[0] = '\n', memcpy(body + 1, c, cn), body[cn + 1] = 0, c = body, cn++;
        if (!st && nl && !body) st = dt_error(DT_ERR_NOMEM, "sft: out of memory");
        if (!st && !(st = put(s, tok, head, hn - nl, 0)) && !(st = put(s, tok, c, cn, scored)) &&
            !(st = put_str(s, tok, dt_chat_answer_end(t, kw, calling), scored)))
            st = put_str(s, tok, t->after, scored && t->after_scored);
        free(text), free(body);
    }
    return st;
}

/* A chat: the assistant's turns scored. */
static dt_status render_chat(const cJSON *msgs, const dt_chat_kwargs *kw, dt_chat_kind chat, dt_bpe *tok, const char *where, seq *s) {
    int assistants = 0;
    dt_status st = render_turns(msgs, kw, dt_chat_template_of(chat), tok, where, true, true, (turns_at){ 0 }, s, &assistants);
    if (!st && !assistants) st = dt_error(DT_ERR_IO, "%s: no assistant message: nothing in it is scored", where);
    return st;
}

/* TRL's prompt-completion: the prompt alone and prompt + completion + end-of-text, each from the begin-of-text; the
 * completion starts at their first difference. */
static dt_status render_completion(const char *prompt, const char *completion, dt_bpe *tok, int eos, seq *s) {
    size_t np = strlen(prompt), nc = strlen(completion);
    char *all = malloc(np + nc + 1);
    if (!all) return dt_error(DT_ERR_NOMEM, "sft: out of memory");
    memcpy(all, prompt, np), memcpy(all + np, completion, nc + 1);
    seq p = { 0 };
    int bos = tok ? dt_bpe_bos(tok) : -1;
    dt_status st = bos >= 0 ? push(&p, bos, 0) : DT_OK; /* both start with it */
    if (!st && bos >= 0) st = push(s, bos, 0);
    if (!st) st = put(&p, tok, prompt, np, 0);
    if (!st) st = put(s, tok, all, np + nc, 1);
    if (!st && eos >= 0) st = push(s, eos, 1);
    size_t common = 0;
    while (!st && common < p.n && common < s->n && p.ids[common] == s->ids[common]) common++;
    for (size_t i = 0; !st && i < common; i++) s->scored[i] = 0;
    free(p.ids), free(p.scored), free(all);
    return st;
}

/* A preference pair as TRL's DPOTrainer tokenizes it: the prompt and each completion as a prompt and completion (the
 * end-of-text after each), the completions starting where the prompt and the first of the two diverge. */
static dt_status render_pair(const char *prompt, const char *chosen, const char *rejected, dt_bpe *tok, int eos, seq *c, seq *r) {
    dt_status st = render_completion(prompt, chosen, tok, eos, c);
    if (!st) st = render_completion(prompt, rejected, tok, eos, r);
    size_t pc = 0, pr = 0;
    while (pc < c->n && !c->scored[pc]) pc++;
    while (pr < r->n && !r->scored[pr]) pr++;
    size_t from = pc < pr ? pc : pr;
    for (size_t i = from; !st && i < c->n; i++) c->scored[i] = 1;
    for (size_t i = from; !st && i < r->n; i++) r->scored[i] = 1;
    return st;
}

/* A conversational prompt and completion as TRL renders them (by the template itself, as for generation): the prompt's
 * turns and the assistant's head (the generation prompt) alone, and the prompt's turns then the completion's (which,
 * what it is, for the error) into s; *from: where the two diverge, the completion's first token. */
static dt_status render_chat_completion(const cJSON *prompt, const cJSON *completion, const dt_chat_kwargs *kw, const dt_chat_template *t,
                                        dt_bpe *tok, const char *where, const char *which, seq *s, size_t *from) {
    seq p = { 0 };
    int n = 0, nc = 0, np = cJSON_GetArraySize(prompt);
    char head[96];
    snprintf(head, sizeof head, t->head, "assistant");
    cJSON *all = cJSON_Duplicate(prompt, true); /* (the conversation whole: its last query) */
    for (const cJSON *m = completion->child; all && m; m = m->next) cJSON_AddItemToArray(all, cJSON_Duplicate(m, true));
    turns_at alone = { 0, np, dt_chat_last_query(prompt) }, whole = { 0, cJSON_GetArraySize(all), all ? dt_chat_last_query(all) : 0 };
    dt_status st = all ? DT_OK : dt_error(DT_ERR_NOMEM, "sft: out of memory");
    if (!st) st = render_turns(prompt, kw, t, tok, where, true, false, alone, &p, &n);
    if (!st) st = put_str(&p, tok, head, 0);
    if (!st && t->no_think && !kw->thinking) st = put_str(&p, tok, t->no_think, 0); /* (Qwen 3's generation prompt, thinking off) */
    if (!st) st = render_turns(prompt, kw, t, tok, where, true, false, whole, s, &n);
    whole.at = np;
    if (!st) st = render_turns(completion, kw, t, tok, where, false, false, whole, s, &nc);
    cJSON_Delete(all);
    if (!st && !nc) st = dt_error(DT_ERR_IO, "%s: the %s has no assistant message", where, which);
    for (*from = 0; !st && *from < p.n && *from < s->n && p.ids[*from] == s->ids[*from]; (*from)++) {}
    free(p.ids), free(p.scored);
    return st;
}

/* A conversational pair as TRL's DPOTrainer renders it: each completion after the prompt (render_chat_completion),
 * scored from where the prompt and the first of the two diverge (its turns whole: content, end of turn, what follows). */
static dt_status render_chat_pair(const cJSON *prompt, const cJSON *chosen, const cJSON *rejected, const dt_chat_kwargs *kw, dt_chat_kind chat,
                                  dt_bpe *tok, const char *where, seq *c, seq *r) {
    const dt_chat_template *t = dt_chat_template_of(chat);
    size_t pc = 0, pr = 0;
    dt_status st = render_chat_completion(prompt, chosen, kw, t, tok, where, "chosen", c, &pc);
    if (!st) st = render_chat_completion(prompt, rejected, kw, t, tok, where, "rejected", r, &pr);
    size_t from = pc < pr ? pc : pr;
    for (size_t i = from; !st && i < c->n; i++) c->scored[i] = 1;
    for (size_t i = from; !st && i < r->n; i++) r->scored[i] = 1;
    return st;
}

/* A conversational prompt and completion for SFT: as TRL's SFTTrainer scores it by default (completion_only_loss), every
 * token from where the prompt's generation prompt and prompt + completion diverge. */
static dt_status render_chat_example(const cJSON *prompt, const cJSON *completion, const dt_chat_kwargs *kw, dt_chat_kind chat, dt_bpe *tok,
                                     const char *where, seq *s) {
    if (!tok || chat == DT_CHAT_NONE)
        return dt_error(DT_ERR_ARG, "%s: a conversational prompt and completion need a tokenizer and a chat template (its "
                        "tokenizer_config.json's, or --chat-template KIND)", where);
    size_t from = 0;
    dt_status st = render_chat_completion(prompt, completion, kw, dt_chat_template_of(chat), tok, where, "completion", s, &from);
    for (size_t i = 0; !st && i < s->n; i++) s->scored[i] = i >= from;
    return st;
}

/* items [a, b) of array x, copied. */
static cJSON *turns_of(const cJSON *x, int a, int b) {
    cJSON *o = cJSON_CreateArray();
    for (int i = a; o && i < b; i++) cJSON_AddItemToArray(o, cJSON_Duplicate(cJSON_GetArrayItem(x, i), true));
    return o;
}

/* TRL's extract_prompt: a pair without "prompt" holds it at the start of both completions (HH-RLHF's form): the
 * longest common prefix of the two texts (a space before the split going with the completions) or of their turns,
 * which j then holds as "prompt", the rest as "chosen" and "rejected". Python's loop is kept: when one completion
 * starts with the whole other, the prompt stops one short of it. */
static dt_status extract_prompt(cJSON *j, const char *where) {
    cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "chosen"), *rj = cJSON_GetObjectItemCaseSensitive(j, "rejected");
    bool text = cJSON_IsString(ch) && cJSON_IsString(rj), turns = cJSON_IsArray(ch) && cJSON_IsArray(rj);
    if (!text && !turns) return DT_OK; /* the pair's own check says what is wrong */
    int nc = text ? (int)strlen(ch->valuestring) : cJSON_GetArraySize(ch), nr = text ? (int)strlen(rj->valuestring) : cJSON_GetArraySize(rj);
    int n = nc < nr ? nc : nr, k = 0;
    bool differ = false;
    for (k = 0; k < n && !differ; k++)
        differ = text ? ch->valuestring[k] != rj->valuestring[k] : !cJSON_Compare(cJSON_GetArrayItem(ch, k), cJSON_GetArrayItem(rj, k), true);
    k = differ ? k - 1 : n > 0 ? n - 1 : 0;
    if (differ && text && k > 0 && ch->valuestring[k - 1] == ' ') k--;
    cJSON *p, *c, *r;
    if (text) {
        char *head = strndup(ch->valuestring, (size_t)k);
        p = head ? cJSON_CreateString(head) : NULL, c = cJSON_CreateString(ch->valuestring + k), r = cJSON_CreateString(rj->valuestring + k);
        free(head);
    } else {
        p = turns_of(ch, 0, k), c = turns_of(ch, k, nc), r = turns_of(rj, k, nr);
    }
    if (!p || !c || !r || !cJSON_AddItemToObject(j, "prompt", p)) {
        cJSON_Delete(p), cJSON_Delete(c), cJSON_Delete(r);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", where);
    }
    cJSON_ReplaceItemInObjectCaseSensitive(j, "chosen", c);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "rejected", r);
    return DT_OK;
}

/* The example in s as a row: inputs ids[0..T), targets ids[1..T] where scored (else DT_IGNORE_INDEX); padding after. */
static dt_status add_row(dt_sft *d, const seq *s) {
    if (d->nrows == d->cap) {
        size_t c = d->cap ? 2 * d->cap : 64, T = (size_t)d->T;
        int32_t *in = realloc(d->inputs, c * T * sizeof *in);
        if (in) d->inputs = in;
        int32_t *tg = in ? realloc(d->targets, c * T * sizeof *tg) : NULL;
        if (tg) d->targets = tg;
        size_t *sc = tg ? realloc(d->scored, c * sizeof *sc) : NULL;
        if (sc) d->scored = sc;
        int *ln = sc ? realloc(d->len, c * sizeof *ln) : NULL;
        if (!ln) return dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu examples", d->path, c);
        d->len = ln, d->cap = c;
    }
    int32_t *in = d->inputs + d->nrows * (size_t)d->T, *tg = d->targets + d->nrows * (size_t)d->T;
    size_t n = 0;
    if (s->n > (size_t)d->T + 1) d->truncated++;
    for (int t = 0; t < d->T; t++) {
        bool real = (size_t)t + 1 < s->n;
        in[t] = (size_t)t < s->n ? s->ids[t] : 0;
        tg[t] = real && s->scored[t + 1] ? s->ids[t + 1] : DT_IGNORE_INDEX;
        n += tg[t] >= 0;
    }
    d->len[d->nrows] = s->n > (size_t)d->T + 1 ? d->T + 1 : (int)s->n;
    d->scored[d->nrows++] = n;
    return DT_OK;
}

static dt_status example(dt_sft *d, const char *line, size_t lineno, dt_bpe *tok, dt_chat_kind chat, int eos) {
    char where[600];
    snprintf(where, sizeof where, "%s:%zu", d->path, lineno);
    cJSON *j = NULL;
    dt_status pst = dt_json_parse_line(line, where, &j);
    if (pst) return pst;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages"), *p = cJSON_GetObjectItemCaseSensitive(j, "prompt"),
                *c = cJSON_GetObjectItemCaseSensitive(j, "completion"), *ch = cJSON_GetObjectItemCaseSensitive(j, "chosen"),
                *rj = cJSON_GetObjectItemCaseSensitive(j, "rejected");
    cJSON *parsed = NULL;
    bool bad_tools;
    const cJSON *tools = dt_chat_line_tools(j, &parsed, &bad_tools), *kwargs = cJSON_GetObjectItemCaseSensitive(j, "chat_template_kwargs");
    dt_chat_kwargs kw; /* the line's chat_template_kwargs (TRL's per-example ones) and tools */
    seq s = { 0 }, s2 = { 0 };
    int pair = ch || rj;
    dt_status st = dt_chat_kwargs_read(kwargs, &kw);
    if (st) st = dt_error(st, "%s: \"chat_template_kwargs\" %s", where, dt_last_error());
    else if (chat != DT_CHAT_NONE && (st = dt_chat_builtin_check(dt_chat_template_of(chat), &kw))) st = dt_error(st, "%s: %s", where, dt_last_error());
    kw.tools = tools;
    if (!st && pair && !p) st = extract_prompt(j, where);
    if (pair && !p) /* the pair as extract_prompt left it */
        p = cJSON_GetObjectItemCaseSensitive(j, "prompt"), ch = cJSON_GetObjectItemCaseSensitive(j, "chosen"),
        rj = cJSON_GetObjectItemCaseSensitive(j, "rejected");
    bool chats = cJSON_IsArray(msgs) || cJSON_IsArray(p);
    if (st) {
    } else if (bad_tools || (tools && !chats)) {
        st = dt_error(DT_ERR_IO, "%s: \"tools\" is a list of the tools a chat's messages may call ({\"type\": \"function\", \"function\": "
                      "{...}}, or the list's JSON text), beside \"messages\" or a conversational pair", where);
    } else if (kwargs && !cJSON_IsNull(kwargs) && !chats) {
        st = dt_error(DT_ERR_IO, "%s: \"chat_template_kwargs\" go to a chat template: beside \"messages\" or conversational prompts", where);
    } else if (d->pairs >= 0 && pair != d->pairs) {
        st = dt_error(DT_ERR_IO, "%s: %s, but the lines before are %s: a file holds one kind", where, pair ? "a preference pair" : "an example",
                      pair ? "examples (chats, prompts and completions)" : "preference pairs");
    } else if (pair && cJSON_IsArray(p) && cJSON_IsArray(ch) && cJSON_IsArray(rj)) {
        st = !tok || chat == DT_CHAT_NONE ? dt_error(DT_ERR_ARG, "%s: a conversational pair needs a tokenizer and a chat template (its "
                                                     "tokenizer_config.json's, or --chat-template KIND)", where)
                                          : render_chat_pair(p, ch, rj, &kw, chat, tok, where, &s, &s2);
    } else if (pair) {
        st = !cJSON_IsString(p) || !cJSON_IsString(ch) || !cJSON_IsString(rj)
               ? dt_error(DT_ERR_IO, "%s: a preference pair is {\"prompt\": TEXT, \"chosen\": TEXT, \"rejected\": TEXT}, or the three as "
                          "lists of messages (conversational)", where)
               : render_pair(p->valuestring, ch->valuestring, rj->valuestring, tok, eos, &s, &s2);
    } else if (cJSON_IsArray(msgs)) {
        st = !tok ? dt_error(DT_ERR_ARG, "%s: chat messages need a tokenizer with the template's special tokens (a byte-level model takes "
                             "prompts and completions)", where)
           : chat == DT_CHAT_NONE ? dt_error(DT_ERR_ARG, "%s: chat messages need a chat template: the tokenizer's tokenizer_config.json's, "
                                             "or --chat-template KIND", where)
                                  : render_chat(msgs, &kw, chat, tok, where, &s);
    } else if (cJSON_IsString(p) && cJSON_IsString(c)) {
        st = render_completion(p->valuestring, c->valuestring, tok, eos, &s);
    } else if (cJSON_IsArray(p) && cJSON_IsArray(c)) {
        st = render_chat_example(p, c, &kw, chat, tok, where, &s);
    } else {
        st = dt_error(DT_ERR_IO, "%s: neither \"messages\" (a list) nor \"prompt\" and \"completion\" (texts, or lists of messages)", where);
    }
    if (!st) st = add_row(d, &s);
    if (!st && pair) st = add_row(d, &s2);
    if (!st) d->pairs = pair;
    free(s.ids), free(s.scored), free(s2.ids), free(s2.scored);
    cJSON_Delete(j), cJSON_Delete(parsed);
    return st;
}

/* Each non-blank line of text an example (or a pair). */
static dt_status parse(dt_sft *d, char *text, dt_bpe *tok, dt_chat_kind chat, int eos) {
    size_t lineno = 0;
    dt_status st = DT_OK;
    for (char *line = text, *next; !st && line && *line; line = next) {
        lineno++;
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        size_t k = strlen(line);
        while (k && isspace((unsigned char)line[k - 1])) line[--k] = 0;
        if (k) st = example(d, line, lineno, tok, chat, eos);
    }
    return st;
}

dt_status dt_sft_load(const char *path, dt_bpe *tok, dt_chat_kind chat, int eos, int T, dt_sft **out) {
    *out = NULL;
    if (T < 1) return dt_error(DT_ERR_ARG, "%s: a row of %d tokens", path, T);
    char *text = NULL;
    size_t len = 0;
    dt_status st = dt_file_read_lines(path, (size_t)1 << 40, &text, &len);
    if (st) return st;
    dt_sft *d = calloc(1, sizeof *d);
    if (!d) { free(text); return dt_error(DT_ERR_NOMEM, "sft: out of memory"); }
    d->T = T, d->pairs = -1;
    snprintf(d->path, sizeof d->path, "%s", path);
    /* tokenized before (by this run's other ranks, or an earlier run) with all the same: the rows from the cache */
    uint64_t key = dt_sft_cache_key(text, len, tok, chat, eos, T);
    if (!dt_sft_cache_read(key, d)) {
        st = parse(d, text, tok, chat, eos);
        if (!st && !d->nrows) st = dt_error(DT_ERR_IO, "%s: no examples", path);
        if (!st) dt_sft_cache_write(key, d);
    }
    free(text);
    if (st) { dt_sft_destroy(d); return st; }
    *out = d;
    return DT_OK;
}

bool dt_sft_cached(const dt_sft *d) { return d->cached; }

void dt_sft_destroy(dt_sft *d) {
    if (!d) return;
    free(d->inputs), free(d->targets), free(d->scored), free(d->len), free(d->pos);
    free(d);
}

size_t dt_sft_rows(const dt_sft *d) { return d->nrows; }
bool dt_sft_pairs(const dt_sft *d) { return d->pairs == 1; }
size_t dt_sft_truncated(const dt_sft *d) { return d->truncated; }
int dt_sft_seq(const dt_sft *d) { return d->T; }
const char *dt_sft_path(const dt_sft *d) { return d->path; }
size_t dt_sft_scored(const dt_sft *d, size_t row) { return d->scored[row]; }
void dt_sft_row(const dt_sft *d, size_t row, int32_t *inputs, int32_t *targets) {
    memcpy(inputs, d->inputs + row * (size_t)d->T, (size_t)d->T * sizeof *inputs);
    memcpy(targets, d->targets + row * (size_t)d->T, (size_t)d->T * sizeof *targets);
}
