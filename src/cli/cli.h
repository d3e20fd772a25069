/* The dtrain command's subcommands: argument parsing only. */
#ifndef DT_CLI_H
#define DT_CLI_H

int dt_cli_launch(int argc, char **argv);
int dt_cli_bench(int argc, char **argv);
int dt_cli_train(int argc, char **argv);
int dt_cli_tokenize(int argc, char **argv);
int dt_cli_generate(int argc, char **argv);
int dt_cli_plot(int argc, char **argv);

#endif
