"""The ranks' processes: is each alive (identity = pid and start time, in any pid
namespace), pinned while an action runs on it, and when and why it died."""
