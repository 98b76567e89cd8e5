"""Tasks: a model plus its loss and evaluation, written as pure functions of the parameters."""

from taciturn.tasks.base import ClientData, Task
from taciturn.tasks.classification import ClassificationTask
from taciturn.tasks.models import build_model

__all__ = ["ClassificationTask", "ClientData", "Task", "build_model"]
