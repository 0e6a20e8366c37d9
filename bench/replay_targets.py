"""The replay's target ratios, printed the same way by every replay benchmark."""

from __future__ import annotations

from collections.abc import Mapping


def print_target_ratios(results: Mapping[str, Mapping[str, float]]) -> None:
    """Loads against round-robin and EPP, and the hit and TTFT gaps to the oracle."""
    if not {"lorafleet", "round-robin", "epp", "oracle"} <= results.keys():
        return
    ours, oracle = results["lorafleet"], results["oracle"]
    gap = 100 * (oracle["gpu_hit_rate"] - ours["gpu_hit_rate"])
    print(
        f"loads round-robin/lorafleet {results['round-robin']['loads'] / ours['loads']:.1f}x,"
        f" epp/lorafleet {results['epp']['loads'] / ours['loads']:.2f}x;"
        f" oracle-lorafleet hit gap {gap:.2f} pt;"
        f" TTFT p95 lorafleet/oracle {ours['ttft_p95_ms'] / oracle['ttft_p95_ms']:.3f}"
    )
