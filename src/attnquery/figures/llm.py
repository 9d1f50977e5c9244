"""Figure llm: a real open LLM's attention layers from their modules' output vectors.

Per layer of the checkpoint (SmolLM2-135M by default): (a) the queries the oracle counted, by
stage, for every module fitted; (b) the function's relative error at every length up to the
check's, against the goal, with the attention half of the decoder layer (through RMSNorm)
marked where it is refused by name.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..claims import ROUNDING_FACTOR, Claim, ClaimSet, Number, extra_values
from ..outcomes import error_type
from ..theory import LLM_FUNC_TOL as GOAL
from ._core import register_figure

#: the route's stages, in the order they run, as stacked in the queries panel
STAGES = ("V", "split", "subspaces", "forms", "verify")
#: errors are drawn no lower than this on log axes
FLOOR = 1e-17


def _rows(df):
    rows = df[df["experiment"] == "llm"]
    return rows if len(rows) else None


def _label(row) -> str:
    base = "measured base" if bool(row.get("base_measured", False)) else "declared base"
    answers = "every token's" if row["variant"] == "all" else "last token's"
    return f"{answers} outputs, {base}"


#: the claims of the llm experiment (one function each, named as the claim), on its rows
CLAIMS = ClaimSet(_rows)


@CLAIMS
def llm_modules(rows) -> Claim | None:
    """Every module cell is fitted and reproduces the module within GOAL at every length up to
    its check (a refusal counts against)."""
    mod = rows[rows["family"] == "module"]
    if not len(mod):
        return None
    ok = mod[mod["status"] == "ok"]
    good = ok["func_err"].astype(float) <= GOAL
    layers = sorted({int(x) for x in mod["layer"]})
    longest = int(mod["check_length"].max())
    worst = float(ok["func_err"].max()) if len(ok) else float("nan")
    return Claim(
        "llm_modules",
        f"every attention module run (layers {', '.join(map(str, layers))}) is extracted from "
        f"its output vectors and reproduces the module to relative error at most {GOAL:g} on "
        f"1 to {longest} tokens",
        bool(len(ok) == len(mod) and good.all()),
        f"{int(good.sum())}/{len(mod)} cells (worst {worst:.2e}); "
        f"{len(mod) - len(ok)} refused",
        numbers=(Number("llmModules", len(mod), "cells", "d", rows="llm, module"),
                 Number("llmCheckLength", longest, "tokens", "d", rows="llm, module"),
                 Number("llmWorstFunctionalError", worst, "relative functional error", ".2g",
                        rows="llm, module, status ok, largest func_err",
                        factor=ROUNDING_FACTOR),
                 Number("llmQueriesMax", int((ok["n_queries"] + ok["verify_queries"]).max())
                        if len(ok) else 0, "queries", "d",
                        rows="llm, module, status ok, n_queries + verify_queries")),
    )


@CLAIMS
def llm_half_refused(rows) -> Claim | None:
    """Through RMSNorm (the attention half of the decoder layer) the route refuses by name: no
    answer is returned (a ModelMismatchError row)."""
    half = rows[rows["family"] == "half"]
    if not len(half):
        return None
    names = [error_type(m if isinstance(m, str) else None) for m in half["message"]]
    refused = [s == "error" and t is not None and t.__name__ == "ModelMismatchError"
               for s, t in zip(half["status"], names, strict=True)]
    return Claim(
        "llm_half_refused",
        "through RMSNorm (the attention half of the decoder layer) the route returns no "
        "answer: every such cell is refused by name (ModelMismatchError)",
        bool(all(refused)),
        f"{sum(refused)}/{len(half)} cells refused",
        numbers=(Number("llmHalfRefused", int(sum(refused)), "cells", "d",
                        rows="llm, half, ModelMismatchError"),),
    )


def llm_claims(df) -> list[Claim]:
    """The claims of the llm experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


LLM_CAPTION = """\
**A real open LLM (beyond the paper).** SmolLM2-135M (Llama architecture: d = 576, 9 query
heads over 3 key/value heads of 64, RoPE base 1e5, no biases), read from its GGUF file and
dequantized to float64. ``VectorLayerLearner`` (rotary positions, the file's heads,
``fit_bias=False``) reads each layer's attention module from its output vectors. (a) Queries
counted by the oracle per layer, by stage. (b) The function's relative error on fresh Gaussian
sequences of 1 to ``check_length`` tokens (the fit claims nothing beyond), against the goal;
a cross marks the attention half of the decoder layer, x + self_attn(RMSNorm(x)), refused by
name (through the norm no token saturates a head).
"""


@register_figure("llm", experiments=["llm"], category="Real heads", caption=LLM_CAPTION)
def llm(df):
    """Per layer: queries by stage and the function's error; the attention half refused."""
    claims = llm_claims(df)
    rows = _rows(df)
    fig, axes = plt.subplots(1, 2, figsize=(6.75, 2.8), layout="constrained")
    mod = (rows[(rows["family"] == "module") & (rows["status"] == "ok")]
           if rows is not None else None)
    layers = sorted({int(x) for x in rows["layer"]}) if rows is not None else []
    ax = axes[0]
    if mod is not None and len(mod):
        first = mod.drop_duplicates("layer").sort_values("layer")
        bottom = np.zeros(len(first))
        for k, stage in enumerate(STAGES):
            vals = np.array([q.get(stage, 0) for q in extra_values(first, "queries_by_stage")],
                            dtype=float)
            ax.bar(first["layer"], vals, bottom=bottom, color=f"C{k}", label=stage)
            bottom += vals
        ax.legend(fontsize=6, loc="lower right")
    ax.set(xlabel="layer", ylabel="queries counted by the oracle",
           title="(a) Queries by stage (every token's outputs)")
    ax = axes[1]
    if mod is not None and len(mod):
        for k, (label, g) in enumerate(mod.groupby(mod.apply(_label, axis=1), sort=True)):
            ax.plot(g["layer"], np.maximum(g["func_err"].astype(float), FLOOR), "os^v"[k % 4],
                    color=f"C{k}", label=label)
    if rows is not None:
        half = rows[(rows["family"] == "half") & (rows["status"] != "ok")]
        if len(half):
            ax.plot(half["layer"], np.full(len(half), 1.0), "x", color="k", ms=7,
                    label="attention half: refused")
    ax.axhline(GOAL, color="k", ls="--", lw=0.8, label=f"goal {GOAL:g}")
    ax.set(yscale="log", xlabel="layer", ylabel="relative error of the function",
           title="(b) Function, 1 to check_length tokens")
    ax.set_ylim(FLOOR, 10.0)
    ax.legend(fontsize=6, loc="center right")
    for a in axes:
        if layers:
            a.set_xticks(layers)
            a.set_xlim(min(layers) - 0.8, max(layers) + 0.8)
        a.title.set_fontsize(8)
    return fig, claims
