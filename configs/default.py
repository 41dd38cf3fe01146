"""Base configuration; every other config starts from this one and changes a few fields.

Run:  python launch/train.py --config=configs/default.py --workdir=/tmp/setdiff_default
      (a small SetDLM on the embedded Jane Austen corpus; prefer configs/tiny_sw.py for a demo)

Any field can be overridden on the command line, e.g. `--config.loss.desired_set_size=8`.
"""

from setdiff_jax.workdir import config as run_config


def get_config():
  """The package defaults (`setdiff_jax.workdir.config.default_config`; every field commented there)."""
  return run_config.default_config()
