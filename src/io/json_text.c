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

/* The next number literal in text[*at, len) (strings skipped): whether it has a fraction or an exponent; -1: none. */
static int next_number(const char *text, size_t len, size_t *at) {
    for (size_t i = *at; i < len; i++) {
        char c = text[i];
        if (c == '"') {
            for (i++; i < len && text[i] != '"'; i++)
                if (text[i] == '\\') i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            int flt = 0;
            for (; i < len && text[i] && strchr("+-0123456789.eE", text[i]); i++) flt |= text[i] == '.' || text[i] == 'e' || text[i] == 'E';
            *at = i;
            return flt;
        }
    }
    *at = len;
    return -1;
}

static void mark(cJSON *v, const char *text, size_t len, size_t *at) {
    for (; v; v = v->next) {
        if (cJSON_IsNumber(v) && next_number(text, len, at) == 1) v->type |= DT_JSON_FLOAT;
        if (v->child) mark(v->child, text, len, at);
    }
}

void dt_json_mark_floats(cJSON *root, const char *text, size_t len) {
    size_t at = 0;
    mark(root, text, len, &at); /* (a root has no next) */
}

cJSON *dt_json_parse_whole(const char *text) {
    cJSON *j = cJSON_ParseWithOpts(text, NULL, 1); /* require_null_terminated: trailing text fails */
    dt_json_mark_floats(j, text, j ? strlen(text) : 0);
    return j;
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
