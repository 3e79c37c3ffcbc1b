from django.apps import AppConfig


class TestappConfig(AppConfig):
    name = "testproject.testapp"
    label = "testapp"
    verbose_name = "Test jobs"
    default_auto_field = "django.db.models.BigAutoField"
