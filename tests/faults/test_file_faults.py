"""Files under attack: a plan file holding NaN or nested 100,000 deep, writers that die
half-way, a rollback racing a publish. A plan reader keeps its last good plan and takes
the fixed one; every write is whole or absent; publish and rollback are one step each."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from placement.adapters.statedir import DirPlanStore
from placement.errors import PlanError
from placement.inputs import read_plan, write_plan
from placement.inputs.files import write_atomically, write_through
from placement.plan import plan_from_json, plan_to_json
from placement.router.sources import FilePlanSource
from tests.factories import make_plan

GOOD = plan_to_json(make_plan(plan_id="good"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(GOOD.replace('"expected_rps": 1.0', '"expected_rps": NaN'), "NaN", id="nan"),
        pytest.param(GOOD.replace('"wall_s": 0.3', '"wall_s": Infinity'), "Infinity", id="inf"),
        pytest.param(
            GOOD.replace('"expected_rps": 1.0', '"expected_rps": 1e999'), "finite", id="1e999"
        ),
        pytest.param("[" * 100_000 + "]" * 100_000, "nested too deeply", id="100k-deep"),
        pytest.param(
            GOOD.replace('"id": "good"', '"id": "\\ud800"'), "not valid Unicode", id="surrogate"
        ),
        pytest.param(
            GOOD.replace('"hbm_bytes_used": 104857600', '"hbm_bytes_used": -Infinity'),
            "-Infinity",
            id="minus-inf",
        ),
    ],
)
def test_a_bad_plan_is_a_plan_error_and_nothing_else(text: str, expected: str) -> None:
    assert text != GOOD
    with pytest.raises(PlanError, match=expected):
        plan_from_json(text, source="plan.json")


def test_a_binary_plan_file_is_a_plan_error(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PlanError, match="not UTF-8"):
        read_plan(path)


@pytest.mark.anyio
async def test_a_plan_watcher_keeps_the_last_good_plan_and_takes_the_fixed_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, make_plan(plan_id="first"))
    source = FilePlanSource(path)
    first = await source.poll()
    assert first is not None and first.id == "first"
    write_atomically(path, GOOD.replace('"expected_rps": 1.0', '"expected_rps": NaN'))
    with pytest.raises(PlanError, match="NaN"):
        await source.poll()
    with pytest.raises(PlanError, match="NaN"):  # still broken: the same reason, again
        await source.poll()
    write_plan(path, make_plan(plan_id="fixed"))
    fixed = await source.poll()
    assert fixed is not None and fixed.id == "fixed"


# --- atomic writes ------------------------------------------------------------------------


def test_a_writer_that_dies_half_way_leaves_the_old_file_and_no_debris(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, make_plan(plan_id="old"))

    def dies(temporary: Path) -> None:
        temporary.write_text('{"schema_version": 1, "id": "new", "po')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_through(path, dies)
    assert read_plan(path).id == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_concurrent_writers_never_share_a_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    stop = threading.Event()
    seen: list[str] = []

    def write(plan_id: str) -> None:
        for i in range(60):
            write_plan(path, make_plan(plan_id=f"{plan_id}-{i}"))

    def read() -> None:
        while not stop.is_set():
            if path.exists():
                seen.append(read_plan(path).id)  # a half-written file would raise here

    writers = [threading.Thread(target=write, args=(name,)) for name in ("a", "b", "c")]
    reader = threading.Thread(target=read)
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    reader.join()
    assert read_plan(path).id.endswith("-59")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    assert seen  # the reader did read while the writers wrote


# --- publish and rollback -------------------------------------------------------------------


def test_publish_and_rollback_racing_keep_a_consistent_pair(tmp_path: Path) -> None:
    store = DirPlanStore(tmp_path)
    store.publish(make_plan(plan_id="p-0"))
    store.publish(make_plan(plan_id="p-1"))
    errors: list[BaseException] = []

    def publish() -> None:
        for i in range(2, 40):
            store.publish(make_plan(plan_id=f"p-{i}"))

    def roll_back() -> None:
        other = DirPlanStore(tmp_path)  # another process's view: its own lock handle
        for _ in range(40):
            try:
                other.rollback()
            except BaseException as exc:
                errors.append(exc)

    pairs: list[tuple[str, str]] = []
    done = threading.Event()

    def watch() -> None:  # a reader: resolve ``current`` once, read the pair it names
        while not done.is_set():
            generation = tmp_path / os.readlink(tmp_path / "current")
            try:
                pair = tuple(
                    json.loads((generation / name).read_text())["id"]
                    for name in ("plan.json", "previous.json")
                )
            except FileNotFoundError:  # pruned while we read: four generations later
                continue
            pairs.append((pair[0], pair[1]))

    threads = [threading.Thread(target=publish), threading.Thread(target=roll_back)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    assert errors == []
    assert pairs and all(current != previous for current, previous in pairs)
    current, previous = store.current(), store.previous()
    assert current is not None and previous is not None
    # Every id was published once: a pair of equal plans means a step was half done.
    assert current.id != previous.id
    generation = os.readlink(tmp_path / "current")
    pair = {
        name: json.loads((tmp_path / generation / name).read_text())["id"]
        for name in ("plan.json", "previous.json")
    }
    assert pair == {"plan.json": current.id, "previous.json": previous.id}


def test_a_state_directory_from_before_generations_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(plan_to_json(make_plan(plan_id="old-current")))
    (tmp_path / "previous.json").write_text(plan_to_json(make_plan(plan_id="old-previous")))
    store = DirPlanStore(tmp_path)
    store.publish(make_plan(plan_id="new"))
    assert (tmp_path / "plan.json").is_symlink() and (tmp_path / "previous.json").is_symlink()
    current, previous = store.current(), store.previous()
    assert (current and current.id, previous and previous.id) == ("new", "old-current")
    assert store.rollback().id == "old-current"
    previous = store.previous()
    assert previous is not None and previous.id == "new"
