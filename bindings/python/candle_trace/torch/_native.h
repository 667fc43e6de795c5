// candle_trace.torch's module spans in C++: what _span_stack.cpp (each thread's open
// spans of a capture), _module_spans.cpp (each module's forward wrapper and the autograd
// hooks of its backward span), _stats_buffer.cpp (the capture's tensor statistics, reduced
// by the library straight from a tensor's memory) and _native.cpp (the module Python gets:
// ct_obs_native) share. Compiled into the op observer's library (_observer.py builds every file),
// driven from _spans.NativeSpans and _modules.NativeModuleSpans; the portable Python
// versions (_spans.Spans, _modules.PyModuleSpans) are used where the library cannot be
// built, and do the same thing step for step -- their docs say what the spans are.
//
// Why C++: the flight recorder records every update, and per module call the Python
// version ran a dozen frames and ~14 ctypes calls (tracer brackets, span begin and end,
// the observer's innermost span), with caches the model's math had just evicted: ~2 ms
// of an 85 ms GPT-style update (BENCHMARKS.md). Here a module costs one C call into its
// wrapper, one into each tensor hook, and the library's span calls.
//
// Every entry point runs with the GIL held -- the wrapper is called by Module.__call__,
// the tensor hooks by autograd's PyFunctionTensorPreHook, the node hooks take it first
// thing, the stack's methods are called by Python -- so the GIL is the lock of all the
// state here.
//
// Python's C API only (no pybind11): the library is loaded with ctypes, and
// ct_obs_native() hands Python a module object with these types.

#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ct_native {

// ---- the library's C ABI, as far as the module spans use it (include/candle_trace.h) --
// Set by ct_obs_native (_native.cpp) to the functions of the libcandle_trace.so the
// binding loaded.

// struct ct_tensor_stats (records start with `size`: one of this version stays valid).
struct TensorStats {
    uint32_t size;
    uint32_t reserved;
    const char *label;
    const char *dtype;
    const int64_t *shape;
    size_t rank;
    uint64_t elements;
    uint64_t non_finite;
    double rms;
    double abs_max;
    double mean;
};

using span_begin_fn = int (*)(uint64_t, const char *, int, int, uint64_t *);
using measurement_begin_fn = int (*)(uint64_t, const char *, uint64_t *);
using span_end_fn = int (*)(uint64_t, uint64_t);
using tracer_fn = int (*)(uint64_t);
using reduce_f32_fn = int (*)(const float *, const int64_t *, size_t, TensorStats *);
using record_stats_fn = int (*)(uint64_t, uint64_t, const TensorStats *);

extern span_begin_fn p_span_begin;
extern measurement_begin_fn p_measurement_begin;  // ct_measurement_begin
extern span_end_fn p_span_end;
extern tracer_fn p_tracer_begin;
extern tracer_fn p_tracer_end;
extern reduce_f32_fn p_reduce_f32;        // ct_reduce_tensor_stats_f32
extern record_stats_fn p_record_stats;    // ct_record_tensor_stats

// A heap type of this library (instances collected by the GC, never made from Python).
PyTypeObject *make_type(const char *name, size_t size, PyType_Slot *slots);
PyObject *no_new(PyTypeObject *, PyObject *, PyObject *);

// ---- the span stack ---------------------------------------------------------------------
// Each thread's open spans of one capture, innermost last, as (owner, span id): the owner
// is a tag ("f:<module>", "b:<module>", "backward", "optimizer", "update") by which a
// hook finds the span it opened, interned to an index.

struct Owner {
    std::string tag;
    bool backward_module;  // "b:<module>"
    bool backward;         // a backward module span's or the backward call's ("backward")
    std::string outer;     // <module>, for a backward module span
};

struct Frame {
    int owner;
    uint64_t sid;
};

struct ThreadFrames {
    unsigned long thread;
    std::vector<Frame> frames;
};

struct StackState {
    std::vector<ThreadFrames> threads;  // few: the program's and autograd's
    size_t last = 0;                    // the entry found last
    std::vector<Owner> owners;
    std::unordered_map<std::string, int> owner_ids;
};

struct SpanStack {
    PyObject_HEAD
    PyObject *hc;            // the session's ctypes.c_uint64, kept alive for `handle`
    const uint64_t *handle;  // its value: the session handle, which ct_reopen changes
    PyObject *raise_status;  // raise_status(status) raises the library's error
    int publish;             // tell the op observer each thread's innermost span
    StackState *st;
};


extern PyTypeObject *g_stack_type;
bool make_stack_type();

// span_stack(hc, address_of_hc_value, raise_status) -> SpanStack
PyObject *new_stack(PyObject *, PyObject *args);

// The calling thread's frames (GIL held).
std::vector<Frame> &frames_of(SpanStack *s);
int intern_owner(SpanStack *s, const std::string &tag);
// Each returns 0, or -1 with a Python error set.
int push(SpanStack *s, int owner, const char *name, int kind, int step, uint64_t *sid);
void push_frame(SpanStack *s, int owner, uint64_t sid);
// Opens the session's measured region (ct_measurement_begin) as this thread's innermost
// span, owned by `owner`.
int push_measured(SpanStack *s, int owner, const char *name, uint64_t *sid);
int pop_top(SpanStack *s);
int close_until(SpanStack *s, uint64_t sid);
// The calling thread's innermost open span of `owner`, 0 when none.
uint64_t find(SpanStack *s, int owner);
// Whether the calling thread is inside a backward: a span of one is open on it.
bool in_backward(SpanStack *s);

// ---- tensor statistics (_stats_buffer.cpp) -----------------------------------------------
// What _stats.StatsRecorder keeps of a capture's statistics until the update is over: the
// filled ct_tensor_stats, in record order, recorded by flush(handle). A module's output
// (forward_end) and the loss are reduced here without Python where the library's float32
// pass applies; everything else is reduced by Python and added as a filled struct.

extern PyTypeObject *g_stats_type;
bool make_stats_type(PyObject *tensor_type);

// stats_buffer() -> StatsBuffer
PyObject *new_stats_buffer(PyObject *, PyObject *);

// Reduces `tensor` into `buffer` for `span`, labelled `label` (bytes), where the library's
// float32 pass applies (a non-empty contiguous float32 CPU torch.Tensor): 1. 0 when it does
// not (the caller takes Python's path, which also raises what the library refuses); -1
// with a Python error set.
int stats_reduce(PyObject *buffer, uint64_t span, PyObject *label, PyObject *tensor);

// The c10::TensorImpl behind a tensor (its Tensor._cdata), or null with no error set:
// how the statistics and the backward spans' node hooks reach a tensor in C++.
void *tensor_impl(PyObject *tensor);

// ---- module spans (_module_spans.cpp) ---------------------------------------------------

// The types, and the Python objects the hooks need (torch.Tensor,
// torch.overrides.has_torch_function_unary, collections.OrderedDict and
// collections.abc.Mapping); false with a Python error set.
bool make_module_types(PyObject *tensor_type, PyObject *has_torch_function,
                       PyObject *ordered_dict, PyObject *mapping);

// module_table(cap, stack, key, record_output, hook_wrap_or_None, root, stats_or_None)
//   -> ModuleTable
PyObject *new_table(PyObject *, PyObject *args);

}  // namespace ct_native
