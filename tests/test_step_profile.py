"""benchmarks/step_profile.py: the thunk classification it sums times by, on compiled programs.

The profiled tables themselves are a benchmark (benchmarks/README.md); here only the reading of
XLA's compiled HLO text, which decides which row a thunk's time lands in.
"""

import os

import jax
import jax.numpy as jnp
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def prof():
  from benchmarks import step_profile

  return step_profile


def _categories(prof, fn, *args):
  ops = prof.hlo_ops(jax.jit(fn).lower(*args).compile().as_text())
  return {prof.category(v) for v in ops.values()}


@pytest.mark.usefixtures("full_optimizations")
def test_dots_split_into_dense_and_batched(prof):
  x, w = jnp.ones((64, 32)), jnp.ones((32, 48))
  assert "dense matmul" in _categories(prof, lambda x, w: x @ w, x, w)
  assert "batched matmul" not in _categories(prof, lambda x, w: x @ w, x, w)
  q = jnp.ones((2, 3, 16, 8))
  cats = _categories(prof, lambda q: jnp.einsum("bhqd,bhkd->bhqk", q, q), q)
  assert "batched matmul" in cats and "dense matmul" not in cats


@pytest.mark.usefixtures("full_optimizations")
def test_rotary_rng_and_layout_fusions(prof):
  x = jnp.arange(4096.0).reshape(64, 64)
  assert "rotary" in _categories(prof, lambda x: jnp.cos(x) * x + 1, x)
  assert "RNG" in _categories(prof, lambda k: jax.random.bits(k, (256,)), jax.random.PRNGKey(0))
  assert "layout copies" in _categories(prof, lambda x: jnp.transpose(x * 1.0).copy(), x)
  assert "other" in _categories(prof, lambda x: jnp.exp(x).sum(0), x)
