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
