"""Evaluation entry points (likelihood bound, infilling, throughput, samples).

The implementation lives in the `setdiff_jax.evaluation` package; this module re-exports its public
API under the name the design document uses (`from setdiff_jax import evaluate`).
"""
from setdiff_jax.evaluation import *  # noqa: F401,F403
from setdiff_jax.evaluation import __all__  # noqa: F401
