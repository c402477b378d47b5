from django.db import migrations


def seed(apps, schema_editor):
    from pool.core.catalogue import GPU_MODELS

    GpuModel = apps.get_model("pool", "GpuModel")
    for row in GPU_MODELS:
        GpuModel.objects.update_or_create(name=row["name"], defaults=row)


class Migration(migrations.Migration):
    dependencies = [("pool", "0001_initial")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
