from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="HeldLock",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=1024, primary_key=True, serialize=False, verbose_name="name"
                    ),
                ),
            ],
            options={
                "verbose_name": "held lock",
                "verbose_name_plural": "held locks",
                "permissions": [("release_lock", "Can force-release held locks")],
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]
