r"""lm-evaluation-harness on a trained run: lm_eval's own command line plus the `setdiff_jax` model.

  python launch/lm_eval_harness.py --model setdiff_jax --model_args workdir=DIR,W=4,tau=0.9 \
      --tasks gsm8k --batch_size 8 [--include_path MY_TASKS] [--limit 100] [--output_path OUT]

Needs the extra: pip install -e ".[lmeval]". lm_eval 0.4.x cannot find a model outside its own
name table (no entry points; --include_path adds tasks only), so the plain `lm_eval` command does
not know `setdiff_jax`: this launcher registers it, then hands every argument to lm_eval's CLI
unchanged. `python -m setdiff_jax.evaluation.lm_eval_model ...` is the same without a checkout.
(Not named lm_eval.py: as the script's folder is on sys.path, it would hide the lm_eval package.)
model_args and what each request type computes: `setdiff_jax/evaluation/lm_eval_model.py`.
"""

import sys

from setdiff_jax import cli, errors

try:
  from setdiff_jax.evaluation import lm_eval_model  # registers --model setdiff_jax
except errors.MissingExtraError as e:  # no lm_eval: one error line naming the extra
  if __name__ == "__main__":
    sys.exit(cli.report(e))
  raise

if __name__ == "__main__":
  sys.exit(lm_eval_model.main())
