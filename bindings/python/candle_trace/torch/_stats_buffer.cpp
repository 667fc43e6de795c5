// A capture's tensor statistics until the update is over (see _native.h): the filled
// ct_tensor_stats of each reduction, in record order, recorded through the library by
// flush(handle) once the update's spans are closed (_stats.StatsRecorder).
//
// Why C++: from Python a statistics call cost ~31k instructions of ctypes and torch's
// getters around a reduction of a few hundred floats (BENCHMARKS.md, "Where the
// uncounted time was"); from a module's forward wrapper (_module_spans.cpp) the float32
// pass is one call into the library, with the tensor read through torch's C++ API: its
// TensorImpl, from Tensor._cdata (torch's Python headers need pybind11, which a distro's
// torch may not ship).

#include "_native.h"

#include <c10/core/TensorImpl.h>

#include <deque>
#include <new>
#include <string>
#include <vector>

namespace ct_native {

reduce_f32_fn p_reduce_f32 = nullptr;
record_stats_fn p_record_stats = nullptr;
PyTypeObject *g_stats_type = nullptr;

namespace {

PyTypeObject *g_exact_tensor = nullptr;  // torch.Tensor: subclasses take Python's path
PyObject *s_cdata = nullptr;             // "_cdata": a tensor's TensorImpl address

// The shape a rank-0 tensor points to (its one element; never read).
const int64_t kNoDims[1] = {1};

struct Entry {
    uint64_t span;
    size_t shape_off;   // into Pending::shapes
    PyObject *keep;     // the label's bytes, or null (a copied label in Pending::texts)
    TensorStats st;     // shape set at flush (the vector may move until then)
};

struct Pending {
    std::vector<Entry> entries;
    std::vector<int64_t> shapes;
    std::deque<std::string> texts;  // labels and dtypes copied from Python's structs

    void clear() {
        for (Entry &e : entries) Py_CLEAR(e.keep);
        entries.clear();
        shapes.clear();
        texts.clear();
    }
};

struct StatsBuffer {
    PyObject_HEAD
    Pending *p;
};

Entry &push_entry(Pending &p, uint64_t span, const int64_t *shape, size_t rank) {
    Entry e{};
    e.span = span;
    e.shape_off = p.shapes.size();
    p.shapes.insert(p.shapes.end(), shape, shape + rank);
    e.st.size = sizeof(TensorStats);
    e.st.rank = rank;
    p.entries.push_back(e);
    return p.entries.back();
}

void pop_entry(Pending &p) {
    Entry &e = p.entries.back();
    Py_CLEAR(e.keep);
    p.shapes.resize(e.shape_off);
    p.entries.pop_back();
}

bool unsigned_arg(PyObject *o, unsigned long long *out) {
    *out = PyLong_AsUnsignedLongLong(o);
    return !(*out == static_cast<unsigned long long>(-1) && PyErr_Occurred());
}

// reduce(span, label: bytes, tensor) -> bool: stats_reduce from Python (the loss).
PyObject *buffer_reduce(StatsBuffer *b, PyObject *const *args, Py_ssize_t n) {
    unsigned long long span;
    if (n != 3 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "reduce(span, label: bytes, tensor)");
        return nullptr;
    }
    if (!unsigned_arg(args[0], &span)) return nullptr;
    int r = stats_reduce(reinterpret_cast<PyObject *>(b), span, args[1], args[2]);
    if (r < 0) return nullptr;
    return PyBool_FromLong(r);
}

// add(span, address): a struct ct_tensor_stats Python filled (ctypes.addressof), copied
// with its label, dtype and shape.
PyObject *buffer_add(StatsBuffer *b, PyObject *const *args, Py_ssize_t n) {
    unsigned long long span, address;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "add(span, address)");
        return nullptr;
    }
    if (!unsigned_arg(args[0], &span) || !unsigned_arg(args[1], &address)) return nullptr;
    const auto *src = reinterpret_cast<const TensorStats *>(static_cast<uintptr_t>(address));
    if (!src || !src->label || !src->dtype || (src->rank && !src->shape)) {
        PyErr_SetString(PyExc_ValueError, "add: a filled ct_tensor_stats (label, dtype, shape)");
        return nullptr;
    }
    Pending &p = *b->p;
    try {
        p.texts.emplace_back(src->label);
        const char *label = p.texts.back().c_str();
        p.texts.emplace_back(src->dtype);
        const char *dtype = p.texts.back().c_str();
        Entry &e = push_entry(p, span, src->shape, src->rank);
        e.st = *src;
        e.st.size = sizeof(TensorStats);
        e.st.label = label;
        e.st.dtype = dtype;
        e.st.shape = nullptr;  // set at flush
    } catch (const std::bad_alloc &) {
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

// flush(handle) -> status: records every entry in order (ct_record_tensor_stats) and
// forgets them; the first refusal's status (its message is the library's last error on
// this thread), the entries after it dropped, as Python's loop raised at the first.
PyObject *buffer_flush(StatsBuffer *b, PyObject *arg) {
    unsigned long long handle;
    if (!unsigned_arg(arg, &handle)) return nullptr;
    Pending &p = *b->p;
    int status = 0;
    for (Entry &e : p.entries) {
        e.st.shape = e.st.rank ? p.shapes.data() + e.shape_off : kNoDims;
        status = p_record_stats(handle, e.span, &e.st);
        if (status) break;
    }
    p.clear();
    return PyLong_FromLong(status);
}

PyObject *buffer_drop(StatsBuffer *b, PyObject *) {
    b->p->clear();
    Py_RETURN_NONE;
}

PyObject *buffer_count(StatsBuffer *b, PyObject *) {
    return PyLong_FromSize_t(b->p->entries.size());
}

void buffer_dealloc(StatsBuffer *b) {
    PyTypeObject *tp = Py_TYPE(b);
    PyObject_GC_UnTrack(b);
    if (b->p) {
        b->p->clear();
        delete b->p;
    }
    PyObject_GC_Del(b);
    Py_DECREF(tp);
}

int buffer_traverse(StatsBuffer *b, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(b));  // the labels it keeps are bytes: no cycle goes through them
    return 0;
}

PyMethodDef buffer_methods[] = {
    {"reduce", (PyCFunction)(void (*)(void))buffer_reduce, METH_FASTCALL,
     "reduce(span, label: bytes, tensor) -> whether the library's float32 pass took it"},
    {"add", (PyCFunction)(void (*)(void))buffer_add, METH_FASTCALL,
     "add(span, address): a filled ct_tensor_stats (ctypes.addressof), copied"},
    {"flush", (PyCFunction)buffer_flush, METH_O,
     "flush(handle) -> status: records what is kept, in order, and forgets it"},
    {"drop", (PyCFunction)buffer_drop, METH_NOARGS, "forgets what is kept"},
    {"count", (PyCFunction)buffer_count, METH_NOARGS, "how many statistics are kept"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

void *tensor_impl(PyObject *tensor) {
    PyObject *address = s_cdata ? PyObject_GetAttr(tensor, s_cdata) : nullptr;
    void *impl = address ? PyLong_AsVoidPtr(address) : nullptr;
    Py_XDECREF(address);
    if (!impl) PyErr_Clear();
    return impl;
}

int stats_reduce(PyObject *buffer, uint64_t span, PyObject *label, PyObject *tensor) {
    if (Py_TYPE(buffer) != g_stats_type || Py_TYPE(tensor) != g_exact_tensor ||
        !PyBytes_Check(label))
        return 0;
    Pending &p = *reinterpret_cast<StatsBuffer *>(buffer)->p;
    void *impl_p = tensor_impl(tensor);
    if (!impl_p) return 0;  // not a TensorImpl of this torch after all: Python's path
    // The tensor (referenced by the caller for the call) keeps its TensorImpl alive.
    const auto *t = static_cast<const c10::TensorImpl *>(impl_p);
    try {
        if (c10::typeMetaToScalarType(t->dtype()) != c10::ScalarType::Float || !t->is_cpu() ||
            t->layout() != c10::kStrided || t->numel() == 0 || !t->has_storage() ||
            !t->is_contiguous())
            return 0;
        const float *data = static_cast<const float *>(t->data());
        if (!data) return 0;
        auto sizes = t->sizes();
        Entry &e = push_entry(p, span, sizes.data(), sizes.size());
        int rc = p_reduce_f32(data, e.st.rank ? p.shapes.data() + e.shape_off : kNoDims,
                              e.st.rank, &e.st);
        if (rc) {  // Python's path raises the library's refusal
            pop_entry(p);
            return 0;
        }
        Py_INCREF(label);
        e.keep = label;
        e.st.label = PyBytes_AS_STRING(label);
        return 1;
    } catch (const std::bad_alloc &) {
        PyErr_NoMemory();
        return -1;
    } catch (const std::exception &) {  // a tensor without the expected metadata
        return 0;
    }
}

PyObject *new_stats_buffer(PyObject *, PyObject *) {
    StatsBuffer *b = PyObject_GC_New(StatsBuffer, g_stats_type);
    if (!b) return nullptr;
    b->p = new (std::nothrow) Pending();
    PyObject_GC_Track(b);
    if (!b->p) {
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    return reinterpret_cast<PyObject *>(b);
}

bool make_stats_type(PyObject *tensor_type) {
    if (!PyType_Check(tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "make_stats_type: torch.Tensor");
        return false;
    }
    if (!s_cdata && !(s_cdata = PyUnicode_InternFromString("_cdata"))) return false;
    Py_INCREF(tensor_type);
    Py_XDECREF(reinterpret_cast<PyObject *>(g_exact_tensor));
    g_exact_tensor = reinterpret_cast<PyTypeObject *>(tensor_type);
    if (g_stats_type) return true;
    PyType_Slot slots[] = {
        {Py_tp_dealloc, reinterpret_cast<void *>(buffer_dealloc)},
        {Py_tp_traverse, reinterpret_cast<void *>(buffer_traverse)},
        {Py_tp_methods, buffer_methods},
        {Py_tp_new, reinterpret_cast<void *>(no_new)},
        {Py_tp_doc, const_cast<char *>("a capture's tensor statistics, kept until recorded")},
        {0, nullptr},
    };
    g_stats_type = make_type("candle_trace_native_spans.StatsBuffer", sizeof(StatsBuffer), slots);
    return g_stats_type != nullptr;
}

}  // namespace ct_native
