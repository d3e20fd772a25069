/* The dtrain command's subcommands: argument parsing only. */
#ifndef DT_CLI_H
#define DT_CLI_H

#include "dtrain/train.h"

/* A command's flags and what each takes, for error messages. */
typedef struct { const char *name, *value; } dt_cli_flag;
/* flag was not accepted: a known flag gets "expected <value>", an unknown one
 * the nearest known name ("did you mean --steps?"). Returns exit code 2. */
int dt_cli_flag_error(const char *cmd, const dt_cli_flag *flags, const char *flag, const char *v);
/* Parses s as a number in [lo, hi]; 0 when it is not one. */
int dt_cli_number(const char *s, double lo, double hi, double *out);
/* Finite numbers separated by commas ("0.8,0.2,1") into out: how many (at most max), 0 for anything else. */
int dt_cli_numbers(const char *s, double *out, int max);
/* A flag taking a number in [lo, hi] (whole: an integer), stored at out as kind: 'i' int, 'f' float, 'd' double,
 * 'l' int64_t, 'u' uint64_t. */
typedef struct { const char *name; double lo, hi; int whole; void *out; char kind; } dt_cli_num_flag;
/* f among the n flags of table, v its word: 1 stored, 0 not a number it takes, -1 not one of them. */
int dt_cli_number_flag(const dt_cli_num_flag *table, size_t n, const char *f, const char *v);
/* --device's value: cpu (*cuda 0), cuda (1) or cuda:N (N + 1, *named 1); 0 for anything else. */
int dt_cli_device(const char *v, int *cuda, int *named);

/* --nproc and the ranks a model is split over (split: --pp's or --tp's N, < 0 for any number of ranks; how: what they
 * are, for errors): with
 * nproc > 1 outside a job, the command line again on nproc local ranks (*launched: their exit code); inside a job,
 * *w the world. Returns 0 to go on, else an exit code. */
int dt_cli_join(const char *cmd, const char *how, double nproc, double split, char **argv, dt_comm **w, int *launched);
int dt_cli_launch(int argc, char **argv);
int dt_cli_bench(int argc, char **argv);
int dt_cli_train(int argc, char **argv);
/* train's flags into *c (cmd names the command in errors): -1 when they are good, else the exit code (0 after --help). */
int dt_cli_train_parse(int argc, char **argv, const char *cmd, dt_train_config *c);
int dt_cli_plan(int argc, char **argv);
int dt_cli_eval(int argc, char **argv); /* argv[-1] must be the program */
int dt_cli_tokenize(int argc, char **argv);
int dt_cli_generate(int argc, char **argv);
int dt_cli_serve(int argc, char **argv);
int dt_cli_plot(int argc, char **argv);
int dt_cli_report(int argc, char **argv);
int dt_cli_ckpt(int argc, char **argv);
int dt_cli_rl(int argc, char **argv);

#endif
