"""The text world's state and rules: rooms, receptacles (some closed), objects, one held item.

Owns: ``World`` (static layout + mutable state), the actions (``look``, ``go``, ``open``,
``close``, ``take``, ``put``, ``clean``, ``heat``, ``cool``, ``inventory``) as methods that change
the state and return what the agent sees, the goal test, and ``state_key`` (a canonical hash of
the mutable state: the same state reached by different paths has the same key).

Does not: generate worlds or plan (``agentrl.envs.textworld.gen``), speak the tool-call protocol
or give rewards (``agentrl.envs.textworld.env``). Pure Python; no randomness here.

Rules: the agent holds at most one object; it takes an object from a receptacle in its room (an
openable one must be open); ``clean`` needs a sink in the room, ``heat`` a microwave, ``cool`` a
fridge (the appliance need not be open); heating makes an object hot (and no longer cold),
cooling the reverse. A mistaken action changes nothing and says why.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

#: receptacle kind -> (openable, station verb or None)
RECEPTACLE_KINDS: dict[str, tuple[bool, str | None]] = {
    "cabinet": (True, None),
    "drawer": (True, None),
    "box": (True, None),
    "fridge": (True, "cool"),
    "microwave": (True, "heat"),
    "sink": (False, "clean"),
    "countertop": (False, None),
    "shelf": (False, None),
    "table": (False, None),
}
#: goal modifier -> (object flag it needs, station verb that sets it)
MODIFIERS: dict[str, tuple[str, str]] = {"clean": ("clean", "clean"), "hot": ("hot", "heat"), "cold": ("cold", "cool")}


def norm(name: str) -> str:
    """A name as the model may type it: case and spacing do not matter."""
    return " ".join(str(name).lower().split())


def kind_of(name: str) -> str:
    """``"mug 2"`` -> ``"mug"``."""
    return name.rsplit(" ", 1)[0]


@dataclass
class World:
    """One world. Static: ``exits`` (room -> adjacent rooms), ``receptacles`` (room -> names),
    ``goal`` (object kind, modifier or None, target receptacle). Mutable: the rest."""

    task_id: str
    exits: dict[str, list[str]]
    receptacles: dict[str, list[str]]
    goal: tuple[str, str | None, str]
    room: str
    holding: str | None = None
    location: dict[str, str] = field(default_factory=dict)  # object -> receptacle
    flags: dict[str, list[str]] = field(default_factory=dict)  # object -> sorted flags
    opened: set[str] = field(default_factory=set)

    # ---------------------------------------------------------------- derived
    def room_of(self, receptacle: str) -> str:
        return next(r for r, recs in self.receptacles.items() if receptacle in recs)

    def contents(self, receptacle: str) -> list[str]:
        return sorted(o for o, r in self.location.items() if r == receptacle)

    @staticmethod
    def openable(receptacle: str) -> bool:
        return RECEPTACLE_KINDS[kind_of(receptacle)][0]

    @staticmethod
    def station(receptacle: str) -> str | None:
        return RECEPTACLE_KINDS[kind_of(receptacle)][1]

    def is_open(self, receptacle: str) -> bool:
        return not self.openable(receptacle) or receptacle in self.opened

    def goal_text(self) -> str:
        kind, mod, target = self.goal
        return f"put a {mod + ' ' if mod else ''}{kind} in {target}"

    def goal_met(self) -> bool:
        kind, mod, target = self.goal
        need = MODIFIERS[mod][0] if mod else None
        return any(
            kind_of(o) == kind and (need is None or need in self.flags.get(o, [])) for o in self.contents(target)
        )

    def state_key(self) -> str:
        """Canonical hash of everything an action can change (and the task id, so keys of
        different worlds never collide). Independent of the path that led here."""
        flags = sorted((o, sorted(f)) for o, f in self.flags.items() if f)
        state = {
            "task": self.task_id,
            "room": self.room,
            "holding": self.holding,
            "location": sorted(self.location.items()),
            "flags": flags,
            "opened": sorted(self.opened),
        }
        return hashlib.blake2b(json.dumps(state, sort_keys=True).encode(), digest_size=8).hexdigest()

    # ---------------------------------------------------------------- lookups (mistakes say why)
    def _here(self, receptacle: str) -> tuple[str | None, str]:
        name = norm(receptacle)
        if name in self.receptacles[self.room]:
            return name, ""
        if any(name in recs for recs in self.receptacles.values()):
            return None, f"{name} is not in the {self.room}. {self._see()}"
        return None, f"There is no {name!r} here. {self._see()}"

    def _see(self) -> str:
        return "You see: " + ", ".join(self.receptacles[self.room]) + "."

    def _describe(self, receptacle: str) -> str:
        if not self.is_open(receptacle):
            return f"{receptacle} (closed)"
        items = self.contents(receptacle)
        return f"{receptacle} ({'holding ' + ', '.join(items) if items else 'empty'})"

    # ---------------------------------------------------------------- actions
    def look(self) -> str:
        recs = "; ".join(self._describe(r) for r in self.receptacles[self.room])
        return (
            f"You are in the {self.room}. You see: {recs}. Exits: {', '.join(self.exits[self.room])}. "
            f"Your task: {self.goal_text()}."
        )

    def go(self, room: str) -> str:
        name = norm(room)
        if name == self.room:
            return f"You are already in the {self.room}."
        if name not in self.exits[self.room]:
            return f"You cannot go to {name!r} from the {self.room}. Exits: {', '.join(self.exits[self.room])}."
        self.room = name
        return self.look()

    def open(self, receptacle: str) -> str:
        name, why = self._here(receptacle)
        if name is None:
            return why
        if not self.openable(name):
            return f"{name} cannot be opened; it is always open. {self._describe(name)}."
        if name in self.opened:
            return f"{name} is already open: {self._describe(name)}."
        self.opened.add(name)
        return f"You open {name}: {self._describe(name)}."

    def close(self, receptacle: str) -> str:
        name, why = self._here(receptacle)
        if name is None:
            return why
        if not self.openable(name) or name not in self.opened:
            return f"{name} is not open."
        self.opened.discard(name)
        return f"You close {name}."

    def take(self, obj: str) -> str:
        name = norm(obj)
        if self.holding == name:
            return f"You already hold {name}."
        if self.holding is not None:
            return f"Your hands are full: you hold {self.holding}. Put it somewhere first."
        where = self.location.get(name)
        if where is None or where not in self.receptacles[self.room] or not self.is_open(where):
            return f"You see no {name!r} you can reach here. {self.look()}"
        del self.location[name]
        self.holding = name
        return f"You take {name} from {where}."

    def put(self, obj: str, receptacle: str) -> str:
        name = norm(obj)
        if self.holding != name:
            return f"You do not hold {name!r}." + (f" You hold {self.holding}." if self.holding else "")
        target, why = self._here(receptacle)
        if target is None:
            return why
        if not self.is_open(target):
            return f"{target} is closed. Open it first."
        self.location[name], self.holding = target, None
        return f"You put {name} in {target}."

    def treat(self, verb: str, obj: str) -> str:
        """``clean``/``heat``/``cool`` the held ``obj`` at the matching appliance in this room."""
        name = norm(obj)
        if self.holding != name:
            return f"You need to hold {name!r} to {verb} it." + (f" You hold {self.holding}." if self.holding else "")
        if not any(self.station(r) == verb for r in self.receptacles[self.room]):
            need = next(k for k, (_, v) in RECEPTACLE_KINDS.items() if v == verb)
            return f"There is no {need} in the {self.room} to {verb} {name} with."
        flags = set(self.flags.get(name, []))
        if verb == "clean":
            flags.add("clean")
        elif verb == "heat":
            flags = (flags - {"cold"}) | {"hot"}
        else:
            flags = (flags - {"hot"}) | {"cold"}
        self.flags[name] = sorted(flags)
        done = {"clean": "clean", "heat": "hot", "cool": "cold"}[verb]
        return f"You {verb} {name}. It is now {done}."

    def inventory(self) -> str:
        if self.holding is None:
            return "You hold nothing."
        flags = self.flags.get(self.holding, [])
        return f"You hold {self.holding}" + (f" ({', '.join(flags)})." if flags else ".")

    def act(self, name: str, **args: str) -> str:
        """Dispatch one action by tool name (the oracle and tests use this)."""
        if name in ("clean", "heat", "cool"):
            return self.treat(name, **args)
        return getattr(self, name)(**args)
