/* A thread's cache of aggregate-span keys: span name and step -> the key the
 * session's Go aggregator interned for them. A hit costs a pointer compare
 * and a strcmp; only a name this thread has never used in the session
 * crosses into Go (ctgo_agg_intern).
 *
 * Two levels: a small direct-mapped table keyed by the name's address (C
 * callers pass string literals, so the address repeats), then a table keyed
 * by the name's bytes (bindings pass a fresh buffer per call). Every hit is
 * confirmed against the bytes, so a buffer reused for another name cannot
 * return a wrong key. */
#ifndef CT_AGGKEYS_H
#define CT_AGGKEYS_H

#include <stdint.h>
#include <string.h>

#include "fastpath.h"

#define CT_AGG_PTR_SLOTS 64
/* Names one thread caches per session; more are looked up in Go each time.
 * Bounds the cache at a few MiB whatever a program names its spans. */
#define CT_AGG_CACHE_MAX 65536

typedef struct ct_agg_ent {
    uint64_t hash;
    char *name; /* NULL: empty slot */
    uint32_t key;
    uint32_t step;
} ct_agg_ent;

typedef struct ct_agg_ptr {
    const char *ptr;
    uint32_t ent;
    uint32_t step;
} ct_agg_ptr;

struct ct_agg_keys {
    ct_agg_ptr ptr[CT_AGG_PTR_SLOTS];
    ct_agg_ent *tab; /* open addressing, cap a power of two */
    uint32_t cap, n;
};

static inline __attribute__((always_inline)) int ct__agg_key_fast(const struct ct_agg_keys *k, const char *name,
                                                                  uint32_t step, uint32_t *key) {
    if (!k) return 0;
    uintptr_t a = (uintptr_t)name;
    const ct_agg_ptr *p = &k->ptr[((a >> 3) ^ (a >> 11) ^ step) & (CT_AGG_PTR_SLOTS - 1)];
    if (p->ptr != name || p->step != step) return 0;
    const ct_agg_ent *e = &k->tab[p->ent];
    if (strcmp(e->name, name) != 0) return 0;
    *key = e->key;
    return 1;
}

/* The step value under which scalar labels are cached (span steps are 0..3):
 * their keys are the aggregator's scalar keys. */
#define CT_AGG_SCALAR 255u
/* ctgo_agg_intern's answer for a label the aggregator refuses. */
#define CT_AGG_REFUSED (-2)

/* The miss path: finds or interns (name, step) for session h and caches it.
 * Validates the name as ct_span_begin does, or as a scalar label when step
 * is CT_AGG_SCALAR (fn names the caller). */
ct_status ct__agg_key_slow(struct ct_agg_keys **keys, uint64_t h, const char *name, uint32_t step,
                           const char *fn, uint32_t *key);
void ct__agg_keys_free(struct ct_agg_keys *k);

#endif
