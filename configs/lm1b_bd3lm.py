"""BD3LM baseline on LM1B (block diffusion, block S=4, adaLN DiT; SPEC §1.6, §2.7, §5).

  python launch/train.py --config=configs/lm1b_bd3lm.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DIR [--config.loss.block_size=8]

One t per block, block-causal two-stream mask, empty blocks re-masked in training, antithetic t.
"""

from configs import lm1b_sw


def get_config(variant: str = ""):  # "cpu": see lm1b_sw.cpu_smoke
  c = lm1b_sw.lm1b_base("bd3lm", variant)
  c.model.adaln = True
  c.loss.block_size = 4
  c.loss.antithetic = True  # the only baseline run with antithetic t (SPEC §5)
  return c
