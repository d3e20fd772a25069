/* Byte sizes as people write them on a command line: 8, 64K, 1M, 256M, 2G, 1T. */
#include "dtrain/base.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

dt_status dt_parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno) return dt_error(DT_ERR_ARG, "bad size '%s' (expected e.g. 8, 64K, 1M, 2G)", s);
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (*end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return dt_error(DT_ERR_ARG, "bad size '%s' (expected e.g. 8, 64K, 1M, 2G)", s);
    if (shift && v > (~0ull >> shift)) return dt_error(DT_ERR_ARG, "size '%s' overflows", s);
    *out = (size_t)(v << shift);
    return DT_OK;
}

const char *dt_format_size(size_t b, char *buf, size_t cap) {
    if (b >= (1u << 30) && b % (1u << 30) == 0) snprintf(buf, cap, "%zuGiB", b >> 30);
    else if (b >= (1u << 20) && b % (1u << 20) == 0) snprintf(buf, cap, "%zuMiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0) snprintf(buf, cap, "%zuKiB", b >> 10);
    else snprintf(buf, cap, "%zuB", b);
    return buf;
}
