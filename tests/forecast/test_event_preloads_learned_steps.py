"""A pipeline's step probabilities learned from the event log (``learned_steps``).

Each declared step's probability becomes the share of its trigger's events that caused
a request for the step's adapter, pipelines.yaml's value counting as ten events: the
war story's extractors, declared 0.6 and 0.4, were reached by 54% and 34% of the
uploads once the unannounced variants took their share.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.domain import AdapterId, Pipeline, Pipelines, PipelineStep, TenantId
from placement.forecast.event_predictors import learned_steps


def declared() -> Pipelines:
    return Pipelines(
        pipelines=(
            Pipeline(
                trigger="doc.uploaded",
                steps=(
                    PipelineStep(adapter=AdapterId("classify"), probability=1.0, within_s=2),
                    PipelineStep(
                        adapter=AdapterId("legal"), after=AdapterId("classify"), probability=0.6
                    ),
                    PipelineStep(
                        adapter=AdapterId("medical"), after=AdapterId("classify"), probability=0.4
                    ),
                ),
            ),
        ),
        logins={TenantId("docs"): (AdapterId("classify"),)},
    )


def probabilities(pipelines: Pipelines) -> dict[str, float]:
    return {str(s.adapter): s.probability for p in pipelines.pipelines for s in p.steps}


def test_each_step_moves_from_its_declared_value_to_the_share_of_events_it_followed() -> None:
    triggers = {f"e{k}": "doc.uploaded" for k in range(10)} | {"x1": "other.trigger"}
    caused = [(f"e{k}", "classify") for k in range(10)]
    caused += [(f"e{k}", "legal") for k in range(3)] + [("e0", "legal")]  # e0 asked twice
    caused += [(f"e{k}", "medical") for k in range(3, 10)]
    caused += [("x1", "legal"), ("unknown", "legal")]  # another trigger's, an unknown event's
    learned = learned_steps(declared(), triggers=triggers, caused=caused)
    assert probabilities(learned) == {
        "classify": pytest.approx(1.0),
        "legal": pytest.approx((0.6 * 10 + 3) / 20),
        "medical": pytest.approx((0.4 * 10 + 7) / 20),
    }
    assert learned.logins == declared().logins
    (pipeline,) = learned.pipelines
    assert [s.after for s in pipeline.steps] == [None, "classify", "classify"]


def test_a_trigger_no_event_names_keeps_its_declared_steps() -> None:
    assert learned_steps(declared(), triggers={"x1": "other"}, caused=[("x1", "legal")]) == (
        declared()
    )


@given(
    reached=st.lists(st.sampled_from(["classify", "legal", "medical", "other"]), max_size=60),
    events=st.integers(min_value=1, max_value=30),
)
def test_a_learned_probability_stays_between_zero_and_one(reached: list[str], events: int) -> None:
    triggers = {f"e{k}": "doc.uploaded" for k in range(events)}
    caused = [(f"e{k % events}", adapter) for k, adapter in enumerate(reached)]
    for value in probabilities(
        learned_steps(declared(), triggers=triggers, caused=caused)
    ).values():
        assert 0.0 <= value <= 1.0
