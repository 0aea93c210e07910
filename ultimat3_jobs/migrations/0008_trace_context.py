# The W3C traceparent a job's run continues (tracing.py). Every row is kept: the column comes
# with a constant database default, which PostgreSQL 11 and later add without rewriting the
# table, and rows of the previous release read as untraced ('').

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("ultimat3_jobs", "0007_lean_job_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
    ]
