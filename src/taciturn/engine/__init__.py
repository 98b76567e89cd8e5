"""Round loop and executors. Executors run client work; they know nothing of any algorithm's math."""

from taciturn.engine.executor import Executor, SequentialExecutor
from taciturn.engine.federation import Federation, RoundReport

__all__ = ["Executor", "Federation", "RoundReport", "SequentialExecutor"]
