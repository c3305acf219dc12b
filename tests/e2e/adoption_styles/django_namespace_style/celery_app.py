from celery import Celery
from django_namespace_style import settings

app = Celery("django_namespace_style")
app.config_from_object(settings, namespace="CELERY")
