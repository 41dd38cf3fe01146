"""AR baseline on LM1B (causal DiT, shifted next-token NLL; SPEC §1.6, §5): `lm1b-ar`.

  python launch/train.py --config=configs/lm1b_ar.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DIR
"""

from configs import lm1b_sw


def get_config(variant: str = ""):  # "cpu": see lm1b_sw.cpu_smoke
  return lm1b_sw.lm1b_base("ar", variant)
