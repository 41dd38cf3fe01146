#!/usr/bin/env bash
# Packaging check: build a wheel, install it in a fresh venv outside the source tree, and train,
# sample, evaluate, export and import from there (nothing may need configs/ or the checkout).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$repo"
# The dependencies are already installed here; the venv reuses them but gets its own setdiff_jax.
python -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-deps --force-reinstall "$tmp/dist"/setdiff_jax-*.whl
cd "$tmp"
"$tmp/venv/bin/python" - "$repo" <<'PY'
import os
import pathlib
import sys

repo = pathlib.Path(sys.argv[1])
sys.path = [p for p in sys.path if p not in ("", str(repo))]  # never the checkout
import setdiff_jax
where = pathlib.Path(setdiff_jax.__file__).resolve()
assert repo not in where.parents, f"imported the checkout ({where}), not the wheel"

from setdiff_jax import decoding, run_config, train
from setdiff_jax.evaluation import run
from setdiff_jax.interop import export_workdir, import_checkpoint

c = run_config.default_config()  # the package's own defaults: no configs/ needed
c.seq_len, c.model.hidden_size, c.model.num_layers, c.model.num_heads = 32, 32, 1, 2
c.tokenizer.vocab_size, c.data.train_split = 384, "validation"
c.batch_size = c.eval_batch_size = 8
c.num_train_steps, c.eval_every_steps, c.checkpoint_every_steps = 2, 2, 2
c.num_eval_steps, c.num_eval_samples, c.mesh.data = 1, 0, 1
workdir = str(pathlib.Path("run").resolve())
result = train.train_and_evaluate(c, workdir)
report = decoding.sample_from_workdir(workdir, num_samples=1, max_new_tokens=4, write=lambda s: None)
lik = run.evaluate_workdir(workdir, ["likelihood"], run.EvalOptions(num_orders=1, max_rows=8),
                           log=None)["likelihood"]
export_workdir(workdir, "export")
config, params = import_checkpoint("export")
assert config.objective == c.objective and report.num_generated >= 1
print(f"wheel check ok: {where.parent}; eval nll {result['eval/nll']:.3f}, "
      f"evaluate nll {lik['nll']:.3f}, sampled {report.num_generated} tokens, export re-imported")
PY
