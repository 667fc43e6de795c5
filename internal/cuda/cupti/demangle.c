/* Kernel names arrive from CUPTI as the compiler emitted them: Itanium C++
 * ABI manglings such as _ZN2at6native29vectorized_elementwise_kernel...
 * Profilers people compare us with (Nsight Systems, torch.profiler) show
 * them demangled, so we do too, with the demangler of the C++ runtime that
 * every CUDA program already has loaded (libstdc++'s __cxa_demangle). It is
 * looked up, never linked: a process without a C++ runtime keeps the
 * mangled names. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "collector.h"

typedef char *(*cxa_demangle_fn)(const char *mangled, char *buf, size_t *len, int *status);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cxa_demangle_fn demangler;

static void resolve(void) {
    demangler = (cxa_demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
    if (demangler) return;
    /* Not in the global scope (e.g. a C program, or libstdc++ loaded
     * RTLD_LOCAL by a plugin): load it privately, it is part of any system
     * that runs CUDA. */
    void *h = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_LOCAL);
    if (h) demangler = (cxa_demangle_fn)dlsym(h, "__cxa_demangle");
}

char *ct_cupti_demangle(const char *name) {
    if (!name || name[0] != '_' || name[1] != 'Z') return NULL;
    pthread_once(&once, resolve);
    if (!demangler) return NULL;
    int status = 0;
    char *out = demangler(name, NULL, NULL, &status);
    if (status != 0) {
        free(out);
        return NULL;
    }
    return out;
}
