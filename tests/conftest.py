"""Test setup: 8 emulated CPU devices, set before jax is imported anywhere."""
import os

os.environ.setdefault("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data():
  """Path of ../shared/data (real data for tests); skips when absent."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"shared data folder not found at {SHARED_DATA}")
  return SHARED_DATA


@pytest.fixture(scope="module")
def fast_compile():
  """XLA compilation dominates tiny-model tests: skip most optimisations for one module.

  Use with `pytestmark = pytest.mark.usefixtures("fast_compile")`; restored after the module.
  """
  import jax
  old = jax.config.values.get("jax_disable_most_optimizations", False)
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", old)
