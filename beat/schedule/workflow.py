"""Workflow schedules: a schedule whose target is a Celery canvas (chain, group, chord,
nested), not one task. Pure: no I/O, no Celery app needed.

A workflow is stored as Celery serialises a signature (``json.dumps(signature)``), in
the schedule's payload: the task is :data:`WORKFLOW_TASK` and the kwargs are
``{"canvas": <the signature>, "ends": [<paths>]}``. Every run copies that payload, as
any run copies its schedule's, so the claim, the outbox, triggers and backfills need
nothing of their own.

Each step (a task signature of the canvas) is named by its **path**, its position in
the canvas as stored: ``"1"`` is a chain's second element, ``"2.h.0"`` the first task of
the header of the chord at position 2, ``"2.b"`` its body. A step's task ID is derived
from the run ID and its path (:func:`step_task_id`), and so is each group's ID
(:func:`group_id`): a run published twice sends the same IDs, so a step delivered twice
meets the idempotency guard, and a chord counts its header's parts in one place.

A run is the whole workflow. It **ends** when its *end steps* ended (:func:`plan`): a
chain's last element, every member of a group, a chord's body, applied recursively:
once they all succeeded, every step did (a chain sends an element only after the one
before succeeded, a chord its body only after its whole header). The run is
``succeeded`` then; ``failed`` (or ``lost``) as soon as one step is, naming it. The
database does that bookkeeping (``beat_runs`` trigger of migration 0021): every path
that ends a step, a worker, the reaper or an operator, moves the workflow with it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from beat.errors import InvalidSchedule

#: The task name a workflow schedule and its runs carry (no task of that name is sent:
#: the publisher sends the canvas instead).
WORKFLOW_TASK: Final = "habeat.workflow"

#: Message headers of a step: its workflow run and its path.
WORKFLOW_HEADER: Final = "habeat_workflow"
STEP_HEADER: Final = "habeat_step"

#: Most steps one workflow may have, and how deep its canvas may nest.
MAX_STEPS: Final = 1000
MAX_DEPTH: Final = 16

#: Canvas kinds a workflow may hold. ``chunks``, ``xmap`` and ``xstarmap`` build their
#: tasks at run time, with IDs of Celery's choosing: a group of signatures says the same.
_CONTAINERS: Final = {"chain", "group", "chord"}
_REFUSED_TASKS: Final = {"celery.chunks", "celery.map", "celery.starmap"}

#: Leaf options a step may not carry: a ``link`` callback would be a step of no path
#: (put it in the chain instead); the task ID is derived.
_REFUSED_STEP_OPTIONS: Final = ("link",)


@dataclass(frozen=True, slots=True)
class Step:
    """One task of a workflow: where it sits, what it runs, whether it takes the result
    of what ran before it (a chain's later elements, a chord's body)."""

    path: str
    task: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    takes_result: bool


@dataclass(frozen=True, slots=True)
class Plan:
    """The steps of a canvas, in the order they are written; the paths of the steps
    whose success ends it (``ends``); and the paths of those sent first (``roots``)."""

    steps: tuple[Step, ...]
    ends: tuple[str, ...]
    roots: tuple[str, ...]


def stored_canvas(workflow: Any) -> dict[str, Any]:
    """A canvas (a Celery signature, its dict, or its JSON text) as it is stored: plain
    JSON, checked by :func:`plan`. InvalidSchedule names what to fix."""
    if isinstance(workflow, str):
        try:
            workflow = json.loads(workflow)
        except ValueError as exc:
            raise InvalidSchedule(
                f"workflow must be a Celery signature as JSON (json.dumps(chain(...))): {exc}"
            ) from None
    if not isinstance(workflow, Mapping):
        raise InvalidSchedule(
            "workflow must be a Celery signature (chain, group, chord or a task's .s()),"
            f" got {type(workflow).__name__}"
        )
    try:
        canvas = json.loads(json.dumps(workflow, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidSchedule(
            f"a workflow's arguments must be plain JSON (numbers, strings, lists, objects): {exc}"
        ) from None
    plan(canvas)
    return dict(canvas)


def workflow_kwargs(canvas: Mapping[str, Any]) -> dict[str, Any]:
    """The payload kwargs of a workflow schedule: its canvas and its end steps."""
    return {"canvas": dict(canvas), "ends": list(plan(canvas).ends)}


def canvas_of(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The canvas of a workflow run's or schedule's kwargs; InvalidSchedule if it has none."""
    canvas = kwargs.get("canvas")
    if not isinstance(canvas, Mapping):
        raise InvalidSchedule(
            f"a {WORKFLOW_TASK} schedule needs its canvas: give workflow= (--workflow JSON)"
        )
    return dict(canvas)


def plan(canvas: Mapping[str, Any]) -> Plan:
    """The steps, end steps and first steps of ``canvas``; InvalidSchedule naming the
    first part that cannot be scheduled."""
    steps: list[Step] = []
    ends, roots = _walk(canvas, "", takes_result=False, depth=0, into=steps)
    if len(steps) > MAX_STEPS:
        raise InvalidSchedule(f"a workflow has at most {MAX_STEPS} steps, this one {len(steps)}")
    if not ends:
        raise InvalidSchedule("a workflow needs at least one task: its chain or group is empty")
    return Plan(steps=tuple(steps), ends=tuple(ends), roots=tuple(roots))


def step_task_id(run_id: uuid.UUID, path: str) -> str:
    """The Celery task ID of the step at ``path`` of run ``run_id``: the same at every send."""
    return str(uuid.uuid5(run_id, f"step:{path}"))


def group_id(run_id: uuid.UUID, path: str) -> str:
    """The ID of the group (a chord's header) at ``path`` of run ``run_id``."""
    return str(uuid.uuid5(run_id, f"group:{path}"))


def stamped(
    canvas: Mapping[str, Any], run_id: uuid.UUID, headers: Mapping[str, Any]
) -> dict[str, Any]:
    """A copy of ``canvas`` ready to send for run ``run_id``: each step with its derived
    task ID and ``headers`` plus its own path, each group and chord header with its
    derived ID (a chord's in the chord's own options, where Celery reads it)."""
    copy: dict[str, Any] = json.loads(json.dumps(canvas))
    for path, node in _nodes(copy, ""):
        options = node.setdefault("options", {})
        kind = node.get("subtask_type")
        if kind == "group":
            options["task_id"] = group_id(run_id, path)
        elif kind == "chord":
            # Celery counts a chord's header under the chord's own ID (a header given as a
            # group loses its options when the canvas is rebuilt): see header_groups.
            options["task_id"] = group_id(run_id, _join(path, "h"))
        elif kind is None:
            options["task_id"] = step_task_id(run_id, path)
            options["headers"] = {
                **(options.get("headers") or {}),
                **headers,
                WORKFLOW_HEADER: str(run_id),
                STEP_HEADER: path,
            }
    return copy


@dataclass(frozen=True, slots=True)
class Node:
    """One line of a workflow's outline: a container (``chain``, ``group``, ``chord``,
    a chord's ``header``) or a step (``task``, with its task's name)."""

    path: str
    depth: int
    kind: str
    task: str | None = None


def outline(canvas: Mapping[str, Any]) -> list[Node]:
    """The canvas as a tree, top down, each step under what holds it (a run's page)."""
    nodes: list[Node] = []
    _outline(canvas, "", 0, nodes)
    return nodes


def _outline(node: Mapping[str, Any], path: str, depth: int, into: list[Node]) -> None:
    kind = node.get("subtask_type")
    if kind in ("chain", "group"):
        into.append(Node(path=path, depth=depth, kind=str(kind)))
        for index, member in enumerate(_members(node)):
            _outline(member, _join(path, str(index)), depth + 1, into)
    elif kind == "chord":
        into.append(Node(path=path, depth=depth, kind="chord"))
        header = _join(path, "h")
        into.append(Node(path=header, depth=depth + 1, kind="header"))
        for index, member in enumerate(_header(node)):
            _outline(member, _join(header, str(index)), depth + 2, into)
        _outline(_body(node), _join(path, "b"), depth + 1, into)
    else:
        into.append(Node(path=path or "0", depth=depth, kind="task", task=str(node.get("task"))))


def needs_result_backend(canvas: Mapping[str, Any]) -> bool:
    """Whether Celery sends this canvas through a chord, which counts its header's results
    in the result backend: a chord, or a group followed by another element in a chain
    (Celery makes that pair a chord when it sends it)."""
    kind = canvas.get("subtask_type")
    if kind == "chord":
        return True
    if kind in ("chain", "group"):
        members = _members(canvas)
        if kind == "chain" and any(
            member.get("subtask_type") == "group" for member in members[:-1]
        ):
            return True
        return any(needs_result_backend(member) for member in members)
    return False


def described(kwargs: Mapping[str, Any]) -> str:
    """A workflow schedule's or run's canvas in one line, from its kwargs; the workflow
    task's name if they hold none that can be read (a row written around the API)."""
    try:
        return label(canvas_of(kwargs))
    except InvalidSchedule:
        return WORKFLOW_TASK


def label(canvas: Mapping[str, Any]) -> str:
    """The canvas in one line, as people write it: ``chain(a | group(b, c) | d)``."""
    kind = canvas.get("subtask_type")
    if kind in ("chain", "group"):
        parts = [label(member) for member in _members(canvas)]
        return f"chain({' | '.join(parts)})" if kind == "chain" else f"group({', '.join(parts)})"
    if kind == "chord":
        header = ", ".join(label(member) for member in _header(canvas))
        return f"chord([{header}], {label(_body(canvas))})"
    return str(canvas.get("task"))


def _walk(
    node: Any, path: str, *, takes_result: bool, depth: int, into: list[Step]
) -> tuple[list[str], list[str]]:
    """Add the steps under ``node`` to ``into``; its end steps and its first steps."""
    where = f"step {path}" if path else "the workflow"
    if depth > MAX_DEPTH:
        raise InvalidSchedule(f"{where}: a workflow nests at most {MAX_DEPTH} levels deep")
    if not isinstance(node, Mapping) or not isinstance(node.get("task"), str):
        raise InvalidSchedule(f"{where}: not a Celery signature (an object with a 'task')")
    kind = node.get("subtask_type")
    if (
        kind is not None
        and isinstance(node.get("options"), Mapping)
        and node["options"].get("link")
    ):
        raise InvalidSchedule(
            f"{where}: a {kind}'s link callback is not tracked: put it in the chain after it"
        )
    if node.get("immutable"):  # Celery gives an immutable signature no result
        takes_result = False
    if (kind is not None and kind not in _CONTAINERS) or node["task"] in _REFUSED_TASKS:
        raise InvalidSchedule(
            f"{where}: {node['task']} builds its tasks when it runs, which a schedule cannot"
            " track: write the tasks out as a group"
        )
    if kind == "chain":
        return _walk_chain(node, path, takes_result=takes_result, depth=depth, into=into)
    if kind == "group":
        return _walk_group(_members(node), path, takes_result=takes_result, depth=depth, into=into)
    if kind == "chord":
        _, roots = _walk_group(
            _header(node), _join(path, "h"), takes_result=takes_result, depth=depth, into=into
        )
        body = _body(node)
        ends, _ = _walk(body, _join(path, "b"), takes_result=True, depth=depth + 1, into=into)
        return ends, roots
    into.append(_leaf(node, path or "0", takes_result=takes_result))
    return [path or "0"], [path or "0"]


def _walk_chain(
    node: Mapping[str, Any], path: str, *, takes_result: bool, depth: int, into: list[Step]
) -> tuple[list[str], list[str]]:
    members = _members(node)
    ends: list[str] = []
    roots: list[str] = []
    for index, member in enumerate(members):
        ends, first = _walk(
            member,
            _join(path, str(index)),
            takes_result=takes_result or index > 0,
            depth=depth + 1,
            into=into,
        )
        roots = roots or first
    return ends, roots


def _walk_group(
    members: list[Any], path: str, *, takes_result: bool, depth: int, into: list[Step]
) -> tuple[list[str], list[str]]:
    ends: list[str] = []
    roots: list[str] = []
    for index, member in enumerate(members):
        member_ends, member_roots = _walk(
            member, _join(path, str(index)), takes_result=takes_result, depth=depth + 1, into=into
        )
        ends += member_ends
        roots += member_roots
    return ends, roots


def _leaf(node: Mapping[str, Any], path: str, *, takes_result: bool) -> Step:
    where = f"step {path} ({node['task']})"
    args, kwargs = node.get("args") or [], node.get("kwargs") or {}
    options = node.get("options") or {}
    if not isinstance(args, list) or not isinstance(kwargs, Mapping):
        raise InvalidSchedule(f"{where}: args must be a JSON array and kwargs a JSON object")
    if not isinstance(options, Mapping):
        raise InvalidSchedule(f"{where}: options must be a JSON object")
    for refused in _REFUSED_STEP_OPTIONS:
        if options.get(refused):
            raise InvalidSchedule(
                f"{where}: a step's {refused} callback is not tracked: put it in the chain"
            )
    headers = options.get("headers")
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidSchedule(f"{where}: options.headers must be a JSON object")
    return Step(
        path=path,
        task=node["task"],
        args=tuple(args),
        kwargs=dict(kwargs),
        takes_result=takes_result and not node.get("immutable"),
    )


def _nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every signature of the canvas (containers and steps) with its path, as ``plan``
    names them."""
    kind = node.get("subtask_type")
    yield (path or "0") if kind is None else path, node
    if kind in ("chain", "group"):
        for index, member in enumerate(_members(node)):
            yield from _nodes(member, _join(path, str(index)))
    elif kind == "chord":
        for index, member in enumerate(_header(node)):
            yield from _nodes(member, _join(_join(path, "h"), str(index)))
        yield from _nodes(_body(node), _join(path, "b"))


def _members(node: Mapping[str, Any]) -> list[Any]:
    tasks = (node.get("kwargs") or {}).get("tasks")
    if not isinstance(tasks, list):
        raise InvalidSchedule(f"{node.get('task')}: its tasks must be a list of signatures")
    if not tasks:
        # Celery skips an empty group or chain: what it closes would end unseen.
        raise InvalidSchedule(f"{node.get('task')}: an empty group or chain: leave it out")
    return tasks


def _header(node: Mapping[str, Any]) -> list[Any]:
    header = (node.get("kwargs") or {}).get("header")
    if isinstance(header, Mapping) and header.get("subtask_type") == "group":
        return _members(header)
    if not isinstance(header, list) or not header:
        raise InvalidSchedule("a chord's header must be a non-empty list or group of signatures")
    return header


def _body(node: Mapping[str, Any]) -> Any:
    body = (node.get("kwargs") or {}).get("body")
    if body is None:
        raise InvalidSchedule("a chord needs a body: the task its header's results go to")
    return body


def _join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part
