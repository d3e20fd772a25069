/* JSON text from a user, read whole (json_text.h). */
#include "json_text.h"

#include <string.h>

bool dt_json_holds_nul(const char *text, size_t len) {
    if (memchr(text, 0, len)) return true;
    for (size_t i = 0; i + 6 <= len; i++)
        if (text[i] == '\\') {
            if (text[i + 1] == 'u' && !memcmp(text + i + 2, "0000", 4)) return true;
            i++; /* skip the escaped character: an escaped backslash before "u0000" leaves it text */
        }
    return false;
}

cJSON *dt_json_parse_whole(const char *text) {
    return cJSON_ParseWithOpts(text, NULL, 1); /* require_null_terminated: trailing text fails */
}

dt_status dt_json_parse_line(const char *text, const char *where, cJSON **out) {
    size_t len = strlen(text), bad = dt_utf8_find_invalid(text, len);
    *out = NULL;
    if (dt_json_holds_nul(text, len)) return dt_error(DT_ERR_IO, "%s: holds a NUL character (\\u0000), which dtrain cannot take", where);
    /* a byte-level tokenizer would take other bytes as text, where a JSON reader refuses them */
    if (bad < len)
        return dt_error(DT_ERR_IO, "%s: byte %zu of the line (0x%02x) starts no UTF-8 character, and JSON text is UTF-8", where, bad,
                        (unsigned)(unsigned char)text[bad]);
    if (!(*out = dt_json_parse_whole(text))) return dt_error(DT_ERR_IO, "%s: not JSON (or more than one value)", where);
    return DT_OK;
}
