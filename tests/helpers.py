"""Shared test utilities (importable as `helpers` from tests; tests/ is on sys.path)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax.model import param_shapes


@functools.lru_cache(maxsize=None)
def random_params(cfg, seed=0):
  """Random parameters drawn in NumPy on the model's own tree.

  Init parameters are useless for numerical tests: the head is zero-initialised, so every logit
  is 0. NumPy draws also avoid compiling an init per test.
  """
  rng = np.random.default_rng(seed)
  leaves, tree = jax.tree_util.tree_flatten_with_path(param_shapes(cfg))
  out = []
  for path, leaf in leaves:
    name = str(getattr(path[-1], "key", path[-1]))
    if name == "scale":
      x = 1 + 0.1 * rng.normal(size=leaf.shape)
    elif name == "kernel":
      x = rng.normal(size=leaf.shape) / np.sqrt(leaf.shape[0])
    else:  # embedding, bias
      x = 0.3 * rng.normal(size=leaf.shape)
    out.append(jnp.asarray(x, jnp.float32))
  return jax.tree_util.tree_unflatten(tree, out)
