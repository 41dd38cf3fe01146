"""Intervals that count seeds, and one rule for many comparisons.

The runs of a benchmark form a seeds x problems matrix per arm: every seed (a training run) is
scored on the same problems. A flat bootstrap over the pooled (seed, problem) pairs treats the
3 x 1000 cells as 3000 independent draws: it leaves out that a new training run would differ
(seed variance) and that the problems are shared. `hierarchical_bootstrap` resamples seeds
(training runs) with replacement and then problems; with `problems="shared"` (the default: the
same problems under every seed, a crossed design) one problem resample is applied to every
chosen seed, with `problems="per_seed"` (nested: each seed saw its own problems) each chosen seed
draws its own. Arms passed together are resampled with the same indices (paired).

`holm` adjusts p-values for m comparisons read together (Holm 1979: step-down Bonferroni; it
controls the family-wise error rate under any dependence).

Where a record keeps only one number per seed (a mean over its problems, a perplexity), the seeds
are the sample: `seed_summary` and `paired_seed_difference` give Student-t intervals and p-values
over them (`t_cdf` / `t_quantile`, computed here so that numpy is the only dependency).

Every function refuses non-finite inputs (a NaN cell, a seed that failed) with a ValueError: a
NaN compares false with everything, so it would pass as a small p-value or a silent nan.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Sequence

import numpy as np

PROBLEMS = ("shared", "per_seed")


def _finite(what: str, values: np.ndarray, fix: str = "") -> np.ndarray:
  """`values`, or a ValueError naming how many entries of `what` are not finite numbers."""
  bad = ~np.isfinite(values)
  if bad.any():
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
      f"{what}: {int(bad.sum())} of {values.size} entries are not finite (first "
      f"{values[first]} at index {first[0] if len(first) == 1 else first}): "
      + (fix or "give finite numbers (leave out a seed or problem that has no score)")
    )
  return values


def _check(arrays: Sequence[np.ndarray], problems: str):
  if problems not in PROBLEMS:
    raise ValueError(f"problems={problems!r}: use one of {PROBLEMS}")
  arrays = [np.asarray(a, float) for a in arrays]
  if not arrays or any(a.ndim != 2 for a in arrays):
    raise ValueError("give each arm as a [seeds, problems] array")
  if any(a.shape != arrays[0].shape for a in arrays):
    raise ValueError(f"paired arms need the same seeds x problems: got {[a.shape for a in arrays]}")
  if arrays[0].size == 0:
    raise ValueError(
      f"the arms are empty arrays ({arrays[0].shape[0]} seeds x {arrays[0].shape[1]} problems): "
      "give each arm at least one seed and one problem"
    )
  return [_finite(f"arm {i}", a) for i, a in enumerate(arrays)]


def hierarchical_bootstrap(
  arrays: Sequence[np.ndarray],
  stat: Callable[..., float],
  n_boot: int = 2000,
  seed: int = 0,
  problems: str = "shared",
) -> np.ndarray:
  """[n_boot] (or [n_boot, k] for a statistic of k numbers) draws of `stat(*resampled)`, each
  resampled array [seeds, problems] taken with the same seed and problem indices from `arrays`
  (the arms, each [seeds, problems])."""
  arrays = _check(arrays, problems)
  n_s, n_p = arrays[0].shape
  rng = np.random.default_rng(seed)
  draws = []
  for _ in range(n_boot):
    s = rng.integers(0, n_s, n_s)
    if problems == "shared":
      p = np.broadcast_to(rng.integers(0, n_p, n_p), (n_s, n_p))
    else:
      p = rng.integers(0, n_p, (n_s, n_p))
    rows = s[:, None]
    draws.append(stat(*(a[rows, p] for a in arrays)))
  return np.asarray(draws, float)


def flat_bootstrap(
  arrays: Sequence[np.ndarray], stat: Callable[..., float], n_boot: int = 2000, seed: int = 0
) -> np.ndarray:
  """The old way, for comparison: resamples the pooled (seed, problem) cells independently."""
  arrays = _check(arrays, "shared")
  flat = [a.reshape(1, -1) for a in arrays]
  n = flat[0].shape[1]
  rng = np.random.default_rng(seed)
  draws = np.empty(n_boot)
  for b in range(n_boot):
    i = rng.integers(0, n, n)
    draws[b] = stat(*(a[:, i] for a in flat))
  return draws


def p_value(draws: np.ndarray, null: float = 0.0) -> float:
  """Two-sided bootstrap p-value of `null` (twice the smaller tail, at most 1). A NaN draw (the
  statistic undefined on a resample) refuses: it would count in neither tail."""
  draws = np.asarray(draws, float)
  if draws.size == 0:
    raise ValueError("p_value: no bootstrap draws")
  _finite(
    "bootstrap draws",
    draws,
    "the statistic is undefined on some resamples (nan inputs, a ratio over 0): give one "
    "defined on every resample",
  )
  _finite("null", np.asarray([null], float))
  tail = min(np.mean(draws <= null), np.mean(draws >= null))
  return float(min(1.0, 2.0 * tail))


def interval(
  arrays: Sequence[np.ndarray],
  stat: Callable[..., float],
  n_boot: int = 2000,
  seed: int = 0,
  problems: str = "shared",
  null: float = 0.0,
  level: float = 0.95,
) -> Dict[str, float]:
  """{'point', 'lo', 'hi', 'p'}: the statistic on the data, its percentile interval at `level`
  (0 < level < 1) under the hierarchical bootstrap, and the two-sided p-value of `null`. Needs
  >= 2 seeds (rows), as `seed_summary` does: one seed's bootstrap resamples only its problems
  and leaves out how another training run would differ."""
  if not 0.0 < level < 1.0:
    raise ValueError(f"bootstrap interval: level={level}, need 0 < level < 1 (e.g. 0.95)")
  n_seeds = _check(arrays, problems)[0].shape[0]
  if n_seeds < 2:
    raise ValueError(
      f"an interval over seeds needs >= 2 seeds (the arms' rows), got {n_seeds}: one seed's "
      "bootstrap resamples only its problems, leaving the seed-to-seed variance out; run more "
      "seeds"
    )
  draws = hierarchical_bootstrap(arrays, stat, n_boot, seed, problems)
  lo, hi = np.percentile(draws, [50 * (1 - level), 50 * (1 + level)])
  point = stat(*[np.asarray(a, float) for a in arrays])
  return {"point": float(point), "lo": float(lo), "hi": float(hi), "p": p_value(draws, null)}


def mean_difference(a: np.ndarray, b: np.ndarray) -> float:
  return float(np.mean(a) - np.mean(b))


def paired_difference(a, b, n_boot: int = 2000, seed: int = 0, problems: str = "shared"):
  """Arm a minus arm b (each [seeds, problems], same seeds and problems): mean difference with
  its hierarchical interval and p-value of 0."""
  return interval([a, b], mean_difference, n_boot, seed, problems)


def _check_df(df: float) -> None:
  if not (math.isfinite(df) and df >= 1):
    raise ValueError(f"t distribution: df={df}, need a finite df >= 1")


def _beta_fraction(a: float, b: float, x: float) -> float:
  """The continued fraction of the incomplete beta function (modified Lentz), converging fast
  for x < (a + 1) / (a + b + 2)."""
  tiny = 1e-300
  c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
  d = 1.0 / (d if abs(d) > tiny else tiny)
  h = d
  for m in range(1, 100_000):
    for num in (
      m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
      -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
    ):
      d = 1.0 + num * d
      d = 1.0 / (d if abs(d) > tiny else tiny)
      c = 1.0 + num / c
      c = c if abs(c) > tiny else tiny
      h *= d * c
    if abs(d * c - 1.0) < 1e-15:
      return h
  raise ValueError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def _t_sf(x: float, df: float) -> float:
  """P(T > x) for x >= 0: I_z(df/2, 1/2) / 2 with z = df / (df + x^2), the regularized
  incomplete beta function. Computed as the tail itself (not 1 - P(T <= x)), it keeps its
  relative precision far out, where 1 - cdf would round to 0 or below."""
  a, b = df / 2.0, 0.5
  if x == 0.0:
    return 0.5
  if math.isinf(x):
    return 0.0
  # z = df / (df + x^2) and w = 1 - z, with their logs, free of cancellation and overflow
  r = x / math.sqrt(df)
  if r <= 1.0:
    log_z = -math.log1p(r * r)
    log_w = 2.0 * math.log(r) + log_z
  else:
    log_w = -math.log1p(1.0 / (r * r))
    log_z = -2.0 * math.log(r) + log_w
  z, w = math.exp(log_z), math.exp(log_w)
  front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * log_z + b * log_w)
  if z < (a + 1.0) / (a + b + 2.0):
    ibeta = front * _beta_fraction(a, b, z) / a
  else:
    ibeta = 1.0 - front * _beta_fraction(b, a, w) / b
  return min(0.5, max(0.0, 0.5 * ibeta))


def t_cdf(x: float, df: float) -> float:
  """P(T <= x) for Student's t with `df` degrees of freedom (in [0, 1], exactly 1/2 at 0)."""
  _check_df(df)
  if math.isnan(x):
    raise ValueError("t_cdf: x is nan: give a number")
  tail = _t_sf(abs(x), df)
  return tail if x < 0 else 1.0 - tail


def t_quantile(prob: float, df: float) -> float:
  """The x with t_cdf(x, df) = prob, for 0 < prob < 1 (bisection on the tail, so that a prob
  near 0 or 1 keeps its precision). A ValueError where x is beyond float range."""
  _check_df(df)
  if not 0.0 < prob < 1.0:
    raise ValueError(f"t quantile: prob={prob}, need 0 < prob < 1")
  if prob == 0.5:
    return 0.0
  tail = min(prob, 1.0 - prob)
  # Bracket [lo, hi] on x >= 0 with sf(lo) > tail >= sf(hi): doubling ends by ~2^1024 = inf,
  # where sf is 0.
  lo, hi = 0.0, 1.0
  while _t_sf(hi, df) > tail:
    lo, hi = hi, 2.0 * hi
    if math.isinf(hi):
      raise ValueError(
        f"t quantile: prob={prob} with df={df} lies beyond float range: use a prob further "
        "from 0 and 1"
      )
  for _ in range(2200):  # at most ~1100 halvings reach adjacent floats
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    lo, hi = (lo, mid) if _t_sf(mid, df) <= tail else (mid, hi)
  x = 0.5 * (lo + hi)
  return x if prob > 0.5 else -x


def seed_summary(values: Sequence[float], level: float = 0.95) -> Dict[str, float]:
  """{'mean', 'std', 'lo', 'hi', 'n'} of one number per seed: the sample std (n - 1) and the
  Student-t interval of the mean at `level` (0 < level < 1). Needs >= 2 seeds, each a finite
  number."""
  v = np.asarray(values, float)
  if v.ndim != 1 or len(v) < 2:
    raise ValueError(
      f"an interval over seeds needs >= 2 values (one per seed), got shape {v.shape}"
    )
  _finite("seed values", v)
  if not 0.0 < level < 1.0:
    raise ValueError(f"seed interval: level={level}, need 0 < level < 1 (e.g. 0.95)")
  mean, std = float(v.mean()), float(v.std(ddof=1))
  half = t_quantile(0.5 + level / 2, len(v) - 1) * std / math.sqrt(len(v))
  return {"mean": mean, "std": std, "lo": mean - half, "hi": mean + half, "n": len(v)}


def paired_seed_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95):
  """a minus b, one number per seed each, paired by seed (the same seed's data order and
  sampling draws): {'point', 'lo', 'hi', 'p', 'n'}, the paired t interval and the two-sided
  p-value of 0, in [0, 1].

  A difference that is the same on every seed (up to float rounding: accuracies k/n give
  0.7 - 0.5 != 0.6 - 0.4) has no t statistic; its limit is taken: p = 0 when it is nonzero
  (t = +-inf), p = 1 when it is 0 (no difference at all)."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  if a.shape != b.shape:
    raise ValueError(f"paired seeds: {a.shape} vs {b.shape}")
  _finite("paired seeds: a", a)
  _finite("paired seeds: b", b)
  s = seed_summary(a - b, level)
  # rounding of a - b is at most an ulp of the inputs' size per seed; allow a few
  rounding = 64 * np.finfo(float).eps * float(max(np.abs(a).max(), np.abs(b).max()))
  if s["std"] <= rounding:
    p = 1.0 if abs(s["mean"]) <= rounding else 0.0
  else:
    t = s["mean"] / (s["std"] / math.sqrt(s["n"]))
    p = 2.0 * _t_sf(abs(t), s["n"] - 1)
  return {"point": s["mean"], "lo": s["lo"], "hi": s["hi"], "p": min(1.0, max(0.0, p)), "n": s["n"]}


def holm(p_values: Sequence[float]) -> np.ndarray:
  """Holm-adjusted p-values, in the input's order: the i-th smallest p times (m - i + 1), made
  non-decreasing in that order, capped at 1. Reject where adjusted <= alpha."""
  p = np.asarray(p_values, float)
  if p.ndim != 1:
    raise ValueError(f"p-values: a 1-d sequence in [0, 1], got shape {p.shape}")
  bad = p[~((p >= 0) & (p <= 1))]  # written so that nan is out of range too
  if bad.size:
    raise ValueError(f"p-values: a 1-d sequence in [0, 1], got {bad.tolist()[:5]} among them")
  m = len(p)
  order = np.argsort(p, kind="stable")
  scaled = np.minimum(1.0, p[order] * (m - np.arange(m)))
  adjusted = np.empty(m)
  adjusted[order] = np.maximum.accumulate(scaled)
  return adjusted
