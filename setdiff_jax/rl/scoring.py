"""Exact trajectory scoring: the log-likelihood of a sampler's rollout under the policy (issue 28).

A set decoder's rollout is an ordered sequence of committed sets C_1, C_2, ...; every committed
token was drawn from the prompt and the clean tokens of earlier steps only, so

    log pi(y | x) = sum_t sum_{i in C_t} log p_theta(y_i | x, y_{C<t})

*provided the commit decision is a function of the step's predictive distributions only*
(`check_exact`: a token-independent commit policy such as `pmax`, `topk`, `entropy_bound`;
temperature sampling without nucleus filtering or repetition penalty). Then the commit sets are a
deterministic function of the history and the product above is the probability of the trajectory
(tokens and commit steps). The default `threshold` policy ranks by the sampled token's probability,
so which positions commit depends on draws that are then thrown away and the formula is wrong
(A = (.6, .4), B = (.9, .1), one commit per step: a0 then b0 has probability .6 * .1 * .9 = .054,
the formula says .54).

  Rollout                   the arrays a scorer needs (host -> `rollout_from_output`)
  token_logprobs(...)       fp32 [B, L]: log pi(y_i | x, y_{C<t}) at generated positions, else 0
  token_features(...)       [B, L, D]: the hidden states the head turns into those distributions
  head_scores(...)          fp32 [B, L] log-probs (+ the exact KL to a reference) from features,
                            the head applied `chunk` positions at a time: memory O(B chunk V),
                            never [B, L, V] (the RL path; `token_logprobs` uses it)
  token_logits(...)         fp32 [B, L, V]: the full log-softmax rows (the tests' reference)
  check_exact(method, cfg)  ValueError (one `error:` line) for a setting that is not exact

Bad arguments are one ValueError naming them, never NaN scores: temperature < 1e-4 (or not
finite), mask_token_id outside [0, V), chunk < 0, and for NumPy rollouts (the host's own values)
token ids outside [0, V) (a rollout sampled with another vocabulary); jax arrays are not read.

Per method (its registry entry's `rollout_scoring`; all pure, jittable with method / model /
temperature / mask_token_id / block_size / max_steps static, differentiable in params):
  setdlm  'two_stream': one two-stream forward over 2L slots: the clean tokens (causal in cache
          order) and one mask token per position that sees the clean tokens committed at
          earlier steps and itself (`masks.rollout_set_mask`); rotary positions are the
          tokens' own positions.
  ar      'causal': one causal pass; the token at position i is scored by the logits at i - 1.
  bd3lm   'block_replay': a block's masks attend to each other, so the steps are replayed: one
          clean pass gives every clean token's K/V (`masks.rollout_block_clean_mask`), then one
          forward per step (a `lax.scan` over up to `max_steps` steps, default L; steps past a
          batch's last one are skipped by `lax.cond`) feeds the step's block of G = block_size
          slots (committed tokens clean, the rest M) against those K/V
          (`masks.rollout_block_step_mask`). Cost: 1 + (number of steps) forwards of G query
          rows over L + G keys, about what sampling cost, plus their backward; the scan keeps
          [steps, B, G] log-probabilities ([steps, B, G, V] rows for `token_logits`).
MDLM has none (not supported: its every step is a full bidirectional pass over the canvas).

Memory: the scorers run the backbone up to its last hidden states only (`return_hidden`; a
`Forward` or logits function has no hidden states, its logits are the features), then
`head_scores` scans over chunks of `chunk` positions (`rl.score_chunk`, default 32), each
`jax.checkpoint`ed, so neither the forward nor the backward pass holds more than one chunk's
fp32 [B, chunk, V] logits (two with a reference): at Qwen3's V = 151,936 a [B, L, V] fp32 copy is
~10 GB at B = 64, L = 256.

Rows are laid out as the samplers lay them out (left-aligned, absolute positions = column index,
padding after each row), so mixed prompt lengths need nothing special.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax import decoders, models
from setdiff_jax.diffusion import masks
from setdiff_jax.models import fused_head
from setdiff_jax.models.layers import suppress_mask_logit
from setdiff_jax.rl import objective
from setdiff_jax.sampling import policies
from setdiff_jax.sampling.cache import apply_fn, backbone_hidden_fn
from setdiff_jax.sampling.config import MIN_TEMPERATURE, SampleOutput, SamplerConfig

SCORERS = ("two_stream", "causal", "block_replay")  # `Method.rollout_scoring` values


class Rollout(NamedTuple):
  """One batch of rollouts, all [B, L] in the samplers' layout (position = column).

  tokens int32 (M / pad where nothing was committed); valid bool (real, attended positions:
  context | generated); context bool (the prompt / visible context); generated bool (positions
  the sampler committed); commit_step int32 (0-based decoding step, -1 for context /
  uncommitted); cache_order int32 (`SampleOutput.cache_order`: SetDLM the strict rank at which
  each clean token entered the KV cache, context first; AR the position; BD3LM the call that
  cached it, 0 = prompt, b + 1 = decode block b; -1 where invalid).
  """

  tokens: jax.Array
  valid: jax.Array
  context: jax.Array
  generated: jax.Array
  commit_step: jax.Array
  cache_order: jax.Array


def rollout_from_output(out: SampleOutput) -> Rollout:
  """The rollout of a sampler's output (`set_generate`, `set_infill`, `reference_*`,
  `ar_generate`, `bd3lm_generate`, sampled with `SamplerConfig.rollout_stats`), as NumPy
  arrays; every committed token is included, those committed after a stopping EOS too (they were
  drawn)."""
  if out.cache_order is None:
    raise ValueError(
      "this sampler's output has no cache order: sample the rollouts with "
      "SamplerConfig(rollout_stats=True) (MDLM has no cache: exact scoring supports the "
      f"samplers of {', '.join(supported())})"
    )
  order = np.asarray(out.cache_order, np.int32)
  step = np.asarray(out.commit_step, np.int32)
  target = np.asarray(out.target, bool)
  generated = target & (step >= 0)
  context = (order >= 0) & ~target
  valid = context | generated
  return Rollout(
    tokens=np.asarray(out.canvas, np.int32),
    valid=valid,
    context=context,
    generated=generated,
    commit_step=np.where(generated, step, -1).astype(np.int32),
    cache_order=np.where(valid, order, -1).astype(np.int32),
  )


def supported() -> tuple:
  """The methods whose decoder has an exact rollout scorer."""
  return tuple(n for n, d in decoders.REGISTRY.items() if d.rollout_scoring in SCORERS)


def scorer(method: str) -> str:
  """The scoring kind of `method` (a registry name); ValueError naming the supported ones."""
  kind = decoders.get(method).rollout_scoring
  if kind not in SCORERS:
    raise ValueError(
      f"objective={method}: exact trajectory scoring supports {', '.join(supported())}"
    )
  return kind


def check_exact(method: str, cfg: SamplerConfig):
  """Raises ValueError (one line: the setting and the fix) unless rollouts of `method` sampled
  with `cfg` have the exact likelihood `token_logprobs` computes."""
  scorer(method)
  if cfg.greedy:
    raise ValueError(
      "greedy=True: greedy decoding draws nothing to score; sample the rollouts "
      "(greedy=False, --temperature=T)"
    )
  if cfg.top_p < 1.0:
    raise ValueError(
      f"top_p={cfg.top_p}: a nucleus-filtered rollout's likelihood is not the "
      "model's; use top_p=1.0 (temperature only) for exact scoring"
    )
  if cfg.repetition_penalty != 1.0:
    raise ValueError(
      f"repetition_penalty={cfg.repetition_penalty}: the scorer does not replay "
      "logits processors; use repetition_penalty=1.0 for exact scoring"
    )
  if decoders.get(method).uses_threshold and policies.token_dependent(cfg.policy.name):
    raise ValueError(
      f"--policy={cfg.policy.name} decides which positions commit from the sampled "
      "tokens, so the trajectory likelihood is not exact; use a policy that reads "
      "the distribution only (--policy=pmax is threshold by max-probability)"
    )


def _features(model):
  """(apply, head) of the feature path: apply(params, tokens, positions, mask, kv, head_start) ->
  (features [B, S, F], kv) and head(params, features) -> fp32 logits [..., V]. A backbone hands
  over its last hidden states and head (exactly its logits: `fused_head.head_logits`); anything
  else (a `Forward`, a logits function) returns logits, and its head is the identity. Raw params:
  the scorer differentiates them, so no decode-only head copy."""
  if models.is_backbone(model) and hasattr(model, "output_head"):
    dt = jnp.dtype(getattr(model.config, "dtype", "float32"))

    def head(params, h):
      kernel, bias = model.output_head(params)
      return fused_head.head_logits(h, kernel, bias, dt)

    return backbone_hidden_fn(model.config), head
  return apply_fn(model), lambda params, z: z.astype(jnp.float32)


def _check_args(temperature, chunk=None):
  """ValueError for a static argument that would give NaN (temperature 0: z / 0) or garbage
  (negative temperature) scores, or a chunk the head cannot be split into."""
  if not isinstance(temperature, jax.core.Tracer):  # a traced one cannot be read: as given
    t = float(temperature)
    if not (math.isfinite(t) and t >= MIN_TEMPERATURE):
      raise ValueError(
        f"temperature={temperature} must be a finite number >= {MIN_TEMPERATURE:g}: the "
        "temperature the rollouts were sampled at (SamplerConfig.temperature; greedy rollouts "
        "draw nothing to score)"
      )
  if chunk is not None and (
    isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 0
  ):
    raise ValueError(
      f"chunk={chunk!r} must be an int >= 0 (positions per head call; None or 0: all at once)"
    )


def _vocab_size(model, params, feats) -> int:
  """V of the head's logits for features `feats` [B, L, F] (shapes only: nothing runs)."""

  def spec(x):
    return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))

  one = jax.ShapeDtypeStruct((1, 1) + tuple(feats.shape[2:]), feats.dtype)
  head = _features(model)[1]
  return int(jax.eval_shape(head, jax.tree_util.tree_map(spec, params), one).shape[-1])


def _check_vocab(v: int, rollout: Rollout, mask_token_id: int):
  """ValueError for a mask id or (NumPy rollouts) token ids outside the model's [0, V): the
  gather and the logit update would read past the vocabulary and give NaN or wrapped scores."""
  if not 0 <= int(mask_token_id) < v:
    raise ValueError(
      f"mask_token_id={mask_token_id} must be in [0, V={v}): the sampler's "
      "SamplerConfig.mask_token_id, a token of this model's vocabulary"
    )
  # Only NumPy tokens are checked: their values are the host's own. A jax.Array is either traced
  # (under jit its values exist only at run time, where no Python error can be raised) or lives
  # on the devices (reading it would copy it back and wait for it on every call, in the RL loop's
  # hot path); the RL loop builds its rollouts from the sampler of the same model.
  tokens = rollout.tokens
  if isinstance(tokens, np.ndarray) and tokens.size:
    bad = (tokens < 0) | (tokens >= v)
    if bad.any():
      b, i = (int(x[0]) for x in np.nonzero(bad))
      raise ValueError(
        f"rollout.tokens holds ids outside [0, V={v}): {int(tokens[b, i])} at row {b}, position "
        f"{i} ({int(bad.sum())} such): the rollout was sampled with another vocabulary than "
        "this model's; score it with the model (and tokenizer) that sampled it"
      )


def _log_softmax(logits: jax.Array, temperature: float, mask_token_id: int) -> jax.Array:
  """As the samplers: M suppressed, then / temperature, then log-softmax; fp32."""
  z = suppress_mask_logit(logits.astype(jnp.float32), mask_token_id)
  return jax.nn.log_softmax(z / temperature if temperature != 1.0 else z, axis=-1)


def _positions(r: Rollout) -> jax.Array:
  b, length = r.tokens.shape
  return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))


def _set_feats(apply, params, r: Rollout, mask_token_id) -> jax.Array:
  length = r.tokens.shape[1]
  pos = _positions(r)
  tokens = jnp.concatenate([r.tokens, jnp.full_like(r.tokens, mask_token_id)], -1)
  mask = masks.rollout_set_mask(r.valid, r.commit_step, r.cache_order)
  feats, _ = apply(params, tokens, jnp.concatenate([pos, pos], -1), mask, None, length)
  return feats  # the mask stream: row i predicts token i


def _ar_feats(apply, params, r: Rollout) -> jax.Array:
  mask = masks.causal_valid_mask(jnp.asarray(r.valid, bool))
  feats, _ = apply(params, r.tokens, _positions(r), mask, None, 0)
  return jnp.concatenate([jnp.zeros_like(feats[:, :1]), feats[:, :-1]], 1)  # row i scores token i


def _block_size(method: str, block_size) -> int:
  if block_size is None:
    raise ValueError(
      f"objective={method} scores by replaying its blocks: pass block_size (the "
      "sampler's SamplerConfig.block_size)"
    )
  return int(block_size)


def _block_steps(apply, params, r: Rollout, mask_token_id, g: int, max_steps: Optional[int]):
  """Per step t (scan): the block's G slots (positions int32 [B, G], scored bool [B, G]) and
  their features [B, G, F]; stacked over steps."""
  b, length = r.tokens.shape
  pos = _positions(r)
  valid = jnp.asarray(r.valid, bool)
  step = jnp.asarray(r.commit_step, jnp.int32)
  seg = jnp.asarray(r.cache_order, jnp.int32)
  clean = masks.rollout_block_clean_mask(pos, valid, seg, g)
  _, kv = apply(params, r.tokens, pos, clean, None, length)  # head skipped
  last = jnp.max(step)
  n_steps = length if max_steps is None else int(max_steps)
  feat = jax.eval_shape(
    lambda: apply(params, r.tokens[:, :1], pos[:, :1], jnp.ones((b, 1, 1), bool), None, 0)
  )[0]

  def one(t):
    here = step == t  # the positions committed at step t: all in one block
    segment = jnp.max(jnp.where(here, seg, -1), -1)  # [B]; -1: the row ran no step t
    in_block = valid & (seg == segment[:, None]) & (segment[:, None] >= 1)
    order = jnp.argsort(~in_block, axis=-1, stable=True)[:, :g]  # block slots, position order
    q_pos = jnp.take_along_axis(pos, order, -1)
    q_valid = jnp.take_along_axis(in_block, order, -1)
    q_step = jnp.take_along_axis(step, order, -1)
    revealed = jnp.take_along_axis(r.context, order, -1) | ((q_step >= 0) & (q_step < t))
    q_tok = jnp.where(revealed, jnp.take_along_axis(r.tokens, order, -1), mask_token_id)
    mask = masks.rollout_block_step_mask(q_pos, q_valid, pos, valid, seg, segment, g)
    feats, _ = apply(params, q_tok, q_pos, mask, kv, 0)
    return q_pos, q_valid & (q_step == t), feats.astype(feat.dtype)

  def skip(t):
    return (
      jnp.zeros((b, g), jnp.int32),
      jnp.zeros((b, g), bool),
      jnp.zeros((b, g, feat.shape[-1]), feat.dtype),
    )

  def body(carry, t):
    return carry, jax.lax.cond(t <= last, one, skip, t)

  _, out = jax.lax.scan(body, None, jnp.arange(n_steps, dtype=jnp.int32))
  return out  # q_pos [T, B, G], scored [T, B, G], features [T, B, G, F]


def _block_scatter(out, b: int, length: int):
  """Steps' slot values -> per position [B, L, F] (each generated position is scored once)."""
  q_pos, scored, vals = out
  t, _, g = q_pos.shape
  rows_idx = jnp.broadcast_to(jnp.arange(b)[None, :, None], q_pos.shape)
  where = jnp.where(scored, q_pos, length)  # unscored slots dropped
  buf = jnp.zeros((b, length) + vals.shape[3:], vals.dtype)
  return buf.at[rows_idx.reshape(-1), where.reshape(-1)].set(
    vals.reshape((t * b * g,) + vals.shape[3:]), mode="drop"
  )


def token_features(
  method: str,
  model,
  params,
  rollout: Rollout,
  *,
  mask_token_id: int,
  block_size: Optional[int] = None,
  max_steps: Optional[int] = None,
) -> jax.Array:
  """[B, L, F]: at every position the features the head turns into the distribution its token
  was drawn from (a backbone's last hidden states, F = D; a logits function's logits, F = V); 0
  at unscored positions of block_replay. Arguments as `token_logits`."""
  r = Rollout(*[jnp.asarray(x) for x in rollout])
  apply, _ = _features(model)
  kind = scorer(method)
  if kind == "two_stream":
    feats = _set_feats(apply, params, r, mask_token_id)
  elif kind == "causal":
    feats = _ar_feats(apply, params, r)
  else:
    out = _block_steps(apply, params, r, mask_token_id, _block_size(method, block_size), max_steps)
    feats = _block_scatter(out, *r.tokens.shape)
  _check_vocab(_vocab_size(model, params, feats), rollout, mask_token_id)
  return feats


def _to_chunks(x: jax.Array, chunk: int) -> jax.Array:
  """[B, L, ...] -> [L' / chunk, B, chunk, ...], L zero-padded to L' (a multiple of chunk)."""
  b, length = x.shape[:2]
  n = -(-length // chunk)
  x = jnp.pad(x, [(0, 0), (0, n * chunk - length)] + [(0, 0)] * (x.ndim - 2))
  return jnp.moveaxis(x.reshape((b, n, chunk) + x.shape[2:]), 1, 0)


def _from_chunks(y: jax.Array, length: int) -> jax.Array:
  """[n, B, chunk] -> [B, L]."""
  return jnp.moveaxis(y, 0, 1).reshape(y.shape[1], -1)[:, :length]


def head_scores(
  model,
  params,
  feats: jax.Array,
  rollout: Rollout,
  *,
  temperature: float,
  mask_token_id: int,
  chunk: Optional[int] = None,
  ref_params=None,
  ref_feats: Optional[jax.Array] = None,
):
  """(logp fp32 [B, L], kl fp32 [B, L] or None) from features [B, L, F] (`token_features`).

  logp: log pi(y_i | ...) of the rollout's token at every generated position (0 elsewhere);
  kl: with `ref_params` / `ref_feats` (the reference's features of the same rollout), the exact
  KL(pi || pi_ref) = sum_v pi_v log(pi_v / ref_v) of both temperature-scaled distributions per
  generated position (`objective.kl_per_token`). The head runs over `chunk` positions at a time
  (None / 0 / >= L: one chunk) in a `lax.scan` of `jax.checkpoint`ed steps, so at most one
  chunk's [B, chunk, V] logits (policy and reference) are live, forward or backward; the numbers
  are those of the full computation. Differentiable in params (and ref_params). ValueError for
  temperature < 1e-4, chunk < 0, mask_token_id or (NumPy) rollout tokens outside [0, V).
  """
  _check_args(temperature, chunk)
  _check_vocab(_vocab_size(model, params, feats), rollout, mask_token_id)
  tokens = jnp.asarray(rollout.tokens, jnp.int32)
  gen = jnp.asarray(rollout.generated, bool)
  length = tokens.shape[1]
  _, head = _features(model)
  with_ref = ref_params is not None and ref_feats is not None
  c = length if not chunk or int(chunk) >= length else int(chunk)

  @jax.checkpoint
  def one(p, rp, f, t, rf):
    lsm = _log_softmax(head(p, f), temperature, mask_token_id)
    lp = jnp.take_along_axis(lsm, t[..., None], -1)[..., 0]
    if not with_ref:
      return lp, jnp.zeros_like(lp)
    ref = _log_softmax(head(rp, rf), temperature, mask_token_id)
    return lp, objective.kl_per_token(lsm, ref)

  xs = (
    _to_chunks(feats, c),
    _to_chunks(tokens, c),
    _to_chunks(ref_feats, c) if with_ref else jnp.zeros((-(-length // c),)),
  )
  _, (lp, kl) = jax.lax.scan(lambda _, x: (None, one(params, ref_params, *x)), None, xs)
  lp = jnp.where(gen, _from_chunks(lp, length), 0.0)
  return lp, (jnp.where(gen, _from_chunks(kl, length), 0.0) if with_ref else None)


def token_logits(
  method: str,
  model,
  params,
  rollout: Rollout,
  *,
  temperature: float,
  mask_token_id: int,
  block_size: Optional[int] = None,
  max_steps: Optional[int] = None,
) -> jax.Array:
  """fp32 [B, L, V]: at every generated position the full log-softmax row of the distribution
  its token was drawn from (M suppressed, logits / temperature), zeros elsewhere. The reference
  `head_scores` is tested against (it holds [B, L, V]: not for real vocabularies).

  method: a registry name with a scorer, `supported()` (static); model: a backbone module, a
  `Forward` or a logits function (static); params: the backbone's params (differentiable);
  rollout: `Rollout` (arrays or NumPy); block_size: G, block_replay only; max_steps: the replayed
  steps of block_replay (default L; pass the sampler's N to scan fewer). ValueError for
  temperature < 1e-4, mask_token_id or (NumPy) rollout tokens outside [0, V).
  """
  _check_args(temperature)
  feats = token_features(
    method,
    model,
    params,
    rollout,
    mask_token_id=mask_token_id,
    block_size=block_size,
    max_steps=max_steps,
  )
  rows = _log_softmax(_features(model)[1](params, feats), temperature, mask_token_id)
  return jnp.where(jnp.asarray(rollout.generated, bool)[..., None], rows, 0.0)


def token_logprobs(
  method: str,
  model,
  params,
  rollout: Rollout,
  *,
  temperature: float,
  mask_token_id: int,
  block_size: Optional[int] = None,
  max_steps: Optional[int] = None,
  chunk: Optional[int] = None,
) -> jax.Array:
  """fp32 [B, L]: log pi(y_i | x, y_{C<t}) at every generated position (0 elsewhere), under the
  temperature-scaled distribution the sampler drew from; the trajectory's log-likelihood is the
  row sum. The head runs `chunk` positions at a time (`head_scores`; None: all at once).
  Arguments as `token_logits`."""
  _check_args(temperature, chunk)  # before the forward
  feats = token_features(
    method,
    model,
    params,
    rollout,
    mask_token_id=mask_token_id,
    block_size=block_size,
    max_steps=max_steps,
  )
  return head_scores(
    model, params, feats, rollout, temperature=temperature, mask_token_id=mask_token_id, chunk=chunk
  )[0]


__all__ = [
  "Rollout",
  "rollout_from_output",
  "check_exact",
  "token_logprobs",
  "token_logits",
  "token_features",
  "head_scores",
  "supported",
  "scorer",
  "SCORERS",
]
