"""The coordinator's journal: the append-only JSONL file, its lock, and the event names its writers use."""
