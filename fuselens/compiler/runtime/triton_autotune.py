"""Autotuning of Triton launch configurations (option `autotune`).

The first launch of each size class (power-of-two buckets of the block axes,
launch_config.py) times `candidate_configs` and keeps the fastest; the choices are
cached on disk under `<cache_dir>/triton_autotune/<sha256 of the kernel source>.json`,
so the next process skips the tuning. Candidates are measured with `cuda_event_timer`.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable

from fuselens.compiler.runtime.atomic_file import write_atomically
from fuselens.compiler.runtime.launch_config import LaunchConfig, candidate_configs, heuristic_config
from fuselens.private_dirs import check_private_file


def autotune_path(cache_dir: str, source: str) -> str:
    key = hashlib.sha256(source.encode()).hexdigest()[:40]
    return os.path.join(cache_dir, "triton_autotune", f"{key}.json")


def load_tuned(cache_dir: str, source: str) -> dict[str, LaunchConfig]:
    """The configurations tuned for this kernel source by size class (empty if none)."""
    path = autotune_path(cache_dir, source)
    configs: dict[str, LaunchConfig] = {}
    try:
        check_private_file(path)  # UnsafePathError is an OSError: a planted file is ignored
        with open(path) as f:
            data = json.load(f)
        for k, v in data.items():
            configs[k] = LaunchConfig(int(v["xblock"]), int(v["rblock"]), int(v["num_warps"]))
    except (OSError, ValueError, KeyError):
        pass
    return configs


def save_tuned(cache_dir: str, source: str, configs: dict[str, LaunchConfig]) -> None:
    write_atomically(autotune_path(cache_dir, source),
                     json.dumps({k: v.to_json() for k, v in configs.items()}, indent=1, sort_keys=True))


def cuda_event_timer(run: Callable[[], None], reps: int = 10) -> float:
    """Mean device time of `run` in ms (3 warm-up launches)."""
    import torch

    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def fastest_config(ks: Any, xn: int, rn: int, timer: Callable[[Callable[[], None]], float],
                   launch: Callable[[LaunchConfig], None]) -> LaunchConfig:
    """The candidate configuration `timer` finds fastest for these sizes."""
    best, best_t = None, float("inf")
    for cfg in candidate_configs(ks, xn, rn):
        try:
            t = timer(lambda c=cfg: launch(c))
        except Exception:  # noqa: BLE001 - a config that does not compile (too many registers) is skipped
            continue
        if t < best_t:
            best, best_t = cfg, t
    return best or heuristic_config(ks, xn, rn)
