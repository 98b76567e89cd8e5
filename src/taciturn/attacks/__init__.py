"""Simulated attackers, for measuring defences: a seeded set of clients that poison their data or
their uplinks (``[attack]``). Never part of a real deployment."""
