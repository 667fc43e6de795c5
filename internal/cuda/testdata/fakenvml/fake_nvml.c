/* A stand-in libnvidia-ml.so.1 for tests on machines without a GPU.
 *
 * It implements the NVML functions candle-trace's sampler calls, with the
 * documented struct layouts of nvml.h, so go-nvml's real cgo path and
 * candle-trace's forwarding stubs (internal/cuda/nvmlbind) run end to end.
 * Every other NVML symbol is absent, as in an old driver.
 *
 * Device i of FAKE_NVML_DEVICES (default 2):
 *   total    = 80 GiB
 *   reserved = 512 MiB            (nvmlDeviceGetMemoryInfo_v2 only)
 *   used     = (i + 1) GiB
 *   free     = total - reserved - used
 *   utilization gpu = 40 + i %, memory = 10 + i %
 *   power    = 150000 + i mW
 *   one compute process: this pid, 256 MiB
 * FAKE_NVML_INIT_ERROR=<nvmlReturn_t> makes nvmlInit_v2 fail with it;
 * FAKE_NVML_NO_V2=1 makes nvmlDeviceGetMemoryInfo_v2 return NOT_SUPPORTED.
 * Build: cc -shared -fPIC -o libnvidia-ml.so.1 fake_nvml.c
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct fake_device { unsigned int index; } *nvmlDevice_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_INSUFFICIENT_SIZE = 7
};

#define GiB (1ull << 30)
#define MiB (1ull << 20)
#define MAXDEV 16
#define MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

static struct fake_device devices[MAXDEV];
static int initialized;

static unsigned int count(void) {
    const char *s = getenv("FAKE_NVML_DEVICES");
    unsigned int n = s ? (unsigned int)atoi(s) : 2;
    return n > MAXDEV ? MAXDEV : n;
}

static int valid(nvmlDevice_t d) {
    return initialized && d && d >= devices && d < devices + count();
}

nvmlReturn_t nvmlInit_v2(void) {
    const char *e = getenv("FAKE_NVML_INIT_ERROR");
    if (e && atoi(e)) return atoi(e);
    for (unsigned int i = 0; i < MAXDEV; i++) devices[i].index = i;
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case 9: return "Driver Not Loaded";
    default: return "Fake NVML error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *n = count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (i >= count()) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devices[i];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = 80 * GiB;
    m->used = (d->index + 1) * GiB + 512 * MiB; /* v1 counts reserved as used */
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (getenv("FAKE_NVML_NO_V2")) return NVML_ERROR_NOT_SUPPORTED;
    if (m->version != MEMORY_V2_VERSION) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    m->total = 80 * GiB;
    m->reserved = 512 * MiB;
    m->used = (d->index + 1) * GiB;
    m->free = m->total - m->reserved - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = 40 + d->index;
    u->memory = 10 + d->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = 150000 + d->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n,
                                                    nvmlProcessInfo_t *infos) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (*n < 1 || !infos) {
        *n = 1;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memset(infos, 0, sizeof *infos);
    infos[0].pid = (unsigned int)getpid();
    infos[0].usedGpuMemory = 256 * MiB;
    infos[0].gpuInstanceId = infos[0].computeInstanceId = 0xFFFFFFFFu;
    *n = 1;
    return NVML_SUCCESS;
}
