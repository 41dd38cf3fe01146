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
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Sequence

import numpy as np

PROBLEMS = ("shared", "per_seed")


def _check(arrays: Sequence[np.ndarray], problems: str):
  if problems not in PROBLEMS:
    raise ValueError(f"problems={problems!r}: use one of {PROBLEMS}")
  arrays = [np.asarray(a, float) for a in arrays]
  if not arrays or any(a.ndim != 2 for a in arrays):
    raise ValueError("give each arm as a [seeds, problems] array")
  if any(a.shape != arrays[0].shape for a in arrays):
    raise ValueError(f"paired arms need the same seeds x problems: got {[a.shape for a in arrays]}")
  return arrays


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
  """Two-sided bootstrap p-value of `null` (twice the smaller tail, at most 1)."""
  draws = np.asarray(draws, float)
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
  """{'point', 'lo', 'hi', 'p'}: the statistic on the data, its percentile interval under the
  hierarchical bootstrap, and the two-sided p-value of `null`."""
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


def t_cdf(x: float, df: int) -> float:
  """P(T <= x) for Student's t with `df` degrees of freedom. With t = sqrt(df) tan(theta) the
  density becomes c cos(theta)^(df - 1) on (-pi/2, pi/2), c = Gamma((df+1)/2) / (sqrt(pi)
  Gamma(df/2)): a smooth integrand on a bounded interval, integrated by Simpson's rule."""
  if df < 1:
    raise ValueError(f"t distribution: df={df}, need >= 1")
  theta = math.atan(x / math.sqrt(df))
  n = 2000  # even; the error is ~1e-12 for df <= 100
  grid = np.linspace(0.0, abs(theta), n + 1)
  f = np.cos(grid) ** (df - 1)
  area = (abs(theta) / (3 * n)) * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
  c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
  return float(0.5 + math.copysign(c * area, theta))


def t_quantile(prob: float, df: int) -> float:
  """The x with t_cdf(x, df) = prob (bisection; prob in (0, 1))."""
  if not 0.0 < prob < 1.0:
    raise ValueError(f"t quantile: prob={prob}, need 0 < prob < 1")
  lo, hi = -1.0, 1.0
  while t_cdf(lo, df) > prob:
    lo *= 2
  while t_cdf(hi, df) < prob:
    hi *= 2
  for _ in range(100):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if t_cdf(mid, df) < prob else (lo, mid)
  return 0.5 * (lo + hi)


def seed_summary(values: Sequence[float], level: float = 0.95) -> Dict[str, float]:
  """{'mean', 'std', 'lo', 'hi', 'n'} of one number per seed: the sample std (n - 1) and the
  Student-t interval of the mean. Needs >= 2 seeds."""
  v = np.asarray(values, float)
  if v.ndim != 1 or len(v) < 2:
    raise ValueError(
      f"an interval over seeds needs >= 2 values (one per seed), got shape {v.shape}"
    )
  mean, std = float(v.mean()), float(v.std(ddof=1))
  half = t_quantile(0.5 + level / 2, len(v) - 1) * std / math.sqrt(len(v))
  return {"mean": mean, "std": std, "lo": mean - half, "hi": mean + half, "n": len(v)}


def paired_seed_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95):
  """a minus b, one number per seed each, paired by seed (the same seed's data order and
  sampling draws): {'point', 'lo', 'hi', 'p', 'n'}, the paired t interval and the two-sided
  p-value of 0 (all seeds' differences equal: p = 1 when they are 0, else 0)."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  if a.shape != b.shape:
    raise ValueError(f"paired seeds: {a.shape} vs {b.shape}")
  s = seed_summary(a - b, level)
  if s["std"] == 0.0:
    p = 1.0 if s["mean"] == 0.0 else 0.0
  else:
    t = s["mean"] / (s["std"] / math.sqrt(s["n"]))
    p = 2.0 * (1.0 - t_cdf(abs(t), s["n"] - 1))
  return {"point": s["mean"], "lo": s["lo"], "hi": s["hi"], "p": float(min(1.0, p)), "n": s["n"]}


def holm(p_values: Sequence[float]) -> np.ndarray:
  """Holm-adjusted p-values, in the input's order: the i-th smallest p times (m - i + 1), made
  non-decreasing in that order, capped at 1. Reject where adjusted <= alpha."""
  p = np.asarray(p_values, float)
  if p.ndim != 1 or np.any((p < 0) | (p > 1)):
    raise ValueError("p-values: a 1-d sequence in [0, 1]")
  m = len(p)
  order = np.argsort(p, kind="stable")
  scaled = np.minimum(1.0, p[order] * (m - np.arange(m)))
  adjusted = np.empty(m)
  adjusted[order] = np.maximum.accumulate(scaled)
  return adjusted
