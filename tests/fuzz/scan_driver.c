/* The trace scanner under AddressSanitizer and UndefinedBehaviorSanitizer: a persistent process
 * that reads cases from stdin and scans each the way analyzers/native.py does (chunks, a cut
 * unit handed again once it has doubled, then the kept args read by args_fields), answering one
 * byte per case on stdout. A memory or UB error aborts the process with the sanitizer's report
 * on stderr; the harness (tests/fuzz/harness.py) then names the case.
 *
 * Case: u32 length, u32 chunk size (0: whole), u64 max_token (0: default), then the bytes.
 * Answer: '.' accepted, 'R' refused. argv: the hints, as native.scan gets them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct scan scan_t;
typedef struct table table_t;
scan_t *scan_open(const char *const *hints, int32_t nhints);
void scan_close(scan_t *s);
int64_t scan_feed(scan_t *s, const char *buf, int64_t len, int32_t final);
int32_t scan_error(scan_t *s);
int64_t scan_rows(scan_t *s);
int64_t scan_kept(scan_t *s);
void scan_set_max_token(scan_t *s, int64_t n);
void *scan_column(scan_t *s, int32_t which);
void *scan_arena(scan_t *s, int32_t which, int64_t *len);
int64_t scan_table(scan_t *s, int32_t which, int64_t **off, int32_t **len, char **bytes);
table_t *args_fields(const char *buf, int64_t len, int64_t n, const int64_t *off, const int32_t *alen, int32_t nkeys,
                     const char *const *keys, const int32_t *klen, int32_t *out);
int64_t table_entries(table_t *t, int64_t **off, int32_t **len, char **bytes);
void table_free(table_t *t);

static int read_all(void *p, size_t n) { return fread(p, 1, n, stdin) == n; }

static volatile uint64_t sink; /* touch every byte the API hands out, so ASan checks its bounds */

static void touch(const char *p, int64_t n) { for (int64_t i = 0; i < n; i++) sink += (unsigned char)p[i]; }

static char scan_case(const char *data, int64_t n, int64_t chunk, int64_t max_token, const char *const *hints, int nh) {
    scan_t *s = scan_open(hints, nh);
    if (!s) return 'R';
    if (max_token) scan_set_max_token(s, max_token);
    if (chunk <= 0) chunk = n ? n : 1;
    char *buf = NULL;
    int64_t have = 0, cap = 0, wait = 0, used = 0;
    for (int64_t at = 0; at < n && used >= 0; at += chunk) {
        int64_t k = n - at < chunk ? n - at : chunk;
        if (have + k > cap) { cap = (have + k) * 2; buf = realloc(buf, (size_t)cap); }
        memcpy(buf + have, data + at, (size_t)k);
        have += k;
        if (have < wait) continue;
        used = scan_feed(s, buf, have, 0);
        if (used < 0) break;
        memmove(buf, buf + used, (size_t)(have - used));
        have -= used;
        wait = 2 * have;
    }
    if (used >= 0) used = scan_feed(s, buf ? buf : "", have, 1);
    free(buf);
    char answer = used < 0 || scan_error(s) ? 'R' : '.';
    if (answer == '.') {
        int64_t rows = scan_rows(s), nk = scan_kept(s);
        for (int c = 0; c < 5; c++) if (rows) touch(scan_column(s, c), rows * (c < 2 ? 8 : 4));
        for (int t = 0; t < 3; t++) {
            int64_t *off; int32_t *len; char *bytes;
            int64_t m = scan_table(s, t, &off, &len, &bytes);
            for (int64_t i = 1; i < m; i++) touch(bytes + off[i], len[i]);
        }
        int64_t alen;
        char *args = scan_arena(s, 0, &alen);
        const int64_t *koff = scan_column(s, 6);
        const int32_t *klen = scan_column(s, 7);
        static const char *const keys[] = {"Collective name", "In msg nelems", "Seq", "Input Dims", "correlation"};
        int32_t kl[5];
        for (int i = 0; i < 5; i++) kl[i] = (int32_t)strlen(keys[i]);
        int32_t *out = malloc(sizeof(int32_t) * 5 * (size_t)(nk ? nk : 1));
        table_t *t = args_fields(args ? args : "", alen > 0 ? alen : 0, nk, koff, klen, 5, keys, kl, out);
        if (t) {
            int64_t *off; int32_t *len; char *bytes;
            int64_t m = table_entries(t, &off, &len, &bytes);
            for (int64_t i = 1; i < m; i++) touch(bytes + off[i], len[i]);
            table_free(t);
        }
        free(out);
    }
    scan_close(s);
    return answer;
}

int main(int argc, char **argv) {
    for (;;) {
        uint32_t n, chunk;
        uint64_t max_token;
        if (!read_all(&n, 4) || !read_all(&chunk, 4) || !read_all(&max_token, 8)) return 0;
        char *data = malloc(n ? n : 1);
        if (!read_all(data, n)) return 1;
        char answer = scan_case(data, n, chunk, (int64_t)max_token, (const char *const *)argv + 1, argc - 1);
        free(data);
        fputc(answer, stdout);
        fflush(stdout);
    }
}
