"""Fault-injection harness for hasync (issue 16): real processes, faults, and an offline checker."""
