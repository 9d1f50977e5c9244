"""The low-precision learners' constants: the probes' limits, the searches' rounds and the bias
route's stage sizes (:mod:`attnquery.learners.lowprecision`)."""

#: |beta| / |c u^T v| at most this: the last token's own value stays negligible beside the
#: smaller answer of a pair, (1 - alpha) |c u^T v| >= exp(-max_logit) |c u^T v|
_BETA_RATIO = 1e-6
#: largest answer size asked for (float16's largest number is 65504)
_MAX_ANSWER = 1e4
#: rounds of a search for a usable logit scale before giving up
_MAX_ROUNDS = 12
#: columns, and directions per column, of the first search for the model's logit scale
_SCOUT_COLUMNS, _SCOUT_ROWS = 4, 2
#: queries :meth:`LowPrecisionValueQueryLearner.min_queries` allows that search
_SCOUT_ALLOWANCE = 3 * 2 * _SCOUT_COLUMNS * _SCOUT_ROWS
#: largest relative noise of the answers the learner accepts. Beyond it the log-ratio of a pair
#: is biased by about the noise squared, which averaging does not remove (one significant digit,
#: relative noise about 0.1, leaves a floor of about 2e-2 on the error of W at d = 16)
MAX_NOISE_LEVEL = 0.03
#: half-width of the per-pass dither of a column's logit scale, in log units
_KAPPA_DITHER = 0.1
#: with ``fit_bias``: largest |c u^T c_b|, the key bias's part of a probe's logit (the probes'
#: scale c is capped by it; the rest of the logit range is left to the measured part)
_BIAS_LOGIT = 2.0
#: with ``fit_bias``: largest |logit| of a probe pair (measured on MiniLM heads served in
#: float32 at 3 (d^2 + 2d + 1) queries: 10 gave 7.7e-7 on W, 8 gave 3.3e-7, 12 gave 4e-6)
_BIAS_MAX_LOGIT = 8.0
#: with ``fit_bias``: singular values of W below this multiple of the key bias's rank-one error
#: are taken for that error when the rank is found
_BIAS_SV_FACTOR = 5.0
#: with ``fit_bias``: largest relative jitter of each pair's last-token scale (Probes.jitter),
#: used where the answers' relative noise is above _JITTER_NOISE (measured on MiniLM L0H0 and
#: L0H1 at 10 (d^2 + 2d + 1): bfloat16 error over its floor 1.49 and 1.58 without, 1.44 and 1.54
#: at 0.05, 1.40 and 1.51 at 0.2; in float32 at 3 units it made heads worse: not used there)
_LAST_TOKEN_JITTER = 0.2
_JITTER_NOISE = 1e-5
#: with ``fit_bias``: one-row queries that average the offset
_OFFSET_QUERIES = 64
#: with ``fit_bias``: fewest rounds of key-bias pairs (2 d queries each)
_MIN_BIAS_ROUNDS = 16
#: with ``fit_bias``: rows of T measured first to cancel the query bias (the shift z moved
#: within W's row space until ``W z + c_b = 0``); the stage runs where d exceeds it and those
#: rows show W's rank below it (_bias.cancel_query_bias)
_CANCEL_ROWS = 48
#: singular values of those rows above this fraction of the largest may span W's row space
_CANCEL_SV = 1e-3
#: ... and at least this ratio between the last of them and the next
_CANCEL_GAP = 4.0
#: moves of z: after the throwaway rows, and after each key-bias stage but the last
_CANCEL_STEPS = 2
#: answer sizes |c u^T v| the design search compares once the query bias is cancelled, and its
#: entries and repetitions per size (5 x 3 x 64 x 4 = 3,840 queries)
_CANCEL_SIZES = (0.03, 0.1, 0.3, 1.0, 3.0)
_DESIGN_ENTRIES, _DESIGN_REPS = 64, 3
#: key-bias rounds per expected pass over W once the query bias is cancelled
_CANCEL_BIAS_ROUNDS = 16
#: uniform passes over both sides of the sketch after the first, before the rest of the budget is
#: shared among the entries by their measured noise (_sketch.entry_quotas)
_SKETCH_UNIFORM = 2
#: entry logits the design search compares for the sketch's passes (each pair's scale set
#: from its entry's estimate so that its logit is this); the largest stays within the logit
#: limit with the dither and the last-token jitter
_SKETCH_LOGITS = (1.5, 2.25, 3.0)
#: largest relative noise of the answers (measured on the rows of stage 3b) for the sketch
_SKETCH_NOISE = _JITTER_NOISE

#: the stages ``n_queries_by_stage_`` counts
STAGES = ("v", "scale_search", "passes", "verify")

#: rows of the array :func:`~attnquery.learners.lowprecision.pair_logits` returns
_T, _M, _C, _Q, _H = range(5)
