"""Data layer: tokenizers, text sources and grain input pipelines.

tok = get_tokenizer(cfg.tokenizer, workdir,
                    train_texts=lambda: tokenizer_training_texts(cfg.data))
ds = make_dataset(cfg.data, tok, split="train", seq_len=128,
                  global_batch_size=64, seed=0)
it = iter(ds); batch = next(it)   # {'tokens', 'attention_mask'}: int32 [B, L]
"""

from setdiff_jax.data.iterator_state import (
  checkpoint_args_restore,
  checkpoint_args_save,
  iterator_state_json,
  restore_iterator_state,
)
from setdiff_jax.data.pipeline import (
  default_data_config,
  make_dataset,
  pad_rows,
  validate_data_config,
  wrap_rows,
)
from setdiff_jax.data.sources import (
  embedded_corpus,
  jsonl_texts,
  load_texts,
  text_file_texts,
  tfds_texts,
  tokenizer_training_texts,
)
from setdiff_jax.data.tokenizers import (
  Tokenizer,
  build_tokenizer,
  default_tokenizer_config,
  get_tokenizer,
  validate_tokenizer_config,
)

__all__ = [
  "checkpoint_args_restore",
  "checkpoint_args_save",
  "default_data_config",
  "iterator_state_json",
  "make_dataset",
  "pad_rows",
  "restore_iterator_state",
  "validate_data_config",
  "wrap_rows",
  "embedded_corpus",
  "jsonl_texts",
  "load_texts",
  "text_file_texts",
  "tfds_texts",
  "tokenizer_training_texts",
  "Tokenizer",
  "build_tokenizer",
  "default_tokenizer_config",
  "get_tokenizer",
  "validate_tokenizer_config",
]
