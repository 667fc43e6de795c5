"""The gradient contract of a capture and the gradients of its update.

A parameter's family is its module's name (``encoder.layers.0.attn``); the model's own
parameters are the family named after the model.

The default contract claims only what a profiler can know: every parameter that
requires grad is reported once (the manifest) and no gradient is non-finite. Whether a
family gets gradients in one update depends on the model and the data -- a layer that
is never called, a branch not taken this time, a gradient ``zero_grad()`` left at zero --
so every family defaults to ``data_conditional`` with ``min_present`` 1, which
candle-graph never fails for absence. What a user knows (``gradient_families``: "this
family must learn", "that one is frozen") is a claim the capture checks when it ends:
a violated claim is a warning that names the parameters, and candle-graph reports it
as the error it is.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ..session import Session, gradient_contract

__all__ = ["Families", "family_of", "contract", "record", "violations"]

#: family -> (expectation, min_present)
Families = Mapping[str, Tuple[str, int]]

EXPECTATIONS = ("active", "inactive", "data_conditional")


def family_of(root: str, key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else root


def check_families(families: Optional[Families], known: Sequence[str]) -> None:
    """Refuses, at the profile's construction, families the contract would refuse later."""
    if not families:
        return
    for fam, spec in families.items():
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise ValueError(f"gradient_families[{fam!r}] must be (expectation, min_present), "
                             f"got {spec!r}")
        exp, n = spec
        if exp not in EXPECTATIONS:
            raise ValueError(f"gradient_families[{fam!r}]: expectation {exp!r} is not one of "
                             f"{', '.join(EXPECTATIONS)}")
        if fam not in known:
            raise ValueError(f"gradient_families names {fam!r}, which is no family of this "
                             f"model; its families are {', '.join(sorted(set(known)))}")


def contract(root: str, keys: Sequence[str], families: Optional[Families]) -> dict:
    """The ``gradient_contract`` of the capture (see the module's doc)."""
    fams: Dict[str, Tuple[str, int]] = {}
    for k in keys:
        fams.setdefault(family_of(root, k), ("data_conditional", 1))
    fams.update(families or {})
    return gradient_contract([(root, k, family_of(root, k)) for k in keys], fams)


_foreach_norm = getattr(torch, "_foreach_norm", None)


def norms(params: Sequence[Tuple[str, torch.Tensor]]) -> Dict[str, Optional[float]]:
    """key -> L2 norm of the parameter's gradient, None when it has none: float32 and
    float64 gradients reduced in their dtype (as ``p.grad.norm()`` is) by one fused call,
    complex ones in theirs, others in float64; one host copy per (device, dtype)."""
    with torch.no_grad():
        vals: Dict[str, Optional[float]] = {n: None for n, _ in params}
        groups: Dict[Any, List[Tuple[str, torch.Tensor]]] = {}
        for n, p in params:
            g = p.grad
            if g is not None:
                groups.setdefault((g.device, g.dtype, g.is_sparse), []).append((n, g.detach()))
        for (_, dtype, sparse), items in groups.items():
            gs = [g for _, g in items]
            # float16/bfloat16 norms overflow where the values do not: float64 there
            if _foreach_norm is not None and not sparse and dtype in (torch.float32, torch.float64):
                ns = torch.stack(_foreach_norm(gs)).tolist()
            else:
                # a complex gradient's norm is real, in its dtype's precision (as
                # p.grad.norm()); float16/bfloat16 ones in float64
                wide = {} if dtype.is_complex else {"dtype": torch.float64}
                ns = torch.stack([torch.linalg.vector_norm(g.coalesce().values() if sparse else g,
                                                           **wide) for g in gs]).tolist()
            vals.update({n: v for (n, _), v in zip(items, ns)})
    return vals


def state_of(v: Optional[float]) -> str:
    if v is None:
        return "missing"
    if v != v or v in (float("inf"), float("-inf")):
        return "non_finite"
    return "zero" if v == 0.0 else "present"


def record(session: Session, root: str, vals: Mapping[str, Optional[float]]) -> Dict[str, str]:
    """Writes one gradient fact per parameter; returns key -> state."""
    states = {}
    for key, v in vals.items():
        st = states[key] = state_of(v)
        session.record_gradient(root, key, st, v if st in ("present", "zero") else None)
    return states


def violations(root: str, states: Mapping[str, str], families: Optional[Families]) -> List[str]:
    """What the update's gradients break of the contract (candle-graph's family rules),
    one line per family, naming its parameters."""
    members: Dict[str, List[str]] = {}
    for k in states:
        members.setdefault(family_of(root, k), []).append(k)
    declared = dict(families or {})
    out = []
    for fam, keys in members.items():
        bad = [k for k in keys if states[k] == "non_finite"]
        if bad:
            out.append(f"family {fam}: non-finite gradient in {', '.join(bad)}")
        exp, n = declared.get(fam, ("data_conditional", 1))
        present = [k for k in keys if states[k] == "present"]
        if exp == "active" and len(present) < n:
            absent = [f"{k} ({states[k]})" for k in keys if states[k] != "present"]
            out.append(f"family {fam} is declared active (min_present {n}) but {len(present)} "
                       f"of its parameters got a gradient; without one: {', '.join(absent)}")
        elif exp == "inactive":
            leaked = [f"{k} ({states[k]})" for k in keys if states[k] != "missing"]
            if leaked:
                out.append(f"family {fam} is declared inactive but got gradients: "
                           f"{', '.join(leaked)}")
        elif exp == "data_conditional" and 0 < len(present) < n:
            out.append(f"family {fam} is declared data_conditional (min_present {n}) but only "
                       f"{len(present)} of its parameters got a gradient")
    return out
