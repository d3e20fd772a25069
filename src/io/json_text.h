/* JSON text from a user (a request's body, a line of a .jsonl file) read whole (json_text.c). cJSON ends its strings at
 * a NUL, so a text holding one is refused rather than cut short unseen, and a line is one value with nothing after. */
#ifndef DTRAIN_IO_JSON_TEXT_H
#define DTRAIN_IO_JSON_TEXT_H

#include "dtrain/base.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

/* Whether text's len bytes hold a NUL: a raw byte, or JSON's \u0000 escape (after an escaped backslash it is text). */
bool dt_json_holds_nul(const char *text, size_t len);
/* A number written with a fraction or an exponent (1.0, 2e3): Python's json reads it as a float and writes it back so
 * (1.0), where a whole number written without them is an int (1). cJSON keeps one double for both, so the reader
 * marks such numbers with this bit of their type (kept by cJSON_Duplicate; cJSON's own tests mask the type with 0xFF)
 * for the chat templates' tojson (data/chat_tojson.c). */
#define DT_JSON_FLOAT (1 << 12)
/* The numbers of root (parsed from text's len bytes) written as floats marked DT_JSON_FLOAT: text's number literals
 * in order are root's numbers in document order. */
void dt_json_mark_floats(cJSON *root, const char *text, size_t len);
/* text (NUL-terminated) as one JSON value with only white space after it, its floats marked; NULL where it is not. */
cJSON *dt_json_parse_whole(const char *text);
/* A user's line of JSON (a .jsonl's; where names it, "FILE:LINE", in errors) as one value into *out: an error that
 * says which where it holds a NUL, is not UTF-8 (as JSON text must be) or is not one value. What it refuses is part
 * of the fine-tuning rows' cache key (sft_cache.c's ROWS_VERSION): a change here changes that, or cached rows skip it. */
dt_status dt_json_parse_line(const char *text, const char *where, cJSON **out);

#endif
