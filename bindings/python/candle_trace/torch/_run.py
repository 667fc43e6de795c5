"""The PyTorch side of ``candle-trace run -- python train.py``: capture an update of a
program that knows nothing of candle_trace.

``install()`` is called by the sitecustomize the runner injects (internal/runner),
once ``import torch`` has run, in the one process that traces. From then on:

- every ``torch.optim.Optimizer`` created gets an instance ``step`` that, once the
  real step returns, ends an update -- with several optimizers, the step that completes
  their round (:class:`~candle_trace.torch._cycle.StepCycle`: a GAN's discriminator and
  generator steps are one update). The first optimizer starts the capture:
  :class:`~candle_trace.torch.profile` over the models whose parameters it holds
  (the outermost ``nn.Module`` objects that hold them, found once on the garbage
  collector's list; a parameter no module holds -- a model written with raw tensors --
  is one of the model's tensors, named after the ``__main__`` global that holds it); one
  made before any optimizer has stepped starts it again over the models of all of them,
  and each update's end is a ``profile.step()``;
- until an optimizer exists, each backward that returns is counted: after
  ``capture_step - 1`` of them with no optimizer (or, watched, the first), the program
  is taken for a loop that updates its parameters by hand (``p.data -= lr * p.grad``):
  the model is what that backward trained (:func:`trained_leaves`: the outermost
  modules holding those tensors, and the tensors none holds), and each backward's
  return ends an update -- so the update by hand comes first in the next one;
- until an optimizer exists or a backward has run, module forward hooks (torch's global
  ones) count the calls of outermost modules. When ``capture_step - 1`` of them have run with no
  optimizer, the program is taken for an inference loop: those hooks go, the module
  last called is the model, each of its calls is a step and the capture is phase
  ``infer`` (at the earliest the second call: the first is what finds the model);
- at exit the profile stops: a capture that never came (the program made fewer
  updates) is a failed trace saying how many there were; an exception that ended the
  program fails a capture it interrupted, with its type and message.

With ``--watch FOLDER`` (``Settings.watch``) there is no capture step: the first
optimizer starts :class:`~candle_trace.torch.watch` over its models instead (again
over all of them, as above), each update's end is a ``watch.step()``, and the updates
its triggers pick are written into the folder; at exit the watch stops (an exception
that ended the program is the update's, a failed ``update-N-exception`` trace) and says
on stderr how many updates it watched and what fired. A watched run needs an
optimizer: no inference loop is looked for.

Options come from the runner in CANDLE_TRACE_RUN_* variables (see :class:`Settings`).
A process forked after install (a DataLoader worker) inherits the patches, and every
hook checks the pid first: there they only call through.
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import signal
import sys
import threading
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ._amp import GRAD_SCALER
from ._common import Patched, patch, restore
from ._cycle import StepCycle
from ._profile import profile
from ._watch import watch

__all__ = ["install", "Settings", "expand", "models_of", "watch_summary"]


@dataclass
class Settings:
    """The runner's options (internal/runner/env.go writes them)."""

    output: str = "candle-trace-%p.jsonl"
    capture_step: int = 3
    #: "auto", None (none), or a list of collectors
    device_collect: Union[str, List[str], None] = "auto"
    aggregate: Optional[str] = None
    #: the folder of a watched run (``--watch``), None for a capture of capture_step
    watch: Optional[str] = None
    max_traces: int = 3
    #: False: a watched run records no update, only captures the one after a trigger
    flight_recorder: bool = True

    @classmethod
    def from_env(cls, env: Optional[Dict[str, str]] = None) -> "Settings":
        e = os.environ if env is None else env
        dc = e.get("CANDLE_TRACE_RUN_DEVICE_COLLECT", "auto")
        collect: Union[str, List[str], None] = (
            "auto" if dc == "auto" else None if dc in ("", "none") else
            [c.strip() for c in dc.split(",") if c.strip()])
        return cls(output=e.get("CANDLE_TRACE_RUN_OUTPUT", cls.output),
                   capture_step=int(e.get("CANDLE_TRACE_RUN_CAPTURE_STEP", cls.capture_step)),
                   device_collect=collect,
                   aggregate=e.get("CANDLE_TRACE_RUN_AGGREGATE") or None,
                   watch=e.get("CANDLE_TRACE_RUN_WATCH") or None,
                   max_traces=int(e.get("CANDLE_TRACE_RUN_MAX_TRACES", cls.max_traces)),
                   flight_recorder=e.get("CANDLE_TRACE_RUN_FLIGHT_RECORDER", "1") != "0")


def expand(pattern: str, pid: int, rank: Optional[str]) -> str:
    """The path of this process's file: %p its pid, %r its rank (0 without one). A
    rank of a distributed launch (``rank`` set) whose pattern has no %r gets
    ``-rank<r>`` before the extension (as ``profile`` names a rank's file), so that
    each rank's file says whose it is."""
    if rank is not None and "%r" not in pattern:
        root, ext = os.path.splitext(pattern)
        pattern = f"{root}-rank%r{ext}"
    out, i = [], 0
    while i < len(pattern):
        two = pattern[i:i + 2]
        if two in ("%p", "%r", "%%"):
            out.append(str(pid) if two == "%p" else (rank or "0") if two == "%r" else "%")
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def models_of(params: Sequence[torch.Tensor]) -> List[torch.nn.Module]:
    """The outermost modules that hold any of ``params``: every live ``nn.Module``
    holding one, less those inside another (a model's layers, a wrapper's model)."""
    want = {id(p) for p in params}
    gc.collect()  # a dropped wrapper of the model would count as one otherwise
    # type(), not isinstance: an object whose __getattribute__ warns (torch.distributed
    # .reduce_op) would warn at an isinstance check of its __class__.
    holders = [m for m in gc.get_objects() if issubclass(type(m), torch.nn.Module)
               and any(id(p) in want for p in m.parameters())]
    inside = {id(sub) for m in holders for sub in m.modules() if sub is not m}
    return [m for m in holders if id(m) not in inside]


class Terminated(BaseException):
    """What ended a run that a SIGTERM killed (the reason of its failed trace)."""


def loose_tensors(params: Sequence[torch.Tensor], tops: Sequence[torch.nn.Module],
                  main: Optional[Dict[str, Any]] = None,
                  in_main_order: bool = False) -> Dict[str, torch.Tensor]:
    """The parameters no module in ``tops`` holds, named after where ``__main__``'s
    globals (or ``main``) hold each: an attribute of a global object -- a model class
    that is no nn.Module -- (``model.W1``, ``model.head.0``), a global tensor (``W1``), a
    global list or tuple of them (``params.3``), in that order of preference; else
    ``param<i>``, its place in ``params``. In the order of ``params``, or with
    ``in_main_order`` (``params`` in no order of the program's: a graph's leaves) in the
    order the program bound what names them, those named by nothing last."""
    held = {id(p) for m in tops for p in m.parameters()}
    want = {id(p) for p in params} - held
    names, place = main_names(want, main)
    out: Dict[str, torch.Tensor] = {}
    order = list(enumerate(params))
    if in_main_order:
        last = (1 << 30,)  # named by nothing: after every global
        order.sort(key=lambda ip: place.get(id(ip[1]), last))
    for i, p in order:
        if id(p) not in want:
            continue
        want.discard(id(p))  # a tensor given twice is named once
        n = names.get(id(p), f"param{i}")
        while n in out:
            n += "_"
        out[n] = p
    return out


def main_names(want: set, main: Optional[Dict[str, Any]] = None
               ) -> Tuple[Dict[int, str], Dict[int, Tuple[int, ...]]]:
    """Names for the objects whose id() is in ``want`` (tensors, modules) after where
    ``__main__``'s globals (or ``main``) hold them -- an attribute of a global object
    (``model.W1``, ``model.norm``), a global (``W1``, ``netG``), a place in a global list
    (``params.3``), in that order of preference -- and where each name was bound (the
    global's index, then the place inside it). Objects nothing names are left out."""
    if main is None:
        main = vars(sys.modules["__main__"]) if "__main__" in sys.modules else {}
    found = [(k, v) for k, v in list(main.items()) if not k.startswith("__")]
    objects = [(k, vars(v)) for k, v in found if hasattr(v, "__dict__") and not isinstance(
        v, (type, types.ModuleType, types.FunctionType, torch.nn.Module, torch.Tensor))]
    names: Dict[int, str] = {}
    place: Dict[int, Tuple[int, ...]] = {}
    index = {k: i for i, (k, _) in enumerate(found)}

    def name(where: str, v: Any, lists: bool, at: Tuple[int, ...]) -> None:
        if isinstance(v, (torch.Tensor, torch.nn.Module)):
            if id(v) in want and id(v) not in names:
                names[id(v)] = where
                place[id(v)] = at
        elif lists and isinstance(v, (list, tuple)):
            for i, t in enumerate(v):
                name(f"{where}.{i}", t, False, at + (i,))

    # A model object's attribute first (a global tensor may be a loop variable left
    # bound to one: ``for p in model.parameters()``), then a global (the first bound),
    # then a place in a global list (``parameters = [C, W1, ...]`` names nothing)
    for k, attrs in objects:
        for j, (a, v) in enumerate(list(attrs.items())):
            name(f"{k}.{a}", v, True, (index[k], j))
    for k, v in found:
        name(k, v, False, (index[k],))
    for k, v in found:
        if isinstance(v, (list, tuple)):
            name(k, v, True, (index[k],))
    return names, place


def _model(tops: Sequence[torch.nn.Module], loose: Dict[str, torch.Tensor],
           main: Optional[Dict[str, Any]] = None) -> Any:
    """What profile takes: the module, or a mapping holding each module and each loose
    tensor -- a module named where ``__main__`` holds it (``netG``, ``model.norm``; see
    :func:`main_names`), else after its class."""
    if len(tops) == 1 and not loose:
        return tops[0]
    names, _ = main_names({id(m) for m in tops}, main)
    holder: Dict[str, Any] = {}
    for m in tops:
        base = names.get(id(m), type(m).__name__)
        name, n = base, 2
        while name in holder or name in loose:
            name, n = f"{base}_{n}", n + 1
        holder[name] = m
    holder.update(loose)
    return holder


def trained_leaves(tensors: Any) -> List[torch.Tensor]:
    """The leaf tensors a backward from ``tensors`` accumulates gradients into (its
    graph's AccumulateGrad nodes), in the order first reached; walked before the
    backward frees the graph."""
    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
    todo = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    out: List[torch.Tensor] = [t for t in roots if isinstance(t, torch.Tensor) and
                               t.grad_fn is None and t.requires_grad]
    seen: set = set()
    walked: List[Any] = []  # a node's Python object may be made afresh at each access:
    while todo:             # the walked ones stay alive so that no id is reused
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        walked.append(node)
        leaf = getattr(node, "variable", None)
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        todo.extend(reversed([n for n, _ in node.next_functions]))
    return out


class Backwards:
    """Calls ``before(tensors)`` and ``after(tensors)`` around each call of
    ``torch.autograd.backward`` (``Tensor.backward`` calls it too). Kept outermost
    (:meth:`keep_on_top`, after anything of ours may have wrapped it: a capture arming):
    an update that ends at a backward's return ends after every wrapper inside it -- a
    capture's backward span -- has closed. A layer left beneath calls straight through."""

    def __init__(self, before: Any, after: Any) -> None:
        self._before, self._after = before, after
        self._patched: Optional[Patched] = None  # the wrapper installed last
        self._live: Optional[List[bool]] = None  # its switch

    def keep_on_top(self) -> None:
        if self._patched is not None and torch.autograd.backward is self._patched.value:
            return
        self.remove()
        inner, live, owner = torch.autograd.backward, [True], self

        @functools.wraps(inner)
        def backward(tensors: Any, *a: Any, **k: Any) -> Any:
            if not live[0]:
                return inner(tensors, *a, **k)
            owner._before(tensors)
            out = inner(tensors, *a, **k)
            if live[0]:
                owner._after(tensors)
            return out

        self._patched, self._live = patch(torch.autograd, "backward", backward), live

    def remove(self) -> None:
        patched, live, self._patched, self._live = self._patched, self._live, None, None
        if live is not None:
            live[0] = False
        if patched is not None:
            restore(torch.autograd, "backward", patched)


#: optimizers made after the loop began that the capture's spans take in (a new epoch's):
#: the capture holds each for the rest of the run, and a program that makes one every
#: update (SGD has no state to lose) would pile them up
MAX_ADDED = 16


class _Counter:
    """A counting wrapper's switch, and what takes it out: a wrapper something else went
    over since stays beneath, switched off. Nothing here holds the object once the loop
    has stepped (``patched`` forgotten: a restart comes only before): the optimizers of
    a program that makes one an update must be free to go."""

    def __init__(self, obj: Any, attr: str) -> None:
        self.live = True
        self.ref = weakref.ref(obj)
        self.attr = attr
        self.patched: Optional[Patched] = None

    def remove(self) -> None:
        self.live = False
        obj = self.ref()
        if obj is not None and self.patched is not None:
            restore(obj, self.attr, self.patched)


class Autorun:
    """The integration's state in the traced process (see the module's doc)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pid = os.getpid()
        rank = os.environ.get("RANK")
        self.path = expand(settings.output, self.pid, rank)
        self.aggregate = expand(settings.aggregate, self.pid, rank) if settings.aggregate else None
        self.prof: Optional[profile] = None
        self.watch: Optional[watch] = None  # a watched run's (settings.watch)
        self.forwards = 0  # outermost module calls while no optimizer exists
        self.backwards = 0  # backward calls returned while no optimizer exists
        #: a loop with no optimizer (parameters updated by hand): updates end when a
        #: backward returns, the model is what that backward trains
        self._backwards = Backwards(self._before_backward, self._after_backward)
        self._by_backward = False
        self._trained: Optional[List[torch.Tensor]] = None  # the deciding backward's leaves
        self._depth = threading.local()
        self._hooks: List[Any] = []
        self._cycle = StepCycle()  # the loop's optimizers: which step ends an update
        self._counters: List[_Counter] = []  # the counting wrappers installed
        self._at_exit = False
        self.optimizer_steps = 0  # steps of the optimizers counted, all together
        self._added = 0  # optimizers made after the capture started, given to it
        self._exc: Any = (None, None)  # what an uncaught exception ended the program with

    # -- installing -------------------------------------------------------------------

    def install(self) -> None:
        self._patch_optimizer()
        self._patch_grad_scaler()
        if self.settings.watch is None:
            self._watch_forwards()
        self._backwards.keep_on_top()
        previous = sys.excepthook

        def excepthook(tp: Any, value: Any, tb: Any) -> None:
            if self.here:
                self._exc = (tp, value)
            previous(tp, value, tb)

        sys.excepthook = excepthook
        self._handle_sigterm()

    def _handle_sigterm(self) -> None:
        """A SIGTERM (the runner forwards its own; a scheduler's) would kill Python with
        no exit handler run, leaving the trace without a terminal line. Where the
        disposition is still the default, the trace is ended first -- failed, naming the
        signal, unless its capture is complete -- then the default is put back and the
        signal raised again: the process dies of it as it would have. A forked child
        gets the default back at once (it has no trace to end)."""
        if threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            # Ignored while the trace ends: a second SIGTERM (the runner forwards its
            # own, a job scheduler's comes to the whole group) must not kill the process
            # half way through writing it. It dies of the one it got, just after.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                if self.here:
                    self._stop(Terminated, Terminated(
                        f"killed by SIGTERM (signal {int(signal.SIGTERM)})"))
            finally:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        def in_fork_child() -> None:
            if signal.getsignal(signal.SIGTERM) is on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

        signal.signal(signal.SIGTERM, on_sigterm)
        os.register_at_fork(after_in_child=in_fork_child)

    @property
    def here(self) -> bool:
        """This is the traced process (not a fork of it)."""
        return os.getpid() == self.pid

    def _patch_optimizer(self) -> None:
        run = self
        init = torch.optim.Optimizer.__init__

        def __init__(opt: torch.optim.Optimizer, *a: Any, **k: Any) -> None:
            init(opt, *a, **k)
            if run.here:
                run.optimizer_created(opt)

        torch.optim.Optimizer.__init__ = __init__  # type: ignore[method-assign]

    def _patch_grad_scaler(self) -> None:
        """A step a GradScaler skipped (the gradients it unscaled held an inf: mixed
        precision's overflow, at the start of every fp16 run and whenever the scale has
        grown too far) is still the end of the optimizer's part of the iteration: with
        no ``optimizer.step()`` to count, the iteration would run on into the next."""
        cls = GRAD_SCALER
        if cls is None or "step" not in cls.__dict__:
            return
        orig, run = cls.__dict__["step"], self

        @functools.wraps(orig)
        def step(scaler: Any, optimizer: Any, *a: Any, **k: Any) -> Any:
            before = run.optimizer_steps
            out = orig(scaler, optimizer, *a, **k)
            if run.here and run.optimizer_steps == before and any(
                    c.live and c.ref() is optimizer for c in run._counters):
                run.stepped(optimizer)
            return out

        cls.step = step  # type: ignore[attr-defined]

    def _count(self, obj: Any, attr: str) -> None:
        """Makes each call of ``obj.<attr>`` (an optimizer's step, the inference model's
        forward) end an update once it returns. Installed over the wrappers the profile
        has put there when it started (the whole-run statistics' spans), so that the
        update ends after they have closed theirs; the capture's own wrappers, installed
        when it arms, go over this one and leave their spans to the capture's end. A
        bound method, as LR schedulers expect of ``optimizer.step`` (they wrap its
        ``__func__``)."""
        inner = getattr(obj, attr)
        run = self
        counter = _Counter(obj, attr)
        is_optimizer = isinstance(obj, torch.optim.Optimizer)

        def counted(this: Any, *a: Any, **k: Any) -> Any:
            out = inner(*a, **k)
            if counter.live and run.here:
                if is_optimizer:
                    run.optimizer_steps += 1
                run.stepped(this)
            return out

        patched = patch(obj, attr, types.MethodType(counted, obj))
        counter.patched = patched if self._cycle.steps == 0 else None
        self._counters.append(counter)
        self._counters = [c for c in self._counters if c.ref() is not None]

    def _watch_forwards(self) -> None:
        hooks = torch.nn.modules.module
        if not hasattr(hooks, "register_module_forward_pre_hook"):
            return  # a torch without global hooks: an optimizer is needed
        self._hooks.append(hooks.register_module_forward_pre_hook(self._pre_forward))
        try:  # torch 2.x also runs it when the forward raised
            post = hooks.register_module_forward_hook(self._post_forward, always_call=True)
        except TypeError:
            post = hooks.register_module_forward_hook(self._post_forward)
        self._hooks.append(post)

    def _unwatch_forwards(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        self._depth.n = getattr(self._depth, "n", 0) + 1

    def _post_forward(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        n = self._depth.n = max(getattr(self._depth, "n", 1) - 1, 0)
        # A module with parameters: a loss module called at the top is no model.
        if n == 0 and self.here and self.prof is None and self._hooks and \
                self.backwards == 0 and next(module.parameters(), None) is not None:
            self.forwards += 1
            if self.forwards >= max(self.settings.capture_step - 1, 1):
                self._start_infer(module)

    # -- the capture ------------------------------------------------------------------

    def _profile(self, model: Any, optimizer: Optional[torch.optim.Optimizer], phase: str,
                 capture_step: int, counted: Any, attr: str) -> Optional[profile]:
        """Starts the profile, then counts the calls of ``counted.<attr>`` as updates
        (``counted`` None: the backwards' returns are counted)."""
        s = self.settings
        try:
            prof = profile(model, optimizer, self.path, capture_step, phase=phase,
                           tags={"mode": "candle-trace run",
                                 "command": os.path.basename(sys.argv[0] or "python")},
                           device_collect=s.device_collect, aggregate_path=self.aggregate)
            prof.start()
        except Exception as e:  # noqa: BLE001 - the program runs on, untraced
            say(f"candle-trace run: no capture: {type(e).__name__}: {e}")
            return None
        self.prof = prof
        if counted is not None:
            self._count(counted, attr)
        self._stop_at_exit()
        return prof

    def _stop_at_exit(self) -> None:
        if not self._at_exit:
            self._at_exit = True
            atexit.register(self.stop)  # after the session's own exit hook: runs before it

    def _watch(self, model: Any, optimizers: List[torch.optim.Optimizer],
               first_update: int = 1) -> None:
        """Starts the watch of a watched run, then counts each step of ``optimizers``
        (none: the backwards' returns are counted)."""
        s = self.settings
        try:
            w = watch(model, optimizers or None, s.watch or "", max_traces=s.max_traces,
                      flight_recorder=s.flight_recorder,
                      tags={"mode": "candle-trace run --watch",
                            "command": os.path.basename(sys.argv[0] or "python")},
                      aggregate_path=self.aggregate, first_update=first_update)
            w.recorder_cost.way_out = "candle-trace run --watch ... --no-flight-recorder"
            w.start()
        except Exception as e:  # noqa: BLE001 - the program runs on, unwatched
            say(f"candle-trace run: not watched: {type(e).__name__}: {e}")
            return
        self.watch = w
        for opt in optimizers:
            self._count(opt, "step")
        self._stop_at_exit()

    def optimizer_created(self, opt: torch.optim.Optimizer) -> None:
        """The first optimizer starts the capture over the models it trains. One created
        before the loop has stepped (a GAN's second) starts it again over the models of
        all of them; one created later (a new epoch's) joins the round
        (:class:`StepCycle`: an update ends once each optimizer of the loop has stepped;
        one it replaces leaves it) and the capture's spans."""
        if self._by_backward:
            return  # a loop whose updates end at backward: counted there
        self._cycle.join(opt)
        if self.prof is not None or self.watch is not None:
            if self._cycle.steps == 0 and not self._in_update():
                self._start_over()
                return
            self._added += 1
            if self._added <= MAX_ADDED:  # each holds its optimizer for the run
                if self.prof is not None:
                    self.prof.add_optimizer(opt)
                if self.watch is not None:
                    self.watch.add_optimizer(opt)
            elif self._added == MAX_ADDED + 1:
                say(f"candle-trace run: the program has made {MAX_ADDED + 1} optimizers "
                    f"since its loop began (one an update?): the steps of those from now "
                    f"on still end updates, but are no spans of their own")
            self._count(opt, "step")  # over the wrappers those put there
            return
        self._backwards.remove()
        self._unwatch_forwards()
        self._start_over()

    def _in_update(self) -> bool:
        """The profile's or the watch's capture is recording an update."""
        if self.prof is not None:
            return self.prof.state not in ("waiting", "armed")
        return self.watch is not None and self.watch.in_update

    def _start_over(self) -> None:
        """(Re)starts the profile or the watch over the models the loop's optimizers
        train, and counts their steps. A profile or watch already started over fewer of
        them has recorded no update: it ends (its trace is replaced by the new one's,
        a watch's records dropped) and its counting stops."""
        old_prof, old_watch, self.prof, self.watch = self.prof, self.watch, None, None
        for counter in self._counters:
            counter.remove()
        self._counters.clear()
        with warnings.catch_warnings():  # "never came": it is superseded, not ended
            warnings.simplefilter("ignore", RuntimeWarning)
            if old_prof is not None:
                old_prof.stop()
            if old_watch is not None:
                old_watch.stop()
        opts = self._cycle.optimizers()
        params = [p for opt in opts for g in opt.param_groups for p in g["params"]]
        tops = models_of(params)
        model = _model(tops, loose_tensors(params, tops))
        if self.settings.watch is not None:
            self._watch(model, opts)
            return
        self._profile(model, opts[0] if len(opts) == 1 else opts, "train",
                      self.settings.capture_step, None, "")
        for opt in opts if self.prof is not None else ():
            self._count(opt, "step")

    def _start_infer(self, module: torch.nn.Module) -> None:
        """No optimizer after capture_step - 1 outermost calls: an inference loop whose
        steps are the calls of ``module``."""
        self._unwatch_forwards()
        prof = self._profile(module, None, "infer", max(self.settings.capture_step, 2),
                             module, "forward")
        if prof is not None:
            for _ in range(self.forwards):  # the calls that ran before it existed
                prof.step()

    def _first_backwards(self) -> int:
        """How many backwards find the model of a loop with no optimizer: as many as
        run before the captured update (at least one); a watch's first."""
        return 1 if self.settings.watch is not None else max(self.settings.capture_step - 1, 1)

    def _before_backward(self, tensors: Any) -> None:
        if self.here and not self._by_backward and self.prof is None and \
                self.watch is None and self.backwards + 1 >= self._first_backwards():
            try:
                self._trained = trained_leaves(tensors)
            except Exception as e:  # noqa: BLE001 - the program runs on, untraced
                say(f"candle-trace run: no capture: {type(e).__name__}: {e}")
                self._backwards.remove()

    def _after_backward(self, tensors: Any) -> None:
        if not self.here:
            return
        if self._by_backward:
            self.stepped()
            return
        if self.prof is not None or self.watch is not None:
            return
        self.backwards += 1
        trained, self._trained = self._trained, None
        if trained:
            self._start_by_backward(trained)

    def _start_by_backward(self, trained: List[torch.Tensor]) -> None:
        """A training loop with no optimizer (its parameters updated by hand) after
        its first backwards: the model is what they train -- the outermost modules
        holding those tensors, and those no module holds (:func:`loose_tensors`) -- and
        each backward's return ends an update."""
        self._unwatch_forwards()
        self._by_backward = True
        tops = models_of(trained)
        model = _model(tops, loose_tensors(trained, tops, in_main_order=True))
        if self.settings.watch is not None:
            self._watch(model, [], first_update=self.backwards + 1)
        else:
            # at the earliest the second update: the first backward is what finds the model
            prof = self._profile(model, None, "train", max(self.settings.capture_step, 2),
                                 None, "")
            for _ in range(self.backwards if prof is not None else 0):
                prof.step()  # the updates that ran before it existed
        self._backwards.keep_on_top()  # over what the profile's start wrapped

    def stepped(self, source: Any = None) -> None:
        """An update (an optimizer step that completes the round, a backward of a loop
        with no optimizer, a call of the inference model) ended."""
        if isinstance(source, torch.optim.Optimizer):
            if self._cycle.steps == 0:  # no restart from here on: nothing to take out
                for c in self._counters:
                    c.patched = None
            if not self._cycle.ends(source):
                return
        try:
            self._stepped()
        finally:
            if self._by_backward:
                self._backwards.keep_on_top()  # over what a capture arming wrapped

    def _stepped(self) -> None:
        if self.watch is not None:
            self.watch.step()
            return
        prof = self.prof
        if prof is None:
            return
        prof.step()
        if prof.state in ("done", "failed") and prof.whole_run is None:
            self.stop()  # nothing more to do for the rest of the run

    def stop(self) -> None:
        """Ends the profile or the watch (at exit, or once the capture is written)."""
        if self.here:
            self._stop(*self._exc)

    def _stop(self, exc_type: Any, exc: Any) -> None:
        self._backwards.remove()
        self._by_backward = False  # nothing counts a backward from here on
        w, self.watch = self.watch, None
        if w is not None:
            w.stop(exc_type, exc)
            say(watch_summary(w))
        prof = self.prof
        if prof is None:
            return
        with warnings.catch_warnings():
            # A capture that never came warns; the runner's verdict says it already.
            warnings.simplefilter("ignore", RuntimeWarning)
            prof.stop(exc_type, exc)


def say(message: str) -> None:
    """Writes a message and its newline to stderr in one write(2): the ranks of a torchrun
    job share one stderr, and print() writes the newline apart, so another rank's line could
    land between a line and its end (atomic on a pipe up to PIPE_BUF, 4096 bytes)."""
    data = (message + "\n").encode(errors="replace")
    try:
        sys.stderr.flush()
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced or closed by the program
        print(message, file=sys.stderr)
        return
    while data:
        data = data[os.write(fd, data):]


def watch_summary(w: watch) -> str:
    """What a watched run says at its end: the updates it watched and each trigger that
    fired, with its trace or why none was written (the runner's verdicts follow)."""
    rank = f"rank {w.rank}: " if w.world_size > 1 else ""  # torchrun: each rank says its own
    n = w.updates - w.first_update + 1
    unarmed = w.slow_unarmed
    lines = [f"candle-trace: {rank}watched {n} update{'s' if n != 1 else ''}; "
             f"{len(w.fired) or 'no'} trigger{'s' if len(w.fired) != 1 else ''} fired"
             + (f" ({unarmed})" if unarmed else "")]
    for f in w.fired:
        what = f"value {f.value:.6g}" + (f" > threshold {f.threshold:.6g}" if f.threshold else "")
        if f.detail:
            what = f.detail if f.trigger == "exception" else f"{what}; {f.detail}"
        kept = f"trace {os.path.basename(f.trace)}" if f.trace else f"no trace: {f.no_trace}"
        lines.append(f"candle-trace:   {rank}update {f.update}: {f.trigger} ({what}) -> {kept}")
    return "\n".join(lines)


_installed: Optional[Autorun] = None


def install(settings: Optional[Settings] = None) -> Autorun:
    """Sets the integration up in this process (once)."""
    global _installed
    if _installed is None:
        _installed = Autorun(settings or Settings.from_env())
        _installed.install()
    return _installed
