"""The run's tokenizer: loaded from WORKDIR/tokenizer/, else built (and trained on the run's data
for kind=trained), shared by every process of a multi-host run.

  tokenizer = workdir_tokenizer.build_tokenizer(config, workdir)   # config: typed or ConfigDict

`config` is anything with the run's `tokenizer` and `data` sections (`config.run.RunConfig`, or
the ConfigDict of a config.json).
"""

from __future__ import annotations

from typing import Optional

import jax

from setdiff_jax import paths, sharding
from setdiff_jax.data import sources, tokenizers


def build_tokenizer(
  config, workdir: Optional[str], *, allow_training: bool = True, save: bool = True
):
  """The run's tokenizer (loaded from WORKDIR/tokenizer/; else built, and saved there if
  `save`: the trainer saves it only after its data is validated)."""
  train_texts = None
  if allow_training:
    train_texts = lambda: sources.tokenizer_training_texts(config.data, max_docs=200_000)
  if workdir is None or jax.process_count() == 1:
    return tokenizers.get_tokenizer(config.tokenizer, workdir, train_texts=train_texts, save=save)
  # Several processes share the workdir: process 0 trains (or loads) and saves it at once (the
  # others read it from there; `save` cannot defer it), the others wait for it (bounded:
  # `sharding.agree`), check that they see the very files process 0 has (a workdir that is not
  # shared by every host, or a stale copy, would give another vocabulary) and read it; never
  # trained twice. Every process ends with the same error when one of them does not.
  me = jax.process_index()
  tok, failed = None, None
  if me == 0:
    try:
      tok = tokenizers.get_tokenizer(config.tokenizer, workdir, train_texts=train_texts)
    except Exception as e:  # noqa: BLE001 - the others must not wait for a tokenizer in vain
      failed = e
  saved = sharding.agree(
    "tokenizer saved",
    "!" + str(failed) if failed else tokenizers.fingerprint(workdir) if me == 0 else "",
  )[0]
  if failed is not None:
    raise failed
  if saved.startswith("!"):
    raise ValueError(f"process 0 could not build the tokenizer: {saved[1:]}")
  where = paths.join(workdir, tokenizers.TOKENIZER_SUBDIR)
  sharding.check_all_see(
    "tokenizer read",
    saved,
    lambda: tokenizers.fingerprint(workdir),
    f"the tokenizer process 0 saved in {where}",
    "other files there",
  )
  if tok is None:
    tok = tokenizers.get_tokenizer(config.tokenizer, workdir, train_texts=None)
  return tok


def id_difference(tokenizer, source: str) -> Optional[str]:
  """None when the run `source` saved a tokenizer giving every token the id `tokenizer` gives it
  (special ids included); else what differs ("N of this run's M tokens have another id there,
  special ids ... there vs ... here"). ValueError when `source` saved none."""
  tok_dir = paths.join(source, tokenizers.TOKENIZER_SUBDIR)
  if not tokenizers.saved_in(source):
    raise ValueError(f"{source} has no saved tokenizer ({tok_dir})")
  with paths.local_copy(tok_dir) as local:
    theirs = tokenizers.Tokenizer.load(local)
  ours_v = tokenizer.hf.get_vocab(with_added_tokens=True)
  theirs_v = theirs.hf.get_vocab(with_added_tokens=True)
  if ours_v == theirs_v and tokenizer.special_ids() == theirs.special_ids():
    return None
  moved = sum(theirs_v.get(t) != i for t, i in ours_v.items())
  return (
    f"{moved} of this run's {len(ours_v)} tokens have another id there, special ids "
    f"{theirs.special_ids()} there vs {tokenizer.special_ids()} here"
  )


def check_same_ids(tokenizer, source: str, flag: str):
  """ValueError unless the run `source` saved a tokenizer giving every token the id `tokenizer`
  gives it (`id_difference`): parameters trained with other ids (another corpus, other
  tokenizer settings) would read every input as other tokens, silently."""
  tok_dir = paths.join(source, tokenizers.TOKENIZER_SUBDIR)
  if not tokenizers.saved_in(source):
    raise ValueError(
      f"{flag}={source} has no saved tokenizer ({tok_dir}): the ids its parameters were trained "
      "with cannot be checked; copy that run's tokenizer/ folder there"
    )
  difference = id_difference(tokenizer, source)
  if difference is None:
    return
  raise ValueError(
    f"{flag}={source} was trained with another tokenizer ({difference}): its parameters would "
    f"read them as other tokens. Start the new run with its tokenizer (copy {tok_dir} into the "
    "new workdir as tokenizer/ before the first run), or give the tokenizer settings and data it "
    "was trained with"
  )


__all__ = ["build_tokenizer", "id_difference", "check_same_ids"]
