// The module of candle_trace.torch's module spans in C++ that Python gets (see
// _native.h): ct_obs_native, called through ctypes.

#include "_native.h"

// _observer.cpp's control interface (the same library).
extern "C" int ct_obs_begin(uint64_t session, uint64_t measured, int memory, const uint64_t *impls,
                            const int64_t *numels, const char *const *names, size_t n,
                            uint64_t earlier_ns, int *memory_on);

namespace ct_native {

span_begin_fn p_span_begin = nullptr;
measurement_begin_fn p_measurement_begin = nullptr;
span_end_fn p_span_end = nullptr;
tracer_fn p_tracer_begin = nullptr;
tracer_fn p_tracer_end = nullptr;

PyTypeObject *make_type(const char *name, size_t size, PyType_Slot *slots) {
    PyType_Spec spec = {name, static_cast<int>(size), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
                        slots};
    return reinterpret_cast<PyTypeObject *>(PyType_FromSpec(&spec));
}

PyObject *no_new(PyTypeObject *, PyObject *, PyObject *) {
    PyErr_SetString(PyExc_TypeError, "made by candle_trace's module spans only");
    return nullptr;
}

namespace {

// observer_begin(session, measured, memory, impls, numels, names, n, earlier_ns) -> 1 or 0
// (op-output memory recorded or not), -1 when the observer could not begin (ct_obs_error
// says why): ct_obs_begin (_observer.cpp, this library) without ctypes -- the arrays are
// Observer.named()'s, passed by address -- as the update's first forward begins it.
PyObject *observer_begin(PyObject *, PyObject *const *args, Py_ssize_t n) {
    if (n != 8) {
        PyErr_SetString(PyExc_TypeError, "observer_begin takes 8 arguments");
        return nullptr;
    }
    unsigned long long v[8];
    for (Py_ssize_t i = 0; i < n; ++i) {
        v[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (v[i] == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
    }
    int memory_on = 0;
    int rc = ct_obs_begin(v[0], v[1], static_cast<int>(v[2]),
                          reinterpret_cast<const uint64_t *>(static_cast<uintptr_t>(v[3])),
                          reinterpret_cast<const int64_t *>(static_cast<uintptr_t>(v[4])),
                          reinterpret_cast<const char *const *>(static_cast<uintptr_t>(v[5])),
                          static_cast<size_t>(v[6]), v[7], &memory_on);
    return PyLong_FromLong(rc ? -1 : memory_on);
}

PyMethodDef module_functions[] = {
    {"span_stack", new_stack, METH_VARARGS,
     "span_stack(hc, address, raise_status): the span stacks of a session (hc: its "
     "ctypes.c_uint64 handle, address: ctypes.addressof(hc))"},
    {"module_table", new_table, METH_VARARGS,
     "module_table(cap, stack, key, record_output, hook_wrap, root, stats, node_hooks=True): "
     "one capture's modules (stats: its StatsBuffer, or None; node_hooks: backward spans by "
     "hooks on autograd's nodes, else by the tensors' Python hooks)"},
    {"observer_begin", (PyCFunction)(void (*)(void))observer_begin, METH_FASTCALL,
     "observer_begin(session, measured, memory, impls, numels, names, n, earlier_ns) -> "
     "memory recorded (1/0), or -1: ct_obs_begin without ctypes"},
    {"stats_buffer", new_stats_buffer, METH_NOARGS,
     "stats_buffer(): a capture's tensor statistics until they are recorded"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "candle_trace_native_spans",
    "candle_trace.torch's module spans in C++ (_native.h)", -1, module_functions,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace
}  // namespace ct_native

// The module (a new reference; null with a Python error set). Called through
// ctypes.PyDLL (the GIL held) with the library's span, tracer and statistics functions
// and the Python objects the hooks need. Every call returns a new module object over the same
// types; the function pointers and objects are those of the latest call (one library,
// one torch per process).
extern "C" __attribute__((visibility("default"))) PyObject *ct_obs_native(
    void *span_begin, void *span_end, void *measurement_begin, void *tracer_begin,
    void *tracer_end, void *reduce_f32, void *record_stats, PyObject *tensor_type,
    PyObject *has_torch_function, PyObject *ordered_dict, PyObject *mapping) {
    using namespace ct_native;
    if (!span_begin || !span_end || !measurement_begin || !tracer_begin || !tracer_end ||
        !reduce_f32 || !record_stats) {
        PyErr_SetString(PyExc_ValueError, "ct_obs_native: a library function is missing");
        return nullptr;
    }
    if (!make_stack_type() ||
        !make_module_types(tensor_type, has_torch_function, ordered_dict, mapping) ||
        !make_stats_type(tensor_type))
        return nullptr;
    p_span_begin = reinterpret_cast<span_begin_fn>(span_begin);
    p_span_end = reinterpret_cast<span_end_fn>(span_end);
    p_measurement_begin = reinterpret_cast<measurement_begin_fn>(measurement_begin);
    p_tracer_begin = reinterpret_cast<tracer_fn>(tracer_begin);
    p_tracer_end = reinterpret_cast<tracer_fn>(tracer_end);
    p_reduce_f32 = reinterpret_cast<reduce_f32_fn>(reduce_f32);
    p_record_stats = reinterpret_cast<record_stats_fn>(record_stats);
    return PyModule_Create(&module_def);
}
