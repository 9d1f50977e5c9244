"""Figure llm: a real open LLM's attention layers from their output vectors.

Per layer of the checkpoint (SmolLM2-135M by default): (a) the queries the oracle counted, by
stage, for every attention module and attention half (through RMSNorm) fitted; (b) the
function's relative error at every length up to the check's, against the goal.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..claims import ROUNDING_FACTOR, Claim, ClaimSet, Number, extra_values
from ..theory import LLM_FUNC_TOL as GOAL
from ..theory import LLM_NORM_FUNC_TOL as NORM_GOAL
from ._core import register_figure

#: the route's stages, in the order they run, as stacked in the queries panel
STAGES = ("V", "split", "subspaces", "forms", "verify")
#: errors are drawn no lower than this on log axes
FLOOR = 1e-17
#: the attention half's eps, read from one-token answers, against the file's (relative)
EPS_TOL = 1e-6


def _rows(df):
    rows = df[df["experiment"] == "llm"]
    return rows if len(rows) else None


#: the boxes, as the figure names them
BOX_NAMES = {"module": "module", "half": "x + attn(RMSNorm(x))"}


def _label(row) -> str:
    base = "measured base" if bool(row.get("base_measured", False)) else "declared base"
    answers = "every token's" if row["variant"] == "all" else "last token's"
    return f"{BOX_NAMES.get(row['family'], row['family'])}: {answers} outputs, {base}"


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
def llm_half(rows) -> Claim | None:
    """Every attention half cell (x + self_attn(RMSNorm(x))) is fitted through the norm, its
    eps read to EPS_TOL of the file's, and reproduces the attention's part of the answers
    within NORM_GOAL at every length up to its check (a refusal counts against)."""
    half = rows[rows["family"] == "half"]
    if not len(half):
        return None
    ok = half[half["status"] == "ok"]
    eps = [abs(float(a) - float(b)) / float(b) for a, b in
           zip(extra_values(ok, "norm_eps", np.nan), extra_values(ok, "file_rms_eps", np.nan),
               strict=True)]
    good = (ok["func_err"].astype(float) <= NORM_GOAL).to_numpy() & (np.array(eps) <= EPS_TOL)
    worst = float(ok["func_err"].max()) if len(ok) else float("nan")
    layers = sorted({int(x) for x in half["layer"]})
    return Claim(
        "llm_half",
        f"through RMSNorm, every attention half of a decoder layer run (layers "
        f"{', '.join(map(str, layers))}) is extracted from its output vectors without "
        f"saturating a head: the norm's eps is read to {EPS_TOL:g} (relative) and the "
        f"attention's outputs reproduced to relative error at most {NORM_GOAL:g} on 1 to "
        f"{int(half['check_length'].max())} tokens",
        bool(len(ok) == len(half) and good.all()),
        f"{int(good.sum())}/{len(half)} cells (worst {worst:.2e}, eps to "
        f"{max(eps, default=float('nan')):.1e}); {len(half) - len(ok)} refused",
        numbers=(Number("llmHalfCells", len(half), "cells", "d", rows="llm, half"),
                 Number("llmHalfWorstFunctionalError", worst, "relative functional error",
                        ".2g", rows="llm, half, status ok, largest func_err",
                        factor=ROUNDING_FACTOR),
                 Number("llmHalfQueriesMax", int((ok["n_queries"] + ok["verify_queries"]).max())
                        if len(ok) else 0, "queries", "d",
                        rows="llm, half, status ok, n_queries + verify_queries"),
                 Number("llmHalfEpsError", max(eps, default=float("nan")),
                        "relative error of eps", ".1g",
                        rows="llm, half, status ok, |norm_eps - file_rms_eps| / file_rms_eps",
                        factor=ROUNDING_FACTOR)),
    )


def llm_claims(df) -> list[Claim]:
    """The claims of the llm experiment (:data:`CLAIMS`), checked on its rows."""
    return CLAIMS.of_rows(df)


LLM_CAPTION = """\
**A real open LLM (beyond the paper).** SmolLM2-135M (Llama architecture: d = 576, 9 query
heads over 3 key/value heads of 64, RoPE base 1e5, RMSNorm, no biases), read from its GGUF
file and dequantized to float64. ``VectorLayerLearner`` (rotary positions, the file's heads,
``fit_bias=False``) reads each layer's attention module from its output vectors, and the
attention half of the decoder layer, x + self_attn(RMSNorm(x)), through its norm
(``input_norm="rms"``, ``residual=True``: no token saturates a head; the gain is folded into
the fitted maps and eps measured). (a) Queries counted by the oracle per layer, by stage
(hatched: through the norm). (b) The function's relative error on fresh Gaussian sequences of
1 to ``check_length`` tokens (the fit claims nothing beyond; for the half, of the attention's
part of its outputs), against the goal (dotted: the claim through the norm); a cross marks a
refused cell.
"""


@register_figure("llm", experiments=["llm"], category="Real heads", caption=LLM_CAPTION)
def llm(df):
    """Per layer: queries by stage and the function's error, module and attention half."""
    claims = llm_claims(df)
    rows = _rows(df)
    fig, axes = plt.subplots(1, 2, figsize=(6.75, 2.8), layout="constrained")
    mod = rows[rows["status"] == "ok"] if rows is not None else None
    layers = sorted({int(x) for x in rows["layer"]}) if rows is not None else []
    ax = axes[0]
    if mod is not None and len(mod):
        boxes = [f for f in BOX_NAMES if f in set(mod["family"])]
        width = 0.8 / len(boxes)
        for j, family in enumerate(boxes):
            first = (mod[mod["family"] == family].drop_duplicates("layer")
                     .sort_values("layer"))
            at = first["layer"].to_numpy(dtype=float) + (j - (len(boxes) - 1) / 2) * width
            bottom = np.zeros(len(first))
            for k, stage in enumerate(STAGES):
                vals = np.array([q.get(stage, 0) for q in
                                 extra_values(first, "queries_by_stage")], dtype=float)
                ax.bar(at, vals, width=width * 0.9, bottom=bottom, color=f"C{k}",
                       hatch="//" if family == "half" else None, edgecolor="white", lw=0.3,
                       label=stage if j == 0 else None)
                bottom += vals
        ax.legend(fontsize=6, loc="lower right", title="hatched: through RMSNorm"
                  if "half" in boxes else None, title_fontsize=6)
    ax.set(xlabel="layer", ylabel="queries counted by the oracle",
           title="(a) Queries by stage (every token's outputs)")
    ax = axes[1]
    if mod is not None and len(mod):
        for k, (label, g) in enumerate(mod.groupby(mod.apply(_label, axis=1), sort=True)):
            ax.plot(g["layer"], np.maximum(g["func_err"].astype(float), FLOOR), "os^v"[k % 4],
                    color=f"C{k}", label=label)
    if rows is not None:
        bad = rows[rows["status"] != "ok"]
        if len(bad):
            ax.plot(bad["layer"], np.full(len(bad), 1.0), "x", color="k", ms=7,
                    label="refused")
    ax.axhline(GOAL, color="k", ls="--", lw=0.8, label=f"goal {GOAL:g}")
    if mod is not None and (mod["family"] == "half").any():
        ax.axhline(NORM_GOAL, color="k", ls=":", lw=0.8, label=f"through the norm {NORM_GOAL:g}")
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
