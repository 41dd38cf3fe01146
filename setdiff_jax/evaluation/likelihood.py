"""Likelihood bounds per sequence: the one-order bound of SPEC §1.5 / §6.1 and a K-draw estimate.

The one implementation behind both the training loop's eval (`evaluate` on the rows of
`eval_rows`: `eval/nll` in metrics.jsonl) and `launch/evaluate.py --eval=likelihood`, so the
two give the same number for the same checkpoint, rows and seed. Which bound and K-draw aggregate
a method uses is its objective's business (`objectives.get(name).eval_batch / num_draws /
aggregate_draws`).

Per method (all reported per token, over the same tokens the training-time eval counts). Prompt
tokens (`context_mask`, the prompt/answer rows of `data/pairs.py`) are never targets for any
method: a prompt/answer run's value is the NLL of the answer tokens and their EOS given the prompt.

  setdlm  one-order bound: the exact log-likelihood of each sequence under ONE sampled staggered
          order, -log p(x | sigma), sigma ~ pi (keep_clean_bos: the BOS slot is dropped; pad-id
          targets are dropped), summed over sequences and divided by the token count (SPEC §1.5).
          K-order estimate: log p(x) >= E[log mean_k p(x | sigma_k)] with sigma_k ~ pi i.i.d.
          (importance sampling with the order prior as proposal; by Jensen it is tighter than the
          one-order bound and it grows with K). Reported as
              nll_K = -sum_seq logmeanexp_k(-nll_seq_k) / sum tokens.
  ar      the exact next-token NLL (one value; K does not apply).
  mdlm,   the 1/t NELBO of SPEC §1.6 with one t (MDLM) or one t per block (BD3LM) and one masking
  bd3lm   draw per sequence. Each NELBO draw is an unbiased estimate of the same bound, not the
          log of an unbiased likelihood estimate, so log-mean-exp does not apply: the K-sample
          value is the mean of K NELBO draws (same bound, lower variance).

Reproducibility and batch-size invariance: the random draw k of the sequence with global index i
(its position in the unshuffled eval split) uses the key fold_in(fold_in(key(seed), i), k), and the
loss is vmapped over single rows, so a sequence's value never depends on which batch it sits in.
The final partial batch is filled with zero-weight rows (attention_mask 0). Draw k = 0 is the
one-order bound, so K = 1 gives exactly the one-order value.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax import objectives
from setdiff_jax.diffusion import losses
from setdiff_jax.objectives import logmeanexp
from setdiff_jax.data import pipeline
from setdiff_jax import models
from setdiff_jax.models import Backbone

DEFAULT_SEED = 1  # the reference's likelihood seed (SPEC §1.5)


def row_keys(seed: int, rows: np.ndarray, k: int) -> jax.Array:
  """Keys [len(rows)] of draw k for the sequences with global indices `rows`."""
  base = jax.random.key(seed)
  rows = jnp.asarray(rows, jnp.uint32)
  return jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(base, r), k))(rows)


def row_order(
  obj_cfg: losses.ObjectiveConfig, tokens: jax.Array, attention_mask: jax.Array, key: jax.Array
) -> jax.Array:
  """The staggered order (int32 [L]) that the SetDLM bound of one row [L] uses for draw `key`."""
  batch = {"tokens": tokens[None], "attention_mask": attention_mask[None]}
  return losses.setdlm_order(obj_cfg, batch, key, train=False)[0]  # SetDLM's draw


@functools.lru_cache(maxsize=32)
def _cached_row_nll_fn(model_config, obj_cfg: losses.ObjectiveConfig):
  return make_row_nll_fn(models.build(model_config), obj_cfg)


def make_row_nll_fn(model: Backbone, obj_cfg: losses.ObjectiveConfig):
  """jit(params, batch [B, L], keys [B]) -> (nll_sum [B], num_tokens [B]), one row at a time.

  The eval loss (train=False) of each row on its own, with its own key: the per-row sum of
  weighted NLLs (NELBO terms for MDLM/BD3LM) and its token count. SetDLM rows are evaluated under
  `row_order(obj_cfg, tokens, attention_mask, key)` (the method's `eval_batch`); MDLM/BD3LM draw
  t and the mask from the key.
  """
  objective = objectives.get(obj_cfg.name)

  def one(params, row, key):
    batch = objective.eval_batch(obj_cfg, {k: v[None] for k, v in row.items()}, key)
    _, metrics = objective.loss(obj_cfg, model, params, batch, key, train=False)
    return metrics["nll_sum"], metrics["num_tokens"]

  return jax.jit(jax.vmap(one, in_axes=(None, 0, 0)))


def per_token(nll: float, tokens: float, prefix: str = "") -> Dict[str, float]:
  """{nll, ppl, bpd} from a summed NLL (nats) and a token count."""
  v = nll / max(tokens, 1.0)
  return {
    f"{prefix}nll": float(v),
    f"{prefix}ppl": float(math.exp(min(v, 700.0))),
    f"{prefix}bpd": float(v / math.log(2.0)),
  }


def sequence_nlls(
  model: Backbone,
  params,
  obj_cfg: losses.ObjectiveConfig,
  tokens: np.ndarray,
  attention_mask: np.ndarray,
  *,
  num_draws: int = 1,
  seed: int = DEFAULT_SEED,
  batch_size: int = 32,
  row_offset: int = 0,
  fn=None,
  sharding=None,
  context_mask: Optional[np.ndarray] = None,
  row_ids: Optional[np.ndarray] = None,
):
  """Per-sequence summed NLLs for draws 0..num_draws-1.

  Args:
    tokens, attention_mask: int [N, L] (all real sequences; no filler rows).
    context_mask: optional int [N, L], 1 on conditioning tokens (a prompt): never targets, never
      masked, so the value is the bound on the rest given them (`data/pairs.py` row layout).
    num_draws: K (orders for SetDLM, (t, mask) draws for MDLM/BD3LM; AR is deterministic and
      always uses one).
    batch_size: rows per jitted call; the last call is filled with zero-weight rows. Results do
      not depend on it.
    row_offset: global index of the first row (for evaluating a split in pieces).
    row_ids: optional int [N], the global index of each row (its draw keys); default
      row_offset + arange(N).
    sharding: where each batch is placed (e.g. the training mesh's batch sharding); None lets jit
      place it (one host).
  Returns:
    (nll [K, N] float64, num_tokens [N] float64).
  """
  tokens = np.asarray(tokens, np.int32)
  attention_mask = np.asarray(attention_mask, np.int32)
  n, length = tokens.shape
  ctx = None if context_mask is None else np.asarray(context_mask, np.int32)
  ids = (np.arange(n) + row_offset) if row_ids is None else np.asarray(row_ids, np.int64)
  if ids.shape != (n,):
    raise ValueError(f"row_ids has shape {ids.shape}; expected ({n},)")
  fn = fn or _cached_row_nll_fn(model.config, obj_cfg)
  # Never more filler than one shard's worth of rows: a batch_size above the split (e.g. a
  # whole-split eval with a huge eval_batch_size) padded it up to that size on the device.
  shards = 1 if sharding is None else batch_size // sharding.shard_shape((batch_size, length))[0]
  batch_size = min(batch_size, -(-n // shards) * shards)
  nll = np.zeros((num_draws, n), np.float64)
  count = np.zeros((n,), np.float64)
  for start in range(0, n, batch_size):
    stop = min(start + batch_size, n)
    pad = batch_size - (stop - start)
    tok = np.concatenate(
      [tokens[start:stop], np.full((pad, length), obj_cfg.pad_token_id, np.int32)]
    )
    att = np.concatenate([attention_mask[start:stop], np.zeros((pad, length), np.int32)])
    rows = np.concatenate([ids[start:stop], np.zeros((pad,), np.int64)])
    batch = {"tokens": tok, "attention_mask": att}
    if ctx is not None:
      batch["context_mask"] = np.concatenate([ctx[start:stop], np.zeros((pad, length), np.int32)])
    batch = jax.device_put(batch, sharding) if sharding is not None else jax.device_put(batch)
    for k in range(num_draws):
      s, c = _fetch(fn(params, batch, row_keys(seed, rows, k)))
      nll[k, start:stop] = np.asarray(s, np.float64)[: stop - start]
      if k == 0:
        count[start:stop] = np.asarray(c, np.float64)[: stop - start]
  return nll, count


def _fetch(values):
  """Device arrays -> host numpy on every process (a multi-process run's per-row results are
  sharded over devices other processes hold: gathered across processes)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return multihost_utils.process_allgather(values, tiled=True)
  return jax.device_get(values)


def summarize(obj_name: str, nll: np.ndarray, count: np.ndarray) -> Dict[str, Any]:
  """Dataset-level metrics from per-sequence NLLs [K, N] and token counts [N]."""
  objective = objectives.get(obj_name)
  k = nll.shape[0]
  tokens = float(np.sum(count))
  out: Dict[str, Any] = {
    "num_sequences": int(nll.shape[1]),
    "num_tokens": tokens,
    "num_draws": int(k),
    "estimator": objective.estimator,
    "estimator_K": objective.estimator_k(k),
  }
  out.update(per_token(float(np.sum(nll[0])), tokens))  # the one-order / one-draw bound
  if not objective.exact_likelihood:
    out.update(per_token(float(np.sum(np.mean(nll, 0))), tokens, "meanK_"))
  out.update(per_token(float(np.sum(objective.aggregate_draws(nll))), tokens, "K_"))
  return out


def bound_data_config(data_cfg):
  """The data config of the bound's rows: a run trained with `data.pad_targets=eos` is scored on
  the `none` layout ([BOS] prompt answer [EOS] pad, the pads not attended), so the bound counts the
  answer and its first EOS only, never the EOS tail (the tail is a deterministic function of the
  answer's length; scoring it would make the per-token value look better with every extra EOS),
  and the value is comparable across pad_targets settings."""
  if data_cfg.get("pad_targets", "none") == "none":
    return data_cfg
  data_cfg = data_cfg.copy_and_resolve_references()
  data_cfg.pad_targets = "none"
  return data_cfg


def eval_rows(config, tokenizer, *, max_rows: Optional[int] = None, split: str = "eval"):
  """The run's eval rows in split order: (tokens, attention_mask, context_mask), int32 [N, L].

  Built with the training pipeline (same rows as the train loop's eval), unshuffled, one epoch;
  filler rows of the last batch are dropped. `max_rows` keeps the first rows only. context_mask
  is 1 on the prompt (BOS included) of prompt/answer rows (`data/pairs.py`) and all zeros for
  text rows: prompt tokens are never targets, so a prompt/answer run's bound is an answer-token
  NLL (the answer and its EOS). EOS-tail rows (`data.pad_targets=eos`) are scored in the `none`
  layout (`bound_data_config`).
  """
  ds = pipeline.make_dataset(
    bound_data_config(config.data),
    tokenizer,
    split=split,
    seq_len=int(config.seq_len),
    global_batch_size=64,
    seed=int(config.seed),
    shuffle=False,
    num_epochs=1,
    drop_remainder=False,
  )
  toks, atts, ctxs, total = [], [], [], 0
  for batch in ds:
    real = np.asarray(batch["attention_mask"]).sum(-1) > 0
    toks.append(np.asarray(batch["tokens"])[real])
    atts.append(np.asarray(batch["attention_mask"])[real])
    ctx = batch.get("context_mask")
    ctxs.append(np.zeros_like(atts[-1]) if ctx is None else np.asarray(ctx)[real])
    total += int(real.sum())
    if max_rows is not None and total >= max_rows:
      break
  if not toks:
    raise ValueError("the eval split produced no rows")
  tokens, att, ctx = np.concatenate(toks), np.concatenate(atts), np.concatenate(ctxs)
  if max_rows is not None:
    tokens, att, ctx = tokens[:max_rows], att[:max_rows], ctx[:max_rows]
  return tokens.astype(np.int32), att.astype(np.int32), ctx.astype(np.int32)


def likelihood_eval(
  model: Backbone,
  params,
  obj_cfg: losses.ObjectiveConfig,
  tokens: np.ndarray,
  attention_mask: np.ndarray,
  *,
  num_orders: int = 1,
  seed: int = DEFAULT_SEED,
  batch_size: int = 32,
  context_mask: Optional[np.ndarray] = None,
) -> Dict[str, Any]:
  """One-order (one-draw) bound and K-draw estimate of a model on given rows (see module doc).

  context_mask: optional int [N, L], 1 on prompt tokens (never targets; `eval_rows` gives it).
  Returns a dict with nll/ppl/bpd (draw 0), K_nll/K_ppl/K_bpd (K-order log-mean-exp for SetDLM,
  mean of K NELBO draws for MDLM/BD3LM, exact for AR), meanK_* (mean of the K one-draw values),
  token and sequence counts, the seed and a description of both estimators.
  """
  draws = objectives.get(obj_cfg.name).num_draws(num_orders)
  t0 = time.perf_counter()
  nll, count = sequence_nlls(
    model,
    params,
    obj_cfg,
    tokens,
    attention_mask,
    num_draws=draws,
    seed=seed,
    batch_size=batch_size,
    context_mask=context_mask,
  )
  out = summarize(obj_cfg.name, nll, count)
  out.update(
    method=obj_cfg.name,
    seed=int(seed),
    num_orders_requested=int(num_orders),
    seconds=time.perf_counter() - t0,
  )
  return out


def evaluate(
  model: Backbone,
  params,
  obj_cfg: losses.ObjectiveConfig,
  tokens: np.ndarray,
  attention_mask: np.ndarray,
  *,
  batch_size: int,
  batch_sharding=None,
  context_mask: Optional[np.ndarray] = None,
) -> Dict[str, float]:
  """The training loop's eval: this module's one-order bound on given rows (per-row keys, seed
  DEFAULT_SEED: one fixed order / t draw per eval sequence).

  Same function, rows and seed as `launch/evaluate.py --eval=likelihood --max_rows=N`, so the two
  agree exactly for the same checkpoint. Prompt tokens (`context_mask`) are never targets: a
  prompt/answer run's eval/nll is an answer-token NLL. Returns eval/{nll, ppl, bpd, num_tokens}.
  """
  nll, count = sequence_nlls(
    model,
    params,
    obj_cfg,
    tokens,
    attention_mask,
    seed=DEFAULT_SEED,
    batch_size=batch_size,
    sharding=batch_sharding,
    context_mask=context_mask,
  )
  tokens_total = float(np.sum(count))
  values = {f"eval/{k}": v for k, v in per_token(float(np.sum(nll[0])), tokens_total).items()}
  values["eval/num_tokens"] = tokens_total
  return values


__all__ = [
  "DEFAULT_SEED",
  "row_keys",
  "row_order",
  "make_row_nll_fn",
  "logmeanexp",
  "per_token",
  "sequence_nlls",
  "summarize",
  "bound_data_config",
  "eval_rows",
  "likelihood_eval",
  "evaluate",
]
