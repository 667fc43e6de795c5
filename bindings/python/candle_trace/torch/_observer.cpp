// candle_trace.torch's op observer: an at::RecordFunction callback that captures every
// aten op of the captured update in C++, and a memory reporter that sees the allocator's
// allocations and frees, with no Python per op.
//
// Built on first use by candle_trace/torch/_observer.py with
// torch.utils.cpp_extension.load (is_python_module=False) against the installed torch,
// and driven through the extern "C" functions at the bottom (ctypes). The library's C
// ABI (include/candle_trace.h) is reached through function pointers handed over from
// Python (ctypes addresses of the very libcandle_trace.so the binding loaded).
//
// What an op is: the outermost dispatcher op of a thread, looking through
// CompositeImplicitAutograd ops (aten::linear is recorded as the aten::t and
// aten::addmm it decomposes into) -- the ops a TorchDispatchMode sees, which keeps the
// two capture mechanisms' traces alike. Ops nested inside a recorded op (a kernel that
// calls other ops) are not recorded separately. Namespace profiler:: is skipped.
//
// During the step, nothing is written and nothing is shared: each thread appends its ops
// and memory events to its own buffer (no hash map, no lock but the buffer's own,
// uncontended); ct_obs_emit merges the buffers and writes them through the C ABI after
// the measured region closed (the library accepts records of closed spans as long as
// they lie inside them).
//
// Tensor ids: parameters are named by Python (their parameter names); every other
// tensor gets "t<N>", numbered in time order at emission: an op's output is a new tensor
// unless it is one of the op's inputs (in-place and out= ops), an input not seen before
// is a new tensor. Every TensorImpl an op touches is pinned by a weak reference until
// emission, so no address is reused by another tensor during the capture (the storage
// is still freed as usual).
//
// Memory: a MemoryReportingInfoBase (the hook torch.profiler's profile_memory uses)
// pushed as this thread's PROFILER_STATE debug info, which the autograd engine
// propagates to its worker threads. An allocation becomes an `alloc` record when its
// pointer is the storage of the output of the recorded op it happened in; a later free
// of that pointer during the capture becomes a `free` record (matched at emission).
//
// Collectives (torch.distributed's ProcessGroup work: DDP's bucket all-reduces, a
// dist.all_reduce): the c10d:: dispatcher op is recorded as an op (its inputs are the
// tensors sent; its time is the enqueue), with record functions left on inside it, so the
// backend's work begins its USER_SCOPE record function ("gloo:all_reduce",
// "nccl:all_reduce", ...) on the calling thread -- the rank enters the collective -- and
// ends it where the work completes (the backend's thread). Each such pair becomes one op
// of the measured region named as the backend names it, from enter to completion, with
// the bytes of its tensors: what a rank spent in the collective, waiting for the others
// included. See "collectives" below.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Logging.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/version.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

// ---- the C ABI, as far as this file uses it (include/candle_trace.h) -----------------
// Records start with `size`, so a struct of this ABI version stays valid for later ones.
extern "C" {
typedef uint64_t ct_session;
typedef uint64_t ct_span;
typedef struct ct_op {
    uint32_t size;
    uint32_t flags;
    const char *op_name;
    const char *dtype;
    const char *device;
    const char *const *inputs;
    size_t n_inputs;
    const char *output;
    const int64_t *shape;
    size_t rank;
    uint64_t duration_ns;
    uint64_t timestamp_ns;
    uint64_t output_dense_bytes;
    uint64_t input_dense_bytes;
} ct_op;
typedef struct ct_memory {
    uint32_t size;
    uint32_t reserved;
    uint64_t timestamp_ns;
    const char *storage_id;
    const char *tensor_id;
    const char *device;
    const char *dtype;
    const char *op_name;
    uint64_t bytes;
    const int64_t *shape;
    size_t rank;
    int category;
} ct_memory;
}

namespace {

constexpr int kProtocol = 5;  // _observer.py checks ct_obs_protocol()
constexpr int kCategoryOther = 0;
constexpr int kCategoryActivation = 2;
constexpr int kMemoryAlloc = 0;
constexpr int kMemoryFree = 1;
constexpr size_t kPendingMax = 256;  // allocations remembered inside one op

using now_fn = uint64_t (*)(ct_session);
using tracer_fn = int (*)(ct_session);
using tracer_at_fn = int (*)(ct_session, uint64_t, uint64_t *);
using tracer_exclude_fn = int (*)(ct_session, uint64_t);
using record_op_fn = int (*)(ct_session, ct_span, const ct_op *);
using record_memory_fn = int (*)(ct_session, ct_span, int, const ct_memory *);
using record_data_edge_fn = int (*)(ct_session, const char *, const char *);
using last_error_fn = const char *(*)();

now_fn p_now = nullptr;
tracer_at_fn p_tracer_begin_at = nullptr;
tracer_exclude_fn p_tracer_exclude_earlier = nullptr;
tracer_fn p_tracer_end = nullptr;
// What recording an op costs that no tracer interval of ours covers (torch setting up
// the RecordFunction, boxing inputs and outputs, calling in; the calls into the library
// themselves), measured by Python before the capture (Observer.calibrate): each
// callback's tracer interval begins half of it earlier (ct_tracer_begin_earlier).
uint64_t g_earlier_ns = 0;
record_op_fn p_record_op = nullptr;
record_memory_fn p_record_memory = nullptr;
record_data_edge_fn p_record_data_edge = nullptr;
last_error_fn p_last_error = nullptr;

using Impl = c10::TensorImpl;

// ---- per-thread buffers of one capture ----------------------------------------------

struct OpRec {
    uint64_t t0, t1, span, in_bytes;
    const char *name;          // the schema's name: lives as long as the operator
    const Impl *out;           // nullptr for none
    uint32_t in_off, in_n;     // into Buf::inputs
    uint32_t shape_off, rank;  // into Buf::shapes
    c10::ScalarType dtype;
    c10::Device device{c10::DeviceType::CPU};
    uintptr_t out_data;  // inside a compiled graph: its output's storage (see kNoOp), else 0
};

struct AllocRec {  // the allocation of an op output's storage, or of a storage no op made
    uint64_t ts, span, bytes;
    uintptr_t ptr;
    uint32_t op;  // index into the same buffer's ops; kNoOp: made outside every op
    c10::Device device{c10::DeviceType::CPU};  // the storage's
};

// An allocation outside every op inside a compiled graph: its buffers, which inductor's
// generated code allocates itself (empty_strided_cpu/_cuda, no dispatcher op) -- 61% of
// the bytes a compiled GPT update allocates. Its storage is recorded with no op; the
// first recorded op writing its output into it (an extern kernel called with out=) names
// its tensor, dtype and shape, else its dtype is unknown. (Outside compiled graphs, what
// no op allocates is the 8-byte tensors of Python numbers passed to ops, made before the
// op begins: not recorded.)
constexpr uint32_t kNoOp = UINT32_MAX;

// The record functions a compiled graph runs inside, on every torch that has them whether
// or not torch.profiler is on: dynamo's frame (the forward, "Torch-Compiled Region: 0/0"),
// AOTAutograd's function ("CompiledFunction") and the autograd engine's evaluation of its
// backward.
bool compiled_region(const char *name) {
    return std::strncmp(name, "Torch-Compiled Region", 21) == 0 ||
           std::strcmp(name, "CompiledFunction") == 0 ||
           std::strcmp(name, "autograd::engine::evaluate_function: CompiledFunctionBackward") == 0;
}

struct FreeRec {  // any free seen during the capture; matched to allocations at emission
    uint64_t ts, span;
    uintptr_t ptr;
};

struct Pending {  // an allocation inside the op being recorded
    uint64_t ts, span, bytes;
    uintptr_t ptr;
};

struct Buf {
    std::mutex mu;  // taken by its thread per record (uncontended) and by emission
    uint64_t epoch = 0;
    std::vector<OpRec> ops;
    std::vector<const Impl *> inputs;
    std::vector<int64_t> shapes;
    std::vector<AllocRec> allocs;
    std::vector<FreeRec> frees;
    std::vector<Impl *> pinned;  // weak references, dropped at emission

    void clear() {
        for (Impl *i : pinned) c10::raw::weak_intrusive_ptr::decref(i);
        pinned.clear();
        ops.clear();
        inputs.clear();
        shapes.clear();
        allocs.clear();
        frees.clear();
    }
};

std::mutex g_mu;  // g_bufs, g_named, the control calls
std::vector<std::shared_ptr<Buf>> g_bufs;  // the buffers of the threads that recorded
std::unordered_map<const Impl *, std::string> g_named;  // parameters
std::atomic<bool> g_active{false};  // recording ops and memory
std::atomic<uint64_t> g_epoch{0};   // one per capture: resets threads' state lazily
std::atomic<bool> g_forked{false};
ct_session g_session = 0;
ct_span g_measured = 0;
at::CallbackHandle g_handle = 0;
at::CallbackHandle g_user_handle = 0;  // USER_SCOPE starts (see on_user_start)
bool g_memory = false;
std::string g_error;  // the last failure of a control call
uint64_t g_errors = 0;
std::string g_first_error;

enum Kind : uint8_t {
    kLookThrough = 0,  // not recorded; the ops it calls are (CompositeImplicitAutograd)
    kRecord = 1,       // recorded; the ops it calls are not
    kOpaque = 2,       // not recorded, nor the ops it calls (profiler::)
    kRecordOpen = 3,   // recorded, the ops it calls are not, record functions stay on
                       // (c10d:: collectives: their backend work's record function)
    kNamed = 4,        // named by a string, no operator: looked through unless an
                       // inductor kernel (inductor_kernel); never cached
};

struct Thread {
    uint64_t epoch = 0;
    uint64_t span = 0;   // innermost span of this thread, published by Python (0: none)
    int depth = 0;       // RecordFunction nesting of FUNCTION scopes
    int rec_depth = -1;  // depth of the op being recorded, -1 when none
    int graph_depth = -1;  // depth of the compiled graph's record function around, -1: none
    bool opaque = false; // the op at rec_depth is not recorded (an opaque op)
    int suspended = 0;   // ct_obs_suspend nesting
    bool rf_in_op = true;           // RecordFunction's state before the recorded op
    bool op_quiet = false;          // the recorded op switched RecordFunction off
    bool learning = false;          // the recorded op's kind learns whether to (see quiet_for)
    int nested = 0;                 // record functions begun inside the recorded op
    bool after_user_scope = false;  // a USER_SCOPE record function just began
    bool maybe_handle = false;      // the op being recorded came right after one
    bool rf_was_enabled = true;
    uint64_t t0 = 0, op_span = 0, in_bytes = 0;
    const char *name = nullptr;
    // The inputs of the op being recorded, each pinned (a weak reference) at its start: a
    // boxed call may free an input before the op ends (a Python number converted to a
    // wrapped-number tensor lives in the call's stack alone). record_op hands the
    // references to the buffer; release_ins drops those of an op not recorded.
    std::vector<const Impl *> ins;
    std::vector<Pending> pending;
    std::shared_ptr<Buf> buf;
    // op name -> kind, for the ops this thread has seen: a direct-mapped cache of the
    // name pointers (one probe, one cache line per op: the hash map it replaces cost
    // 0.2 ms of a 85 ms GPT-style update in cache misses, BENCHMARKS.md), g_kind behind it.
    static constexpr size_t kKindSlots = 1024;
    struct KindSlot {
        const char *name = nullptr;
        Kind kind = kLookThrough;
        int8_t quiet = -1;  // quiet_for's decision for the kind; -1: not known here
    };
    KindSlot kinds[kKindSlots];
    // inductor kernels' names as their record functions give them (a string literal of
    // the kernel's library) -> the interned copy (see inductor_kernel)
    static constexpr size_t kKernelSlots = 64;
    struct KernelSlot {
        const char *raw = nullptr;
        const char *name = nullptr;
    };
    KernelSlot kernels[kKernelSlots];
};

// Each thread's Thread, on the heap. A thread_local with a constructor is reached, in a
// dlopen'ed library, through a wrapper that checks its initialization and calls
// __tls_get_addr at every access: ~11 calls per op callback (callgrind); a plain pointer
// is one. Freed at the thread's exit (the key's destructor).
thread_local Thread *tl_thread = nullptr;

void free_thread(void *t) { delete static_cast<Thread *>(t); }

Thread *new_thread() {
    static pthread_key_t key = [] {
        pthread_key_t k;
        pthread_key_create(&k, free_thread);
        return k;
    }();
    Thread *t = new Thread();
    pthread_setspecific(key, t);
    tl_thread = t;
    return t;
}

inline Thread &this_thread() {
    Thread *t = tl_thread;
    return *(__builtin_expect(t != nullptr, 1) ? t : new_thread());
}

inline void release_ins(Thread &t) {
    for (const Impl *i : t.ins) c10::raw::weak_intrusive_ptr::decref(const_cast<Impl *>(i));
    t.ins.clear();
}

inline Thread &thread_state() {
    Thread &t = this_thread();
    uint64_t e = g_epoch.load(std::memory_order_acquire);
    if (t.epoch != e) {
        t.epoch = e;
        t.span = 0;
        t.depth = 0;
        t.rec_depth = -1;
        t.graph_depth = -1;
        t.opaque = t.op_quiet = t.learning = false;
        release_ins(t);
        t.pending.clear();
    }
    return t;
}

// This thread's buffer for the current capture, registered on first use.
Buf &buffer(Thread &t) {
    if (!t.buf || t.buf->epoch != t.epoch) {
        std::lock_guard<std::mutex> lock(g_mu);
        if (!t.buf) t.buf = std::make_shared<Buf>();
        if (t.buf->epoch != t.epoch) {
            std::lock_guard<std::mutex> block(t.buf->mu);
            t.buf->clear();
            t.buf->epoch = t.epoch;
            g_bufs.push_back(t.buf);
        }
    }
    return *t.buf;
}

inline uint64_t span_of(const Thread &t) { return t.span ? t.span : g_measured; }

// The observer's own work on a recorded op (gathering inputs, buffering the record) is
// the tracer's, not the model's: the session clock stands still while it runs
// (ct_tracer_begin_at/end), so an op's start is taken as the callback is entered and
// its end as the op returns, and neither the op nor its span counts the bookkeeping --
// nor, as calibrated, torch's own work for the callback before it was entered.
//
// An interval that times something takes the value the clock stopped at from the call
// that opened it (`at()`: an op's start or end); a separate read would cost a sequence
// lock's loads and a call. The library never backdates an interval past a value it
// handed out nor into the interval before it (where that one left the clock), read or
// not, so no time is left out twice.
//
// While the calibration counts (ct_obs_count_intervals), each interval is counted: it
// divides what torch spent for the observer by the record functions it saw (two
// intervals each).
bool g_counting = false;
uint64_t g_counted = 0;

struct TracerWork {
    explicit TracerWork(uint64_t earlier = g_earlier_ns) {
        if (g_counting) ++g_counted;
        ok_ = p_tracer_begin_at(g_session, earlier, &at_) == 0;
    }
    ~TracerWork() { p_tracer_end(g_session); }
    TracerWork(const TracerWork &) = delete;
    TracerWork &operator=(const TracerWork &) = delete;
    // The clock stands still inside: the value the interval began at, handed out by
    // ct_tracer_begin_at (a refused interval: the clock as it reads).
    uint64_t at() const { return ok_ ? at_ : p_now(g_session); }

   private:
    uint64_t at_ = 0;
    bool ok_ = false;
};

// The kind of an op: dispatcher ops (RecordFunctions named by a schema, whose name
// pointer lives as long as the operator, so it keys the caches) are recorded, except
// CompositeImplicitAutograd ones (we look through those to the ops they decompose into,
// as a dispatch mode does) and the profiler's own ops.
std::mutex g_kind_mu;
std::unordered_map<const char *, Kind> g_kind;  // shared by threads and captures

bool composite(const c10::OperatorHandle &op) {
    using K = c10::DispatchKey;
    // The dispatcher's precedence for AutogradCPU: a direct AutogradCPU kernel, else the
    // CompositeImplicitAutograd one unless the op has a backend kernel of its own.
    return op.hasKernelForDispatchKey(K::CompositeImplicitAutograd) &&
           !op.hasKernelForDispatchKey(K::AutogradCPU) && !op.hasKernelForDispatchKey(K::CPU) &&
           !op.hasKernelForDispatchKey(K::CompositeExplicitAutograd);
}

// The caller's Thread, passed in: each access to the thread_local of a dlopen'ed library
// is a __tls_get_addr call.
inline Thread::KindSlot &kind_slot(Thread &t, const char *name) {
    uintptr_t p = reinterpret_cast<uintptr_t>(name);
    return t.kinds[((p >> 3) ^ (p >> 13)) & (Thread::kKindSlots - 1)];
}

Kind op_kind(Thread &t, const at::RecordFunction &fn, const char *name) {
    Thread::KindSlot &slot = kind_slot(t, name);
    if (slot.name == name) return slot.kind;
    Kind k;
    {
        std::lock_guard<std::mutex> lock(g_kind_mu);
        auto git = g_kind.find(name);
        if (git != g_kind.end()) {
            k = git->second;
        } else {
            auto opname = fn.operator_name();
            if (!opname) return kNamed;  // named by a string: not an op, not cached
            if (std::strncmp(name, "profiler::", 10) == 0) {
                k = kOpaque;
            } else if (std::strncmp(name, "c10d::", 6) == 0) {
                k = kRecordOpen;
            } else {
                auto op = c10::Dispatcher::singleton().findOp(*opname);
                k = op && composite(*op) ? kLookThrough : kRecord;
            }
            g_kind.emplace(name, k);
        }
    }
    slot.name = name;  // a colliding name's entry goes: it is found again in g_kind
    slot.kind = k;
    slot.quiet = -1;
    return k;
}

// Inductor's generated C++ kernels (torch.compile on the CPU, with
// torch._inductor.config.cpp.enable_kernel_profile: _kernels.py) each run a FUNCTION
// record function named by a string, the kernel's name ("cpp_fused_gelu_native_layer_norm_0",
// after "graph_<id>_" where the graph has an id): ops of the update -- most of a compiled
// model's time -- that call no other op. Other string-named ones (a compiled region's
// wrappers: "Torch-Compiled Region: 0/0", "CompiledFunction") are looked through.
bool inductor_kernel_name(const char *name) {
    if (std::strncmp(name, "graph_", 6) == 0) {
        const char *p = name + 6;
        if (!std::isdigit(static_cast<unsigned char>(*p))) return false;
        while (std::isdigit(static_cast<unsigned char>(*p))) ++p;
        if (*p != '_') return false;
        name = p + 1;
    }
    return std::strncmp(name, "cpp_", 4) == 0;
}

std::unordered_set<std::string> g_kernel_names;  // interned, never freed; under g_kind_mu

// The interned name of an inductor kernel's record function, else nullptr: its op is
// emitted after the update, and the string it was given need not live that long. The
// kernel gives the same literal at every call, so a direct-mapped cache per thread
// answers; the content is compared too, as another string may reuse an address.
const char *inductor_kernel(Thread &t, const char *name) {
    uintptr_t p = reinterpret_cast<uintptr_t>(name);
    Thread::KernelSlot &s = t.kernels[((p >> 4) ^ (p >> 12)) & (Thread::kKernelSlots - 1)];
    const char *interned = s.name;
    if (s.raw != name || std::strcmp(name, interned) != 0) {
        if (!inductor_kernel_name(name)) return nullptr;
        {
            std::lock_guard<std::mutex> lock(g_kind_mu);
            interned = g_kernel_names.emplace(name).first->c_str();
        }
        s.raw = name;
        s.name = interned;
    }
    Thread::KindSlot &slot = kind_slot(t, interned);  // what quiet_for and learn_quiet read
    if (slot.name != interned) {
        slot.name = interned;
        slot.kind = kRecord;
        slot.quiet = -1;
    }
    return interned;
}

// Room for n more elements, grown geometrically: reserve(size() + n) grows a vector to
// exactly that, so one grown by it per record is copied whole each time -- quadratic in
// the capture's records (2.8M instructions of memcpy in a GPT-style 1x8 update's 627
// ops, inside the tracer's intervals).
template <class V>
inline void room(V &v, size_t n) {
    if (v.capacity() - v.size() < n) v.reserve(std::max(v.size() + n, 2 * v.capacity()));
}

inline void add_input(Thread &t, const at::Tensor &x) {
    if (!x.defined()) return;
    Impl *impl = x.unsafeGetTensorImpl();
    room(t.ins, 1);  // no throw between the incref and the push
    c10::raw::weak_intrusive_ptr::incref(impl);
    t.ins.push_back(impl);
    t.in_bytes += static_cast<uint64_t>(x.numel()) * x.element_size();
}

void gather(Thread &t, const c10::IValue &v) {
    if (v.isTensor()) {
        add_input(t, v.toTensor());
    } else if (v.isTensorList()) {
        for (const at::Tensor &x : v.toTensorVector()) add_input(t, x);
    } else if (v.isList()) {
        for (const c10::IValue &e : v.toListRef())
            if (e.isTensor()) add_input(t, e.toTensor());
    }
}

const at::Tensor *first_tensor(const std::vector<c10::IValue> &outs, at::Tensor &holder) {
    for (const c10::IValue &v : outs) {
        if (v.isTensor()) {
            if (v.toTensor().defined()) return &v.toTensor();
        } else if (v.isTensorList()) {
            for (auto &x : v.toTensorVector())
                if (x.defined()) {
                    holder = x;
                    return &holder;
                }
        }
    }
    return nullptr;
}

inline void pin(Buf &b, const Impl *impl) {
    Impl *i = const_cast<Impl *>(impl);
    c10::raw::weak_intrusive_ptr::incref(i);
    b.pinned.push_back(i);
}

// torch.autograd.profiler.record_function (torch 1.x, which every optimizer's step uses)
// begins a USER_SCOPE record function and then keeps it in a byte tensor of
// sizeof(at::RecordFunction) made by aten::empty -- the profiler's handle, not the
// model's op. The op right after a user scope begins is checked for that shape.
std::unique_ptr<at::ObserverContext> on_user_start(const at::RecordFunction &fn);
void on_user_end(const at::RecordFunction &fn, at::ObserverContext *ctx);

bool is_scope_handle(const Thread &t, const at::Tensor *out) {
    return t.maybe_handle && out && std::strcmp(t.name, "aten::empty") == 0 &&
           out->scalar_type() == c10::ScalarType::Byte && out->dim() == 1 &&
           out->numel() == static_cast<int64_t>(sizeof(at::RecordFunction));
}

// The ops a recorded (or opaque) op calls are never recorded: RecordFunction is off on
// this thread until it ends, so they do not even box their inputs for a callback that
// would only count them -- the op's time is the op's, not the observer's. The op's own
// end callback still runs (it belongs to a record function that began while on).
inline void quiet_nested(Thread &t) {
    t.rf_in_op = at::isRecordFunctionEnabled();
    at::enableRecordFunction(false);
    t.op_quiet = true;
}

// ---- which recorded ops switch RecordFunction off ------------------------------------
// Switching it off and on again (at::enableRecordFunction) rebuilds torch's callback
// cache of every record scope twice: ~5.6k instructions per op (torch 1.13), tracer work
// that an op calling no other op -- a view, a reshape alias, an optimizer's addcdiv_: a
// third of a GPT-style update's ops -- does not need, and one calling a single op
// (detach, transpose) pays more for than that op's record function left on costs (~2.5k
// instructions of torch's and our two callbacks' ~0.9k). So a kind is left on until one
// of its calls is seen to begin kQuietFrom record functions inside it (nested_start:
// they are bracketed as tracer work, as calibrated), and quieted from then on; the
// decision is kept per process.
constexpr int kQuietFrom = 2;
std::unordered_map<const char *, bool> g_quiet;  // op name -> quieted; under g_kind_mu

bool quiet_for(Thread::KindSlot &slot, const char *name) {
    if (slot.quiet < 0) {
        std::lock_guard<std::mutex> lock(g_kind_mu);
        auto it = g_quiet.find(name);
        if (it != g_quiet.end()) slot.quiet = it->second ? 1 : 0;
    }
    return slot.quiet == 1;  // not known yet: left on, learned as it runs
}

// The end of a recorded op left on: its kind is quieted if it began enough record
// functions.
void learn_quiet(Thread &t) {
    Thread::KindSlot &slot = kind_slot(t, t.name);
    int8_t q = t.nested >= kQuietFrom ? 1 : 0;
    if (slot.name != t.name || slot.quiet == 1 || slot.quiet == q) return;
    slot.quiet = q;
    std::lock_guard<std::mutex> lock(g_kind_mu);
    g_quiet[t.name] = q == 1;
}

// A callback with nothing to do but leave torch's work for it out of the clock (as
// calibrated): one call, where an interval would be two.
inline void exclude_torch_work() {
    if (g_counting) ++g_counted;
    p_tracer_exclude_earlier(g_session, g_earlier_ns);
}

// A record function begun inside a recorded op left on: not recorded, its cost
// (torch's, for our callbacks) is tracer work, and its op's kind calls other ops.
std::unique_ptr<at::ObserverContext> nested_start(Thread &t) {
    ++t.nested;
    exclude_torch_work();
    return nullptr;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction &fn) {
    Thread &t = thread_state();
    bool after_user_scope = t.after_user_scope;
    t.after_user_scope = false;
    int d = t.depth++;
    if (!g_active.load(std::memory_order_relaxed)) return nullptr;
    if (t.rec_depth >= 0) return nested_start(t);
    TracerWork work;
    try {
        const char *name = fn.name();
        if (!name) return nullptr;
        Kind k = op_kind(t, fn, name);
        if (k == kNamed) {
            if (t.graph_depth < 0 && compiled_region(name)) t.graph_depth = d;
            name = inductor_kernel(t, name);
            if (!name) return nullptr;
            k = kRecord;
        }
        if (k == kLookThrough) return nullptr;
        if (k == kOpaque) {
            t.rec_depth = d;
            t.opaque = true;
            quiet_nested(t);
            return nullptr;
        }
        release_ins(t);
        t.in_bytes = 0;
        for (const c10::IValue &v : fn.inputs()) gather(t, v);
        t.name = name;
        t.op_span = span_of(t);
        t.maybe_handle = after_user_scope;
        t.pending.clear();
        t.rec_depth = d;
        t.opaque = false;
        t.op_quiet = t.learning = false;
        t.nested = 0;
        if (k == kRecord) {
            if (quiet_for(kind_slot(t, name), name))
                quiet_nested(t);
            else
                t.learning = true;
        }
    } catch (...) {  // never let torch log a failed callback; the op goes unrecorded
        return nullptr;
    }
    t.t0 = work.at();
    return nullptr;
}

void record_op(const at::RecordFunction &fn, Thread &t, uint64_t t1) {
    at::Tensor holder;
    const at::Tensor *out = first_tensor(fn.outputs(), holder);
    if (is_scope_handle(t, out)) {
        release_ins(t);
        t.pending.clear();
        return;
    }
    Buf &b = buffer(t);
    std::lock_guard<std::mutex> lock(b.mu);
    OpRec r;
    r.t0 = t.t0;
    r.t1 = t1;
    r.span = t.op_span;
    r.name = t.name;
    r.in_off = static_cast<uint32_t>(b.inputs.size());
    r.in_n = static_cast<uint32_t>(t.ins.size());
    room(b.inputs, t.ins.size());
    room(b.pinned, t.ins.size() + 1);
    for (const Impl *impl : t.ins) {  // the references pinned at the op's start
        b.inputs.push_back(impl);
        b.pinned.push_back(const_cast<Impl *>(impl));
    }
    t.ins.clear();
    r.in_bytes = t.in_bytes;
    r.shape_off = static_cast<uint32_t>(b.shapes.size());
    r.rank = 0;
    r.out = nullptr;
    r.out_data = 0;
    r.dtype = c10::ScalarType::Undefined;
    if (out) {
        r.out = out->unsafeGetTensorImpl();
        pin(b, r.out);
        if (g_memory && t.graph_depth >= 0 && out->has_storage())
            r.out_data = reinterpret_cast<uintptr_t>(out->storage().data());
        r.dtype = out->scalar_type();
        r.device = out->device();
        if (!out->is_sparse()) {
            for (int64_t s : out->sizes()) b.shapes.push_back(s);
            r.rank = static_cast<uint32_t>(out->dim());
        }
        if (g_memory && !t.pending.empty() && out->has_storage()) {
            uintptr_t p = reinterpret_cast<uintptr_t>(out->storage().data());
            for (size_t i = t.pending.size(); p && i-- > 0;) {
                const Pending &a = t.pending[i];
                if (a.ptr == p) {
                    b.allocs.push_back(AllocRec{a.ts, a.span, a.bytes, p,
                                                static_cast<uint32_t>(b.ops.size()), r.device});
                    break;
                }
            }
        }
    }
    t.pending.clear();
    b.ops.push_back(r);
}

void on_end(const at::RecordFunction &fn, at::ObserverContext *) {
    Thread &t = this_thread();
    if (t.epoch != g_epoch.load(std::memory_order_acquire)) return;
    int d = --t.depth;
    if (d == t.graph_depth) t.graph_depth = -1;
    if (d != t.rec_depth) {
        // A looked-through or nested op ends: torch boxed its outputs for us too.
        if (g_active.load(std::memory_order_relaxed)) exclude_torch_work();
        return;
    }
    t.rec_depth = -1;
    TracerWork work;
    if (t.op_quiet) {
        at::enableRecordFunction(t.rf_in_op);  // a rebuild of torch's callback cache: ours
        t.op_quiet = false;
    }
    if (t.opaque) {
        t.opaque = false;
        return;
    }
    if (t.learning) learn_quiet(t);
    uint64_t t1 = work.at();
    if (!g_active.load(std::memory_order_relaxed)) {
        release_ins(t);
        return;
    }
    try {
        record_op(fn, t, t1);
    } catch (...) {  // out of memory, or a tensor without the expected metadata
        release_ins(t);  // the references record_op did not take
    }
}

// ---- collectives ----------------------------------------------------------------------
// A backend's work record function: begun on the thread that enqueues the collective (a
// DDP bucket's all-reduce from autograd's thread, dist.all_reduce from the caller), ended
// where the work completes. Few per update, from several threads: one list under a lock.

struct CollRec {
    uint64_t t0, t1, bytes, numel;
    std::string name;
    c10::ScalarType dtype;
    c10::Device device{c10::DeviceType::CPU};
};

struct CollCtx : public at::ObserverContext {
    uint64_t epoch = 0;
    CollRec rec;
};

std::mutex g_coll_mu;
std::vector<CollRec> g_colls;  // the capture's completed collectives
// The capture's collectives begun and not yet ended (reset when a capture begins; only a
// record of the current epoch counts itself down), so that stopping can wait for them.
std::atomic<int64_t> g_coll_open{0};
// how long ct_obs_stop waits for them
constexpr auto kCollectiveEndWait = std::chrono::milliseconds(100);

bool is_collective(const char *name) {
    static const char *const kBackends[] = {"gloo:", "nccl:", "mpi:", "ucc:", "xccl:"};
    for (const char *b : kBackends)
        if (std::strncmp(name, b, std::strlen(b)) == 0) return true;
    return false;
}

std::unique_ptr<at::ObserverContext> on_user_start(const at::RecordFunction &fn) {
    this_thread().after_user_scope = true;
    if (!g_active.load(std::memory_order_relaxed)) return nullptr;
    const char *name = fn.name();
    if (!name || !is_collective(name)) return nullptr;
    TracerWork work;
    try {
        auto ctx = std::make_unique<CollCtx>();
        ctx->epoch = g_epoch.load(std::memory_order_acquire);
        CollRec &r = ctx->rec;
        r.name = name;
        r.bytes = r.numel = 0;
        r.dtype = c10::ScalarType::Undefined;
        auto add = [&r](const at::Tensor &x) {
            if (!x.defined()) return;
            if (r.dtype == c10::ScalarType::Undefined) {
                r.dtype = x.scalar_type();
                r.device = x.device();
            }
            r.numel += static_cast<uint64_t>(x.numel());
            r.bytes += static_cast<uint64_t>(x.numel()) * x.element_size();
        };
        for (const c10::IValue &v : fn.inputs()) {
            if (v.isTensor()) {
                add(v.toTensor());
            } else if (v.isTensorList()) {
                for (const at::Tensor &x : v.toTensorVector()) add(x);
            } else if (v.isList()) {
                for (const c10::IValue &e : v.toListRef())
                    if (e.isTensor()) add(e.toTensor());
            }
        }
        r.t0 = work.at();
        g_coll_open.fetch_add(1, std::memory_order_acq_rel);
        return ctx;
    } catch (...) {
        return nullptr;
    }
}

void on_user_end(const at::RecordFunction &, at::ObserverContext *c) {
    if (!c) return;
    auto *ctx = static_cast<CollCtx *>(c);
    // A collective still in flight when the capture stopped is not the capture's.
    if (ctx->epoch != g_epoch.load(std::memory_order_acquire)) return;
    if (!g_active.load(std::memory_order_acquire)) {
        g_coll_open.fetch_sub(1, std::memory_order_acq_rel);
        return;
    }
    TracerWork work(0);
    try {
        ctx->rec.t1 = work.at();
        std::lock_guard<std::mutex> lock(g_coll_mu);
        g_colls.push_back(std::move(ctx->rec));
    } catch (...) {
    }
    // Counted down once the record is in: ct_obs_stop, seeing 0, finds it there.
    g_coll_open.fetch_sub(1, std::memory_order_acq_rel);
}

// A backend completes a collective's future before it ends the work's record function
// (gloo's worker marks the future done, then finishes the work, which ends the record),
// so a rank can see its all-reduce done, finish the update and stop the capture while the
// worker has yet to end the record -- on a loaded machine, long enough to lose it. So
// stopping waits for the capture's open collectives, at most kCollectiveEndWait: one the
// program really leaves in flight (an async op waited for after the update) costs that.
void wait_for_collectives() {
    auto deadline = std::chrono::steady_clock::now() + kCollectiveEndWait;
    while (g_coll_open.load(std::memory_order_acquire) > 0 &&
           std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
}

std::vector<CollRec> take_collectives() {
    std::lock_guard<std::mutex> lock(g_coll_mu);
    std::vector<CollRec> out;
    out.swap(g_colls);
    return out;
}

// The allocator's view: every allocation and free on threads that carry our debug info.
// ProfilerStateBase (not bare MemoryReportingInfoBase): torch casts whatever sits in the
// PROFILER_STATE slot to it; its config says "profiler disabled", so torch.profiler's
// own checks (profilerEnabled) still answer no.
struct MemoryReporter : public torch::profiler::impl::ProfilerStateBase {
    MemoryReporter()
        : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(
              torch::profiler::impl::ProfilerState::Disabled)) {}

#if TORCH_VERSION_MAJOR >= 2
    using total_t = size_t;
#else
    using total_t = int64_t;
#endif
    void reportMemoryUsage(void *ptr, int64_t alloc_size, total_t, total_t,
                           c10::Device device) override {
        if (!g_active.load(std::memory_order_relaxed) || !ptr || alloc_size == 0) return;
        // Not a tracer interval: noting an event is a clock read and a push, fewer
        // instructions than an interval's own begin and end, about half of which would
        // fall outside it anyway (before its clock read, after its end's).
        try {
            Thread &t = thread_state();
            uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
            if (alloc_size > 0) {
                if (t.opaque) return;  // the profiler's own
                if (t.rec_depth < 0) {  // no op made it (see kNoOp)
                    if (t.graph_depth < 0) return;
                    uint64_t ts = p_now(g_session);
                    Buf &b = buffer(t);
                    std::lock_guard<std::mutex> lock(b.mu);
                    b.allocs.push_back(AllocRec{ts, span_of(t), static_cast<uint64_t>(alloc_size),
                                                p, kNoOp, device});
                    return;
                }
                if (t.pending.size() >= kPendingMax) t.pending.clear();
                t.pending.push_back(
                    Pending{p_now(g_session), span_of(t), static_cast<uint64_t>(alloc_size), p});
                return;
            }
            uint64_t ts = p_now(g_session);
            Buf &b = buffer(t);
            std::lock_guard<std::mutex> lock(b.mu);
            b.frees.push_back(FreeRec{ts, span_of(t), p});
        } catch (...) {
        }
    }

    // Off while the thread is suspended: Python's stats allocate many small temporaries
    // that are not the model's, and torch's allocator pays for every reported block.
    bool memoryProfilingEnabled() const override {
        return g_active.load(std::memory_order_relaxed) && this_thread().suspended == 0;
    }

    torch::profiler::impl::ActiveProfilerType profilerType() override {
        return torch::profiler::impl::ActiveProfilerType::NONE;
    }
};

std::shared_ptr<MemoryReporter> g_reporter;
bool g_reporter_pushed = false;

// While the reporter is on, torch's CPU allocator logs (glog, once) that a block freed
// during the capture was "allocated before the profiling started" -- true of every
// tensor older than the capture, and not a problem: those frees are not ours to record.
// Its warnings are held back for the capture (glog's FLAGS_minloglevel, or c10's
// FLAGS_caffe2_log_level where torch logs without glog).
#ifdef C10_USE_GLOG
int g_saved_minloglevel = -1;
void quiet_logs(bool on) {
    if (on && g_saved_minloglevel < 0) {
        g_saved_minloglevel = FLAGS_minloglevel;
        if (FLAGS_minloglevel < 2) FLAGS_minloglevel = 2;  // ERROR and above
    } else if (!on && g_saved_minloglevel >= 0) {
        FLAGS_minloglevel = g_saved_minloglevel;
        g_saved_minloglevel = -1;
    }
}
#else
// Without glog (PyPI's wheels) c10's own logger drops messages below
// FLAGS_caffe2_log_level (TORCH_CPP_LOG_LEVEL sets it; WARNING by default).
int g_saved_log_level = -1;
bool g_log_level_saved = false;
void quiet_logs(bool on) {
    if (on && !g_log_level_saved) {
        g_saved_log_level = FLAGS_caffe2_log_level;
        g_log_level_saved = true;
        if (FLAGS_caffe2_log_level < c10::GLOG_ERROR) FLAGS_caffe2_log_level = c10::GLOG_ERROR;
    } else if (!on && g_log_level_saved) {
        FLAGS_caffe2_log_level = g_saved_log_level;
        g_log_level_saved = false;
    }
}
#endif

void after_fork_child() {
    g_forked.store(true);
    g_active.store(false);
}

const char *dtype_name(c10::ScalarType s, std::string &buf) {
    switch (s) {
        case c10::ScalarType::Float: return "f32";
        case c10::ScalarType::Double: return "f64";
        case c10::ScalarType::Half: return "f16";
        case c10::ScalarType::BFloat16: return "bf16";
        case c10::ScalarType::Long: return "i64";
        case c10::ScalarType::Int: return "i32";
        case c10::ScalarType::Short: return "i16";
        case c10::ScalarType::Char: return "i8";
        case c10::ScalarType::Byte: return "u8";
        case c10::ScalarType::Bool: return "bool";
        case c10::ScalarType::ComplexFloat: return "c64";
        case c10::ScalarType::ComplexDouble: return "c128";
        case c10::ScalarType::Undefined: return "none";
        default:
            buf = c10::toString(s);
            std::transform(buf.begin(), buf.end(), buf.begin(),
                           [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
            return buf.c_str();
    }
}

void note_error(int st) {
    if (st == 0) return;
    if (g_errors++ == 0) {
        const char *m = p_last_error ? p_last_error() : nullptr;
        g_first_error = m ? m : "unknown error";
    }
}

std::string device_str(const c10::Device &d) { return d.is_cpu() ? std::string("cpu") : d.str(); }

// Takes every thread's buffer of the capture (they are left empty).
std::vector<std::shared_ptr<Buf>> take_buffers() {
    std::lock_guard<std::mutex> lock(g_mu);
    std::vector<std::shared_ptr<Buf>> out;
    out.swap(g_bufs);
    return out;
}

void drop(std::vector<std::shared_ptr<Buf>> &bufs) {
    for (auto &b : bufs) {
        std::lock_guard<std::mutex> lock(b->mu);
        b->clear();
        b->epoch = 0;
    }
    bufs.clear();
}

// Writes the capture; returns the number of refused records.
uint64_t emit(std::vector<std::shared_ptr<Buf>> &bufs) {
    g_errors = 0;
    g_first_error.clear();
    struct Ref {
        Buf *b;
        uint32_t i;
    };
    std::vector<Ref> order;  // every op, in time order
    for (auto &b : bufs) {
        std::lock_guard<std::mutex> lock(b->mu);  // no writer is left; for the memory model
        for (uint32_t i = 0; i < b->ops.size(); ++i) order.push_back(Ref{b.get(), i});
    }
    std::stable_sort(order.begin(), order.end(), [](const Ref &x, const Ref &y) {
        return x.b->ops[x.i].t0 < y.b->ops[y.i].t0;
    });

    // Tensor ids, assigned in time order.
    std::unordered_map<const Impl *, uint32_t> current;  // impl -> id index
    std::vector<std::string> ids;
    uint64_t next_num = 0;
    auto fresh = [&](const Impl *impl) -> uint32_t {
        auto n = g_named.find(impl);
        ids.push_back(n != g_named.end() ? n->second : "t" + std::to_string(++next_num));
        uint32_t idx = static_cast<uint32_t>(ids.size() - 1);
        current[impl] = idx;
        return idx;
    };
    std::unordered_map<const Buf *, std::vector<int64_t>> out_id;  // op -> output id index
    for (auto &b : bufs) out_id[b.get()].assign(b->ops.size(), -1);
    std::vector<uint32_t> in_ids;
    std::vector<const char *> ins;
    std::unordered_set<uint64_t> edges;
    std::vector<std::pair<uint32_t, uint32_t>> edge_list;
    std::string dbuf;
    for (const Ref &ref : order) {
        const OpRec &r = ref.b->ops[ref.i];
        in_ids.clear();
        for (uint32_t k = 0; k < r.in_n; ++k) {
            const Impl *impl = ref.b->inputs[r.in_off + k];
            auto it = current.find(impl);
            in_ids.push_back(it != current.end() ? it->second : fresh(impl));
        }
        int64_t oid = -1;
        if (r.out) {
            for (uint32_t k = 0; k < r.in_n && oid < 0; ++k)
                if (ref.b->inputs[r.in_off + k] == r.out) oid = in_ids[k];
            if (oid < 0) oid = fresh(r.out);
        }
        out_id[ref.b][ref.i] = oid;
        ins.clear();
        for (uint32_t id : in_ids) ins.push_back(ids[id].c_str());
        std::string dev = device_str(r.device);
        ct_op op;
        std::memset(&op, 0, sizeof op);
        op.size = sizeof op;
        op.op_name = r.name;
        op.dtype = dtype_name(r.dtype, dbuf);
        op.device = dev.c_str();
        op.inputs = ins.empty() ? nullptr : ins.data();
        op.n_inputs = ins.size();
        op.output = oid >= 0 ? ids[oid].c_str() : nullptr;
        op.shape = r.rank ? &ref.b->shapes[r.shape_off] : nullptr;
        op.rank = r.rank;
        op.duration_ns = r.t1 > r.t0 ? r.t1 - r.t0 : 0;
        op.timestamp_ns = r.t0;
        op.input_dense_bytes = r.in_bytes;
        note_error(p_record_op(g_session, r.span, &op));
        if (oid >= 0) {
            for (uint32_t from : in_ids) {
                if (from == static_cast<uint32_t>(oid)) continue;
                uint64_t key = (static_cast<uint64_t>(from) << 32) | static_cast<uint32_t>(oid);
                if (edges.insert(key).second) edge_list.emplace_back(from, static_cast<uint32_t>(oid));
            }
        }
    }

    // Memory: allocations of op outputs and the frees that end them, in time order.
    struct Ev {
        uint64_t ts, span;
        uintptr_t ptr;
        int action;
        const AllocRec *alloc;  // allocations only
        const Buf *b;
    };
    std::vector<Ev> evs;
    for (auto &b : bufs) {
        for (const AllocRec &a : b->allocs) evs.push_back(Ev{a.ts, a.span, a.ptr, kMemoryAlloc, &a, b.get()});
        for (const FreeRec &f : b->frees) evs.push_back(Ev{f.ts, f.span, f.ptr, kMemoryFree, nullptr, b.get()});
    }
    std::stable_sort(evs.begin(), evs.end(), [](const Ev &x, const Ev &y) { return x.ts < y.ts; });

    // An op-less storage's writers: the recorded ops whose output lives in it, in time
    // order; the first between its allocation and the next allocation at its address
    // names it (kNoOp).
    struct Writer {
        uint64_t t0;
        const Buf *b;
        uint32_t op;
    };
    std::unordered_map<uintptr_t, std::vector<Writer>> writers;
    for (const Ev &e : evs)
        if (e.action == kMemoryAlloc && e.alloc->op == kNoOp) writers[e.ptr];
    std::vector<uint64_t> next_alloc;  // per event: the next allocation at its address (kNoOp's)
    if (!writers.empty()) {  // a compiled graph ran: none of this for an eager update
        for (auto &b : bufs)
            for (uint32_t i = 0; i < b->ops.size(); i++) {
                auto it = b->ops[i].out_data ? writers.find(b->ops[i].out_data) : writers.end();
                if (it != writers.end()) it->second.push_back(Writer{b->ops[i].t0, b.get(), i});
            }
        for (auto &w : writers)
            std::sort(w.second.begin(), w.second.end(),
                      [](const Writer &x, const Writer &y) { return x.t0 < y.t0; });
        next_alloc.assign(evs.size(), UINT64_MAX);
        std::unordered_map<uintptr_t, uint64_t> later;
        for (size_t i = evs.size(); i-- > 0;) {
            if (evs[i].action != kMemoryAlloc || !writers.count(evs[i].ptr)) continue;
            auto it = later.find(evs[i].ptr);
            if (it != later.end()) next_alloc[i] = it->second;
            later[evs[i].ptr] = evs[i].ts;
        }
    }
    struct Opless {
        std::string id;
        const OpRec *r = nullptr;  // the op that named it, if one did
        const Buf *b = nullptr;
    };
    std::unordered_map<const AllocRec *, Opless> opless;
    size_t unnamed = 0;
    std::unordered_map<uintptr_t, const Ev *> live;
    char sid[96];
    for (size_t ei = 0; ei < evs.size(); ei++) {
        const Ev &e = evs[ei];
        const Ev *alloc = &e;
        if (e.action == kMemoryAlloc) {
            if (live.count(e.ptr)) continue;  // its free was not seen: keep the first
            live[e.ptr] = &e;
        } else {
            auto it = live.find(e.ptr);
            if (it == live.end()) continue;  // not an op output of the capture
            alloc = it->second;
            live.erase(it);
        }
        const AllocRec &a = *alloc->alloc;
        ct_memory mr;
        std::memset(&mr, 0, sizeof mr);
        mr.size = sizeof mr;
        mr.timestamp_ns = e.ts;
        mr.bytes = a.bytes;
        if (a.op == kNoOp) {
            auto it = opless.find(&a);
            if (it == opless.end()) {  // its allocation (e is alloc)
                Opless o;
                for (const Writer &w : writers[a.ptr]) {
                    if (w.t0 < e.ts) continue;
                    if (w.t0 >= next_alloc[ei]) break;
                    int64_t oid = out_id[w.b][w.op];
                    if (oid >= 0) {
                        o.id = ids[oid];
                        o.r = &w.b->ops[w.op];
                        o.b = w.b;
                    }
                    break;
                }
                if (!o.r) o.id = "m" + std::to_string(++unnamed);  // no op's tensor
                it = opless.emplace(&a, std::move(o)).first;
            }
            const Opless &o = it->second;
            mr.tensor_id = o.id.c_str();
            if (o.r) {
                mr.dtype = dtype_name(o.r->dtype, dbuf);
                mr.shape = o.r->rank ? &o.b->shapes[o.r->shape_off] : nullptr;
                mr.rank = o.r->rank;
                mr.category = kCategoryActivation;
            } else {
                mr.dtype = "unknown";
                mr.category = kCategoryOther;
            }
        } else {
            const OpRec &r = alloc->b->ops[a.op];
            int64_t oid = out_id[alloc->b][a.op];
            if (oid < 0) continue;
            mr.tensor_id = ids[oid].c_str();
            mr.dtype = dtype_name(r.dtype, dbuf);
            mr.op_name = e.action == kMemoryAlloc ? r.name : nullptr;
            mr.shape = r.rank ? &alloc->b->shapes[r.shape_off] : nullptr;
            mr.rank = r.rank;
            mr.category = kCategoryActivation;
        }
        std::string dev = device_str(a.device);
        std::snprintf(sid, sizeof sid, "%s-%llx", dev.c_str(),
                      static_cast<unsigned long long>(e.ptr));
        mr.storage_id = sid;
        mr.device = dev.c_str();
        note_error(p_record_memory(g_session, e.span, e.action, &mr));
    }
    for (auto &e : edge_list)
        note_error(p_record_data_edge(g_session, ids[e.first].c_str(), ids[e.second].c_str()));

    // Collectives: ops of the measured region (they may end after the span they began in,
    // never after the capture stopped), in the order the ranks entered them.
    std::vector<CollRec> colls = take_collectives();
    std::stable_sort(colls.begin(), colls.end(),
                     [](const CollRec &x, const CollRec &y) { return x.t0 < y.t0; });
    for (const CollRec &c : colls) {
        std::string dev = device_str(c.device);
        int64_t shape = static_cast<int64_t>(c.numel);
        ct_op op;
        std::memset(&op, 0, sizeof op);
        op.size = sizeof op;
        op.flags = 1u;  // CT_HAS_OUTPUT_DENSE_BYTES: tensors of mixed dtypes add up too
        op.op_name = c.name.c_str();
        op.dtype = dtype_name(c.dtype, dbuf);
        op.device = dev.c_str();
        op.shape = &shape;
        op.rank = 1;
        op.duration_ns = c.t1 > c.t0 ? c.t1 - c.t0 : 0;
        op.timestamp_ns = c.t0;
        op.output_dense_bytes = c.bytes;
        op.input_dense_bytes = c.bytes;
        note_error(p_record_op(g_session, g_measured, &op));
    }
    return g_errors;
}

}  // namespace

// ---- the control interface (ctypes) ---------------------------------------------------
// Every function catches what torch may throw: nothing crosses the C boundary.

#define CT_OBS_EXPORT extern "C" __attribute__((visibility("default")))

CT_OBS_EXPORT int ct_obs_protocol() { return kProtocol; }

CT_OBS_EXPORT const char *ct_obs_error() { return g_error.c_str(); }

CT_OBS_EXPORT void ct_obs_set_abi(void *now, void *tracer_begin_at, void *tracer_exclude_earlier,
                                  void *tracer_end,
                                  void *record_op, void *record_memory,
                                  void *record_data_edge, void *last_error) {
    p_now = reinterpret_cast<now_fn>(now);
    p_tracer_begin_at = reinterpret_cast<tracer_at_fn>(tracer_begin_at);
    p_tracer_exclude_earlier = reinterpret_cast<tracer_exclude_fn>(tracer_exclude_earlier);
    p_tracer_end = reinterpret_cast<tracer_fn>(tracer_end);
    p_record_op = reinterpret_cast<record_op_fn>(record_op);
    p_record_memory = reinterpret_cast<record_memory_fn>(record_memory);
    p_record_data_edge = reinterpret_cast<record_data_edge_fn>(record_data_edge);
    p_last_error = reinterpret_cast<last_error_fn>(last_error);
    static bool atfork = false;
    if (!atfork) {
        atfork = true;
        pthread_atfork(nullptr, nullptr, after_fork_child);
    }
}

// Starts recording. `impls` are the TensorImpl addresses (Tensor._cdata) of the named
// tensors (parameters), `numels` their element counts (checked, as a guard against a
// torch whose _cdata means something else). Returns 0 on success, 1 on failure
// (ct_obs_error says why); *memory_on is 1 when the memory reporter is installed.
CT_OBS_EXPORT int ct_obs_begin(uint64_t session, uint64_t measured, int memory,
                               const uint64_t *impls, const int64_t *numels,
                               const char *const *names, size_t n, uint64_t earlier_ns,
                               int *memory_on) {
    try {
        if (g_forked.load()) {
            g_error = "candle_trace observer: this process is a fork() child";
            return 1;
        }
        if (g_handle != 0 || g_active.load()) {
            g_error = "candle_trace observer: a capture is already running";
            return 1;
        }
        if (!p_now || !p_tracer_begin_at || !p_tracer_exclude_earlier || !p_tracer_end || !p_record_op) {
            g_error = "candle_trace observer: ct_obs_set_abi was not called";
            return 1;
        }
        {
            std::lock_guard<std::mutex> lock(g_mu);
            g_named.clear();
            for (size_t i = 0; i < n; ++i) {
                auto *impl = reinterpret_cast<const Impl *>(impls[i]);
                if (!impl || impl->numel() != numels[i]) {
                    g_error = std::string("candle_trace observer: Tensor._cdata of ") +
                              names[i] + " is not a TensorImpl of this torch";
                    g_named.clear();
                    return 1;
                }
                g_named[impl] = names[i];
            }
        }
        auto stale = take_buffers();
        drop(stale);
        take_collectives();
        g_session = session;
        g_measured = measured;
        g_earlier_ns = earlier_ns;
        g_epoch.fetch_add(1, std::memory_order_acq_rel);
        // After the new epoch: a record of the last capture ending now no longer counts down.
        g_coll_open.store(0, std::memory_order_release);
        thread_state();
        g_memory = false;
        if (memory) {
            // Not under an active torch.profiler (it owns the slot): ops only.
            if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == nullptr) {
                if (!g_reporter) g_reporter = std::make_shared<MemoryReporter>();
                c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, g_reporter);
                g_reporter_pushed = true;
                g_memory = true;
                quiet_logs(true);
            }
        }
        *memory_on = g_memory ? 1 : 0;
        g_active.store(true, std::memory_order_release);
        g_handle = at::addGlobalCallback(
            at::RecordFunctionCallback(on_start, on_end)
                .needsInputs(true)
                .needsOutputs(true)
                .scopes({at::RecordScope::FUNCTION}));
        g_user_handle = at::addGlobalCallback(
            at::RecordFunctionCallback(on_user_start, on_user_end)
                .needsInputs(true)
                .scopes({at::RecordScope::USER_SCOPE}));
        return 0;
    } catch (const std::exception &e) {
        g_active.store(false);
        g_error = std::string("candle_trace observer: ") + e.what();
        return 1;
    }
}

// Calibration (Observer.calibrate): on=1 starts counting the tracer intervals the
// observer opens (from 0), on=0 stops; returns the count so far.
CT_OBS_EXPORT uint64_t ct_obs_count_intervals(int on) {
    uint64_t n = g_counted;
    if (on) g_counted = 0;
    g_counting = on != 0;
    return n;
}

// Publishes the innermost span of the calling thread (0: none, ops go to the measured
// region).
CT_OBS_EXPORT void ct_obs_set_span(uint64_t span) { thread_state().span = span; }

// Suspends recording on the calling thread (on=1) or resumes it (on=0): Python's own
// torch work (stats, gradient norms) is not the model's. RecordFunction is switched off
// for the thread, so those ops do not even pay for the callback.
CT_OBS_EXPORT void ct_obs_suspend(int on) {
    Thread &t = thread_state();
    if (on) {
        if (t.suspended++ == 0) {
            t.rf_was_enabled = at::isRecordFunctionEnabled();
            at::enableRecordFunction(false);
        }
    } else if (t.suspended > 0 && --t.suspended == 0) {
        at::enableRecordFunction(t.rf_was_enabled);
    }
}

// Stops recording (idempotent); call it on the thread that called ct_obs_begin.
CT_OBS_EXPORT int ct_obs_stop() {
    try {
        if (g_active.load(std::memory_order_acquire)) wait_for_collectives();
        g_active.store(false, std::memory_order_release);
        if (g_handle != 0) {
            at::removeCallback(g_handle);
            g_handle = 0;
        }
        if (g_user_handle != 0) {
            at::removeCallback(g_user_handle);
            g_user_handle = 0;
        }
        quiet_logs(false);
        if (g_reporter_pushed) {
            g_reporter_pushed = false;
            auto top = c10::ThreadLocalDebugInfo::_peek(c10::DebugInfoKind::PROFILER_STATE);
            if (top.get() == g_reporter.get())
                c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
        }
        return 0;
    } catch (const std::exception &e) {
        g_error = std::string("candle_trace observer: ") + e.what();
        return 1;
    }
}

// What the capture holds: out[0] ops, out[1] op-output allocations, out[2] frees seen.
CT_OBS_EXPORT void ct_obs_counts(uint64_t *out) {
    std::lock_guard<std::mutex> lock(g_mu);
    out[0] = out[1] = out[2] = 0;
    for (auto &b : g_bufs) {
        std::lock_guard<std::mutex> block(b->mu);
        out[0] += b->ops.size();
        out[1] += b->allocs.size();
        out[2] += b->frees.size();
    }
}

// Writes the buffered ops, memory events (in time order) and data edges through the C
// ABI, then drops the buffers. Returns the number of refused records; ct_obs_error
// holds the first refusal's message.
CT_OBS_EXPORT uint64_t ct_obs_emit() {
    auto bufs = take_buffers();
    uint64_t errors;
    try {
        errors = emit(bufs);
        g_error = g_first_error;
    } catch (const std::exception &e) {
        g_error = std::string("candle_trace observer: ") + e.what();
        errors = 1;
    }
    drop(bufs);
    std::lock_guard<std::mutex> lock(g_mu);
    g_named.clear();
    return errors;
}

// Drops a capture without writing it (an exception ended the update).
CT_OBS_EXPORT void ct_obs_discard() {
    auto bufs = take_buffers();
    drop(bufs);
    take_collectives();
    std::lock_guard<std::mutex> lock(g_mu);
    g_named.clear();
}
