#!/usr/bin/env bash
# Train on a multi-host Cloud TPU VM slice: create (or reuse) the slice, install the package on
# every worker, and run the same training command on all of them. JAX's distributed runtime
# (sharding.initialize_distributed in launch/train.py) discovers the other hosts from the TPU
# metadata. All hosts share one global data order (each reads its rows of every global batch, so
# the batches do not depend on the host count); orbax saves the sharded state from all hosts;
# process 0 writes config.json, tokenizer/ (trained once), metrics.jsonl and the iterator state,
# all through etils.epath, so WORKDIR on gs:// holds the whole run and a fresh slice (of any
# size) resumes from it. Stop decisions are agreed by all hosts: a SIGTERM (preemption) that
# reaches one host, a NaN / divergence stop seen by one, a checkpoint one finds damaged at resume
# make every host save / stop / fall back alike. A host that dies, in a step or in a save, stops
# the others (one error line, or JAX's own abort within seconds when the coordinator is gone, at
# most SETDIFF_HEARTBEAT_TIMEOUT_S for a silent host); rerun this script to resume.
# Tested on one machine with launch/local_cluster.py (CPU processes + gloo), not on a real pod.
#
# Usage:
#   TPU_NAME=setdiff-v4-32 ZONE=us-central2-b ACCELERATOR=v4-32 \
#   REPO=https://github.com/<you>/setdiff_jax.git WORKDIR=gs://<bucket>/runs/lm1b_sw \
#   TFDS_DIR=gs://<bucket>/tensorflow_datasets \
#   bash launch/tpu_pod.sh configs/lm1b_sw.py [--config.mesh.fsdp=4 ...]
#
# WORKDIR and TFDS_DIR should be on GCS (every host must see the same paths).
set -euo pipefail

CONFIG=${1:?usage: launch/tpu_pod.sh CONFIG [--config.overrides ...]}
shift
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${REPO:?set REPO (git URL of this repo)}"
: "${WORKDIR:?set WORKDIR (gs://...)}"
ACCELERATOR=${ACCELERATOR:-v4-32}
RUNTIME=${RUNTIME:-tpu-ubuntu2204-base}
BRANCH=${BRANCH:-main}
TFDS_FLAG=${TFDS_DIR:+--config.data.tfds_data_dir=$TFDS_DIR}

if ! gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" >/dev/null 2>&1; then
  gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" \
      --accelerator-type="$ACCELERATOR" --version="$RUNTIME"
fi

ssh_all() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$1"
}

# Install on every worker (idempotent): the repo at $BRANCH, jax for TPU, the package.
ssh_all "set -e; if [ ! -d setdiff_jax ]; then git clone -b $BRANCH $REPO setdiff_jax; fi; \
  cd setdiff_jax && git fetch -q && git checkout -q $BRANCH && git pull -q; \
  pip install -q -U 'jax[tpu]>=0.10,<0.11' && pip install -q -e ."

# The same command on every host; only process 0 writes the shared files.
ssh_all "cd setdiff_jax && python launch/train.py --config=$CONFIG --workdir=$WORKDIR $TFDS_FLAG $*"
