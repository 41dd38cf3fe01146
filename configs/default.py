"""Base configuration; every other config starts from this one and changes a few fields.

Run:  python launch/train.py --config=configs/default.py --workdir=/tmp/setdiff_default
      (a small SetDLM on the embedded Jane Austen corpus; prefer configs/tiny_sw.py for a demo)

Any field can be overridden on the command line, e.g. `--config.loss.desired_set_size=8`.
"""

from setdiff_jax.config import run as run_config


def get_config():
  """The package defaults (`setdiff_jax.config.run.default_config`; every field is commented in
  `setdiff_jax/config/sections.py`)."""
  return run_config.default_config()
