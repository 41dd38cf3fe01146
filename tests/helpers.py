"""Shared test utilities (importable as `helpers` from tests; tests/ is on sys.path)."""

import functools
import os
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax.data import tokenizers
from setdiff_jax.models import param_shapes  # any backbone config (DiT, Qwen3)

TINY_VOCAB = 384  # the tiny runs' BPE size (divides by a tensor axis of 2, 4 or 8)


def set_fields(config, overrides):
  """config["a.b"] = v for each item of `overrides`."""
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def new_workdir(base, name, tokenizer_dir=None) -> str:
  """An empty run directory, with a pre-trained tokenizer copied in (no BPE training per run)."""
  path = os.path.join(str(base), name)
  os.makedirs(path)
  if tokenizer_dir:
    shutil.copytree(tokenizer_dir, os.path.join(path, tokenizers.TOKENIZER_SUBDIR))
  return path


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


def assert_trees_close(a, b, atol, rtol=0.0):
  """Same tree structure and every leaf close (the failing leaf's path in the message)."""
  leaves = jax.tree_util.tree_flatten_with_path(a)[0]
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for (path, x), y in zip(leaves, jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(
      np.asarray(x), np.asarray(y), atol=atol, rtol=rtol, err_msg=jax.tree_util.keystr(path)
    )


def random_dit(cfg, seed: int):
  """(DiT, params): a random DiT with a strong head (0.5-scaled normal), drawn in NumPy leaf by
  leaf in tree order, so that greedy decoding varies across rows and positions."""
  from setdiff_jax.models.dit import DiT

  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      return 1.0 + 0.1 * rng.standard_normal(shape.shape)
    if "head" in name:
      return 0.5 * rng.standard_normal(shape.shape)
    return rng.standard_normal(shape.shape) / np.sqrt(shape.shape[0])

  params = jax.tree_util.tree_map_with_path(leaf, param_shapes(cfg))
  return DiT(cfg), jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)


def git(repo, *args):
  subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def git_repo(path):
  """A git repository at `path` on branch main with one commit (code.py)."""
  path.mkdir()
  git(path, "init", "-q", "-b", "main")
  git(path, "config", "user.email", "t@t")
  git(path, "config", "user.name", "t")
  (path / "code.py").write_text("x = 1\n")
  git(path, "add", "code.py")
  git(path, "commit", "-q", "-m", "one")
  return path


def flip_tensor_bit(file: str, offset: int = 100):
  """Flips the lowest bit of the byte `offset` bytes into a safetensors file's tensor data (a
  damaged disk or copy: a low mantissa bit, so the value stays finite)."""
  with open(file, "r+b") as f:
    data_start = 8 + int.from_bytes(f.read(8), "little")
    f.seek(data_start + offset)
    byte = f.read(1)[0]
    f.seek(data_start + offset)
    f.write(bytes([byte ^ 1]))
