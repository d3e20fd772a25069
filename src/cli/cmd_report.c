/* dtrain report: flag parsing only. */
#include "cli.h"
#include "dtrain/obs.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* dtrain report RUN_DIR [-o report.html] */
int dt_cli_report(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    char def[4200];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dtrain report RUN_DIR [-o report.html]\n"
                   "  one self-contained HTML page of a run (what dtrain train --report RUN_DIR wrote, or a directory with\n"
                   "  a metrics.jsonl): loss, learning rate and gradient norm, tok/s and MFU, time per phase, memory, I/O,\n"
                   "  the ranks' timeline from trace.json and the scaling from scaling.json where present;\n"
                   "  -o: where (RUN_DIR/report.html)\n");
            return 0;
        } else if (argv[i][0] == '-') {
            dt_log(DT_LOG_ERROR, "report: unknown flag %s (expected -o FILE)", argv[i]);
            return 2;
        } else if (dir) {
            dt_log(DT_LOG_ERROR, "report: one run directory, got %s and %s", dir, argv[i]);
            return 2;
        } else dir = argv[i];
    }
    struct stat sb;
    if (!dir) { dt_log(DT_LOG_ERROR, "report: which run? (dtrain report RUN_DIR -o report.html)"); return 2; }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        dt_log(DT_LOG_ERROR, "report: %s is not a directory (a run directory: dtrain train --report DIR)", dir);
        return 2;
    }
    if (!out) snprintf(def, sizeof def, "%s/report.html", dir), out = def;
    if (dt_report_write(dir, out)) { dt_log(DT_LOG_ERROR, "report: %s", dt_last_error()); return 1; }
    printf("wrote %s\n", out);
    return 0;
}
