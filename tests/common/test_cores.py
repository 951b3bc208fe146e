"""CoreShare: a party computing alone gets every core, two at once their share, each in its own thread."""

from __future__ import annotations

import threading

import pytest
import torch

from agentrl.common.cores import CoreShare


def test_threads_follow_who_computes():
    share = CoreShare(shared=1, alone=2)
    assert share.threads("engine") == 2 and share.threads("trainer") == 2
    with share.computing("trainer"):
        assert share.threads("engine") == 1  # the other party computes: its share
        assert share.threads("trainer") == 2  # the engine is idle: every core
        share.busy("engine", True)
        assert share.threads("trainer") == 1
        share.busy("engine", False)
    assert share.threads("engine") == 2
    with pytest.raises(ValueError, match="shared=3, alone=2"):
        CoreShare(shared=3, alone=2)


def test_apply_sizes_only_the_calling_threads_team():
    share = CoreShare(shared=1, alone=2)
    before = torch.get_num_threads()
    seen: dict[str, int] = {}
    engine_resized, trainer_may_go = threading.Event(), threading.Event()

    def engine() -> None:
        share.busy("engine", True)
        share.apply("engine")  # the trainer is idle: 2
        engine_resized.set()
        trainer_may_go.wait(10)
        seen["engine alone"] = torch.get_num_threads()
        share.apply("engine")  # the trainer computes now: 1
        seen["engine shared"] = torch.get_num_threads()
        share.busy("engine", False)

    def trainer() -> None:
        engine_resized.wait(10)
        with share.computing("trainer"):
            seen["trainer"] = share.apply("trainer")  # the engine computes: 1, set in this thread only
            seen["trainer team"] = torch.get_num_threads()
            trainer_may_go.set()
            t.join(10)
            seen["trainer after"] = share.apply("trainer")  # the engine went idle: 2 again

    t = threading.Thread(target=engine)
    u = threading.Thread(target=trainer)
    t.start(), u.start()
    u.join(10)
    try:
        assert seen == {
            "engine alone": 2,  # the trainer's resize to 1 did not reach the engine's thread
            "engine shared": 1,
            "trainer": 1,
            "trainer team": 1,
            "trainer after": 2,
        }
        assert share.resizes == 4
    finally:
        torch.set_num_threads(before)
