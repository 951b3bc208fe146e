"""A tiny verifiers (0.4, ``verifiers.v1``) taskset built from verifiers' own classes, for the verifiers
adapter's tests: reverse a short word; the reward is verifiers' own (a ``@vf.reward`` on the task),
1.0 when the last assistant reply contains the reversed word. Needs no network or model download."""

import verifiers.v1 as vf

WORDS = ["cat", "dog", "sun", "map", "pen", "cup", "box", "hat", "car", "bee"]


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def reversed_word(self, trace: vf.Trace) -> float:
        return float(self.data.answer in (trace.last_reply or ""))


class ReverseConfig(vf.TasksetConfig):
    num_tasks: int = 10


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self):
        return [
            ReverseTask(
                ReverseData(prompt=f"Reverse the word '{w}'. Answer with the reversed word only.", answer=w[::-1])
            )
            for w in WORDS[: self.config.num_tasks]
        ]


__all__ = ["ReverseTaskset"]
