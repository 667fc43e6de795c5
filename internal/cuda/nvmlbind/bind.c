#define _GNU_SOURCE
#include "bind.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* NVML_ERROR_FUNCTION_NOT_FOUND: what go-nvml itself answers for a symbol
 * the loaded library lacks. Every NVML function except nvmlErrorString
 * returns nvmlReturn_t (an int), so one fallback fits them all whatever
 * their arguments. */
int ct_nvml_unbound(void) { return 13; }

const char *ct_nvml_unbound_string(int result) {
    (void)result;
    return "NVML function not found (libnvidia-ml is not bound)";
}

static int nvml_error_string_index(void) {
    for (int i = 0; i < ct_nvml_nsyms; i++)
        if (strcmp(ct_nvml_names[i], "nvmlErrorString") == 0) return i;
    return -1;
}

static pthread_mutex_t bind_mu = PTHREAD_MUTEX_INITIALIZER;

int ct_nvml_bind(const char *path, int flags, char *err, size_t errcap) {
    pthread_mutex_lock(&bind_mu);
    dlerror();
    /* Never closed: a stub may jump into the library at any time after this,
     * so the library must stay mapped even after nvmlShutdown and go-nvml's
     * own dlclose. */
    void *h = dlopen(path, flags);
    if (!h) {
        const char *e = dlerror();
        snprintf(err, errcap, "%s", e ? e : "dlopen failed");
        pthread_mutex_unlock(&bind_mu);
        return -1;
    }
    int n = 0;
    for (int i = 0; i < ct_nvml_nsyms; i++) {
        void *p = dlsym(h, ct_nvml_names[i]);
        if (p) {
            n++;
        } else {
            p = i == nvml_error_string_index() ? (void *)ct_nvml_unbound_string : (void *)ct_nvml_unbound;
        }
        __atomic_store_n(&ct_nvml_table[i], p, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&bind_mu);
    return n;
}

int ct_nvml_is_bound(int i) {
    if (i < 0 || i >= ct_nvml_nsyms) return 0;
    void *p = __atomic_load_n(&ct_nvml_table[i], __ATOMIC_ACQUIRE);
    return p != (void *)ct_nvml_unbound && p != (void *)ct_nvml_unbound_string;
}
