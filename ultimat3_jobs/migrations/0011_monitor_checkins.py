# Sentry Crons check-ins, every row kept. The check-in that closes a monitored occurrence looks
# up the jobs of that one occurrence: the task's index takes the occurrence as a second column
# (still one index over all rows, still serving a task's admin list and the overlap check), and
# a table of closed occurrences, unique per task and occurrence, lets one process alone send
# each closing check-in.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("ultimat3_jobs", "0010_relay_target_unknown_since"),
    ]

    operations = [
        # The new index first, so a task's jobs are never without one.
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["task", "occurrence"], name="u3j_job_task_occurrence"),
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="u3j_job_task",
        ),
        migrations.CreateModel(
            name="CheckIn",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("task", models.CharField(max_length=200)),
                ("occurrence", models.DateTimeField()),
                ("status", models.CharField(max_length=8)),
                ("started_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField()),
            ],
        ),
        migrations.AddConstraint(
            model_name="checkin",
            constraint=models.UniqueConstraint(
                fields=("task", "occurrence"), name="u3j_checkin_occurrence"
            ),
        ),
    ]
