from django.db import models


class Ping(models.Model):
    """A side effect the demo jobs leave, so tests can see exactly which runs happened."""

    label = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.label


class Beat(models.Model):
    """One run of the demo's ten-second job, with the occurrence that produced it.

    ``make run`` shows these rows filling up in the admin (Demo > Beats) beside the job table.
    """

    occurrence = models.DateTimeField(unique=True)
    ran_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-occurrence"]

    def __str__(self) -> str:
        return f"beat {self.occurrence.isoformat()}"
