"""Measure shape advice: build the original and proposed causal LMs with random weights and
time their forward passes here, interleaved (A/B/A/B...), with the workload_runs protocol
(the harness's measure_step: whole steps on the host clock, device synchronized).

On a shared machine a slow spell that lands on one variant's block of runs would show up as
a speed-up; interleaving puts every variant in every spell, and the speed-up is taken per
round (original over proposed, paired), so what is reported is the median of paired ratios
and their spread (p20-p80). A ratio whose spread straddles 1 is reported as within noise.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from pipeline.harness.timer import TimingSpec, measure_step
from pipeline.workloads.predict_callable import build_causal_lm, check_hf_config


@dataclass
class ABResult:
    labels: list[str]
    us_per_token: dict[str, np.ndarray]  # label -> one median per round (µs per token)

    def speedup(self, base: str, other: str) -> tuple[float, float, float]:
        """(median, p20, p80) of the per-round ratios base/other: > 1 means `other` is faster."""
        r = self.us_per_token[base] / self.us_per_token[other]
        return float(np.median(r)), float(np.percentile(r, 20)), float(np.percentile(r, 80))

    def verdict(self, base: str, other: str, predicted: float) -> str:
        med, lo, hi = self.speedup(base, other)
        if lo <= 1.0 <= hi:
            return "within noise"
        return "sign agrees" if (med > 1) == (predicted > 1) else "WRONG SIGN"


def measure_ab(variants: dict[str, tuple[dict, int]], seq: int, dtype: str = "float32", *, rounds: int = 7,
               reps: int = 3, warmup: int = 2, progress: bool = True) -> ABResult:
    """variants: label -> (HF config dict, batch). Each is checked (memory included) and built
    once; then `rounds` rounds time every variant `reps` forwards (after `warmup`), the order
    reversed on odd rounds. One median per variant per round, as µs per token."""
    import torch

    built = {}
    for label, (cfg, batch) in variants.items():
        config = check_hf_config(cfg, batch, seq, dtype)
        model = build_causal_lm(cfg, dtype, config=config)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
        built[label] = (model, ids, batch)
    labels = list(variants)
    per_round = {lb: [] for lb in labels}
    spec = TimingSpec.fixed(warmup, reps)
    with torch.inference_mode():
        for r in range(rounds):
            for label in (labels if r % 2 == 0 else labels[::-1]):
                model, ids, batch = built[label]
                m = measure_step(lambda: model(input_ids=ids, use_cache=False), spec)
                per_round[label].append(m.median_us / (batch * seq))
            if progress:
                print(f"  measure: round {r + 1}/{rounds} " + ", ".join(
                    f"{lb} {per_round[lb][-1] * batch_seq(variants[lb][1], seq) / 1e3:.1f} ms" for lb in labels),
                    file=sys.stderr, flush=True)
    return ABResult(labels, {lb: np.asarray(v) for lb, v in per_round.items()})


def batch_seq(batch: int, seq: int) -> int:
    return batch * seq
