/* Commands that run over ranks (generate and serve split a model, rl splits its environments): --nproc N on one
 * machine runs the command line again per rank; in a job (those ranks,
 * mpirun's or srun's) the ranks join the world. */
#include "cli.h"

int dt_cli_join(const char *cmd, const char *how, double nproc, double split, char **argv, dt_comm **w, int *launched) {
    dt_launch_kind kind;
    *w = NULL;
    *launched = -1;
    if (dt_comm_detect_launch(&kind)) { dt_log(DT_LOG_ERROR, "%s: %s", cmd, dt_last_error()); return 2; }
    if (nproc > 1 && kind == DT_LAUNCH_NONE && split >= 0 && split != nproc) {
        dt_log(DT_LOG_ERROR, "%s: --nproc %g needs the model split %g ways: %s", cmd, nproc, nproc, how);
        return 2;
    }
    if (nproc > 1 && kind == DT_LAUNCH_NONE) { *launched = dt_comm_launch((int)nproc, argv - 1); return 0; }
    if (nproc > 1 && kind == DT_LAUNCH_MPI) {
        dt_log(DT_LOG_ERROR, "%s: --nproc %g inside an mpirun/srun job: the job's ranks are the ranks (drop --nproc)", cmd, nproc);
        return 2;
    }
    if (kind != DT_LAUNCH_NONE && dt_comm_init(w)) { dt_log(DT_LOG_ERROR, "%s: %s", cmd, dt_last_error()); return 1; }
    int ranks = *w ? dt_comm_size(*w) : 1;
    if (split >= 0 && (split > 0 ? split : 1) != ranks) {
        dt_log(DT_LOG_ERROR, "%s: the model split %g ways, but the job has %d rank%s: %s", cmd, split > 0 ? split : 1, ranks,
               ranks == 1 ? "" : "s", how);
        dt_comm_destroy(*w);
        *w = NULL;
        return 2;
    }
    return 0;
}
