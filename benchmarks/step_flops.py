"""Model FLOPs of one DiT training step, for any method: what its loss makes the backbone compute.

The method's own loss is traced once on one row of L tokens with a stand-in backbone that records
each call it gets: the slots (S), the rows the output head runs on (S - head_start) and the
(query, key) pairs the attention mask allows. No method name is looked at (SetDLM: 2L slots, the
head on the noisy L, the set-causal pairs; AR: L - 1 slots, causal; MDLM: L, all pairs; BD3LM: 2L,
the head on L, block-causal). Then, per training step (forward 2, backward 4 FLOPs per
multiply-add parameter and row):

  6 B (P_token * S  +  D V * head rows  +  P_cond)  +  12 layers D B * pairs   (summed over calls)

P_token: the matmul parameters every slot goes through (attention q, k, v and output, MLP); D V:
the output head; P_cond: the adaLN conditioning (MDLM / BD3LM), applied once per row. Attention
scores and values: 2 x 2 D FLOPs per allowed pair and layer forward, twice that backward. Not
counted: embedding gathers and elementwise work (norms, GELU, softmax, rotary, residuals, the
loss, the optimizer), and the masked-out pairs a dense kernel also computes (hardware, not model,
FLOPs). XLA's cost analysis of the same step counts those too: tests/test_accelerator_check.py
compares the two.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax import objectives

COND_LAYERS = ("adaln", "sigma_map")  # applied to the conditioning vector, once per row


class CallRecorder:
  """A stand-in backbone: records what each call is given and returns zero logits."""

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size
    self.calls = []  # (slots, head rows, allowed pairs of row 0: a traced scalar)

  def apply(self, variables, tokens, positions, mask, *, head_start: int = 0, **_):
    slots = tokens.shape[1]
    keys = mask.shape[-1]
    rows = jnp.broadcast_to(mask, mask.shape[:-2] + (slots, keys)).reshape(-1, slots, keys)
    self.calls.append((slots, slots - head_start, jnp.sum(rows[0], dtype=jnp.int32)))
    return jnp.zeros((tokens.shape[0], slots - head_start, self.vocab_size), jnp.float32)


@functools.lru_cache(maxsize=None)
def backbone_calls(obj_cfg, length: int, vocab_size: int) -> tuple:
  """((slots, head rows, allowed pairs), ...): the backbone calls of the method's training loss on
  one row of `length` real tokens (one small jit, cached per method and length)."""
  objective = objectives.get(obj_cfg.name)
  tokens = jnp.asarray(1 + np.arange(length) % (vocab_size - 1), jnp.int32)[None]
  batch = {"tokens": tokens, "attention_mask": jnp.ones_like(tokens)}
  shapes = []

  def pairs(rng):
    recorder = CallRecorder(vocab_size)
    objective.loss(obj_cfg, recorder, None, batch, rng, train=True)
    shapes.extend((s, h) for s, h, _ in recorder.calls)
    return [p for *_, p in recorder.calls]

  counts = jax.jit(pairs)(jax.random.key(0))
  return tuple((s, h, int(p)) for (s, h), p in zip(shapes, counts))


def parameter_counts(params) -> dict:
  """{'token', 'head', 'cond'}: multiply-add parameters (kernels) per slot, of the output head and
  of the conditioning (`params`: arrays or shapes)."""
  out = {"token": 0, "head": 0, "cond": 0}
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    top = str(getattr(path[0], "key", path[0]))
    if len(x.shape) < 2 or top == "embed":  # biases, norm scales; the embedding is a gather
      continue
    name = jax.tree_util.keystr(path)
    kind = "head" if top == "head" else "cond" if any(c in name for c in COND_LAYERS) else "token"
    out[kind] += int(np.prod(x.shape))
  return out


def model_flops(params, model_cfg, obj_cfg, batch_size: int, length: int) -> float:
  """The module doc's model FLOPs of one training step of `obj_cfg.name`'s method: DiT
  `params` (arrays or shapes), its `model_cfg`, batch `batch_size` x `length` tokens."""
  counts = parameter_counts(params)
  d = model_cfg.hidden_size
  total = 0.0
  for slots, head_rows, pairs in backbone_calls(obj_cfg, length, model_cfg.vocab_size):
    per_row = counts["token"] * slots + counts["head"] * head_rows + counts["cond"]
    total += 6 * batch_size * per_row + 12 * model_cfg.num_layers * d * batch_size * pairs
  return total


__all__ = ["CallRecorder", "backbone_calls", "parameter_counts", "model_flops"]
