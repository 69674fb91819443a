"""Which device is this? Cheap identification (for partition keys) apart from measured peaks.

The slug is the partition key: stable across runs on the same hardware, e.g.
`cpu-intel-xeon-processor-f6m207-2c` or `cuda-nvidia-h100-80gb-hbm3`. A CPU's slug carries its
family and model numbers beside its name because a VM often masks the name: two different
Xeons both report "Intel(R) Xeon(R) Processor", and a calibration of one must never be taken
for the other's.
"""
from __future__ import annotations

import os
import platform
import re
from dataclasses import asdict, dataclass

from pipeline.core.cores import usable_cores
from pipeline.core.errors import UnknownDeviceError
from pipeline.core.slugs import check_slug


@dataclass(frozen=True)
class DeviceIdentity:
    slug: str
    kind: str  # "cpu" or "cuda"
    model: str
    torch_device: str  # what torch calls it: "cpu" or "cuda:0"
    cores: int | None
    threads: int | None
    sm_count: int | None
    memory_bytes: int | None
    l2_bytes: int | None
    torch_version: str
    cuda_version: str | None
    driver_version: str | None

    def as_row(self) -> dict:
        return asdict(self)


def slugify(text: str) -> str:
    text = re.sub(r"\((r|tm)\)", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def _cpuinfo() -> dict[str, str]:
    """Each /proc/cpuinfo field's first value (the first processor's, where every block has it);
    empty where the file cannot be read."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except (OSError, UnicodeDecodeError):
        return {}
    return fields


def _cpu_model(fields: dict[str, str]) -> str:
    if "model name" in fields:
        return fields["model name"]
    return platform.processor() or platform.machine() or "cpu"


def cpu_signature(fields: dict[str, str]) -> str:
    """The signature of /proc/cpuinfo's fields: `f<family>m<model>` (x86), `i<implementer>p<part>`
    (Arm), or '' where neither is there: what tells CPU models apart when their names are the same."""
    family, model = fields.get("cpu family", ""), fields.get("model", "")
    if family.isdigit() and model.isdigit():
        return f"f{family}m{model}"
    implementer, part = fields.get("CPU implementer", ""), fields.get("CPU part", "")
    if implementer and part:
        return slugify(f"i{implementer.lower().removeprefix('0x')}p{part.lower().removeprefix('0x')}")
    return ""


def cpu_stem(model: str, signature: str) -> str:
    """The slug of a CPU less its thread count: `cpu-<name>[-<signature>]`."""
    return "-".join(p for p in ("cpu", slugify(model), signature) if p)


def _cpu_l2_bytes() -> int | None:
    path = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in sorted(os.listdir(path)):
            with open(f"{path}/{idx}/level") as f:
                if f.read().strip() != "2":
                    continue
            with open(f"{path}/{idx}/size") as f:
                size = f.read().strip().upper()
            mult = {"K": 1024, "M": 1024**2}.get(size[-1], 1)
            return int(size.rstrip("KM")) * mult
    except (OSError, ValueError):
        pass
    return None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+([\d.]+)", f.read())
            return m.group(1) if m else None
    except OSError:
        return None


def cpu_threads() -> int:
    """Threads devchar uses on the CPU: all cores it may run on, fixed for the whole run."""
    return usable_cores()


def identify_cpu() -> DeviceIdentity:
    import torch

    threads = cpu_threads()
    info = _cpuinfo()  # read once: the name and the signature
    model = _cpu_model(info)
    return DeviceIdentity(
        slug=check_slug(f"{cpu_stem(model, cpu_signature(info))}-{threads}c"), kind="cpu", model=model, torch_device="cpu",
        cores=os.cpu_count(), threads=threads, sm_count=None, memory_bytes=_memory_bytes(),
        l2_bytes=_cpu_l2_bytes(), torch_version=torch.__version__, cuda_version=None, driver_version=None,
    )


def identify_cuda(index: int = 0) -> DeviceIdentity:
    import torch

    if not torch.cuda.is_available():
        raise UnknownDeviceError("device 'cuda' requested but torch sees no CUDA device here")
    p = torch.cuda.get_device_properties(index)
    return DeviceIdentity(
        slug=f"cuda-{slugify(p.name)}", kind="cuda", model=p.name, torch_device=f"cuda:{index}",
        cores=None, threads=None, sm_count=p.multi_processor_count, memory_bytes=p.total_memory,
        l2_bytes=getattr(p, "L2_cache_size", None), torch_version=torch.__version__,
        cuda_version=torch.version.cuda, driver_version=_driver_version(),
    )


def identify(which: str = "auto") -> DeviceIdentity:
    """`auto` picks CUDA when torch sees one, else the CPU; `cpu` and `cuda` force a kind."""
    import torch

    if which == "cpu":
        return identify_cpu()
    if which == "cuda" or (which == "auto" and torch.cuda.is_available()):
        return identify_cuda()
    if which == "auto":
        return identify_cpu()
    raise UnknownDeviceError(f"unknown device kind {which!r}; expected 'auto', 'cpu' or 'cuda'")


def local_devices() -> dict[str, DeviceIdentity]:
    """Every device this machine can characterize, by slug."""
    import torch

    found = {d.slug: d for d in [identify_cpu()]}
    if torch.cuda.is_available():
        d = identify_cuda()
        found[d.slug] = d
    return found


def resolve(slug: str) -> DeviceIdentity:
    found = local_devices()
    if slug not in found:
        raise UnknownDeviceError(f"device {slug!r} is not reachable from this machine; local devices: {sorted(found)}")
    return found[slug]
