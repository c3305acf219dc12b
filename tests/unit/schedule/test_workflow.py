"""Scheduled workflows (``beat.schedule.workflow``, ``define(workflow=...)``): a Celery
canvas is stored as Celery serialises it, its steps named by their position, its end
steps those whose success ends the run; what cannot be tracked is refused at
definition; each send stamps the same derived task and group IDs.

The property test checks ``plan`` against an oracle of its own, written here: it walks
the Celery objects and works out which step waits on which, as Celery runs them."""

from __future__ import annotations

import copy
import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery, chain, chord, group, signature
from celery.canvas import Signature, _chain, _chord, chunks, xmap, xstarmap
from celery.result import GroupResult, ResultSet
from hypothesis import given, settings
from hypothesis import strategies as st

from beat.errors import InvalidSchedule
from beat.models import ScheduleDefinition
from beat.publish.workflows import derived_ids, sendable
from beat.schedule.define import define, steps_problem
from beat.schedule.workflow import (
    MAX_DEPTH,
    MAX_STEPS,
    STEP_HEADER,
    WORKFLOW_HEADER,
    WORKFLOW_TASK,
    group_id,
    label,
    plan,
    stamped,
    step_task_id,
    stored_canvas,
    workflow_kwargs,
)

# In-process broker and result backend: Celery refuses to freeze or send a chord
# without a backend, and nothing here reaches a server.
app = Celery("t", broker="memory://", backend="cache+memory://", set_as_current=False)


@app.task(name="t.add", shared=False)
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="t.total", shared=False)
def total(numbers: list[int]) -> int:
    return sum(numbers)


@app.task(name="t.ping", shared=False)
def ping() -> str:
    return "pong"


NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
RUN = uuid.UUID("5b0c3f0e-8d1e-4a5e-9a51-0f6f7e2b1c3d")


def sig(name: str, *args: Any, immutable: bool = False, **kwargs: Any) -> Signature:
    """A signature of task ``t.<name>`` on the test app."""
    return app.signature(f"t.{name}", args=list(args), kwargs=kwargs, immutable=immutable)


def scheduled(workflow: Any, task: str = "", **fields: Any) -> ScheduleDefinition:
    """A schedule every minute firing ``workflow``."""
    return define("nightly", task, every=60, now=NOW, workflow=workflow, **fields)


def defined_again(kwargs: dict[str, Any]) -> ScheduleDefinition:
    """A stored workflow schedule defined again from its kwargs (a restore, an edit)."""
    return define("nightly", WORKFLOW_TASK, every=60, now=NOW, kwargs=kwargs)


def paths(canvas: Any) -> list[str]:
    return [step.path for step in plan(stored_canvas(canvas)).steps]


def refusal(workflow: Any) -> str:
    with pytest.raises(InvalidSchedule) as caught:
        stored_canvas(workflow)
    return str(caught.value)


# --- What a canvas's steps, end steps and first steps are ------------------------------


def test_a_chain_ends_at_its_last_element_and_starts_at_its_first() -> None:
    result = plan(stored_canvas(chain(sig("a"), sig("b"), sig("c"))))
    assert [step.path for step in result.steps] == ["0", "1", "2"]
    assert [step.task for step in result.steps] == ["t.a", "t.b", "t.c"]
    assert result.ends == ("2",)
    assert result.roots == ("0",)


def test_a_group_ends_and_starts_with_every_member() -> None:
    result = plan(stored_canvas(group(*(sig(str(i)) for i in range(5)))))
    members = ("0", "1", "2", "3", "4")
    assert [step.path for step in result.steps] == list(members)
    assert result.ends == members
    assert result.roots == members


def test_a_chord_ends_at_its_body_and_starts_with_its_header() -> None:
    result = plan(stored_canvas(chord([sig("part", i) for i in range(5)], sig("total"))))
    header = ("h.0", "h.1", "h.2", "h.3", "h.4")
    assert [step.path for step in result.steps] == [*header, "b"]
    assert result.ends == ("b",)
    assert result.roots == header


def test_a_lone_task_is_step_0() -> None:
    result = plan(stored_canvas(sig("a", 1)))
    assert [(step.path, step.task, step.args) for step in result.steps] == [("0", "t.a", (1,))]
    assert result.ends == result.roots == ("0",)


def test_a_group_then_a_task_inside_a_chain_is_stored_as_the_chord_celery_makes_of_it() -> None:
    stored = stored_canvas(chain(sig("a"), group(sig("b"), sig("c")), sig("d")))
    assert label(stored) == "chain(t.a | chord([t.b, t.c], t.d))"
    result = plan(stored)
    assert [step.path for step in result.steps] == ["0", "1.h.0", "1.h.1", "1.b"]
    assert result.ends == ("1.b",)
    assert result.roots == ("0",)


def test_a_chain_ending_in_a_group_ends_with_every_member_of_the_group() -> None:
    stored = stored_canvas(chain(sig("a"), group(sig("b"), sig("c"))))
    assert label(stored) == "chain(t.a | group(t.b, t.c))"
    result = plan(stored)
    assert result.ends == ("1.0", "1.1")
    assert result.roots == ("0",)


def test_nested_canvases_name_each_step_by_its_position() -> None:
    canvas = group(
        chain(sig("a"), sig("b")),
        chord([sig("c"), chain(sig("d"), sig("e"))], group(sig("f"), sig("g"))),
    )
    stored = stored_canvas(canvas)
    assert label(stored) == (
        "group(chain(t.a | t.b), chord([t.c, chain(t.d | t.e)], group(t.f, t.g)))"
    )
    result = plan(stored)
    assert [(step.path, step.task) for step in result.steps] == [
        ("0.0", "t.a"),
        ("0.1", "t.b"),
        ("1.h.0", "t.c"),
        ("1.h.1.0", "t.d"),
        ("1.h.1.1", "t.e"),
        ("1.b.0", "t.f"),
        ("1.b.1", "t.g"),
    ]
    assert result.ends == ("0.1", "1.b.0", "1.b.1")
    assert result.roots == ("0.0", "1.h.0", "1.h.1.0")


def test_a_chord_in_a_chords_body_ends_at_the_inner_body() -> None:
    result = plan(stored_canvas(chord([sig("a")], chord([sig("b"), sig("c")], sig("d")))))
    assert [step.path for step in result.steps] == ["h.0", "b.h.0", "b.h.1", "b.b"]
    assert result.ends == ("b.b",)
    assert result.roots == ("h.0",)


def test_a_canvas_is_stored_alike_from_its_signature_its_dict_and_its_json() -> None:
    canvas = chain(sig("a", 1), group(sig("b", x=2), sig("c")))
    stored = stored_canvas(canvas)
    assert stored_canvas(json.loads(json.dumps(canvas))) == stored
    assert stored_canvas(json.dumps(canvas)) == stored
    assert json.loads(json.dumps(stored)) == stored  # plain JSON
    assert workflow_kwargs(stored) == {"canvas": stored, "ends": ["1.0", "1.1"]}


# --- Which steps take the result of what ran before them --------------------------------


def test_chain_elements_after_the_first_take_the_previous_result_unless_immutable() -> None:
    result = plan(stored_canvas(chain(sig("a"), sig("b"), sig("c", immutable=True), sig("d"))))
    assert [step.takes_result for step in result.steps] == [False, True, False, True]


def test_a_chord_body_takes_the_headers_results_and_its_header_does_not() -> None:
    result = plan(stored_canvas(chord([sig("a"), sig("b")], sig("c"))))
    assert {step.path: step.takes_result for step in result.steps} == {
        "h.0": False,
        "h.1": False,
        "b": True,
    }
    immutable_body = plan(stored_canvas(chord([sig("a")], sig("c", immutable=True))))
    assert [step.takes_result for step in immutable_body.steps] == [False, False]


def test_group_members_take_a_result_only_after_something_in_a_chain() -> None:
    first = plan(stored_canvas(chain(group(sig("a"), sig("b")), sig("c"))))
    assert {step.path: step.takes_result for step in first.steps} == {
        "h.0": False,
        "h.1": False,
        "b": True,
    }
    later = plan(stored_canvas(chain(sig("a"), group(sig("b"), sig("c", immutable=True)))))
    assert {step.path: step.takes_result for step in later.steps} == {
        "0": False,
        "1.0": True,
        "1.1": False,
    }
    alone = plan(stored_canvas(group(sig("a"), sig("b"))))
    assert not any(step.takes_result for step in alone.steps)


# --- What cannot be scheduled is refused, naming what to fix ----------------------------


def _with_link() -> Signature:
    first = sig("a")
    first.link(sig("b"))
    return chain(first, sig("c"))


def _nested_groups(levels: int) -> dict[str, Any]:
    """``levels`` groups, each the only member of the one around it, round one task (as
    JSON: Celery's ``group`` would unroll a group of one group)."""
    node: dict[str, Any] = json.loads(json.dumps(sig("x")))
    for _ in range(levels):
        node = {
            "task": "celery.group",
            "args": [],
            "kwargs": {"tasks": [node]},
            "options": {},
            "subtask_type": "group",
            "immutable": False,
        }
    return node


def _leaf_json(**fields: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(sig("a"))), **fields}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda: chain(), "an empty group or chain", id="empty chain"),
        pytest.param(lambda: group(), "an empty group or chain", id="empty group"),
        pytest.param(
            lambda: chord([], sig("b")), "header must be a non-empty list", id="empty header"
        ),
        pytest.param(
            lambda: chunks(sig("a"), [(1,), (2,)], 1), "celery.chunks builds its tasks", id="chunks"
        ),
        pytest.param(lambda: xmap(sig("a"), [1, 2]), "celery.map builds its tasks", id="map"),
        pytest.param(
            lambda: xstarmap(sig("a"), [(1,), (2,)]),
            "celery.starmap builds its tasks",
            id="starmap",
        ),
        pytest.param(
            lambda: chain(sig("b"), chunks(sig("a"), [(1,)], 1)),
            "step 1: celery.chunks",
            id="chunks in a chain",
        ),
        pytest.param(_with_link, "step 0 (t.a): a step's link callback", id="link"),
        pytest.param(
            lambda: group(*(sig("x") for _ in range(MAX_STEPS + 1))),
            f"at most {MAX_STEPS} steps, this one {MAX_STEPS + 1}",
            id="too many steps",
        ),
        pytest.param(
            lambda: _nested_groups(MAX_DEPTH + 1),
            f"nests at most {MAX_DEPTH} levels deep",
            id="too deep",
        ),
        pytest.param(lambda: sig("a", {1, 2}), "plain JSON", id="set argument"),
        pytest.param(lambda: sig("a", x=object()), "plain JSON", id="object argument"),
        pytest.param(lambda: sig("a", float("nan")), "plain JSON", id="nan argument"),
        pytest.param(lambda: '{"task": "t.a", ', "as JSON", id="json that does not parse"),
        pytest.param(lambda: "[1, 2]", "got list", id="json of no signature"),
        pytest.param(lambda: [sig("a")], "got list", id="a list"),
        pytest.param(lambda: 5, "got int", id="a number"),
        pytest.param(lambda: {"args": []}, "not a Celery signature", id="no task"),
        pytest.param(
            lambda: _leaf_json(subtask_type="xmap"), "builds its tasks", id="unknown subtask type"
        ),
        pytest.param(lambda: _leaf_json(args={"x": 1}), "args must be a JSON array", id="args"),
        pytest.param(
            lambda: _leaf_json(options={"headers": [1]}),
            "options.headers must be a JSON object",
            id="headers",
        ),
        pytest.param(
            lambda: {
                **json.loads(json.dumps(chord([sig("a")], sig("b")))),
                "kwargs": {"header": [json.loads(json.dumps(sig("a")))]},
            },
            "a chord needs a body",
            id="chord without body",
        ),
    ],
)
def test_what_cannot_be_scheduled_is_refused_in_one_line(
    make: Callable[[], Any], message: str
) -> None:
    text = refusal(make())
    assert message in text
    assert "\n" not in text


def test_the_most_steps_and_the_deepest_nesting_allowed_are_taken() -> None:
    assert len(plan(stored_canvas(group(*(sig("x") for _ in range(MAX_STEPS))))).steps) == (
        MAX_STEPS
    )
    assert paths(_nested_groups(MAX_DEPTH)) == [".".join(["0"] * MAX_DEPTH)]


# --- define(workflow=...) --------------------------------------------------------------


CANVAS = chain(sig("a", 1), group(sig("b"), sig("c")), sig("d"))


def test_a_workflow_schedule_carries_the_workflow_task_its_canvas_and_its_ends() -> None:
    definition = scheduled(CANVAS)
    assert definition.task == WORKFLOW_TASK
    assert definition.args == ()
    assert definition.options == {}
    assert set(definition.kwargs) == {"canvas", "ends"}
    assert definition.kwargs["canvas"] == stored_canvas(CANVAS)
    assert definition.kwargs["ends"] == ["1.b"]
    assert scheduled(CANVAS, WORKFLOW_TASK) == definition


def test_a_stored_workflow_schedule_defined_again_is_the_same() -> None:
    definition = scheduled(json.dumps(CANVAS))
    again = defined_again(definition.kwargs)
    assert again == definition


def test_stored_ends_that_were_tampered_with_are_computed_again() -> None:
    definition = scheduled(CANVAS)
    tampered = {**definition.kwargs, "ends": ["0"]}
    assert defined_again(tampered).kwargs["ends"] == ["1.b"]
    missing = {"canvas": definition.kwargs["canvas"]}
    assert defined_again(missing) == definition


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"task": "tasks.report"}, "give a task or a workflow, not both (task 'tasks.report')"),
        ({"args": [1]}, "leave args out"),
        ({"kwargs": {"x": 1}}, "leave kwargs out"),
        ({"options": {"priority": 3}}, "leave the schedule's options and queue out"),
        ({"queue": "reports"}, "leave the schedule's options and queue out"),
    ],
)
def test_a_workflow_with_a_task_or_a_payload_of_its_own_is_refused(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        scheduled(CANVAS, **fields)
    assert message in str(caught.value)


def test_the_workflow_task_without_a_canvas_is_refused() -> None:
    with pytest.raises(InvalidSchedule, match="needs its canvas: give workflow="):
        define("nightly", WORKFLOW_TASK, every=60, now=NOW)
    with pytest.raises(InvalidSchedule, match="an empty group or chain"):
        scheduled(group())


# --- steps_problem: can the app run every step? -----------------------------------------


def test_a_step_naming_an_unknown_task_is_named_by_its_path() -> None:
    definition = scheduled(chord([sig("add", 1, 2)], sig("nope", immutable=True)))
    assert steps_problem(app.tasks, definition) == (
        "step b names 't.nope', which is not a registered task"
    )


def test_a_step_that_cannot_take_its_arguments_and_the_previous_result_is_named() -> None:
    # t.add(x, y) after t.add(1, 2) gets its result and 5: fits; after it with 5 and 6: no.
    fits = scheduled(chain(sig("add", 1, 2), sig("add", 5)))
    assert steps_problem(app.tasks, fits) is None
    extra = scheduled(chain(sig("add", 1, 2), sig("add", 5, 6)))
    problem = steps_problem(app.tasks, extra)
    assert problem is not None
    assert problem.startswith("step 1: task t.add(x, y) cannot take these arguments")
    assert problem.endswith("(with the result of the step before it)")
    # Immutable, it is called with its own arguments only: one is then missing.
    alone = scheduled(chain(sig("add", 1, 2), sig("add", 5, immutable=True)))
    problem = steps_problem(app.tasks, alone)
    assert problem is not None
    assert problem.startswith("step 1: task t.add(x, y) cannot take these arguments")
    assert "with the result" not in problem


def test_a_chord_body_is_checked_with_the_headers_results() -> None:
    fits = scheduled(chord([sig("add", 1, 2)] * 3, sig("total")))
    assert steps_problem(app.tasks, fits) is None
    first = scheduled(chain(sig("total"), sig("ping")))
    problem = steps_problem(app.tasks, first)
    assert problem is not None
    assert problem.startswith("step 0: task t.total(numbers) cannot take these arguments")


def test_no_problem_when_every_step_fits() -> None:
    canvas = chain(
        sig("ping"),
        group(sig("add", 1, 2, immutable=True), sig("add", y=3)),
        sig("total"),
        sig("ping", immutable=True),
    )
    assert steps_problem(app.tasks, scheduled(canvas)) is None


# --- stamped: the IDs and headers of one run's send -------------------------------------


def _leaves_of(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The task signatures of a stored canvas (containers walked by their JSON keys)."""
    kind = node.get("subtask_type")
    if kind in ("chain", "group"):
        return [leaf for member in node["kwargs"]["tasks"] for leaf in _leaves_of(member)]
    if kind == "chord":
        header = node["kwargs"]["header"]
        members = header["kwargs"]["tasks"] if isinstance(header, dict) else header
        return [leaf for m in members for leaf in _leaves_of(m)] + _leaves_of(
            node["kwargs"]["body"]
        )
    return [node]


STAMPED_CANVAS = chain(
    sig("a").set(headers={"mine": "kept"}),
    group(sig("b"), sig("c")),
    sig("d"),
    group(sig("e"), sig("f")),
)


def test_stamping_gives_every_step_its_derived_id_and_the_headers() -> None:
    stored = stored_canvas(STAMPED_CANVAS)
    result = stamped(stored, RUN, {"habeat_schedule": "nightly"})
    leaves = _leaves_of(result)
    steps = plan(stored).steps
    assert len(leaves) == len(steps) == 6
    for leaf, step in zip(leaves, steps, strict=True):
        assert leaf["task"] == step.task
        assert leaf["options"]["task_id"] == step_task_id(RUN, step.path)
        headers = leaf["options"]["headers"]
        assert headers["habeat_schedule"] == "nightly"
        assert headers[WORKFLOW_HEADER] == str(RUN)
        assert headers[STEP_HEADER] == step.path
    assert leaves[0]["options"]["headers"]["mine"] == "kept"


def test_stamping_gives_groups_and_chord_headers_their_derived_ids() -> None:
    stored = stored_canvas(STAMPED_CANVAS)
    assert label(stored) == "chain(t.a | chord([t.b, t.c], chain(t.d | group(t.e, t.f))))"
    result = stamped(stored, RUN, {})
    the_chord = result["kwargs"]["tasks"][1]
    assert the_chord["options"]["task_id"] == group_id(RUN, "1.h")  # where Celery reads it
    inner_group = the_chord["kwargs"]["body"]["kwargs"]["tasks"][1]
    assert inner_group["options"]["task_id"] == group_id(RUN, "1.b.1")
    top = stamped(stored_canvas(group(sig("a"), sig("b"))), RUN, {})
    assert top["options"]["task_id"] == group_id(RUN, "")


def test_stamping_leaves_the_stored_canvas_alone_and_is_the_same_every_time() -> None:
    stored = stored_canvas(STAMPED_CANVAS)
    before = json.dumps(stored, sort_keys=True)
    first = stamped(stored, RUN, {"k": 1})
    assert json.dumps(stored, sort_keys=True) == before
    assert stamped(stored, RUN, {"k": 1}) == first
    other = stamped(stored, uuid.uuid4(), {"k": 1})
    assert {leaf["options"]["task_id"] for leaf in _leaves_of(other)}.isdisjoint(
        leaf["options"]["task_id"] for leaf in _leaves_of(first)
    )


def _frozen_ids(result: Any) -> tuple[set[str], set[str]]:
    """The task IDs and the group IDs of a frozen canvas's result tree."""
    tasks: set[str] = set()
    groups: set[str] = set()
    stack = [result]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        if isinstance(node, ResultSet):
            if isinstance(node, GroupResult):
                groups.add(node.id)
            stack.extend(node.results)
        else:
            tasks.add(node.id)
        stack.append(getattr(node, "parent", None))
    return tasks, groups


def test_a_stamped_canvas_rebuilt_by_celery_freezes_to_the_derived_ids() -> None:
    stored = stored_canvas(STAMPED_CANVAS)
    rebuilt = signature(stamped(stored, RUN, {}), app=app)
    assert isinstance(rebuilt, _chain)
    tasks, groups = _frozen_ids(rebuilt.freeze())
    assert tasks == {step_task_id(RUN, step.path) for step in plan(stored).steps}
    assert group_id(RUN, "1.b.1") in groups


def _sent_header_group_id(canvas: Any) -> str:
    """The group ID Celery sends the header of the chord of ``canvas`` under (its
    result's first parent that is a group), sending it through the in-memory broker as
    the publisher does."""
    with derived_ids(RUN):
        result = sendable(app, RUN, stored_canvas(canvas), {}).apply_async()
    node = result
    while not isinstance(node, GroupResult):
        node = node.parent
    return str(node.id)


@pytest.mark.parametrize(
    "canvas",
    [
        pytest.param(chord([sig("a"), sig("b")], sig("c")), id="chord"),
        pytest.param(chain(sig("x"), chord([sig("a"), sig("b")], sig("c"))), id="in a chain"),
        pytest.param(group(sig("x"), chord([sig("a"), sig("b")], sig("c"))), id="in a group"),
    ],
)
def test_a_chord_header_is_sent_under_the_same_group_id_at_every_send(canvas: Any) -> None:
    """A workflow sent twice counts its chord's parts under one ID: not a random one."""
    first = _sent_header_group_id(canvas)
    assert _sent_header_group_id(canvas) == first


def test_a_chord_alone_is_sent_under_its_derived_group_id() -> None:
    assert _sent_header_group_id(chord([sig("a"), sig("b")], sig("c"))) == group_id(RUN, "h")


# --- Found by review: refused, or sent under derived IDs ---


def test_an_empty_group_closing_a_nested_chain_does_not_drop_its_steps_from_the_ends() -> None:
    canvas = group(sig("a") | group(), sig("b"))  # Celery keeps the empty group: chain(a | group())
    try:
        result = plan(stored_canvas(canvas))
    except InvalidSchedule:
        return  # refused: as good
    assert "0.0" in result.ends  # t.a may still run when t.b has succeeded


@pytest.mark.parametrize("where", ["group", "chord header"])
def test_a_canvas_plan_takes_can_be_stamped_and_rebuilt_by_celery(where: str) -> None:
    one: dict[str, Any] = json.loads(json.dumps(sig("a")))
    a_group = {
        "task": "celery.group",
        "args": [],
        "kwargs": {"tasks": one},
        "options": {},
        "subtask_type": "group",
        "immutable": False,
    }
    canvas = a_group
    if where == "chord header":
        canvas = json.loads(json.dumps(chord([sig("x")], sig("b"))))
        canvas["kwargs"]["header"] = a_group
    try:
        stored = stored_canvas(canvas)
    except InvalidSchedule:
        return  # refused: as good
    signature(stamped(stored, RUN, {}), app=app)


# --- Property: the plan agrees with the order Celery runs a canvas in ------------------


@dataclass(frozen=True)
class OracleLeaf:
    """A task of a canvas: its position, and every task that must have finished before
    it starts."""

    path: str
    task: str
    args: tuple[Any, ...]
    immutable: bool
    after: frozenset[str]
    task_id: str | None
    headers: dict[str, Any]


def _join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part


def oracle(
    node: Signature, path: str = "", after: frozenset[str] = frozenset()
) -> list[OracleLeaf]:
    """The tasks of the Celery canvas ``node``, in written order, with what each waits on:
    a chain's element waits on everything before it in the chain, a chord's body on all
    of its header, a group's members on nothing more than the group does."""
    if isinstance(node, _chain):
        leaves: list[OracleLeaf] = []
        waited = after
        for index, member in enumerate(node.tasks):
            mine = oracle(member, _join(path, str(index)), waited)
            leaves += mine
            waited = waited | {leaf.path for leaf in mine}
        return leaves
    if isinstance(node, _chord):
        header = node.tasks.tasks if isinstance(node.tasks, group) else node.tasks
        leaves = []
        for index, member in enumerate(header):
            leaves += oracle(member, _join(_join(path, "h"), str(index)), after)
        body_waits = after | {leaf.path for leaf in leaves}
        return leaves + oracle(node.body, _join(path, "b"), body_waits)
    if isinstance(node, group):
        return [
            leaf
            for index, member in enumerate(node.tasks)
            for leaf in oracle(member, _join(path, str(index)), after)
        ]
    return [
        OracleLeaf(
            path=path or "0",
            task=node.task,
            args=tuple(node.args),
            immutable=bool(node.immutable),
            after=after,
            task_id=node.options.get("task_id"),
            headers=dict(node.options.get("headers") or {}),
        )
    ]


def task_names(node: Any) -> Counter[str]:
    """How many times each task is in a Celery canvas, whatever its shape."""
    if isinstance(node, _chord):
        header = node.tasks.tasks if isinstance(node.tasks, group) else node.tasks
        return sum((task_names(member) for member in header), Counter()) + task_names(node.body)
    if isinstance(node, _chain | group):
        return sum((task_names(member) for member in node.tasks), Counter())
    return Counter([node.task])


LEAVES = st.builds(
    lambda name, args, immutable: sig(name, *args, immutable=immutable),
    st.sampled_from("abcdefg"),
    st.lists(st.integers(-5, 5), max_size=2),
    st.booleans(),
)


def canvases(depth: int) -> st.SearchStrategy[Signature]:
    """Random canvases built by Celery's own constructors, at most ``depth`` containers
    deep and 3 members wide (Celery reshapes some: the property holds on the result)."""
    if depth == 0:
        return LEAVES
    inner = canvases(depth - 1)
    members = st.lists(inner, min_size=1, max_size=3)
    return st.one_of(
        LEAVES,
        members.map(lambda tasks: chain(*tasks)),
        members.map(lambda tasks: group(*tasks)),
        st.builds(lambda header, body: chord(header, body), members, inner),
    )


@settings(max_examples=300, deadline=None)
@given(canvas=canvases(4))
def test_the_plan_agrees_with_the_order_celery_runs_a_canvas_in(canvas: Signature) -> None:
    stored = stored_canvas(canvas)
    rebuilt = signature(copy.deepcopy(stored), app=app)  # Celery's from_dict writes into it
    assert stored_canvas(rebuilt) == stored  # Celery reads back the very shape stored
    leaves = oracle(rebuilt)
    result = plan(stored)

    # Every task of the canvas is a step, once, at its own position, in written order.
    assert task_names(canvas) == Counter(step.task for step in result.steps)
    assert len(result.steps) == len(leaves) == sum(task_names(canvas).values())
    assert [(s.path, s.task, s.args) for s in result.steps] == [
        (leaf.path, leaf.task, leaf.args) for leaf in leaves
    ]
    assert len({step.path for step in result.steps}) == len(result.steps)

    # Ends: the tasks nothing waits on; roots: those that wait on nothing.
    waited_on = set().union(*(leaf.after for leaf in leaves))
    assert set(result.ends) == {leaf.path for leaf in leaves} - waited_on
    assert set(result.roots) == {leaf.path for leaf in leaves if not leaf.after}
    assert len(set(result.ends)) == len(result.ends)
    # A step takes a result exactly when something ran before it, unless immutable.
    assert [step.takes_result for step in result.steps] == [
        bool(leaf.after) and not leaf.immutable for leaf in leaves
    ]
    # The last task to finish (one time unit a task, after all it waits on) is an end.
    finish: dict[str, int] = {}
    for leaf in leaves:  # written order: what a task waits on is written before it
        finish[leaf.path] = 1 + max((finish[path] for path in leaf.after), default=0)
    latest = max(finish.values())
    assert {path for path, time in finish.items() if time == latest} <= set(result.ends)

    # Derived IDs: one per step, the same at every send, where Celery reads them.
    ids = [step_task_id(RUN, step.path) for step in result.steps]
    assert len(set(ids)) == len(ids)
    assert ids == [step_task_id(RUN, step.path) for step in plan(stored).steps]
    first = stamped(stored, RUN, {"k": "v"})
    assert stamped(stored, RUN, {"k": "v"}) == first
    sent = oracle(signature(first, app=app))
    assert [leaf.task_id for leaf in sent] == ids
    assert all(
        leaf.headers[STEP_HEADER] == leaf.path and leaf.headers[WORKFLOW_HEADER] == str(RUN)
        for leaf in sent
    )
