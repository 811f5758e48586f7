/*
 * commprobe DDA (Direct Data Access) collectives over shared memory between processes.
 *
 * Layout of the shared segment (one per process group, mapped by every rank):
 *   [ header: one rank_hdr_t per rank ][ data: 2 buffers x world slots x slot_bytes ]
 * Every rank writes only into its own slot; peers read it directly ("direct data access").
 *
 * Steps. Each collective is one or more *steps* numbered k = 1, 2, ... identically on every
 * rank (chunks of a large message and all-to-all rounds are steps too). Step k uses data
 * buffer k & 1 (double buffering). A rank publishes "my slot for step k is written" by
 * storing k into its `ready` flag; two-shot publishes its reduced chunk through `ready2`.
 *
 * Buffer reuse. Before writing its slot for step k, a rank waits until every peer's `ready`
 * is >= k - 1: a peer that has started step k - 1 has finished reading step k - 2, which used
 * the same buffer. After a one-shot, two-shot, all-gather or all-to-all this already holds
 * (one acquire load per peer); after a ring send/recv it can really wait.
 *
 * Memory ordering (why this is correct beyond x86). Flag stores are __atomic stores with
 * sequentially consistent (so at least release) ordering: every load and store of the slot
 * done before the store is visible before the flag. Flag loads are acquire (seq_cst when
 * deciding to sleep): data read after seeing the flag is the data written before it. The
 * sleep/wake handshake is Dekker-style with seq_cst on both sides: a waiter increments
 * `waiters` then re-reads the flag; a poster stores the flag then reads `waiters`. Total
 * order guarantees at least one of them sees the other, so a wake-up is never lost, and
 * FUTEX_WAIT itself re-checks the word atomically before sleeping.
 *
 * Waiting (`wait_mode`, set by dda_set_wait). How a rank waits for a peer decides what DDA
 * costs when ranks do not own their cores, and the peers chose differently: vLLM-CPU's shm
 * allreduce and DeepSpeed's shm allreduce spin (a pause loop, no sleep); oneCCL lets the user
 * choose (CCL_WORKER_WAIT: none, pause, nanosleep, sched_yield). The modes, all bounded by the
 * same deadline:
 *   SPIN_FUTEX  spin `spin_ns` with a pause instruction, then sleep on a futex in 5 ms slices;
 *   FUTEX       sleep on the futex at once (no spin);
 *   YIELD       re-check after sched_yield(), never sleeping (the core goes to whoever is ready);
 *   SPIN        pause-spin only, as vLLM and DeepSpeed do;
 *   ADAPTIVE    spin a budget that halves each time a spin ends in a sleep and doubles each time
 *               it succeeds (between SPIN_MIN_NS and spin_ns), then sleep on the futex: a rank
 *               beside a busy process stops burning the slices the peer it waits for needs.
 * The futex is shared, not private: the word lives in a MAP_SHARED file mapping. Sleeping is
 * what keeps 4 ranks on 2 cores fast: a spinner holds its core for a whole scheduler slice
 * while the rank it waits for cannot run. The measurements behind the default are in
 * bench/RESULTS.md, "DDA under load".
 */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CL 64
#define MAXW 64
#define BLOCK 2048 /* elements reduced per pass, so partial sums stay in L1 */
#define A2A_ROUND (256u * 1024u) /* all-to-all bytes per peer and round (pipelining grain) */
#define SPIN_MIN_NS 2000 /* the adaptive spin budget's floor: one futex round trip or so */
#define DDA_INTERRUPTED (-1000) /* a collective's return when a watched signal arrived during it */

enum { WAIT_SPIN_FUTEX = 0, WAIT_FUTEX = 1, WAIT_YIELD = 2, WAIT_SPIN = 3, WAIT_ADAPTIVE = 4, WAIT_MODES = 5 };

typedef struct {
    uint32_t val;
    uint32_t waiters;
    char pad[CL - 8];
} flag_t;

typedef struct {
    flag_t ready;       /* step k: my slot holds my input (or my round's rows) */
    flag_t ready2;      /* step k (two-shot): my reduced chunk is in my slot */
    uint64_t rounds[2]; /* all-to-all: rounds this rank needs, per data buffer */
    char pad[CL - 16];
} rank_hdr_t;

typedef struct {
    char *base;
    rank_hdr_t *hdr;
    char *data;
    int world, rank;
    uint64_t slot_bytes;
    uint32_t k; /* last step started */
    int64_t spin_ns; /* busy-wait this long before sleeping on the futex */
    int64_t spin_cur; /* ADAPTIVE: the spin budget now, in [SPIN_MIN_NS, spin_ns] */
    int64_t timeout_ns;
    int wait_mode;
    uint32_t sig0; /* g_signals when the running collective started */
} dda_ctx;

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };
static const int ELSIZE[3] = {4, 2, 2};

uint64_t dda_header_bytes(int world) { return (uint64_t)world * sizeof(rank_hdr_t); }

uint64_t dda_segment_bytes(int world, uint64_t slot_bytes) {
    return dda_header_bytes(world) + 2ull * (uint64_t)world * slot_bytes;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static inline int reached(uint32_t v, uint32_t target) { return (int32_t)(v - target) >= 0; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Signals. A rank waiting here is inside one C call with the GIL released, and Python runs its
 * own signal handlers (Ctrl-C's KeyboardInterrupt) only when that call returns: a rank whose peer
 * will never arrive would ignore Ctrl-C until the DDA timeout. So dda_watch_signals() puts a
 * handler in front of each watched signal that has a handler (Python's): it counts the signal
 * and calls the handler it replaced, and every wait gives up with DDA_INTERRUPTED once the count
 * moved during the collective, so the call returns and Python acts on the signal. Signals left at
 * their default (SIGTERM kills) or ignored are not touched. A later signal.signal() replaces our
 * handler, which only turns this off again. */
#define N_WATCHED 2
static const int WATCHED[N_WATCHED] = {SIGINT, SIGTERM};
static struct sigaction g_prev[N_WATCHED];
static uint32_t g_signals; /* watched signals seen, ever (atomic: async-signal-safe) */

static void on_signal(int sig, siginfo_t *info, void *uctx) {
    __atomic_fetch_add(&g_signals, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < N_WATCHED; i++) {
        if (WATCHED[i] != sig) continue;
        if (g_prev[i].sa_flags & SA_SIGINFO) g_prev[i].sa_sigaction(sig, info, uctx);
        else if (g_prev[i].sa_handler != SIG_DFL && g_prev[i].sa_handler != SIG_IGN) g_prev[i].sa_handler(sig);
    }
}

/* Watch SIGINT and SIGTERM where a handler is installed; returns how many are watched now. */
int dda_watch_signals(void) {
    int n = 0;
    for (int i = 0; i < N_WATCHED; i++) {
        struct sigaction cur, mine;
        if (sigaction(WATCHED[i], NULL, &cur)) continue;
        if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_signal) { n++; continue; }
        if (!(cur.sa_flags & SA_SIGINFO) && (cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN)) continue;
        mine = cur;
        mine.sa_sigaction = on_signal;
        mine.sa_flags = (cur.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
        g_prev[i] = cur;
        if (sigaction(WATCHED[i], &mine, NULL) == 0) n++;
    }
    return n;
}

/* How many watched signals this process has seen (tests). */
uint32_t dda_signals_seen(void) { return __atomic_load_n(&g_signals, __ATOMIC_SEQ_CST); }

static inline int signalled(const dda_ctx *c) { return __atomic_load_n(&g_signals, __ATOMIC_RELAXED) != c->sig0; }

/* Spin until f->val >= target or `ns` have passed (or the deadline, for ns < 0): 1 when reached,
 * 0 when the time ran out, -1 when a watched signal arrived. */
static int spin_for(dda_ctx *c, flag_t *f, uint32_t target, int64_t ns, int64_t deadline, int yield) {
    int64_t end = ns >= 0 ? now_ns() + ns : deadline;
    if (end > deadline) end = deadline;
    for (unsigned i = 1;; i++) {
        if (yield) sched_yield();
        else cpu_relax();
        if (reached(__atomic_load_n(&f->val, __ATOMIC_ACQUIRE), target)) return 1;
        if (signalled(c)) return -1;
        if ((yield || (i & 63) == 0) && now_ns() > end) return 0;
    }
}

/* Wait until f->val >= target; 0 on success, -1 on timeout, -2 when a watched signal arrived. */
static int wait_ge(dda_ctx *c, flag_t *f, uint32_t target) {
    if (reached(__atomic_load_n(&f->val, __ATOMIC_ACQUIRE), target)) return 0;
    int64_t deadline = now_ns() + c->timeout_ns;
    int s;
    switch (c->wait_mode) {
    case WAIT_SPIN:
    case WAIT_YIELD:
        s = spin_for(c, f, target, -1, deadline, c->wait_mode == WAIT_YIELD);
        return s > 0 ? 0 : s < 0 ? -2 : -1;
    case WAIT_ADAPTIVE:
        s = spin_for(c, f, target, c->spin_cur, deadline, 0);
        if (s > 0) {
            c->spin_cur = c->spin_cur * 2 > c->spin_ns ? c->spin_ns : c->spin_cur * 2;
            return 0;
        }
        if (s < 0) return -2;
        c->spin_cur = c->spin_cur / 2 < SPIN_MIN_NS ? SPIN_MIN_NS : c->spin_cur / 2;
        break;
    case WAIT_SPIN_FUTEX:
        s = c->spin_ns > 0 ? spin_for(c, f, target, c->spin_ns, deadline, 0) : 0;
        if (s > 0) return 0;
        if (s < 0) return -2;
        break;
    default: /* WAIT_FUTEX */
        break;
    }
    struct timespec slice = {0, 5 * 1000 * 1000};
    for (;;) {
        __atomic_fetch_add(&f->waiters, 1, __ATOMIC_SEQ_CST);
        uint32_t v = __atomic_load_n(&f->val, __ATOMIC_SEQ_CST);
        /* a signal arriving here ends FUTEX_WAIT at once (EINTR), and the check below sees it */
        if (!reached(v, target) && !signalled(c)) syscall(SYS_futex, &f->val, FUTEX_WAIT, v, &slice, NULL, 0);
        __atomic_fetch_sub(&f->waiters, 1, __ATOMIC_SEQ_CST);
        if (reached(__atomic_load_n(&f->val, __ATOMIC_ACQUIRE), target)) return 0;
        if (signalled(c)) return -2;
        if (now_ns() > deadline) return -1;
    }
}

/* A failed wait on peer p as a collective's return: -(p + 1) for a timeout, or DDA_INTERRUPTED. */
static inline int failed(int w, int p) { return w == -2 ? DDA_INTERRUPTED : -(p + 1); }

static void post(flag_t *f, uint32_t v) {
    __atomic_store_n(&f->val, v, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&f->waiters, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &f->val, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline char *slot(dda_ctx *c, uint32_t k, int r) {
    return c->data + ((uint64_t)(k & 1) * c->world + r) * c->slot_bytes;
}

/* Start step k: make sure every peer is done with this buffer's previous use. Returns k,
 * or -(peer + 1) when a peer did not arrive before the deadline. */
static int64_t begin_step(dda_ctx *c) {
    uint32_t k = ++c->k;
    for (int p = 0; p < c->world; p++) {
        if (p == c->rank) continue;
        int w = wait_ge(c, &c->hdr[p].ready, k - 1);
        if (w) return failed(w, p);
    }
    return k;
}

static int wait_all(dda_ctx *c, int second, uint32_t k) {
    for (int p = 0; p < c->world; p++) {
        if (p == c->rank) continue;
        flag_t *f = second ? &c->hdr[p].ready2 : &c->hdr[p].ready;
        int w = wait_ge(c, f, k);
        if (w) return failed(w, p);
    }
    return 0;
}

/* ---- reduction: out[i] = src[0][i] + src[1][i] + ... in rank order, identical on every rank ---- */

static inline float bf16_to_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* out2, when not NULL, receives a second copy of the result (saves re-reading it later). */
static void reduce(int dtype, char *out, char *out2, const char *const *src, int nsrc, uint64_t first, uint64_t n) {
    float acc[BLOCK];
    for (uint64_t b0 = first; b0 < first + n; b0 += BLOCK) {
        uint64_t m = first + n - b0 < BLOCK ? first + n - b0 : BLOCK;
        if (dtype == DT_F32) {
            float *o = (float *)out + b0;
            const float *a = (const float *)src[0] + b0, *b = (const float *)src[1] + b0;
            for (uint64_t i = 0; i < m; i++) acc[i] = a[i] + b[i];
            for (int s = 2; s < nsrc; s++) {
                const float *x = (const float *)src[s] + b0;
                for (uint64_t i = 0; i < m; i++) acc[i] += x[i];
            }
            memcpy(o, acc, m * 4);
            if (out2) memcpy((float *)out2 + b0, acc, m * 4);
        } else if (dtype == DT_BF16) {
            for (int s = 0; s < nsrc; s++) {
                const uint16_t *x = (const uint16_t *)src[s] + b0;
                if (s == 0)
                    for (uint64_t i = 0; i < m; i++) acc[i] = bf16_to_f(x[i]);
                else
                    for (uint64_t i = 0; i < m; i++) acc[i] += bf16_to_f(x[i]);
            }
            uint16_t *o = (uint16_t *)out + b0;
            for (uint64_t i = 0; i < m; i++) o[i] = f_to_bf16(acc[i]);
            if (out2) memcpy((uint16_t *)out2 + b0, o, m * 2);
        } else {
            for (int s = 0; s < nsrc; s++) {
                const _Float16 *x = (const _Float16 *)src[s] + b0;
                if (s == 0)
                    for (uint64_t i = 0; i < m; i++) acc[i] = (float)x[i];
                else
                    for (uint64_t i = 0; i < m; i++) acc[i] += (float)x[i];
            }
            _Float16 *o = (_Float16 *)out + b0;
            for (uint64_t i = 0; i < m; i++) o[i] = (_Float16)acc[i];
            if (out2) memcpy((_Float16 *)out2 + b0, o, m * 2);
        }
    }
}

/* ---- public API ---- */

dda_ctx *dda_open(char *base, int world, int rank, uint64_t slot_bytes, double spin_us, double timeout_s) {
    if (world < 1 || world > MAXW || rank < 0 || rank >= world || slot_bytes % CL) return NULL;
    dda_ctx *c = calloc(1, sizeof(dda_ctx));
    if (!c) return NULL;
    c->base = base;
    c->hdr = (rank_hdr_t *)base;
    c->data = base + dda_header_bytes(world);
    c->world = world;
    c->rank = rank;
    c->slot_bytes = slot_bytes;
    c->spin_ns = (int64_t)(spin_us * 1e3);
    c->spin_cur = c->spin_ns > SPIN_MIN_NS ? c->spin_ns : SPIN_MIN_NS;
    c->timeout_ns = (int64_t)(timeout_s * 1e9);
    c->k = __atomic_load_n(&c->hdr[rank].ready.val, __ATOMIC_ACQUIRE);
    return c;
}

void dda_close(dda_ctx *c) { free(c); }

void dda_set_spin(dda_ctx *c, double spin_us) {
    c->spin_ns = (int64_t)(spin_us * 1e3);
    c->spin_cur = c->spin_ns > SPIN_MIN_NS ? c->spin_ns : SPIN_MIN_NS;
}

/* Choose how this rank waits for its peers (the WAIT_* modes above); 0, or -1 for an unknown mode. */
int dda_set_wait(dda_ctx *c, int mode) {
    if (mode < 0 || mode >= WAIT_MODES) return -1;
    c->wait_mode = mode;
    return 0;
}

/* One-shot allreduce, in place allowed (out == in). Returns 0 or -(peer + 1). */
int dda_allreduce_oneshot(dda_ctx *c, const char *in, char *out, uint64_t n, int dtype) {
    c->sig0 = dda_signals_seen();
    uint64_t es = ELSIZE[dtype], per = c->slot_bytes / es;
    const char *src[MAXW];
    for (uint64_t off = 0; off < n || off == 0; off += per) {
        uint64_t m = n - off < per ? n - off : per;
        int64_t k = begin_step(c);
        if (k < 0) return (int)k;
        memcpy(slot(c, k, c->rank), in + off * es, m * es);
        post(&c->hdr[c->rank].ready, (uint32_t)k);
        int rc = wait_all(c, 0, k);
        if (rc) return rc;
        for (int p = 0; p < c->world; p++) src[p] = slot(c, k, p);
        if (c->world == 1)
            memcpy(out + off * es, in + off * es, m * es);
        else
            reduce(dtype, out + off * es, NULL, src, c->world, 0, m);
        if (n == 0) break;
    }
    return 0;
}

/* Two-shot: reduce-scatter by direct reads (rank r reduces chunk r), then all-gather by direct
 * reads of the reduced chunks. Traffic is trimmed where peers do not need it: a rank copies in
 * every chunk but its own (it reads its own chunk from its private input), and writes its reduced
 * chunk once into its output and once into its slot, where the peers read it. */
int dda_allreduce_twoshot(dda_ctx *c, const char *in, char *out, uint64_t n, int dtype) {
    c->sig0 = dda_signals_seen();
    uint64_t es = ELSIZE[dtype], per = c->slot_bytes / es;
    int w = c->world, me = c->rank;
    const char *src[MAXW];
    if (w == 1) return dda_allreduce_oneshot(c, in, out, n, dtype);
    for (uint64_t off = 0; off < n; off += per) {
        uint64_t m = n - off < per ? n - off : per;
        uint64_t line = CL / es;
        uint64_t chunk = ((m + w - 1) / w + line - 1) / line * line; /* whole cache lines per rank */
        uint64_t lo = (uint64_t)me * chunk < m ? (uint64_t)me * chunk : m;
        uint64_t hi = lo + chunk < m ? lo + chunk : m;
        int64_t k = begin_step(c);
        if (k < 0) return (int)k;
        char *mine = slot(c, k, me);
        const char *x = in + off * es;
        memcpy(mine, x, lo * es);
        memcpy(mine + hi * es, x + hi * es, (m - hi) * es);
        post(&c->hdr[me].ready, (uint32_t)k);
        int rc = wait_all(c, 0, k);
        if (rc) return rc;
        if (lo < hi) {
            for (int p = 0; p < w; p++) src[p] = p == me ? x : slot(c, k, p);
            /* in-place safe: each block is read whole before it is written */
            reduce(dtype, out + off * es, mine, src, w, lo, hi - lo);
        }
        post(&c->hdr[me].ready2, (uint32_t)k);
        for (int i = 1; i < w; i++) {
            int p = (me + i) % w; /* stagger so ranks do not all read the same slot at once */
            int wr = wait_ge(c, &c->hdr[p].ready2, k);
            if (wr) return failed(wr, p);
            uint64_t plo = (uint64_t)p * chunk;
            if (plo >= m) continue;
            uint64_t len = m - plo < chunk ? m - plo : chunk;
            memcpy(out + (off + plo) * es, slot(c, k, p) + plo * es, len * es);
        }
    }
    return 0;
}

/* Publish `in` step by step and read it back from the peers: every peer (all-gather, into
 * out + p * nbytes) or only `src` (ring exchange, into out). */
static int exchange(dda_ctx *c, const char *in, char *out, uint64_t nbytes, int src) {
    c->sig0 = dda_signals_seen();
    uint64_t per = c->slot_bytes;
    for (uint64_t off = 0; off < nbytes; off += per) {
        uint64_t m = nbytes - off < per ? nbytes - off : per;
        int64_t k = begin_step(c);
        if (k < 0) return (int)k;
        memcpy(slot(c, k, c->rank), in + off, m);
        post(&c->hdr[c->rank].ready, (uint32_t)k);
        for (int i = 0; i < c->world; i++) {
            int p = src >= 0 ? src : (c->rank + i) % c->world;
            int wr = p != c->rank ? wait_ge(c, &c->hdr[p].ready, k) : 0;
            if (wr) return failed(wr, p);
            memcpy(src >= 0 ? out + off : out + (uint64_t)p * nbytes + off, slot(c, k, p), m);
            if (src >= 0) break;
        }
    }
    return 0;
}

/* All-gather of `nbytes` from every rank into out (rank order). */
int dda_all_gather(dda_ctx *c, const char *in, char *out, uint64_t nbytes) { return exchange(c, in, out, nbytes, -1); }

/* All-to-all with byte splits. A rank's own rows go straight from input to output; each slot is
 * cut into world - 1 sub-slots of `cap` bytes, one per other rank (destination d uses sub-slot
 * (d - rank - 1) mod world), and rows move in rounds of at most `cap` bytes per pair. The number
 * of rounds is agreed through the header in round 0 (each rank publishes what its sends need;
 * all take the max). */
int dda_all_to_all(dda_ctx *c, const char *in, const uint64_t *in_off, const uint64_t *in_len,
                   char *out, const uint64_t *out_off, const uint64_t *out_len) {
    c->sig0 = dda_signals_seen();
    int w = c->world, me = c->rank;
    uint64_t cap = (c->slot_bytes / (w > 1 ? w - 1 : 1)) & ~(uint64_t)(CL - 1);
    /* Rounds no larger than A2A_ROUND: with double buffering a sender copies round r + 1 in
     * while its peers copy round r out, so a large exchange costs about one copy, not two. */
    if (cap > A2A_ROUND) cap = A2A_ROUND;
    uint64_t mine = 1;
    for (int d = 0; d < w; d++) {
        uint64_t r = (in_len[d] + cap - 1) / cap;
        if (d != me && r > mine) mine = r;
    }
    uint64_t rounds = mine;
    for (uint64_t r = 0; r < rounds; r++) {
        int64_t k = begin_step(c);
        if (k < 0) return (int)k;
        char *my = slot(c, k, me);
        uint64_t o = r * cap;
        for (int i = 1; i < w; i++) {
            int d = (me + i) % w;
            if (o < in_len[d])
                memcpy(my + (uint64_t)(i - 1) * cap, in + in_off[d] + o, in_len[d] - o < cap ? in_len[d] - o : cap);
        }
        if (r == 0) c->hdr[me].rounds[k & 1] = mine; /* published by the release below */
        post(&c->hdr[me].ready, (uint32_t)k);
        /* our own rows move while the peers copy theirs in, a round's share at a time so the
         * next round's copy-in is not held up; the last round takes whatever is left */
        if (o < in_len[me]) {
            uint64_t n = (r + 1 == rounds || in_len[me] - o < cap) ? in_len[me] - o : cap;
            memcpy(out + out_off[me] + o, in + in_off[me] + o, n);
        }
        for (int i = 1; i < w; i++) {
            int p = (me + w - i) % w; /* stagger: i-th sender upstream */
            int wr = wait_ge(c, &c->hdr[p].ready, k);
            if (wr) return failed(wr, p);
            if (r == 0 && c->hdr[p].rounds[k & 1] > rounds) rounds = c->hdr[p].rounds[k & 1];
            if (o < out_len[p])
                memcpy(out + out_off[p] + o, slot(c, k, p) + (uint64_t)(i - 1) * cap,
                       out_len[p] - o < cap ? out_len[p] - o : cap);
        }
    }
    return 0;
}

/* Ring exchange: every rank of the group calls it at once with the same byte count; send `in`
 * to `dst`, receive from `src`. dst's readiness is covered by begin_step's wait on every peer. */
int dda_send_recv(dda_ctx *c, const char *in, char *out, uint64_t nbytes, int dst, int src) {
    (void)dst;
    return exchange(c, in, out, nbytes, src);
}

/* A step with no data: every rank arrives before any leaves. */
int dda_barrier(dda_ctx *c) {
    c->sig0 = dda_signals_seen();
    int64_t k = begin_step(c);
    if (k < 0) return (int)k;
    post(&c->hdr[c->rank].ready, (uint32_t)k);
    return wait_all(c, 0, k);
}
