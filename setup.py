"""setdiff_jax: Set Diffusion language models in JAX/Flax."""

import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent


def _requirements():
  lines = (HERE / "requirements.txt").read_text().splitlines()
  return [l.split("#")[0].strip() for l in lines if l.split("#")[0].strip()]


setup(
  name="setdiff_jax",
  version="0.1.0",
  description="Set Diffusion (Arriola & Kuleshov, ICML 2026) in JAX/Flax.",
  long_description=(HERE / "README.md").read_text(),
  long_description_content_type="text/markdown",
  python_requires=">=3.10",
  packages=find_packages(include=["setdiff_jax", "setdiff_jax.*"]),
  # The embedded corpus and the bert-base-uncased / GPT-2 vocabularies with their licence
  # notices (setdiff_jax/data/vocab/README.md).
  package_data={
    "setdiff_jax.data": [
      "corpus/*.xz",
      "corpus/*.md",
      "vocab/*.md",
      "vocab/*/LICENSE",
      "vocab/*/*.txt",
      "vocab/*/*.json",
    ]
  },
  include_package_data=True,
  install_requires=_requirements(),
  extras_require={
    # Exactly the CPU build provided on our machines; an unpinned torch pulls CUDA wheels.
    # transformers: the Qwen3 parity tests (tests/test_qwen3.py); 5.x installs with torch 2.13.
    "torch": ["torch==2.13.0", "transformers>=5.0,<6"],
    # lm_eval: tests/test_lm_eval.py runs the harness adapter in CI (~1 min of pip CPU time,
    # ~3 s to import); without it that file is skipped. ruff: the linter (ruff.toml),
    # pinned exactly so that CI and developers apply the same rules.
    # gcp-storage-emulator + gcsfs: tests/test_gcs_chain.py (a whole run on an emulated
    # gs:// bucket; skipped without them). pytest-xdist: the suite runs on every core
    # (`-n auto --dist loadfile`: a module's fixtures are built once, on one worker).
    "test": [
      "pytest>=8",
      "pytest-xdist>=3.8,<4",
      "nbclient>=0.10",
      "nbformat>=5.10",
      "ipykernel>=6",
      "lm_eval>=0.4.9,<0.5",
      "ruff==0.17.6",
      "gcp-storage-emulator>=2024.8,<2027",
      "gcsfs>=2025.3,<2027",
    ],
    # The lm-evaluation-harness adapter (setdiff_jax/evaluation/lm_eval_model.py); 0.4.13
    # tested. It needs no torch; install it beside the CPU torch pin, never an unpinned one.
    # Extra names are written in their normalised form (lowercase, no "_"): pip 23.2 (a fresh
    # Python 3.11 venv's) matches `.[name]` literally against the metadata's normalised
    # names, so an "lm_eval" key (metadata "lm-eval") ignored `.[lm_eval]`. The README gives
    # `.[lmeval]`; "lm-eval" keeps `.[lm_eval]` working on newer pips (they normalise).
    "lmeval": ["lm_eval>=0.4.9,<0.5"],
    "lm-eval": ["lm_eval>=0.4.9,<0.5"],
    # The `tensorboard --logdir DIR/tensorboard` viewer (the events are written without it).
    "tensorboard": ["tensorboard>=2.18,<3"],
  },
)
