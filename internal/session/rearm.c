/* A flight recorder's next update without a call into Go (ct_reopen's
 * common case).
 *
 * Why: a flight recorder drops almost every update and reopens its session
 * for the next, once per update. Entering Go for that after an update's
 * worth of other work costs far more than the reopen itself: the runtime's
 * re-entry wakes its monitor thread, takes the P back, starts a spinning
 * thread (35 us of the caller's CPU and 84 us of other threads' after 1 ms
 * away, BENCHMARKS.md), and Go's code and data come back cold. Here the next
 * session takes a slot of the registry in C, with its clock started, and the
 * replaced one is marked REARMED; Go catches up when it next runs for either
 * (a record call, the drainer meeting the new session's records, finish):
 * it discards the session it holds and opens the new one in its tables with
 * what was recorded here (rearm_claim). Sessions re-armed in C one after the
 * other without Go in between are released here at once: Go never knew
 * them. Anything but the plain case (another folder, a path that exists, a
 * session Go is busy with) goes the Go way, which keeps every rule and
 * message of ct_reopen. */
#define _GNU_SOURCE
#include "fastpath.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* The folder part of path when it is dir + "/" + a name with no other '/'. */
static int in_folder(const char *path, size_t n, const char *dir) {
    size_t d = strlen(dir);
    if (d == 0 || d + 1 >= n || strncmp(path, dir, d) != 0 || path[d] != '/') return 0;
    return strchr(path + d + 1, '/') == NULL;
}

/* Whether h is still the open, re-armable session it was (slots locked). */
static ct_slot *rearmable(ct_session h) {
    ct_slot *s = ct__slot_of(h);
    if (!s || LOAD(&s->state) != CT_SLOT_OPEN || !LOAD(&s->rearm_ok)) return NULL;
    return s;
}

int ct__rearm(ct_session h, const char *path, uint64_t step, ct_session *out) {
    if (!path || !out || LOAD(&ct__forked)) return CT_REARM_GO;
    size_t n;
    int blank;
    if (ct__utf8_len(path, &n, &blank) != 0 || blank || n >= CT_REARM_PATH_CAP) return CT_REARM_GO;

    ct__slots_lock();
    ct_slot *s = rearmable(h);
    int ok = s && step != 0 && step >= s->rearm_min_step && in_folder(path, n, s->rearm_dir);
    ct__slots_unlock();
    if (!ok) return CT_REARM_GO;
    /* The path rule of the Go way for a folder already found usable: the
     * name must not exist yet (an existing file goes the Go way, which says
     * whether it may be overwritten). Outside the lock: a system call. */
    struct stat st;
    if (lstat(path, &st) == 0 || errno != ENOENT) return CT_REARM_GO;

    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    int64_t tid = ct__gettid();
    ct__slots_lock();
    /* Again: another thread may have finished, poisoned or re-armed it. */
    s = rearmable(h);
    uint64_t next = s ? ct__slot_alloc_locked() : 0;
    if (!next) {
        ct__slots_unlock();
        return CT_REARM_GO;
    }
    ct_slot *ns = ct__slot_of(next);
    ns->rearm_min_step = s->rearm_min_step;
    ns->rearm_measured_root = s->rearm_measured_root;
    STORE(&ns->measured, s->rearm_measured_root); /* as Go's open sets it */
    memcpy(ns->rearm_dir, s->rearm_dir, sizeof ns->rearm_dir);
    memcpy(ns->rearm_path, path, n + 1);
    ns->rearm_step = step;
    ns->rearm_tid = tid;
    ns->rearm_wall_ns = (uint64_t)wall.tv_sec * 1000000000ull + (uint64_t)wall.tv_nsec;
    if (s->rearm_root) {
        /* Re-armed in C already: Go never knew it. Its root points past it. */
        ns->rearm_root = s->rearm_root;
        ct_slot *root = ct__slot_of(s->rearm_root);
        if (root) root->rearm_next = next;
        ct__slot_free_locked(s);
    } else {
        ns->rearm_root = h;
        s->rearm_next = next;
        STORE(&s->state, CT_SLOT_REARMED);
    }
    STORE(&ns->rearm_ok, 1);
    ct__slots_unlock();
    *out = next;
    return CT_OK;
}

int ct__rearm_claim(uint64_t h, ct_rearm_claim *c) {
    ct__slots_lock();
    ct_slot *s = ct__slot_of(h);
    uint64_t root = s ? (s->rearm_root ? s->rearm_root : h) : 0;
    ct_slot *r = root ? ct__slot_of(root) : NULL;
    ct_slot *ns = r && LOAD(&r->state) == CT_SLOT_REARMED && r->rearm_next ? ct__slot_of(r->rearm_next) : NULL;
    if (!ns) {
        if (s && s->rearm_root && (!r || LOAD(&r->state) != CT_SLOT_REARMED)) {
            /* Re-armed in C from a session that ended before Go took this
             * one over (a finish racing the reopen on another thread):
             * nothing to take over from, and its slot must not leak. */
            ct__slot_free_locked(s);
        }
        ct__slots_unlock();
        return 0;
    }
    c->root = root;
    c->next = r->rearm_next;
    c->step = ns->rearm_step;
    c->tid = ns->rearm_tid;
    c->wall_ns = ns->rearm_wall_ns;
    memcpy(c->path, ns->rearm_path, sizeof c->path);
    /* Go's from now on; not re-armed in C until Go has it in its tables. */
    ns->rearm_root = 0;
    STORE(&ns->rearm_ok, 0);
    r->rearm_next = 0;
    ct__slots_unlock();
    return 1;
}

void ct__rearm_allow(ct_slot *s, int ok, uint64_t min_step, int measured_root, const char *dir) {
    ct__slots_lock();
    if (dir) {
        size_t n = strlen(dir);
        if (n >= sizeof s->rearm_dir) ok = 0, n = 0;
        memcpy(s->rearm_dir, dir, n);
        s->rearm_dir[n] = 0;
    }
    s->rearm_min_step = min_step;
    s->rearm_measured_root = (uint32_t)(measured_root != 0);
    STORE(&s->rearm_ok, (uint32_t)(ok != 0));
    ct__slots_unlock();
}
