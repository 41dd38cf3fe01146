"""MDLM baseline on LM1B (bidirectional adaLN DiT fed sigma = 0, linear schedule; SPEC §1.6, §5).

  python launch/train.py --config=configs/lm1b_mdlm.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DIR

Training loss: unweighted CE over masked tokens; eval: the 1/t NELBO per real token.
"""

from configs import lm1b_sw


def get_config(variant: str = ""):  # "cpu": see lm1b_sw.cpu_smoke
  c = lm1b_sw.lm1b_base("mdlm", variant)
  c.model.adaln = True
  c.loss.antithetic = False  # off in the reference run despite its "antithetic" tag
  return c
