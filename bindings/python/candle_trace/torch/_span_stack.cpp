// Each thread's open spans of one capture (see _native.h), and their Python methods
// (_spans.NativeSpans).

#include "_native.h"

#include <new>

extern "C" void ct_obs_set_span(uint64_t span);  // _observer.cpp: ops' innermost span

namespace ct_native {

PyTypeObject *g_stack_type = nullptr;

std::vector<Frame> &frames_of(SpanStack *s) {
    StackState &st = *s->st;
    unsigned long me = PyThread_get_thread_ident();
    if (st.last < st.threads.size() && st.threads[st.last].thread == me)
        return st.threads[st.last].frames;
    for (size_t i = 0; i < st.threads.size(); ++i) {
        if (st.threads[i].thread == me) {
            st.last = i;
            return st.threads[i].frames;
        }
    }
    st.threads.push_back(ThreadFrames{me, {}});
    st.last = st.threads.size() - 1;
    return st.threads.back().frames;
}

int intern_owner(SpanStack *s, const std::string &tag) {
    StackState &st = *s->st;
    auto it = st.owner_ids.find(tag);
    if (it != st.owner_ids.end()) return it->second;
    Owner o;
    o.tag = tag;
    o.backward_module = tag.compare(0, 2, "b:") == 0;
    o.backward = o.backward_module || tag == "backward";
    if (o.backward_module) o.outer = tag.substr(2);
    st.owners.push_back(o);
    int id = static_cast<int>(st.owners.size() - 1);
    st.owner_ids.emplace(tag, id);
    return id;
}

int owner_arg(SpanStack *s, PyObject *owner) {
    Py_ssize_t n = 0;
    const char *p = PyUnicode_AsUTF8AndSize(owner, &n);
    if (!p) return -1;
    return intern_owner(s, std::string(p, static_cast<size_t>(n)));
}

// A library status as the Python error of the binding (raise_status raises it).
int lib_error(SpanStack *s, int status) {
    PyObject *r = PyObject_CallFunction(s->raise_status, "i", status);
    if (r) {  // it did not raise: still an error here
        Py_DECREF(r);
        PyErr_Format(PyExc_RuntimeError, "candle_trace: status %d", status);
    }
    return -1;
}

// The op observer learns the new innermost span of the calling thread (its ops go there).
void notify(SpanStack *s, uint64_t sid) {
    if (s->publish) ct_obs_set_span(sid);
}

int push(SpanStack *s, int owner, const char *name, int kind, int step, uint64_t *sid) {
    uint64_t out = 0;
    int st = p_span_begin(*s->handle, name, kind, step, &out);
    if (st) return lib_error(s, st);
    frames_of(s).push_back(Frame{owner, out});
    *sid = out;
    notify(s, out);
    return 0;
}

void push_frame(SpanStack *s, int owner, uint64_t sid) {
    frames_of(s).push_back(Frame{owner, sid});
    notify(s, sid);
}

int push_measured(SpanStack *s, int owner, const char *name, uint64_t *sid) {
    uint64_t out = 0;
    int st = p_measurement_begin(*s->handle, name, &out);
    if (st) return lib_error(s, st);
    push_frame(s, owner, out);
    *sid = out;
    return 0;
}

// Closes the calling thread's innermost span.
int pop_top(SpanStack *s) {
    std::vector<Frame> &f = frames_of(s);
    if (f.empty()) {
        PyErr_SetString(PyExc_IndexError, "pop from an empty span stack");
        return -1;
    }
    uint64_t top = f.back().sid;
    f.pop_back();
    // The observer learns the new innermost span before the old one closes, so an event
    // between the two calls still lands in an open span.
    notify(s, f.empty() ? 0 : f.back().sid);
    int st = p_span_end(*s->handle, top);
    return st ? lib_error(s, st) : 0;
}

// Closes this thread's spans down to and including `sid` (if it is open).
int close_until(SpanStack *s, uint64_t sid) {
    bool open = false;
    for (const Frame &fr : frames_of(s))
        if (fr.sid == sid) open = true;
    if (!open) return 0;
    for (;;) {
        std::vector<Frame> &f = frames_of(s);
        if (f.empty()) return 0;
        uint64_t top = f.back().sid;
        if (pop_top(s) < 0) return -1;
        if (top == sid) return 0;
    }
}

// The calling thread's innermost open span of `owner`, 0 when none.
uint64_t find(SpanStack *s, int owner) {
    std::vector<Frame> &f = frames_of(s);
    for (size_t i = f.size(); i-- > 0;)
        if (f[i].owner == owner) return f[i].sid;
    return 0;
}

bool in_backward(SpanStack *s) {
    const std::vector<Owner> &owners = s->st->owners;
    for (const Frame &f : frames_of(s))
        if (owners[static_cast<size_t>(f.owner)].backward) return true;
    return false;
}

// ---- SpanStack: the Python methods (_spans.NativeSpans) ------------------------------

PyObject *stack_push(SpanStack *s, PyObject *args) {
    PyObject *owner;
    const char *name;
    int kind, step;
    if (!PyArg_ParseTuple(args, "Uyii", &owner, &name, &kind, &step)) return nullptr;
    int o = owner_arg(s, owner);
    if (o < 0) return nullptr;
    uint64_t sid = 0;
    if (push(s, o, name, kind, step, &sid) < 0) return nullptr;
    return PyLong_FromUnsignedLongLong(sid);
}

PyObject *stack_push_frame(SpanStack *s, PyObject *args) {
    PyObject *owner;
    unsigned long long sid;
    if (!PyArg_ParseTuple(args, "UK", &owner, &sid)) return nullptr;
    int o = owner_arg(s, owner);
    if (o < 0) return nullptr;
    push_frame(s, o, sid);
    Py_RETURN_NONE;
}

PyObject *stack_push_measured(SpanStack *s, PyObject *args) {
    PyObject *owner;
    const char *name;
    if (!PyArg_ParseTuple(args, "Uy", &owner, &name)) return nullptr;
    int o = owner_arg(s, owner);
    if (o < 0) return nullptr;
    uint64_t sid = 0;
    if (push_measured(s, o, name, &sid) < 0) return nullptr;
    return PyLong_FromUnsignedLongLong(sid);
}

PyObject *stack_pop_top(SpanStack *s, PyObject *) {
    if (pop_top(s) < 0) return nullptr;
    Py_RETURN_NONE;
}

PyObject *stack_close_until(SpanStack *s, PyObject *arg) {
    unsigned long long sid = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred() || close_until(s, sid) < 0) return nullptr;
    Py_RETURN_NONE;
}

PyObject *stack_find(SpanStack *s, PyObject *owner) {
    if (!PyUnicode_Check(owner)) {
        PyErr_SetString(PyExc_TypeError, "owner must be a str");
        return nullptr;
    }
    int o = owner_arg(s, owner);
    if (o < 0) return nullptr;
    uint64_t sid = find(s, o);
    if (!sid) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(sid);
}

PyObject *stack_current(SpanStack *s, PyObject *) {
    std::vector<Frame> &f = frames_of(s);
    return PyLong_FromUnsignedLongLong(f.empty() ? 1 : f.back().sid);
}

PyObject *stack_frames(SpanStack *s, PyObject *) {
    std::vector<Frame> &f = frames_of(s);
    PyObject *out = PyList_New(static_cast<Py_ssize_t>(f.size()));
    if (!out) return nullptr;
    for (size_t i = 0; i < f.size(); ++i) {
        const std::string &tag = s->st->owners[f[i].owner].tag;
        PyObject *t = Py_BuildValue("(s#K)", tag.data(), static_cast<Py_ssize_t>(tag.size()),
                                    static_cast<unsigned long long>(f[i].sid));
        if (!t) {
            Py_DECREF(out);
            return nullptr;
        }
        PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), t);
    }
    return out;
}

// The session clock stops (pause) and goes on (resume): ct_tracer_begin/end, the status
// returned as the ctypes calls they replace return it (a capture ending inside a
// bracket resumes a session already finished: not the program's error).
PyObject *stack_pause(SpanStack *s, PyObject *) { return PyLong_FromLong(p_tracer_begin(*s->handle)); }

PyObject *stack_resume(SpanStack *s, PyObject *) { return PyLong_FromLong(p_tracer_end(*s->handle)); }

// How many spans threads other than the calling one hold open (autograd's device threads
// run backward hooks on CUDA: _autograd_threads closes what they leave).
PyObject *stack_open_elsewhere(SpanStack *s, PyObject *) {
    unsigned long me = PyThread_get_thread_ident();
    size_t n = 0;
    for (const ThreadFrames &t : s->st->threads)
        if (t.thread != me) n += t.frames.size();
    return PyLong_FromSize_t(n);
}

PyObject *stack_reset(SpanStack *s, PyObject *) {
    s->st->threads.clear();
    s->st->last = 0;
    s->publish = 0;
    Py_RETURN_NONE;
}

PyObject *stack_get_publish(SpanStack *s, void *) { return PyBool_FromLong(s->publish); }

int stack_set_publish(SpanStack *s, PyObject *v, void *) {
    int on = v ? PyObject_IsTrue(v) : 0;
    if (on < 0) return -1;
    s->publish = on;
    return 0;
}

int stack_traverse(SpanStack *s, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(s));
    Py_VISIT(s->hc);
    Py_VISIT(s->raise_status);
    return 0;
}

int stack_clear(SpanStack *s) {
    Py_CLEAR(s->hc);
    Py_CLEAR(s->raise_status);
    return 0;
}

void stack_dealloc(SpanStack *s) {
    PyTypeObject *tp = Py_TYPE(s);
    PyObject_GC_UnTrack(s);
    stack_clear(s);
    delete s->st;
    PyObject_GC_Del(s);
    Py_DECREF(tp);
}

PyMethodDef stack_methods[] = {
    {"push", (PyCFunction)stack_push, METH_VARARGS,
     "push(owner, name: bytes, kind, step) -> span id: opens a span on this thread"},
    {"push_frame", (PyCFunction)stack_push_frame, METH_VARARGS,
     "push_frame(owner, sid): a span opened elsewhere (the measured region) as this thread's innermost"},
    {"push_measured", (PyCFunction)stack_push_measured, METH_VARARGS,
     "push_measured(owner, name: bytes) -> span id: opens the session's measured region "
     "(ct_measurement_begin) on this thread"},
    {"pop_top", (PyCFunction)stack_pop_top, METH_NOARGS, "closes this thread's innermost span"},
    {"close_until", (PyCFunction)stack_close_until, METH_O,
     "closes this thread's spans down to and including sid, if it is open"},
    {"find", (PyCFunction)stack_find, METH_O, "this thread's innermost open span of owner, or None"},
    {"current", (PyCFunction)stack_current, METH_NOARGS, "this thread's innermost span (1: none)"},
    {"frames", (PyCFunction)stack_frames, METH_NOARGS, "this thread's open spans, innermost last"},
    {"reset", (PyCFunction)stack_reset, METH_NOARGS, "forgets every thread's open spans"},
    {"open_elsewhere", (PyCFunction)stack_open_elsewhere, METH_NOARGS,
     "how many spans other threads hold open"},
    {"pause", (PyCFunction)stack_pause, METH_NOARGS,
     "ct_tracer_begin on the session -> status: the tracer's work follows"},
    {"resume", (PyCFunction)stack_resume, METH_NOARGS, "ct_tracer_end on the session -> status"},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef stack_getset[] = {
    {"publish", (getter)stack_get_publish, (setter)stack_set_publish,
     "whether the op observer is told each thread's innermost span", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// span_stack(hc, address_of_hc_value, raise_status) -> SpanStack
PyObject *new_stack(PyObject *, PyObject *args) {
    PyObject *hc, *raise_status;
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "OKO", &hc, &address, &raise_status)) return nullptr;
    if (!address || !PyCallable_Check(raise_status)) {
        PyErr_SetString(PyExc_ValueError, "span_stack: a handle's address and a callable");
        return nullptr;
    }
    SpanStack *s = PyObject_GC_New(SpanStack, g_stack_type);
    if (!s) return nullptr;
    s->st = new (std::nothrow) StackState();
    Py_INCREF(hc);
    Py_INCREF(raise_status);
    s->hc = hc;
    s->handle = reinterpret_cast<const uint64_t *>(static_cast<uintptr_t>(address));
    s->raise_status = raise_status;
    s->publish = 0;
    PyObject_GC_Track(s);
    if (!s->st) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    return reinterpret_cast<PyObject *>(s);
}

bool make_stack_type() {
    if (g_stack_type) return true;
    PyType_Slot slots[] = {
        {Py_tp_dealloc, reinterpret_cast<void *>(stack_dealloc)},
        {Py_tp_traverse, reinterpret_cast<void *>(stack_traverse)},
        {Py_tp_clear, reinterpret_cast<void *>(stack_clear)},
        {Py_tp_methods, stack_methods},
        {Py_tp_getset, stack_getset},
        {Py_tp_new, reinterpret_cast<void *>(no_new)},
        {Py_tp_doc, const_cast<char *>("each thread's open spans of one capture")},
        {0, nullptr},
    };
    g_stack_type = make_type("candle_trace_native_spans.SpanStack", sizeof(SpanStack), slots);
    return g_stack_type != nullptr;
}

}  // namespace ct_native
