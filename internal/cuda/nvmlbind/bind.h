/* NVML forwarding stubs: see bind.go. */
#ifndef CT_NVMLBIND_H
#define CT_NVMLBIND_H

#include <stddef.h>

#define CT_HIDDEN __attribute__((visibility("hidden")))

CT_HIDDEN extern const int ct_nvml_nsyms;
CT_HIDDEN extern const char *const ct_nvml_names[];
CT_HIDDEN extern void *ct_nvml_table[];

CT_HIDDEN int ct_nvml_unbound(void);
CT_HIDDEN const char *ct_nvml_unbound_string(int result);

/* dlopens `path` (kept open for the life of the process) and points every
 * table entry the library has at its function. Returns the number of entries
 * bound, or -1 with the dlerror() text in err. */
CT_HIDDEN int ct_nvml_bind(const char *path, int flags, char *err, size_t errcap);

/* 1 when entry i points into the library, 0 when at the fallback. */
CT_HIDDEN int ct_nvml_is_bound(int i);

#endif
