"""Parity checks between our JAX model and the PyTorch reference (needs jax and torch).

  report = parity_report(config, params, out_dir)   # out_dir: an export of (config, params)

measures, in fp32 with dropout off:
  two_stream   max relative error of the logits on a two-stream set-causal input (permuted
               positions, one padded row), JAX vs the reference loaded from `out_dir`;
  cached_step  the same for one KV-cached decoding step (cache of committed tokens, pending clean
               tokens, active masks; SPEC §2.8), each side building its own cache;
  loss         |JAX setdlm likelihood bound - reference| / |reference| for the same order;
  roundtrip    whether import_checkpoint(out_dir) gives back `params` bit-exactly.
Relative error = max|jax - ref| / max|ref|.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax import objectives
from setdiff_jax import layer_names
from setdiff_jax.diffusion import masks
from setdiff_jax.diffusion import losses
from setdiff_jax.models import dit as model_lib
from setdiff_jax.interop import hf_config, import_, name_map
from setdiff_jax.interop import weight_files


def rel_err(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def fp32_model_config(config, params) -> model_lib.DiTConfig:
  """Our DiTConfig for `config` with the vocabulary of `params`, fp32, dense attention."""
  model_cfg = getattr(config, "model", None) or config
  cfg = model_lib.DiTConfig.from_config(model_cfg)
  dims = name_map.dims_from_params(params)
  return dataclasses.replace(cfg, vocab_size=dims.vocab_size, dtype="float32", attention="dense")


@functools.lru_cache(maxsize=32)
def _jitted_forward(model_cfg: model_lib.DiTConfig, return_kv: bool):
  return jax.jit(
    lambda p, t, q, m, c: model_lib.DiT(model_cfg).apply(
      {"params": p}, t, q, m, kv_cache=c, return_kv=return_kv
    )
  )


def jax_forward(
  model_cfg: model_lib.DiTConfig,
  params,
  tokens,
  positions,
  allowed,
  kv_cache=None,
  return_kv: bool = False,
):
  """Our DiT's raw logits (jitted, cached per config), dropout off; params in either layout."""
  params = layer_names.to_layout(params, model_cfg.scan_layers)
  return _jitted_forward(model_cfg, return_kv)(
    params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(allowed), kv_cache
  )


def two_stream_example(
  length: int,
  vocab: int,
  mask_id: int,
  pad_id: int,
  *,
  batch: int = 2,
  seed: int = 0,
  bos_id: Optional[int] = None,
):
  """A SetDLM batch with a random order (position 0 first) and a padded second row."""
  rng = np.random.default_rng(seed)
  low = max(mask_id, pad_id, bos_id or 0) + 1
  if low >= vocab:
    low = 0
  x = rng.integers(low, vocab, (batch, length)).astype(np.int32)
  if bos_id is not None:
    x[:, 0] = bos_id
  real = np.ones((batch, length), bool)
  n_pad = max(1, length // 4)
  orders = []
  for b in range(batch):
    n_real = length - (n_pad if b % 2 else 0)
    real[b, n_real:] = False
    x[b, n_real:] = pad_id
    orders.append(np.concatenate([[0], 1 + rng.permutation(n_real - 1), np.arange(n_real, length)]))
  return {"tokens": x, "attention_mask": real, "order": np.stack(orders).astype(np.int32)}


def cached_step_example(
  length: int, vocab: int, mask_id: int, *, seed: int = 0, prompt: int = 3, window: int = 3
):
  """Token ids / positions / validity for a cache, pending tokens and active masks (batch 1)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (1, length)).astype(np.int32)
  tokens[tokens == mask_id] = (mask_id + 1) % vocab
  gen = prompt + rng.permutation(length - prompt)  # commit order of the generated positions
  n_cached, n_pending = (length - prompt) // 3, 2
  cache_pos = np.concatenate([np.arange(prompt), gen[:n_cached]])
  pending_pos = gen[n_cached : n_cached + n_pending]
  active_pos = np.sort(gen[n_cached + n_pending :])[:window]
  cap = length  # fixed capacity; the tail slots are empty
  cache_valid = np.zeros((1, cap), bool)
  cache_valid[0, : len(cache_pos)] = True
  pend_cap, act_cap = n_pending + 1, window + 1  # one empty slot each (fixed shapes)
  pad_to = lambda a, n: np.concatenate([a, np.zeros(n - len(a), a.dtype)])
  return dict(
    cache_tokens=tokens[:, cache_pos],
    cache_positions=cache_pos[None].astype(np.int32),
    cache_valid=cache_valid,
    pending_tokens=pad_to(tokens[0, pending_pos], pend_cap)[None],
    pending_positions=pad_to(pending_pos, pend_cap)[None].astype(np.int32),
    pending_valid=(np.arange(pend_cap) < n_pending)[None],
    mask_positions=pad_to(active_pos, act_cap)[None].astype(np.int32),
    mask_valid=(np.arange(act_cap) < len(active_pos))[None],
  )


def jax_cached_step(model_cfg, params, ex, mask_id: int):
  """Encodes the cache (clean-causal), pads it to capacity, runs the step. Returns logits."""
  n = ex["cache_tokens"].shape[1]
  enc_mask = masks.causal_mask(n)[None]
  _, kv = jax_forward(
    model_cfg, params, ex["cache_tokens"], ex["cache_positions"], enc_mask, return_kv=True
  )
  cap = ex["cache_valid"].shape[1]
  kv = tuple(
    (
      jnp.pad(k, ((0, 0), (0, cap - n), (0, 0), (0, 0))),
      jnp.pad(v, ((0, 0), (0, cap - n), (0, 0), (0, 0))),
    )
    for k, v in kv
  )
  a = ex["mask_positions"].shape[1]
  tokens = np.concatenate([ex["pending_tokens"], np.full((1, a), mask_id, np.int32)], 1)
  positions = np.concatenate([ex["pending_positions"], ex["mask_positions"]], 1)
  allowed = masks.cached_step_mask(ex["cache_valid"], ex["pending_valid"], ex["mask_valid"])
  return np.asarray(jax_forward(model_cfg, params, tokens, positions, allowed, kv_cache=kv))


def torch_cached_step(ref, ex, mask_id: int):
  import torch

  n = ex["cache_tokens"].shape[1]
  kv = ref.encode(ex["cache_tokens"], ex["cache_positions"])
  cap = ex["cache_valid"].shape[1]
  pad = lambda t: torch.cat([t, torch.zeros(t.shape[0], cap - n, *t.shape[2:])], 1)
  kv = [(pad(k), pad(v)) for k, v in kv]
  logits, _ = ref.cached_step(
    kv,
    ex["cache_valid"],
    ex["pending_tokens"],
    ex["pending_positions"],
    ex["pending_valid"],
    ex["mask_positions"],
    ex["mask_valid"],
    mask_id,
  )
  return logits.numpy()


def parity_report(
  config, params, out_dir: Optional[str] = None, *, special_ids=None, seed: int = 0
) -> Dict[str, object]:
  """Runs the checks of the module docstring (see there). `config`: our run ConfigDict."""
  from setdiff_jax.testing import torch_reference  # torch: an optional extra

  model_cfg = fp32_model_config(config, params)
  params = layer_names.to_layout(params, model_cfg.scan_layers)  # the layout the model takes
  length = int(config.seq_len)
  special = dict(special_ids or {})
  if out_dir is not None:
    raw = weight_files.read_json(f"{out_dir}/{weight_files.CONFIG_FILE}")
    special = {**hf_config.from_hf_config(raw, out_dir)[0]["special_ids"], **special}
  mask_id, pad_id = int(special.get("mask_id", 1)), int(special.get("pad_id", 0))
  ref = (
    torch_reference.load_reference(out_dir)
    if out_dir is not None
    else torch_reference.model_from_params(config, params)
  )
  report: Dict[str, object] = {}

  batch = two_stream_example(
    length, model_cfg.vocab_size, mask_id, pad_id, seed=seed, bos_id=special.get("bos_id")
  )
  # The check always scores the SetDLM bound (the torch reference implements that one).
  obj = losses.ObjectiveConfig(
    name=objectives.SetDLM.name,
    mask_token_id=mask_id,
    pad_token_id=pad_id,
    keep_clean_bos=bool(config.loss.keep_clean_bos),
  )
  jbatch = {k: jnp.asarray(v) for k, v in batch.items()}
  inp = losses.setdlm_inputs(obj, jbatch, jbatch["order"])
  jl = np.asarray(jax_forward(model_cfg, params, inp["tokens"], inp["positions"], inp["mask"]))
  tl = ref(np.asarray(inp["tokens"]), np.asarray(inp["positions"]), np.asarray(inp["mask"]))
  report["two_stream"] = rel_err(jl, tl.detach().numpy())

  ex = cached_step_example(length, model_cfg.vocab_size, mask_id, seed=seed)
  report["cached_step"] = rel_err(
    jax_cached_step(model_cfg, params, ex, mask_id), torch_cached_step(ref, ex, mask_id)
  )

  loss_fn = jax.jit(
    lambda p, b: losses.setdlm_loss(
      obj, model_lib.DiT(model_cfg), p, b, jax.random.key(0), train=False
    )[0]
  )
  jloss = float(loss_fn(params, jbatch))
  tloss, _, _ = torch_reference.setdlm_likelihood_bound(
    ref,
    batch["tokens"],
    batch["order"],
    batch["attention_mask"],
    mask_id=mask_id,
    pad_id=pad_id,
    keep_clean_bos=obj.keep_clean_bos,
  )
  report["loss_jax"], report["loss_torch"] = jloss, tloss
  report["loss"] = abs(jloss - tloss) / max(abs(tloss), 1e-30)

  if out_dir is not None:
    _, back = import_.import_checkpoint(out_dir)
    a = name_map.flatten(layer_names.unstack_layers(params))
    b = name_map.flatten(layer_names.unstack_layers(back))
    report["roundtrip"] = a.keys() == b.keys() and all(
      np.array_equal(np.asarray(a[k]), b[k]) and np.asarray(a[k]).dtype == b[k].dtype for k in a
    )
  return report


__all__ = [
  "parity_report",
  "rel_err",
  "two_stream_example",
  "cached_step_example",
  "jax_cached_step",
  "torch_cached_step",
  "jax_forward",
  "fp32_model_config",
]
