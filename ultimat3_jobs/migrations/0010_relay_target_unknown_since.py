# When a relay first found an outbox row's Celery task or Django Task unknown, so the row waits
# RELAY_UNKNOWN_TASK_GRACE for a relay that knows it. A nullable column: every row is kept, and
# a row of the previous release has never waited.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("ultimat3_jobs", "0009_task_backfilled_to"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="target_unknown_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
