/* The part of CUPTI's ABI that candle-trace's CUPTI collector uses, declared
 * here so that nothing of CUDA is needed to build: no CUDA headers, no
 * libcupti at link time (it is dlopened, see collector.c).
 *
 * Source of every declaration: NVIDIA's CUPTI headers (cupti_activity.h,
 * cupti_callbacks.h, cupti_result.h) as shipped in the nvidia-cuda-cupti-cu12
 * 12.9.79 wheel (CUDA 12.9, CUPTI_API_VERSION 28), checked against the
 * nvidia-cuda-cupti 13.5.25 wheel (CUDA 13).
 *
 * Record versions. cuptiActivityGetNextRecord hands out records in the layout
 * of the newest version the loaded CUPTI knows. CUDA 12.x (12.0 .. 12.9)
 * documents, per kind:
 *   CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL  CUpti_ActivityKernel9   208 bytes
 *   CUPTI_ACTIVITY_KIND_MEMCPY             CUpti_ActivityMemcpy6    96 bytes
 *     (earlier 12.x CUPTIs: CUpti_ActivityMemcpy5, the same less copyCount)
 *   CUPTI_ACTIVITY_KIND_MEMSET             CUpti_ActivityMemset4    88 bytes
 *   CUPTI_ACTIVITY_KIND_RUNTIME / DRIVER   CUpti_ActivityAPI        40 bytes
 * CUDA 13 documents Kernel13, Memcpy7 and Memset5. Each newer version only
 * appends fields, so the collector reads only the fields that every one of
 * these versions has at the same offset (kind, start, end, deviceId,
 * contextId, streamId, correlationId, name, copyKind, bytes) and never
 * depends on a record's size: cuptiActivityGetNextRecord steps over records.
 * The full CUDA 12 layouts are declared anyway, with their offsets checked at
 * compile time below, so that a test library can lay records out exactly as
 * CUPTI 12 does (internal/cuda/testdata/fakecupti).
 *
 * Records are packed and 8-byte aligned (PACKED_ALIGNMENT in
 * cupti_activity.h); every field below sits at its natural alignment, so the
 * packed attribute changes no offset on LP64. */
#ifndef CT_CUPTI_ABI_H
#define CT_CUPTI_ABI_H

#include <stddef.h>
#include <stdint.h>

#define CT_CUPTI_PACKED __attribute__((__packed__)) __attribute__((aligned(8)))

/* cupti_result.h */
typedef int CUptiResult;
enum {
    CUPTI_SUCCESS = 0,
    CUPTI_ERROR_INVALID_PARAMETER = 1,
    CUPTI_ERROR_MAX_LIMIT_REACHED = 12,
    CUPTI_ERROR_NOT_INITIALIZED = 15,
    CUPTI_ERROR_INVALID_KIND = 21,
    CUPTI_ERROR_NOT_SUPPORTED = 27,
    CUPTI_ERROR_INSUFFICIENT_PRIVILEGES = 35,
    CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39,
    CUPTI_ERROR_UNKNOWN = 999,
};

/* cupti_activity.h: CUpti_ActivityKind (the values used here). */
typedef int CUpti_ActivityKind;
enum {
    CUPTI_ACTIVITY_KIND_INVALID = 0,
    CUPTI_ACTIVITY_KIND_MEMCPY = 1,
    CUPTI_ACTIVITY_KIND_MEMSET = 2,
    CUPTI_ACTIVITY_KIND_KERNEL = 3,
    CUPTI_ACTIVITY_KIND_DRIVER = 4,
    CUPTI_ACTIVITY_KIND_RUNTIME = 5,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10,
};

/* CUpti_ActivityFlag: cuptiActivityFlushAll's flag. */
enum { CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1 << 0 };

/* CUpti_ActivityMemcpyKind */
enum {
    CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN = 0,
    CUPTI_ACTIVITY_MEMCPY_KIND_HTOD = 1,
    CUPTI_ACTIVITY_MEMCPY_KIND_DTOH = 2,
    CUPTI_ACTIVITY_MEMCPY_KIND_HTOA = 3,
    CUPTI_ACTIVITY_MEMCPY_KIND_ATOH = 4,
    CUPTI_ACTIVITY_MEMCPY_KIND_ATOA = 5,
    CUPTI_ACTIVITY_MEMCPY_KIND_ATOD = 6,
    CUPTI_ACTIVITY_MEMCPY_KIND_DTOA = 7,
    CUPTI_ACTIVITY_MEMCPY_KIND_DTOD = 8,
    CUPTI_ACTIVITY_MEMCPY_KIND_HTOH = 9,
    CUPTI_ACTIVITY_MEMCPY_KIND_PTOP = 10,
};

/* cupti_callbacks.h */
typedef int CUpti_CallbackDomain;
enum { CUPTI_CB_DOMAIN_DRIVER_API = 1, CUPTI_CB_DOMAIN_RUNTIME_API = 2 };
typedef int CUpti_ApiCallbackSite;
enum { CUPTI_API_ENTER = 0, CUPTI_API_EXIT = 1 };
typedef uint32_t CUpti_CallbackId;
typedef struct CUctx_st *CUcontext;
typedef struct CUpti_Subscriber_st *CUpti_SubscriberHandle;

/* What a runtime or driver API callback receives as cbdata. */
typedef struct {
    CUpti_ApiCallbackSite callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    CUcontext context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} CUpti_CallbackData;

typedef void (*CUpti_CallbackFunc)(void *userdata, CUpti_CallbackDomain domain,
                                   CUpti_CallbackId cbid, const void *cbdata);
typedef void (*CUpti_BuffersCallbackRequestFunc)(uint8_t **buffer, size_t *size,
                                                 size_t *maxNumRecords);
typedef void (*CUpti_BuffersCallbackCompleteFunc)(CUcontext context, uint32_t streamId,
                                                  uint8_t *buffer, size_t size, size_t validSize);

/* ---- activity records ------------------------------------------------------ */

typedef struct CT_CUPTI_PACKED {
    CUpti_ActivityKind kind;
} CUpti_Activity;

/* CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL (and KERNEL) in CUDA 12.x. */
typedef struct CT_CUPTI_PACKED {
    CUpti_ActivityKind kind;
    uint8_t cacheConfig;          /* union { both; {requested:4, executed:4} } */
    uint8_t sharedMemoryConfig;
    uint16_t registersPerThread;
    int32_t partitionedGlobalCacheRequested;
    int32_t partitionedGlobalCacheExecuted;
    uint64_t start;               /* ns, cuptiGetTimestamp's clock; 0 = not collected */
    uint64_t end;
    uint64_t completed;
    uint32_t deviceId;
    uint32_t contextId;
    uint32_t streamId;
    int32_t gridX, gridY, gridZ;
    int32_t blockX, blockY, blockZ;
    int32_t staticSharedMemory;
    int32_t dynamicSharedMemory;
    uint32_t localMemoryPerThread;
    uint32_t localMemoryTotal;
    uint32_t correlationId;       /* = that of the API call that launched it */
    int64_t gridId;
    const char *name;             /* owned by CUPTI, shared by every record of the kernel */
    void *reserved0;
    uint64_t queued;
    uint64_t submitted;
    uint8_t launchType;
    uint8_t isSharedMemoryCarveoutRequested;
    uint8_t sharedMemoryCarveoutRequested;
    uint8_t padding;
    uint32_t sharedMemoryExecuted;
    uint64_t graphNodeId;
    int32_t shmemLimitConfig;     /* CUpti_FuncShmemLimitConfig */
    uint32_t graphId;
    void *pAccessPolicyWindow;
    uint32_t channelID;
    int32_t channelType;          /* CUpti_ChannelType */
    uint32_t clusterX, clusterY, clusterZ;
    uint32_t clusterSchedulingPolicy;
    uint64_t localMemoryTotal_v2;
    uint32_t maxPotentialClusterSize;
    uint32_t maxActiveClusters;
} CUpti_ActivityKernel9;

/* CUPTI_ACTIVITY_KIND_MEMCPY in CUDA 12.9 (CUpti_ActivityMemcpy5, of earlier
 * CUPTIs, is the same without copyCount). */
typedef struct CT_CUPTI_PACKED {
    CUpti_ActivityKind kind;
    uint8_t copyKind;             /* CUpti_ActivityMemcpyKind */
    uint8_t srcKind;
    uint8_t dstKind;
    uint8_t flags;
    uint64_t bytes;
    uint64_t start;
    uint64_t end;
    uint32_t deviceId;
    uint32_t contextId;
    uint32_t streamId;
    uint32_t correlationId;       /* of the driver API call */
    uint32_t runtimeCorrelationId;/* of the runtime API call, 0 when none */
    uint32_t pad;
    void *reserved0;
    uint64_t graphNodeId;
    uint32_t graphId;
    uint32_t channelID;
    int32_t channelType;
    uint32_t pad2;
    uint64_t copyCount;
} CUpti_ActivityMemcpy6;

/* CUPTI_ACTIVITY_KIND_MEMSET in CUDA 12.x. */
typedef struct CT_CUPTI_PACKED {
    CUpti_ActivityKind kind;
    uint32_t value;
    uint64_t bytes;
    uint64_t start;
    uint64_t end;
    uint32_t deviceId;
    uint32_t contextId;
    uint32_t streamId;
    uint32_t correlationId;
    uint16_t flags;
    uint16_t memoryKind;
    uint32_t pad;
    void *reserved0;
    uint64_t graphNodeId;
    uint32_t graphId;
    uint32_t channelID;
    int32_t channelType;
    uint32_t pad2;
} CUpti_ActivityMemset4;

/* CUPTI_ACTIVITY_KIND_RUNTIME and _DRIVER. */
typedef struct CT_CUPTI_PACKED {
    CUpti_ActivityKind kind;
    CUpti_CallbackId cbid;
    uint64_t start;
    uint64_t end;
    uint32_t processId;
    uint32_t threadId;
    uint32_t correlationId;
    uint32_t returnValue;
} CUpti_ActivityAPI;

/* The layouts of cupti_activity.h, 12.9 (LP64). */
#define CT_CUPTI_OFF(T, f, o) _Static_assert(offsetof(T, f) == (o), #T "." #f " is at " #o)
CT_CUPTI_OFF(CUpti_ActivityKernel9, start, 16);
CT_CUPTI_OFF(CUpti_ActivityKernel9, end, 24);
CT_CUPTI_OFF(CUpti_ActivityKernel9, deviceId, 40);
CT_CUPTI_OFF(CUpti_ActivityKernel9, contextId, 44);
CT_CUPTI_OFF(CUpti_ActivityKernel9, streamId, 48);
CT_CUPTI_OFF(CUpti_ActivityKernel9, correlationId, 92);
CT_CUPTI_OFF(CUpti_ActivityKernel9, gridId, 96);
CT_CUPTI_OFF(CUpti_ActivityKernel9, name, 104);
CT_CUPTI_OFF(CUpti_ActivityKernel9, graphNodeId, 144);
CT_CUPTI_OFF(CUpti_ActivityKernel9, pAccessPolicyWindow, 160);
CT_CUPTI_OFF(CUpti_ActivityKernel9, localMemoryTotal_v2, 192);
_Static_assert(sizeof(CUpti_ActivityKernel9) == 208, "CUpti_ActivityKernel9 is 208 bytes");
CT_CUPTI_OFF(CUpti_ActivityMemcpy6, copyKind, 4);
CT_CUPTI_OFF(CUpti_ActivityMemcpy6, bytes, 8);
CT_CUPTI_OFF(CUpti_ActivityMemcpy6, start, 16);
CT_CUPTI_OFF(CUpti_ActivityMemcpy6, end, 24);
CT_CUPTI_OFF(CUpti_ActivityMemcpy6, deviceId, 32);
CT_CUPTI_OFF(CUpti_ActivityMemcpy6, streamId, 40);
CT_CUPTI_OFF(CUpti_ActivityMemcpy6, correlationId, 44);
CT_CUPTI_OFF(CUpti_ActivityMemcpy6, runtimeCorrelationId, 48);
CT_CUPTI_OFF(CUpti_ActivityMemcpy6, reserved0, 56);
_Static_assert(sizeof(CUpti_ActivityMemcpy6) == 96, "CUpti_ActivityMemcpy6 is 96 bytes");
CT_CUPTI_OFF(CUpti_ActivityMemset4, bytes, 8);
CT_CUPTI_OFF(CUpti_ActivityMemset4, start, 16);
CT_CUPTI_OFF(CUpti_ActivityMemset4, end, 24);
CT_CUPTI_OFF(CUpti_ActivityMemset4, deviceId, 32);
CT_CUPTI_OFF(CUpti_ActivityMemset4, streamId, 40);
CT_CUPTI_OFF(CUpti_ActivityMemset4, correlationId, 44);
CT_CUPTI_OFF(CUpti_ActivityMemset4, reserved0, 56);
_Static_assert(sizeof(CUpti_ActivityMemset4) == 88, "CUpti_ActivityMemset4 is 88 bytes");
CT_CUPTI_OFF(CUpti_ActivityAPI, start, 8);
CT_CUPTI_OFF(CUpti_ActivityAPI, threadId, 28);
CT_CUPTI_OFF(CUpti_ActivityAPI, correlationId, 32);
_Static_assert(sizeof(CUpti_ActivityAPI) == 40, "CUpti_ActivityAPI is 40 bytes");
CT_CUPTI_OFF(CUpti_CallbackData, correlationId, 64);

#endif
