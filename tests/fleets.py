"""The small fleet.yaml the CLI and file-reading tests write: one vLLM pool of
llama-3.1-8b pods with two GPU slots and four host places each, two pods by default.

Each test names only what it varies (the pool's name, its rank, its capacity, its
storage, its pods); the rest is this one text. In-memory fleets are
``tests.factories``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

#: pod-0 and pod-1 on ports nothing listens on (the replay and the planner never call them).
TWO_PODS = (("pod-0", "http://127.0.0.1:18000"), ("pod-1", "http://127.0.0.1:18001"))


def fleet_yaml(
    *,
    pool: str = "small",
    max_lora_rank: int = 64,
    capacity_rps: float = 5,
    host_adapter_bytes: str = "4GiB",
    served_model_name: str | None = None,
    storage: str | None = None,
    pods: Sequence[tuple[str, str]] = TWO_PODS,
) -> str:
    """The fleet.yaml text; ``storage`` is the pool's ``storage:`` mapping, inline
    (for instance ``{kind: object, bandwidth_per_s: 200MB}``)."""
    lines = [
        "pools:",
        f"  - name: {pool}",
        "    base_model: llama-3.1-8b",
        *([f"    served_model_name: {served_model_name}"] if served_model_name else []),
        "    engine: vllm",
        f"    max_lora_rank: {max_lora_rank}",
        *([f"    storage: {storage}"] if storage else []),
        "    pod_defaults: {max_loras: 2, max_cpu_loras: 4, hbm_adapter_bytes: 1GiB,",
        f"                   host_adapter_bytes: {host_adapter_bytes},"
        f" capacity_rps: {capacity_rps}}}",
        "    pods:",
        *(f'      - {{name: {name}, url: "{url}"}}' for name, url in pods),
    ]
    return "\n".join(lines) + "\n"
