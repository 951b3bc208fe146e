"""The explorer: a plan that uses only what the transcript shows, for demonstrations a policy can imitate.

Owns ``explorer_actions(world)``: the ``(tool name, arguments)`` list an agent that knows only what
it has seen plays from the world's current state to the goal. The oracle (``oracle``) walks
straight to where the goal object hides, which nothing in the transcript tells a policy; a model
trained to imitate it learns the plan's shape but not where its actions come from. Every action
here follows from earlier observations by a fixed rule, so it can be learnt:

1. Holding a goal object that still needs a treatment: go to the nearest seen room with the
   appliance and treat it (explore if none is seen yet).
2. Holding it ready: go to the target's room once seen (explore until then), open the target if
   closed, put.
3. Not holding one: if an object of the goal's kind lies in an open receptacle of this room
   (not already in the target), take it; else open the first closed receptacle of this room not
   opened yet; else explore.
Explore: go to the first unvisited exit of this room (in the order the room lists them), else walk
the shortest known path to the nearest visited room that has one.

Given an ``rng``, "first" in rules 3 and Explore becomes "one at random" (which closed receptacle to
open, which unvisited exit to take): the same rules and knowledge, other orders, so one world gives
many different demonstrations (varied games of a few fixed worlds).

Knowledge is rebuilt from what an agent has seen: the rooms entered (their receptacles and exits),
the receptacles it saw open (their contents). Objects move only when the agent moves them, so what
it saw stays true. Does not: change the world (it plays a copy) or talk to a model.
"""

from __future__ import annotations

import copy
import random
from collections import deque

from agentrl.envs.textworld.oracle import Action
from agentrl.envs.textworld.world import MODIFIERS, World, kind_of

#: a guard against a bug looping forever; a world of 8 rooms needs far fewer
MAX_ACTIONS = 200


class _Seen:
    """What the agent has seen so far."""

    def __init__(self, world: World) -> None:
        self.rooms: list[str] = []
        self.contents: dict[str, list[str]] = {}  # receptacle -> objects, for receptacles seen open
        self.enter(world)

    def enter(self, w: World) -> None:
        if w.room not in self.rooms:
            self.rooms.append(w.room)
        for r in w.receptacles[w.room]:
            if w.is_open(r):
                self.contents[r] = w.contents(r)

    def room_of(self, w: World, receptacle: str) -> str | None:
        return next((room for room in self.rooms if receptacle in w.receptacles[room]), None)


def _path(w: World, seen: _Seen, to: str) -> list[str]:
    """Shortest path (rooms after the current one) to ``to`` through known exits only."""
    prev: dict[str, str | None] = {w.room: None}
    queue = deque([w.room])
    while queue:
        room = queue.popleft()
        if room == to:
            break
        if room not in seen.rooms:
            continue  # its exits are unknown
        for nxt in w.exits[room]:
            if nxt not in prev:
                prev[nxt] = room
                queue.append(nxt)
    path, room = [], to
    while room != w.room:
        path.append(room)
        room = prev[room]
    return path[::-1]


def _first(options: list, rng: random.Random | None):
    return options[0] if rng is None else rng.choice(options)


def _frontier(w: World, seen: _Seen, rng: random.Random | None = None) -> str:
    """The next room to explore: an unvisited exit here, else the nearest one beyond a visited room."""
    here = [r for r in w.exits[w.room] if r not in seen.rooms]
    if here:
        return _first(here, rng)
    queued = {w.room}
    queue = deque([w.room])
    while queue:
        room = queue.popleft()
        for nxt in w.exits[room]:
            if nxt not in seen.rooms:
                return nxt  # breadth-first: the first unvisited room met is a nearest one
            if nxt not in queued:
                queued.add(nxt)
                queue.append(nxt)
    raise ValueError(f"world {w.task_id}: every room seen and the goal {w.goal_text()!r} still not reachable")


def _next(w: World, seen: _Seen, rng: random.Random | None = None) -> Action:
    """The next action by the rules of the module docstring."""
    kind, mod, target = w.goal
    need, verb = MODIFIERS[mod] if mod else (None, None)
    held = w.holding
    if held is not None and kind_of(held) == kind:
        if need is not None and need not in w.flags.get(held, []):
            if any(w.station(r) == verb for r in w.receptacles[w.room]):
                return verb, {"obj": held}
            rooms = [room for room in seen.rooms if any(w.station(r) == verb for r in w.receptacles[room])]
            goal_room = min(rooms, key=lambda room: (len(_path(w, seen, room)), seen.rooms.index(room)), default=None)
        else:
            if target in w.receptacles[w.room]:
                if not w.is_open(target):
                    return "open", {"receptacle": target}
                return "put", {"obj": held, "receptacle": target}
            goal_room = seen.room_of(w, target)
    else:
        if held is not None:  # something else in hand: set it down here
            spot = next((r for r in w.receptacles[w.room] if w.is_open(r)), None)
            if spot is None:
                return "open", {"receptacle": w.receptacles[w.room][0]}
            return "put", {"obj": held, "receptacle": spot}
        for r in w.receptacles[w.room]:
            if r != target and w.is_open(r):
                found = [o for o in seen.contents.get(r, []) if kind_of(o) == kind]
                if found:
                    return "take", {"obj": found[0]}
        closed = [r for r in w.receptacles[w.room] if not w.is_open(r) and r not in seen.contents]
        if closed:
            return "open", {"receptacle": _first(closed, rng)}
        goal_room = None
    room = goal_room if goal_room is not None else _frontier(w, seen, rng)
    return "go", {"room": _path(w, seen, room)[0]}


def explorer_actions(world: World, rng: random.Random | None = None) -> list[Action]:
    """The explorer's plan from ``world``'s current state to its goal (``[]`` if already met);
    ValueError if it cannot finish (a world whose goal is unreachable). ``rng``: break the rules'
    ties at random (see the module docstring); None: the fixed order."""
    w = copy.deepcopy(world)
    seen = _Seen(w)
    plan: list[Action] = []
    while not w.goal_met():
        if len(plan) >= MAX_ACTIONS:
            raise AssertionError(f"world {w.task_id}: the explorer did not finish in {MAX_ACTIONS} actions")
        name, args = _next(w, seen, rng)
        w.act(name, **args)
        plan.append((name, args))
        seen.enter(w)
    return plan
