"""Two-row probes: the measurement every value-query learner of a single head is built on.

A probe ``[(c u + s b); s b]`` gives the attention weight ``alpha = sigma(c s u^T W b)`` on its
first row, and its answer ``y = s b^T v + alpha c u^T v`` gives ``alpha`` once v is known; so one
value query measures one bilinear form ``u^T W b`` (paper Theorem 4.1 with ``b = e_j``). The
scale ``kappa = c s`` keeps logits where the sigmoid can be inverted and is learnt from the
answers (:class:`Prober`); the ratio ``c / s`` keeps ``s b^T v`` from swamping ``c u^T v``.
Probes that share a last token ask it identically, so a black box that caches per-token work
evaluates it once.

A head with a key bias c and an offset beta (``f = softmax(X (W x_N + c))^T (X v) + beta``)
answers the same probe with ``y = beta + s b^T v + alpha c u^T v`` and
``alpha = sigma(c s u^T W b + c u^T c)``: once beta and c are known, the offset is subtracted
from the answer and ``c u^T c`` from the logit (:class:`Prober` with ``key_bias`` and
``offset``). The bias itself is read from probes ``[c u; 0]`` whose last token is zero, with
logit ``c u^T c`` (``make`` returning ``None`` for the last tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

import numpy as np

from ..errors import AssumptionViolation, ConfigError, NotIdentifiableError
from ._base import chunk_slices
from ._params import Interval

__all__ = ["read_v", "read_key_bias", "read_head_constants", "HeadConstants", "pivot_directions",
           "check_v", "unit_directions", "balanced_orthonormal",
           "SparseRows",
           "coordinate_rows", "rows_dot", "probe_logits", "Prober", "check_probe_params",
           "PROBE_PARAMS", "ZERO_TOL_PARAM",
           "ZERO_LOGIT"]

#: logits at or below this are rounding noise of alpha = 1/2 (a zero bilinear form)
ZERO_LOGIT = 1e-12


#: the constraints of the probe parameters a Prober-based learner shares (its
#: ``_parameter_constraints`` include them); :func:`check_probe_params` joins the two logits
PROBE_PARAMS = {
    "max_logit": [Interval(Real, 1, 30, closed="both")],
    "min_logit": [Interval(Real, 0, 30, closed="neither")],
    "initial_logit_scale": [Interval(Real, 0, None, closed="neither")],
}
#: the constraint of ``zero_tol`` (relative size below which an entry of v counts as zero)
ZERO_TOL_PARAM = Interval(Real, 0, 1, closed="left")


def check_probe_params(learner) -> None:
    """The rule joining a learner's probe parameters (each already valid by
    :data:`PROBE_PARAMS`): ``min_logit`` below ``max_logit``; raise :class:`ConfigError`."""
    if not learner.min_logit < learner.max_logit:
        raise ConfigError(f"min_logit must be below max_logit = {learner.max_logit:g}; got "
                          f"{learner.min_logit!r}")


def read_v(oracle, d: int, offset: bool = False):
    """Read v from the d one-row queries ``[e_i]`` (Theorem 4.1, phase 1).

    With ``offset``, the head may add a constant beta to every answer: one more one-row query,
    the zero token ``[0]`` (whose answer is beta alone), is asked first, and ``(v, beta)`` is
    returned (``d + 1`` queries).
    """
    if not offset:
        return oracle(np.eye(d)[:, None, :].copy())
    X = np.zeros((d + 1, 1, d))
    X[np.arange(1, d + 1), 0, np.arange(d)] = 1.0
    y = oracle(X)
    return y[1:] - y[0], float(y[0])


def read_key_bias(oracle, v: np.ndarray, beta: float, chunk: int, *, max_logit: float,
                  min_logit: float):
    """Read the key bias c from d probes ``[kappa a_m; 0]`` (logit ``kappa a_m^T c``).

    The answer ``beta + alpha kappa a_m^T v`` carries ``a_m^T v`` in its signal, so every
    direction is ``a_m = e_m + sigma_m e_p`` with ``p = argmax |v_i|`` and the sign
    ``sigma_m = sign(v_m v_p)`` (``a_p = e_p``): ``|a_m^T v| >= max |v_i|`` for every m, where
    the coordinate directions ``e_m`` would read c through ``v_m``, as small as rounding. Then
    ``c_p = t_p`` and ``c_m = t_m - sigma_m t_p``. The probes start at ``kappa = 1`` (a token of
    unit norm) and a pilot of 32 probes sets the scale of the rest (:class:`Prober`).

    Returns
    -------
    c : ndarray (d,)
    prober : Prober
        The prober used (its ``n_requeried`` counts probes asked twice).
    """
    d = v.size
    p, sig = pivot_directions(v)
    rows = np.arange(d)
    extra = np.flatnonzero(sig)

    def make(idx):
        m = rows[idx]
        ex = extra[np.isin(extra, m)]
        pos = np.searchsorted(m, ex)
        A = SparseRows((m.size, d), np.concatenate([np.arange(m.size), pos]),
                       np.concatenate([m, np.full(ex.size, p)]),
                       np.concatenate([np.ones(m.size), sig[ex]]))
        return A, None

    prober = Prober(oracle, v, initial_logit_scale=1.0, max_logit=max_logit,
                    min_logit=min_logit, chunk=chunk, pilot=32, target=1.0, offset=beta)
    t = prober.measure(make, d)
    return t - sig * t[p], prober


def pivot_directions(v: np.ndarray, zero_tol: float | None = None) -> tuple[int, np.ndarray]:
    """The pivot design of the probe directions ``u_j = e_j + coef_j e_p``.

    ``p = argmax |v_i|``. Signed (``zero_tol`` None, the design of a head with an offset):
    ``coef_j = sign(v_j v_p)`` (+1 where ``v_j = 0``) for every ``j != p``, so that
    ``|u_j^T v| = |v_j| + |v_p| >= max |v_i|``. With ``zero_tol``: ``coef_j = 1`` only where
    ``|v_j| < zero_tol max |v_i|`` (``u_j = e_j`` elsewhere, the paper's basis design). Always
    ``coef_p = 0``, so ``u_j^T x = x_j + coef_j x_p`` is undone by ``t_j - coef_j t_p``.

    Returns
    -------
    p : int
    coef : ndarray (d,)
    """
    p = int(np.argmax(np.abs(v)))
    if zero_tol is None:
        coef = np.where(v * v[p] < 0, -1.0, 1.0)
    else:
        coef = (np.abs(v) < zero_tol * np.max(np.abs(v))).astype(float)
    coef[p] = 0.0
    return p, coef


@dataclass(frozen=True)
class HeadConstants:
    """What a head's probes need before any probe of W: v, the offset beta and the key bias c.

    Attributes
    ----------
    v : ndarray (d,)
    offset : float
        beta (0 when the head was read without biases).
    key_bias : ndarray (d,) or None
        c (None when the head was read without biases).
    n_requeried : int
        Key-bias probes asked twice (:class:`Prober`).
    """

    v: np.ndarray
    offset: float
    key_bias: np.ndarray | None
    n_requeried: int = 0

    def key_bias_or_zero(self) -> np.ndarray:
        """``key_bias``, or zeros for a head read without biases (the fitted ``key_bias_``)."""
        return np.zeros(self.v.size) if self.key_bias is None else self.key_bias


def read_head_constants(oracle, d: int, *, bias: bool, key_bias: bool | None = None,
                        chunk: int = 1, max_logit: float = 10.0,
                        min_logit: float = 1e-5) -> HeadConstants:
    """Read v (:func:`read_v`), and with ``bias`` the offset beta and the key bias c
    (:func:`read_key_bias`), in that order: ``d`` queries, or ``2 d + 1`` with ``bias``.

    ``key_bias`` (default: ``bias``) False reads v and beta only (a layer reads each head's key
    bias along its own subspace). Raises :class:`NotIdentifiableError` when v = 0
    (:func:`check_v`), before any key-bias probe.
    """
    key_bias = bias if key_bias is None else key_bias
    if bias:
        v, beta = read_v(oracle, d, offset=True)
    else:
        v, beta = read_v(oracle, d), 0.0
    check_v(v)
    if not (bias and key_bias):
        return HeadConstants(v, float(beta), None)
    c, prober = read_key_bias(oracle, v, beta, chunk, max_logit=max_logit,
                              min_logit=min_logit)
    return HeadConstants(v, float(beta), c, int(prober.n_requeried))


def check_v(v: np.ndarray) -> float:
    """Return ``max |v_i|``; raise :class:`NotIdentifiableError` when v = 0."""
    vmax = float(np.max(np.abs(v)))
    if vmax == 0.0:
        raise NotIdentifiableError(
            "v = 0: every answer is 0, so W is not identifiable from value queries"
        )
    return vmax


def unit_directions(n: int, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``n`` random unit vectors ``a`` with ``|a^T v|`` not far below its typical size.

    ``|a^T v|`` for a random unit ``a`` is about ``||v|| / sqrt(d)``; a direction with a tiny
    ``a^T v`` divides the answer by a tiny number, so such draws are redrawn (this costs no
    query).
    """
    d = v.size
    A = rng.standard_normal((n, d))
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    vn = v / np.linalg.norm(v)
    floor = 0.05 / np.sqrt(d)
    for _ in range(100):
        bad = np.abs(A @ vn) < floor
        if not bad.any():
            break
        G = rng.standard_normal((int(bad.sum()), d))
        A[bad] = G / np.linalg.norm(G, axis=1, keepdims=True)
    return A


def balanced_orthonormal(v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random orthonormal basis (rows) with every ``|u^T v|`` equal to ``||v|| / sqrt(d)``.

    A Haar-distributed orthogonal matrix (QR of a Gaussian matrix, signs fixed by the diagonal
    of R), reflected by the Householder map that takes ``R v / ||v||`` to a vector of equal
    magnitudes and random signs. Its condition number is 1, and no row divides an answer by a
    small ``u^T v``. ``v`` must be nonzero.
    """
    from ..rng import haar_orthogonal

    d = v.size
    R = haar_orthogonal(d, rng).T  # Haar-distributed orthogonal rows
    vn = v / np.linalg.norm(v)
    w = rng.choice([-1.0, 1.0], size=d) / np.sqrt(d)
    h = R @ vn - w  # Householder reflection taking R v to w
    nh = np.linalg.norm(h)
    if nh > 0:
        h /= nh
        R = R - 2.0 * np.outer(h, h @ R)
    return R


class SparseRows:
    """``n`` rows of length ``d`` with a few nonzeros each, as (row, column, value) triplets.

    The probes' coordinate directions and tokens (``e_j``, ``e_j + e_p``) in this form cost
    O(nonzeros) to build, to multiply by a vector and to add into a batch of queries.
    Triplets are sorted by row.
    """

    __slots__ = ("shape", "row", "col", "val")

    def __init__(self, shape, row, col, val):
        self.shape = (int(shape[0]), int(shape[1]))
        order = np.argsort(row, kind="stable")
        self.row = np.asarray(row, dtype=np.intp)[order]
        self.col = np.asarray(col, dtype=np.intp)[order]
        self.val = np.asarray(val, dtype=float)[order]

    def __matmul__(self, v: np.ndarray) -> np.ndarray:
        return np.bincount(self.row, weights=self.val * v[self.col], minlength=self.shape[0])

    def __getitem__(self, mask) -> SparseRows:
        """The rows selected by a boolean mask, in order."""
        mask = np.asarray(mask, dtype=bool)
        new_index = np.cumsum(mask) - 1
        keep = mask[self.row]
        return SparseRows((int(mask.sum()), self.shape[1]), new_index[self.row[keep]],
                          self.col[keep], self.val[keep])

    def add_to(self, out: np.ndarray, coef: np.ndarray) -> None:
        """``out += coef[:, None] * self`` on a dense (n, d) array (touches the nonzeros)."""
        np.add.at(out, (self.row, self.col), coef[self.row] * self.val)

    def toarray(self) -> np.ndarray:
        """The rows as a dense (n, d) array."""
        out = np.zeros(self.shape)
        self.add_to(out, np.ones(self.shape[0]))
        return out


def coordinate_rows(cols, d: int) -> SparseRows:
    """The coordinate rows ``e_{cols[k]}`` (n, d)."""
    cols = np.asarray(cols, dtype=np.intp)
    return SparseRows((cols.size, d), np.arange(cols.size), cols, np.ones(cols.size))


def rows_dot(M, v: np.ndarray) -> np.ndarray:
    """``M @ v`` for rows given densely, as one broadcast row (stride 0) or sparse."""
    if isinstance(M, np.ndarray) and M.shape[0] > 1 and M.strides[0] == 0:
        return np.full(M.shape[0], M[0] @ v)
    return M @ v


def probe_logits(oracle, U, cols, c, s, v, last=None, uv=None, lastv=None, offset=0.0):
    """Ask the two-row probes ``[(c_k U[k] + s_k e_j); s_k e_j]`` and return their logits.

    Parameters
    ----------
    oracle : value oracle
    U : ndarray or SparseRows (n, d)
        The probe directions, one per query (dense, a broadcast row or sparse).
    cols : ndarray (n,) of int
        The column j of each probe.
    c, s : ndarray (n,)
        Scale of the probe direction and of the last token.
    v : ndarray (d,)
        The value vector (already read).
    last : ndarray or SparseRows (n, d), optional
        General last tokens ``b_k`` in place of ``e_j``: the probes are then
        ``[(c_k U[k] + s_k b_k); s_k b_k]`` with logit ``c s u^T W b`` (``cols`` is ignored).
    uv, lastv : ndarray (n,), optional
        ``U @ v`` and ``last @ v``, when the caller has them already.
    offset : float
        The head's offset beta (already read), subtracted from every answer.

    Returns
    -------
    logit : ndarray (n,)
        ``c s u^T w_j`` measured (NaN where alpha was not strictly inside (0, 1)); for a head
        with a key bias c, ``c s u^T w_j + c u^T c``.
    alpha : ndarray (n,)
        The attention weight on the first row.
    """
    n, d = U.shape
    if last is None:
        last = coordinate_rows(cols, d)
    if uv is None:
        uv = rows_dot(U, v)
    if lastv is None:
        lastv = rows_dot(last, v)
    X = np.empty((n, 2, d))
    if isinstance(last, SparseRows):
        X[:, 1, :] = 0.0
        if isinstance(U, SparseRows):
            X[:, 0, :] = 0.0
            U.add_to(X[:, 0, :], c)
        else:
            np.multiply(c[:, None], U, out=X[:, 0, :])
        last.add_to(X[:, 0, :], s)
        last.add_to(X[:, 1, :], s)
    elif isinstance(U, SparseRows):
        np.multiply(s[:, None, None], last[:, None, :], out=X)
        U.add_to(X[:, 0, :], c)
    else:
        np.multiply(s[:, None], last, out=X[:, 1, :])
        np.multiply(c[:, None], U, out=X[:, 0, :])
        X[:, 0, :] += X[:, 1, :]
    y = oracle(X)
    if offset:
        y = y - offset
    base = s * lastv
    uvc = c * uv
    num1 = y - base  # = alpha * c u^T v
    num0 = uvc - num1  # = (1 - alpha) * c u^T v
    r1 = num1 / uvc
    r0 = num0 / uvc
    ok = (r1 > 0) & (r0 > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        logit = np.where(ok, np.log(np.where(ok, r1, 1.0)) - np.log(np.where(ok, r0, 1.0)), np.nan)
    return logit, r1


class Prober:
    """Measure bilinear forms ``u^T W b`` through scaled two-row probes, in bounded chunks.

    ``make(idx)`` returns the directions ``U`` (n, d) and last tokens ``B`` (n, d) of the probes
    ``idx``; ``measure`` returns ``u^T W b`` for each of them. The logit scale ``kappa`` is
    learnt from a pilot batch (the first ``pilot`` probes, asked at ``initial_logit_scale``) and
    then maps the largest value seen so far to logit ``target`` (a value ``max_logit / target``
    times larger still fits); saturated probes are asked again at ``kappa / 100``. A larger
    target reads the logits with more significant digits; the exact learner, whose error is
    amplified by the condition number of its probe matrix, uses 1, the low-rank learners 0.1.

    For a head with a key bias and an offset, ``offset`` (beta) is subtracted from every
    answer and, when ``key_bias`` (c) is given, its share ``c u^T c`` from every logit; a
    probe counts as saturated on its raw logit. The answer's rounding error is relative to
    ``|beta|``, so the first row is scaled up until ``c |u^T v| >= |beta|`` (the last token
    down, ``c s`` is kept), but never so far that the bias's share ``c |u^T c|`` exceeds
    ``bias_logit``: a large share pushes alpha towards 0 or 1, where the logit loses digits.
    When ``make`` returns ``None`` for the last tokens, the probes are ``[kappa u; 0]`` and
    ``measure`` returns ``u^T c`` (give such a prober no ``key_bias``).

    For noisy answers (the layer learner's served mode, docs/served.md): ``repilot`` asks the
    pilot's probes again at the scale the measurement settled on (at the initial scale their
    logits may be far from the target, and a layer's probe 0 enters every coordinate);
    ``relimit`` asks a probe whose logit exceeds it again at the target. ``make`` may return
    a third array, each probe's value as a rough estimate predicts it; with ``entry_target``
    set, a probe whose prediction is small is then asked at a scale up to ``entry_cap`` times
    ``kappa`` that puts it at logit ``entry_target`` (as the low-precision learner scales each
    entry), as long as its last token's share ``s b^T v`` of the answer stays below the
    answer's other parts (where ``c`` is held by the key bias's or the offset's bound, a larger
    scale only enlarges ``s``, and the answer's rounding with it).
    """

    def __init__(self, oracle, v, *, initial_logit_scale, max_logit, min_logit, chunk,
                 pilot=None, target=0.1, key_bias=None, offset=0.0, bias_logit=1.0,
                 repilot=False, relimit=None, entry_target=None, entry_cap=10.0):
        self.oracle = oracle
        self.relimit = None if relimit is None else float(relimit)
        self.repilot = bool(repilot)
        self.v = v
        self.key_bias = key_bias
        self.bias_logit = float(bias_logit)
        self.offset = float(offset)
        self.kappa = None
        self.initial = float(initial_logit_scale)
        self.max_logit = float(max_logit)
        self.min_logit = float(min_logit)
        self.chunk = int(chunk)
        self.pilot = self.chunk if pilot is None else max(1, min(int(pilot), self.chunk))
        self.n_requeried = 0
        self.target = float(target)
        self.entry_target = float(entry_target) if entry_target else 0.0
        self.entry_cap = float(entry_cap)

    def _ask(self, U, B, kap, uv_floor, base=None):
        """Logits ``kap u^T W b`` of the probes (NaN where the answer saturated). With ``base``
        (per-entry scales, :meth:`_scales`), ``kap`` is lowered in place, not below ``base``,
        to where ``s |b^T v|`` reaches ``max(|beta|, c |u^T v|)``."""
        n, d = U.shape
        uv = rows_dot(U, self.v)
        # u^T c, the key bias's direction in each probe (None without a key bias)
        uc = None if self.key_bias is None else rows_dot(U, self.key_bias)
        if B is None:  # zero last token: the probe [kap u; 0] has logit kap u^T c
            B = SparseRows((n, d), [], [], [])
            bv = np.zeros(n)
            c, s = kap, np.ones(n)
        else:
            bv = rows_dot(B, self.v)
            # c / s = rho keeps the s b^T v term from swamping c u^T v. With a floor on |u^T v|
            # known for the whole measurement, s depends on the last token only, so probes that
            # share a last token ask it identically
            floor = np.maximum(np.abs(uv) if uv_floor is None else uv_floor, 1e-300)
            rho = np.maximum(1.0, np.abs(bv) / floor)
            s = np.sqrt(kap / rho)
            c = kap / s
            if self.offset or self.key_bias is not None:
                # c |u^T v| >= |beta|, so that the offset does not swamp the signal, unless the
                # bias's share c u^T c of the logit would exceed bias_logit
                c = np.maximum(c, abs(self.offset) / floor)
                if uc is not None:
                    c = np.minimum(c, self.bias_logit / np.maximum(np.abs(uc), 1e-300))
                if base is not None:
                    lim = c * np.maximum(abs(self.offset), c * np.abs(uv)) / np.maximum(
                        np.abs(bv), 1e-300)
                    kap[:] = np.maximum(base, np.minimum(kap, lim))
                s = kap / c
        logit, _ = probe_logits(self.oracle, U, None, c, s, self.v, last=B, uv=uv, lastv=bv,
                                offset=self.offset)
        saturated = ~(np.abs(logit) <= self.max_logit)
        if uc is not None:  # the bias's share c u^T c of the logit
            logit = logit - c * uc
        logit[saturated] = np.nan
        return logit

    def _ask_checked(self, U, B, kap, uv_floor, base=None):
        logit = self._ask(U, B, kap, uv_floor, base)
        for _ in range(8):
            bad = np.isnan(logit)
            if not bad.any():
                break
            kap[bad] *= 1e-2
            logit[bad] = self._ask(U[bad], None if B is None else B[bad], kap[bad], uv_floor)
            self.n_requeried += int(bad.sum())
        if self.relimit is not None:  # logits beyond relimit: again, scaled to the target
            big = np.abs(logit) > self.relimit
            if big.any():
                kap[big] *= self.target / np.abs(logit[big])
                logit[big] = self._ask(U[big], None if B is None else B[big], kap[big],
                                       uv_floor)
                self.n_requeried += int(big.sum())
        if not np.all(np.isfinite(logit)):
            raise AssumptionViolation(
                "the answers are not those of a single attention head: some attention weights "
                "fall outside (0, 1) at every probe scale"
            )
        return logit

    def _pilot(self, U, B, uv_floor):
        """First batch: find the model's scale and set ``kappa`` from it."""
        kap = np.full(U.shape[0], self.initial)
        logit = self._ask_checked(U, B, kap, uv_floor)
        peak = float(np.max(np.abs(logit)))
        if ZERO_LOGIT < peak < self.min_logit:  # too few digits: ask again, larger
            kap2 = kap * (1.0 / peak)
            new = self._ask(U, B, kap2, uv_floor)
            self.n_requeried += U.shape[0]
            if np.all(np.isfinite(new)):
                logit, kap = new, kap2
        vals = logit / kap
        if peak > ZERO_LOGIT:  # rounding noise shows no scale
            self._update(vals)
        if self.kappa is None:  # every pilot value is 0: keep the initial scale
            self.kappa = self.initial
        return vals, kap

    def _update(self, vals):
        # The largest value seen so far maps to logit ``target``, so a value max_logit / target
        # times larger still fits; the scale only ever decreases.
        big = float(np.max(np.abs(vals))) if vals.size else 0.0
        if big > 0:
            kap = self.target / big
            self.kappa = kap if self.kappa is None else min(self.kappa, kap)

    def _scales(self, n: int, pred) -> tuple[np.ndarray, np.ndarray | None]:
        """Each probe's logit scale and, where ``make`` predicted the values (and
        ``entry_target`` is set), the shared scale below which it is not lowered."""
        kap = np.full(n, self.kappa)
        if not (pred and pred[0] is not None and self.entry_target):
            return kap, None
        with np.errstate(invalid="ignore"):
            up = self.entry_target / (self.kappa * np.maximum(np.abs(pred[0]), 1e-300))
        up = np.where(np.isfinite(up), up, 1.0)  # no usable prediction: the shared scale
        return kap * np.clip(up, 1.0, self.entry_cap), kap

    def measure(self, make, n: int, uv_floor: float | None = None, return_scale: bool = False):
        """``u^T W b`` for probes ``0..n-1`` described by ``make``.

        ``uv_floor``, a lower bound on ``|u^T v|`` over these probes, lets every probe with the
        same last token use the same token scale. With ``return_scale``, also returns the logit
        scale ``c s`` each probe was answered at.
        """
        out = np.empty(n)
        scale = np.empty(n)
        start = 0
        pilot = None
        if self.kappa is None and n:  # the pilot batch, at the initial scale
            sl = slice(0, min(n, self.pilot))
            out[sl], scale[sl] = self._pilot(*make(np.arange(sl.stop))[:2], uv_floor)
            start = sl.stop
            pilot = sl
        for sl in chunk_slices(n - start, self.chunk):  # the pilot has set kappa
            sl = slice(sl.start + start, sl.stop + start)
            U, B, *pred = make(np.arange(sl.start, sl.stop))
            kap, base = self._scales(U.shape[0], pred)
            out[sl] = self._ask_checked(U, B, kap, uv_floor, base) / kap
            scale[sl] = kap
            self._update(out[sl])
        if self.repilot and pilot is not None:
            # the pilot's probes again at the scale the measurement settled on (at the initial
            # scale their logits may be far from the target: with noisy answers, few digits)
            U, B, *pred = make(np.arange(pilot.stop))
            kap, base = self._scales(U.shape[0], pred)
            out[pilot] = self._ask_checked(U, B, kap, uv_floor, base) / kap
            scale[pilot] = kap
            self.n_requeried += U.shape[0]
        return (out, scale) if return_scale else out
