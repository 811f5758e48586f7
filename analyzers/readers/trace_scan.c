/* JSON trace -> columns, streamed: the input arrives in chunks and no Python object exists per event.
 *
 * Reads a Kineto/Chrome trace (an object with "traceEvents", or a bare array of events) and
 * keeps, for every complete ("ph": "X") event: ts, dur, and interned name, cat and tid ids; for
 * events whose name may be communication (a hint substring, case-insensitive), the raw bytes
 * of their "args", for args_fields to read a few keys from later; for events of a category
 * named by an '@' hint (device work and the runtime calls that launch it), only their args'
 * "correlation" number: a step's device work is found by it, and a CPU-only trace keeps none. Strings are interned by their
 * raw bytes, copied into the scanner's own arenas, so a chunk can be dropped once scanned:
 * memory is one chunk plus the columns, not the whole trace. Python decodes each distinct string
 * once. scan_feed returns how many bytes it consumed; an event (or top-level value) cut by the
 * chunk's end is left for the next call. Any input the scanner does not accept sets err (and
 * err_pos): malformed JSON or a field of an unexpected type makes the caller fall back to the
 * msgspec decoder where the input is small enough to decode whole (it names the problem), so
 * this file only has to be right on the happy path and strict elsewhere; a truncated document,
 * a token over max_token bytes and a second "traceEvents" are refused outright.
 * Lengths are int64 until checked against max_token (at most 1 GiB), then stored as int32.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__ /* every x86-64 CPU: no -march needed, the cached library stays portable */
#include <emmintrin.h>
#endif

typedef struct {
    char *p;
    int64_t n, cap;
} arena_t;

typedef struct {
    int64_t n, cap;
    int64_t *off; /* into bytes */
    int32_t *len;
    uint32_t *hash;
    uint8_t *flag; /* names: 1 when a hint occurs in it (args kept), 2 correlation only; cats: 2 when an '@' hint names it */
    int32_t *slot; /* open addressing: id + 1, 0 = empty */
    int64_t nslots;
    arena_t bytes;
} table_t;

typedef struct {
    int64_t n, cap;
    double *ts, *dur;
    int32_t *name, *cat, *tid;
    /* Sparse, for the events of flagged names only (launches, candidates; a few per cent of a
     * trace): their row, raw args span (off -1: not kept) and args "correlation" (-1: none). */
    int64_t nk, capk;
    int64_t *k_row, *k_off, *k_corr;
    int32_t *k_len;
    table_t names, cats, tids;
    arena_t args, dist, meta, host; /* host: Kineto's top-level "host_name" (torch 2.x), raw JSON */
    int64_t base_ns;
    int32_t has_dist, has_meta, has_host;
    int32_t state; /* 0 start, 1 object: key or '}', 2 events: event or ']', 3 object: ',' or '}', 4 done */
    int32_t bare, found, first, after_comma;
    char **hints; /* lower-case */
    int32_t nhints;
    int64_t err_pos;
    int64_t max_token; /* longest string token, args object or kept top-level value, in bytes */
    int64_t max_rows; /* most complete events kept: memory is bound by what is kept, not by the JSON's size */
    int32_t err; /* 0 ok, 1 malformed JSON, 2 unexpected type, 3 out of memory, 4 no events array,
                  * 5 a token over max_token, 6 "traceEvents" twice, 7 the input ends inside the document,
                  * 8 more than max_rows complete events */
} scan_t;

typedef struct {
    const unsigned char *p, *b, *e;
    scan_t *s;
} cur_t;

#define FAIL(c, code) do { if (!(c)->s->err) { (c)->s->err = (code); (c)->s->err_pos = (int64_t)((c)->p - (c)->b); } return -1; } while (0)

/* JSON's four whitespace bytes. */
static const uint8_t WS[256] = {[' '] = 1, ['\n'] = 1, ['\r'] = 1, ['\t'] = 1};

static inline void ws(cur_t *c) {
    const unsigned char *p = c->p, *e = c->e;
    while (e - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        if (w != 0x2020202020202020ull) break;
        p += 8;
    }
    while (p < e && WS[*p]) p++;
    c->p = p;
}

static int32_t hex4(const unsigned char *p) {
    int32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char h = p[k];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The first '"', '\\' or control byte in [p, e), or e: sixteen bytes at a time where SSE2 is. */
static inline const unsigned char *string_stop(const unsigned char *p, const unsigned char *e) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), ctl = _mm_set1_epi8(0x1f);
    while (e - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                                   _mm_cmpeq_epi8(_mm_min_epu8(v, ctl), v)); /* v <= 0x1f, unsigned */
        int mask = _mm_movemask_epi8(hit);
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < e && *p != '"' && *p != '\\' && *p >= 0x20) p++;
    return p;
}

/* A string token starting at '"'; leaves p after the closing quote. Checks escapes (a surrogate
 * only in a pair) and control characters as JSON requires (UTF-8 is checked by Python for the
 * strings it decodes). *esc (when asked) says whether the token holds an escape. */
static int scan_string(cur_t *c, int *esc) {
    const unsigned char *p = c->p + 1, *e = c->e;
    for (;;) {
        p = string_stop(p, e);
        if (p >= e || *p < 0x20) { c->p = p; FAIL(c, 1); }
        if (*p == '"') { c->p = p + 1; return 0; }
        if (esc) *esc = 1;
        p++; /* a backslash: one escape */
        if (p >= e) { c->p = p; FAIL(c, 1); }
        if (*p == 'u') {
            if (e - p < 5) { c->p = e; FAIL(c, 1); } /* cut by the chunk's end (or truncated) */
            int32_t u = hex4(p + 1);
            if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF)) { c->p = p; FAIL(c, 1); }
            p += 5;
            if (u >= 0xD800 && u <= 0xDBFF) { /* a high surrogate: a low one must follow (UTF-16 pair), as msgspec requires */
                static const char pre[2] = {'\\', 'u'};
                int64_t have = e - p < 6 ? e - p : 6;
                for (int64_t k = 0; k < have && k < 2; k++)
                    if (p[k] != (unsigned char)pre[k]) { c->p = p; FAIL(c, 1); }
                if (have < 6) { c->p = e; FAIL(c, 1); } /* cut (or truncated) */
                int32_t lo = hex4(p + 2);
                if (lo < 0xDC00 || lo > 0xDFFF) { c->p = p; FAIL(c, 1); }
                p += 6;
            }
        } else if (*p && strchr("\"\\/bfnrt", *p)) {
            p++;
        } else {
            c->p = p;
            FAIL(c, 1);
        }
    }
}

static inline int skip_string(cur_t *c) { return scan_string(c, NULL); }

/* Whether p[0..8) are eight ASCII digits, and their value (SWAR, as simdjson parses them). */
static inline int eight_digits(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return ((w & 0xF0F0F0F0F0F0F0F0ull) | (((w + 0x0606060606060606ull) & 0xF0F0F0F0F0F0F0F0ull) >> 4)) ==
           0x3333333333333333ull;
}

static inline uint64_t eight_value(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian: the first digit in the low byte */
    v -= 0x3030303030303030ull;
    v = v * 10 + (v >> 8);
    v = (((v & 0x000000FF000000FFull) * 0x000F424000000064ull) + (((v >> 16) & 0x000000FF000000FFull) * 0x0000271000000001ull)) >> 32;
    return v;
}

/* JSON number grammar; value returned through *out (exact for the common case). */
static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int number(cur_t *c, double *out, int *is_int) {
    /* Locals, not c->p: a byte read through an unsigned char pointer may alias c->p, so the
     * compiler would store and reload the cursor around every digit. */
    const unsigned char *s = c->p, *p = c->p, *e = c->e;
#define NFAIL(code) do { c->p = p; FAIL(c, code); } while (0)
    int neg = 0;
    if (p < e && *p == '-') { neg = 1; p++; }
    if (p >= e || *p < '0' || *p > '9') NFAIL(1);
    uint64_t m = 0;
    int digits = 0, exp10 = 0;
    if (*p == '0') { p++; }
    else {
        while (digits <= 11 && e - p >= 8 && eight_digits(p)) { /* timestamps: 13-16 digits */
            m = m * 100000000u + eight_value(p);
            digits += 8;
            p += 8;
        }
        while (p < e && *p >= '0' && *p <= '9') {
            if (digits < 19) { m = m * 10 + (uint64_t)(*p - '0'); digits++; } else exp10++;
            p++;
        }
    }
    *is_int = 1;
    if (p < e && *p == '.') {
        *is_int = 0;
        p++;
        if (p >= e || *p < '0' || *p > '9') NFAIL(1);
        while (digits <= 11 && e - p >= 8 && eight_digits(p)) {
            m = m * 100000000u + eight_value(p);
            digits += 8;
            exp10 -= 8;
            p += 8;
        }
        while (p < e && *p >= '0' && *p <= '9') {
            if (digits < 19) { m = m * 10 + (uint64_t)(*p - '0'); digits++; exp10--; }
            p++;
        }
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        *is_int = 0;
        p++;
        int eneg = 0, ev = 0;
        if (p < e && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        if (p >= e || *p < '0' || *p > '9') NFAIL(1);
        while (p < e && *p >= '0' && *p <= '9') { if (ev < 100000) ev = ev * 10 + (*p - '0'); p++; }
        exp10 += eneg ? -ev : ev;
    }
    c->p = p;
#undef NFAIL
    if (!out) return 0;
    /* Clinger's fast path: an exact mantissa below 2^53 and a power of ten below 1e23 give the
     * correctly rounded result with one multiplication or division. Otherwise strtod. */
    if (digits < 19 && m < (1ULL << 53) && exp10 >= -22 && exp10 <= 22) {
        double v = (double)m;
        v = exp10 < 0 ? v / POW10[-exp10] : v * POW10[exp10];
        *out = neg ? -v : v;
        return 0;
    }
    char tmp[128];
    size_t n = (size_t)(c->p - s);
    if (n >= sizeof tmp) { *out = 0; FAIL(c, 2); }
    memcpy(tmp, s, n);
    tmp[n] = 0;
    *out = strtod(tmp, NULL);
    if (*out - *out != 0) FAIL(c, 2); /* 1e400: not a finite number, invalid input (msgspec names it) */
    return 0;
}

/* One object member's key and the ':' after it: the key's raw bytes (between the quotes) in
 * *k and *kn, p left at the value, which must follow (at the end of the input: a cut). */
static int member_key(cur_t *c, const unsigned char **k, int32_t *kn) {
    if (c->p >= c->e || *c->p != '"') FAIL(c, 1);
    *k = c->p + 1;
    int esc = 0;
    if (scan_string(c, &esc)) return -1;
    if (c->p - 1 - *k > c->s->max_token) { c->p = *k - 1; FAIL(c, 5); }
    *kn = (int32_t)(c->p - 1 - *k);
    /* A key written with escapes ("p\u0068" is "ph") cannot be matched as raw bytes: refuse, and
     * the msgspec decoder, which applies JSON's rules, reads the trace. */
    if (esc) FAIL(c, 2);
    ws(c);
    if (c->p >= c->e || *c->p != ':') FAIL(c, 1);
    c->p++;
    ws(c);
    if (c->p >= c->e) FAIL(c, 1);
    return 0;
}

static int skip_value(cur_t *c, int depth);

/* The length of the token from v to the cursor, refused (5) over max_token: int32 from here on. */
static int token_len(cur_t *c, const unsigned char *v, int32_t *n) {
    int64_t len = (int64_t)(c->p - v);
    if (len > c->s->max_token || len > INT32_MAX) { c->p = v; FAIL(c, 5); } /* named at its start */
    *n = (int32_t)len;
    return 0;
}

static inline int key_is(const unsigned char *k, int32_t n, const char *lit) {
    return (size_t)n == strlen(lit) && !memcmp(k, lit, (size_t)n);
}

/* A "correlation" member's value: a non-negative integer of at most 18 digits, else -1. */
static int64_t correlation_value(const unsigned char *v, int64_t len) {
    int64_t x = 0, i = 0;
    if (len < 1 || len > 18) return -1;
    while (i < len && v[i] >= '0' && v[i] <= '9') x = x * 10 + (v[i++] - '0');
    return i == len ? x : -1;
}

/* Skips the object or array at the cursor. `corr`: where an object's own "correlation" member
 * is read on the way (the last one where a key repeats, as JSON decoders keep), NULL to skip only. */
static int skip_container(cur_t *c, int depth, int64_t *corr) {
    unsigned char close = *c->p == '{' ? '}' : ']';
    int obj = close == '}';
    if (depth > 512) FAIL(c, 1);
    c->p++;
    ws(c);
    if (c->p < c->e && *c->p == close) { c->p++; return 0; }
    for (;;) {
        ws(c);
        const unsigned char *k;
        int32_t kn;
        if (obj && member_key(c, &k, &kn)) return -1;
        const unsigned char *v = c->p;
        if (skip_value(c, depth + 1)) return -1;
        if (corr && obj && key_is(k, kn, "correlation")) *corr = correlation_value(v, c->p - v);
        ws(c);
        if (c->p >= c->e) FAIL(c, 1);
        if (*c->p == ',') { c->p++; continue; }
        if (*c->p == close) { c->p++; return 0; }
        FAIL(c, 1);
    }
}

static int literal(cur_t *c, const char *word) {
    size_t n = strlen(word), have = (size_t)(c->e - c->p);
    if (have < n && !memcmp(c->p, word, have)) { c->p = c->e; FAIL(c, 1); } /* cut by the chunk's end */
    if (have < n || memcmp(c->p, word, n)) FAIL(c, 1);
    c->p += n;
    return 0;
}

static int skip_value(cur_t *c, int depth) {
    if (c->p >= c->e) FAIL(c, 1);
    switch (*c->p) {
    case '"': return skip_string(c);
    case '{': case '[': return skip_container(c, depth, NULL);
    case 't': return literal(c, "true");
    case 'f': return literal(c, "false");
    case 'n': return literal(c, "null");
    default: { int i; return number(c, NULL, &i); }
    }
}

/* Eight bytes per multiply (names are often 50-300 bytes of C++ template); a byte-at-a-time
 * FNV cost more than the scanning of the string did. */
static uint32_t hash_bytes(const unsigned char *p, int32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)n, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    w = 0;
    memcpy(&w, p, (size_t)(n > 0 ? n : 0));
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    return (uint32_t)(h ^ (h >> 32));
}

static int grow(void **p, int64_t cap, size_t elem) {
    void *q = realloc(*p, (size_t)cap * elem);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int64_t arena_put(arena_t *a, const void *p, int64_t n) {
    if (n < 0) return -1;
    if (a->n + n > a->cap) {
        int64_t cap = a->cap ? a->cap : 4096;
        while (cap < a->n + n) cap *= 2;
        if (grow((void **)&a->p, cap, 1)) return -1;
        a->cap = cap;
    }
    memcpy(a->p + a->n, p, (size_t)n);
    a->n += n;
    return a->n - n;
}

/* 1: a plain hint occurs in the name (its events' args are kept); 2: only a '#'-prefixed hint
 * does (kernel launches: only their args' "correlation" number is kept, in its own column); 0. */
static int has_hint(scan_t *s, const unsigned char *p, int32_t n) {
    /* ASCII-lowered once, then one memmem per hint (it runs once per distinct name). */
    unsigned char small[512], *low = n <= (int32_t)sizeof small ? small : malloc((size_t)n);
    if (!low) return 1; /* out of memory: keep the args (the safe answer) */
    for (int32_t i = 0; i < n; i++) low[i] = p[i] >= 'A' && p[i] <= 'Z' ? (unsigned char)(p[i] - 'A' + 'a') : p[i];
    int found = 0;
    for (int32_t h = 0; h < s->nhints && found != 1; h++) {
        const char *hint = s->hints[h];
        if (hint[0] == '@') continue; /* a category's */
        int corr_only = hint[0] == '#';
        if (corr_only && found) continue;
        hint += corr_only;
        if (memmem(low, (size_t)n, hint, strlen(hint))) found = corr_only ? 2 : 1;
    }
    if (low != small) free(low);
    return found;
}

/* 2 when an '@' hint names the category whose raw token (quotes included) is p[0..n), else 0:
 * its events keep their args' correlation number. Compared ASCII-case-insensitively. */
static int cat_hint(scan_t *s, const unsigned char *p, int32_t n) {
    if (n < 2) return 0;
    for (int32_t h = 0; h < s->nhints; h++) {
        const char *hint = s->hints[h];
        if (hint[0] != '@' || (int32_t)strlen(hint + 1) != n - 2) continue;
        int32_t i = 0;
        for (; i < n - 2; i++) {
            unsigned char c = p[1 + i];
            if ((c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c) != (unsigned char)hint[1 + i]) break;
        }
        if (i == n - 2) return 2;
    }
    return 0;
}

/* The id of raw token p[0..n) in t, added (bytes copied) when new; flag 1: a name (hints
 * decide its flag), 2: a category ('@' hints decide), 0: no flag. */
static int32_t intern(scan_t *s, table_t *t, const unsigned char *p, int32_t n, int flag) {
    uint32_t h = hash_bytes(p, n);
    if (n < 0 || t->n >= INT32_MAX - 1) return -1; /* ids are int32 */
    if ((t->n + 1) * 2 > t->nslots) {
        int64_t ns = t->nslots ? t->nslots * 2 : 1024;
        int32_t *slot = calloc((size_t)ns, sizeof(int32_t));
        if (!slot) return -1;
        for (int64_t i = 0; i < t->n; i++) {
            int64_t j = t->hash[i] & (ns - 1);
            while (slot[j]) j = (j + 1) & (ns - 1);
            slot[j] = (int32_t)(i + 1);
        }
        free(t->slot);
        t->slot = slot;
        t->nslots = ns;
    }
    int64_t j = h & (t->nslots - 1);
    while (t->slot[j]) {
        int32_t id = t->slot[j] - 1;
        if (t->hash[id] == h && t->len[id] == n && !memcmp(t->bytes.p + t->off[id], p, (size_t)n)) return id;
        j = (j + 1) & (t->nslots - 1);
    }
    if (t->n == t->cap) {
        int64_t cap = t->cap ? t->cap * 2 : 256;
        if (grow((void **)&t->off, cap, 8) || grow((void **)&t->len, cap, 4) || grow((void **)&t->hash, cap, 4) ||
            grow((void **)&t->flag, cap, 1))
            return -1;
        t->cap = cap;
    }
    int64_t off = arena_put(&t->bytes, p, n);
    if (off < 0) return -1;
    t->off[t->n] = off;
    t->len[t->n] = n;
    t->hash[t->n] = h;
    /* An escaped name ("record\u005fparam_comms") may decode to a hinted one: keep its args. */
    t->flag[t->n] = (uint8_t)(flag == 2 ? cat_hint(s, p, n) : flag ? (memchr(p, '\\', (size_t)n) ? 1 : has_hint(s, p, n)) : 0);
    t->slot[j] = (int32_t)(t->n + 1);
    return (int32_t)t->n++;
}

static int reserve(scan_t *s) {
    if (s->n < s->cap) return 0;
    int64_t cap = s->cap ? s->cap * 2 : 4096;
    if (grow((void **)&s->ts, cap, 8) || grow((void **)&s->dur, cap, 8) || grow((void **)&s->name, cap, 4) ||
        grow((void **)&s->cat, cap, 4) || grow((void **)&s->tid, cap, 4))
        return -1;
    s->cap = cap;
    return 0;
}

static int reserve_kept(scan_t *s) {
    if (s->nk < s->capk) return 0;
    int64_t cap = s->capk ? s->capk * 2 : 1024;
    if (grow((void **)&s->k_row, cap, 8) || grow((void **)&s->k_off, cap, 8) || grow((void **)&s->k_corr, cap, 8) ||
        grow((void **)&s->k_len, cap, 4))
        return -1;
    s->capk = cap;
    return 0;
}

/* The args value at the cursor, skipped and checked like skip_value, reading its top-level
 * "correlation" member on the way: one pass over a launch's args. A value that is not an
 * object has no correlation (-1). */
static int skip_args_correlation(cur_t *c, int64_t *found) {
    *found = -1;
    if (c->p >= c->e || *c->p != '{') return skip_value(c, 1);
    return skip_container(c, 1, found);
}

/* The same for args already skipped and kept as bytes (an event whose name came after its
 * args): -2 when a key is written with escapes (the caller decodes that object in Python). */
static int64_t find_correlation(const unsigned char *a, int32_t n) {
    scan_t tmp;
    tmp.err = 0;
    tmp.max_token = INT32_MAX;
    cur_t c = {a, a, a + n, &tmp};
    int64_t found;
    if (skip_args_correlation(&c, &found)) return tmp.err == 2 ? -2 : -1;
    return found;
}

/* One event object; appends a row when its ph is "X". Fields are read only when typed as the
 * msgspec path expects (ph/name/cat: string; ts/dur: number; tid: integer or string). */
static int event(cur_t *c) {
    scan_t *s = c->s;
    if (c->p >= c->e) FAIL(c, 1);
    if (*c->p != '{') FAIL(c, 2);
    c->p++;
    int is_x = 0;
    double ts = 0, dur = 0;
    int32_t name = 0, cat = 0, tid = 0, args_len = 0, named = 0, have_corr = 0;
    int64_t corr = -1;
    const unsigned char *args = NULL;
    ws(c);
    if (c->p < c->e && *c->p == '}') { c->p++; return 0; }
    for (;;) {
        ws(c);
        const unsigned char *k;
        int32_t kn;
        if (member_key(c, &k, &kn)) return -1;
        const unsigned char *v = c->p;
        if (key_is(k, kn, "ph")) {
            if (*v != '"') FAIL(c, 2);
            if (skip_string(c)) return -1;
            for (const unsigned char *q = v + 1; q < c->p - 1; q++) /* escaped or non-ASCII (UTF-8 unchecked here): msgspec decides */
                if (*q == '\\' || *q >= 0x80) FAIL(c, 2);
            is_x = c->p - v == 3 && v[1] == 'X';
        } else if (key_is(k, kn, "name") || key_is(k, kn, "cat")) {
            if (*v != '"') FAIL(c, 2);
            int32_t vn;
            if (skip_string(c) || token_len(c, v, &vn)) return -1;
            int32_t id = intern(s, kn == 4 ? &s->names : &s->cats, v, vn, kn == 4 ? 1 : 2);
            if (id < 0) FAIL(c, 3);
            if (kn == 4) { name = id; named = 1; } else cat = id;
        } else if (key_is(k, kn, "ts") || key_is(k, kn, "dur")) {
            int is_int;
            if (*v != '-' && (*v < '0' || *v > '9')) FAIL(c, 2);
            if (number(c, kn == 2 ? &ts : &dur, &is_int)) return -1;
        } else if (key_is(k, kn, "tid")) {
            int is_int = 1;
            if (*v == '"') { if (skip_string(c)) return -1; }
            else if (*v == '-' || (*v >= '0' && *v <= '9')) { if (number(c, NULL, &is_int)) return -1; }
            else FAIL(c, 2);
            if (!is_int) FAIL(c, 2);
            if (c->p >= c->e) FAIL(c, 1); /* a number cut by the chunk's end may go on: not interned yet */
            int32_t vn;
            if (token_len(c, v, &vn)) return -1;
            tid = intern(s, &s->tids, v, vn, 0);
            if (tid < 0) FAIL(c, 3);
        } else if (key_is(k, kn, "args")) {
            if ((named && s->names.flag[name]) || s->cats.flag[cat]) { /* name or cat before args, as Kineto writes */
                if (skip_args_correlation(c, &corr)) return -1;
                have_corr = 1;
            } else if (skip_value(c, 1)) {
                return -1;
            }
            if (token_len(c, v, &args_len)) return -1;
            args = v;
        } else if (skip_value(c, 1)) return -1;
        ws(c);
        if (c->p >= c->e) FAIL(c, 1);
        if (*c->p == ',') { c->p++; continue; }
        if (*c->p == '}') { c->p++; break; }
        FAIL(c, 1);
    }
    if (!is_x) return 0;
    if (s->n >= s->max_rows) FAIL(c, 8);
    if (reserve(s)) FAIL(c, 3);
    int64_t i = s->n++;
    s->ts[i] = ts;
    s->dur[i] = dur;
    s->name[i] = name;
    s->cat[i] = cat;
    s->tid[i] = tid;
    uint8_t want = s->names.flag[name] ? s->names.flag[name] : s->cats.flag[cat];
    if (!args || !want) return 0;
    if (reserve_kept(s)) FAIL(c, 3);
    int64_t k = s->nk++;
    s->k_row[k] = i;
    s->k_corr[k] = have_corr ? corr : find_correlation(args, args_len);
    s->k_off[k] = -1;
    s->k_len[k] = 0;
    if (want == 1 || s->k_corr[k] == -2) { /* -2: Python reads these args */
        int64_t off = arena_put(&s->args, args, args_len);
        if (off < 0) FAIL(c, 3);
        s->k_off[k] = off;
        s->k_len[k] = args_len;
    }
    return 0;
}

static void table_init(table_t *t) {
    /* id 0: the field's default, for events without it (no bytes) */
    t->cap = 256;
    t->off = malloc(256 * 8);
    t->len = malloc(256 * 4);
    t->hash = malloc(256 * 4);
    t->flag = malloc(256);
    if (t->off && t->len && t->hash && t->flag) { t->off[0] = 0; t->len[0] = 0; t->hash[0] = 0; t->flag[0] = 0; t->n = 1; }
}

static void table_release(table_t *t) {
    free(t->off); free(t->len); free(t->hash); free(t->flag); free(t->slot); free(t->bytes.p);
}

scan_t *scan_open(const char *const *hints, int32_t nhints) {
    scan_t *s = calloc(1, sizeof(scan_t));
    if (!s) return NULL;
    table_init(&s->names);
    table_init(&s->cats);
    table_init(&s->tids);
    s->hints = calloc((size_t)nhints + 1, sizeof(char *));
    if (!s->names.n || !s->cats.n || !s->tids.n || !s->hints) { s->err = 3; return s; }
    for (int32_t i = 0; i < nhints; i++) {
        s->hints[i] = strdup(hints[i]);
        if (!s->hints[i]) { s->err = 3; return s; }
    }
    s->nhints = nhints;
    s->max_token = (int64_t)1 << 30;
    s->max_rows = INT64_MAX;
    return s;
}

void scan_close(scan_t *s) {
    if (!s) return;
    free(s->ts); free(s->dur); free(s->name); free(s->cat); free(s->tid);
    free(s->k_row); free(s->k_off); free(s->k_corr); free(s->k_len);
    table_release(&s->names);
    table_release(&s->cats);
    table_release(&s->tids);
    free(s->args.p); free(s->dist.p); free(s->meta.p); free(s->host.p);
    for (int32_t i = 0; i < s->nhints; i++) free(s->hints[i]);
    free(s->hints);
    free(s);
}

/* Scan as much of buf as holds complete units (events, top-level values); returns the bytes
 * consumed (the caller keeps the rest and appends the next chunk), or -1 on error (s->err).
 * final: no more input follows (a cut unit is then an error, and the document must be done). */
int64_t scan_feed(scan_t *s, const char *buf, int64_t len, int32_t final) {
    if (s->err) return -1;
    cur_t c = {(const unsigned char *)buf, (const unsigned char *)buf, (const unsigned char *)buf + len, s};
    for (;;) {
        ws(&c);
        const unsigned char *mark = c.p; /* everything before is consumed */
        if (c.p >= c.e) {
            if (final && s->state != 4) { s->err = s->state == 0 ? 4 : 7; s->err_pos = len; return -1; }
            return (int64_t)(mark - c.b);
        }
        int rc = 0;
        unsigned char ch = *c.p;
        switch (s->state) {
        case 0:
            if (ch == '[') { s->bare = s->found = 1; s->state = 2; s->first = 1; s->after_comma = 0; c.p++; }
            else if (ch == '{') { s->state = 1; s->first = 1; c.p++; }
            else { s->err = 2; return -1; }
            break;
        case 1: {
            if (ch == '}' && s->first) { c.p++; s->state = 4; break; }
            const unsigned char *k;
            int32_t kn;
            if ((rc = member_key(&c, &k, &kn))) break;
            const unsigned char *v = c.p;
            if (key_is(k, kn, "traceEvents")) {
                if (s->found) { s->err = 6; s->err_pos = (int64_t)(k - c.b); return -1; } /* which one is the trace? */
                if (*c.p != '[') { s->err = 2; return -1; }
                c.p++;
                s->found = 1; s->state = 2; s->first = 1; s->after_comma = 0;
                break;
            }
            if (key_is(k, kn, "baseTimeNanoseconds")) {
                int64_t x = 0;
                int neg = 0;
                if (*c.p == '-') { neg = 1; c.p++; }
                if (c.p >= c.e) { s->err = 1; s->err_pos = len; rc = -1; break; }
                if (*c.p < '0' || *c.p > '9') { s->err = 2; return -1; }
                while (c.p < c.e && *c.p >= '0' && *c.p <= '9') {
                    if (x > (INT64_MAX - 9) / 10) { s->err = 2; return -1; }
                    x = x * 10 + (*c.p++ - '0');
                }
                if (c.p < c.e && (*c.p == '.' || *c.p == 'e' || *c.p == 'E')) { s->err = 2; return -1; }
                s->base_ns = neg ? -x : x;
            } else if ((rc = skip_value(&c, 1))) {
                break;
            }
            if (c.p >= c.e && !final) { s->err = 1; s->err_pos = len; rc = -1; break; } /* may continue */
            int dist = key_is(k, kn, "distributedInfo"), host = key_is(k, kn, "host_name");
            if (dist || host || key_is(k, kn, "commprobe")) {
                arena_t *a = dist ? &s->dist : host ? &s->host : &s->meta;
                if (c.p - v > s->max_token) { s->err = 5; s->err_pos = (int64_t)(v - c.b); return -1; }
                a->n = 0;
                if (arena_put(a, v, c.p - v) < 0) { s->err = 3; return -1; }
                *(dist ? &s->has_dist : host ? &s->has_host : &s->has_meta) = 1;
            }
            s->state = 3;
            break;
        }
        case 3:
            if (ch == ',') { c.p++; s->state = 1; s->first = 0; }
            else if (ch == '}') { c.p++; s->state = 4; }
            else { s->err = 1; s->err_pos = c.p - c.b; return -1; }
            break;
        case 2:
            if (ch == ']' && !s->after_comma) { c.p++; s->state = s->bare ? 4 : 3; break; }
            if (ch == ',' && !s->first && !s->after_comma) { c.p++; s->after_comma = 1; break; }
            if (!s->first && !s->after_comma) { s->err = 1; s->err_pos = c.p - c.b; return -1; }
            rc = event(&c);
            if (!rc) { s->first = 0; s->after_comma = 0; }
            break;
        default: /* 4: only whitespace may follow */
            s->err = 1;
            s->err_pos = c.p - c.b;
            return -1;
        }
        if (rc) {
            if (!final && s->err == 1 && s->err_pos >= len) { /* cut by the chunk's end: next call */
                s->err = 0;
                s->err_pos = 0;
                return (int64_t)(mark - c.b);
            }
            if (final && s->err == 1 && s->err_pos >= len) s->err = 7; /* the input ends inside an event */
            return -1;
        }
    }
}

int32_t scan_error(scan_t *s) { return s->err ? s->err : (s->found ? 0 : 4); }
int64_t scan_rows(scan_t *s) { return s->n; }
int64_t scan_error_pos(scan_t *s) { return s->err_pos; }
void scan_set_max_token(scan_t *s, int64_t n) { s->max_token = n; }
void scan_set_max_rows(scan_t *s, int64_t n) { s->max_rows = n; }
int64_t scan_base_ns(scan_t *s) { return s->base_ns; }

/* Columns: 0 ts, 1 dur, 2 name, 3 cat, 4 tid (s->n rows); 5 k_row, 6 k_off, 7 k_len, 8 k_corr (s->nk rows). */
static void **column(scan_t *s, int32_t which) {
    void **cols[9] = {(void **)&s->ts, (void **)&s->dur, (void **)&s->name, (void **)&s->cat, (void **)&s->tid,
                      (void **)&s->k_row, (void **)&s->k_off, (void **)&s->k_len, (void **)&s->k_corr};
    return which >= 0 && which < 9 ? cols[which] : NULL;
}

void *scan_column(scan_t *s, int32_t which) {
    void **p = column(s, which);
    return p ? *p : NULL;
}

int64_t scan_kept(scan_t *s) { return s->nk; }

/* Free one column as soon as the caller has copied it. */
void scan_drop_column(scan_t *s, int32_t which) {
    void **p = column(s, which);
    if (p) { free(*p); *p = NULL; }
}

/* String tables: 0 names, 1 cats, 2 tids; their size, each entry's (offset, length) in bytes. */
int64_t scan_table(scan_t *s, int32_t which, int64_t **off, int32_t **len, char **bytes) {
    table_t *t = which == 0 ? &s->names : which == 1 ? &s->cats : &s->tids;
    *off = t->off;
    *len = t->len;
    *bytes = t->bytes.p;
    return t->n;
}

/* Per name (table 0), what its hints said: 0 none, 1 args kept, 2 correlation only. */
uint8_t *scan_name_flags(scan_t *s) { return s->names.flag; }

/* Raw arenas: 0 args, 1 distributedInfo, 2 commprobe, 3 host_name (length -1: absent). */
char *scan_arena(scan_t *s, int32_t which, int64_t *len) {
    arena_t *a = which == 0 ? &s->args : which == 1 ? &s->dist : which == 2 ? &s->meta : &s->host;
    *len = which == 1 && !s->has_dist ? -1 : which == 2 && !s->has_meta ? -1 : which == 3 && !s->has_host ? -1 : a->n;
    return a->p;
}

/* The values of a few named keys of each given "args" object (raw bytes at buf + off[i], already
 * valid JSON), interned by raw bytes: out[i * nkeys + k] is the id of event i's value for keys[k]
 * in the returned table (the last one where a key repeats), -1 when absent, and -2 in every key
 * of an object with a key written with escapes (the caller decodes it by JSON's rules). */
table_t *args_fields(const char *buf, int64_t len, int64_t n, const int64_t *off, const int32_t *alen, int32_t nkeys,
                     const char *const *keys, const int32_t *klen, int32_t *out) {
    scan_t tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.max_token = INT32_MAX; /* the spans were checked when they were kept */
    table_t *t = calloc(1, sizeof(table_t));
    if (!t) return NULL;
    cur_t c = {(const unsigned char *)buf, (const unsigned char *)buf, (const unsigned char *)buf + len, &tmp};
    for (int64_t i = 0; i < n; i++) {
        for (int32_t k = 0; k < nkeys; k++) out[i * nkeys + k] = -1;
        if (off[i] < 0 || buf[off[i]] != '{') continue;
        tmp.err = 0;
        c.p = (const unsigned char *)buf + off[i];
        c.e = c.p + alen[i];
        c.p++;
        ws(&c);
        if (c.p < c.e && *c.p == '}') continue;
        for (;;) {
            ws(&c);
            const unsigned char *kk;
            int32_t kn;
            if (member_key(&c, &kk, &kn)) { /* a key written with escapes: -2, the caller decodes the object */
                if (tmp.err == 2) for (int32_t k = 0; k < nkeys; k++) out[i * nkeys + k] = -2;
                break;
            }
            const unsigned char *v = c.p;
            if (skip_value(&c, 1)) break;
            for (int32_t k = 0; k < nkeys; k++) {
                if (klen[k] == kn && !memcmp(keys[k], kk, (size_t)kn)) {
                    int32_t id = intern(&tmp, t, v, (int32_t)(c.p - v), 0);
                    if (id < 0) { table_release(t); free(t); return NULL; }
                    out[i * nkeys + k] = id;
                }
            }
            ws(&c);
            if (c.p >= c.e || *c.p != ',') break;
            c.p++;
        }
    }
    return t;
}

void table_free(table_t *t) {
    if (!t) return;
    table_release(t);
    free(t);
}

/* A table's size and each entry's (offset, length) in its bytes (for args_fields' result). */
int64_t table_entries(table_t *t, int64_t **off, int32_t **len, char **bytes) {
    *off = t->off;
    *len = t->len;
    *bytes = t->bytes.p;
    return t->n;
}
