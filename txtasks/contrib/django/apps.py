"""The Django app: `"txtasks.contrib.django"` in INSTALLED_APPS registers its system checks."""

from __future__ import annotations

from django.apps import AppConfig


class TxtasksConfig(AppConfig):
    name = "txtasks.contrib.django"
    label = "txtasks"
    verbose_name = "txtasks"

    def ready(self) -> None:
        from txtasks.contrib.django import checks

        checks.register()
