/* candle-trace's CUPTI activity collector, the C half: see collector.c and
 * cupti.go. Everything here is hidden: nothing of it is exported from the
 * shared library. */
#ifndef CT_CUPTI_COLLECTOR_H
#define CT_CUPTI_COLLECTOR_H

#include <stddef.h>
#include <stdint.h>

#include "abi.h"

#define CT_CUPTI_HIDDEN __attribute__((visibility("hidden")))

/* A CUDA API function whose entry is watched (cbids.c). */
typedef struct ct_cupti_cbid {
    uint32_t cbid;
    const char *name;
} ct_cupti_cbid;

CT_CUPTI_HIDDEN extern const ct_cupti_cbid ct_cupti_runtime_cbids[];
CT_CUPTI_HIDDEN extern const int ct_cupti_n_runtime_cbids;
CT_CUPTI_HIDDEN extern const ct_cupti_cbid ct_cupti_driver_cbids[];
CT_CUPTI_HIDDEN extern const int ct_cupti_n_driver_cbids;

/* internal/session/fastpath.c: the span work launched now from the calling
 * thread belongs to (its innermost; else the measuring thread's innermost,
 * *borrowed = 1; else 1). */
uint64_t ct__launch_span(uint64_t session, int *borrowed);
void ct__track_main_thread(uint64_t session, int on);
uint64_t ct__session_now(uint64_t session);

/* demangle.c: the demangled form of an Itanium-mangled name (malloc'd, the
 * caller frees it), NULL when name is not mangled or no C++ runtime can
 * demangle it. */
CT_CUPTI_HIDDEN char *ct_cupti_demangle(const char *name);

/* ---- loading ----------------------------------------------------------------- */

/* dlopens path (RTLD_NOLOAD too when noload: only a library already in the
 * process) and resolves every function the collector needs. 0 on success
 * (the first library loaded stays for the life of the process; later calls
 * return 0 at once), -1 when it cannot be opened, -2 when a function is
 * missing; err holds why. */
CT_CUPTI_HIDDEN int ct_cupti_load(const char *path, int noload, char *err, size_t errcap);
/* The path the library was loaded from ("" before). */
CT_CUPTI_HIDDEN const char *ct_cupti_loaded_path(void);
/* CUPTI's own text for a result ("" when the library lacks it). */
CT_CUPTI_HIDDEN const char *ct_cupti_result_string(CUptiResult r);

/* Why CUDA is not there, for a CUPTI that reports CUPTI_ERROR_NOT_INITIALIZED:
 * writes what is missing into err (libcuda.so.1 not loadable, or cuInit's
 * error) and returns nonzero, or returns 0 when the driver initialises. */
CT_CUPTI_HIDDEN int ct_cuda_probe(char *err, size_t errcap);

/* ---- starting and stopping ----------------------------------------------------- */

enum {
    CT_CUPTI_STAGE_OK = 0,
    CT_CUPTI_STAGE_BUSY = 1,       /* a collector already runs in this process */
    CT_CUPTI_STAGE_SUBSCRIBE = 2,  /* cuptiSubscribe failed: *res */
    CT_CUPTI_STAGE_CALLBACKS = 3,  /* cuptiEnableCallback refused every launch API */
    CT_CUPTI_STAGE_BUFFERS = 4,    /* cuptiActivityRegisterCallbacks failed */
    CT_CUPTI_STAGE_ENABLE = 5,     /* cuptiActivityEnable(*kind) failed */
    CT_CUPTI_STAGE_MEMORY = 6,     /* no memory for the correlation table */
    CT_CUPTI_STAGE_NOT_LOADED = 7,
};

/* Subscribes, watches the launch APIs, registers the buffer callbacks and
 * enables the activity kinds. borrow_main: launches from a thread with no
 * open span go to the session's main thread's innermost span, not s1.
 * Returns a CT_CUPTI_STAGE_*; on failure nothing stays enabled and *res /
 * *kind say what CUPTI answered. */
CT_CUPTI_HIDDEN int ct_cupti_start(uint64_t session, size_t buffer_bytes, int max_buffers, int borrow_main,
                                   CUptiResult *res, int *kind);
/* How long a forced flush waits for the buffers CUPTI still holds to come
 * back (a CUPTI that never returns one must not hang a process's exit). */
#define CT_CUPTI_FLUSH_WAIT_MS 5000

/* Forces out every buffer (cuptiActivityFlushAll(FLUSH_FORCED) when forced,
 * else only the buffers whose records are complete). A forced flush returns
 * once every buffer handed out before it is back in the completed queue
 * (ct_cupti_take), wherever CUPTI delivered it from, or after
 * CT_CUPTI_FLUSH_WAIT_MS (counted in flush_timeouts). */
CT_CUPTI_HIDDEN CUptiResult ct_cupti_flush(int forced);
/* Flushes (forced), disables the kinds and unsubscribes. The correlation
 * table stays until the next start, so what was flushed can be decoded. */
CT_CUPTI_HIDDEN void ct_cupti_stop(void);

/* ---- completed buffers ------------------------------------------------------------ */

typedef struct ct_cupti_buf {
    struct ct_cupti_buf *next;
    uint8_t *data;
    size_t valid;
    CUpti_Activity *cursor; /* cuptiActivityGetNextRecord's position */
    int done;
} ct_cupti_buf;

/* Takes every completed buffer, oldest first (NULL when none). */
CT_CUPTI_HIDDEN ct_cupti_buf *ct_cupti_take(void);
/* Frees a taken buffer (the collector may hand its memory to CUPTI again). */
CT_CUPTI_HIDDEN void ct_cupti_buf_free(ct_cupti_buf *b);

/* ---- decoding ------------------------------------------------------------------------ */

enum { CT_CUPTI_REC_KERNEL = 1, CT_CUPTI_REC_MEMCPY = 2, CT_CUPTI_REC_MEMSET = 3 };

/* One device interval as decoded from a CUPTI record. */
typedef struct ct_cupti_rec {
    uint32_t kind;           /* CT_CUPTI_REC_* */
    uint32_t device_id;
    uint32_t stream_id;
    uint32_t copy_kind;      /* memcpy: CUpti_ActivityMemcpyKind */
    uint64_t start, end;     /* ns on CUPTI's clock (cuptiGetTimestamp) */
    uint64_t correlation_id;
    uint64_t span;           /* the launching thread's innermost span; 0 = unknown */
    uint64_t bytes;          /* memcpy, memset */
    const char *name;        /* kernel: CUPTI's (lives as long as CUPTI); else NULL */
} ct_cupti_rec;

/* Decodes up to cap device intervals from b with cuptiActivityGetNextRecord;
 * returns how many (0 once b is exhausted). API records, records of other
 * kinds and records without timestamps are counted and skipped. */
CT_CUPTI_HIDDEN int ct_cupti_decode(ct_cupti_buf *b, ct_cupti_rec *out, int cap);

/* ---- counters and clock ------------------------------------------------------------- */

/* Reset by every ct_cupti_start. */
typedef struct ct_cupti_counters {
    uint64_t launches;          /* launch API entries attributed */
    uint64_t buffers;           /* buffers completed with records */
    uint64_t buffers_refused;   /* buffer requests refused (too many outstanding) */
    uint64_t dropped;           /* cuptiActivityGetNumDroppedRecords, summed */
    uint64_t api_records;       /* RUNTIME / DRIVER records (skipped) */
    uint64_t other_records;     /* records of other kinds (skipped) */
    uint64_t incomplete;        /* device records without valid timestamps (skipped) */
    uint64_t bad_records;       /* cuptiActivityGetNextRecord errors (rest of buffer lost) */
    uint64_t unattributed;      /* device records whose correlation id was not recorded */
    uint64_t borrowed;          /* launches from a thread with no open span given the main thread's span */
    uint64_t flush_timeouts;    /* forced flushes that gave up waiting for a buffer CUPTI kept */
    uint64_t buffers_fresh;     /* buffers handed to CUPTI newly allocated, not from the pool */
} ct_cupti_counters;

CT_CUPTI_HIDDEN void ct_cupti_read_counters(ct_cupti_counters *out);
/* Adds cuptiActivityGetNumDroppedRecords of the global queue. */
CT_CUPTI_HIDDEN void ct_cupti_poll_dropped(void);

/* One clock reading: session ns before, CUPTI ns, session ns after.
 * Returns the CUptiResult of cuptiGetTimestamp. */
CT_CUPTI_HIDDEN CUptiResult ct_cupti_clock_read(uint64_t session, uint64_t *h0, uint64_t *c,
                                                uint64_t *h1);

/* Test support: the address of symbol name in the loaded library (NULL when
 * absent). */
CT_CUPTI_HIDDEN void *ct_cupti_sym(const char *name);

#endif
