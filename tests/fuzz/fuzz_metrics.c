/* dtrain plot: a metrics file (one JSON object per line) drawn as SVG. */
#include "dtrain/train.h"
#include "memfile.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    for (int log_y = 0; log_y < 2; log_y++) {
        char *svg;
        size_t len;
        if (dt_plot_svg(dt_fuzz_file(0, data, n), log_y, &svg, &len) == DT_OK) free(svg);
    }
    return 0;
}
