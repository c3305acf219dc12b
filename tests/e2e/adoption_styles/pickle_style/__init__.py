"""An app whose tasks travel pickled: ``task_serializer = 'pickle'``, pickle only accepted."""
