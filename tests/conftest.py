"""Test setup: 8 emulated CPU devices and fast XLA compiles, set before jax is imported anywhere.

Compilation dominates the tiny models of this suite, so every test (and every subprocess it
starts: launchers, the notebook kernel) compiles with most XLA optimisations off
(`JAX_DISABLE_MOST_OPTIMIZATIONS`, ~40 % less CPU time); a test that needs the optimised
programs uses the `full_optimizations` fixture. One persistent compilation cache for the session
(a temporary folder, removed at exit) lets the many launcher subprocesses and tests that build the
same tiny programs compile each of them once. Under pytest-xdist (`-n auto --dist loadfile`, as
README and `.ci/run` run the suite) the controller makes that folder before it starts its workers,
which inherit it through the environment: one cache for every worker and its subprocesses.
"""

import atexit
import gc
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="setdiff_jax_test_cache_")
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
  os.environ.update(
    JAX_COMPILATION_CACHE_DIR=_cache,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
  )

import pathlib  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

# The persistent cache serves the launcher subprocesses (they read JAX_COMPILATION_CACHE_DIR);
# this pytest process neither writes nor reads one (see `_release_compiled_programs`).
jax.config.update("jax_enable_compilation_cache", False)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# Real data a clone does not carry (the Story Cloze CSV may not be redistributed): ../shared/data
# beside the repository, or the folder SETDIFF_SHARED_DATA names ("" or a missing folder: none).
_SHARED = os.environ.get("SETDIFF_SHARED_DATA", str(REPO_ROOT.parent / "shared" / "data"))
SHARED_DATA = pathlib.Path(_SHARED) if _SHARED else None
CLOZE_CSV = "rocstories-cloze-val-2016.csv"
# A committed stand-in in the Story Cloze layout (stories written for these tests).
CLOZE_FIXTURE = REPO_ROOT / "tests" / "data" / "cloze_fixture.csv"


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
  """Drop every compiled program after each test module.

  Each XLA:CPU executable keeps its JIT code in memory maps of its own, and jit's caches keep
  every executable alive: the whole suite in one process passed Linux's 65,530 maps
  (`vm.max_map_count`) around its 540th test and died with a segmentation fault inside the next
  compile (or cache write). Measured on 2026-12-04: ~44,000 maps at 57 % of the default tier.
  """
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture(scope="session")
def shared_data():
  """Path of ../shared/data (real data for tests); skips, saying what is missing, when absent.
  Only tests that need data the repository may not ship use it (README, Tests)."""
  if SHARED_DATA is None or not (SHARED_DATA / CLOZE_CSV).is_file():
    where = SHARED_DATA or "no folder (SETDIFF_SHARED_DATA is empty)"
    pytest.skip(
      f"needs the real Story Cloze 2016 validation CSV ({CLOZE_CSV}, not redistributable), "
      f"looked in {where}; set SETDIFF_SHARED_DATA to the folder holding it"
    )
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


@pytest.fixture
def full_optimizations():
  """The optimised XLA pipeline for one test (e.g. one that checks compiled-program numbers)."""
  import jax

  old = jax.config.values["jax_disable_most_optimizations"]
  jax.config.update("jax_disable_most_optimizations", False)
  yield
  jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
  """Compile time dominates tiny training steps: fewer XLA passes and a compilation cache private
  to one module (its runs build new jitted closures, which the in-memory jit cache cannot share,
  so the train and eval steps compile once per config). Restored after the module.

  Use as `_fast = pytest.fixture(scope="module", autouse=True)(lambda compile_cache: None)`.
  """
  import jax
  from jax.experimental.compilation_cache import compilation_cache

  settings = {
    "jax_disable_most_optimizations": True,
    "jax_compilation_cache_dir": str(tmp_path_factory.mktemp("jax_cache")),
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
  }
  previous = {k: jax.config.values[k] for k in settings}
  for k, v in settings.items():
    jax.config.update(k, v)
  compilation_cache.reset_cache()  # re-read the cache settings at the next compile
  yield
  for k, v in previous.items():
    jax.config.update(k, v)
  compilation_cache.reset_cache()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
  """A 384-token BPE of the embedded validation split, trained once and copied into workdirs."""
  from helpers import TINY_VOCAB
  from setdiff_jax.data import sources, tokenizers

  cfg = tokenizers.default_tokenizer_config()
  cfg.vocab_size = TINY_VOCAB
  tok = tokenizers.get_tokenizer(cfg, train_texts=sources.embedded_corpus("validation"))
  path = tmp_path_factory.mktemp("tok") / tokenizers.TOKENIZER_SUBDIR
  tok.save(path)
  return str(path)


@pytest.fixture(scope="session")
def tok(tokenizer_dir):
  from setdiff_jax.data import tokenizers

  return tokenizers.Tokenizer.load(tokenizer_dir)
