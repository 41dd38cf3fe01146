"""Ahead-of-time compilation from abstract inputs (issue 26, benchmarks/aot_compile.py).

On the 8 emulated CPU devices: `train_step.abstract_sharded_state` is the created state's shapes,
dtypes and shardings (nothing allocated); slow tier: the train step lowered from it (the
benchmark's `lower_train`) runs on the real state and batch with the loss of the jitted step,
and the benchmark's cached set-decoding lowering compiles with the batch split over the mesh. With
libtpu importable (a separate venv; CI has none) the slow test compiles for a v5e-8 topology.
"""

import jax
import numpy as np
import pytest

from benchmarks import aot_compile
from setdiff_jax import models, sharding, train_step

pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.fixture(scope="module")
def tiny():
  """The benchmark's tiny Qwen3 SetDLM config (2 x 64, L=64, batch 16, mesh fsdp=-1 -> 8)."""
  config, model_cfg, obj_cfg = aot_compile.run_config("gsm8k_sw_qwen3_train", tiny=True)
  return config, model_cfg, obj_cfg, sharding.make_mesh(config.mesh.sizes())


def test_abstract_state_is_the_created_state(tiny):
  config, model_cfg, _, mesh = tiny
  assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
  abstract, _ = train_step.abstract_sharded_state(config, model_cfg, mesh)
  state, shardings = train_step.create_sharded_state(config, model_cfg, mesh)
  leaves = jax.tree_util.tree_leaves
  assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(state)
  for a, x, s in zip(leaves(abstract), leaves(state), leaves(shardings)):
    assert isinstance(a, jax.ShapeDtypeStruct)
    assert (a.shape, a.dtype) == (x.shape, x.dtype)
    assert a.sharding == s and x.sharding.is_equivalent_to(a.sharding, x.ndim)
  assert any("fsdp" in a.sharding.spec for a in leaves(abstract))


@pytest.mark.slow
def test_step_lowered_from_abstract_inputs_runs_on_the_real_state(tiny):
  """The benchmark's lowering takes the real (created) state and batch and gives the loss of the
  step jitted the usual way."""
  config, model_cfg, obj_cfg, mesh = tiny
  state, shardings = train_step.create_sharded_state(config, model_cfg, mesh)
  lowered, shape = aot_compile.lower_train(config, model_cfg, obj_cfg, mesh)
  assert shape == f"batch {config.optimization.batch_size} x L {config.seq_len}"
  compiled = lowered.compile()
  assert aot_compile.memory_row(compiled).get("peak_gib", 1.0) > 0
  rng = np.random.default_rng(0)
  shp = (config.optimization.batch_size, config.seq_len)
  host = {
    "tokens": rng.integers(4, 500, shp).astype(np.int32),
    "attention_mask": np.ones(shp, np.int32),
    "context_mask": np.zeros(shp, np.int32),
  }
  host["context_mask"][:, :8] = 1
  batch = sharding.global_batch(host, mesh)
  key = jax.random.key(3)
  jitted = train_step.jit_train_step(
    config.optimization, models.build(model_cfg), obj_cfg, mesh, shardings
  )
  copy = jax.tree_util.tree_map(lambda x: x.copy(), state)  # both steps donate their state
  _, m_aot = compiled(state, batch, key)
  _, m_jit = jitted(copy, batch, key)
  assert np.isfinite(float(m_aot["loss"]))
  np.testing.assert_allclose(float(m_aot["loss"]), float(m_jit["loss"]), rtol=1e-6)


@pytest.mark.slow
def test_cached_set_decoding_lowers_split_over_the_mesh(tiny):
  config, model_cfg, obj_cfg, mesh = tiny
  args = aot_compile.parse_args(["--tiny"])
  lowered, shape = aot_compile.lower_decode(config, model_cfg, obj_cfg, mesh, args)
  assert shape.startswith("batch 8, prompt 16 + N 16")
  text = lowered.compile().as_text()
  # the per-device canvas holds 1 of the 8 rows: s32[1,32] (prompt 16 + N 16)
  assert "s32[1,32]" in text


@pytest.mark.slow
def test_aot_compile_for_a_v5e_8_topology():
  pytest.importorskip("libtpu")
  [row] = aot_compile.main(["--tiny", "--topologies=v5e-8", "--programs=gsm8k_sw_qwen3_decode"])
  assert "error" not in row, row["error"]
  assert (row["chips"], row["mesh"], row["fits"]) == (8, "fsdp=8", True)
  assert 0 < row["peak_gib"] < 1
