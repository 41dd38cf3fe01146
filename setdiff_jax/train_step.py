"""The train step: TrainState, the optimizer and its schedule, the pure step and its sharded jit.

Setup is two functions used by the loop (`train.py`), the benchmarks and the tests alike:

  state, shardings = create_sharded_state(cfg, model_cfg, mesh)   # born in its shardings
  step_fn = jit_train_step(cfg.optimization, model, obj_cfg, mesh, shardings)  # donated state

`cfg` is the typed run config (`setdiff_jax.config.run.RunConfig`); the optimizer, schedule, EMA
and accumulation read its `optimization` section.

Parameters, EMA and optimizer state are sharded by the logical-axis rules of `sharding.py` (FSDP
over the model dimension, tensor parallelism over heads / MLP / vocabulary; replicated on a
data-only mesh), the batch over data x fsdp, so the same code runs on 1 CPU, 8 emulated devices,
a GPU or a TPU slice. The loss is the method's objective's (`setdiff_jax.objectives`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Tuple

import flax
import flax.struct
import jax
import jax.numpy as jnp
import optax

from setdiff_jax import models, objectives, sharding
from setdiff_jax.config.run import RunConfig
from setdiff_jax.config.sections import Optimization
from setdiff_jax.diffusion import losses
from setdiff_jax.models import Backbone, BackboneConfig


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  ema_params: Any
  opt_state: Any


def learning_rate_schedule(opt: Optimization) -> optax.Schedule:
  """Linear warm-up from 0, then constant or cosine to cosine_alpha * peak (SPEC §5)."""
  peak, warmup = opt.learning_rate, opt.warmup_steps
  warm = optax.linear_schedule(0.0, peak, max(warmup, 1))
  if opt.lr_schedule == "constant":
    after = optax.constant_schedule(peak)
  else:
    after = optax.cosine_decay_schedule(
      peak, max(opt.num_train_steps - warmup, 1), alpha=opt.cosine_alpha
    )
  return optax.join_schedules([warm, after], [warmup])


def make_optimizer(opt: Optimization) -> optax.GradientTransformation:
  """Clip -> Adam -> decoupled weight decay scaled by lr/peak (Composer DecoupledAdamW) -> lr."""
  schedule = learning_rate_schedule(opt)
  parts = []
  if opt.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt.grad_clip_norm))
  parts.append(optax.scale_by_adam(b1=opt.adam_b1, b2=opt.adam_b2, eps=opt.adam_eps))
  if opt.weight_decay > 0:
    parts.append(optax.add_decayed_weights(opt.weight_decay / opt.learning_rate))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts)


def create_train_state(opt: Optimization, model_cfg: BackboneConfig, rng) -> TrainState:
  params = models.init_params(model_cfg, rng)
  opt_state = make_optimizer(opt).init(params)
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    ema_params=jax.tree_util.tree_map(jnp.copy, params),
    opt_state=opt_state,
  )


def make_train_step(
  opt: Optimization,
  model: Backbone,
  obj_cfg: losses.ObjectiveConfig,
  optimizer: optax.GradientTransformation,
) -> Callable:
  """Pure step(state, batch, base_rng) -> (state, metrics); rng = fold_in(base_rng, step)."""
  accum = int(opt.grad_accum_steps)
  ema_decay = float(opt.ema_decay)
  schedule = learning_rate_schedule(opt)

  objective = objectives.get(obj_cfg.name)

  def loss_fn(params, batch, rng):
    return objective.loss(obj_cfg, model, params, batch, rng, train=True)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(state: TrainState, batch, base_rng):
    rng = jax.random.fold_in(base_rng, state.step)
    if accum == 1:
      (loss, metrics), grads = grad_fn(state.params, batch, rng)
    else:
      # Micro-batch a takes rows a, a + accum, ... so every device keeps an equal share.
      micro = jax.tree_util.tree_map(
        lambda x: x.reshape((x.shape[0] // accum, accum) + x.shape[1:]).swapaxes(0, 1), batch
      )

      def body(carry, xs):
        mb, i = xs
        (l, m), g = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
        return jax.tree_util.tree_map(jnp.add, carry, (g, m)), l

      zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
      zero_metrics = jax.tree_util.tree_map(
        jnp.zeros_like,
        jax.eval_shape(
          lambda: loss_fn(state.params, jax.tree_util.tree_map(lambda x: x[0], micro), rng)[1]
        ),
      )
      (grads, metrics), micro_losses = jax.lax.scan(
        body, (zeros, zero_metrics), (micro, jnp.arange(accum))
      )
      grads = jax.tree_util.tree_map(lambda g: g / accum, grads)
      loss = jnp.mean(micro_losses)
      metrics = dict(metrics, loss=loss)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    ema = jax.tree_util.tree_map(
      lambda e, p: ema_decay * e + (1.0 - ema_decay) * p, state.ema_params, params
    )
    metrics = dict(
      metrics,
      grad_norm=optax.tree.norm(grads),
      lr=schedule(state.step),
      clean_tokens=jnp.sum(batch["attention_mask"]).astype(jnp.float32),
    )
    return TrainState(
      step=state.step + 1, params=params, ema_params=ema, opt_state=opt_state
    ), metrics

  return step


def abstract_sharded_state(
  cfg: RunConfig, model_cfg: BackboneConfig, mesh
) -> Tuple[TrainState, Any]:
  """The initial TrainState as `jax.ShapeDtypeStruct`s carrying their shardings, nothing
  allocated (ahead-of-time lowering: `jit_train_step(...).lower(state, batch, rng)`).

  Returns (abstract state, state_shardings); shardings follow the config's logical-axis rules.
  """
  shapes = jax.eval_shape(
    functools.partial(create_train_state, cfg.optimization, model_cfg), jax.random.key(cfg.seed)
  )
  shardings = sharding.state_shardings(
    shapes, mesh, sharding.rules_from_config(cfg.mesh.with_rules())
  )
  return jax.tree_util.tree_map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
  ), shardings


def create_sharded_state(cfg: RunConfig, model_cfg: BackboneConfig, mesh) -> Tuple[TrainState, Any]:
  """The initial TrainState created directly in its shardings (never whole on one device).

  Returns (state, state_shardings); shardings follow the config's logical-axis rules.
  """
  _, shardings = abstract_sharded_state(cfg, model_cfg, mesh)
  init_fn = functools.partial(create_train_state, cfg.optimization, model_cfg)
  return jax.jit(init_fn, out_shardings=shardings)(jax.random.key(cfg.seed)), shardings


def jit_train_step(
  opt: Optimization,
  model: Backbone,
  obj_cfg: losses.ObjectiveConfig,
  mesh,
  state_shardings,
  optimizer: Optional[optax.GradientTransformation] = None,
):
  """`make_train_step` jitted with the state's and the batch's shardings, state donated.

  Call as step(state, batch, base_rng) -> (state, metrics); batches from `sharding.global_batch`.
  """
  step = make_train_step(opt, model, obj_cfg, optimizer or make_optimizer(opt))
  return jax.jit(
    step,
    in_shardings=(state_shardings, sharding.batch_sharding(mesh), None),
    out_shardings=(state_shardings, None),
    donate_argnums=(0,),
  )
