#!/usr/bin/env bash
# Packaging check: build a wheel, check that a fresh venv's pip (23.2) sees every extra the README
# names, install the wheel in that venv outside the source tree, and build the packaged
# tokenizers, train, sample, evaluate, export and import from there (nothing may need configs/,
# the checkout or ../shared).
#
# Works from the system Python and from inside a venv: the check's venv sees the *active*
# interpreter's packages through a .pth file listing its site-packages folders (a venv made with
# --system-site-packages would see the base interpreter's, not an active venv's). Plain path
# lines only: the active environment's own .pth files (its editable setdiff_jax) are not run, so
# the venv imports the wheel.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Built from a copy of the files a clone would have (tracked, plus new ones git does not ignore):
# no stale build/ folder of the checkout can leak old modules into the wheel.
mkdir "$tmp/src"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$repo" && git ls-files -z -c -o --exclude-standard \
     | while IFS= read -r -d '' f; do [[ -f "$f" ]] && printf '%s\0' "$f"; done \
     | tar --null -T - -cf -) | tar -xf - -C "$tmp/src"
else
  cp -r "$repo/." "$tmp/src"
fi
python -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp/src"
wheel="$(ls "$tmp"/dist/setdiff_jax-*.whl)"
python -m venv "$tmp/venv"
vpy="$tmp/venv/bin/python"
purelib="$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
python - "$purelib/_active_env.pth" <<'PY'
import os
import sys
dirs = [p for p in sys.path if os.path.basename(p.rstrip("/")) in ("site-packages",
                                                                   "dist-packages")
        and os.path.isdir(p)]
assert dirs, f"no site-packages folder on the active sys.path: {sys.path}"
with open(sys.argv[1], "w", encoding="utf-8") as f:
  f.write("".join(os.path.abspath(p) + "\n" for p in dirs))
PY

# --- extras: every `.[name]` of the README is provided under that exact name for pip 23.2 (the
# pip a fresh Python 3.11 venv ships; it does not normalise `lm_eval` to the metadata's `lm-eval`).
pipv="$("$vpy" -m pip --version | cut -d' ' -f2)"
if [[ "$pipv" != 23.2* ]]; then
  "$vpy" -m pip install -q "pip==23.2.1" 2>/dev/null \
    || echo "extras check: pip 23.2.1 not installable here; checking with pip $pipv" >&2
  pipv="$("$vpy" -m pip --version | cut -d' ' -f2)"
fi
extras="$(grep -o 'pip install -e "\.\[[^]]*\]"' "$repo/README.md" | sed 's/.*\[\(.*\)\].*/\1/' \
          | tr ',' '\n' | sort -u | paste -sd, -)"
[[ -n "$extras" ]] || { echo "extras check: the README names no extra" >&2; exit 1; }
# A dry run against the active environment's packages (already satisfied: ~10 s, no downloads
# beyond what is missing); pip warns "does not provide the extra" and exits 0 on a wrong name.
out="$("$vpy" -m pip install --dry-run --no-build-isolation "$wheel[$extras]" 2>&1)" || {
  echo "$out" >&2; echo "extras check: pip $pipv could not resolve .[$extras]" >&2; exit 1; }
if grep -i "does not provide the extra" <<<"$out" >&2; then
  echo "extras check failed: pip $pipv ignores the extras above (README: .[$extras])" >&2
  exit 1
fi
echo "extras check ok: pip $pipv provides .[$extras]"

# --- the wheel, imported from outside the checkout.
"$vpy" -m pip install -q --no-deps --force-reinstall "$wheel"
cd "$tmp"
"$vpy" - "$repo" <<'PY'
import os
import pathlib
import sys

repo = pathlib.Path(sys.argv[1])
sys.path = [p for p in sys.path if p not in ("", str(repo))]  # never the checkout
import setdiff_jax
where = pathlib.Path(setdiff_jax.__file__).resolve()
assert repo not in where.parents, f"imported the checkout ({where}), not the wheel"

from setdiff_jax import decoding, train
from setdiff_jax.data import tokenizers
from setdiff_jax.evaluation import run
from setdiff_jax.interop import export_workdir, import_checkpoint
from setdiff_jax.config import run as run_config

# The LM1B / OWT tokenizers from the packaged vocabularies (the configs' defaults).
bert = tokenizers.wordpiece_tokenizer(tokenizers.packaged_vocab("bert-base-uncased/vocab.txt"))
gpt2 = tokenizers.gpt2_tokenizer(tokenizers.packaged_vocab("gpt2/vocab.json"),
                                 tokenizers.packaged_vocab("gpt2/merges.txt"))
assert where.parent in pathlib.Path(tokenizers.packaged_vocab("gpt2/merges.txt")).parents
assert bert.encode("Hello world") == [7592, 2088] and bert.vocab_size == 30522
assert gpt2.encode("Hello world") == [15496, 995] and gpt2.mask_id == 50257
for name in ("bert-base-uncased", "gpt2"):
  assert (tokenizers.PACKAGED_VOCAB_DIR / name / "LICENSE").is_file(), name

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
print(f"wheel check ok: {where.parent}; packaged bert-base-uncased and GPT-2 tokenizers build; "
      f"eval nll {result['eval/nll']:.3f}, evaluate nll {lik['nll']:.3f}, "
      f"sampled {report.num_generated} tokens, export re-imported")
PY
