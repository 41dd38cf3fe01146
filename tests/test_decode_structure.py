"""The shape of a decoding step, read from the jaxpr of each sampler's jitted loop (issue 33,
item 4: one cache write per step, no per-step host work).

Each sampler's core is traced as it decodes (the module's core is wrapped for the call, so the
traced program is the one that runs) and its `while` body is walked, branches included:
- every KV-cache leaf is written exactly once per step, outside the `cond` / `switch` branches
  (an append inside a branch makes XLA copy every layer's cache around the branch: the whole-cache
  copies the head-major cache removed; benchmarks/README.md, "Decoding: the head-major KV cache");
- nothing in the loop calls back to the host (no callback, no outfeed), and the whole decode is
  one `while`: no host round trip between steps.
Independent of the backend: these are properties of the program handed to XLA."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore

from setdiff_jax import models
from setdiff_jax.models import param_shapes
from setdiff_jax.models.dit import DiTConfig
from setdiff_jax.models.qwen3 import Qwen3Config
from setdiff_jax.sampling import SamplerConfig, ar_sampler, baselines, continuous, set_sampler

LAYERS = 2
WRITES = ("dynamic_update_slice", "scatter")
HOST = ("callback", "outfeed", "infeed", "send", "recv")


def _random(cfg):
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(
    lambda s: jnp.asarray(0.2 * rng.standard_normal(s.shape), jnp.float32), param_shapes(cfg)
  )
  return models.build(cfg), params


@pytest.fixture(scope="module")
def tiny():
  return _random(
    DiTConfig(vocab_size=48, hidden_size=32, num_layers=LAYERS, num_heads=2, dropout=0.0)
  )


@pytest.fixture(scope="module")
def tiny_qwen3():
  return _random(
    Qwen3Config(
      vocab_size=48,
      hidden_size=32,
      num_layers=LAYERS,
      num_heads=4,
      num_kv_heads=2,
      head_dim=8,
      intermediate_size=64,
    )
  )


def _cfg(**kw):
  base = dict(
    mask_token_id=3,
    eos_token_id=2,
    pad_token_id=0,
    bos_token_id=1,
    max_new_tokens=8,
    stop_at_eos=False,
    max_length=32,
  )
  return SamplerConfig(**{**base, **kw})


def traced_core(monkeypatch, module, name, generate, *args):
  """Runs `generate(*args)` with `module.name` (a jitted core) wrapped so that its jaxpr is kept;
  returns (the jaxpr of the call that decoded, the sampler's output)."""
  core, seen = getattr(module, name), []

  def wrapped(*a, **k):
    seen.append(core.trace(*a, **k).jaxpr)
    return core(*a, **k)

  monkeypatch.setattr(module, name, wrapped)
  out = generate(*args)
  assert len(seen) == 1, "the whole decode must be one call of the jitted core"
  return seen[0], out


def eqns(jaxpr, path=()):
  """Every equation of `jaxpr` with the path of sub-programs it sits in (while.body, cond...)."""
  for e in jaxpr.eqns:
    yield path, e
    for key, value in e.params.items():
      for i, sub in enumerate(value if isinstance(value, (list, tuple)) else [value]):
        inner = sub.jaxpr if isinstance(sub, jcore.ClosedJaxpr) else sub
        if isinstance(inner, jcore.Jaxpr):
          yield from eqns(inner, path + (f"{e.primitive.name}.{key}",))


def step_writes(closed):
  """{(where in the step, operand shape): writes} for the in-place writes of the while body."""
  (loop,) = [e for p, e in eqns(closed.jaxpr) if e.primitive.name == "while" and not p]
  body = loop.params["body_jaxpr"].jaxpr
  out = collections.Counter()
  for path, e in eqns(body):
    if e.primitive.name in WRITES:
      where = "branch" if any(p.startswith(("cond", "switch")) for p in path) else "step"
      out[(where, tuple(e.invars[0].aval.shape))] += 1
  return out


def host_work(closed):
  return sorted(
    {
      e.primitive.name
      for _, e in eqns(closed.jaxpr)
      if e.primitive.name.startswith(HOST) or "callback" in e.primitive.name
    }
  )


@pytest.mark.parametrize("backbone", ["tiny", "tiny_qwen3"])
@pytest.mark.parametrize("prompts", [[[1, 10, 11]], [[1, 10, 11], [1, 5]]], ids=["b1", "b2"])
def test_set_sampler_writes_each_cache_leaf_once_per_step_outside_the_branches(
  request, monkeypatch, prompts, backbone
):
  model, params = request.getfixturevalue(backbone)
  closed, out = traced_core(
    monkeypatch,
    set_sampler,
    "set_core",
    set_sampler.set_generate,
    model,
    params,
    prompts,
    _cfg(window=3),
  )
  writes = step_writes(closed)
  kv = {k: n for k, n in writes.items() if len(k[1]) == 4}
  (shape,) = {s for _, s in kv}
  assert shape[:2] == (len(prompts), 2)  # [B, KV heads, capacity, head dim]: head-major
  assert kv == {("step", shape): 2 * LAYERS}  # K and V of each layer, once, never in a branch
  assert writes[("step", (len(prompts), shape[2]))] == 1  # the cache's positions
  assert host_work(closed) == []
  assert out.sequences  # and it decoded


def test_ar_and_bd3lm_write_each_cache_leaf_once_per_step(tiny, monkeypatch):
  model, params = tiny
  prompts = [[1, 10, 11], [1, 5]]
  for module, name, generate, cfg in (
    (ar_sampler, "ar_core", ar_sampler.ar_generate, _cfg()),
    (baselines, "_bd3lm_core", baselines.bd3lm_generate, _cfg(block_size=4)),
  ):
    closed, _ = traced_core(monkeypatch, module, name, generate, model, params, prompts, cfg)
    writes = step_writes(closed)
    kv = {k: n for k, n in writes.items() if len(k[1]) == 4}
    assert sum(kv.values()) == 2 * LAYERS and all(w == "step" for w, _ in kv), (name, writes)
    assert host_work(closed) == [], name


def test_the_checks_see_a_write_in_a_branch_and_a_host_callback():
  """Planted programs: a cache write inside a `cond` of the loop body, and a debug callback."""

  def body(c):
    i, buf = c
    new = jax.lax.cond(
      i % 2 == 0,
      lambda b: jax.lax.dynamic_update_slice(b, jnp.ones((1, 2, 1, 4)), (0, 0, i, 0)),
      lambda b: b,
      buf,
    )
    jax.debug.callback(lambda x: None, i)
    return i + 1, new

  closed = jax.make_jaxpr(lambda b: jax.lax.while_loop(lambda c: c[0] < 3, body, (0, b)))(
    jnp.zeros((1, 2, 8, 4))
  )
  assert step_writes(closed) == {("branch", (1, 2, 8, 4)): 1}
  assert host_work(closed) == ["debug_callback"]


@pytest.mark.parametrize("kind,name", [("set", "_set_slots_core"), ("causal", "_ar_slots_core")])
def test_continuous_batching_writes_each_cache_leaf_once_per_load_and_once_per_step(
  tiny, monkeypatch, kind, name
):
  """The slot loop: a load (the prefilled rows into their free slots) and a step (the append)
  per iteration, each once per KV leaf and outside the load's `cond` (module docstring of
  sampling/continuous.py); no host work in the loop."""
  model, params = tiny
  prompts = [[1, 10, 11], [1, 5], [1, 7, 8, 9]]
  cfg = _cfg(window=3) if kind == "set" else _cfg()

  def generate(*args):
    return continuous.continuous_generate(kind, *args, slots=2)

  closed, out = traced_core(monkeypatch, continuous, name, generate, model, params, prompts, cfg)
  writes = step_writes(closed)
  kv = {k: n for k, n in writes.items() if len(k[1]) == 4 and k[1][0] == 2}  # [slots, ...]
  assert kv and all(w == "step" for w, _ in kv), writes
  assert sum(kv.values()) == 2 * 2 * LAYERS  # load + step, K and V, each layer
  assert host_work(closed) == []
  assert len(out.result.sequences) == 3
