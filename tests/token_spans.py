"""Runs of loss-masked tokens: the spans of a trajectory or SFT example the loss trains on, for tests that decode
them and compare with what the model should learn."""


def mask_spans(ids, mask) -> list[list[int]]:
    """The maximal runs of ``ids`` whose ``mask`` is 1, in order."""
    spans, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    return spans + ([cur] if cur else [])
