/* dtrain io layer: checkpoints and weight files. Every reader says which file
 * and which field or offset is wrong; every writer leaves the previous file
 * intact when it fails (temporary file, fsync, rename). */
#ifndef DTRAIN_IO_H
#define DTRAIN_IO_H

#include "dtrain/model.h"

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

/* Writes bytes to path atomically: path.tmp, fsync, rename. */
dt_status dt_file_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int nparts);

#ifdef __cplusplus
}
#endif
#endif
