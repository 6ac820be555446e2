"""The stored forecast is a cache the control worker rewrites whole after passes (every few seconds at
most): on PostgreSQL it skips the write-ahead log. Writing 98k rows took 0.83 s logged and 0.52 s
unlogged (bench 5). After a database crash the table is empty until the next forecast, and standbys do
not have it; pages then show no forecast for a few seconds, as before the first one."""

from django.db import migrations


def unlogged(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE quotas_queueforecast SET UNLOGGED")


def logged(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE quotas_queueforecast SET LOGGED")


class Migration(migrations.Migration):
    dependencies = [("quotas", "0006_queue_forecast_without_fk")]

    operations = [migrations.RunPython(unlogged, logged)]
