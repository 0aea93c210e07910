# The task table leaves room in each page for the watermark a round writes, on PostgreSQL:
# every round updates the watermarks of the tasks it fires, and an update that finds room in
# its row's page is a heap-only tuple, written without touching the table's indexes. With full
# pages (the default), each such update also inserted into every index, and the table bloated
# until vacuum (the README's benchmark section has the figures). No row is rewritten: pages
# written from now on keep the room. Nothing changes on other databases.

from django.db import migrations

#: Percent of each heap page new rows may fill; the rest is kept for their updates.
FILLFACTOR = 70


def _leave_room(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        table = schema_editor.quote_name(apps.get_model("ultimat3_jobs", "Task")._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {FILLFACTOR})")


def _fill_pages(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        table = schema_editor.quote_name(apps.get_model("ultimat3_jobs", "Task")._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")


class Migration(migrations.Migration):

    dependencies = [
        ("ultimat3_jobs", "0011_monitor_checkins"),
    ]

    operations = [
        migrations.RunPython(_leave_room, _fill_pages, elidable=False),
    ]
