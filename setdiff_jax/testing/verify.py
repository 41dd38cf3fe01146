"""`launch/export.py --verify`: an export checked against the reference implementations.

  report = export_report(config, params, out_dir)   # torch (and transformers for Qwen3)
  passed, line = verdict(report)                    # the `verify: PASS` / `verify: FAIL` line

The DiT is checked against the PyTorch reference (`parity.py`), Qwen3 against `transformers`
(`qwen3_parity.py`).
"""

from __future__ import annotations

from setdiff_jax.testing import parity, qwen3_parity

# --verify passes when every relative error is below this (fp32 agreement is ~5e-7) and the
# re-import is bit-exact.
VERIFY_TOLERANCE = 1e-5
_VERIFY_ERRORS = {"two_stream": "two-stream logits", "cached_step": "cached step", "loss": "loss"}


def export_report(config, params, out_dir: str) -> dict:
  """The parity report of the export of (`config`, `params`) in `out_dir`."""
  if str(config.model.get("backbone", "dit")) == "qwen3":
    return qwen3_parity.parity_report(config, params, out_dir)
  return parity.parity_report(config, params, out_dir)


def verdict(report: dict) -> tuple[bool, str]:
  """(passed, one line) for a parity report of `export_report`."""
  parts, failed = [], []
  for key, what in _VERIFY_ERRORS.items():
    if key in report:
      value = float(report[key])
      parts.append(f"{what} {value:.1e}")
      if not value < VERIFY_TOLERANCE:  # NaN fails too
        failed.append(f"{what} error {value:.1e} >= {VERIFY_TOLERANCE:.0e}")
  exact = bool(report.get("roundtrip"))
  parts.append("re-import bit-exact" if exact else "re-import NOT bit-exact")
  if not exact:
    failed.append("the re-imported parameters differ")
  head = "PASS" if not failed else "FAIL (" + "; ".join(failed) + ")"
  return not failed, (
    f"verify: {head}: relative errors against the PyTorch reference "
    f"(tolerance {VERIFY_TOLERANCE:.0e}): " + ", ".join(parts)
  )


__all__ = ["export_report", "verdict", "VERIFY_TOLERANCE"]
