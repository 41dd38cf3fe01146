"""Reference implementations and the parity checks against them (the tests and
`launch/export.py --verify`; they need the torch extra, `transformers` for Qwen3).

  torch_reference.py   a PyTorch re-implementation of the DiT backbone and its SetDLM bound
  parity.py            our JAX model vs the PyTorch reference on an export (logits, cached step,
                       bound, re-import)
  qwen3_parity.py      a Qwen3 export vs `transformers` (logits, re-import)
  verify.py            the `--verify` report of an export and its one-line verdict

Above `interop/` (they read exports through it); no library module imports this package.
"""
