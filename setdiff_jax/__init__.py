"""setdiff_jax: Set Diffusion (Arriola & Kuleshov, ICML 2026) in JAX/Flax."""

__version__ = "0.1.0"
