// Each module's forward wrapper and the autograd hooks of its backward span (see
// _native.h), and the table of a capture's modules they share (_modules.NativeModuleSpans).

#include "_native.h"

#include <c10/core/GradMode.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <new>

// Compiled autograd's argument collector (torch >= 2.2 declares it; older torches never
// call what takes it).
namespace torch::dynamo::autograd {
class CompiledNodeArgs;
}  // namespace torch::dynamo::autograd

namespace ct_native {
namespace {

constexpr int kKindModule = 2;    // CT_SPAN_MODULE
constexpr int kStepNone = 0;      // CT_STEP_NONE
constexpr int kStepForward = 1;   // CT_STEP_FORWARD
constexpr int kStepBackward = 2;  // CT_STEP_BACKWARD

// ---- Python objects looked up once (make_module_types) --------------------------------

PyTypeObject *g_tensor_type = nullptr;     // torch.Tensor
PyObject *g_has_torch_function = nullptr;  // torch.overrides.has_torch_function_unary
PyObject *g_ordered_dict = nullptr;        // collections.OrderedDict
PyObject *g_mapping = nullptr;             // collections.abc.Mapping

PyObject *s_state, *s_capturing, *s_armed, *s_stats, *s_on_forward, *s_failing,
    *s_abort, *s_requires_grad, *s_backward_hooks, *s_grad_fn, *s_register_hook_dict,
    *s_register_hook, *s_own_hooks;

PyTypeObject *g_table_type, *g_forward_type, *g_hooks_type;

bool intern_all() {
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_state, "state"},
        {&s_capturing, "capturing"},
        {&s_armed, "armed"},
        {&s_stats, "stats"},
        {&s_on_forward, "on_forward"},
        {&s_failing, "failing"},
        {&s_abort, "abort"},
        {&s_requires_grad, "requires_grad"},
        {&s_backward_hooks, "_backward_hooks"},
        {&s_grad_fn, "grad_fn"},
        {&s_register_hook_dict, "_register_hook_dict"},
        {&s_register_hook, "register_hook"},
        {&s_own_hooks, "_candle_trace_hooks"},
    };
    for (auto &n : names) {
        if (*n.slot) continue;
        *n.slot = PyUnicode_InternFromString(n.text);
        if (!*n.slot) return false;
    }
    return true;
}

// ---- the module table -------------------------------------------------------------------
// The modules of one capture, their span names and owners; what the wrappers and the
// hooks share.

struct ModInfo {
    PyObject *module;   // strong: the wrapper is the module's instance attribute anyway
    PyObject *name;     // bytes (the span's name), or null when it could not be encoded
    PyObject *no_grad;  // bytes: "<name> [no_grad]", or null likewise
    PyObject *recompute;  // bytes: "<name> [recompute]", or null likewise
    PyObject *out_label;  // bytes: "<name>/output", the output's statistics; null: Python's
    PyObject *name_error;  // why not (the binding's argument error), raised at push
    std::string qual;   // the qualified name ("" for the model)
    int owner_forward, owner_backward;
    bool top;
};

struct ModuleTable;

// What an autograd node's hook (NodeHook) holds of its capture's table: the node may
// outlive the table, and is freed wherever autograd frees it, without the GIL.
// Cleared (under the GIL) when the table goes.
struct TableRef {
    ModuleTable *table;
};

struct ModuleTable {
    PyObject_HEAD
    PyObject *cap;            // the Capture: state, stats, on_forward, failing, abort
    SpanStack *stack;
    PyObject *key;            // this capture's key in a tensor's _backward_hooks
    PyObject *record_output;  // record_output(index, sid, tensor): the output's statistics
    PyObject *hook_wrap;      // hook_wrap(hooks) -> what goes into the dict, or null
    PyObject *stats;          // the capture's StatsBuffer (_stats_buffer.cpp), or null
    std::string *root;        // the model's span name
    std::vector<ModInfo> *mods;
    std::shared_ptr<TableRef> *ref;  // what this table's node hooks hold
    bool node_hooks;          // backward spans by hooks on autograd's nodes (NodeHook)
};

struct ModuleForward {
    PyObject_HEAD
    ModuleTable *table;
    PyObject *orig;
    int index;
};

// One per tensor whose gradient opens or closes backward spans: when the gradient
// arrives, the span ends of the modules that consumed the tensor run first, then the
// span begins of the modules that produced it, outermost first (an outer module's
// forward ends last, so it is added last).
struct TensorHooks {
    PyObject_HEAD
    ModuleTable *table;
    std::vector<int> ends, begins;
};

enum State { kOther, kArmed, kCapturing };

State state_of(PyObject *cap) {
    PyObject *s = PyObject_GetAttr(cap, s_state);
    if (!s) {
        PyErr_Clear();
        return kOther;
    }
    State r = kOther;
    if (s == s_capturing || (PyUnicode_Check(s) && PyUnicode_Compare(s, s_capturing) == 0))
        r = kCapturing;
    else if (s == s_armed || (PyUnicode_Check(s) && PyUnicode_Compare(s, s_armed) == 0))
        r = kArmed;
    Py_DECREF(s);
    if (PyErr_Occurred()) PyErr_Clear();
    return r;
}

// The tracer's own work: the session clock stands still (ct_tracer_begin/end).
struct TracerWork {
    uint64_t h;
    explicit TracerWork(const SpanStack *s) : h(*s->handle) { p_tracer_begin(h); }
    ~TracerWork() { p_tracer_end(h); }
    TracerWork(const TracerWork &) = delete;
    TracerWork &operator=(const TracerWork &) = delete;
};

// With a Python error set: an Exception is the tracer's failure -- the capture fails
// (cap.abort) and the program goes on (0); anything else goes to the program (-1).
int tracer_failed(ModuleTable *t) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb) PyException_SetTraceback(value, tb);
    PyObject *r = PyObject_CallMethodOneArg(t->cap, s_abort, value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

bool is_tensor(PyObject *o) { return PyObject_TypeCheck(o, g_tensor_type); }

// A collections.abc.Mapping other than a dict (rare: checked only for what is neither
// a tensor, a list, a tuple nor a plain value); -1 on error.
int other_mapping(PyObject *o) {
    if (o == Py_None || PyLong_Check(o) || PyFloat_Check(o) || PyUnicode_Check(o) ||
        PyBytes_Check(o))
        return 0;
    return PyObject_IsInstance(o, g_mapping);
}

PyObject *mapping_values(PyObject *o) {
    if (PyDict_Check(o)) return PyDict_Values(o);
    PyObject *v = PyMapping_Values(o);
    return v;
}

// The field values of a dataclass instance (a model's output record, as some models
// return one), in order: a new list; null when `o` is none (no error set).
PyObject *dataclass_values(PyObject *o) {
    if (o == Py_None || PyLong_Check(o) || PyFloat_Check(o) || PyUnicode_Check(o) ||
        PyBytes_Check(o) || PyType_Check(o))
        return nullptr;
    PyObject *fields = PyObject_GetAttrString((PyObject *)Py_TYPE(o), "__dataclass_fields__");
    if (!fields || !PyDict_Check(fields)) {
        Py_XDECREF(fields);
        PyErr_Clear();
        return nullptr;
    }
    PyObject *out = PyList_New(0);
    PyObject *key, *field;
    Py_ssize_t pos = 0;
    while (out && PyDict_Next(fields, &pos, &key, &field)) {
        PyObject *v = PyObject_GetAttr(o, key);
        if (!v) {
            PyErr_Clear();  // a field never set (init=False): nothing to read
            continue;
        }
        if (PyList_Append(out, v) < 0) Py_CLEAR(out);
        Py_DECREF(v);
    }
    Py_DECREF(fields);
    return out;
}

// The first tensor in a module's output (a tensor, or nested lists/tuples/mappings/
// dataclasses): a new reference, null when none (then check PyErr_Occurred).
PyObject *first_tensor(PyObject *o) {
    if (is_tensor(o)) {
        Py_INCREF(o);
        return o;
    }
    PyObject *seq = nullptr;
    if (PyList_Check(o) || PyTuple_Check(o)) {
        Py_INCREF(o);
        seq = o;
    } else {
        int m = PyDict_Check(o) ? 1 : other_mapping(o);
        if (m < 0) return nullptr;
        seq = m ? mapping_values(o) : dataclass_values(o);  // a new list
        if (!seq) return nullptr;
    }
    PyObject *found = nullptr;
    for (Py_ssize_t i = 0; i < PySequence_Size(seq) && !found; ++i) {
        PyObject *x = PySequence_GetItem(seq, i);
        if (!x) break;
        found = first_tensor(x);
        Py_DECREF(x);
        if (!found && PyErr_Occurred()) break;
    }
    Py_DECREF(seq);
    return found;
}

// Every tensor in `args` (nested lists/tuples/mappings), in order, as new references.
int tensors_of(PyObject *args, std::vector<PyObject *> &out) {
    std::vector<PyObject *> todo;  // new references
    Py_INCREF(args);
    todo.push_back(args);
    int rc = 0;
    while (!todo.empty()) {
        PyObject *a = todo.back();
        todo.pop_back();
        if (rc == 0) {
            if (is_tensor(a)) {
                Py_INCREF(a);
                out.push_back(a);
            } else if (PyList_Check(a) || PyTuple_Check(a)) {
                for (Py_ssize_t i = PySequence_Size(a); i-- > 0 && rc == 0;) {
                    PyObject *x = PySequence_GetItem(a, i);
                    if (x)
                        todo.push_back(x);
                    else
                        rc = -1;
                }
            } else {
                int m = PyDict_Check(a) ? 1 : other_mapping(a);
                if (m < 0) {
                    rc = -1;
                } else if (m > 0) {
                    PyObject *vals = mapping_values(a);
                    if (!vals) {
                        rc = -1;
                    } else {
                        todo.push_back(vals);  // walked as a list
                    }
                }
            }
        }
        Py_DECREF(a);
    }
    return rc;
}

int requires_grad(PyObject *t) {
    PyObject *r = PyObject_GetAttr(t, s_requires_grad);
    if (!r) return -1;
    int v = PyObject_IsTrue(r);
    Py_DECREF(r);
    return v;
}

TensorHooks *hooks_of(ModuleTable *t, PyObject *bound);
int node_hook(ModuleTable *t, PyObject *tensor, int index, bool begin);
int gradient_arrived(ModuleTable *t, const std::vector<int> &ends, const std::vector<int> &begins);
bool table_alive(const ModuleTable *t);

TensorHooks *new_hooks(ModuleTable *t) {
    TensorHooks *h = PyObject_GC_New(TensorHooks, g_hooks_type);  // holds a reference to its type
    if (!h) return nullptr;
    new (&h->ends) std::vector<int>();
    new (&h->begins) std::vector<int>();
    Py_INCREF(t);
    h->table = t;
    PyObject_GC_Track(h);
    return h;
}

// What goes into the dict for `h` (new reference): h itself, or hook_wrap(h) where
// torch.compile must see an opaque hook (_common.outside_dynamo).
PyObject *bound_hooks(ModuleTable *t, TensorHooks *h) {
    if (!t->hook_wrap) {
        Py_INCREF(h);
        return reinterpret_cast<PyObject *>(h);
    }
    return PyObject_CallOneArg(t->hook_wrap, reinterpret_cast<PyObject *>(h));
}

// The TensorHooks of this table behind `bound` (h, or a functools.partial of hook_wrap
// bound to h), borrowed; null when it is another's (or nothing of ours).
TensorHooks *hooks_of(ModuleTable *t, PyObject *bound) {
    PyObject *h = bound;
    if (Py_TYPE(bound) != g_hooks_type) {
        PyObject *args = PyObject_GetAttrString(bound, "args");
        if (!args) {
            PyErr_Clear();
            return nullptr;
        }
        h = PyTuple_Check(args) && PyTuple_GET_SIZE(args) > 0 ? PyTuple_GET_ITEM(args, 0) : nullptr;
        Py_DECREF(args);  // the partial keeps its arguments
        if (!h || Py_TYPE(h) != g_hooks_type) return nullptr;
    }
    TensorHooks *th = reinterpret_cast<TensorHooks *>(h);
    return th->table == t ? th : nullptr;
}

void add_hook(TensorHooks *h, int index, bool begin) {
    (begin ? h->begins : h->ends).push_back(index);
}

// One autograd hook per tensor (see TensorHooks): what Tensor.register_hook does, less the
// handle it makes (nothing removes these: the tensor and its hooks go together) -- the
// hook goes into the tensor's _backward_hooks dict under this capture's key, where the
// next module to see the tensor finds it. A tensor subclass (or a torch function mode)
// gets its own register_hook.
int tensor_hook(ModuleTable *t, PyObject *tensor, int index, bool begin) {
    if (int on_node = node_hook(t, tensor, index, begin)) return on_node < 0 ? -1 : 0;
    PyObject *hooks = PyObject_GetAttr(tensor, s_backward_hooks);
    if (!hooks) return -1;
    if (hooks != Py_None) {
        PyObject *bound = PyDict_Check(hooks) ? PyDict_GetItemWithError(hooks, t->key)
                                              : PyObject_GetItem(hooks, t->key);
        if (!PyDict_Check(hooks)) {  // a new reference, or a KeyError
            if (!bound && PyErr_ExceptionMatches(PyExc_KeyError)) PyErr_Clear();
        } else {
            Py_XINCREF(bound);
        }
        if (bound) {
            TensorHooks *h = hooks_of(t, bound);
            Py_DECREF(bound);
            if (h) {
                Py_DECREF(hooks);
                add_hook(h, index, begin);
                return 0;
            }
        } else if (PyErr_Occurred()) {
            Py_DECREF(hooks);
            return -1;
        }
    }
    PyObject *subclass = PyObject_CallOneArg(g_has_torch_function, tensor);
    if (!subclass) {
        Py_DECREF(hooks);
        return -1;
    }
    int is_sub = PyObject_IsTrue(subclass);
    Py_DECREF(subclass);
    if (is_sub) {
        Py_DECREF(hooks);
        PyObject *bound = PyObject_GetAttr(tensor, s_own_hooks);
        if (!bound) PyErr_Clear();
        TensorHooks *h = bound ? hooks_of(t, bound) : nullptr;
        if (!h) {
            Py_XDECREF(bound);
            h = new_hooks(t);
            if (!h) return -1;
            bound = bound_hooks(t, h);
            Py_DECREF(h);  // `bound` holds it
            if (!bound) return -1;
            PyObject *r = PyObject_CallMethodOneArg(tensor, s_register_hook, bound);
            if (!r || PyObject_SetAttr(tensor, s_own_hooks, bound) < 0) {
                Py_XDECREF(r);
                Py_DECREF(bound);
                return -1;
            }
            Py_DECREF(r);
        }
        add_hook(h, index, begin);
        Py_DECREF(bound);
        return 0;
    }
    TensorHooks *h = new_hooks(t);
    if (!h) {
        Py_DECREF(hooks);
        return -1;
    }
    add_hook(h, index, begin);
    PyObject *bound = bound_hooks(t, h);
    Py_DECREF(h);
    if (!bound) {
        Py_DECREF(hooks);
        return -1;
    }
    int rc = -1;
    // As register_hook: reading grad_fn refreshes a stale view before the dict.
    PyObject *grad_fn = PyObject_GetAttr(tensor, s_grad_fn);
    if (grad_fn) {
        if (hooks == Py_None) {
            Py_DECREF(hooks);
            hooks = PyObject_CallNoArgs(g_ordered_dict);
            if (hooks && PyObject_SetAttr(tensor, s_backward_hooks, hooks) == 0) {
                Py_DECREF(grad_fn);
                grad_fn = PyObject_GetAttr(tensor, s_grad_fn);
                if (grad_fn && grad_fn != Py_None) {
                    PyObject *r = PyObject_CallMethodOneArg(grad_fn, s_register_hook_dict, tensor);
                    if (!r) Py_CLEAR(hooks);
                    Py_XDECREF(r);
                }
                if (!grad_fn) Py_CLEAR(hooks);
            } else {
                Py_CLEAR(hooks);
            }
        }
        if (hooks) rc = PyObject_SetItem(hooks, t->key, bound);
        Py_XDECREF(grad_fn);
    }
    Py_XDECREF(hooks);
    Py_DECREF(bound);
    return rc;
}

// ---- hooks on autograd's nodes ---------------------------------------------------------
// What TensorHooks does, as a pre-hook of the node that consumes the tensor's gradient
// (its grad_fn, at its output_nr) -- the moment autograd would run the tensor's own
// hooks. Autograd calls it in C++: no Python tensor made of the gradient, no hooks dict,
// and on torch 2.x no torch.compiler.disable wrapper around the call (which the Python
// path needs so that dynamo sees the hook as opaque); that path cost 0.9 us a gradient,
// 1.9 us with the wrapper, on torch 2.15 (BENCHMARKS.md). A leaf (no grad_fn), a tensor
// subclass or a torch without the node API takes the Python path.

struct NodeHook final : torch::autograd::FunctionPreHook {
    NodeHook(std::shared_ptr<TableRef> r, uint32_t nr) : ref(std::move(r)), output_nr(nr) {}

    torch::autograd::variable_list operator()(const torch::autograd::variable_list &grads) override {
        if (!Py_IsInitialized()) return grads;
        PyGILState_STATE gil = PyGILState_Ensure();
        ModuleTable *t = ref->table;
        if (table_alive(t) && gradient_arrived(t, ends, begins) < 0) {
            // Not the tracer's failure (that ended the capture), the program's own -- a
            // KeyboardInterrupt while the tracer ran Python: no Python error crosses
            // autograd's C++, so the interrupt is raised again at the program's next
            // bytecode, as the signal would have been.
            if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
                PyErr_Clear();
                PyErr_SetInterrupt();
            } else {
                PyErr_WriteUnraisable(nullptr);
            }
        }
        PyGILState_Release(gil);
        return grads;
    }

    // Under compiled autograd the compiled graph runs instead of the nodes, without the
    // backward spans; what it collects of a hook is for Python hooks only, and it refuses
    // C++ hooks that do not say what they need -- this one needs nothing.
    void compiled_args(torch::dynamo::autograd::CompiledNodeArgs &) const {}

    std::shared_ptr<TableRef> ref;
    uint32_t output_nr;
    std::vector<int> ends, begins;
};

// 1: the node hook has `index` (see NodeHook); 0: the tensor takes the Python path; -1 on
// error.
int node_hook(ModuleTable *t, PyObject *tensor, int index, bool begin) {
    if (!t->node_hooks || Py_TYPE(tensor) != g_tensor_type) return 0;
    void *impl_p = tensor_impl(tensor);
    if (!impl_p) return 0;  // not a TensorImpl of this torch after all
    try {
        // The caller's reference keeps the TensorImpl alive; this one is for the call.
        at::Tensor v(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(
            static_cast<c10::TensorImpl *>(impl_p)));
        const auto &fn = v.grad_fn();  // as register_hook: refreshes a stale view
        if (!fn) return 0;
        const auto nr = static_cast<uint32_t>(v.output_nr());
        NodeHook *h = nullptr;
        for (const auto &p : fn->pre_hooks()) {
            auto *mine = dynamic_cast<NodeHook *>(p.get());
            if (mine && mine->ref == *t->ref && mine->output_nr == nr) {
                h = mine;
                break;
            }
        }
        if (!h) {
            auto made = std::make_unique<NodeHook>(*t->ref, nr);
            h = made.get();
            fn->add_pre_hook(std::move(made));
        }
        (begin ? h->begins : h->ends).push_back(index);
        return 1;
    } catch (const std::exception &e) {
        PyErr_Format(PyExc_RuntimeError, "candle_trace: a backward hook on autograd's node: %s", e.what());
        return -1;
    }
}

// ---- forward spans ------------------------------------------------------------------

// A forward with gradients on inside a backward is activation checkpointing's recompute:
// its own name and no step (its time is the backward's, which holds it).
int push_module(ModuleTable *t, const ModInfo &m, bool grad, uint64_t *sid) {
    bool again = grad && in_backward(t->stack);
    PyObject *name = again ? m.recompute : grad ? m.name : m.no_grad;
    if (!name) {
        PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(m.name_error)), m.name_error);
        return -1;
    }
    return push(t->stack, m.owner_forward, PyBytes_AS_STRING(name), kKindModule,
                grad && !again ? kStepForward : kStepNone, sid);
}

// Python's record_output(index, sid, tensor): the output's statistics by Python's path.
int record_output_py(ModuleTable *t, int index, uint64_t sid, PyObject *tensor) {
    PyObject *r = PyObject_CallFunction(t->record_output, "iKO", index,
                                        static_cast<unsigned long long>(sid), tensor);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

// The output's statistics, where the capture takes them: the library's float32 pass from
// here (stats_reduce), anything else by Python's path.
int output_stats(ModuleTable *t, int index, uint64_t sid, PyObject *tensor) {
    if (t->stats) {
        PyObject *label = (*t->mods)[index].out_label;
        int done = label ? stats_reduce(t->stats, sid, label, tensor) : 0;
        return done != 0 ? (done < 0 ? -1 : 0) : record_output_py(t, index, sid, tensor);
    }
    PyObject *stats = PyObject_GetAttr(t->cap, s_stats);
    if (!stats) return -1;
    int rc = stats != Py_None ? record_output_py(t, index, sid, tensor) : 0;
    Py_DECREF(stats);
    return rc;
}

// After the module's forward returned: its output's statistics, the hooks of its backward
// span, and its span closes.
int forward_end(ModuleTable *t, int index, uint64_t sid, PyObject *args, PyObject *out) {
    PyObject *tensor = first_tensor(out);
    if (!tensor && PyErr_Occurred()) return -1;
    if (tensor) {
        int rc = output_stats(t, index, sid, tensor);
        int rg = rc == 0 ? requires_grad(tensor) : -1;
        if (rg > 0 && c10::GradMode::is_enabled()) {
            rc = tensor_hook(t, tensor, index, true);
            std::vector<PyObject *> ins;
            if (rc == 0) {
                if (PyTuple_GET_SIZE(args) == 1 && is_tensor(PyTuple_GET_ITEM(args, 0))) {
                    PyObject *a = PyTuple_GET_ITEM(args, 0);
                    Py_INCREF(a);
                    ins.push_back(a);
                } else {
                    rc = tensors_of(args, ins);
                }
            }
            for (PyObject *a : ins) {
                if (rc == 0) {
                    int arg = requires_grad(a);
                    if (arg < 0)
                        rc = -1;
                    else if (arg > 0)
                        rc = tensor_hook(t, a, index, false);
                }
                Py_DECREF(a);
            }
        } else if (rg < 0) {
            rc = -1;
        }
        Py_DECREF(tensor);
        if (rc < 0) return -1;
    }
    std::vector<Frame> &f = frames_of(t->stack);
    if (!f.empty() && f.back().sid == sid) return pop_top(t->stack);  // the module's own: most calls
    return close_until(t->stack, sid);
}

PyObject *forward_call(ModuleForward *self, PyObject *args, PyObject *kw) {
    ModuleTable *t = self->table;
    const bool top = (*t->mods)[self->index].top;
    State state = state_of(t->cap);
    if (state != kCapturing && state != kArmed) return PyObject_Call(self->orig, args, kw);
    uint64_t sid = 0;
    {
        TracerWork work(t->stack);
        int rc = 0;
        if (state == kArmed) {
            PyObject *r = PyObject_CallMethodOneArg(t->cap, s_on_forward, (*t->mods)[self->index].module);
            rc = r ? 0 : -1;
            Py_XDECREF(r);
        }
        if (rc == 0 && state_of(t->cap) == kCapturing)
            rc = push_module(t, (*t->mods)[self->index], c10::GradMode::is_enabled(), &sid);
        if (rc < 0 && tracer_failed(t) < 0) return nullptr;
    }
    PyObject *out = PyObject_Call(self->orig, args, kw);
    if (!out) {
        if (top) {  // the program raised inside the update: the capture fails with it
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb) PyException_SetTraceback(value, tb);
            PyObject *r = PyObject_CallMethodOneArg(t->cap, s_failing, value);
            if (!r) {  // failing raised: that goes on, in the program's exception's context
                PyObject *t2, *v2, *tb2;
                PyErr_Fetch(&t2, &v2, &tb2);
                PyErr_NormalizeException(&t2, &v2, &tb2);
                if (v2 != value)
                    PyException_SetContext(v2, value);  // steals value
                else
                    Py_DECREF(value);
                Py_XDECREF(type);
                Py_XDECREF(tb);
                PyErr_Restore(t2, v2, tb2);
                return nullptr;
            }
            Py_DECREF(r);
            PyErr_Restore(type, value, tb);
        }
        return nullptr;
    }
    if (sid && state_of(t->cap) == kCapturing) {
        TracerWork work(t->stack);
        if (forward_end(t, self->index, sid, args, out) < 0 && tracer_failed(t) < 0) {
            Py_DECREF(out);
            return nullptr;
        }
    }
    return out;
}

// ---- backward spans -------------------------------------------------------------------

bool starts_with_dot(const std::string &qual, const std::string &outer) {
    return qual.size() > outer.size() && qual.compare(0, outer.size(), outer) == 0 &&
           qual[outer.size()] == '.';
}

// The gradient of the module's output arrived: its backward span opens, after closing the
// spans of this thread that do not contain the module.
int backward_begin(ModuleTable *t, const ModInfo &m) {
    SpanStack *s = t->stack;
    for (;;) {
        std::vector<Frame> &f = frames_of(s);
        if (f.empty()) break;
        const Owner &o = s->st->owners[f.back().owner];
        if (!o.backward_module) break;
        if (o.outer == *t->root || m.qual == o.outer || starts_with_dot(m.qual, o.outer)) break;
        if (pop_top(s) < 0) return -1;
    }
    if (!m.name) {
        PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(m.name_error)), m.name_error);
        return -1;
    }
    uint64_t sid;
    return push(s, m.owner_backward, PyBytes_AS_STRING(m.name), kKindModule, kStepBackward, &sid);
}

// The gradients of the module's inputs are computed: its backward span closes.
int backward_end(ModuleTable *t, const ModInfo &m) {
    SpanStack *s = t->stack;
    std::vector<Frame> &f = frames_of(s);
    if (!f.empty() && f.back().owner == m.owner_backward) return pop_top(s);  // most calls
    uint64_t sid = find(s, m.owner_backward);
    return sid ? close_until(s, sid) : 0;
}

// A tensor's gradient arrived (TensorHooks, NodeHook): the backward span ends of the
// modules that consumed it, then the begins of those that produced it. -1 with a Python
// error that goes to the program.
int gradient_arrived(ModuleTable *t, const std::vector<int> &ends, const std::vector<int> &begins) {
    if (state_of(t->cap) != kCapturing) return 0;
    TracerWork work(t->stack);
    const std::vector<ModInfo> &mods = *t->mods;
    int rc = 0;
    for (size_t i = 0; i < ends.size() && rc == 0; ++i) rc = backward_end(t, mods[ends[i]]);
    for (size_t i = begins.size(); i-- > 0 && rc == 0;) rc = backward_begin(t, mods[begins[i]]);
    return rc < 0 && tracer_failed(t) < 0 ? -1 : 0;
}

PyObject *hooks_call(TensorHooks *self, PyObject *, PyObject *) {
    if (gradient_arrived(self->table, self->ends, self->begins) < 0) return nullptr;
    Py_RETURN_NONE;
}

// ---- ModuleTable: the Python methods (_modules.NativeModuleSpans) ---------------------

// add(module, name, qual, name_bytes_or_error, no_grad_bytes_or_error,
//     recompute_bytes_or_error, output_label_bytes_or_error, top) -> index
PyObject *table_add(ModuleTable *t, PyObject *args) {
    PyObject *module, *name, *qual, *name_b, *no_grad_b, *recompute_b, *out_label_b;
    int top;
    if (!PyArg_ParseTuple(args, "OUUOOOOp", &module, &name, &qual, &name_b, &no_grad_b,
                          &recompute_b, &out_label_b, &top))
        return nullptr;
    const char *n = PyUnicode_AsUTF8(name);
    const char *q = n ? PyUnicode_AsUTF8(qual) : nullptr;
    if (!q) return nullptr;
    ModInfo m;
    m.module = module;
    m.name = PyBytes_Check(name_b) ? name_b : nullptr;
    m.no_grad = PyBytes_Check(no_grad_b) ? no_grad_b : nullptr;
    m.recompute = PyBytes_Check(recompute_b) ? recompute_b : nullptr;
    m.out_label = PyBytes_Check(out_label_b) ? out_label_b : nullptr;  // else Python raises it
    m.name_error = !m.name ? name_b : !m.no_grad ? no_grad_b : !m.recompute ? recompute_b : nullptr;
    if (m.name_error && !PyExceptionInstance_Check(m.name_error)) {
        PyErr_SetString(PyExc_TypeError, "a module's names are bytes or the exception encoding raised");
        return nullptr;
    }
    m.qual = q;
    m.owner_forward = intern_owner(t->stack, std::string("f:") + n);
    m.owner_backward = intern_owner(t->stack, std::string("b:") + n);
    m.top = top != 0;
    Py_INCREF(m.module);
    Py_XINCREF(m.name);
    Py_XINCREF(m.no_grad);
    Py_XINCREF(m.recompute);
    Py_XINCREF(m.out_label);
    Py_XINCREF(m.name_error);
    t->mods->push_back(m);
    return PyLong_FromSsize_t(static_cast<Py_ssize_t>(t->mods->size() - 1));
}

// wrapper(index, orig_forward) -> the module's forward wrapper
PyObject *table_wrapper(ModuleTable *t, PyObject *args) {
    int index;
    PyObject *orig;
    if (!PyArg_ParseTuple(args, "iO", &index, &orig)) return nullptr;
    if (index < 0 || static_cast<size_t>(index) >= t->mods->size()) {
        PyErr_SetString(PyExc_IndexError, "no such module");
        return nullptr;
    }
    ModuleForward *w = PyObject_GC_New(ModuleForward, g_forward_type);
    if (!w) return nullptr;
    Py_INCREF(t);
    Py_INCREF(orig);
    w->table = t;
    w->orig = orig;
    w->index = index;
    PyObject_GC_Track(w);
    return reinterpret_cast<PyObject *>(w);
}

void release_mods(std::vector<ModInfo> &mods) {
    for (ModInfo &m : mods) {
        Py_CLEAR(m.module);
        Py_CLEAR(m.name);
        Py_CLEAR(m.no_grad);
        Py_CLEAR(m.recompute);
        Py_CLEAR(m.out_label);
        Py_CLEAR(m.name_error);
    }
    mods.clear();
}

int table_traverse(ModuleTable *t, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(t));
    Py_VISIT(t->cap);
    Py_VISIT(reinterpret_cast<PyObject *>(t->stack));
    Py_VISIT(t->key);
    Py_VISIT(t->record_output);
    Py_VISIT(t->hook_wrap);
    Py_VISIT(t->stats);
    if (t->mods)
        for (ModInfo &m : *t->mods) Py_VISIT(m.module);
    return 0;
}

int table_clear(ModuleTable *t) {
    Py_CLEAR(t->cap);
    Py_CLEAR(t->key);
    Py_CLEAR(t->record_output);
    Py_CLEAR(t->hook_wrap);
    Py_CLEAR(t->stats);
    if (t->mods) release_mods(*t->mods);
    if (t->ref && *t->ref) (*t->ref)->table = nullptr;  // the node hooks still alive see it gone
    // The stack goes last: the wrappers and hooks still alive check `cap` first.
    PyObject *s = reinterpret_cast<PyObject *>(t->stack);
    t->stack = nullptr;
    Py_XDECREF(s);
    return 0;
}

void table_dealloc(ModuleTable *t) {
    PyTypeObject *tp = Py_TYPE(t);
    PyObject_GC_UnTrack(t);
    table_clear(t);
    delete t->mods;
    delete t->root;
    delete t->ref;
    PyObject_GC_Del(t);
    Py_DECREF(tp);
}

// use_tensor_hooks(): backward spans by the tensors' Python hooks from now on (autograd
// runs compiled: NodeHook)
PyObject *table_use_tensor_hooks(ModuleTable *t, PyObject *) {
    t->node_hooks = false;
    Py_RETURN_NONE;
}

PyMethodDef table_methods[] = {
    {"add", (PyCFunction)table_add, METH_VARARGS,
     "add(module, name, qual, name_bytes, no_grad_bytes, recompute_bytes, output_label_bytes, top) -> index "
     "(a name that could not be encoded is passed as the exception: raised when its span "
     "would open, or by Python's statistics for the output's label)"},
    {"wrapper", (PyCFunction)table_wrapper, METH_VARARGS,
     "wrapper(index, orig_forward) -> the module's forward wrapper"},
    {"use_tensor_hooks", (PyCFunction)table_use_tensor_hooks, METH_NOARGS,
     "use_tensor_hooks(): backward spans by the tensors' Python hooks from now on"},
    {nullptr, nullptr, 0, nullptr},
};

// What the collector cleared (a cycle through a module's __dict__ found unreachable)
// passes through.
bool table_alive(const ModuleTable *t) { return t && t->cap && t->stack; }

int forward_traverse(ModuleForward *w, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(w));
    Py_VISIT(reinterpret_cast<PyObject *>(w->table));
    Py_VISIT(w->orig);
    return 0;
}

int forward_clear(ModuleForward *w) {
    PyObject *t = reinterpret_cast<PyObject *>(w->table);
    w->table = nullptr;
    Py_XDECREF(t);
    Py_CLEAR(w->orig);
    return 0;
}

void forward_dealloc(ModuleForward *w) {
    PyTypeObject *tp = Py_TYPE(w);
    PyObject_GC_UnTrack(w);
    forward_clear(w);
    PyObject_GC_Del(w);
    Py_DECREF(tp);
}

PyObject *forward_call_entry(ModuleForward *self, PyObject *args, PyObject *kw) {
    if (!self->orig) {
        PyErr_SetString(PyExc_RuntimeError, "candle_trace: a cleared module wrapper");
        return nullptr;
    }
    if (!table_alive(self->table)) return PyObject_Call(self->orig, args, kw);
    return forward_call(self, args, kw);
}

int hooks_traverse(TensorHooks *h, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(h));
    Py_VISIT(reinterpret_cast<PyObject *>(h->table));
    return 0;
}

int hooks_clear(TensorHooks *h) {
    PyObject *t = reinterpret_cast<PyObject *>(h->table);
    h->table = nullptr;
    Py_XDECREF(t);
    return 0;
}

void hooks_dealloc(TensorHooks *h) {
    PyTypeObject *tp = Py_TYPE(h);
    PyObject_GC_UnTrack(h);
    hooks_clear(h);
    h->ends.~vector();
    h->begins.~vector();
    PyObject_GC_Del(h);
    Py_DECREF(tp);
}

PyObject *hooks_call_entry(TensorHooks *self, PyObject *args, PyObject *kw) {
    if (!table_alive(self->table)) Py_RETURN_NONE;
    return hooks_call(self, args, kw);
}

PyObject *hooks_get(TensorHooks *h, void *which) {
    const std::vector<int> &v = which ? h->begins : h->ends;
    PyObject *out = PyList_New(static_cast<Py_ssize_t>(v.size()));
    if (!out) return nullptr;
    for (size_t i = 0; i < v.size(); ++i)
        PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), PyLong_FromLong(v[i]));
    return out;
}

PyGetSetDef hooks_getset[] = {
    {"ends", (getter)hooks_get, nullptr, "the modules whose backward span this gradient closes", nullptr},
    {"begins", (getter)hooks_get, nullptr, "the modules whose backward span this gradient opens",
     reinterpret_cast<void *>(1)},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

bool make_types() {
    if (g_table_type) return true;
    PyType_Slot table_slots[] = {
        {Py_tp_dealloc, reinterpret_cast<void *>(table_dealloc)},
        {Py_tp_traverse, reinterpret_cast<void *>(table_traverse)},
        {Py_tp_clear, reinterpret_cast<void *>(table_clear)},
        {Py_tp_methods, table_methods},
        {Py_tp_new, reinterpret_cast<void *>(no_new)},
        {Py_tp_doc, const_cast<char *>("the modules of one capture")},
        {0, nullptr},
    };
    PyType_Slot forward_slots[] = {
        {Py_tp_dealloc, reinterpret_cast<void *>(forward_dealloc)},
        {Py_tp_traverse, reinterpret_cast<void *>(forward_traverse)},
        {Py_tp_clear, reinterpret_cast<void *>(forward_clear)},
        {Py_tp_call, reinterpret_cast<void *>(forward_call_entry)},
        {Py_tp_new, reinterpret_cast<void *>(no_new)},
        {Py_tp_doc, const_cast<char *>("a module's forward, with its span")},
        {0, nullptr},
    };
    PyType_Slot hooks_slots[] = {
        {Py_tp_dealloc, reinterpret_cast<void *>(hooks_dealloc)},
        {Py_tp_traverse, reinterpret_cast<void *>(hooks_traverse)},
        {Py_tp_clear, reinterpret_cast<void *>(hooks_clear)},
        {Py_tp_call, reinterpret_cast<void *>(hooks_call_entry)},
        {Py_tp_getset, hooks_getset},
        {Py_tp_new, reinterpret_cast<void *>(no_new)},
        {Py_tp_doc, const_cast<char *>("a tensor's gradient hook: backward module spans")},
        {0, nullptr},
    };
    g_table_type = make_type("candle_trace_native_spans.ModuleTable", sizeof(ModuleTable), table_slots);
    g_forward_type = make_type("candle_trace_native_spans.ModuleForward", sizeof(ModuleForward), forward_slots);
    g_hooks_type = make_type("candle_trace_native_spans.TensorHooks", sizeof(TensorHooks), hooks_slots);
    if (g_table_type && g_forward_type && g_hooks_type) return true;
    Py_CLEAR(g_table_type);
    Py_CLEAR(g_forward_type);
    Py_CLEAR(g_hooks_type);
    return false;
}

}  // namespace

// module_table(cap, stack, key, record_output, hook_wrap_or_None, root, stats_or_None,
//              node_hooks=True) -> ModuleTable
PyObject *new_table(PyObject *, PyObject *args) {
    PyObject *cap, *stack, *key, *record_output, *hook_wrap, *root, *stats;
    int node_hooks = 1;
    if (!PyArg_ParseTuple(args, "OO!UOOUO|p", &cap, g_stack_type, &stack, &key, &record_output,
                          &hook_wrap, &root, &stats, &node_hooks))
        return nullptr;
    if (stats != Py_None && Py_TYPE(stats) != g_stats_type) {
        PyErr_SetString(PyExc_TypeError, "module_table: stats is a StatsBuffer or None");
        return nullptr;
    }
    const char *r = PyUnicode_AsUTF8(root);
    if (!r) return nullptr;
    ModuleTable *t = PyObject_GC_New(ModuleTable, g_table_type);
    if (!t) return nullptr;
    t->mods = new (std::nothrow) std::vector<ModInfo>();
    t->root = new (std::nothrow) std::string(r);
    t->ref = new (std::nothrow) std::shared_ptr<TableRef>();
    if (t->ref) {
        try {
            *t->ref = std::make_shared<TableRef>(TableRef{t});
        } catch (const std::bad_alloc &) {
        }
    }
    t->node_hooks = node_hooks != 0;
    Py_INCREF(cap);
    Py_INCREF(stack);
    Py_INCREF(key);
    Py_INCREF(record_output);
    t->cap = cap;
    t->stack = reinterpret_cast<SpanStack *>(stack);
    t->key = key;
    t->record_output = record_output;
    t->hook_wrap = hook_wrap == Py_None ? nullptr : (Py_INCREF(hook_wrap), hook_wrap);
    t->stats = stats == Py_None ? nullptr : (Py_INCREF(stats), stats);
    PyObject_GC_Track(t);
    if (!t->mods || !t->root || !t->ref || !*t->ref) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    return reinterpret_cast<PyObject *>(t);
}

bool make_module_types(PyObject *tensor_type, PyObject *has_torch_function,
                       PyObject *ordered_dict, PyObject *mapping) {
    if (!PyType_Check(tensor_type) || !PyCallable_Check(has_torch_function) ||
        !PyCallable_Check(ordered_dict) || !PyType_Check(mapping)) {
        PyErr_SetString(PyExc_TypeError,
                        "ct_obs_native: torch.Tensor, has_torch_function_unary, OrderedDict, Mapping");
        return false;
    }
    if (!intern_all() || !make_types()) return false;
    PyObject *keep[] = {tensor_type, has_torch_function, ordered_dict, mapping};
    for (PyObject *o : keep) Py_INCREF(o);
    Py_XDECREF(reinterpret_cast<PyObject *>(g_tensor_type));
    Py_XDECREF(g_has_torch_function);
    Py_XDECREF(g_ordered_dict);
    Py_XDECREF(g_mapping);
    g_tensor_type = reinterpret_cast<PyTypeObject *>(tensor_type);
    g_has_torch_function = has_torch_function;
    g_ordered_dict = ordered_dict;
    g_mapping = mapping;
    return true;
}

}  // namespace ct_native
