from django.db import models


class Ping(models.Model):
    """A side effect the demo jobs leave, so tests can see exactly which runs happened."""

    label = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.label
