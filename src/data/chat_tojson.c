/* A JSON value as a chat template's tojson writes it (transformers' filter: Python's json.dumps with ensure_ascii off,
 * its default separators ", " and ": ", the keys in their order), so that a prompt holding a tool's schema or a call's
 * arguments is the template's byte for byte; with an indent (Llama 3.1's tojson(indent=4)) each item on its own line, ","
 * after it, as Python writes it then. Numbers: whole ones as integers, others by the shortest digits that read
 * back (Python's repr); a whole number written as a float (1.0; its reader marked it DT_JSON_FLOAT) as Python's float. */
#include "dtrain/data.h"
#include "io/json_text.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_status put(char **buf, size_t *len, size_t *cap, const char *s) { return dt_chat_append(buf, len, cap, s, strlen(s)); }

/* A string as json.dumps(ensure_ascii=False): quotes, backslashes and control characters escaped, the rest as it is. */
static dt_status put_string(char **buf, size_t *len, size_t *cap, const char *s) {
    dt_status st = put(buf, len, cap, "\"");
    for (const char *p = s; !st && *p; p++) {
        unsigned char c = (unsigned char)*p;
        char e[8] = { (char)c, 0 };
        if (c == '"' || c == '\\') snprintf(e, sizeof e, "\\%c", c);
        else if (c == '\n') snprintf(e, sizeof e, "\\n");
        else if (c == '\r') snprintf(e, sizeof e, "\\r");
        else if (c == '\t') snprintf(e, sizeof e, "\\t");
        else if (c == '\b') snprintf(e, sizeof e, "\\b");
        else if (c == '\f') snprintf(e, sizeof e, "\\f");
        else if (c < 0x20) snprintf(e, sizeof e, "\\u%04x", c);
        st = put(buf, len, cap, e);
    }
    return st ? st : put(buf, len, cap, "\"");
}

/* v as Python writes an int (a whole number written so) or, marked DT_JSON_FLOAT, a float: repr's shortest digits
 * that read back, a whole one below 1e16 with ".0" (1.0), from 1e16 on in exponent form (1e+16, 1.5e+17). */
static dt_status put_number(char **buf, size_t *len, size_t *cap, double v, bool flt) {
    char s[48];
    bool whole = v == floor(v), exp = flt && whole && fabs(v) >= 1e16;
    if (whole && !exp && fabs(v) < (flt ? 1e16 : 1e18)) snprintf(s, sizeof s, flt ? "%.0f.0" : "%.0f", v);
    else
        for (int p = 1; p <= 17; p++) /* the shortest that reads back (%g: exponent form below 1e-4, as repr) */
            if (snprintf(s, sizeof s, exp ? "%.*e" : "%.*g", exp ? p - 1 : p, v), strtod(s, NULL) == v) break;
    return put(buf, len, cap, s);
}

/* v as json.dumps(v, indent=indent) writes it at depth level (indent 0: on one line, ", " between items; -1: on one
 * line, "," and ":" between, as separators=(",", ":")). */
static dt_status tojson(const cJSON *v, int indent, int level, char **buf, size_t *len, size_t *cap) {
    if (cJSON_IsString(v)) return put_string(buf, len, cap, v->valuestring);
    if (cJSON_IsNumber(v)) return put_number(buf, len, cap, v->valuedouble, v->type & DT_JSON_FLOAT);
    if (cJSON_IsBool(v)) return put(buf, len, cap, cJSON_IsTrue(v) ? "true" : "false");
    if (cJSON_IsNull(v)) return put(buf, len, cap, "null");
    bool object = cJSON_IsObject(v);
    if (!object && !cJSON_IsArray(v)) return dt_error(DT_ERR_ARG, "not a JSON value");
    bool lines = indent > 0;
    dt_status st = put(buf, len, cap, object ? "{" : "[");
    for (const cJSON *c = v->child; !st && c; c = c->next) {
        if (c != v->child) st = put(buf, len, cap, indent ? "," : ", ");
        if (!st && lines) st = put(buf, len, cap, "\n");
        for (int k = 0; !st && k < indent * (level + 1); k++) st = put(buf, len, cap, " ");
        if (!st && object) st = put_string(buf, len, cap, c->string);
        if (!st && object) st = put(buf, len, cap, indent < 0 ? ":" : ": ");
        if (!st) st = tojson(c, indent, level + 1, buf, len, cap);
    }
    if (!st && lines && v->child) st = put(buf, len, cap, "\n"); /* (an empty one stays {} or []) */
    for (int k = 0; !st && lines && v->child && k < indent * level; k++) st = put(buf, len, cap, " ");
    return st ? st : put(buf, len, cap, object ? "}" : "]");
}

dt_status dt_chat_tojson(const cJSON *v, char **buf, size_t *len, size_t *cap) { return tojson(v, 0, 0, buf, len, cap); }

dt_status dt_chat_tojson_indent(const cJSON *v, int indent, char **buf, size_t *len, size_t *cap) { return tojson(v, indent, 0, buf, len, cap); }

char *dt_json_print_compact(const cJSON *v) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (tojson(v, -1, 0, &buf, &len, &cap) == DT_OK && buf) return buf;
    free(buf);
    return NULL;
}
