"""Fault injection ("chaos") for a real cluster: see ``tests.chaos.harness``."""
