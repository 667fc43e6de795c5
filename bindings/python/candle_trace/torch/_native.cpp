// The module of candle_trace.torch's module spans in C++ that Python gets (see
// _native.h): ct_obs_native, called through ctypes.

#include "_native.h"

namespace ct_native {

span_begin_fn p_span_begin = nullptr;
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

PyMethodDef module_functions[] = {
    {"span_stack", new_stack, METH_VARARGS,
     "span_stack(hc, address, raise_status): the span stacks of a session (hc: its "
     "ctypes.c_uint64 handle, address: ctypes.addressof(hc))"},
    {"module_table", new_table, METH_VARARGS,
     "module_table(cap, stack, key, record_output, hook_wrap, root, stats): one capture's "
     "modules (stats: its StatsBuffer, or None)"},
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
    void *span_begin, void *span_end, void *tracer_begin, void *tracer_end, void *reduce_f32,
    void *record_stats, PyObject *tensor_type, PyObject *has_torch_function,
    PyObject *ordered_dict, PyObject *mapping) {
    using namespace ct_native;
    if (!span_begin || !span_end || !tracer_begin || !tracer_end || !reduce_f32 || !record_stats) {
        PyErr_SetString(PyExc_ValueError, "ct_obs_native: a library function is missing");
        return nullptr;
    }
    if (!make_stack_type() ||
        !make_module_types(tensor_type, has_torch_function, ordered_dict, mapping) ||
        !make_stats_type(tensor_type))
        return nullptr;
    p_span_begin = reinterpret_cast<span_begin_fn>(span_begin);
    p_span_end = reinterpret_cast<span_end_fn>(span_end);
    p_tracer_begin = reinterpret_cast<tracer_fn>(tracer_begin);
    p_tracer_end = reinterpret_cast<tracer_fn>(tracer_end);
    p_reduce_f32 = reinterpret_cast<reduce_f32_fn>(reduce_f32);
    p_record_stats = reinterpret_cast<record_stats_fn>(record_stats);
    return PyModule_Create(&module_def);
}
