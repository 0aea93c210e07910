# Where a backfill enqueued occurrences the scheduler has not reached yet, so its round for them
# adds nothing. A nullable column: every task row stays as it was, NULL (nothing backfilled
# ahead), and adding it rewrites no row.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("ultimat3_jobs", "0008_trace_context"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="backfilled_to",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
