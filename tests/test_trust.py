"""Trust boundaries: a learner sees answers only, and nothing the project loads is unpickled."""

import re
from pathlib import Path

import numpy as np

from attnquery.learners import ExactValueQueryLearner
from attnquery.metrics import relative_error
from attnquery.models import AttentionHead, random_head
from attnquery.oracles import ValueOracle


def _public_reachable(obj, depth=3):
    """Everything reachable from ``obj`` through public attributes (what a learner may use)."""
    seen, out, frontier = set(), [], [obj]
    for _ in range(depth):
        nxt = []
        for o in frontier:
            if id(o) in seen:
                continue
            seen.add(id(o))
            out.append(o)
            for name in dir(o):
                if name.startswith("_"):
                    continue
                try:
                    val = getattr(o, name)
                except Exception:
                    continue
                if callable(val) and not isinstance(val, np.ndarray):
                    continue
                nxt.append(val)
        frontier = nxt
    return out


def test_a_learner_finds_no_parameters_through_the_oracle():
    head = random_head(6, seed=0)
    oracle = ValueOracle(head, 6)
    reached = _public_reachable(oracle)
    assert not any(isinstance(o, AttentionHead) for o in reached)
    for o in reached:
        if isinstance(o, np.ndarray) and o.size:
            assert not np.array_equal(o, head.v) and not np.array_equal(o, head.W)
    # the oracle has no instance dictionary to browse, and no attribute naming the model
    assert not hasattr(oracle, "__dict__")
    assert not any(n in dir(oracle) for n in ("fn", "model", "W", "v", "head"))
    # ... and the learner still recovers the head from the answers alone
    est = ExactValueQueryLearner(random_state=0).fit(oracle)
    assert relative_error(est.W_, head.W) <= 1e-10


def test_a_plain_function_is_enough():
    rng = np.random.default_rng(1)
    W, v = rng.standard_normal((5, 5)), rng.standard_normal(5)
    f = AttentionHead(v, W=W)

    def black_box(X):  # no model object at all: only numbers come back
        return np.asarray(f(X))

    est = ExactValueQueryLearner(probes="basis").fit(ValueOracle(black_box, 5))
    assert relative_error(est.W_, W) <= 1e-10


def test_nothing_is_unpickled(repo):
    offenders = []
    for p in sorted(Path(repo, "src").rglob("*.py")) + sorted(Path(repo, "workflow").rglob("*")):
        if not p.is_file() or p.suffix not in (".py", ".smk", ""):
            continue
        text = p.read_text(encoding="utf-8", errors="ignore")
        if re.search(r"allow_pickle\s*=\s*True|pickle\.loads?\(|import pickle|torch\.load", text):
            offenders.append(str(p))
        for m in re.finditer(r"np\.load\(([^)]*)\)", text):
            if "allow_pickle=False" not in m.group(1):
                offenders.append(f"{p}: {m.group(0)}")
    assert not offenders, offenders
