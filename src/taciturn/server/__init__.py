"""Server-side processing of the uplinks that passed validation, as one chain of small pieces
(optax's shape): clip -> (robust) aggregate -> DP noise, each with its own state (transform.py)."""
