"""A small built-in task set in skyrl-gym's row layout, for the ``gsm8k`` and ``gsm8k_multi_turn``
envs run without a ``dataset`` (smoke tests, first runs): grade-school word problems written for
agentrl, each ``{"data_source", "prompt", "env_class", "reward_spec": {"method", "ground_truth"},
"extra_info": {"split", "index"}}``. ``SAMPLE_TRAIN`` and ``SAMPLE_EVAL`` are disjoint.

Owns only the rows; the adapter (``agentrl.envs.adapters.skyrl_gym``) reads them. Not a benchmark:
sixteen problems say nothing about a model's arithmetic.
"""

from __future__ import annotations

_INSTRUCTION = ' Let\'s think step by step and output the final answer after "####".'

# (question, answer)
_TRAIN = (
    ("A baker makes 24 rolls in the morning and 18 in the afternoon. How many rolls does he make?", "42"),
    ("Mia has 7 boxes with 6 pencils in each box. How many pencils does she have?", "42"),
    ("A bus holds 52 people. 19 get off at the first stop. How many are left on the bus?", "33"),
    ("Tom reads 15 pages a day. How many pages does he read in 8 days?", "120"),
    ("A farmer has 96 eggs and packs them in cartons of 12. How many cartons does he fill?", "8"),
    ("Lena buys 3 books at 9 dollars each and pays with a 50 dollar bill. How much change does she get?", "23"),
    ("A garden has 5 rows of 14 tulips. 11 tulips are picked. How many tulips are left?", "59"),
    ("Sam saves 4 dollars every week. How many weeks does he need to save 64 dollars?", "16"),
    ("A class of 28 pupils splits into teams of 4. How many teams are there?", "7"),
    ("A shop sells 35 apples on Monday and twice as many on Tuesday. How many apples does it sell in all?", "105"),
    ("Ava runs 3 km on each of 5 days and 6 km on Saturday. How many km does she run?", "21"),
    ("A box of 200 nails loses 37 nails and then 45 more. How many nails are in the box now?", "118"),
)
_EVAL = (
    ("Ben has 13 marbles and wins 29 more. How many marbles does he have?", "42"),
    ("A ticket costs 8 dollars. How much do 11 tickets cost?", "88"),
    ("There are 81 chairs in 9 equal rows. How many chairs are in each row?", "9"),
    ("Kim had 150 stickers and gave 4 friends 12 stickers each. How many stickers does she have now?", "102"),
)


def _rows(pairs: tuple[tuple[str, str], ...], split: str) -> list[dict]:
    return [
        {
            "data_source": "agentrl/sample-gsm8k",
            "prompt": [{"role": "user", "content": q + _INSTRUCTION}],
            "env_class": "gsm8k",
            "reward_spec": {"method": "rule", "ground_truth": a},
            "extra_info": {"split": split, "index": i},
        }
        for i, (q, a) in enumerate(pairs)
    ]


SAMPLE_TRAIN: list[dict] = _rows(_TRAIN, "train")
SAMPLE_EVAL: list[dict] = _rows(_EVAL, "eval")
#: the skyrl-gym env ids the sample's rows suit (their reward reads ``reward_spec.ground_truth``)
SAMPLE_ENVS = ("gsm8k", "gsm8k_multi_turn")
