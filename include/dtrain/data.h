/* dtrain data layer: token files in llm.c's format and the loader that cuts
 * them into batches, in order (as llm.c) or shuffled, with each rank of a
 * data-parallel job taking its own slice of every global batch. */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include "dtrain/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tokens dt_tokens;

/* int32 header[256] = { 20240520, 1, ntokens } + uint16 tokens, or
 * { 20240801, 7, ntokens } + uint32 tokens. */
dt_status dt_tokens_open(const char *path, dt_tokens **out);
void dt_tokens_close(dt_tokens *t);
/* The file it was read from, and its largest token. */
const char *dt_tokens_path(const dt_tokens *t);
uint32_t dt_tokens_max(const dt_tokens *t);
size_t dt_tokens_count(const dt_tokens *t);
uint32_t dt_tokens_get(const dt_tokens *t, size_t i);
/* Fails naming the file and the first token >= vocab and its offset. */
dt_status dt_tokens_check_vocab(const dt_tokens *t, int vocab);
/* Writes a token file: uint16 (version 1) when every id fits, else uint32 (version 7). */
dt_status dt_tokens_write(const char *path, const uint32_t *tokens, size_t n);

/* Byte-level BPE: GPT-2's from the encoder.json + vocab.bpe pair it is
 * distributed as, or any Hugging Face tokenizer.json of its kind (a BPE
 * model, a ByteLevel pre-tokenizer alone or after a Split by a pattern:
 * GPT-2's, Llama 3's, Qwen 2's; added tokens; an NFC normalizer).
 * Pre-tokenization matches the tokenizer's pattern with PCRE2, NFC is
 * libunistring's; the ids are the `tokenizers` library's. */
typedef struct dt_bpe dt_bpe;
/* Token ids at or above this are refused (GPT-2 has 50257). */
#define DT_BPE_MAX_VOCAB (1 << 24)
dt_status dt_bpe_load(const char *encoder_json, const char *vocab_bpe, dt_bpe **out);
/* A tokenizer.json; what it asks that this encoder does not do (a normalizer, another model or pre-tokenizer, byte
 * fallback, stripping added tokens) is an error naming the file and the field. */
dt_status dt_bpe_load_json(const char *path, dt_bpe **out);
/* The token a prompt starts with (the tokenizer's template's begin-of-text), or -1. */
int dt_bpe_bos(const dt_bpe *b);
/* What an exporter (GGUF) needs of a tokenizer: token id as its file lists it (byte-level characters; an added
 * token's content; NULL: no such id) and whether it is an added token (2 special, 1 not, 0 the vocabulary's); the
 * merges in rank order ("left right"); the pre-tokenizer's pattern (GPT-2's and Llama 3's are these). */
const char *dt_bpe_token_text(const dt_bpe *b, uint32_t id, int *added);
int dt_bpe_merge_count(const dt_bpe *b);
const char *dt_bpe_merge(const dt_bpe *b, int rank);
const char *dt_bpe_pattern(const dt_bpe *b);
/* Byte `byte` as byte-level BPE shows it (GPT-2's byte-to-character table), UTF-8 and NUL-terminated. */
void dt_bpe_byte_char(int byte, char out[3]);
extern const char *const dt_bpe_gpt2_pattern, *const dt_bpe_llama3_pattern, *const dt_bpe_qwen2_pattern;
void dt_bpe_destroy(dt_bpe *b);
int dt_bpe_vocab_size(const dt_bpe *b);
/* Appends the ids of text[0..len) to *ids (grown with realloc; *n updated). */
dt_status dt_bpe_encode(dt_bpe *b, const char *text, size_t len, uint32_t **ids, size_t *n, size_t *cap);
/* The bytes of token id (NULL if out of range), and their count. */
const char *dt_bpe_token_bytes(const dt_bpe *b, uint32_t id, size_t *len);
/* The other way: token id's text as the model's vocabulary gives it (b's bytes, or a byte-level model's byte: b
 * NULL), "<id>" for an id it has none for (in scratch); *len its bytes. */
const char *dt_token_text(const dt_bpe *b, int32_t id, char scratch[16], size_t *len);
/* A prompt's tokens as a model reads them: text's bytes (b NULL: a byte-level model's), or b's ids, with bos after its
 * begin-of-text token where it has one (a text as it is, as HF's tokenizer adds its special tokens; without: a chat
 * template's text, which writes its own, as apply_chat_template tokenizes it); *ids (freed by the caller) holds *n. */
dt_status dt_bpe_prompt(dt_bpe *b, const char *text, size_t len, bool bos, int32_t **ids, int *n);
/* The text <-> tokens of a model of vocab tokens (who: "generate", "serve", for the messages): with encoder_json,
 * GPT-2's BPE pair (with vocab_bpe) or a tokenizer.json (vocab_bpe NULL), refused if it has more tokens than the
 * model; without it, model's own tokenizer.json where model is a folder that has one, else bytes (*out NULL),
 * refused below min_bytes tokens (256; a caller that refuses each text's bytes beyond the vocabulary may take fewer),
 * and said (where say) when the model has other than 256, whose tokens from 256 up print as <id>. */
dt_status dt_bpe_for_model(const char *encoder_json, const char *vocab_bpe, int vocab, int min_bytes, const char *model,
                           const char *who, bool say, dt_bpe **out);

/* Supervised fine-tuning data (data/sft.c; tok NULL: a byte-level model's bytes, prompts and completions only): a JSONL file of chats ({"messages": [{"role", "content"}, ...]}) or
 * prompts and completions ({"prompt", "completion"}: texts, or lists of messages), one example a row of T inputs and T targets, the targets not
 * scored (prompts, the user's and system's turns, padding) DT_IGNORE_INDEX, as TRL's SFTTrainer scores them; chats
 * rendered by a chat template of the documented subset (chat_template.c), prompts and completions as TRL tokenizes
 * them (eos: the end-of-text id appended to a completion, -1: none). Bad lines are refused naming the file and line. */
typedef enum {
    DT_CHAT_NONE = 0, DT_CHAT_CHATML, DT_CHAT_LLAMA3, DT_CHAT_QWEN3, DT_CHAT_QWEN25, DT_CHAT_LLAMA31, DT_CHAT_LLAMA32, DT_CHAT_QWEN2,
    DT_CHAT_SMOLLM2
} dt_chat_kind;
dt_status dt_chat_kind_parse(const char *name, dt_chat_kind *out);
/* Which of the subset a tokenizer_config.json's Jinja chat_template is (by its markers), or an error naming where. */
dt_status dt_chat_kind_of_template(const char *jinja, const char *where, dt_chat_kind *out);
/* A template's name and pieces (data/chat_template.c): its --chat-template name and the server's; the text before the
 * first message; a turn's head (printf's %s: the role); the end of a turn (an answer ends with it); what follows that;
 * Qwen 3's empty think block (NULL: the template has none), which a generation prompt ends with when thinking is off;
 * the system turn's text written where a chat has none (NULL: none); the text every system turn opens with (Llama
 * 3.1's, printf's %s: the date; NULL: none), the date it names where none is given (the template's own) and whether
 * the server's date is today's (Llama 3.2's); whether a content
 * is trimmed; whether training scores what follows an answer's end (TRL's training forms of Qwen's templates do), and
 * the newline that ends an answer's head (Qwen 2.5's); which tool calls it renders (DT_CHAT_TOOLS_HERMES, Qwen 2.5's
 * and 3's: the tools in its system turn, an answer's calls as <tool_call> JSON, the tools' results as <tool_response>
 * in a user turn; DT_CHAT_TOOLS_JSON, Llama 3.1's and 3.2's: the tools in the first user message, or the system turn,
 * an answer's one call as a JSON object, a tool's result in an ipython turn; 0: none); whether it takes built-in
 * tools (Llama 3.1's builtin_tools: named in its system turn, called as <|python_tag|>NAME.call(ARG="VALUE"), an answer
 * that calls ending with <|eom_id|>). */
enum { DT_CHAT_TOOLS_HERMES = 1, DT_CHAT_TOOLS_JSON };
typedef struct {
    const char *kind, *name;
    const char *begin, *head, *end, *after, *no_think, *default_system, *preamble, *date;
    int today, trim, after_scored, head_nl_scored, tools, builtin;
} dt_chat_template;
const dt_chat_template *dt_chat_template_of(dt_chat_kind k);
/* A message's content as the template writes it ([*start, *start + *n) of c). */
void dt_chat_content(const dt_chat_template *t, const char *c, const char **start, size_t *n);
/* An assistant's answer (message i) as t writes it, into *out (the caller frees): its content, trimmed where t trims;
 * in Qwen 3's (t->no_think set) the reasoning (given, or the content's part before "</think>", after "<think>") taken
 * out of the content and, where block is DT_CHAT_BLOCK or DT_CHAT_BLOCK_IF_REASONING with a reasoning, written before
 * it as "<think>\nREASONING\n</think>\n\n"; then its tool calls (calls: OpenAI's tool_calls; NULL or empty: none;
 * dt_chat_tool_calls; builtin: Llama 3.1's built-in tools' names, NULL: none given). */
enum { DT_CHAT_NO_BLOCK, DT_CHAT_BLOCK, DT_CHAT_BLOCK_IF_REASONING };
struct cJSON;
dt_status dt_chat_answer(const dt_chat_template *t, const char *content, const char *reasoning, const struct cJSON *calls,
                         const struct cJSON *builtin, int i, int block, char **out);
/* What a generation prompt may be asked (chat_template_kwargs, as vLLM's server and TRL take them): whether a thinking
 * model thinks (Qwen 3's enable_thinking, true unless said) and the date a dated system turn names (Llama 3.1's
 * date_string; NULL: the template's own, which training writes; the server gives Llama 3.2's today's); and the tools
 * a model may call (a request's "tools", OpenAI's {"type": "function", "function": {...}} objects; NULL: none), and
 * whether Llama 3.1's tools go in its system turn (tools_in_user_message false; else in the first user message); and
 * whether a prompt's earlier answers are written as the template's training form writes them (Qwen 3's: each with its
 * think block, where generation drops those before the last query; TRL's GRPO renders prompts so where tools run, as
 * it needs a template that keeps a conversation's prefix); Llama 3.1's builtin_tools (a list of names, NULL: not
 * given). */
typedef struct {
    bool thinking;
    const char *date;
    const struct cJSON *tools;
    bool tools_in_system;
    bool training;
    const struct cJSON *builtin;
} dt_chat_kwargs;
/* What ends an answer's turn: t's end, or with built-in tools given (kw->builtin) an answer that calls <|eom_id|>
 * (Llama 3.1's: the model goes on after the results); an error where kw names built-in tools t has none of. */
const char *dt_chat_answer_end(const dt_chat_template *t, const dt_chat_kwargs *kw, bool calling);
dt_status dt_chat_builtin_check(const dt_chat_template *t, const dt_chat_kwargs *kw);
/* Tool calls in a template (data/chat_tools.c: Qwen's; chat_tools_json.c: Llama 3.1's). Whether a request's or an
 * example's tools are any (a non-empty array); an error naming what where t renders no tool calls; the turns that
 * hold kw->tools, written before a chat's messages (Qwen's: the system turn, the chat's system message or t's default
 * text before them; Llama's: its dated system turn and the first user message with them, or with
 * kw->tools_in_system the tools in the system turn) into *out (the caller frees), *used the leading messages written
 * in them; an answer's calls (message i's; content: the answer's content, after which a newline goes before the
 * first; Llama's: the one call alone, its content left out as the template leaves it) appended to a growing text as
 * dt_chat_append, each call's arguments an object or its JSON text (written as the object, as vLLM passes them); a
 * tool's result (m, of messages: consecutive ones share a user turn in Qwen's) into *out. */
bool dt_chat_has_tools(const struct cJSON *tools);
/* A data set line's "tools" (a list, or its JSON text as data sets keep it, which TRL reads too; *parsed: the list
 * parsed from that text, which the caller deletes): NULL where it has none (or null), *bad where it holds another. */
const struct cJSON *dt_chat_line_tools(const struct cJSON *line, struct cJSON **parsed, bool *bad);
dt_status dt_chat_tools_check(const dt_chat_template *t, const char *what);
dt_status dt_chat_tools_turn(const dt_chat_template *t, const struct cJSON *messages, const dt_chat_kwargs *kw, char **out, int *used);
dt_status dt_chat_tool_calls(const dt_chat_template *t, const char *content, const struct cJSON *calls, const struct cJSON *builtin, int i,
                             char **buf, size_t *len, size_t *cap);
dt_status dt_chat_tool_result(const dt_chat_template *t, const struct cJSON *messages, const struct cJSON *m, int i, char **out);
/* What follows an answer's end of turn when its calls have run, as TRL's GRPOTrainer appends it: what t writes after
 * an end of turn, the results (results: {"role": "tool", "content"} messages) as t writes them, and the assistant's
 * head again (with Qwen 3's empty think block where kw says no thinking), into *out (the caller frees). */
dt_status dt_chat_tool_suffix(const dt_chat_template *t, const struct cJSON *results, const dt_chat_kwargs *kw, char **out);
/* An answer's tool calls as the model wrote them in t's form (form: dt_chat_template.tools; data/chat_calls.c: Qwen's
 * <tool_call> blocks as vLLM's hermes parser reads them, Llama 3.1's JSON calls as its llama3_json parser reads a
 * stream): a JSON array of {"name", "arguments"} (the caller deletes it), *content the bytes of text before them; NULL
 * (and *content n) where the answer makes none. Of an answer's first n bytes (a stream's so far), those that can go
 * out as text before any call: Qwen's up to its first "<tool_call>" and short of an end that could begin one; Llama's
 * none where it opens as a call (or may yet). */
struct cJSON *dt_chat_calls_read(int form, const char *text, size_t n, size_t *content);
size_t dt_chat_calls_text(int form, const char *text, size_t n);
/* The think block an assistant message at index i of n gets when a prompt is rendered for generation (Qwen 3's
 * original template: after the last user query, the last message always, an earlier one where it has a reasoning;
 * last_query: dt_chat_last_query's). */
int dt_chat_prompt_block(int i, int n, int last_query);
/* The system turn t writes before a chat's messages, whole (its head, content, end and what follows) into *out (the
 * caller frees; NULL: none, the messages as they are): with a preamble (Llama 3.1's) always, the preamble with kw's
 * date (NULL: the template's own, as training renders it; at most 63 bytes), after kw's built-in tools where given,
 * and the chat's system message (system: the first message's content where its role is system, NULL where not),
 * which the caller then does not write again; else t's default system text where system is NULL. */
dt_status dt_chat_system_turn(const dt_chat_template *t, const char *system, const dt_chat_kwargs *kw, char **out);
/* Today's date as Llama 3.2's template writes it (strftime's "%d %b %Y", local time) into buf. */
void dt_chat_today(char buf[32]);
struct cJSON;
/* A chat's messages ({"role": system, developer, user, assistant or tool, "content": a text or text parts}; an
 * assistant's reasoning_content and tool_calls, OpenAI's {"function": {"name", "arguments"}} with the arguments an
 * object or its JSON text, written as an object as vLLM passes them) as the prompt a model answers, by template t
 * (data/chat_prompt.c): its beginning, its own system turn (with the tools, where t renders them), each message, the
 * assistant's head last; into *out (the caller frees), *len its bytes. Bad messages are refused naming the message;
 * tools, a tool's message or an answer's calls where t renders none are refused. */
dt_status dt_chat_prompt(const dt_chat_template *t, const struct cJSON *messages, const dt_chat_kwargs *kw, char **out, size_t *len);
/* chat_template_kwargs o (an object; NULL or null: none) into *kw: enable_thinking (true or false), date_string (a
 * text of at most 63 bytes, kw->date pointing into o), tools_in_user_message (true or false) and builtin_tools (a list
 * of names, kw->builtin pointing into o); anything else is an error saying what it holds. */
dt_status dt_chat_kwargs_read(const struct cJSON *o, dt_chat_kwargs *kw);
/* A JSON value as a template's tojson writes it (Python's json.dumps: ", " and ": " between, text beyond ASCII as it
 * is), appended to a growing text as dt_chat_append (data/chat_tojson.c). */
dt_status dt_chat_tojson(const struct cJSON *v, char **buf, size_t *len, size_t *cap);
/* The same as json.dumps(indent=indent) writes it: each item on its own line, "," and ": " between. */
dt_status dt_chat_tojson_indent(const struct cJSON *v, int indent, char **buf, size_t *len, size_t *cap);
/* v on one line with "," and ":" between, as cJSON_PrintUnformatted writes it, but its numbers as the above (a float
 * stays one: 2.0, not 2) and its text unescaped as json.dumps(ensure_ascii=False); NULL when out of memory. */
char *dt_json_print_compact(const struct cJSON *v);
/* A message's content as one text (a string, or {"type": "text", "text"} parts joined; message i, for the error)
 * appended to a growing text (*buf of *len bytes, room for *cap, NUL-terminated), and any bytes so. */
dt_status dt_chat_message_text(const struct cJSON *content, int i, char **buf, size_t *len, size_t *cap);
dt_status dt_chat_append(char **buf, size_t *len, size_t *cap, const char *a, size_t n);
/* The index of messages' last user query (a user message whose text is not a <tool_response>), or the last index. */
int dt_chat_last_query(const struct cJSON *messages);
/* tokenizer_config.json beside tokenizer_json (none: nothing changes): its chat_template's kind into *chat where that
 * is DT_CHAT_NONE (chat NULL: not asked), its eos_token's id (tok's; eos NULL: not asked), its chat_template's text
 * (the "default" one of a list of named ones) into *jinja (the caller frees; jinja NULL: not asked). A template of a
 * kind this build cannot render is DT_ERR_UNSUPPORTED with the rest read. */
dt_status dt_tokenizer_config_read(const char *tokenizer_json, dt_bpe *tok, dt_chat_kind *chat, int *eos, char **jinja);
#define DT_MAX_ENDS 8
/* The tokens that end a completion (token_ends.c): the end of text and a model folder's generation_config.json's
 * other eos_token_id. */
typedef struct {
    int32_t ids[DT_MAX_ENDS];
    int n;
} dt_token_ends;
/* eot (-1: none) and model's generation_config.json's eos_token_id (an id or a list; no such file, or model NULL or a
 * file: none) into *e. A file that is not JSON, an id outside the vocabulary or more than DT_MAX_ENDS ids: an error
 * naming it. */
dt_status dt_token_ends_read(const char *model, int vocab, int eot, dt_token_ends *e);
/* Whether token ends a completion. */
bool dt_token_ends_has(const dt_token_ends *e, int32_t token);
typedef struct dt_sft dt_sft;
dt_status dt_sft_load(const char *path, dt_bpe *tok, dt_chat_kind chat, int eos, int T, dt_sft **out);
/* Whether the rows came from the cache: the file tokenized before with the same tokenizer, template, end-of-text and
 * T (${XDG_CACHE_HOME:-~/.cache}/dtrain/sft; sft_cache.c). */
bool dt_sft_cached(const dt_sft *d);
void dt_sft_destroy(dt_sft *d);
size_t dt_sft_rows(const dt_sft *d);
int dt_sft_seq(const dt_sft *d);
const char *dt_sft_path(const dt_sft *d);
/* Preference pairs ({"prompt", "chosen", "rejected"}: texts, each completion followed by the end-of-text, or lists of
 * messages rendered by the chat template, the prompt's with the assistant's head after; as TRL's DPOTrainer tokenizes
 * them, each completion scored from where the prompt and either one diverge; without "prompt", the prompt is the
 * start both share, as TRL's extract_prompt takes it): a pair makes rows 2i (chosen) and 2i + 1 (rejected). A file
 * holds pairs or examples, not both. */
bool dt_sft_pairs(const dt_sft *d);
/* Packing (TRL's SFTTrainer with packing=True, strategy "bfd"): the examples, cut at T tokens, binned best-fit
 * decreasing into rows of T, each example's tokens from position 0 (dt_sft_row_positions; a packed row's attention
 * stays inside each example: dt_program_set_positions), an example's last token predicting nothing, the padding a
 * document of its own. Preference pairs are refused. */
dt_status dt_sft_pack(dt_sft *d);
bool dt_sft_packed(const dt_sft *d);
void dt_sft_row_positions(const dt_sft *d, size_t row, int32_t *pos);
/* Examples longer than T + 1 tokens, cut there; row's scored targets; row's inputs and targets (T each). */
size_t dt_sft_truncated(const dt_sft *d);
size_t dt_sft_scored(const dt_sft *d, size_t row);
void dt_sft_row(const dt_sft *d, size_t row, int32_t *inputs, int32_t *targets);

typedef struct dt_loader dt_loader;
/* Batches of B x T (+1 for the targets) for rank `rank` of `nranks`.
 * seed 0 reads batches in file order, wrapping at the end; otherwise the
 * order of global batches is shuffled each epoch, or (rows) each global
 * batch's N x B rows of T are drawn from across the file, a new draw each
 * epoch (every row once an epoch but the last few, which the batches do not fill). */
dt_status dt_loader_create(const dt_tokens *t, int B, int T, int rank, int nranks, uint64_t seed, bool rows, dt_loader **out);
/* The same over an SFT file's rows: global batch i is rows [i*N*B, (i+1)*N*B), rank r's B of them from i*N*B + r*B. */
dt_status dt_loader_create_rows(const dt_sft *d, int B, int rank, int nranks, uint64_t seed, dt_loader **out);
/* The scored targets of the next n global batches, every rank's (rows: what a step's loss divides by; a token
 * file's: all of them). */
size_t dt_loader_scored(dt_loader *l, int n);
void dt_loader_destroy(dt_loader *l);
void dt_loader_next(dt_loader *l, int32_t *inputs, int32_t *targets);
/* The first of the B rows the last dt_loader_next gave, among the global rows (an SFT file's rows; a token file's
 * sequences of T, in its order of batches). */
size_t dt_loader_last_row(const dt_loader *l);
/* A key for each of the last batch's B rows: its place among the global rows of every epoch so far, mixed with seed
 * (what dropout draws from: dt_program_set_row_keys). The same global batch on any number of ranks, the same keys. */
void dt_loader_row_keys(const dt_loader *l, uint64_t seed, uint64_t *keys);
const dt_sft *dt_loader_rows(const dt_loader *l); /* the rows it reads (NULL: a token file) */
/* The last batch's positions, B x T (packed rows: each example's from 0; else 0..T-1 a row). */
void dt_loader_positions(const dt_loader *l, int32_t *pos);
void dt_loader_reset(dt_loader *l);
size_t dt_loader_batches(const dt_loader *l); /* global batches per epoch */
/* Where the loader is, for checkpoints: the pass over the file (it reshuffles
 * each one) and the next global batch of it; seek goes back there. */
void dt_loader_position(const dt_loader *l, uint64_t *epoch, size_t *next);
dt_status dt_loader_seek(dt_loader *l, uint64_t epoch, size_t next);

/* IDX files (MNIST's format), gzip-compressed or plain: unsigned bytes
 * with 1 to 3 dimensions. */
typedef struct { uint8_t *data; int ndim; int dims[3]; size_t count; } dt_idx;
dt_status dt_idx_load(const char *path, dt_idx *out);
void dt_idx_free(dt_idx *x);

/* An image classification set: n images of dim = channels x rows x cols
 * values (IDX files: one channel, scaled to [0, 1]), labels 0..classes-1. */
typedef struct { float *x; int32_t *y; int n, dim, channels, rows, cols, classes; } dt_images;
/* DIR/PREFIX-images-idx3-ubyte.gz and DIR/PREFIX-labels-idx1-ubyte.gz
 * (PREFIX train or t10k, as MNIST and Fashion-MNIST name them). */
dt_status dt_images_load(const char *dir, const char *prefix, dt_images *out);
void dt_images_free(dt_images *s);

#ifdef __cplusplus
}
#endif
#endif
