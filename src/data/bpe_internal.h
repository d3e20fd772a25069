/* Byte-level BPE's state, shared by its loaders (bpe_load.c: GPT-2's encoder.json + vocab.bpe, HF's tokenizer.json)
 * and its encoder (bpe.c). */
#ifndef DTRAIN_BPE_INTERNAL_H
#define DTRAIN_BPE_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "dtrain/data.h"

#include <pcre2.h>
#include <stdbool.h>

/* A string -> int hash map (open addressing, FNV-1a). */
typedef struct { char *key; int val; } bpe_slot;
typedef struct { bpe_slot *s; size_t cap, n; } bpe_map;
int bpe_map_put(bpe_map *m, const char *k, size_t n, int v); /* -1: out of memory */
int bpe_map_get(const bpe_map *m, const char *k, size_t n);  /* -1: absent */

/* A token matched in the raw text before pre-tokenization (tokenizer.json's added_tokens). */
typedef struct {
    char *content;
    size_t len;
    int id;
    bool special;
} bpe_added;

struct dt_bpe {
    bpe_map vocab, merges;       /* token string -> id; "left right" -> rank */
    char byte_utf8[256][3];      /* each byte's character, UTF-8 */
    unsigned char byte_len[256];
    char **token_bytes;          /* id -> raw bytes */
    char **token_text;           /* id -> the token as the file lists it (byte-level characters; an added token's content) */
    char **merge_list;           /* rank -> "left right" */
    int nmerges, merge_cap;
    char *pattern;               /* the pre-tokenizer's pattern as compiled */
    size_t *token_len;
    int nvocab;
    pcre2_code *re;              /* the pre-tokenizer's pattern (NULL: a segment is one piece) */
    bool prefix_space;           /* ByteLevel's add_prefix_space */
    bool ignore_merges;          /* a piece that is a token is taken whole (Llama 3) */
    bool nfc;                    /* the normalizer: each segment to Unicode NFC first (Qwen 2; libunistring's) */
    bpe_added *added;            /* longest first */
    int nadded;
    bool added_first[256];       /* bytes an added token starts with */
    int bos;                     /* a prompt's first token (TemplateProcessing's), or -1 */
};

/* The merge "left right" (len bytes) at the next rank, in the map and the rank-ordered list. */
dt_status bpe_add_merge(dt_bpe *b, const char *key, size_t len);

/* b's byte -> character table (GPT-2's: bytes that print as themselves keep their code, the others 256 + n). */
void bpe_byte_table(dt_bpe *b);
/* A token string (mapped characters) back to raw bytes in out (as long as s); its length. */
size_t bpe_unmap(const dt_bpe *b, const char *s, char *out);
/* The offset of the first byte of s[0, n) that does not begin a well-formed UTF-8 character, or -1. */
long bpe_utf8_bad(const unsigned char *s, size_t n);
/* pattern compiled (UTF, Unicode properties, JIT where it can) into b->re; an error naming where and the pattern. */
dt_status bpe_compile(dt_bpe *b, const char *pattern, const char *where);

#endif
