"""The samplers' Python API on inputs a probe found silently wrong (round 7): ids outside the
model's vocabulary, parameters of another model, per-row budgets, non-integer settings and ids.
Each case fails on the code before its fix: a NaN-filled decode, dropped layers, a row refused
for another row's budget, a cut float."""

import dataclasses

import jax
import numpy as np
import pytest

from helpers import random_params
from setdiff_jax import models
from setdiff_jax.models.dit import DiTConfig
from setdiff_jax.sampling import (
  SamplerConfig,
  ar_generate,
  bd3lm_generate,
  mdlm_generate,
  mdlm_infill,
  set_generate,
  set_infill,
)
from setdiff_jax.sampling.continuous import continuous_generate

V, MASK, EOS, PAD = 40, 39, 1, 0
CFG = DiTConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=2, dropout=0.0)


@pytest.fixture(scope="module")
def model_and_params():
  return models.build(CFG), random_params(CFG)


def scfg(**kw):
  base = dict(mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, max_length=32)
  return SamplerConfig(**{**base, "max_new_tokens": 4, "window": 2, **kw})


GENERATORS = {
  "set": set_generate,
  "ar": ar_generate,
  "bd3lm": lambda m, p, x, c: bd3lm_generate(m, p, x, c.replace(block_size=2)),
  "mdlm": mdlm_generate,
  "continuous_set": lambda m, p, x, c: continuous_generate("set", m, p, x, c, slots=2).result,
  "continuous_causal": lambda m, p, x, c: continuous_generate("causal", m, p, x, c, slots=2).result,
}


@pytest.mark.parametrize("sampler", sorted(GENERATORS))
def test_an_id_outside_the_vocabulary_is_refused_not_decoded_to_nan(model_and_params, sampler):
  """Prompt id 100 with V = 40 made NaN logits and all-zero tokens in every sampler; a mask or
  EOS id >= V did the same (or never stopped)."""
  model, params = model_and_params
  generate = GENERATORS[sampler]
  with pytest.raises(ValueError, match=r"prompt 1 holds token id 100, outside .*vocab_size=40"):
    generate(model, params, [[2, 3], [2, 100]], scfg())
  for name in ("mask_token_id", "eos_token_id", "pad_token_id"):
    with pytest.raises(ValueError, match=f"{name}=40 is outside the model's vocabulary"):
      generate(model, params, [[2, 3]], scfg(**{name: V}))
  out = generate(model, params, [[2, 3], [4]], scfg(greedy=True))  # in range: decodes
  assert all(0 <= t < V for row in out.generated for t in row)


def test_infill_ids_outside_the_vocabulary_are_refused(model_and_params):
  model, params = model_and_params
  for infill in (set_infill, mdlm_infill):
    with pytest.raises(ValueError, match=r"canvas 0 holds token id 41"):
      infill(model, params, [[2, MASK, MASK, 41]], scfg())


def test_mdlm_infill_checks_its_canvases_like_the_set_sampler(model_and_params):
  """mdlm_infill decoded a 24-token canvas past max_length=16, passed id -3 into its output and
  failed on an empty list with `max() arg is an empty sequence`."""
  model, params = model_and_params
  cases = [
    (  # probe round 15: the message now says what counts and by how much to shorten
      [[2] * 20 + [MASK] * 4],
      r"24 tokens \(text, gap positions and special tokens\) > the model's context length "
      r"max_length=16: shorten its text or gaps by 8 tokens",
    ),
    ([[2, -3, MASK]], "negative token id"),
    ([], "no canvases given"),
  ]
  for canvases, message in cases:
    with pytest.raises(ValueError, match=message):
      mdlm_infill(model, params, canvases, scfg(max_length=16))


def test_params_of_another_model_are_refused(model_and_params):
  """A 2-layer tree decoded by a 1-layer DiT ran (blocks_1 ignored by Flax, other tokens); a
  variables dict failed with KeyError: 'head'."""
  model, params = model_and_params
  one_layer = models.build(dataclasses.replace(CFG, num_layers=1))
  with pytest.raises(
    ValueError, match=r"do not fit this DiT \(1 layers.*unexpected \['blocks_1'\]"
  ):
    set_generate(one_layer, params, [[2, 3]], scfg())
  three_layers = models.build(dataclasses.replace(CFG, num_layers=3))
  with pytest.raises(ValueError, match=r"missing \['blocks_2'\]"):
    ar_generate(three_layers, params, [[2, 3]], scfg())
  wider = models.build(dataclasses.replace(CFG, vocab_size=48))
  with pytest.raises(ValueError, match="has shape .*40.*the model expects .*48"):
    set_generate(wider, params, [[2, 3]], scfg())
  with pytest.raises(ValueError, match=r"variables dict .*pass variables\['params'\]"):
    set_generate(model, {"params": params}, [[2, 3]], scfg())
  set_generate(model, params, [[2, 3]], scfg())  # its own tree decodes


@pytest.mark.parametrize("kind", ["set", "causal"])
def test_continuous_budgets_are_checked_per_row_and_never_cut(model_and_params, kind):
  """Prompts of 28 and 1 tokens with budgets [2, 20] fit max_length = 32 row by row but were
  refused with row 1's budget charged to row 0; float budgets 2.9 / 3.9 decoded 2 / 3 tokens."""
  model, params = model_and_params
  prompts = [[2] * 28, [3]]
  out = continuous_generate(
    kind, model, params, prompts, scfg(greedy=True, stop_at_eos=False), budgets=[2, 20], slots=2
  )
  assert [len(g) for g in out.result.generated] == [2, 20]
  with pytest.raises(
    ValueError, match=r"prompt 0 has 28 tokens; with its budget budgets\[0\]=5 that is 33"
  ):
    continuous_generate(kind, model, params, prompts, scfg(), budgets=[5, 2], slots=2)
  with pytest.raises(ValueError, match="whole numbers"):
    continuous_generate(kind, model, params, [[2], [3]], scfg(), budgets=[2.9, 3.9], slots=2)


def test_non_integer_settings_ids_and_keys_get_one_clear_error(model_and_params):
  model, params = model_and_params
  for name in ("window", "max_new_tokens", "num_steps", "block_size", "max_length"):
    with pytest.raises(ValueError, match=f"{name}=2.5 must be a whole number"):
      scfg(**{name: 2.5})
  assert scfg(window=2.0).window == 2 and isinstance(scfg(max_new_tokens=4.0).max_new_tokens, int)
  with pytest.raises(ValueError, match="row 0 holds float64 values, not integer token ids"):
    set_generate(model, params, [[2.7, 3.0]], scfg())
  with pytest.raises(ValueError, match=r"rng=3: pass a PRNG key \(jax.random.key\(3\)"):
    set_generate(model, params, [[2, 3]], scfg(), rng=3)
  with pytest.raises(ValueError, match=r"kind is one of \('set', 'causal'\)"):
    continuous_generate("ar", model, params, [[2]], scfg())
  key = jax.random.key(3)  # a typed key and a raw one both decode
  a = set_generate(model, params, [[2, 3]], scfg(), rng=key).generated
  b = set_generate(model, params, [[2, 3]], scfg(), rng=jax.random.key_data(key)).generated
  assert a == b
  assert np.asarray(set_generate(model, params, np.array([[2, 3]], np.int32), scfg()).canvas).size


def test_eos_equal_to_the_mask_id_is_refused(model_and_params):
  """M's logit is suppressed before every draw, so an EOS id equal to M was never generated: a
  row asked to stop at EOS ran to its budget, silently (probe round 9, noted)."""
  with pytest.raises(ValueError, match=f"eos_token_id={MASK} equals mask_token_id"):
    scfg(eos_token_id=MASK)
  assert scfg(eos_token_id=None).stops_at_eos is False  # never stopping is still expressible
