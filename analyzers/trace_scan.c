/* JSON trace -> columns, in one pass, without one Python object per event.
 *
 * Reads a Kineto/Chrome trace (an object with "traceEvents", or a bare array of events) and
 * returns, for every complete ("ph": "X") event: ts, dur, interned name, cat and tid ids, and
 * the byte span of its "args" (read later, by args_fields, only for the few events that need
 * them). Strings are interned by their raw bytes; Python decodes each distinct one
 * once. Any input this scanner does not accept (malformed JSON, a field of an unexpected type)
 * makes it return an error and the caller falls back to the msgspec decoder, which then names
 * the problem; so this file only has to be right on the happy path and strict elsewhere.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t n, cap;
    int64_t *off;
    int32_t *len;
    uint32_t *hash;
    int32_t *slot; /* open addressing: id + 1, 0 = empty */
    int64_t nslots;
} table_t;

typedef struct {
    int64_t n, cap;
    double *ts, *dur;
    int32_t *name, *cat;
    int32_t *tid;
    int64_t *args_off;
    int32_t *args_len;
    table_t names, cats, tids;
    int64_t base_ns;
    int64_t dist_off, meta_off;
    int32_t dist_len, meta_len;
    int64_t err_pos;
    int32_t err; /* 0 ok, 1 malformed JSON, 2 unexpected type, 3 out of memory, 4 no events array */
} scan_t;

typedef struct {
    const unsigned char *p, *b, *e;
    scan_t *s;
} cur_t;

#define FAIL(c, code) do { if (!(c)->s->err) { (c)->s->err = (code); (c)->s->err_pos = (int64_t)((c)->p - (c)->b); } return -1; } while (0)

static inline void ws(cur_t *c) {
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

/* A string token starting at '"'; leaves p after the closing quote. Checks escapes and
 * control characters as JSON requires (UTF-8 is checked by Python for the strings it decodes). */
static int skip_string(cur_t *c) {
    const unsigned char *p = c->p + 1, *e = c->e;
    for (;;) {
        while (p < e && *p != '"' && *p != '\\' && *p >= 0x20) p++;
        if (p >= e || *p < 0x20) { c->p = p; FAIL(c, 1); }
        if (*p == '"') { c->p = p + 1; return 0; }
        p++; /* a backslash: one escape */
        if (p >= e) { c->p = p; FAIL(c, 1); }
        if (*p == 'u') {
            if (e - p < 5) { c->p = p; FAIL(c, 1); }
            for (int k = 1; k <= 4; k++) {
                unsigned char h = p[k];
                if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) { c->p = p; FAIL(c, 1); }
            }
            p += 5;
        } else if (*p && strchr("\"\\/bfnrt", *p)) {
            p++;
        } else {
            c->p = p;
            FAIL(c, 1);
        }
    }
}

/* JSON number grammar; value returned through *out (exact for the common case). */
static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int number(cur_t *c, double *out, int *is_int) {
    const unsigned char *s = c->p;
    int neg = 0;
    if (c->p < c->e && *c->p == '-') { neg = 1; c->p++; }
    if (c->p >= c->e || *c->p < '0' || *c->p > '9') FAIL(c, 1);
    uint64_t m = 0;
    int digits = 0, exp10 = 0;
    if (*c->p == '0') { c->p++; }
    else while (c->p < c->e && *c->p >= '0' && *c->p <= '9') {
        if (digits < 19) { m = m * 10 + (uint64_t)(*c->p - '0'); digits++; } else exp10++;
        c->p++;
    }
    *is_int = 1;
    if (c->p < c->e && *c->p == '.') {
        *is_int = 0;
        c->p++;
        if (c->p >= c->e || *c->p < '0' || *c->p > '9') FAIL(c, 1);
        while (c->p < c->e && *c->p >= '0' && *c->p <= '9') {
            if (digits < 19) { m = m * 10 + (uint64_t)(*c->p - '0'); digits++; exp10--; }
            c->p++;
        }
    }
    if (c->p < c->e && (*c->p == 'e' || *c->p == 'E')) {
        *is_int = 0;
        c->p++;
        int eneg = 0, ev = 0;
        if (c->p < c->e && (*c->p == '+' || *c->p == '-')) { eneg = *c->p == '-'; c->p++; }
        if (c->p >= c->e || *c->p < '0' || *c->p > '9') FAIL(c, 1);
        while (c->p < c->e && *c->p >= '0' && *c->p <= '9') { if (ev < 100000) ev = ev * 10 + (*c->p - '0'); c->p++; }
        exp10 += eneg ? -ev : ev;
    }
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
    return 0;
}

static int skip_value(cur_t *c, int depth);

static int skip_container(cur_t *c, int depth) {
    unsigned char close = *c->p == '{' ? '}' : ']';
    int obj = close == '}';
    if (depth > 512) FAIL(c, 1);
    c->p++;
    ws(c);
    if (c->p < c->e && *c->p == close) { c->p++; return 0; }
    for (;;) {
        ws(c);
        if (obj) {
            if (c->p >= c->e || *c->p != '"') FAIL(c, 1);
            if (skip_string(c)) return -1;
            ws(c);
            if (c->p >= c->e || *c->p != ':') FAIL(c, 1);
            c->p++;
            ws(c);
        }
        if (skip_value(c, depth + 1)) return -1;
        ws(c);
        if (c->p >= c->e) FAIL(c, 1);
        if (*c->p == ',') { c->p++; continue; }
        if (*c->p == close) { c->p++; return 0; }
        FAIL(c, 1);
    }
}

static int literal(cur_t *c, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(c->e - c->p) < n || memcmp(c->p, word, n)) FAIL(c, 1);
    c->p += n;
    return 0;
}

static int skip_value(cur_t *c, int depth) {
    if (c->p >= c->e) FAIL(c, 1);
    switch (*c->p) {
    case '"': return skip_string(c);
    case '{': case '[': return skip_container(c, depth);
    case 't': return literal(c, "true");
    case 'f': return literal(c, "false");
    case 'n': return literal(c, "null");
    default: { int i; return number(c, NULL, &i); }
    }
}

static uint32_t hash_bytes(const unsigned char *p, int32_t n) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

static int grow(void **p, int64_t cap, size_t elem) {
    void *q = realloc(*p, (size_t)cap * elem);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int32_t intern(cur_t *c, table_t *t, const unsigned char *p, int32_t n) {
    uint32_t h = hash_bytes(p, n);
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
        if (t->hash[id] == h && t->len[id] == n && !memcmp(c->b + t->off[id], p, (size_t)n)) return id;
        j = (j + 1) & (t->nslots - 1);
    }
    if (t->n == t->cap) {
        int64_t cap = t->cap ? t->cap * 2 : 256;
        if (grow((void **)&t->off, cap, 8) || grow((void **)&t->len, cap, 4) || grow((void **)&t->hash, cap, 4)) return -1;
        t->cap = cap;
    }
    t->off[t->n] = (int64_t)(p - c->b);
    t->len[t->n] = n;
    t->hash[t->n] = h;
    t->slot[j] = (int32_t)(t->n + 1);
    return (int32_t)t->n++;
}

static int reserve(scan_t *s) {
    if (s->n < s->cap) return 0;
    int64_t cap = s->cap ? s->cap * 2 : 4096;
    if (grow((void **)&s->ts, cap, 8) || grow((void **)&s->dur, cap, 8) || grow((void **)&s->name, cap, 4) ||
        grow((void **)&s->cat, cap, 4) || grow((void **)&s->tid, cap, 4) || grow((void **)&s->args_off, cap, 8) ||
        grow((void **)&s->args_len, cap, 4))
        return -1;
    s->cap = cap;
    return 0;
}

static inline int key_is(const unsigned char *k, int32_t n, const char *lit) {
    return (size_t)n == strlen(lit) && !memcmp(k, lit, (size_t)n);
}

/* One event object; appends a row when its ph is "X". Fields are read only when typed as the
 * msgspec path expects (ph/name/cat: string; ts/dur: number; tid: integer or string). */
static int event(cur_t *c, int32_t empty_name, int32_t empty_cat) {
    scan_t *s = c->s;
    if (c->p >= c->e || *c->p != '{') FAIL(c, 2);
    c->p++;
    int is_x = 0;
    double ts = 0, dur = 0;
    int32_t name = empty_name, cat = empty_cat, tid = 0, args_len = 0;
    int64_t args_off = -1;
    ws(c);
    if (c->p < c->e && *c->p == '}') { c->p++; return 0; }
    for (;;) {
        ws(c);
        if (c->p >= c->e || *c->p != '"') FAIL(c, 1);
        const unsigned char *k = c->p + 1;
        if (skip_string(c)) return -1;
        int32_t kn = (int32_t)(c->p - 1 - k);
        ws(c);
        if (c->p >= c->e || *c->p != ':') FAIL(c, 1);
        c->p++;
        ws(c);
        if (c->p >= c->e) FAIL(c, 1);
        const unsigned char *v = c->p;
        if (key_is(k, kn, "ph")) {
            if (*v != '"') FAIL(c, 2);
            if (skip_string(c)) return -1;
            is_x = c->p - v == 3 && v[1] == 'X';
        } else if (key_is(k, kn, "name") || key_is(k, kn, "cat")) {
            if (*v != '"') FAIL(c, 2);
            if (skip_string(c)) return -1;
            int32_t id = intern(c, kn == 4 ? &s->names : &s->cats, v, (int32_t)(c->p - v));
            if (id < 0) FAIL(c, 3);
            if (kn == 4) name = id; else cat = id;
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
            tid = intern(c, &s->tids, v, (int32_t)(c->p - v));
            if (tid < 0) FAIL(c, 3);
        } else if (key_is(k, kn, "args")) {
            if (skip_value(c, 1)) return -1;
            args_off = v - c->b;
            args_len = (int32_t)(c->p - v);
        } else if (skip_value(c, 1)) return -1;
        ws(c);
        if (c->p >= c->e) FAIL(c, 1);
        if (*c->p == ',') { c->p++; continue; }
        if (*c->p == '}') { c->p++; break; }
        FAIL(c, 1);
    }
    if (!is_x) return 0;
    if (reserve(s)) FAIL(c, 3);
    int64_t i = s->n++;
    s->ts[i] = ts;
    s->dur[i] = dur;
    s->name[i] = name;
    s->cat[i] = cat;
    s->tid[i] = tid;
    s->args_off[i] = args_off;
    s->args_len[i] = args_len;
    return 0;
}

static int events(cur_t *c) {
    if (*c->p != '[') FAIL(c, 2);
    c->p++;
    ws(c);
    if (c->p < c->e && *c->p == ']') { c->p++; return 0; }
    for (;;) {
        ws(c);
        if (event(c, 0, 0)) return -1;
        ws(c);
        if (c->p >= c->e) FAIL(c, 1);
        if (*c->p == ',') { c->p++; continue; }
        if (*c->p == ']') { c->p++; return 0; }
        FAIL(c, 1);
    }
}

static void reserve_empty(table_t *t) {
    /* id 0: the field's default, for events without it (offset -1, length 0) */
    t->cap = 256;
    t->off = malloc(256 * 8);
    t->len = malloc(256 * 4);
    t->hash = malloc(256 * 4);
    if (t->off && t->len && t->hash) { t->off[0] = -1; t->len[0] = 0; t->hash[0] = 0; t->n = 1; }
}

void trace_scan_free(scan_t *s) {
    if (!s) return;
    free(s->ts); free(s->dur); free(s->name); free(s->cat);
    free(s->tid); free(s->args_off); free(s->args_len);
    table_t *ts[3] = {&s->names, &s->cats, &s->tids};
    for (int i = 0; i < 3; i++) { free(ts[i]->off); free(ts[i]->len); free(ts[i]->hash); free(ts[i]->slot); }
    free(s);
}

scan_t *trace_scan(const char *buf, int64_t len) {
    scan_t *s = calloc(1, sizeof(scan_t));
    if (!s) return NULL;
    s->dist_off = s->meta_off = -1;
    reserve_empty(&s->names);
    reserve_empty(&s->cats);
    reserve_empty(&s->tids);
    if (!s->names.n || !s->cats.n || !s->tids.n) { s->err = 3; return s; }
    cur_t c = {(const unsigned char *)buf, (const unsigned char *)buf, (const unsigned char *)buf + len, s};
    cur_t *cp = &c;
    int found = 0;
    ws(cp);
    if (c.p >= c.e) { s->err = 1; return s; }
    if (*c.p == '[') {
        if (events(cp)) return s;
        found = 1;
    } else if (*c.p == '{') {
        c.p++;
        ws(cp);
        if (c.p < c.e && *c.p == '}') c.p++;
        else for (;;) {
            ws(cp);
            if (c.p >= c.e || *c.p != '"') { s->err = 1; s->err_pos = c.p - c.b; return s; }
            const unsigned char *k = c.p + 1;
            if (skip_string(cp)) return s;
            int32_t kn = (int32_t)(c.p - 1 - k);
            ws(cp);
            if (c.p >= c.e || *c.p != ':') { s->err = 1; s->err_pos = c.p - c.b; return s; }
            c.p++;
            ws(cp);
            const unsigned char *v = c.p;
            if (key_is(k, kn, "traceEvents")) {
                if (events(cp)) return s;
                found = 1;
            } else if (key_is(k, kn, "baseTimeNanoseconds")) {
                /* an integer (int64); anything else: let msgspec judge it */
                int64_t x = 0;
                int neg = 0;
                if (c.p < c.e && *c.p == '-') { neg = 1; c.p++; }
                if (c.p >= c.e || *c.p < '0' || *c.p > '9') { s->err = 2; return s; }
                while (c.p < c.e && *c.p >= '0' && *c.p <= '9') {
                    if (x > (INT64_MAX - 9) / 10) { s->err = 2; return s; }
                    x = x * 10 + (*c.p++ - '0');
                }
                if (c.p < c.e && (*c.p == '.' || *c.p == 'e' || *c.p == 'E')) { s->err = 2; return s; }
                s->base_ns = neg ? -x : x;
            } else {
                if (skip_value(cp, 1)) return s;
                if (key_is(k, kn, "distributedInfo")) { s->dist_off = v - c.b; s->dist_len = (int32_t)(c.p - v); }
                if (key_is(k, kn, "commprobe")) { s->meta_off = v - c.b; s->meta_len = (int32_t)(c.p - v); }
            }
            ws(cp);
            if (c.p >= c.e) { s->err = 1; s->err_pos = c.p - c.b; return s; }
            if (*c.p == ',') { c.p++; continue; }
            if (*c.p == '}') { c.p++; break; }
            s->err = 1;
            s->err_pos = c.p - c.b;
            return s;
        }
    } else {
        s->err = 2;
        return s;
    }
    ws(cp);
    if (c.p != c.e) { s->err = 1; s->err_pos = c.p - c.b; return s; }
    if (!found) s->err = 4;
    return s;
}

/* The values of a few named keys of each given "args" object (spans found by trace_scan in the
 * same buffer, so already valid JSON), interned by raw bytes: out[i * nkeys + k] is the id of
 * event i's value for keys[k] in the returned table, or -1 when absent. */
table_t *args_fields(const char *buf, int64_t len, int64_t n, const int64_t *off, const int32_t *alen, int32_t nkeys,
                     const char *const *keys, const int32_t *klen, int32_t *out) {
    scan_t tmp;
    memset(&tmp, 0, sizeof tmp);
    table_t *t = calloc(1, sizeof(table_t));
    if (!t) return NULL;
    cur_t c = {(const unsigned char *)buf, (const unsigned char *)buf, (const unsigned char *)buf + len, &tmp};
    for (int64_t i = 0; i < n; i++) {
        for (int32_t k = 0; k < nkeys; k++) out[i * nkeys + k] = -1;
        if (off[i] < 0 || buf[off[i]] != '{') continue;
        c.p = (const unsigned char *)buf + off[i];
        c.e = c.p + alen[i];
        c.p++;
        ws(&c);
        if (c.p < c.e && *c.p == '}') continue;
        for (;;) {
            ws(&c);
            const unsigned char *kk = c.p + 1;
            if (skip_string(&c)) break;
            int32_t kn = (int32_t)(c.p - 1 - kk);
            ws(&c);
            c.p++; /* ':' */
            ws(&c);
            const unsigned char *v = c.p;
            if (skip_value(&c, 1)) break;
            for (int32_t k = 0; k < nkeys; k++) {
                if (klen[k] == kn && !memcmp(keys[k], kk, (size_t)kn)) {
                    int32_t id = intern(&c, t, v, (int32_t)(c.p - v));
                    if (id < 0) { free(t->off); free(t->len); free(t->hash); free(t->slot); free(t); return NULL; }
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
    free(t->off); free(t->len); free(t->hash); free(t->slot);
    free(t);
}

/* Free one column as soon as the caller has copied it (the peak is input + one column, not
 * input + all columns twice). */
void scan_free_ptr(void *p) { free(p); }
