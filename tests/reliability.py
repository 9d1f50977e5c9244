"""The table of docs/reliability.md: every learner on every black box of tests/boxes.py.

Run ``python -m tests.reliability [--seeds S]`` from the repository root (about 30 s a seed on
one core). Each
learner is fitted at d = 8 (d = 8 and two heads for the multi-head learners) on the box that it
assumes and on each wrong box; a cell is the named error it raised, or "agrees" / "WRONG" with
the relative functional error of what it returned, measured on 1 to 64-token inputs that the
learner never saw (:func:`agreement`), or "VacuousCheckWarning" (with that error) when the learner
returned with a warning that its check could not fail (``verify_vacuous_``). "WRONG" is a silent
wrong answer: the table must have none.

The learners are those of the registry (:func:`attnquery.learners.registry`, plug-ins included):
a row of :data:`LEARNERS` (its first word the learner's name), a row its spec gives
(:func:`spec_row`), or a reason in :data:`EXEMPT`; :func:`uncovered` names any other.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np

from attnquery.errors import AttnQueryError, ConfigError, VacuousCheckWarning
from attnquery.learners import registry
from attnquery.learners._base import output_error_bound
from attnquery.learners._registry import get_entry
from attnquery.models import (
    AttentionHead,
    orthogonal_subspace_multihead,
    random_head,
    random_multihead,
    random_rotary_head,
    random_transformer,
    random_v,
)
from attnquery.oracles import MembershipOracle, ValueOracle
from tests.boxes import (
    ARCHITECTURE_BOXES,
    biased_head,
    in_dtype,
    relative_noise,
    three_heads,
    two_heads,
)

D = 8
#: the lengths on which a returned estimate is compared with the box
AGREEMENT_LENGTHS = (1, 2, 3, 4, 5, 8, 16, 32, 64)


def _noisy_head(d, seed):
    return AttentionHead(random_v(d, seed, mu=0.2) / np.sqrt(d),
                         W=random_head(d, seed=seed, W_fro=3.0).W)


def _membership_head(d, seed):
    v = random_v(d, seed, mu=0.5)
    return AttentionHead(v / np.linalg.norm(v), W=random_head(d, seed=seed, W_fro=2.0).W)


def _learner(name: str, **params):
    """A maker of the registered learner ``name`` (:func:`attnquery.learners.get_entry`) with
    ``params``, seeded."""
    return lambda: get_entry(name).make(random_state=0, **params)


#: row -> (make learner, the box it assumes (d, seed), membership answers); a row's first word
#: is the registered learner's name
LEARNERS = {
    "exact": (_learner("exact"), random_head, False),
    "exact fit_bias": (_learner("exact", fit_bias=True), random_head, False),
    "sketch": (_learner("sketch"), lambda d, s: random_head(d, seed=s, rank=2), False),
    "sketch fit_bias": (_learner("sketch", fit_bias=True),
                        lambda d, s: random_head(d, seed=s, rank=2), False),
    "nuclear": (_learner("nuclear"), lambda d, s: random_head(d, seed=s, rank=1), False),
    "noisy tau=1e-6": (_learner("noisy", W_bound=8.0, mu=0.01, tau=1e-6), _noisy_head, False),
    "noisy tau=5e-3": (_learner("noisy", W_bound=8.0, mu=0.01, tau=5e-3), _noisy_head, False),
    "lowprecision": (_learner("lowprecision", n_queries=16 * (D * D + D)), random_head, False),
    "membership": (_learner("membership", eps=1e-3, W_bound=8.0, mu=0.01), _membership_head,
                   True),
    "transformer": (_learner("transformer"), lambda d, s: random_transformer(d, 3, s), False),
    "orthogonal": (_learner("orthogonal", n_heads=2),
                   lambda d, s: orthogonal_subspace_multihead(d, 2, s), False),
    "multihead": (_learner("multihead", n_heads=2), lambda d, s: random_multihead(d, 2, s),
                  False),
    "layer": (_learner("layer", n_heads=2),
              lambda d, s: random_multihead(d, 2, s, rank=d // 2), False),
    # a rotary head depends on positions: its check asks no permuted copies
    "rotary": (_learner("rotary"), lambda d, s: random_rotary_head(d, s), False),
}

#: registered learners measured in no row, and why
EXEMPT = {
    "relu": "a ReLU network's box takes one vector: the transformer row covers it",
    "vector": "vector answers: tests/test_vector_learner.py refuses the same boxes by name",
}


def spec_row(entry):
    """The row of a registered learner that :data:`LEARNERS` does not list, from its spec: a
    learner of one head from value answers is fitted with its defaults (seeded where it takes
    ``random_state``) on a random head. None for any other learner, and for one that cannot be
    loaded: it needs a row of its own or an entry in :data:`EXEMPT`."""
    try:
        spec = entry.spec
        params = entry.parameters()
    except ConfigError:
        return None
    if spec.oracle != "value" or spec.returns != "head":
        return None
    seeded = {"random_state": 0} if "random_state" in params else {}
    return (lambda: entry.make(**seeded), random_head, False)


def learner_rows(reg=None) -> dict:
    """:data:`LEARNERS`, and a row (:func:`spec_row`) for each learner of the registry ``reg``
    (default: :func:`attnquery.learners.registry`, plug-ins included) that no row names and
    :data:`EXEMPT` does not list."""
    reg = registry() if reg is None else reg
    rows = dict(LEARNERS)
    named = {row.split()[0] for row in LEARNERS}
    for name, entry in reg.items():
        if name not in named and name not in EXEMPT and (row := spec_row(entry)) is not None:
            rows[name] = row
    return rows


def uncovered(reg=None) -> list[str]:
    """The learners of the registry ``reg`` (default: the registry, plug-ins included) that no
    row of :func:`learner_rows` measures and :data:`EXEMPT` does not list: a learner added
    without a reliability row."""
    reg = registry() if reg is None else reg
    measured = {row.split()[0] for row in learner_rows(reg)}
    return sorted(name for name in reg if name not in measured and name not in EXEMPT)


#: box -> builder (d, seed)
BOXES = {
    "two heads": two_heads,
    "three heads": three_heads,
    "biased head": biased_head,
    "noise 1e-4": lambda d, s: relative_noise(random_head(d, seed=s), 1e-4, s),
    "float32": lambda d, s: in_dtype(random_head(d, seed=s), np.float32),
    "float16": lambda d, s: in_dtype(random_head(d, seed=s), np.float16),
    **{name.replace("_", " "): make for name, make in ARCHITECTURE_BOXES.items()},
}
#: the boxes' own relative imprecision (an estimate within 20 times of it agrees)
IMPRECISION = {"noise 1e-4": 1e-4, "float32": 2.0**-24, "float16": 2.0**-11}


def agreement(est, box, d: int, signs: bool = False, seed: int = 99,
              rel: float = 0.0) -> tuple[float, bool]:
    """How far a returned estimate is from the box on fresh random queries of every length in
    :data:`AGREEMENT_LENGTHS` (16 of each): the relative functional error (max |diff| / max |y|)
    and whether that agrees: within 1e-6 relative or 20 times the box's own imprecision
    ``rel``, or within the error the learner states it can have (tau plus its per-entry
    bounds carried to the outputs, the noisy learner), or, for
    signs, no sign differs where the estimate's value exceeds 1e-2 of its largest."""
    rng = np.random.default_rng(seed)
    err, ok = 0.0, True
    for n in AGREEMENT_LENGTHS:
        X = rng.standard_normal((16, n, d)) / np.sqrt(d)
        y, yhat = np.asarray(box(X), dtype=float), np.asarray(est.predict(X), dtype=float)
        if signs:
            sure = np.abs(yhat) > 1e-2 * np.max(np.abs(yhat))
            wrong = float(np.mean(sure & ((y > 0) != (yhat > 0))))
            err, ok = max(err, wrong), ok and wrong == 0.0
            continue
        scale = max(float(np.max(np.abs(y))), 1e-300)
        diff = np.abs(y - yhat)
        err = max(err, float(np.max(diff)) / scale)
        allowed = np.full(len(X), max(1e-6, 20 * rel) * scale)
        if hasattr(est, "err_W_") and hasattr(est, "tau_"):
            allowed = np.maximum(allowed, est.tau_ + output_error_bound(
                X, est.v_, est.err_W_, est.err_v_))
        ok = ok and bool(np.all(diff <= allowed))
    return err, ok


def run_cell(learner: str, box_name: str | None, d: int = D, seed: int = 0) -> dict:
    """Fit one learner on one box (``None``: the box it assumes); returns the outcome."""
    make, own, signs = learner_rows()[learner]
    box = own(d, seed) if box_name is None else BOXES[box_name](d, seed)
    oracle = (MembershipOracle if signs else ValueOracle)(box, d)
    est = make()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            est.fit(oracle)
        except ConfigError:  # the parameters are valid: never a refusal of the box
            raise
        except AttnQueryError as exc:
            return {"outcome": type(exc).__name__, "error": None, "agrees": None,
                    "vacuous": None, "wall": time.perf_counter() - t0}
    err, ok = agreement(est, box, d, signs, rel=IMPRECISION.get(box_name, 0.0))
    vacuous = any(issubclass(w.category, VacuousCheckWarning) for w in caught)
    vacuous = vacuous or bool(getattr(est, "verify_vacuous_", False))
    # a returned estimate whose check could not fail is flagged, hence not silent
    outcome = "VacuousCheckWarning" if vacuous else ("agrees" if ok else "WRONG")
    return {"outcome": outcome, "error": err, "agrees": ok, "vacuous": vacuous,
            "wall": time.perf_counter() - t0}


def cell_text(r: dict) -> str:
    if r["error"] is None:
        return r["outcome"]
    return f"{r['outcome']} ({r['error']:.1g})"


def table(d: int = D, seeds=(0,), learners=None, boxes=None) -> tuple[list[str], dict]:
    """Rows: the box each learner assumes, then every box of :data:`BOXES`; one column per
    learner; each cell over ``seeds`` (the outcomes, with how many seeds gave each when there
    are several). Returns the header and {"rows": {row: [cell, ...]}, "raw": {(row, learner):
    [outcome dict per seed]}}."""
    learners = list(learner_rows()) if learners is None else list(learners)
    boxes = list(BOXES) if boxes is None else list(boxes)
    rows, raw = {}, {}
    for b in [None, *boxes]:
        name = "the box it assumes" if b is None else b
        cells = []
        for learner in learners:
            rs = [run_cell(learner, b, d, seed) for seed in seeds]
            raw[(name, learner)] = rs
            if len(rs) == 1:
                cells.append(cell_text(rs[0]))
                continue
            parts = []
            for outcome in dict.fromkeys(r["outcome"] for r in rs):
                same = [r for r in rs if r["outcome"] == outcome]
                errs = [r["error"] for r in same if r["error"] is not None]
                parts.append(f"{outcome} {len(same)}" + (f" ({max(errs):.1g})" if errs else ""))
            cells.append(", ".join(parts))
        rows[name] = cells
    return learners, {"rows": rows, "raw": raw}


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.reliability", description=__doc__)
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0 .. SEEDS - 1 (default 1)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    learners, out = table(seeds=range(args.seeds))
    seeds = "seed 0" if args.seeds == 1 else f"seeds 0 to {args.seeds - 1}"
    print(f"d = {D}, {seeds} (python -m tests.reliability --seeds {args.seeds}; "
          f"{time.perf_counter() - t0:.0f} s)\n")
    print("| box | " + " | ".join(learners) + " |")
    print("|---|" + "---|" * len(learners))
    for name, cells in out["rows"].items():
        print(f"| {name} | " + " | ".join(cells) + " |")
    wrong = [(k, i) for k, rs in out["raw"].items() for i, r in enumerate(rs)
             if r["outcome"] == "WRONG"]
    n = sum(len(rs) for rs in out["raw"].values())
    print(f"\nsilent wrong answers: {len(wrong)} of {n} fits {wrong if wrong else ''}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
