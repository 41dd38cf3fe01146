"""`data.pad_targets=eos`: the answer's tail up to L is EOS, attended and a target for all four
methods in training (issue 22); `none` keeps the reference layout; bad values are refused."""

import numpy as np
import pytest

from setdiff_jax.data import pairs, pipeline
from test_bound_context import BOS, EOS, L, NAMES, PAD, PosTable, V, cfg_for  # noqa: F401
from setdiff_jax import objectives

import jax
import jax.numpy as jnp

pytestmark = pytest.mark.usefixtures("fast_compile")

ENCODED = [([BOS, 7, 8, 9], [10, 11, EOS]), ([BOS, 5], [12, 13, 14, 15, EOS])]


def test_pair_rows_eos_tail_layout():
  rows = pairs.pair_rows(ENCODED, 10, PAD, pad_targets="eos", eos_id=EOS)
  np.testing.assert_array_equal(
    rows["tokens"],
    [[BOS, 7, 8, 9, 10, 11, EOS, EOS, EOS, EOS], [BOS, 5, 12, 13, 14, 15, EOS, EOS, EOS, EOS]],
  )
  np.testing.assert_array_equal(rows["attention_mask"], np.ones((2, 10)))
  np.testing.assert_array_equal(rows["context_mask"], [[1] * 4 + [0] * 6, [1] * 2 + [0] * 8])
  none = pairs.pair_rows(ENCODED, 10, PAD)
  np.testing.assert_array_equal(none["tokens"][0], [BOS, 7, 8, 9, 10, 11, EOS, PAD, PAD, PAD])
  np.testing.assert_array_equal(none["attention_mask"][0], [1] * 7 + [0] * 3)
  with pytest.raises(ValueError, match="data.pad_targets='pad'"):
    pairs.pair_rows(ENCODED, 10, PAD, pad_targets="pad", eos_id=EOS)


def test_pad_targets_validation():
  cfg = pipeline.default_data_config()
  assert cfg.pad_targets == "none"
  cfg.source, cfg.preprocess = "arithmetic", "pad"
  cfg.pad_targets = "eos"
  pipeline.validate_data_config(cfg)
  cfg.pad_targets = "EOS"
  with pytest.raises(
    ValueError, match=r"data.pad_targets='EOS'; expected one of \('none', 'eos'\)"
  ):
    pipeline.validate_data_config(cfg)
  text = pipeline.default_data_config()
  text.pad_targets = "eos"
  with pytest.raises(ValueError, match="applies to prompt/answer sources"):
    pipeline.validate_data_config(text)


@pytest.mark.parametrize("name", NAMES)
def test_eos_tail_carries_training_loss(name):
  """Training rows with an EOS tail: every tail position carries loss (gradient on its table row)
  and the prompt none, for every method; with pad_targets=none no tail position does (except
  AR's stop label right after the EOS)."""
  enc = [([BOS, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, EOS])]  # answer + EOS at 6..11
  tail = np.arange(L) >= 12
  for pad_targets in ("eos", "none"):
    batch = pairs.pair_rows(enc * 64, L, PAD, pad_targets=pad_targets, eos_id=EOS)
    model = PosTable(shift=1 if name == "ar" else 0)
    table = jnp.asarray(np.random.default_rng(1).normal(size=(L + 1, V)), jnp.float32)
    jb = {k: jnp.asarray(v) for k, v in batch.items()}
    fn = lambda t: objectives.compute_loss(
      cfg_for(name), model, {"table": t}, jb, jax.random.key(0), train=True
    )[0]
    grad = np.abs(np.asarray(jax.grad(fn)(table))).sum(-1)[:L]
    assert np.all(grad[:6] == 0), "a prompt position carries loss"
    assert np.all(grad[6:12] > 0), "an answer position carries no loss"
    if pad_targets == "eos":
      assert np.all(grad[tail] > 0), f"EOS tail positions without loss: {grad[tail]}"
    else:
      assert list(np.flatnonzero(grad[tail]) + 12) == ([12] if name == "ar" else [])
