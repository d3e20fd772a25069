/* A user's program kept running over a run (--grpo-tools proc:COMMAND): lines in, as many lines out, each round
 * (cmd_proc.c). */
#ifndef DTRAIN_TRAIN_CMD_PROC_H
#define DTRAIN_TRAIN_CMD_PROC_H

#include "dtrain/base.h"

#include <stddef.h>

typedef struct dt_cmd_proc dt_cmd_proc;
/* Starts `sh -c command` with pipes to its standard input and output (its standard error is the run's); flag names
 * the setting in errors. */
dt_status dt_cmd_proc_create(const char *flag, const char *command, dt_cmd_proc **out);
/* Writes in[0..n) to it while reading its answer until it has written `lines` lines (poll: neither side waits on a
 * full pipe); *out (the caller frees, NUL-terminated) holds them, *len their bytes. A program that ends (its status
 * named), writes more than `lines` lines in a round, or says nothing for a minute (its output not flushed a line at a
 * time, say) is an error naming flag and command; the program is stopped then and later rounds fail alike. */
dt_status dt_cmd_proc_lines(dt_cmd_proc *p, const char *in, size_t n, int lines, char **out, size_t *len);
/* Closes its input (its end of work), waits a moment for it to exit, then kills it. */
void dt_cmd_proc_destroy(dt_cmd_proc *p);

#endif
