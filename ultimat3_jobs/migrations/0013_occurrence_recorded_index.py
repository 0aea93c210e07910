# The occurrence records get an index on when they were recorded. The history only grows
# between prunes (10,000 tasks a minute keep 200 million records over the default 14 days),
# and without it the admin's history list, the lateness jobs_status prints and each prune's
# search for old records read every record there is. Built without locking the table on
# PostgreSQL, so the scheduler goes on writing its rounds meanwhile; every record stays.

from django.db import migrations, models


class AddIndexWithoutLocking(migrations.AddIndex):
    """``CREATE INDEX CONCURRENTLY`` on PostgreSQL (a plain one would hold every round's
    records back until it is built); a plain ``CREATE INDEX`` elsewhere."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _drop_if_left_invalid(schema_editor, self.index.name)
            schema_editor.add_index(model, self.index, concurrently=True)
        return None

    def database_backwards(self, app_label, schema_editor, from_state, to_state):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)
        return None


def _drop_if_left_invalid(schema_editor, name):  # type: ignore[no-untyped-def]
    """A build killed halfway (a deploy's timeout, a lost connection) leaves an invalid index of
    that name behind, and the next CREATE INDEX would fail on it: it goes first."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    if row is not None and row[0]:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY {schema_editor.quote_name(name)}")


class Migration(migrations.Migration):

    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("ultimat3_jobs", "0012_task_fillfactor"),
    ]

    operations = [
        AddIndexWithoutLocking(
            model_name="occurrence",
            index=models.Index(fields=["-recorded_at"], name="u3j_occ_recorded"),
        ),
    ]
