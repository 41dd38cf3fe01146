"""Sampler configuration, outputs and the host-side step schedule (SPEC §4.1, §4.2).

Everything here is plain Python / NumPy (the policy names and parameter checks come from
`policies.py`); the jitted samplers treat a `SamplerConfig` as static.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Mapping, Optional

import numpy as np

from setdiff_jax.sampling import policies

MIN_TEMPERATURE = 1e-4  # = config.fields.SHARED['temperature']'s lower bound

PENALTY_HISTORIES = ("auto", "generated", "cached", "visible")
CACHE_ORDERS = ("l2r", "fht")
BUCKET_MIN = 8  # the smallest power-of-two bucket ("pow2")


def bucket_length(n: int, buckets=None) -> int:
  """The padded length of an array axis holding n slots (bounded compiles).

  buckets: None (exactly n, one program per distinct n), "pow2" (the next power of two >= n, at
  least BUCKET_MIN) or a sorted tuple of lengths (the smallest entry >= n; n itself past the last
  entry). A data set of prompt lengths up to P then compiles at most log2(P) programs ("pow2")
  or len(buckets) + 1.
  """
  n = int(n)
  if buckets is None:
    return n
  if buckets == "pow2":
    return max(BUCKET_MIN, 1 << max(0, n - 1).bit_length())
  for b in buckets:
    if b >= n:
      return int(b)
  return n


def check_buckets(buckets, what: str = "length_buckets"):
  """None, "pow2", or a strictly increasing tuple of positive ints; else a ValueError naming it."""
  if buckets is None or buckets == "pow2":
    return
  ok = (
    isinstance(buckets, tuple)
    and buckets
    and all(isinstance(b, (int, np.integer)) and b > 0 for b in buckets)
    and all(a < b for a, b in zip(buckets, buckets[1:]))
  )
  if not ok:
    raise ValueError(
      f"{what}={buckets!r}: expected None, 'pow2' or a strictly increasing tuple of "
      f"positive lengths, e.g. (64, 128, 256)"
    )


def tau_label(tau: Optional[float]) -> str:
  """A threshold tau as the reports write it: 'off' (None) or '%g'."""
  return "off" if tau is None else f"{tau:g}"


@dataclasses.dataclass(frozen=True)
class CommitPolicy:
  """Which of a step's candidates commit (hashable: a static argument of the jitted loops).

  name: a policy of `policies.POLICIES` (default 'threshold', SPEC §4.2's rule).
  arg: its parameter as given (tau, gamma, f, k or d; None = the policy's default, for the
    threshold rule tau off). `param` is the validated value the loop commits with.
  """

  name: str = policies.DEFAULT
  arg: Optional[float] = None

  def __post_init__(self):
    policies.check_arg(self.name, self.arg)  # names the valid policies / the range

  @property
  def param(self):
    """The validated parameter, the policy's default when `arg` is None (static)."""
    return policies.check_arg(self.name, self.arg)

  @property
  def tau(self) -> Optional[float]:
    """tau of the threshold rule (None: off, or another policy)."""
    return self.param if self.name == policies.DEFAULT else None

  @property
  def label(self) -> str:
    """'tau=0.7' / 'tau=off' for the threshold rule, else 'entropy_bound gamma=0.1'."""
    if self.name == policies.DEFAULT:
      return f"tau={tau_label(self.tau)}"
    return policies.label(self.name, self.arg)


# How the launchers' users name the commit policy's settings (`commit_policy`'s messages).
POLICY_FLAGS = {"policy": "--policy", "policy_arg": "--policy_arg", "threshold": "--threshold"}


def commit_policy(
  policy: Optional[str] = None,
  policy_arg=None,
  threshold: Optional[float] = None,
  names: Mapping[str, str] = POLICY_FLAGS,
) -> CommitPolicy:
  """The `CommitPolicy` of the user's flags: --policy (None: 'threshold'), --policy_arg and
  --threshold, the reference's name for tau of the threshold rule (its --policy_arg). A ValueError
  names the settings as `names` spells them (default the flags) when they conflict."""
  name = policy or policies.DEFAULT
  policies.get(name)
  if threshold is None:
    return CommitPolicy(name, policy_arg)
  p, t = names["policy"], names["threshold"]
  if name != policies.DEFAULT:
    raise ValueError(
      f"{t}={threshold} is the parameter of {p}=threshold; for {p}={name} pass "
      f"{names['policy_arg']}"
    )
  if policy_arg is not None and float(policy_arg) != float(threshold):
    raise ValueError(
      f"{t}={threshold} and {names['policy_arg']}={policy_arg} both set tau of {p}=threshold "
      "and disagree; give one"
    )
  policies.check_arg(name, threshold, t, p)
  return CommitPolicy(name, threshold)


@dataclasses.dataclass(frozen=True)
class DecodeSetting:
  """One decode setting of a report: the set window W and the commit policy (hashable).

  window: W of the set sampler (None: the method has no window, or the run's own S).
  policy: the `CommitPolicy` (None: the method has no commit rule, e.g. AR).
  `name` is the one label every report prints: 'W=4 tau=0.7', 'tau=off' (MDLM / BD3LM),
  'W=4 entropy_bound gamma=0.1', '-' (AR).
  """

  window: Optional[int] = None
  policy: Optional[CommitPolicy] = CommitPolicy()

  def __post_init__(self):
    if self.window is not None:
      object.__setattr__(self, "window", int(self.window))
    if self.policy is not None and not isinstance(self.policy, CommitPolicy):
      raise ValueError(f"policy={self.policy!r} must be a CommitPolicy or None")

  @property
  def name(self) -> str:
    parts = [] if self.window is None else [f"W={self.window}"]
    if self.policy is not None:
      parts.append(self.policy.label)
    return " ".join(parts) or "-"

  @property
  def tau(self) -> Optional[float]:
    """tau of the threshold rule (None: off, another policy or no commit rule)."""
    return None if self.policy is None else self.policy.tau

  def sampler_fields(self):
    """The `SamplerConfig` fields this setting sets (None: the method's default)."""
    fields = {"window": self.window, "policy": self.policy}
    return {k: v for k, v in fields.items() if v is not None}

  def row(self):
    """The columns a result row records for this setting (the name, W, tau, policy, arg)."""
    policy = self.policy or CommitPolicy()
    return {
      "setting": self.name,
      "window": self.window,
      "threshold": tau_label(self.tau),
      "policy": policy.name,
      "policy_arg": policy.param,
    }


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Knobs shared by every sampler (set, no-cache set, AR, BD3LM, MDLM).

  Special ids:
    mask_token_id: M; its logit is set to -1e12 before the softmax (SPEC §3.5).
    eos_token_id: EOS for stopping (None: never stop early).
    pad_token_id: fills unused slots of fixed-shape arrays (never attended).
    bos_token_id: informative only (callers put BOS in the prompt; see `text.py`).
  Decoding:
    window: W, the positional window of the set sampler [first mask, first mask + W) (SPEC §4.2).
    policy: the `CommitPolicy` (default: the threshold rule of SPEC §4.2, n_i most confident +
      tau, tau off); its `arg` is the one place tau lives. The schedule's n_i is a floor for
      every policy. `setting` is (window, policy) as a `DecodeSetting`, the reports' name.
    max_new_tokens: N, masks appended after each prompt (ignored by infilling, where N is the number
      of masks in the input).
    num_steps: T, the step budget; None = N (one token per step with tau off). The set sampler runs
      min(T, N) steps; MDLM/BD3LM run min(T, G) steps per sub-block.
    block_size: G, the sub-block of MDLM/BD3LM (BD3LM: the trained block size S; MDLM: None = N).
    greedy / temperature / top_p: argmax or sampling from softmax(z / temperature), after the
      nucleus filter when top_p < 1 (the token that crosses top_p is kept). Temperature only
      applies when sampling. The confidence is the chosen token's probability under the
      (processed, nucleus-renormalised) distribution (SPEC §8.14).
    repetition_penalty: HF semantics on raw logits of tokens in the history: positive logits are
      divided by it, negative ones multiplied; 1.0 = off.
    penalty_history: which tokens count as seen. 'generated': committed tokens of the generated
      span, the previous step's included, prompt excluded (SPEC §4.2, prompted default);
      'cached': tokens whose K/V are in the cache at the start of the step, i.e. all context
      plus tokens committed two or more steps earlier (SPEC §4.5, infill default); 'visible':
      context and every committed token (infill with right context). 'auto' picks the default of
      the mode. AR always uses prompt + generated; MDLM/BD3LM use 'generated'.
    cache_order: order of a step's committed set in the cache: 'l2r' (by position) or 'fht'
      (descending staggered reveal times drawn once per row from `seed` on the host, S = W,
      S_max = 2W, the last N locs of a length-`max_length` schedule; SPEC §4.3).
    stop_at_eos: stop a row once an EOS sits at a generated position with no mask before it
      (prompted generation only; see `set_sampler.py` for the exact rule).
    max_length: the model's trained context length L; prompt + max_new_tokens (or the infill
      canvas) must fit. None = unchecked.
    mdlm_pad_to_max_length: MDLM feeds a canvas padded with M to max_length (SPEC §4.8).
    align_to_blocks: BD3LM and block-wise MDLM (the official `align_inputs_to_blocks`): decode
      blocks sit on the grid of G = block_size positions instead of starting at each row's prompt
      end P. BD3LM caches only the prompt's full blocks [0, G*floor(P/G)); the first decode block
      is the grid block holding the prompt's tail (its prompt tokens fed clean, never committed),
      then blocks on the grid; ceil(N/G) blocks as the official loop (with P % G != 0 the span's
      last positions may stay undecoded). No effect for MDLM without block_size (one sub-block)
      nor for the set and AR samplers. False: blocks start at P (see `baselines.py`).
    seed: default PRNG seed when no key is passed (and the seed of the 'fht' reveal times).
    rollout_stats: also return each committed token's log-probability (`token_logprob`) and the
      KV cache order (`cache_order`), what exact trajectory scoring reads (`rl.scoring`; the RL
      loop turns it on). Off (default): both are None and the decoding loop neither carries nor
      writes them; the tokens are the same either way.
    length_buckets: how the host pads a batch's ragged axes (prompt / context width, canvas,
      schedule) before the jitted loop: None = to the batch's longest row (one compile per
      distinct length), "pow2" or a tuple of lengths (`bucket_length`; the decode paths of
      `setdiff_jax.decoding` use "pow2"), so a data set compiles a bounded number of programs.
      The padding slots are invalid (never attended, never generated): the tokens do not change.
      The set sampler's compiled loop also ignores `max_new_tokens` / `max_length` (host-side
      only), so generation lengths share programs within a canvas bucket; AR / BD3LM pad their
      canvas to P + the bucketed N (N is a loop argument) and cut it back to P + N, MDLM's
      loop takes N as an argument (its width is never bucketed: it attends its padding).
  The jitted loops take the config as a static argument (seed excluded): changing any other field
  compiles a new loop; params, prompts of the same shapes and keys do not.
  """

  mask_token_id: int
  eos_token_id: Optional[int] = None
  pad_token_id: int = 0
  bos_token_id: Optional[int] = None
  window: int = 4
  policy: CommitPolicy = CommitPolicy()
  max_new_tokens: int = 64
  num_steps: Optional[int] = None
  block_size: Optional[int] = None
  greedy: bool = True
  temperature: float = 1.0
  top_p: float = 1.0
  repetition_penalty: float = 1.0
  penalty_history: str = "auto"
  cache_order: str = "l2r"
  stop_at_eos: bool = True
  max_length: Optional[int] = None
  mdlm_pad_to_max_length: bool = True
  align_to_blocks: bool = False
  seed: int = 0
  length_buckets: Optional[object] = None
  rollout_stats: bool = False

  def __post_init__(self):
    for name in ("window", "max_new_tokens", "num_steps", "block_size", "max_length"):
      value = getattr(self, name)
      if value is None:
        continue
      whole = isinstance(value, (int, np.integer)) or (
        isinstance(value, float) and value.is_integer()
      )
      if isinstance(value, bool) or not whole:
        raise ValueError(f"{name}={value!r} must be a whole number")
      object.__setattr__(self, name, int(value))  # 4.0 -> 4: a static jit argument, hashed
    if int(self.window) < 1:
      raise ValueError(f"window W={self.window} must be >= 1")
    if int(self.max_new_tokens) < 1:
      raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
    if self.num_steps is not None and int(self.num_steps) < 1:
      raise ValueError(f"num_steps={self.num_steps} must be >= 1 (or None for one step per token)")
    if self.block_size is not None and int(self.block_size) < 1:
      raise ValueError(f"block_size={self.block_size} must be >= 1")
    if not isinstance(self.policy, CommitPolicy):
      raise ValueError(
        f"policy={self.policy!r} must be a CommitPolicy, e.g. CommitPolicy('pmax', 0.7) "
        "(`commit_policy` resolves the --policy / --policy_arg / --threshold flags)"
      )
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
    if not (math.isfinite(self.temperature) and self.temperature >= MIN_TEMPERATURE):
      raise ValueError(  # below it z / T overflows fp32 in the jitted softmax
        f"temperature={self.temperature} must be a finite number >= {MIN_TEMPERATURE:g} "
        "(use greedy=True for argmax)"
      )
    if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
      raise ValueError(f"repetition_penalty={self.repetition_penalty} must be > 0 (1.0 = off)")
    if self.penalty_history not in PENALTY_HISTORIES:
      raise ValueError(f"penalty_history={self.penalty_history!r}; use one of {PENALTY_HISTORIES}")
    if self.cache_order not in CACHE_ORDERS:
      raise ValueError(f"cache_order={self.cache_order!r}; use one of {CACHE_ORDERS}")
    if self.max_length is not None and int(self.max_length) < 2:
      raise ValueError(f"max_length={self.max_length} must be >= 2")
    if self.cache_order == "fht" and self.max_length is not None:  # (None: set_inputs refuses)
      if 2 * int(self.window) > int(self.max_length):
        raise ValueError(
          f"cache_order='fht' needs 2 * window <= max_length (its schedule's S_max = 2W = "
          f"{2 * int(self.window)} > {self.max_length}): use window <= {int(self.max_length) // 2} "
          "or cache_order='l2r'"
        )
    if isinstance(self.length_buckets, list):  # hashable: the config is a static jit argument
      object.__setattr__(self, "length_buckets", tuple(int(b) for b in self.length_buckets))
    check_buckets(self.length_buckets)
    for name in ("mask_token_id", "pad_token_id"):
      if int(getattr(self, name)) < 0:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
    if self.eos_token_id is not None and int(self.eos_token_id) == int(self.mask_token_id):
      raise ValueError(  # M's logit is suppressed: EOS would never be generated, no row would stop
        f"eos_token_id={self.eos_token_id} equals mask_token_id: take both from the tokenizer "
        "(EOS and M are different tokens), or eos_token_id=None to never stop early"
      )

  @property
  def stops_at_eos(self) -> bool:
    """Whether a prompted row stops at a generated EOS (the rule itself: `processors.eos_stop`)."""
    return self.stop_at_eos and self.eos_token_id is not None

  @property
  def setting(self) -> "DecodeSetting":
    """The decode setting (window, commit policy) these knobs decode with."""
    return DecodeSetting(int(self.window), self.policy)

  def replace(self, **kwargs) -> "SamplerConfig":
    return dataclasses.replace(self, **kwargs)

  def static(self) -> "SamplerConfig":
    """The part that shapes the compiled loop (the seed only seeds the default key)."""
    return dataclasses.replace(self, seed=0)


@dataclasses.dataclass
class SampleOutput:
  """What every sampler returns (host NumPy / lists).

  sequences: per row, context + generated tokens in position order, leftover masks removed
    (compaction) and everything after a stopping EOS dropped.
  generated: per row, the generated tokens only (same rules).
  canvas: int [B, Lc], the final canvas before compaction (M where nothing was committed).
  target: bool [B, Lc], the positions that were to be generated.
  commit_step: int [B, Lc], the decoding step (0-based, per row) at which a position was committed,
    -1 for context and never-committed positions.
  num_steps: int [B], decoding steps run per row.
  forward_calls: int [B], model calls that advanced the row (prompt/context encoding included).
  num_committed: int [B], tokens committed (those dropped after an EOS stop included).
  stopped: bool [B], the row stopped at an EOS.
  token_logprob: fp32 [B, Lc], the log-probability of each committed token under the distribution
    it was drawn from (processed logits, M suppressed, temperature when sampling, nucleus-
    renormalised when top_p < 1); 0 for context and never-committed positions. Tokens committed
    after a stopping EOS are included (they were drawn). What `rl.scoring` reproduces. None
    unless `SamplerConfig.rollout_stats` (as `cache_order`).
  cache_order: int [B, Lc], when each clean token's K/V entered the KV cache, as a rank, context
    first (-1: never committed). Set sampler: a strict order (context in position order, then
    each step's committed set in its cache order, `set_inputs.cache_ranks`); AR: the position;
    BD3LM: the index of the call that caches the token (0 = the prompt, b + 1 = decode block b,
    whose tokens attend each other by the grid rule); None where a sampler has no cache (MDLM).
  """

  sequences: List[List[int]]
  generated: List[List[int]]
  canvas: np.ndarray
  target: np.ndarray
  commit_step: np.ndarray
  num_steps: np.ndarray
  forward_calls: np.ndarray
  num_committed: np.ndarray
  stopped: np.ndarray
  token_logprob: Optional[np.ndarray] = None
  cache_order: Optional[np.ndarray] = None

  @property
  def tokens_per_step(self) -> float:
    """Mean committed tokens per decoding step over the batch (the parallelism factor)."""
    steps = float(np.sum(self.num_steps))
    return float(np.sum(self.num_committed)) / steps if steps else 0.0

  @property
  def num_generated(self) -> int:
    """Generated tokens in the outputs (after compaction and EOS truncation)."""
    return int(sum(len(g) for g in self.generated))


def step_counts(num_tokens: int, num_steps: Optional[int] = None) -> np.ndarray:
  """Tokens to commit per step, n_i = round(N t_i) - round(N t_{i+1}) (SPEC §4.2, §8.13).

  t comes from a float64 linspace(1, 0, min(T, N) + 1); `np.round` rounds half to even, as the
  reference's `round`. For T >= N every count is 1.

  Example: N=48, T=32 gives n_0 = 48 - round(46.5) = 2.
  """
  n = int(num_tokens)
  if n < 0:
    raise ValueError(f"num_tokens={n} must be >= 0")
  if n == 0:
    return np.zeros((0,), np.int64)
  t_steps = n if num_steps is None else min(int(num_steps), n)
  t = np.linspace(1.0, 0.0, t_steps + 1, dtype=np.float64)
  r = np.round(n * t)
  return (r[:-1] - r[1:]).astype(np.int64)


def count_table(num_tokens, num_steps: Optional[int]) -> np.ndarray:
  """Per-row schedules padded into int32 [B, K] (K = the longest schedule, at least 1)."""
  rows = [step_counts(n, num_steps) for n in num_tokens]
  k = max(1, max(len(r) for r in rows))
  out = np.zeros((len(rows), k), np.int32)
  for i, r in enumerate(rows):
    out[i, : len(r)] = r
  return out


__all__ = [
  "CommitPolicy",
  "DecodeSetting",
  "commit_policy",
  "tau_label",
  "SamplerConfig",
  "SampleOutput",
  "step_counts",
  "count_table",
  "PENALTY_HISTORIES",
  "CACHE_ORDERS",
  "bucket_length",
  "check_buckets",
  "BUCKET_MIN",
]
