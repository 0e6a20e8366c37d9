"""The router as an OpenAI-compatible proxy, driven by the real ``openai`` client."""

from __future__ import annotations

import openai
import pytest

from placement.domain import Engine

from .conftest import catalog_of, emulated, plan_of, router_for

ADAPTERS = ["alpha", "beta", "gamma"]


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG], ids=["vllm", "sglang"])
def test_completions_chat_and_streams_pass_through(engine: Engine) -> None:
    with emulated(2, engine=engine) as pods:
        plan = plan_of({"alpha": ["pod-0"], "beta": ["pod-1"]})
        with router_for(pods.domain, plan=plan, catalog=catalog_of(ADAPTERS)) as router:
            client = router.client()
            whole = client.completions.create(model="alpha", prompt="hello there", max_tokens=4)
            assert whole.choices[0].text
            chat = client.chat.completions.create(
                model="beta", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert chat.choices[0].message.content
            chunks = list(
                client.chat.completions.create(
                    model="alpha",
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=5,
                    stream=True,
                )
            )
            assert len(chunks) >= 5
            text_chunks = list(
                client.completions.create(model="beta", prompt="x", max_tokens=3, stream=True)
            )
            assert len(text_chunks) >= 3
        # The plan's pods served their adapters: each pod saw its own adapter only.
        assert set(pods.stats("pod-0")["gpu"]) == {"alpha"}
        assert set(pods.stats("pod-1")["gpu"]) == {"beta"}


def test_models_health_and_metrics_describe_the_plan() -> None:
    with emulated(2) as pods:
        plan = plan_of({"alpha": ["pod-0", "pod-1"], "beta": ["pod-1"]}, plan_id="p-42")
        with router_for(pods.domain, plan=plan, catalog=catalog_of(ADAPTERS)) as router:
            ids = {model.id for model in router.client().models.list().data}
            assert ids == {"alpha", "beta", "base-model"}
            health = router.get("/healthz")
            assert health["plan"] == "p-42"
            assert health["routing"] == "plan"
            assert health["healthy_pods"] == ["pod-0", "pod-1"]
            # The pods start empty: the first request pays the load, the next ones hit.
            for _ in range(3):
                router.client().completions.create(model="alpha", prompt="a", max_tokens=1)
            text = router.get("/metrics")
            assert 'lorafleet_requests_total{adapter="alpha",outcome="cold_load"} 1.0' in text
            assert 'lorafleet_requests_total{adapter="alpha",outcome="gpu_hit"} 2.0' in text
            assert 'lorafleet_adapter_loads_total{pod="pod-0",reason="cold"} 1.0' in text
            assert "lorafleet_ttft_seconds_bucket" in text
            assert 'lorafleet_pod_queue_depth{pod="pod-0"}' in text


def test_unknown_model_is_a_404_in_openai_shape() -> None:
    # One pool: any name goes to it by hashing, and the pod says it does not exist.
    with (
        emulated(1) as pods,
        router_for(pods.domain, plan=None) as router,
        pytest.raises(openai.NotFoundError),
    ):
        router.client().completions.create(model="nobody", prompt="a", max_tokens=1)


def test_base_model_requests_reach_a_pod() -> None:
    with emulated(2) as pods, router_for(pods.domain, plan=None) as router:
        answer = router.client().completions.create(model="base-model", prompt="a", max_tokens=2)
        assert answer.choices[0].text
        assert router.get("/healthz")["routing"] == "hashing"


def test_bad_json_is_a_400() -> None:
    import urllib.error
    import urllib.request

    with emulated(1) as pods, router_for(pods.domain) as router:
        request = urllib.request.Request(
            f"{router.url}/v1/completions", data=b"{not json", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as failure:
            urllib.request.urlopen(request, timeout=5)
        failure.value.close()
        assert failure.value.code == 400
