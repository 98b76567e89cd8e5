"""Round loop and executors. Executors run client work; they know nothing of any algorithm's math."""

from taciturn.engine.executor import Executor, SequentialExecutor
from taciturn.engine.federation import Federation, RoundReport
from taciturn.engine.pipeline import ClientPipeline, RoundPart

__all__ = ["ClientPipeline", "Executor", "Federation", "RoundPart", "RoundReport", "SequentialExecutor"]
