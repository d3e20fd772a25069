/* dtrain io layer: checkpoints and weight files. Every reader says which file
 * and which field or offset is wrong; every writer leaves the previous file
 * intact when it fails (temporary file, fsync, rename). */
#ifndef DTRAIN_IO_H
#define DTRAIN_IO_H

#include "dtrain/model.h"
#include "dtrain/program.h"

#ifdef __cplusplus
extern "C" {
#endif

/* llm.c model files: 256 int32 header (magic 20240326; version 3 = f32
 * parameters, 5 = bf16), then the parameters in llm.c's order. */
dt_status dt_llmc_read_config(const char *path, dt_gpt2_config *cfg);
dt_status dt_llmc_load(const char *path, dt_gpt2 **out);
/* Loads into an existing model, which must have the file's shape. */
dt_status dt_llmc_load_into(const char *path, dt_gpt2 *m);
dt_status dt_llmc_save(const char *path, dt_gpt2 *m);
/* Whether the file's format holds a model of this configuration (llm.c's: GPT-2 alone): an error naming the family,
 * asked before a run (its --save) as well as by the save itself. */
dt_status dt_llmc_check_family(const char *path, const dt_gpt2_config *c);

/* safetensors with Hugging Face GPT-2 names (wte.weight, h.0.attn.c_attn.weight,
 * ...; an optional "transformer." prefix is accepted, lm_head.weight and the
 * attention mask buffers are ignored). Conv1D weights are stored (in, out) as
 * HF does; wte has V rows. F32, BF16 and F16 are read. The head count is not
 * in the tensors: it comes from heads (> 0), else the file's metadata
 * ("n_head", which dt_safetensors_save writes), else a config.json beside it. */
dt_status dt_safetensors_load(const char *path, int heads, dt_gpt2 **out);
dt_status dt_safetensors_load_into(const char *path, dt_gpt2 *m);
/* dtype: DT_F32, DT_BF16 or DT_F16. */
dt_status dt_safetensors_save(const char *path, dt_gpt2 *m, dt_dtype dtype);
/* Whether path names a .safetensors file (else a weights path is llm.c's). */
int dt_safetensors_path(const char *path);
/* Likewise for a weights file of Hugging Face's names (every family that has them: not gpt2_moe). */
dt_status dt_safetensors_check_family(const char *path, const dt_gpt2_config *c);
/* A torchvision ResNet's state dict as safetensors (torchvision's names;
 * parameters and the BatchNorm running averages) into m, which has the
 * architecture: a missing tensor or one of another shape is an error
 * naming it and both shapes. F32, BF16 and F16 are read. */
dt_status dt_safetensors_load_resnet(const char *path, dt_resnet *m);
/* A Hugging Face folder: dir/config.json (GPT2Config) and dir/model.safetensors
 * (f32), which GPT2LMHeadModel.from_pretrained(dir) loads. */
dt_status dt_hf_folder_save(const char *dir, dt_gpt2 *m);
/* A tokenizer's files into an HF folder dir: tokenizer_json as dir/tokenizer.json, and the tokenizer_config.json,
 * special_tokens_map.json and generation_config.json beside it where it has them (each written atomically). */
dt_status dt_hf_tokenizer_copy(const char *tokenizer_json, const char *dir);
/* An error naming the architecture and model_type that dir/config.json gives when they are not GPT-2's (no
 * config.json, or an unreadable one: DT_OK, the weights are checked as they are read). */
dt_status dt_hf_folder_check(const char *dir);
/* A model file of either kind, told apart by its first bytes, or an HF
 * folder (its model.safetensors, the heads from its config.json). */
dt_status dt_model_load(const char *path, int heads, dt_gpt2 **out);
int dt_model_file_is_safetensors(const char *path);

/* Any safetensors file, read by tensor name: the file's tensors checked against the shape asked for (a 2-D one
 * read transposed when the file stores it [in, out]); F32, BF16 and F16 into f32, I32 into int32; the
 * metadata's string entries. Errors name the file, the tensor and both shapes. */
typedef struct dt_safetensors dt_safetensors;
dt_status dt_safetensors_open(const char *path, dt_safetensors **out);
void dt_safetensors_close(dt_safetensors *f);
int dt_safetensors_has(const dt_safetensors *f, const char *name);
dt_status dt_safetensors_read(dt_safetensors *f, const char *name, int ndim, const int *dims, int transposed, float *out);
dt_status dt_safetensors_read_i32(dt_safetensors *f, const char *name, size_t n, int32_t *out);
/* The metadata entry key (NULL: none, or not a string). */
const char *dt_safetensors_metadata(const dt_safetensors *f, const char *key);
/* A model's tensors from f by their Hugging Face names (dt_tensor_info's hf), each a whole tensor of the
 * table's shape; a vocabulary table's rows below vocab from the file's vocab rows, the padding left as it is.
 * skip (NULL: none): a tensor the model holds that the file need not (a tied head). */
dt_status dt_safetensors_read_model(dt_safetensors *f, const dt_model *m, int vocab, const char *skip);
/* Every tensor of m's table under its Hugging Face name, in the table's order (whole tensors), a vocabulary tensor's
 * first vocab rows only (HF's have no padding), as f32, bf16 or f16; written atomically. */
dt_status dt_safetensors_save_table(const char *path, const dt_model *m, int vocab, dt_dtype dtype);

/* A Hugging Face config.json's text (path names it in errors) as a model program's config: model_type llama,
 * qwen2 or gpt2; rotary settings from rope_parameters (transformers 5) or rope_theta and rope_scaling (4), the
 * default and llama3 kinds. A field missing or out of range, or a feature the families lack (attention_bias,
 * mlp_bias, another rope kind), is an error naming the file and the field. */
dt_status dt_lm_config_from_hf(const char *json, const char *path, dt_lm_config *out);

/* A Hugging Face folder (config.json; model.safetensors, or the shards model.safetensors.index.json maps each
 * tensor to) as a model program. Errors name the file and the field or tensor; nothing is written. */
dt_status dt_program_load_hf(const char *dir, dt_program **out);
/* The same as a dt_gpt2 (the interface training, checkpoints and dt_model_load use); whether dir's config.json names a
 * family the program reads from folders this way (llama, qwen2; GPT-2's folders go through dt_safetensors_load). */
dt_status dt_gpt2_load_hf(const char *dir, dt_gpt2 **out);
int dt_hf_folder_is_program(const char *dir);
/* PEFT's LoRA adapter folder (io/peft.c): dir/adapter_config.json and dir/adapter_model.safetensors. Save: a whole
 * program's adapters (dt_program_set_lora). Read config: rank, alpha, dropout and targets (joined by commas into
 * targets[cap]), refusing what this build does not run (a regular expression of targets, biases, DoRA, rsLoRA,
 * per-layer patterns), naming the field. Load: LoRA set on p (no adapters yet) from the config, its weights read (a
 * part of the model reads its own; a tensor missing or of another shape is named). */
dt_status dt_peft_save(const char *dir, dt_program *p);
dt_status dt_peft_read_config(const char *dir, dt_lora_config *out, char *targets, size_t cap);
dt_status dt_peft_load(const char *dir, dt_program *p);
/* Load, then merge into the base (dt_program_lora_merge): a plain model that decodes as base and adapters do. */
dt_status dt_peft_merge(const char *dir, dt_program *p);
/* A whole model as llama.cpp's GGUF (version 3, f32; io/gguf.c says what it holds), written atomically; its
 * vocabulary v's tokenizer (a byte-level BPE: GPT-2's, Llama 3's or Qwen 2's pattern) with its chat template (NULL:
 * none) and end-of-text id (-1: the vocabulary's, by its text), or with v NULL bytes and placeholders. */
typedef struct dt_bpe dt_bpe;
typedef struct {
    const dt_bpe *bpe;
    const char *chat_template; /* tokenizer_config.json's (Jinja), written as tokenizer.chat_template */
    int eos;                   /* tokenizer_config.json's eos_token's id */
} dt_gguf_vocab;
dt_status dt_gguf_save(const char *path, dt_gpt2 *m, const dt_gguf_vocab *v);

/* Writes bytes to path atomically: path.tmp.PID, fsync, rename; temporaries
 * that killed saves left beside path are removed first. */
dt_status dt_file_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int nparts);
/* A whole text file (NUL-terminated; *len without it may be NULL), at most max_bytes. */
dt_status dt_file_read_text(const char *path, size_t max_bytes, char **out, size_t *len);
/* The same for a file of lines (a .jsonl, a prompts file) that must hold no NUL byte: every line after one would be
 * lost to a reader of C strings, so one is refused naming its offset. */
dt_status dt_file_read_lines(const char *path, size_t max_bytes, char **out, size_t *len);
/* Whether path can be written (creates and removes a temporary beside it):
 * checked at start-up so that a long run does not learn it at the end. */
dt_status dt_file_check_writable(const char *path);
/* Whether a and b name the same existing file or directory (links and other spellings of one path included). */
int dt_file_same(const char *a, const char *b);

#ifdef __cplusplus
}
#endif
#endif
