"""Operations the app's migrations share (not a migration: its name starts with "_")."""

from django.db import migrations


class AddIndexWithoutLocking(migrations.AddIndex):
    """``CREATE INDEX CONCURRENTLY`` on PostgreSQL: a plain one would hold every write to the
    table (a round's records, a worker's finishes) back until it is built, minutes on a table
    of hundreds of millions of rows. A plain ``CREATE INDEX`` elsewhere. The migration using
    it must not be atomic."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            if _to_build(schema_editor, self.index.name):
                schema_editor.add_index(model, self.index, concurrently=True)
        return None

    def database_backwards(self, app_label, schema_editor, from_state, to_state):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)
        return None


def _to_build(schema_editor, name):  # type: ignore[no-untyped-def]
    """Whether the index ``name`` is still to build. A migration that is not atomic and was
    killed halfway (a deploy's timeout, a lost connection) is run again whole: an index it
    finished is kept, and one whose build was cut off, left invalid, is dropped to build again
    (CREATE INDEX would fail on either). Showing the SQL (``sqlmigrate``), always."""
    if schema_editor.collect_sql:
        return True
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    if row is None:
        return True
    if row[0]:
        return False
    schema_editor.execute(f"DROP INDEX CONCURRENTLY {schema_editor.quote_name(name)}")
    return True
