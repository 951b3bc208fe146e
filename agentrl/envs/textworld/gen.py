"""Procedural worlds: a pure function of ``(seed, difficulty, split)``.

Owns ``generate_world``: the room graph (a random spanning tree plus one extra door, so some
states are reachable by several paths), the receptacles of each room (the kitchen always has a
fridge, a microwave and a sink; the bathroom a sink), the objects (all start dirty and at room
temperature), the goal, and the start room; and the train/eval split.

Difficulty (the goal's shape): 1 = "put a mug in cabinet 2"; 2 = "put a clean mug in ..." (clean
it at a sink); 3 = "put a hot/cold mug in ..." (microwave / fridge). A world is kept only if the
oracle's plan has ``PLAN_TURNS[difficulty]`` actions (10-30 at the default difficulty 2), so
every task is solvable within the env's turn limit by construction.

Split: the world's id is a hash of its full initial description; ids in a fixed 10% bucket are
eval worlds, the rest train worlds, and the generator redraws until the world lands in the
requested split, so the two splits share no world. Does not: apply actions (``world``) or plan
(``oracle``).
"""

from __future__ import annotations

import hashlib
import json
import random

from agentrl.envs.textworld.oracle import oracle_actions
from agentrl.envs.textworld.world import RECEPTACLE_KINDS, World

DIFFICULTIES = (1, 2, 3)
SPLITS = ("train", "eval")
#: difficulty -> (min, max) oracle actions a kept world needs
PLAN_TURNS = {1: (8, 30), 2: (10, 30), 3: (10, 30)}
ROOMS = ("hallway", "living room", "bedroom", "study", "pantry", "garage", "dining room", "laundry room")
OBJECTS = ("mug", "apple", "plate", "bowl", "cup", "potato", "egg", "tomato", "book", "towel", "spoon", "bottle")
_PLAIN = ("cabinet", "drawer", "box", "shelf", "table", "countertop")
_MAX_REDRAWS = 2000


def _layout(rng: random.Random, n_rooms: int) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    rooms = ["kitchen", "bathroom"] + rng.sample(ROOMS, n_rooms - 2)
    rng.shuffle(rooms)
    edges = {(rooms[i], rooms[rng.randrange(i)]) for i in range(1, n_rooms)}
    a, b = rng.sample(rooms, 2)
    edges.add((a, b))
    exits: dict[str, set[str]] = {r: set() for r in rooms}
    for x, y in edges:
        exits[x].add(y)
        exits[y].add(x)
    kinds: dict[str, list[str]] = {}
    for room in rooms:
        fixed = {"kitchen": ["fridge", "microwave", "sink"], "bathroom": ["sink"]}.get(room, [])
        kinds[room] = fixed + rng.sample(_PLAIN, rng.randint(2, 3))
    counter: dict[str, int] = {}
    receptacles: dict[str, list[str]] = {}
    for room in rooms:
        names = []
        for kind in kinds[room]:
            counter[kind] = counter.get(kind, 0) + 1
            names.append(f"{kind} {counter[kind]}")
        receptacles[room] = names
    return {r: sorted(e) for r, e in exits.items()}, receptacles


def _draw(rng: random.Random, difficulty: int) -> World:
    exits, receptacles = _layout(rng, rng.randint(5, 7))
    all_recs = [r for recs in receptacles.values() for r in recs]
    storage = [r for r in all_recs if RECEPTACLE_KINDS[r.rsplit(" ", 1)[0]][1] is None]
    kinds = rng.sample(OBJECTS, rng.randint(4, 6))
    location = {f"{k} 1": rng.choice(storage) for k in kinds}
    goal_obj = f"{kinds[0]} 1"
    target = rng.choice([r for r in storage if r != location[goal_obj]])
    mod = None if difficulty == 1 else "clean" if difficulty == 2 else rng.choice(("hot", "cold"))
    return World(
        task_id="",
        exits=exits,
        receptacles=receptacles,
        goal=(kinds[0], mod, target),
        room=rng.choice(sorted(exits)),
        location=location,
    )


def _world_id(w: World, difficulty: int) -> str:
    desc = json.dumps(
        {
            "exits": w.exits,
            "receptacles": w.receptacles,
            "goal": w.goal,
            "room": w.room,
            "location": sorted(w.location.items()),
        },
        sort_keys=True,
    )
    return f"tw{difficulty}-" + hashlib.blake2b(desc.encode(), digest_size=6).hexdigest()


def _is_eval(world_id: str) -> bool:
    return int(world_id.rsplit("-", 1)[1], 16) % 10 == 0


def generate_world(seed: int, difficulty: int = 2, split: str = "train") -> World:
    """The world for ``seed`` at ``difficulty`` in ``split``; the same arguments give the same world."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"{int(seed)}/{difficulty}/{split}")
    lo, hi = PLAN_TURNS[difficulty]
    for _ in range(_MAX_REDRAWS):
        world = _draw(rng, difficulty)
        world.task_id = _world_id(world, difficulty)
        if _is_eval(world.task_id) != (split == "eval"):
            continue
        if lo <= len(oracle_actions(world)) <= hi:
            return world
    raise RuntimeError(
        f"no {split} world with a {lo}-{hi} action plan at difficulty {difficulty} "
        f"after {_MAX_REDRAWS} draws (seed {seed})"
    )
