"""Event models learn planted transitions and login lead times from a request log."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models.events import (
    Transition,
    learn_logins,
    learn_transitions,
    merge_declared,
    preloads_after_login,
    preloads_after_request,
)

T0 = 1_767_225_600.0


def planted_log(*, p_follow: float, sessions: int = 300, seed: int = 5) -> pd.DataFrame:
    """Tenant acme: each session starts with the classifier at login + ~60 s; with
    probability ``p_follow`` the extractor follows 20-40 s later. Sessions are 2 h apart."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, str, str]] = []
    for k in range(sessions):
        login = T0 + k * 7200.0
        rows.append((login, "acme-chat", "acme"))
        first = login + rng.uniform(50, 70)
        rows.append((first, "doc-classifier", "acme"))
        if rng.random() < p_follow:
            rows.append((first + rng.uniform(20, 40), "legal-extract", "acme"))
        rows.append((login + rng.uniform(0, 3600), "other-tenant-bot", "globex"))
    frame = pd.DataFrame(rows, columns=["t", "adapter", "tenant"])
    frame["ts"] = pd.to_datetime(frame["t"], unit="s", utc=True)
    return frame.drop(columns="t").sample(frac=1.0, random_state=1)  # out of order on purpose


@pytest.mark.parametrize("p_follow", [0.3, 0.6, 0.9])
def test_learns_a_planted_transition_probability(p_follow: float) -> None:
    learned = learn_transitions(planted_log(p_follow=p_follow), window_s=120)
    pair = next(t for t in learned if (t.source, t.target) == ("doc-classifier", "legal-extract"))
    assert pair.probability == pytest.approx(p_follow, abs=0.08)
    assert 20 <= pair.delay_median_s <= 40
    assert pair.baseline_probability < 0.1
    assert pair.tenant == "acme"


def test_never_links_adapters_of_different_tenants() -> None:
    learned = learn_transitions(planted_log(p_follow=0.6), window_s=3600)
    assert all(
        {t.source, t.target} <= {"acme-chat", "doc-classifier", "legal-extract"}
        for t in learned
        if t.tenant == "acme"
    )
    assert not any(
        "other-tenant-bot" in (t.source, t.target) for t in learned if t.tenant == "acme"
    )


def test_login_lead_time_is_learned() -> None:
    logins = learn_logins(planted_log(p_follow=0.5), idle_s=1800, window_s=600)
    classifier = next(a for a in logins if (a.tenant, a.adapter) == ("acme", "doc-classifier"))
    assert classifier.probability == pytest.approx(1.0, abs=0.02)
    assert 50 <= classifier.lead_median_s <= 70
    preloads = preloads_after_login(logins, tenant="acme", at_s=1000.0)
    due = {p.adapter: p.due_s for p in preloads}
    assert due["acme-chat"] == 1000.0
    assert 1050.0 <= due["doc-classifier"] <= 1070.0


def test_preloads_follow_a_request_and_skip_weak_links() -> None:
    learned = learn_transitions(planted_log(p_follow=0.6), window_s=120)
    after = preloads_after_request(learned, tenant="acme", adapter="doc-classifier", at_s=0.0)
    assert [p.adapter for p in after] == ["legal-extract"]
    assert 15 <= after[0].due_s <= 30
    assert (
        preloads_after_request(learned, tenant="globex", adapter="doc-classifier", at_s=0.0) == ()
    )


def declared(probability: float) -> Transition:
    return Transition(
        tenant="acme",
        source="doc-classifier",
        target="legal-extract",
        probability=probability,
        support=0,
        delay_median_s=60.0,
        delay_p10_s=0.0,
        declared=True,
    )


def test_declared_pipeline_is_a_prior_the_log_refines() -> None:
    learned = learn_transitions(planted_log(p_follow=0.6), window_s=120)
    merged = merge_declared(learned, [declared(0.1)], prior_weight=10)
    pair = next(t for t in merged if (t.source, t.target) == ("doc-classifier", "legal-extract"))
    assert pair.declared
    assert 0.5 <= pair.probability <= 0.62  # 300 observations outweigh a prior worth 10


def test_declared_pipeline_stands_alone_without_evidence() -> None:
    merged = merge_declared((), [declared(0.4)])
    assert merged[0].probability == 0.4
