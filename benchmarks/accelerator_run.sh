#!/bin/bash
# The accelerator check with the official code beside it, as one bounded device command.
#
# 1. Here (network to PyPI), from the repository root, once per checkout:
#      bash benchmarks/accelerator_run.sh prepare /path/to/setdlms-git-dir
#    writes, all ignored by git (.git/info/exclude): .setdlms/ (the official tree, `git archive`
#    of 549f0bb, else HEAD), .whl/ours (grain, array-record, portpicker, ml-collections: what the
#    device image lacks for us) and .whl/off (the official code's pins: transformers 4.52.4,
#    tokenizers 0.21.4, huggingface_hub 0.36.2, hydra-core 1.3.2, omegaconf 2.3.0, antlr4 4.9.3),
#    Python 3.12 x86-64 wheels, and COMMIT (the copy on the device is not a git repository).
# 2. On the device (the `run` tool; carry .setdlms .whl COMMIT; timeout_s 560):
#      bash benchmarks/accelerator_run.sh run
#    installs each wheel set into its own folder (ours on PYTHONPATH for the check, the official
#    pins only for the official worker's python), then runs python -m benchmarks.accelerator_check
#    --official=.setdlms into $OUT (budget 450 s, killed at 520 s): table.md, results.jsonl,
#    results.json, check.log, train_trace.json.gz, machine.txt.
# A second, shorter pass for the training levers (their own reference row inside the section):
#      SECTIONS=levers,levers_xla BUDGET=240 bash benchmarks/accelerator_run.sh run
# Env: OUT (default /tmp/acc_out), BUDGET (450), TINY=1 (tiny shapes: a CPU run of this script),
#      SECTIONS (accelerator_check --sections; default all, in priority order),
#      PY (python3), PY_OFF (the official python; default: PY with the official wheels),
#      OFFICIAL (where the official tree is copied to / read from; default /tmp/setdlms_official).
set -u
mode=${1:-run}
PY=${PY:-python3}
if [ "$mode" = prepare ]; then
  src=${2:?usage: accelerator_run.sh prepare SETDLMS_GIT_DIR}
  set -e
  for p in /.setdlms/ /.whl/ /COMMIT; do
    grep -qxF "$p" "$(git rev-parse --git-path info/exclude)" 2>/dev/null ||
      echo "$p" >>"$(git rev-parse --git-path info/exclude)"
  done
  rev=549f0bb; git --git-dir="$src" cat-file -e "$rev^{commit}" 2>/dev/null || rev=HEAD
  rm -rf .setdlms && mkdir -p .setdlms && git --git-dir="$src" archive "$rev" | tar -x -C .setdlms
  plat="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
  rm -rf .whl && mkdir -p .whl/ours .whl/off
  $PY -m pip download -q --no-deps $plat -d .whl/ours grain==0.2.18 array-record==0.8.6 \
    portpicker==1.6.0 ml-collections==1.1.0
  $PY -m pip download -q --no-deps $plat -d .whl/off transformers==4.52.4 tokenizers==0.21.4 \
    huggingface_hub==0.36.2 hydra-core==1.3.2 omegaconf==2.3.0
  $PY -m pip wheel -q --no-deps -w .whl/off antlr4-python3-runtime==4.9.3  # an sdist only
  git rev-parse --short HEAD >COMMIT
  echo "official tree $rev in .setdlms; wheels: $(ls .whl/ours .whl/off | grep -c whl); $(du -sh .whl | cut -f1)"
  exit 0
fi

# The official tree is copied outside the repository (official.py insists). The copy replaces
# OFFICIAL, so OFFICIAL must be new or a copy this script made (its marker file): never a folder
# of someone's, such as the .setdlms it copies from.
OFFICIAL=${OFFICIAL:-/tmp/setdlms_official}
if [ -d .setdlms ]; then
  if [ -e "$OFFICIAL" ] && [ ! -e "$OFFICIAL/.copied_by_accelerator_run" ]; then
    echo "error: OFFICIAL=$OFFICIAL exists and is not a copy this script made; the run would" \
      "replace it with .setdlms: point OFFICIAL at a new folder (default /tmp/setdlms_official)" >&2
    exit 2
  fi
  rm -rf "$OFFICIAL" && cp -r .setdlms "$OFFICIAL" && touch "$OFFICIAL/.copied_by_accelerator_run"
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/acc_out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-450}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  echo "project commit $(git rev-parse --short HEAD 2>/dev/null || cat COMMIT 2>/dev/null)"
} >"$OUT/machine.txt"
if [ -d .whl/ours ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_ours \
    .whl/ours/*.whl 2>&1 | tail -2
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_off \
    .whl/off/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site_ours${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -z "${PY_OFF:-}" ]; then  # the official side: its pins first, nothing of ours
  PY_OFF=/tmp/official_python
  printf '#!/bin/bash\nPYTHONPATH=/tmp/site_off exec %s "$@"\n' "$(command -v "$PY")" >"$PY_OFF"
  chmod +x "$PY_OFF"
fi
$PY -c "import jax; print('ours: jax', jax.__version__, jax.devices())" 2>&1 | tail -1 |
  tee -a "$OUT/machine.txt"
ARGS=(--output_dir="$OUT" --budget_s="$BUDGET" --official="$OFFICIAL" --official_python="$PY_OFF")
[ "${TINY:-0}" = 1 ] && ARGS+=(--tiny --repeats=1)
[ -n "${SECTIONS:-}" ] && ARGS+=(--sections="$SECTIONS")
timeout $((BUDGET + 70)) $PY -m benchmarks.accelerator_check "${ARGS[@]}"
echo "rc=$? (accelerator_check)"
