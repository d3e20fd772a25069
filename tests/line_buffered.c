/* Linked into every test program: stdout line-buffered, so that a test which ctest stops at its time limit leaves
 * what it printed in the log (into a pipe, stdout is otherwise written only when a buffer fills or at exit). */
#include <stdio.h>

__attribute__((constructor)) static void line_buffered(void) { setvbuf(stdout, NULL, _IOLBF, 0); }
