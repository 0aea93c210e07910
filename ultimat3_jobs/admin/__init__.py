"""The admin: tasks (next runs, history, pause, "Run now"), jobs, occurrence records, nodes.

Importing the package registers every admin, as Django's autodiscovery expects of ``admin``.
"""

from .jobs import JobAdmin
from .records import NodeAdmin, OccurrenceAdmin
from .tasks import TaskAdmin, TaskPauseForm

__all__ = ["JobAdmin", "NodeAdmin", "OccurrenceAdmin", "TaskAdmin", "TaskPauseForm"]
