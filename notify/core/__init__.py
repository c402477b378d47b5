"""Notification's pure cores, without Django: `webhook_targets` decides where a webhook may
be sent."""
