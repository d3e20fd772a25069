/* What the checkpoint files share: reading a manifest (checkpoint.c holds
 * these; resume_settings.c reads the run's settings with them). */
#ifndef DT_CHECKPOINT_INTERNAL_H
#define DT_CHECKPOINT_INTERNAL_H

#include "dtrain/base.h"
#include <cjson/cJSON.h>

/* dir's latest checkpoint (or dir itself, one step's folder): its folder
 * (sub) and its manifest, parsed (*out: the caller deletes it). */
dt_status dt_ckpt_open_latest(const char *dir, char sub[4400], char mpath[4500], cJSON **out);
/* manifest[section][key] (section NULL: the top level) as a number, or an error naming it. */
dt_status dt_ckpt_number(const cJSON *j, const char *section, const char *key, const char *path, double *v);
/* The same, a whole number in [0, max]. */
dt_status dt_ckpt_count(const cJSON *j, const char *section, const char *key, const char *path, double max, double *v);
/* manifest[section][key] as a string, or NULL. */
const char *dt_ckpt_string(const cJSON *j, const char *section, const char *key);

#endif
