"""Where finished trajectory groups wait before training and how they become trainer samples:
the bounded-staleness queue, the prompt stream, the exactly-once ledger, replay, credit -> samples."""
