"""An app on the host's local time: ``enable_utc = False`` and no ``timezone``."""
