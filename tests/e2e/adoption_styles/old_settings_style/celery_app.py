from celery import Celery
from old_settings_style import settings

app = Celery("old_settings_style")
app.config_from_object(settings)
