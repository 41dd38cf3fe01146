"""benchmarks/speed_accuracy.py without training: method specs (`+eos`) and the mean ± std table
over seeds (issue 22)."""

import importlib.util
import os

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location(
    "speed_accuracy", os.path.join(REPO, "benchmarks", "speed_accuracy.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_method_specs(bench):
  assert bench.parse_spec("mdlm+eos") == ("mdlm", None, "eos")
  assert bench.parse_spec("bd3lm4") == ("bd3lm", 4, "none")
  with pytest.raises(ValueError, match=r"the only suffix is '\+eos'"):
    bench.parse_spec("mdlm+pad")
  c = bench.method_config("bd3lm8+eos", bench.plan(bench.parse_args(["--quick"])), 3, True)
  assert (c.objective, c.loss.block_size, c.data.pad_targets, c.seed) == ("bd3lm", 8, "eos", 3)


def row(acc, align, kept=1.5):
  return {
    "window": None,
    "threshold": "off",
    "align_to_blocks": align,
    "accuracy": acc,
    "tokens_per_step": 2.0,
    "kept_tokens_per_step": kept,
    "forward_calls": 10.0,
    "mean_generated_tokens": 15.0,
    "tokens_per_second_batch1": 100.0,
    "tokens_per_second": 300.0,
    "num_examples": 200,
    "setting": "tau=off",
    "batch1_matches_batched": True,
  }


def test_summary_over_seeds(bench):
  runs = [
    {
      "seed": s,
      "results": [
        {
          "method": "bd3lm4",
          "objective": "bd3lm",
          "num_test": 200,
          "rows": [row(a, True), row(b, False, kept=k)],
        }
      ],
    }
    for s, a, b, k in ((0, 0.3, 0.1, 1.0), (1, 0.2, 0.15, 2.0), (2, 0.4, 0.05, 3.0))
  ]
  (rec,) = bench.summarize_seeds(runs)
  aligned, unaligned = rec["rows"]
  assert aligned["align_to_blocks"] is True and aligned["num_seeds"] == 3
  assert aligned["accuracy"] == pytest.approx(0.3)
  assert aligned["accuracy_std"] == pytest.approx(np.std([0.3, 0.2, 0.4], ddof=1))
  assert unaligned["kept_tokens_per_step"] == pytest.approx(2.0)
  md = bench.summary_table([rec])
  assert "| bd3lm4 | - | off | grid | 3 | 200 | 30.0 ± 10.0 |" in md
  assert "| bd3lm4 | - | off | prompt end | 3 | 200 | 10.0 ± 5.0 |" in md


def test_report_of_a_run_cut_short_says_partial(bench, tmp_path):
  runs = [
    {
      "seed": 0,
      "results": [
        {
          "method": "bd3lm4",
          "objective": "bd3lm",
          "num_test": 200,
          "num_params": 1e5,
          "train_seconds": 60.0,
          "rows": [row(0.3, True)],
        }
      ],
    }
  ]
  record = {
    "command": "python benchmarks/speed_accuracy.py --seeds=0,1,2",
    "commit": "abc1234",
    "quick": False,
    "hardware": {"cpu": "cpu", "cpu_count": 2, "jax": "x", "backend": "cpu"},
    "plan": {"steps": 1200, "batch_size": 32, "decode_batch": 50, "speed_examples": 16},
    "load_start": "l0",
    "load_end": "l1",
    "total_seconds": 60.0,
    "train_seconds": 50.0,
    "eval_seconds": 10.0,
    "recipe": "r",
    "results": runs[0]["results"],
    "runs": runs,
    "summary": None,
    "seeds": [0, 1, 2],
    "seeds_done": [0],
  }
  md = bench.write_report(str(tmp_path), record)
  assert "**Partial**: seeds 0 of 0, 1, 2 done" in md
  assert "at commit abc1234" in md
  record["seeds"] = record["seeds_done"] = [0]
  assert "Partial" not in bench.write_report(str(tmp_path), record)
