"""benchmarks/arms.py: what differs between benchmark arms ('setdlm4', 'bd3lm4', 'ar'), asked of
the methods' pieces; checked against configs/compare.py, which spells it out by name."""

import ml_collections
import pytest

from benchmarks import arms
from configs import compare
from setdiff_jax import decoders, objectives

ARMS = (*compare.METHODS, "bd3lm8", "setdlm16")


@pytest.mark.parametrize("arm", ARMS)
def test_size_field_is_the_field_the_compare_config_sets(arm):
  """`Objective.size_field`: a method takes a size iff it names one, and the size of a sized arm
  lands in that loss field (compare.get_config writes it by the method's name)."""
  name, size = compare.parse_method(arm)
  field = objectives.get(name).size_field
  assert (field is None) == (size is None)
  if field:
    assert compare.get_config(arm).loss[field] == size
    assert compare.get_config(f"{name}{size + 1}").loss[field] == size + 1


def test_set_size_writes_the_arm_size_into_the_loss_config():
  def loss():
    return ml_collections.ConfigDict(dict(desired_set_size=4, max_set_size=8, block_size=4))

  cases = {  # arm -> the loss fields after set_size
    "setdlm3": dict(desired_set_size=3, max_set_size=6, block_size=4),
    "bd3lm8": dict(desired_set_size=4, max_set_size=8, block_size=8),
    "ar": dict(desired_set_size=4, max_set_size=8, block_size=4),
    "mdlm": dict(desired_set_size=4, max_set_size=8, block_size=4),
  }
  for arm, want in cases.items():
    c = loss()
    arms.set_size(c, *compare.parse_method(arm))
    assert c.to_dict() == want, arm


def test_pieces_of_an_arm():
  assert arms.objective("bd3lm4") is objectives.get("bd3lm")
  assert arms.decoder("setdlm8") is decoders.get("setdlm")
  with pytest.raises(ValueError, match="needs its set/block size"):
    arms.decoder("setdlm")


def test_sampler_decoder_names_the_set_sampler_and_the_methods():
  """'set' is the windowed set sampler, other --samplers names are methods' ('ar'); the
  continuous-batching loops they select are those benchmarks/continuous_batching.py ran."""
  assert arms.sampler_decoder("set") is decoders.get("setdlm")
  assert arms.sampler_decoder("ar") is decoders.get("ar")
  assert [arms.sampler_decoder(s).continuous_kind for s in ("set", "ar")] == ["set", "causal"]
  with pytest.raises(ValueError, match="expected one of"):
    arms.sampler_decoder("sett")
