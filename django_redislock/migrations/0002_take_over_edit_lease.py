from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_redislock", "0001_initial")]

    operations = [
        migrations.AlterModelOptions(
            name="heldlock",
            options={
                "default_permissions": (),
                "managed": False,
                "permissions": [
                    ("release_lock", "Can force-release held locks"),
                    ("take_over_edit_lease", "Can take over another user's admin edit lease"),
                ],
                "verbose_name": "held lock",
                "verbose_name_plural": "held locks",
            },
        ),
    ]
