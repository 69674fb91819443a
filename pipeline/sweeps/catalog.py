"""The workloads a profile measures and traces: GPT-2 forward passes, DLRM training steps and
one small MLP training step (an extra overhead donor, never evaluated).

Each entry builds its model and inputs on a device and returns a no-argument step, so the
timed runs (workload_runs) and the captured traces (overhead_samples, workload_graphs) run
exactly the same calls. torch is imported only when a step is built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pipeline.sweeps.profiles import Profile


@dataclass(frozen=True)
class WorkloadEntry:
    workload: str  # "gpt2", "dlrm" or "mlp"
    config: str
    batch: int
    seq: int  # 0 where the workload has no sequence
    mode: str  # "forward" (inference) or "train" (forward, loss, backward, optimizer step)
    spec: object = None

    @property
    def key(self) -> tuple:
        return self.workload, self.config, self.batch, self.seq, self.mode

    def build(self, device: str = "cpu", dtype: str = "float32") -> Callable[[], object]:
        import torch

        if self.workload == "gpt2":
            from pipeline.workloads.gpt2_run import build_gpt2

            model = build_gpt2(self.spec, dtype, device)
            ids = torch.randint(0, self.spec.vocab_size, (self.batch, self.seq),
                                generator=torch.Generator().manual_seed(0)).to(device)

            def forward():
                with torch.inference_mode():
                    return model(input_ids=ids, use_cache=False)
            return forward
        if self.workload == "dlrm":
            from pipeline.workloads.dlrm_run import built_step

            return built_step(self.spec, self.batch, device)
        return _mlp_step(self.batch, device)


MLP_WIDTHS = (256, 512, 512, 10)


def _mlp_step(batch: int, device: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = []
    for a, b in zip(MLP_WIDTHS, MLP_WIDTHS[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, MLP_WIDTHS[0], device=device)
    y = torch.randint(0, MLP_WIDTHS[-1], (batch,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def workload_entries(profile: Profile, evaluated_only: bool = False) -> list[WorkloadEntry]:
    """Every (workload, config, batch, seq, mode) the profile runs; the MLP donor unless evaluated_only."""
    from pipeline.workloads import dlrm, gpt2

    out = [WorkloadEntry("gpt2", s.name, b, q, "forward", s) for s in gpt2.configs_for(profile.workload_configs)
           for b in profile.workload_batches for q in profile.workload_seqs]
    out += [WorkloadEntry("dlrm", s.name, b, 0, "train", s) for s in dlrm.configs_for(profile.dlrm_configs)
            for b in profile.dlrm_batches]
    if not evaluated_only:
        out += [WorkloadEntry("mlp", "mlp-" + "-".join(map(str, MLP_WIDTHS)), b, 0, "train")
                for b in profile.dlrm_batches]
    return out
