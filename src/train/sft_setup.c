/* Supervised fine-tuning in a training run: --data FILE.jsonl (and --val-data FILE.jsonl) are chats or prompts and
 * completions (data/sft.c), tokenized with --tokenizer or the model folder's tokenizer.json, chats rendered by
 * --chat-template or the template its tokenizer_config.json names; each step's loss is the mean over the global
 * batch's scored tokens, whatever the layout (dt_program_set_loss_tokens). */
#include "run.h"
#include "dtrain/io.h"

#include <stdlib.h>
#include <string.h>

bool dt_train_is_sft(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n > 6 && !strcmp(path + n - 6, ".jsonl");
}

static dt_status open_one(run *r, dt_bpe *tok, dt_chat_kind chat, int eos, const char *path, dt_sft **out) {
    dt_status st = dt_sft_load(path, tok, chat, eos, r->c.seq, out);
    size_t examples = st ? 0 : dt_sft_rows(*out);
    if (!st && dt_sft_cached(*out) && r->rank == 0 && !r->c.quiet) printf("%s: its rows from the tokenization cache\n", path);
    if (!st && r->c.pack && !(st = dt_sft_pack(*out)) && r->rank == 0 && !r->c.quiet)
        printf("%s: %zu examples packed into %zu rows of %d tokens (best-fit decreasing; attention stays in each example)\n", path, examples,
               dt_sft_rows(*out), r->c.seq);
    if (!st && dt_sft_truncated(*out) && r->rank == 0)
        dt_log(DT_LOG_WARN, "%s: %zu of %zu examples are longer than --seq %d + 1 tokens and were cut there", path, dt_sft_truncated(*out),
               dt_sft_rows(*out), r->c.seq);
    return st;
}

dt_status dt_train_open_sft(run *r) {
    const dt_train_config *c = &r->c;
    int V = dt_gpt2_get_config(r->m)->vocab_size, eos = -1;
    dt_chat_kind chat = DT_CHAT_NONE;
    dt_bpe *tok = NULL;
    dt_status st = c->chat_template ? dt_chat_kind_parse(c->chat_template, &chat) : DT_OK;
    if (!st) st = dt_bpe_for_model(c->tokenizer, NULL, V, 256, c->model, "--data", false, &tok);
    if (!st && !tok && V != 256) /* a byte-level model reads bytes */
        st = dt_error(DT_ERR_ARG, "--data %s: chats and completions are tokenized: give --tokenizer tokenizer.json (or a --model folder "
                      "that has one)", c->data);
    if (!st && tok) {
        char found[4200];
        snprintf(found, sizeof found, "%s/tokenizer.json", c->model);
        const char *tj = c->tokenizer ? c->tokenizer : found;
        st = dt_tokenizer_config_read(tj, tok, &chat, &eos, NULL);
        if (st == DT_ERR_UNSUPPORTED) { /* prompts and completions need none; a chat line is then refused */
            if (r->rank == 0) dt_log(DT_LOG_WARN, "--data: %s", dt_last_error());
            chat = DT_CHAT_NONE, st = DT_OK;
        }
    }
    if (!st) st = open_one(r, tok, chat, eos, c->data, &r->sft);
    if (!st && c->val_data) st = open_one(r, tok, chat, eos, c->val_data, &r->sft_val);
    /* packed rows: the model reads each batch's positions (load() fills them) */
    if (!st && c->pack && !(r->pos = malloc((size_t)c->batch * c->seq * sizeof *r->pos)))
        st = dt_error(DT_ERR_NOMEM, "--pack: out of memory");
    if (!st && c->pack) st = dt_program_set_positions(dt_gpt2_program(r->m), r->pos);
    bool bytes = !tok;
    dt_bpe_destroy(tok);
    if (!st && c->shuffle_rows)
        st = dt_error(DT_ERR_ARG, "--shuffle-rows: %s's rows are whole examples (a preference pair two of them), which --shuffle "
                      "shuffles a global batch at a time; the rows of a token file are what it draws one by one", c->data);
    if (!st) st = dt_loader_create_rows(r->sft, c->batch, r->dp_rank, r->dp_size, c->shuffle_seed, &r->tl);
    if (!st && r->sft_val) st = dt_loader_create_rows(r->sft_val, c->batch, r->dp_rank, r->dp_size, 0, &r->vl);
    if (!st && r->vl && dt_loader_batches(r->vl) < (size_t)c->eval_batches) r->c.eval_batches = (int)dt_loader_batches(r->vl);
    if (!st && r->rank == 0 && !c->quiet)
        printf("supervised fine-tuning: %zu %s from %s (%s), %zu rows a global batch; the loss over the scored tokens%s\n",
               dt_sft_rows(r->sft), c->pack ? "packed rows" : "examples", c->data,
               dt_chat_template_of(chat) ? dt_chat_template_of(chat)->kind : !bytes ? "prompts and completions" : "prompts and completions, as bytes",
               (size_t)c->batch * (size_t)r->dp_size, eos >= 0 && chat == DT_CHAT_NONE ? ", a completion ends with the end-of-text token" : "");
    return st;
}

size_t dt_train_data_tokens(const run *r) {
    return r->sft ? dt_sft_rows(r->sft) * (size_t)dt_sft_seq(r->sft) : r->train ? dt_tokens_count(r->train) : 0; /* GRPO: none */
}

void dt_train_loss_tokens(run *r, dt_loader *l, int batches) {
    if (!r->sft) return;
    /* each batch's loss divides by the global count over the batches and the replicas (DP x CP): the means over both (the
     * engine's, evaluation's) then make the mean over every scored token */
    int replicas = r->mesh ? dt_comm_size(dt_mesh_replicas(r->mesh)) : 1;
    size_t n = dt_loader_scored(l, batches);
    dt_program_set_loss_tokens(dt_gpt2_program(r->m), n ? (double)n / ((double)batches * replicas) : 1);
}
