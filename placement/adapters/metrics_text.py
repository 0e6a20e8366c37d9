"""Parse a pod's Prometheus ``/metrics`` text into ``PodMetrics``.

Pure: text in, values out. vLLM's ``lora_requests_info`` keeps one series per label
set it ever exposed, each valued with the time it was last set, so the current one is
the series with the largest value (POD-API.md). vLLM's KV share is
``vllm:kv_cache_usage_perc``, ``vllm:gpu_cache_usage_perc`` before vllm-project/vllm#18354:
either is read, the current name first.

SGLang has no per-adapter series. ``sglang:lora_pool_slots_used`` counts the distinct
adapters in the running batch, not the adapters resident on the GPU: it is activity,
never residency (residency comes from the router's ledger, ``placement.residency``).

A sample valued ``NaN`` or infinite says nothing: it is left out, as if the pod had not
exposed it (a pod once answered ``vllm:num_requests_running NaN``, and ``round(NaN)``
raised). Counts below zero read as zero and the KV share is kept within 0..1.

Two readings of a page. ``parse_vllm_metrics`` and ``parse_sglang_metrics`` are strict,
as Prometheus' own parser is: text it refuses is a ``PermanentEngineError`` naming the
first line it refuses (the engine clients, the controller's, read so). The router reads
with ``read_vllm_metrics`` and ``read_sglang_metrics``: one line it cannot read costs it
that line, not the pod's whole page (and the pod's place in the rotation). Such a line
is left out and said in ``ReadMetrics.skipped``, the rest of the page read, unless it is
a line of a metric the reading needs (``VLLM_READS``, ``SGLANG_READS``: those it keeps,
by the name the line starts with), or nothing the reading needs is left: then the page
is refused as the strict reading refuses it. A page that reads whole costs one parse,
as before; one with bad lines three (the failed one, each line alone, the rest). A
line, or the metric name it starts with, is quoted cut to 120 characters with a marker
saying how long it was: a megabyte of garbage on one line must not become a megabyte
of log line (or of rate-limit key in ``router.scraping``).

A page past the router's cap is read from its head (``read_vllm_head``,
``read_sglang_head``): the text exposition keeps each metric family's lines together,
so every family in the head but the last is whole, and the last (it may go on past the
cut) is left out with the cut line. The head is read only if it holds each metric the
reading needs (``VLLM_NEEDS``, ``SGLANG_NEEDS``) whole; else the answer is None, and
the caller reads the pod as one without ``/metrics``. vLLM writes its request gauges
and KV use before ``vllm:lora_requests_info`` (the family that grows: a series per
adapter mix), but in multiprocess mode the order is not promised: nothing here counts
on it.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from placement.domain import AdapterId
from placement.errors import PermanentEngineError
from placement.ports import PodMetrics

_Samples = dict[str, list[tuple[dict[str, str], float]]]

#: The metrics ``read_vllm_metrics`` takes a pod's load from: a line of one it cannot
#: read fails the page.
VLLM_READS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:lora_requests_info",
)
#: The same for ``read_sglang_metrics``.
SGLANG_READS = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:lora_pool_slots_used",
    "sglang:lora_pool_slots_total",
)
#: Of each group, one metric must lie whole in a cut page's head for
#: ``read_vllm_head`` to read it (a pod's load and its LoRA series).
VLLM_NEEDS = (
    ("vllm:num_requests_running",),
    ("vllm:num_requests_waiting",),
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ("vllm:lora_requests_info",),
)
#: The same for ``read_sglang_head``: every metric it reads.
SGLANG_NEEDS = tuple((name,) for name in SGLANG_READS)
#: A line, or the metric name it starts with, is quoted up to this many characters.
_QUOTED_CHARS = 120
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, kw_only=True)
class SkippedLine:
    """A line of a ``/metrics`` page the lenient reading left out, and why."""

    #: 1 for the page's first line.
    number: int
    #: The line, cut to 120 characters (``_cut``'s marker saying how long it was).
    text: str
    #: ``sample`` for a sample line, ``metadata`` for a ``# HELP`` or ``# TYPE`` line.
    kind: Literal["sample", "metadata"]
    #: The metric the line names (its first word, cut as ``text``), "" when it names none.
    metric: str
    #: What the parser said of it, cut to 200 characters.
    reason: str

    def __str__(self) -> str:
        return f"line {self.number} ({self.text!r}): {self.reason}"


@dataclass(frozen=True, kw_only=True)
class ReadMetrics:
    """A lenient reading of a page: its figures, and the lines left out of them."""

    metrics: PodMetrics
    skipped: tuple[SkippedLine, ...] = ()


def _read(lines: Iterable[str]) -> _Samples:
    """The page's finite samples by name; ValueError where the parser refuses it."""
    by_name: _Samples = defaultdict(list)
    for family in text_string_to_metric_families("\n".join(lines)):
        for sample in family.samples:
            value = float(sample.value)
            if math.isfinite(value):  # NaN and infinities say nothing: left out
                by_name[sample.name].append((dict(sample.labels), value))
    return by_name


def _samples(text: str, *, pod: str | None) -> _Samples:
    try:
        return _read((text,))
    except ValueError as exc:
        raise _unreadable(text, exc, pod=pod) from None


def _unreadable(text: str, exc: ValueError, *, pod: str | None) -> PermanentEngineError:
    return PermanentEngineError(
        f"unreadable /metrics text{_first_bad_line(text)}: {str(exc)[:300]}", pod=pod
    )


def _refusal(line: str) -> str | None:
    """What the parser says of ``line`` alone, or None when it reads it."""
    try:
        for family in text_string_to_metric_families(line + "\n"):
            for sample in family.samples:
                float(sample.value)
    except ValueError as exc:
        said = " ".join(_CONTROL.sub(" ", str(exc)).split())  # one line, for a log
        return said[:200] or "the parser refuses it"
    return None


def _cut(text: str) -> str:
    """``text`` as quoted in a message: up to ``_QUOTED_CHARS`` characters, then a marker
    saying how long it was."""
    if len(text) <= _QUOTED_CHARS:
        return text
    return f"{text[:_QUOTED_CHARS]}... ({len(text)} characters in all)"


def _lines(count: int) -> str:
    return "1 line" if count == 1 else f"{count} lines"


def _metric_named(line: str) -> str:
    """The metric a line names: a ``# HELP``/``# TYPE`` line's third word, a sample's
    name (up to its labels or value)."""
    words = line.split(None, 3)
    if line.lstrip().startswith("#"):
        return words[2] if len(words) > 2 else ""
    return words[0].split("{", 1)[0] if words else ""


def _lenient_samples(
    text: str, *, pod: str | None, reads: tuple[str, ...]
) -> tuple[_Samples, tuple[SkippedLine, ...]]:
    """The page's samples with the lines the parser refuses left out (the parser reads
    lines as newlines split them), or a PermanentEngineError naming the first line it
    refuses that is one of ``reads``' (or none of ``reads`` left, or a page whose lines
    each read but not together)."""
    try:
        return _read((text,)), ()
    except ValueError as whole:
        first_error = whole
    lines = text.split("\n")
    skipped = []
    for index, line in enumerate(lines):
        reason = _refusal(line) if line.strip() else None
        if reason is None:
            continue
        named = _metric_named(line)
        metric = _cut(named)
        quoted = f"line {index + 1} ({_cut(line)!r})"
        if named.startswith(reads):
            raise PermanentEngineError(
                f"unreadable /metrics text at {quoted}, a line of {metric} the router "
                f"reads: {reason}",
                pod=pod,
            )
        kind: Literal["sample", "metadata"] = (
            "metadata" if line.lstrip().startswith("#") else "sample"
        )
        skipped.append(
            SkippedLine(number=index + 1, text=_cut(line), kind=kind, metric=metric, reason=reason)
        )
        lines[index] = ""
    if not skipped:  # every line reads alone: the fault is in how they go together
        raise _unreadable(text, first_error, pod=pod)
    try:
        samples = _read(lines)
    except ValueError as exc:
        raise _unreadable(text, exc, pod=pod) from None
    if not any(name in samples for name in reads):
        raise PermanentEngineError(
            f"unreadable /metrics text: {_lines(len(skipped))} refused (the first at "
            f"{skipped[0]}) and none of {', '.join(reads)} read: not a metrics page?",
            pod=pod,
        )
    return samples, tuple(skipped)


def _first_bad_line(text: str) -> str:
    """Where the text stops parsing: `` at line N (...)`` for the first sample line the
    parser refuses alone, else nothing (the fault is in how lines go together)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            for family in text_string_to_metric_families(line + "\n"):
                for sample in family.samples:
                    float(sample.value)
        except ValueError:
            return f" at line {number} ({_cut(line)!r})"
    return ""


def _whole_families(head: str) -> tuple[list[str], set[str]]:
    """A cut page's head without what the cut may have left incomplete: its last line
    (cut mid-way, or the nothing after the last newline) and every line of the last
    family in it (its lines are together; more of them may come after the cut). With the
    metrics the kept lines name (``# HELP``/``# TYPE`` lines count: a family may have no
    series yet)."""
    lines = head.split("\n")[:-1]
    last = next((_metric_named(line) for line in reversed(lines) if line.strip()), "")
    while lines and (not lines[-1].strip() or _metric_named(lines[-1]) == last):
        lines.pop()
    return lines, {_metric_named(line) for line in lines}


def _read_head(
    head: str,
    *,
    pod: str | None,
    reads: tuple[str, ...],
    needs: tuple[tuple[str, ...], ...],
) -> tuple[_Samples, tuple[SkippedLine, ...]] | None:
    lines, named = _whole_families(head)
    if not all(named.intersection(group) for group in needs):
        return None  # not parsed: the page's figures are not all in its head
    return _lenient_samples("\n".join(lines) + "\n", pod=pod, reads=reads)


def _total(samples: _Samples, name: str) -> float:
    return sum(value for _, value in samples.get(name, []))


def _count(samples: _Samples, name: str) -> int:
    """A sum of gauges that count things (requests, slots): a whole number, never negative."""
    total = _total(samples, name)
    return max(0, round(total)) if math.isfinite(total) else 0


def _share(value: float) -> float:
    return min(1.0, max(0.0, value))


def _mean(samples: _Samples, name: str) -> float:
    values = [value for _, value in samples.get(name, [])]
    return sum(values) / len(values) if values else 0.0


def _first_mean(samples: _Samples, *names: str) -> float:
    """The mean of the first of ``names`` the text exposes (0.0 when none is)."""
    for name in names:
        if name in samples:
            return _mean(samples, name)
    return 0.0


def _whole_number(text: str | None) -> int | None:
    """``text`` as a whole number if it is ASCII digits (``isdigit`` alone takes "²",
    which ``int`` refuses), else None."""
    if text and text.isascii() and text.isdigit():
        return int(text)
    return None


def _names(joined: str) -> frozenset[AdapterId]:
    return frozenset(AdapterId(name) for name in joined.split(",") if name)


def parse_vllm_metrics(text: str, *, pod: str | None = None) -> PodMetrics:
    """Running and waiting requests summed over engines, KV use averaged over them;
    strict: a line the parser refuses fails the page."""
    return _vllm(_samples(text, pod=pod))


def read_vllm_metrics(text: str, *, pod: str | None = None) -> ReadMetrics:
    """As ``parse_vllm_metrics``, the lines it cannot read left out where they are not
    of ``VLLM_READS``."""
    samples, skipped = _lenient_samples(text, pod=pod, reads=VLLM_READS)
    return ReadMetrics(metrics=_vllm(samples), skipped=skipped)


def read_vllm_head(head: str, *, pod: str | None = None) -> ReadMetrics | None:
    """The first bytes of a page past the cap (the rest unread), read as
    ``read_vllm_metrics`` reads a page from its whole families; None when the head does
    not hold one of each of ``VLLM_NEEDS`` whole."""
    read = _read_head(head, pod=pod, reads=VLLM_READS, needs=VLLM_NEEDS)
    return None if read is None else ReadMetrics(metrics=_vllm(read[0]), skipped=read[1])


def _vllm(samples: _Samples) -> PodMetrics:
    info = samples.get("vllm:lora_requests_info", [])
    latest = max(info, key=lambda series: series[1])[0] if info else {}
    return PodMetrics(
        running=_count(samples, "vllm:num_requests_running"),
        waiting=_count(samples, "vllm:num_requests_waiting"),
        kv_usage=_share(
            _first_mean(samples, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        ),
        running_adapters=_names(latest.get("running_lora_adapters", "")),
        waiting_adapters=_names(latest.get("waiting_lora_adapters", "")),
        max_loras=_whole_number(latest.get("max_lora")),
    )


def parse_sglang_metrics(text: str, *, pod: str | None = None) -> PodMetrics:
    """SGLang's gauges; the LoRA pool slots say how many adapters the running batch uses.
    Strict: a line the parser refuses fails the page."""
    return _sglang(_samples(text, pod=pod))


def read_sglang_metrics(text: str, *, pod: str | None = None) -> ReadMetrics:
    """As ``parse_sglang_metrics``, the lines it cannot read left out where they are not
    of ``SGLANG_READS``."""
    samples, skipped = _lenient_samples(text, pod=pod, reads=SGLANG_READS)
    return ReadMetrics(metrics=_sglang(samples), skipped=skipped)


def read_sglang_head(head: str, *, pod: str | None = None) -> ReadMetrics | None:
    """As ``read_vllm_head``, for SGLang: None unless each of ``SGLANG_NEEDS`` is whole."""
    read = _read_head(head, pod=pod, reads=SGLANG_READS, needs=SGLANG_NEEDS)
    return None if read is None else ReadMetrics(metrics=_sglang(read[0]), skipped=read[1])


def _sglang(samples: _Samples) -> PodMetrics:
    slots = "sglang:lora_pool_slots_total" in samples
    used = _count(samples, "sglang:lora_pool_slots_used")
    total = _count(samples, "sglang:lora_pool_slots_total")
    return PodMetrics(
        running=_count(samples, "sglang:num_running_reqs"),
        waiting=_count(samples, "sglang:num_queue_reqs"),
        kv_usage=_share(_mean(samples, "sglang:token_usage")),
        lora_slots_used=used if slots else None,
        lora_slots_total=total if slots else None,
    )
