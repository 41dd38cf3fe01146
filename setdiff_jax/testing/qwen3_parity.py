"""`launch/export.py --verify` for Qwen3 runs: our logits vs `transformers` on the export.

report = parity_report(config, params, out_dir)   # needs torch and transformers

two_stream  max relative logits error, fp32, on a two-stream set-causal input with permuted
            positions: JAX vs `Qwen3ForCausalLM` holding the export's weights (`backbone.model.`
            stripped, loaded strictly; 4-D additive mask and position ids, eager attention);
roundtrip   whether import_checkpoint(out_dir) gives back `params` bit-exactly.
"""

from __future__ import annotations

import numpy as np

from setdiff_jax import layer_names
from setdiff_jax.diffusion import masks
from setdiff_jax.interop import pretrained
from setdiff_jax.interop import logits, name_map, qwen3_hf
from setdiff_jax.interop import weight_files
from setdiff_jax.interop.import_ import import_checkpoint


def parity_report(config, params, out_dir: str, *, length: int = 8, seed: int = 0) -> dict:
  import torch
  import transformers

  m = qwen3_hf.resolved_model(config, params)
  hf_cfg = transformers.Qwen3Config(**pretrained.to_hf_fields(m))
  hf_cfg._attn_implementation = "eager"
  model = transformers.Qwen3ForCausalLM(hf_cfg).eval()
  state = {
    k[len("backbone.model.") :]: torch.from_numpy(np.array(v))
    for k, v in weight_files.read_state_dict(out_dir).items()
    if k.startswith("backbone.model.")
  }
  model.load_state_dict(state, strict=True)
  rng = np.random.default_rng(seed)
  vocab = int(m["vocab_size"])
  order = np.concatenate([[0], 1 + rng.permutation(length - 1)])[None]
  x = rng.integers(0, vocab, (1, length))[:, order[0]]
  tokens = np.concatenate([x, rng.integers(0, vocab, x.shape)], -1)
  positions = np.concatenate([order, order], -1)
  allowed = masks.set_causal_mask(length)[None]
  ours = logits.jax_logits(config, params, tokens, positions, allowed)
  add = np.where(allowed[:, None], 0.0, np.finfo(np.float32).min).astype(np.float32)
  with torch.no_grad():
    ref = model(
      input_ids=torch.as_tensor(tokens),
      attention_mask=torch.from_numpy(add),
      position_ids=torch.as_tensor(positions),
      use_cache=False,
    ).logits.numpy()
  err = float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))
  _, back = import_checkpoint(out_dir)
  unstack = layer_names.unstack_layers  # compared per layer, whatever model.scan_layers is
  a = {k: np.asarray(v) for k, v in name_map.flatten(unstack(params)).items()}  # host params
  b = name_map.flatten(unstack(back))
  exact = set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
  return {"two_stream": err, "roundtrip": bool(exact)}


__all__ = ["parity_report"]
