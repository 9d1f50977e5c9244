"""The pair probes: what an antipodal pair of answers measures (:func:`pair_logits`), the one
builder of pair queries, the answers of one fit (:class:`Channel`, asked through the fit's
query ledger, the one budget) and the probes' design (:class:`Probes`, a frozen run object:
a stage that changes the design returns a new one)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ...errors import BudgetExceededError, ModelMismatchError
from ...precision import AnswerFormat
from .._base import chunk_slices
from ._constants import (
    _BETA_RATIO,
    _BIAS_LOGIT,
    _BIAS_MAX_LOGIT,
    _MAX_ANSWER,
    _MAX_ROUNDS,
    _T,
)
from ._entries import Entries
from ._noise import check_noise


def pair_logits(y_plus, y_minus, beta, c) -> np.ndarray:
    """What a pair of answers measures, and how their errors reach it.

    Parameters
    ----------
    y_plus, y_minus : ndarray
        Answers to ``[(c u + s b); s b]`` and ``[(-c u + s b); s b]``.
    beta : ndarray
        ``s b^T v`` (the last token's value), from an estimate of v.
    c : ndarray
        The scale of the probe direction.

    Returns
    -------
    ndarray (5, ...)
        Row ``_T``: the logit ``log((y+ - beta) / (beta - y-)) = c s u^T W b`` (NaN where the
        ratio is not positive and finite: answers no single head gives, or lost to rounding).
        Row ``_M``: ``(y+ - y-) / c``, which is ``u^T v`` for any sum of heads. Row ``_C``: c.
        Row ``_Q``: ``y+^2 + y-^2``. Row ``_H``: the variance of the logit per unit of relative
        noise in the answers, ``y+^2 / (y+ - beta)^2 + y-^2 / (beta - y-)^2`` (about 2).
    """
    num1 = y_plus - beta
    num0 = beta - y_minus
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = num1 / num0
        ok = np.isfinite(ratio) & (ratio > 0)
        t = np.where(ok, np.log(np.where(ok, ratio, 1.0)), np.nan)
        return np.stack(np.broadcast_arrays(
            t, (y_plus - y_minus) / c, c, y_plus * y_plus + y_minus * y_minus,
            (y_plus / num1) ** 2 + (y_minus / num0) ** 2))


def fill_pairs(X, c, U, s, cols, V=None) -> None:
    """Write antipodal probe pairs into ``X`` (k, ..., 2, 2, d): for each k (a column) and
    each direction ``u`` of ``U`` (broadcast over the middle axes), the queries
    ``[(c_k u + s_k e_j); s_k e_j]`` and ``[(-c_k u + s_k e_j); s_k e_j]`` with
    ``j = cols[k]`` (with ``V``, rows of last-token directions: ``V[j]`` instead of ``e_j``).
    The one pair-query builder of the learners."""
    extra = X.ndim - 4  # axes between the column and the pair
    np.multiply(c.reshape(c.shape + (1,) * (extra + 1)), U, out=X[..., 0, 0, :])
    np.negative(X[..., 0, 0, :], out=X[..., 1, 0, :])
    X[..., 1, :] = 0.0
    s = s.reshape(s.shape + (1,) * (extra + 2))
    if V is None:
        X[np.arange(len(cols)), ..., cols] += s
    else:
        X += s[..., None] * V[cols].reshape((len(cols),) + (1,) * (extra + 2) + (V.shape[1],))


class Channel:
    """The answers of one ``fit``, asked through its query ledger.

    The ledger (:class:`~attnquery.learners._base.QueryLedger`, opened with ``cap=n_queries``
    and the check queries as its ``reserve``) is the fit's one budget: :meth:`need` refuses a
    step before it is asked, and ``ledger.left()`` is what the plans share out. The channel
    tallies what the answers showed: their narrowest format (``formats``) and how many were
    not finite (``n_overflow``); pairs asked again are counted on ``ledger.n_requeried``.

    Parameters
    ----------
    ledger : QueryLedger
    """

    def __init__(self, ledger):
        self.ledger = ledger
        self.formats = AnswerFormat()  # the format of every answer the pairs met
        self.n_overflow = 0

    def __call__(self, X) -> np.ndarray:
        """The ledger's answers to X; answers that are not finite (the box's format
        overflowed) are counted in ``n_overflow`` and, NaN to the pairs, make the probes that
        met them be asked again at a smaller scale: the overflow bounds the input scale."""
        y = np.asarray(self.ledger(X), dtype=float)
        self.formats.update(y)
        bad = ~np.isfinite(y)
        if bad.any():
            self.n_overflow += int(bad.sum())
            y = np.where(bad, np.nan, y)
        return y

    def need(self, n: int) -> None:
        """Raise :class:`~attnquery.errors.BudgetExceededError` before ``n`` queries the
        ledger's budget (less the check's reserve) does not pay for."""
        try:
            self.ledger.need(n, "measuring every entry of W once")
        except BudgetExceededError as exc:
            raise BudgetExceededError(
                f"{n} more queries are needed to measure every entry of W once but only "
                f"{self.ledger.left()} of n_queries = {self.ledger.cap} remain for fitting (the "
                "search for the logit scale and pairs asked again at a smaller scale took the "
                "rest)") from exc

    def requeried(self, n: int) -> None:
        """Count ``n`` pairs asked again (``ledger.n_requeried``)."""
        self.ledger.n_requeried += int(n)


@dataclasses.dataclass(frozen=True, eq=False)
class Probes:
    """The design of the probe pairs at one stage of a fit: the directions, the rough v that
    sets their scales, and (with ``fit_bias``) the shift and key bias they carry. Frozen: a
    stage that changes the design returns a new one (:meth:`but`).

    Parameters
    ----------
    channel : Channel
        The fit's answers.
    U : ndarray (d, d)
        The directions, one per row.
    v0 : ndarray (d,)
        v from the one-row queries (with ``fit_bias``, refined by the key-bias stages).
    answer_scale, target_logit : float
        The learner's parameters.
    block_bytes : int
        The learner's parameter.
    max_logit : float
        The learner's parameter; with ``fit_bias`` at most ``_BIAS_MAX_LOGIT``
        (:meth:`start`).
    fit_bias : bool
        Whether the pairs carry the bias route's shift, key bias and caps.
    off : float
        The offset (with ``fit_bias``).
    z : ndarray (d,) or None
        The shift of every probe (with ``fit_bias``), ``zv = z^T v``.
    b : ndarray (d,) or None
        The key bias in the basis U (the logits' part ``c b_l`` taken out).
    c_bias : ndarray (d,) or None
        Each direction's cap on the scale c.
    acc : Entries or None
        The entries' running means, for the last tokens' signs (with ``fit_bias``).
    rng : Generator or None
        The generator of the last tokens' jitter (None: no jitter).
    jitter_size : float
        Largest relative jitter of a pair's last-token scale.
    cancelled : bool
        The query bias cancelled by the shift z (random last-token signs).
    V : ndarray or None
        Last-token directions (rows) of the columns; None: ``e_j``.
    sign_base : ndarray or None
        The sketch's passes: each entry's last-token sign.
    """

    channel: Channel
    U: np.ndarray
    v0: np.ndarray
    answer_scale: float
    target_logit: float
    block_bytes: int
    max_logit: float
    fit_bias: bool = False
    off: float = 0.0
    z: np.ndarray | None = None
    zv: float = 0.0
    b: np.ndarray | None = None
    c_bias: np.ndarray | None = None
    acc: Entries | None = None
    rng: np.random.Generator | None = None
    jitter_size: float = 0.0
    cancelled: bool = False
    V: np.ndarray | None = None
    sign_base: np.ndarray | None = None

    @classmethod
    def start(cls, learner, channel: Channel, U, v0, fit_bias: bool, off: float = 0.0):
        """The first design of a fit, from the learner's parameters."""
        mx = float(learner.max_logit)
        return cls(channel, U, v0, float(learner.answer_scale), float(learner.target_logit),
                   int(learner.block_bytes), min(mx, _BIAS_MAX_LOGIT) if fit_bias else mx,
                   fit_bias=fit_bias, off=off)

    def but(self, **changes) -> Probes:
        """This design with ``changes`` (:func:`dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)

    @property
    def uv(self) -> float:
        """The root-mean-square of ``u^T v``, ``|v| / sqrt(d)``."""
        return float(np.linalg.norm(self.v0) / np.sqrt(self.v0.size))

    @property
    def max(self) -> float:
        """Largest |logit| of a pair."""
        return self.max_logit

    @property
    def mlog(self) -> float:
        """Largest measured part of a logit (with ``fit_bias``, the key bias's part left
        out)."""
        return self.max_logit - _BIAS_LOGIT if self.fit_bias else self.max_logit

    def col_v(self, cols) -> np.ndarray:
        """``w_j^T v`` for the columns' last-token directions (``v_j`` for ``e_j``)."""
        return self.v0[cols] if self.V is None else self.V[cols] @ self.v0

    def signs(self, rows, cols) -> np.ndarray:
        """With ``fit_bias``: the sign of each pair's last token, ``-sign(T_lj b_l)`` where the
        entry has been measured (+1 elsewhere), so that the measured part of the logit,
        ``kappa T_lj``, and the key bias's part, ``c b_l``, have opposite signs and the logit
        stays moderate (a large logit leaves the smaller answer of a pair small beside the
        rest of the answer)."""
        if self.acc is None:
            return np.ones(np.broadcast_shapes(np.shape(rows), np.shape(cols)))
        if self.sign_base is not None:  # the sketch's passes: each entry's sign alternates
            return self.sign_base[rows, cols]
        if self.cancelled:  # the key bias's part is about 0: random signs, so that the error
            # of b_l reaches the entries of its row with random signs, not as a rank-one error
            shape = np.broadcast_shapes(np.shape(rows), np.shape(cols))
            return self.rng.choice([-1.0, 1.0], size=shape)
        T = self.acc.ref[rows, cols]
        sg = -np.sign(np.nan_to_num(T) * self.b[rows])
        return np.where(sg == 0, 1.0, sg)

    def jitter(self, shape) -> np.ndarray:
        """With ``fit_bias``: a factor in ``[1, 1 + jitter_size]`` per pair for its last
        token's scale s. A pair's logit less the key bias's part is linear in s, so it is
        divided by the factor and measures ``kappa T_lj`` as before; but the pairs of a column
        no longer share one last token, so a served box rounds each pair's query vector
        ``W_Q x_N + b_Q`` differently and that rounding averages over the pairs of a column
        instead of only over passes. ``jitter_size`` is ``_LAST_TOKEN_JITTER`` where the
        answers' relative noise exceeds ``_JITTER_NOISE`` (float16, bfloat16) and 0 below it
        (float32, where a larger last token costs more than the jitter gains)."""
        if self.rng is None or self.jitter_size == 0:
            return np.ones(shape)
        return 1.0 + self.rng.uniform(0.0, self.jitter_size, size=shape)

    def scales(self, kappa, cols, dither, rows=None):
        """Token scales ``(c, s)`` with ``c s = kappa``: answers ``|c u^T v|`` of at least
        ``answer_scale`` and large enough that ``|beta| <= 1e-6 |c u^T v|``, times ``dither``,
        and at most 1e4 (with ``fit_bias``: c capped per direction, see ``c_bias``)."""
        uv = self.uv
        if self.fit_bias:  # each direction's key-bias logit c u_l^T c_b stays within _BIAS_LOGIT
            c = np.minimum(min(self.answer_scale, _MAX_ANSWER) / uv,
                           self.c_bias[rows]) * dither ** -0.1
            c = np.broadcast_to(c, np.broadcast_shapes(np.shape(c), np.shape(kappa)))
            return c, kappa / c
        size = np.maximum(self.answer_scale,
                          np.sqrt(kappa * np.abs(self.v0[cols]) * uv / _BETA_RATIO))
        c = np.minimum(size * dither, _MAX_ANSWER) / uv
        return c, kappa / c

    def ask(self, rows, cols, kappa, dither):
        """Ask the pairs (direction ``rows[k]``, column ``cols[k]``); returns their
        :func:`pair_logits` (5, n)."""
        n, d = rows.size, self.U.shape[1]
        self.channel.need(2 * n)
        P = np.empty((5, n))
        for sl in chunk_slices(n, max(1, self.block_bytes // (32 * d))):
            k = sl.stop - sl.start
            cj = cols[sl]
            c, s = self.scales(kappa[sl], cj, dither[sl], rows[sl])
            sg = self.signs(rows[sl], cj) if self.fit_bias else 1.0
            jit = self.jitter(np.shape(s)) if self.fit_bias else 1.0
            s = s * sg * jit
            X = np.empty((k, 2, 2, d))
            fill_pairs(X, c, self.U[rows[sl]], s, cj, self.V)
            if self.z is not None:
                X += self.z
            y = self.channel(X.reshape(2 * k, 2, d)).reshape(k, 2)
            P[:, sl] = pair_logits(y[:, 0], y[:, 1], s * self.col_v(cj) + self.off + self.zv, c)
            if self.fit_bias:  # the key bias's part of the logit, c u^T c_b, taken out
                P[_T, sl] = sg * (P[_T, sl] - c * self.b[rows[sl]]) / jit
        return P

    def ask_rows(self, rows, kappa, dither):
        """Directions ``rows`` against every column at the columns' ``kappa`` and ``dither``
        (d,): their :func:`pair_logits`, (5, len(rows), d). The pairs of a column share their
        last token and are asked one after the other."""
        U = self.U[rows]
        r, d = U.shape
        self.channel.need(2 * r * d)
        P = np.empty((5, r, d))
        per = max(1, min(d, self.block_bytes // (32 * r * d)))  # columns per batch
        buf = np.empty((per, r, 2, 2, d))  # reused: no page faults per batch
        for sl in chunk_slices(d, per):
            cols = np.arange(sl.start, sl.stop)
            k = cols.size
            X = buf[:k]
            if self.fit_bias:  # scales per pair (k, r): c depends on the direction too
                kk = kappa[:, sl].T if np.ndim(kappa) == 2 else kappa[sl][:, None]
                c, s = self.scales(kk, cols, dither[sl][:, None], rows[None, :])
                sg = self.signs(rows[None, :], cols[:, None])
                jit = self.jitter(np.shape(s))
                s = s * sg * jit
                np.multiply(c[:, :, None], U[None], out=X[:, :, 0, 0, :])
                np.negative(X[:, :, 0, 0, :], out=X[:, :, 1, 0, :])
                X[:, :, :, 1, :] = 0.0
                X[np.arange(k), :, :, :, cols] += s[:, :, None, None]
                if self.z is not None:
                    X += self.z
                y = self.channel(X.reshape(2 * k * r, 2, d)).reshape(k, r, 2)
                Pk = pair_logits(y[:, :, 0], y[:, :, 1],
                                 s * self.v0[cols][:, None] + self.off + self.zv, c)
                Pk[_T] = sg * (Pk[_T] - self.b[rows][None, :] * c) / jit
                P[:, :, sl] = Pk.transpose(0, 2, 1)
                continue
            c, s = self.scales(kappa[sl], cols, dither[sl])
            fill_pairs(X, c, U, s, cols)
            y = self.channel(X.reshape(2 * k * r, 2, d)).reshape(k, r, 2)
            P[:, :, sl] = pair_logits(y[:, :, 0], y[:, :, 1], (s * self.v0[cols])[:, None],
                                      c[:, None]).transpose(0, 2, 1)
        return P

    def sweep(self, rows, kappa, dither, mask=None):
        """One pass of ``rows`` over every column (only the entries of ``mask``, (len(rows),
        columns), where given; the others are NaN); pairs with a non-finite or too large logit
        are asked again at a tenth of the scale. Returns the :func:`pair_logits` of every entry
        and its scale."""
        if mask is None and self.V is None:
            P = self.ask_rows(rows, kappa, dither)
        else:  # flat pairs: the entries of mask, or every last-token direction of V
            if mask is None:
                mask = np.ones((rows.size, self.V.shape[0]), dtype=bool)
            P = np.full((5,) + mask.shape, np.nan)
            i, j = np.nonzero(mask)
            P[:, i, j] = self.ask(rows[i], j, np.broadcast_to(kappa, mask.shape)[i, j],
                                  dither[j])
        kap = np.broadcast_to(kappa, P.shape[1:]).copy()
        dit = np.broadcast_to(dither, P.shape[1:])
        for _ in range(_MAX_ROUNDS):
            bad = ~(np.abs(P[_T]) <= self.mlog)
            if mask is not None:
                bad &= mask
            if not bad.any():
                return P, kap
            r, c = np.nonzero(bad)
            kap[r, c] /= 10.0
            P[:, r, c] = self.ask(rows[r], c, kap[r, c], dit[r, c])
            self.channel.requeried(r.size)
        raise ModelMismatchError(
            "the answers are not those of a single attention head: some probe pairs give no "
            f"positive ratio at any of {_MAX_ROUNDS} scales")

    def search(self, rows, cols, kappa, acc):
        """For each column, a scale at which directions ``rows`` give usable logits (all finite,
        within ``max_logit``, root-mean-square at least ``target_logit / 10`` unless the column
        shows only noise). Every round's answers go into ``acc`` (a measurement at any scale
        counts, with its weight). Returns ``kappa`` and the accepted logits (len(rows),
        len(cols))."""
        # the rows' largest logit is about three times their root-mean-square
        T, max_logit = min(self.target_logit, self.mlog / 3.0), self.mlog
        p = rows.size
        kappa = np.asarray(kappa, dtype=float).copy()
        dither = np.ones(cols.size)
        t = np.full((p, cols.size), np.nan)
        todo = np.ones(cols.size, dtype=bool)
        prev_rms = np.full(cols.size, np.nan)
        prev_kap = np.full(cols.size, np.nan)
        for rnd in range(_MAX_ROUNDS):
            idx = np.flatnonzero(todo)
            if idx.size == 0:
                return kappa, t
            if rnd:
                self.channel.requeried(p * idx.size)
            rr, cc = np.tile(rows, idx.size), np.repeat(idx, p)
            P = self.ask(rr, cols[cc], kappa[cc], dither[cc]).reshape(5, idx.size, p)
            P = P.transpose(0, 2, 1)
            acc.add(rows, cols[idx], P, kappa[idx][None, :], max_logit)
            tt = P[_T]
            t[:, idx] = tt
            rms = np.sqrt(np.mean(tt**2, axis=0))
            finite = np.all(np.isfinite(tt), axis=0)
            big = ~(np.max(np.abs(tt), axis=0) <= max_logit)  # NaN counts as big
            small = ~big & (rms < T / 10)
            # a scale raised tenfold that raised the logits less than twofold shows noise only:
            # the column is zero to the answers' precision, and its scale is kept
            stalled = small & (kappa[idx] >= 10 * prev_kap[idx]) & (rms < 2 * prev_rms[idx])
            prev_rms[idx], prev_kap[idx] = rms, kappa[idx]
            kappa[idx[big & ~finite]] /= 100.0
            fix = (big & finite) | (small & ~stalled)
            kappa[idx[fix]] *= np.minimum(1e4, T / np.maximum(rms[fix], 1e-300))
            todo[idx[~big & (~small | stalled)]] = False
        check_noise(acc)
        raise ModelMismatchError(
            f"the answers are not those of a single attention head: no logit scale gave usable "
            f"answers within {_MAX_ROUNDS} rounds for {int(todo.sum())} columns")


