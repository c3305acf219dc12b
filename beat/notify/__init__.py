"""Notifications of incidents sent to the channels operators set (``beat_channels``):
a webhook's JSON document, a Slack message, an email. ``targets`` checks a channel's
target before it is written; ``senders`` sends one notification, or raises."""
