/* A user's program run once over a batch of lines (--reward cmd:, --grpo-tools cmd:): what both protocols share; and
 * how any of the user's programs is started (--grpo-tools proc: too, cmd_proc.c). */
#ifndef DTRAIN_TRAIN_CMD_EXCHANGE_H
#define DTRAIN_TRAIN_CMD_EXCHANGE_H

#include "dtrain/base.h"

#include <stddef.h>
#include <sys/types.h>

/* Starts `sh -c command` with pipes to its standard input (*in, ours to write) and output (*out, ours to read); its
 * standard error is the run's. kind ("cmd", "proc") and flag name it in errors. */
dt_status dt_cmd_spawn(const char *flag, const char *kind, const char *command, pid_t *pid, int *in, int *out);

/* Runs `sh -c command`, writes in[0..n) to its standard input while reading its standard output to its end
 * (poll: a program that answers as it reads and one that answers at its end both work), and waits for it; *out (the
 * caller frees, NUL-terminated) holds what it wrote, *len its bytes. Its standard error is the run's. A program that
 * fails, is killed or says nothing for a minute is an error naming flag and command. */
dt_status dt_cmd_exchange(const char *flag, const char *command, const char *in, size_t n, char **out, size_t *len);

#endif
