/* What the checkpoint files share (checkpoint_write.c, checkpoint_read.c,
 * checkpoint_describe.c; resume_settings.c reads the run's settings with them). */
#ifndef DT_CHECKPOINT_INTERNAL_H
#define DT_CHECKPOINT_INTERNAL_H

#include "dtrain/base.h"
#include "dtrain/model.h"
#include "dtrain/program.h"
#include "dtrain/train.h"
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>

#define FORMAT "dtrain-checkpoint"
#define VERSION 3 /* 2: optim.f32 hashed in pieces (one per rank of a sharded save); 3: params.f32 too (ZeRO-3); 1, 2 are read too */

/* The manifest's names of GPT-2's shape, in dt_checkpoint_model's order. */
/* A language model's shape in a manifest: GPT-2's six integers, then (other families) five more and five numbers. */
extern const char *const dt_ckpt_lm_shape[22], *const dt_ckpt_lm_numbers[9];
/* [off, off + n) of this rank's store, in each of nb buffers holding just
 * that range, written to (write 1) or read from a file in the whole
 * model's layout (buffer b at b * global parameters): the table's runs. */
dt_status dt_ckpt_file_runs(const char *path, int write, const dt_model *m, float *const *bufs, int nb, size_t off, size_t n);
/* The same for a slice of several runs of the store (dt_engine_runs), the buffers holding them side by side. */
dt_status dt_ckpt_file_slice(const char *path, int write, const dt_model *m, float *const *bufs, int nb, const dt_store_range *rg, int nrg);
/* The manifest's model.lora (a LoRA run's adapters): *found, and then *out, its targets copied into targets[cap]; an
 * error naming the file where it is malformed. */
dt_status dt_ckpt_manifest_lora(const cJSON *j, const char *mpath, bool *found, dt_lora_config *out, char *targets, size_t cap);
/* The manifest's GPT-2 shape, checked. */
dt_status dt_ckpt_manifest_shape(const cJSON *j, const char *mpath, dt_gpt2_config *g);

/* dir's latest checkpoint (or dir itself, one step's folder): its folder
 * (sub) and its manifest, parsed (*out: the caller deletes it). */
dt_status dt_ckpt_open_latest(const char *dir, char sub[4400], char mpath[4500], cJSON **out);
/* manifest[section][key] (section NULL: the top level) as a number, or an error naming it. */
dt_status dt_ckpt_number(const cJSON *j, const char *section, const char *key, const char *path, double *v);
/* The same, a whole number in [0, max]. */
dt_status dt_ckpt_count(const cJSON *j, const char *section, const char *key, const char *path, double max, double *v);
/* The saved run's samples a step (micro-batch x accumulation x data-parallel ranks), 0 if the manifest lacks them. */
long dt_ckpt_global_batch(const cJSON *j);
/* A file of nb stores of nparams floats against the manifest j of step folder dir: its size and hashes, read a
 * chunk at a time (into the nb buffers into as it goes, when given). */
dt_status dt_ckpt_verify_file(const char *dir, const cJSON *j, const char *file, int nb, size_t nparams, float *const *into);
/* The steps of dir's step-N folders, newest first (at most cap); how many. */
int dt_ckpt_steps(const char *dir, int *steps, int cap);
/* Collective over w (NULL: this rank alone): whether every rank could (ok: this one's, its buffers held), before a
 * collective that a rank without them would skip, so that none waits on another's failure; the error names what
 * ("hold the codec's state to save") on every rank. */
dt_status dt_ckpt_every_rank(dt_comm *w, bool ok, const char *what);
/* A codec's state (checkpoint_codec.c): what each stage's first data-parallel rank saved (collected by
 * dt_ckpt_codec_collect, collective over w, NULL: this rank's own; *out malloc'd), the manifest's codec section and files
 * entries from them, this rank's codec.f32 (a pipeline stage's codec-stageSofP.f32) in folder tmp, and every saved one
 * of step folder dir checked against the manifest j (", FILE" appended to listed). */
typedef struct {
    int stage;
    uint64_t floats, shared, hash;
} dt_ckpt_codec_meta;
dt_status dt_ckpt_codec_collect(dt_comm *w, const dt_checkpoint_model *cm, dt_ckpt_codec_meta **out, int *n);
void dt_ckpt_codec_manifest(cJSON *j, const dt_checkpoint_model *cm, const dt_ckpt_codec_meta *pc, int n, const dt_train_config *c);
dt_status dt_ckpt_codec_write(const char *tmp, const dt_checkpoint_model *cm);
dt_status dt_ckpt_codec_verify(const char *dir, const cJSON *j, char *listed, size_t cap);
/* A line each for ckpt info. */
void dt_ckpt_codec_describe(const cJSON *j, FILE *f);
/* Second-order state units (checkpoint_units.c): what the manifest says of a saved source (every stage's, collected
 * by dt_ckpt_units_collect, collective over w, NULL: this rank's own; *out malloc'd), the manifest's units section and
 * files entries from them, and the sources this rank holds written as KEY.f32 in tmp. */
typedef struct {
    char key[48];
    int units;
    long steps;
    uint64_t floats, sizes, hash;
} dt_ckpt_units_meta;
dt_status dt_ckpt_units_collect(dt_comm *w, const dt_checkpoint_model *cm, dt_ckpt_units_meta **out, int *n);
void dt_ckpt_units_manifest(cJSON *j, const dt_ckpt_units_meta *u, int n);
dt_status dt_ckpt_units_write(const char *tmp, const dt_checkpoint_model *cm);
/* Each saved units file of step folder dir checked against the manifest j (", KEY.f32" appended to listed); a line
 * each for ckpt info. */
dt_status dt_ckpt_units_verify(const char *dir, const cJSON *j, char *listed, size_t cap);
void dt_ckpt_units_describe(const cJSON *j, FILE *f);
/* The manifest's tensor table (checkpoint_table.c): the whole model's tensors, each once, by global offset; a model in
 * parts (parts: collective over w) from every rank's own. *out malloc'd. */
typedef struct {
    char name[48], hf[96];
    int64_t unit, ndim, gshape[4], goffset;
} dt_ckpt_tensor;
dt_status dt_ckpt_table_collect(dt_comm *w, const dt_checkpoint_model *cm, bool parts, dt_ckpt_tensor **out, int *n);
/* The manifest's "tensors" array from them. */
void dt_ckpt_table_manifest(cJSON *j, const dt_ckpt_tensor *t, int n);
/* What the ranks saved beside the stores (each stage's first data-parallel rank its own) and the whole table, for rank
 * 0's manifest. */
typedef struct {
    dt_ckpt_units_meta *units;
    int nunits;
    dt_ckpt_codec_meta *codec;
    int ncodec;
    dt_ckpt_tensor *tensors;
    int ntensors;
} dt_ckpt_side;
/* One rank's slice of optim.f32: [off, off + count) of each buffer, and the hash of those ranges, buffer after buffer;
 * phash: of its slice of params.f32, where the parameters are sharded too. */
typedef struct {
    uint64_t off, count, hash, phash;
} dt_ckpt_piece;
/* What a checkpoint's manifest says (checkpoint_manifest.c): the run's settings, the model, the optimizer's and loss
 * scaler's counts, the data's place, each file's size and hash (hashes, bytes: params.f32, optim.f32, buffers.f32; the
 * ranks' pieces where the optimizer, and with params_pieces the parameters, were saved in slices), and what the ranks
 * saved beside the stores. */
typedef struct {
    const dt_train_config *c;
    int nranks;
    const char *strategy;
    const dt_checkpoint_model *cm;
    dt_optim *o;
    const dt_loss_scale *ls;
    const dt_checkpoint_position *pos;
    uint64_t hashes[3];
    size_t bytes[3];
    const dt_ckpt_piece *pieces;
    int npieces;
    bool params_pieces;
    const dt_ckpt_side *side;
} dt_ckpt_manifest_in;
cJSON *dt_ckpt_manifest(const dt_ckpt_manifest_in *in);
/* manifest[section][key] as a string, or NULL. */
const char *dt_ckpt_string(const cJSON *j, const char *section, const char *key);

#endif
