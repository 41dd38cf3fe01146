"""The optimizer and its schedule (train_step.make_optimizer, learning_rate_schedule, SPEC §5)
against a NumPy float64 recomputation of their definitions: linear warm-up from 0, then constant
or cosine to alpha * peak; global-norm clipping; Adam with bias correction; decoupled weight
decay scaled by lr / peak (Composer's DecoupledAdamW: p <- p * (1 - wd * lr / peak) - lr * adam).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from setdiff_jax import train_step
from setdiff_jax.config.sections import Optimization


def numpy_lr(opt: Optimization, t: int) -> float:
  peak, warm = opt.learning_rate, opt.warmup_steps
  if t < warm:
    return peak * t / warm
  if opt.lr_schedule == "constant":
    return peak
  span = max(opt.num_train_steps - warm, 1)
  frac = min(t - warm, span) / span
  return peak * ((1 - opt.cosine_alpha) * 0.5 * (1 + math.cos(math.pi * frac)) + opt.cosine_alpha)


def numpy_adamw(opt: Optimization, params, grads_per_step):
  """Parameters after each step, float64; params / grads: lists of arrays (the leaves)."""
  p = [np.asarray(x, np.float64) for x in params]
  m = [np.zeros_like(x) for x in p]
  v = [np.zeros_like(x) for x in p]
  out = []
  for t, grads in enumerate(grads_per_step):
    g = [np.asarray(x, np.float64) for x in grads]
    norm = math.sqrt(sum(float((x**2).sum()) for x in g))
    if opt.grad_clip_norm > 0 and norm > opt.grad_clip_norm:
      g = [x * opt.grad_clip_norm / norm for x in g]
    lr = numpy_lr(opt, t)
    new = []
    for i, x in enumerate(p):
      m[i] = opt.adam_b1 * m[i] + (1 - opt.adam_b1) * g[i]
      v[i] = opt.adam_b2 * v[i] + (1 - opt.adam_b2) * g[i] ** 2
      mhat = m[i] / (1 - opt.adam_b1 ** (t + 1))
      vhat = v[i] / (1 - opt.adam_b2 ** (t + 1))
      adam = mhat / (np.sqrt(vhat) + opt.adam_eps)
      new.append(x * (1 - opt.weight_decay * lr / opt.learning_rate) - lr * adam)
    p = new
    out.append(p)
  return out


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_schedule_equals_its_definition(schedule):
  opt = Optimization(
    learning_rate=2e-3,
    warmup_steps=3,
    num_train_steps=10,
    lr_schedule=schedule,
    cosine_alpha=0.1,
  )
  sched = train_step.learning_rate_schedule(opt)
  for t in range(14):  # past the end: cosine stays at alpha * peak
    np.testing.assert_allclose(float(sched(t)), numpy_lr(opt, t), rtol=1e-6, atol=1e-12)
  assert float(sched(0)) == 0.0 and float(sched(3)) == pytest.approx(2e-3)


def test_optimizer_equals_numpy_adamw():
  """Six steps on two leaves: steps 0-2 clipped (large gradients), 3-5 not; weight decay on."""
  opt = Optimization(
    learning_rate=1e-2,
    warmup_steps=2,
    num_train_steps=6,
    lr_schedule="cosine",
    cosine_alpha=0.2,
    weight_decay=0.1,
    grad_clip_norm=1.0,
  )
  rng = np.random.default_rng(0)
  params = {"w": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
  grads = [
    {k: (5.0 if t < 3 else 0.05) * rng.standard_normal(x.shape) for k, x in params.items()}
    for t in range(6)
  ]
  assert all(optax.tree.norm(g) > 1 for g in grads[:3])
  assert all(optax.tree.norm(g) < 1 for g in grads[3:])
  tx = train_step.make_optimizer(opt)
  p = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
  state = tx.init(p)
  want = numpy_adamw(opt, [params["b"], params["w"]], [[g["b"], g["w"]] for g in grads])
  for t, g in enumerate(grads):
    updates, state = tx.update(jax.tree_util.tree_map(jnp.asarray, g), state, p)
    p = optax.apply_updates(p, updates)
    np.testing.assert_allclose(np.asarray(p["b"]), want[t][0], rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(p["w"]), want[t][1], rtol=2e-5, atol=1e-6)
  # step 0 has lr 0 (warm-up from 0): the NumPy run left the parameters where they were
  np.testing.assert_array_equal(want[0][0], params["b"])
