#define _GNU_SOURCE
#include "aggkeys.h"

#include <stdlib.h>

/* Implemented in Go (aggregate.go): the session's key for (name, step), or
 * for the scalar label name when step is CT_AGG_SCALAR; -1 when h is not a
 * live aggregate session; CT_AGG_REFUSED (with ct_last_error set) for a
 * label the aggregator refuses. */
extern int64_t ctgo_agg_intern(uint64_t h, char *name, size_t n, uint32_t step);

static uint64_t hash_name(const char *s, size_t *len, uint32_t step) {
    uint64_t x = 1469598103934665603ull ^ step; /* FNV-1a */
    size_t i = 0;
    for (; s[i]; i++) {
        x ^= (unsigned char)s[i];
        x *= 1099511628211ull;
    }
    *len = i;
    return x | 1; /* never 0 */
}

static void ptr_remember(struct ct_agg_keys *k, const char *name, uint32_t step, uint32_t ent) {
    uintptr_t a = (uintptr_t)name;
    ct_agg_ptr *p = &k->ptr[((a >> 3) ^ (a >> 11) ^ step) & (CT_AGG_PTR_SLOTS - 1)];
    p->ptr = name;
    p->step = step;
    p->ent = ent;
}

/* Index of (name, step) in the table, or of the empty slot it would take. */
static uint32_t probe(const struct ct_agg_keys *k, uint64_t hash, const char *name, uint32_t step) {
    uint32_t mask = k->cap - 1;
    for (uint32_t i = (uint32_t)hash & mask;; i = (i + 1) & mask) {
        const ct_agg_ent *e = &k->tab[i];
        if (!e->name) return i;
        if (e->hash == hash && e->step == step && strcmp(e->name, name) == 0) return i;
    }
}

static int grow(struct ct_agg_keys *k) {
    uint32_t cap = k->cap ? k->cap * 2 : 64;
    ct_agg_ent *old = k->tab;
    uint32_t old_cap = k->cap;
    ct_agg_ent *tab = calloc(cap, sizeof *tab);
    if (!tab) return -1;
    k->tab = tab;
    k->cap = cap;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (!old[i].name) continue;
        uint32_t mask = cap - 1, j = (uint32_t)old[i].hash & mask;
        while (tab[j].name) j = (j + 1) & mask;
        tab[j] = old[i];
    }
    free(old);
    /* Slot indexes changed: forget the address cache. */
    memset(k->ptr, 0, sizeof k->ptr);
    return 0;
}

ct_status ct__agg_key_slow(struct ct_agg_keys **keys, uint64_t h, const char *name, uint32_t step,
                           const char *fn, uint32_t *key) {
    struct ct_agg_keys *k = *keys;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k || grow(k) != 0) {
            free(k);
            return ct__fail(CT_ERR_INTERNAL, "%s: out of memory for the span name cache", fn);
        }
        *keys = k;
    }
    size_t n;
    uint64_t hash = hash_name(name, &n, step);
    uint32_t i = probe(k, hash, name, step);
    if (k->tab[i].name) {
        ptr_remember(k, name, step, i);
        *key = k->tab[i].key;
        return CT_OK;
    }
    /* A name this thread has not seen in the session: check it as a trace
     * session would, then ask the aggregator, which judges its own limits
     * (a span name past them counts under (overflow); a scalar label past
     * them is refused, with the aggregator's message). */
    size_t vn;
    ct_status st = ct__check_text(fn, step == CT_AGG_SCALAR ? "label" : "name", name, &vn);
    if (st != CT_OK) return st;
    int64_t got = ctgo_agg_intern(h, (char *)name, n, step);
    if (got == CT_AGG_REFUSED) return CT_ERR_INVALID_ARGUMENT; /* the message is set */
    if (got < 0)
        return ct__fail(CT_ERR_STATE, "%s: session %llu is finishing", fn, (unsigned long long)h);
    *key = got > CT_AGG_MAX_KEY ? 0 : (uint32_t)got;
    if (k->n >= CT_AGG_CACHE_MAX) return CT_OK;
    if ((k->n + 1) * 2 > k->cap) {
        if (grow(k) != 0) return CT_OK; /* uncached, still correct */
        i = probe(k, hash, name, step);
    }
    char *copy = malloc(n + 1);
    if (!copy) return CT_OK;
    memcpy(copy, name, n + 1);
    k->tab[i] = (ct_agg_ent){.hash = hash, .name = copy, .key = *key, .step = step};
    k->n++;
    ptr_remember(k, name, step, i);
    return CT_OK;
}

void ct__agg_keys_free(struct ct_agg_keys *k) {
    if (!k) return;
    for (uint32_t i = 0; i < k->cap; i++) free(k->tab[i].name);
    free(k->tab);
    free(k);
}
