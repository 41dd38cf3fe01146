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
# 2. On the device, ONE call of the `run` tool (carry .setdlms .whl COMMIT; timeout_s 540):
#      BUDGET=420 OUT=$OUT bash benchmarks/accelerator_run.sh run
#    installs each wheel set into its own folder (ours on PYTHONPATH for the check, the official
#    pins only for the official worker's python), then runs python -m benchmarks.accelerator_check
#    --official=.setdlms into $OUT: table.md, results.jsonl, results.json, check.log,
#    train_trace.json.gz, machine.txt (6 files; the tool brings back at most 8). The check prints
#    its plan first (the sections in priority order with their limits) and writes each row to
#    results.jsonl as it is measured, the table after every section.
#    The arithmetic of one 15-minute lease (900 s of device time, the machine's start included):
#      start 60-120 s + setup here ~20 s + the check BUDGET = 420 s + files back ~10-30 s
#      = 510-590 s; the check is sent SIGTERM at BUDGET + 40 s (it then kills the running
#      section, writes its table and exits; SIGKILL 15 s later), so the command ends by
#      setup + BUDGET + 55 s = 495 s < timeout_s 540. The 5-6 min left hold no second run of
#      this size (and no machine starts with under 4 min left): plan one call.
#    The check's section limits (accelerator_check.TIMEOUTS) add up to 420 s for device 30, train
#    140, decode_dit 60, official 80, decode_qwen3 70, attention 40: each of these starts; levers
#    (150), levers_xla (60) and stack (40) run only on the time the earlier sections leave.
# A later pass for the training levers (their own reference row inside the section), in its own
# call (its files would take the main pass past 8), writes into its own subfolder of $OUT,
# $OUT/sections_levers_levers_xla:
#      SECTIONS=levers,levers_xla BUDGET=240 OUT=$OUT bash benchmarks/accelerator_run.sh run
# OUT (or the pass's subfolder) must be new or empty: a run never replaces another's files.
# Env: OUT (default /tmp/acc_out), BUDGET (420), TINY=1 (tiny shapes: a CPU run of this script),
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

OUT=${OUT:-/tmp/acc_out}
DEST=$OUT${SECTIONS:+/sections_${SECTIONS//,/_}}  # a pass of chosen sections: its own subfolder
if [ -n "$(ls -A "$DEST" 2>/dev/null)" ]; then
  echo "error: $DEST is not empty (an earlier run's files?); a run never replaces them: point" \
    "OUT at a new folder" >&2
  exit 2
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
mkdir -p "$DEST"
BUDGET=${BUDGET:-420}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  echo "project commit $(git rev-parse --short HEAD 2>/dev/null || cat COMMIT 2>/dev/null)"
} >"$DEST/machine.txt"
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
# No JAX client here (it would hold accelerator memory): the device section reports the devices.
ARGS=(--output_dir="$DEST" --budget_s="$BUDGET" --official="$OFFICIAL" --official_python="$PY_OFF")
[ "${TINY:-0}" = 1 ] && ARGS+=(--tiny --repeats=1)
[ -n "${SECTIONS:-}" ] && ARGS+=(--sections="$SECTIONS")
echo "accelerator_check into $DEST: budget $BUDGET s, SIGTERM at $((BUDGET + 40)) s"
timeout -s TERM -k 15 $((BUDGET + 40)) $PY -m benchmarks.accelerator_check "${ARGS[@]}"
echo "rc=$? (accelerator_check)"
