"""The oracle planner: a shortest-enough action plan from any world state to the goal.

Owns ``oracle_actions(world)``: the list of ``(tool name, arguments)`` that solves the task from
the world's *current* state, using full knowledge of the state (where the object hides). Used for
SFT demonstrations, as the solvability test of every generated world, and to size tasks (the
generator keeps worlds whose plan length falls in the difficulty's turn range).
Does not: change the world (it plans on a copy) or talk to a model.

The plan: walk (breadth-first shortest path) to the nearest goal object, open its receptacle if
closed, take it; if the goal has a modifier, walk to the appliance room minimising
``dist(object, appliance) + dist(appliance, target)`` and treat it; walk to the target, open it if
closed, put. An object already held (or already treated) skips those steps.
"""

from __future__ import annotations

import copy
from collections import deque

from agentrl.envs.textworld.world import MODIFIERS, World, kind_of

Action = tuple[str, dict[str, str]]


def distances(world: World, start: str) -> dict[str, tuple[int, list[str]]]:
    """Room -> (hops, path of rooms after ``start``), breadth-first over sorted exits (deterministic)."""
    out = {start: (0, [])}
    queue = deque([start])
    while queue:
        room = queue.popleft()
        hops, path = out[room]
        for nxt in sorted(world.exits[room]):
            if nxt not in out:
                out[nxt] = (hops + 1, path + [nxt])
                queue.append(nxt)
    return out


def _walk(world: World, to: str, plan: list[Action]) -> None:
    for room in distances(world, world.room)[to][1]:
        plan.append(("go", {"room": room}))
        world.go(room)


def _step(world: World, plan: list[Action], name: str, **args: str) -> None:
    plan.append((name, dict(args)))
    world.act(name, **args)


def oracle_actions(world: World) -> list[Action]:
    """The plan from ``world``'s current state to its goal (``[]`` if already met)."""
    w = copy.deepcopy(world)
    kind, mod, target = w.goal
    plan: list[Action] = []
    if w.goal_met():
        return plan
    need = MODIFIERS[mod][0] if mod else None
    verb = MODIFIERS[mod][1] if mod else None
    if w.holding is None or kind_of(w.holding) != kind:
        if w.holding is not None:  # hands full of something else: set it down where we stand
            spot = next((r for r in w.receptacles[w.room] if w.is_open(r)), None)
            if spot is None:
                spot = w.receptacles[w.room][0]
                _step(w, plan, "open", receptacle=spot)
            _step(w, plan, "put", obj=w.holding, receptacle=spot)
        here = distances(w, w.room)
        candidates = sorted(
            (here[w.room_of(r)][0], o) for o, r in w.location.items() if kind_of(o) == kind and r != target
        )
        if not candidates:
            raise ValueError(f"world {w.task_id}: no {kind} to fetch for goal {w.goal_text()!r}")
        obj = candidates[0][1]
        source = w.location[obj]
        _walk(w, w.room_of(source), plan)
        if not w.is_open(source):
            _step(w, plan, "open", receptacle=source)
        _step(w, plan, "take", obj=obj)
    obj = w.holding
    if need is not None and need not in w.flags.get(obj, []):
        here, to_target = distances(w, w.room), distances(w, w.room_of(target))
        rooms = [r for r, recs in w.receptacles.items() if any(w.station(x) == verb for x in recs)]
        best = min(rooms, key=lambda r: (here[r][0] + to_target[r][0], r))
        _walk(w, best, plan)
        _step(w, plan, verb, obj=obj)
    _walk(w, w.room_of(target), plan)
    if not w.is_open(target):
        _step(w, plan, "open", receptacle=target)
    _step(w, plan, "put", obj=obj, receptacle=target)
    if not w.goal_met():
        raise AssertionError(f"world {w.task_id}: the oracle's plan does not reach the goal")  # a planner bug
    return plan
