"""fleet.yaml: what an engine would break on is refused, naming the file, pool and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from placement.errors import InputError
from placement.inputs.fleet import load_fleet

POOL = """\
pools:
  - name: chat
    base_model: llama-3.1-8b
    engine: {engine}
{served}    pods:
      - {{name: pod-0, url: "http://127.0.0.1:18000"}}
"""


def _fleet(tmp_path: Path, *, engine: str, served: str | None, base: str = "") -> Path:
    line = f"    served_model_name: {served!r}\n" if served is not None else ""
    text = POOL.format(engine=engine, served=line)
    if base:
        text = text.replace("llama-3.1-8b", base)
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_a_served_name_with_a_colon_is_refused_for_sglang(tmp_path: Path) -> None:
    path = _fleet(tmp_path, engine="sglang", served="meta/llama:8b")
    with pytest.raises(InputError) as refused:
        load_fleet(path)
    assert str(refused.value).startswith(f"{path}: pool chat: served_model_name: SGLang")
    assert "'meta/llama:8b'" in str(refused.value)
    assert "--served-model-name" in str(refused.value)


def test_a_colon_in_an_sglang_base_model_used_as_the_served_name_names_base_model(
    tmp_path: Path,
) -> None:
    path = _fleet(tmp_path, engine="sglang", served=None)
    path.write_text(path.read_text().replace("base_model: llama-3.1-8b", "base_model: 'x:y'"))
    with pytest.raises(InputError, match=r"pool chat: base_model: SGLang splits"):
        load_fleet(path)


@pytest.mark.parametrize(
    ("engine", "served"),
    [("vllm", "meta/llama:8b"), ("sglang", "llama-3.1-8b-instruct")],
    ids=["vllm-takes-a-colon", "sglang-without-colon"],
)
def test_other_served_names_are_accepted(tmp_path: Path, engine: str, served: str) -> None:
    fleet = load_fleet(_fleet(tmp_path, engine=engine, served=served))
    assert fleet.pools[0].served_model_name == served
