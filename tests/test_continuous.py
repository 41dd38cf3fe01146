"""Continuous batching (sampling/continuous.py): every row equals decoding it alone.

Each row of a continuous run (S slots, refilled as rows end) is compared with the static sampler
on that row alone (batch 1) with the row's own key fold_in(key, r) and budget: tokens, commit
steps, per-token log-probabilities, steps, calls, the EOS stop. A toy model whose logits are exact
in fp32 (integer sums, elementwise functions) gives bit-equal log-probs; the tiny random DiT
(slow tier) gives equal tokens and log-probs equal to fp32 rounding (batch 1 and the slots' batch
use differently shaped matmuls).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from setdiff_jax.sampling import ar_sampler, compiles, continuous, set_sampler
from setdiff_jax.sampling.config import CommitPolicy, SamplerConfig

PAD, BOS, EOS, M = 0, 1, 2, 3
V = 64
TRIGGER = 40  # prompt token TRIGGER + q: the toy predicts EOS at absolute position q


def toy(tokens, positions, mask, kv_cache):
  """Known logits from what a query sees: a smooth function of the visible tokens' sum and count
  and of the query position over tokens 4..39, EOS forced at the position a trigger token names.
  kv = the tokens (so the prompt stays visible through the cache)."""
  tok = tokens.astype(jnp.float32)[..., None]
  keys = tok if kv_cache is None else jnp.concatenate([kv_cache[0], tok], 1)
  kt = keys[..., 0][:, None, :]
  vis = mask & (kt != M) & (kt != PAD)
  total = jnp.sum(jnp.where(vis, kt, 0.0), -1)
  count = jnp.sum(vis, -1).astype(jnp.float32)
  trig = jnp.max(jnp.where(vis & (kt >= TRIGGER), kt - TRIGGER, -1.0), -1)
  q = positions.astype(jnp.float32)
  v = jnp.arange(V, dtype=jnp.float32)
  z = 3.0 * jnp.sin(0.37 * v * (1.0 + jnp.mod(total, 7.0))[..., None] + 0.5 * q[..., None])
  z = z + 0.1 * count[..., None]
  z = jnp.where((v >= 4) & (v < TRIGGER), z, -30.0)
  z = z.at[..., EOS].set(jnp.where(q == trig, 20.0, -4.0))
  return z, (tok,)


def cfg_of(**kw):
  base = dict(
    mask_token_id=M,
    eos_token_id=EOS,
    pad_token_id=PAD,
    bos_token_id=BOS,
    window=3,
    max_new_tokens=10,
    stop_at_eos=True,
    max_length=32,
    length_buckets="pow2",  # few static programs for the batch-1 references
    rollout_stats=True,  # per-token log-probs and cache order: compared row by row too
  )
  base.update(kw)
  return SamplerConfig(**base)


def mixed_rows(n: int, seed: int):
  """Prompts of 2-8 tokens, budgets 3 or 7, and an EOS position inside about half of the answers
  (two budgets and one prompt bucket: the batch-1 references compile two programs)."""
  rng = np.random.default_rng(seed)
  prompts, budgets = [], []
  for _ in range(n):
    p = [BOS] + [int(t) for t in rng.integers(4, TRIGGER, size=rng.integers(1, 7))]
    b = int(rng.choice([3, 7]))
    if rng.random() < 0.5:
      p.insert(1, TRIGGER + len(p) + 1 + int(rng.integers(0, b)))  # EOS at an answer position
    prompts.append(p)
    budgets.append(b)
  return prompts, budgets


GENERATE = {"set": set_sampler.set_generate, "causal": ar_sampler.ar_generate}
SETTINGS = [
  dict(greedy=True),
  dict(greedy=True, policy=CommitPolicy("threshold", 0.2), repetition_penalty=1.3),
  dict(greedy=False, temperature=0.8, top_p=0.9, policy=CommitPolicy("threshold", 0.3)),
  dict(greedy=False, policy=CommitPolicy("stable", 2)),
]


def assert_rows_alone(kind, model, params, prompts, budgets, cfg, key, out, exact=True, ids=None):
  """Row r of `out` = prompt r decoded alone with fold_in(key, ids[r]) (ids default: r)."""
  res = out.result
  ids = range(len(prompts)) if ids is None else ids
  for r, p in enumerate(prompts):
    one = GENERATE[kind](
      model, params, [p], cfg.replace(max_new_tokens=budgets[r]), jax.random.fold_in(key, ids[r])
    )
    assert res.generated[r] == one.generated[0], r
    assert res.sequences[r] == one.sequences[0], r
    a, b = res.target[r], one.target[0]
    np.testing.assert_array_equal(res.commit_step[r][a], one.commit_step[0][b])
    lp_a, lp_b = res.token_logprob[r][a], one.token_logprob[0][b]
    if exact:
      np.testing.assert_array_equal(lp_a, lp_b)
    else:
      np.testing.assert_allclose(lp_a, lp_b, atol=2e-5, rtol=0)
    assert res.num_steps[r] == one.num_steps[0]
    assert res.forward_calls[r] == one.forward_calls[0]
    assert res.num_committed[r] == one.num_committed[0]
    assert res.stopped[r] == one.stopped[0]


def check_counters(kind, out, n_rows):
  c, res = out.counters, out.result
  steps = res.num_steps if kind == "set" else res.num_steps - 1  # AR: token 1 is the prefill's
  assert c["live_slot_steps"] == int(np.sum(steps))  # every live slot-step is a row's step
  assert c["rows"] == n_rows
  assert c["prefill_calls"] >= -(-n_rows // c["refill"])
  assert 0 < c["utilisation"] <= 1
  assert c["forward_calls"] == c["decode_steps"] + c["prefill_calls"]


@pytest.mark.parametrize("kind", ["set", "causal"])
@pytest.mark.parametrize(
  "setting",
  [0, 2, pytest.param(1, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)],
)
def test_rows_equal_rows_alone_toy(kind, setting):
  fields = dict(SETTINGS[setting])
  if kind == "causal":  # AR commits one token a step: the setting without its commit policy
    fields.pop("policy", None)
  prompts, budgets = mixed_rows(8, seed=setting)
  cfg = cfg_of(**fields)
  key = jax.random.PRNGKey(7)
  out = continuous.continuous_generate(
    kind, toy, None, prompts, cfg, key, slots=4, refill=2, budgets=budgets
  )
  assert any(out.result.stopped) and not all(out.result.stopped)  # mixed EOS / budget ends
  assert_rows_alone(kind, toy, None, prompts, budgets, cfg, key, out)
  check_counters(kind, out, len(prompts))


@pytest.mark.parametrize("kind", ["set", "causal"])
def test_row_ids_key_each_row(kind):
  """row_ids: row r draws from fold_in(key, row_ids[r]) whatever its position (ids across the
  uint32 range, one repeated: equal ids, equal prompts give equal rows), not fold_in(key, r)."""
  fields = dict(SETTINGS[2])
  if kind == "causal":
    fields.pop("policy")
  prompts, budgets = mixed_rows(6, seed=2)
  prompts[4], budgets[4] = prompts[1], budgets[1]
  ids = [2**32 - 1, 77, 0, 2**31 + 5, 77, 3]
  cfg, key = cfg_of(**fields), jax.random.PRNGKey(11)
  out = continuous.continuous_generate(
    kind, toy, None, prompts, cfg, key, slots=3, refill=1, budgets=budgets, row_ids=ids
  )
  assert_rows_alone(kind, toy, None, prompts, budgets, cfg, key, out, ids=ids)
  assert out.result.generated[4] == out.result.generated[1]
  plain = continuous.continuous_generate(
    kind, toy, None, prompts, cfg, key, slots=3, refill=1, budgets=budgets
  )
  assert plain.result.generated != out.result.generated  # the ids, not the positions, key rows
  for bad in ([1, 2], [-1] * 6, [2**32] * 6, [0.5] * 6):
    with pytest.raises(ValueError, match="row_ids: expected 6 integers in"):
      continuous.continuous_generate(kind, toy, None, prompts, cfg, key, row_ids=bad)


def test_greedy_equals_static_batches():
  """Greedy rows do not depend on the key: continuous = the static sampler's batches."""
  prompts, _ = mixed_rows(9, seed=3)
  cfg = cfg_of(policy=CommitPolicy("threshold", 0.3))
  for kind in ("set", "causal"):
    out = continuous.continuous_generate(kind, toy, None, prompts, cfg, slots=3, refill=1)
    static = [GENERATE[kind](toy, None, prompts[i : i + 4], cfg) for i in range(0, 9, 4)]
    assert out.result.generated == sum((s.generated for s in static), [])


def test_typed_key_is_its_key_data():
  prompts, budgets = mixed_rows(5, seed=6)
  cfg = cfg_of(greedy=False, policy=CommitPolicy("threshold", 0.4))
  run = lambda key: continuous.continuous_generate(
    "set", toy, None, prompts, cfg, key, slots=5, refill=5, budgets=budgets
  )
  typed, raw = run(jax.random.key(4)), run(jax.random.PRNGKey(4))
  assert typed.result.generated == raw.result.generated


def test_slot_count_and_refill_do_not_change_rows():
  prompts, budgets = mixed_rows(10, seed=5)
  cfg = cfg_of(greedy=False, policy=CommitPolicy("threshold", 0.4))
  key = jax.random.PRNGKey(1)
  runs = [
    continuous.continuous_generate(
      "set", toy, None, prompts, cfg, key, slots=s, refill=k, budgets=budgets
    )
    for s, k in ((1, 1), (4, 3))
  ]
  for other in runs[1:]:
    assert other.result.generated == runs[0].result.generated
    np.testing.assert_array_equal(other.result.token_logprob, runs[0].result.token_logprob)
  assert runs[0].counters["utilisation"] == 1.0  # one slot is never idle


def test_compiled_programs_bounded():
  """Row counts in one power-of-two bucket share a program."""
  cfg = cfg_of()
  prompts, _ = mixed_rows(16, seed=8)
  before = compiles.compiled_programs()
  continuous.continuous_generate("set", toy, None, prompts[:9], cfg, slots=5)
  assert compiles.compiled_programs() == before + 1
  before += 1
  continuous.continuous_generate("set", toy, None, prompts[:13], cfg, slots=5)
  assert compiles.compiled_programs() == before


def test_bad_inputs():
  prompts, _ = mixed_rows(3, seed=0)
  with pytest.raises(ValueError, match="cache_order='l2r'"):
    continuous.continuous_generate("set", toy, None, prompts, cfg_of(cache_order="fht"))
  with pytest.raises(ValueError, match="set sampler and AR only"):
    continuous.continuous_generate("bd3lm", toy, None, prompts, cfg_of())
  with pytest.raises(ValueError, match="budgets"):
    continuous.continuous_generate("set", toy, None, prompts, cfg_of(), budgets=[1, 2])
  for kind in ("set", "causal"):  # a row's own budget past the context is named as such
    with pytest.raises(ValueError, match=r"with its budget budgets\[2\]=40 that is"):
      continuous.continuous_generate(kind, toy, None, prompts, cfg_of(), budgets=[3, 3, 40])
    with pytest.raises(ValueError, match=r"with max_new_tokens=40 that is"):
      continuous.continuous_generate(kind, toy, None, prompts, cfg_of(max_new_tokens=40))
  with pytest.raises(ValueError, match="refill"):
    continuous.continuous_generate("causal", toy, None, prompts, cfg_of(), slots=2, refill=3)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["set", "causal"])
def test_rows_equal_rows_alone_dit(kind):
  """The tiny random DiT: equal tokens, commit steps, steps; log-probs to fp32 rounding."""
  from helpers import random_dit
  from setdiff_jax.models.dit import DiTConfig

  model, params = random_dit(
    DiTConfig(vocab_size=48, hidden_size=32, num_layers=2, num_heads=2, dropout=0.0), 0
  )
  rng = np.random.default_rng(2)  # one prompt bucket, two budgets: few batch-1 programs
  prompts = [
    [BOS] + [int(t) for t in rng.integers(4, 48, size=rng.integers(1, 7))] for _ in range(6)
  ]
  budgets = [int(b) for b in rng.choice([3, 7], size=6)]
  key = jax.random.PRNGKey(3)
  for setting in (
    dict(greedy=True, policy=CommitPolicy("threshold", 0.3)),
    dict(greedy=False, top_p=0.9),
  ):
    cfg = cfg_of(**setting)
    out = continuous.continuous_generate(
      kind, model, params, prompts, cfg, key, slots=3, refill=1, budgets=budgets
    )
    assert_rows_alone(kind, model, params, prompts, budgets, cfg, key, out, exact=False)
    check_counters(kind, out, len(prompts))


@pytest.mark.slow
def test_benchmark_quick(tmp_path):
  """benchmarks/continuous_batching.py --quick: identical rows (checked inside), exact counters,
  continuous batching busier and needing fewer decode steps than static batches."""
  import os

  from benchmarks import continuous_batching as bench

  table = bench.main(["--quick", "--samplers=set", f"--out={tmp_path}"])
  static, flow = table
  assert static["mode"] == "static" and flow["mode"] == "continuous"
  assert static["identical_rows"] and flow["identical_rows"]
  assert flow["utilisation"] > static["utilisation"]
  assert flow["decode_steps"] < static["decode_steps"]
  assert flow["compiled_programs"] == 1
  assert os.path.exists(tmp_path / "continuous_batching.json")
  assert "| set | continuous |" in (tmp_path / "continuous_batching.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("mesh_cfg", [{"data": 8}, {"data": 2, "tensor": 4}])
def test_mesh_gives_the_single_device_rows(mesh_cfg):
  """Parameters placed by the training rules on 8 emulated devices: slots split over data (x
  heads over tensor), the same rows and counters as on one device."""
  from helpers import random_dit
  from setdiff_jax import sharding
  from setdiff_jax.models.dit import DiTConfig

  model, params = random_dit(
    DiTConfig(vocab_size=48, hidden_size=32, num_layers=1, num_heads=4, dropout=0.0), 2
  )
  prompts, budgets = mixed_rows(12, seed=4)
  prompts = [[min(t, 47) for t in p] for p in prompts]
  cfg = cfg_of(greedy=False, policy=CommitPolicy("threshold", 0.3))
  key = jax.random.PRNGKey(0)
  run = lambda p: continuous.continuous_generate(
    "set", model, p, prompts, cfg, key, slots=8, refill=2, budgets=budgets
  )
  one = run(params)
  mesh = sharding.make_mesh(mesh_cfg)
  flow = run(jax.device_put(params, sharding.state_shardings(params, mesh)))
  assert flow.result.generated == one.result.generated
  np.testing.assert_allclose(flow.result.token_logprob, one.result.token_logprob, atol=2e-5)
  assert flow.counters == one.counters


def test_benchmark_flags_are_checked_before_it_runs(capsys):
  """--quick replaced explicit --slots / --rows (the header read 'rows 48, slots 8' for --slots=16
  --rows=20); 0 slots, rows, window or refill were tracebacks; --record without --out failed after
  the whole run. Each is now one usage error before anything runs."""
  from benchmarks import continuous_batching as bench

  args = bench.parse_args(["--quick", "--slots=16", "--rows=20"])
  assert (args.rows, args.slots, args.max_answer, args.repeats) == (20, 16, 48, 1)
  for bad, said in (
    (["--slots=0"], "--slots=0 must be >= 1"),
    (["--quick", "--rows=0"], "--rows=0 must be >= 1"),
    (["--quick", "--window=0"], "--window=0 must be >= 1"),
    (["--refill=0"], "--refill=0 must be >= 1"),
    (["--record=x"], "--record needs --out"),
  ):
    with pytest.raises(SystemExit) as e:
      bench.parse_args(bad)
    assert e.value.code == 2 and said in capsys.readouterr().err, bad
