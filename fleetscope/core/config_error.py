"""The one error a bad config file raises, wherever in the config it is found."""

from __future__ import annotations


class ConfigError(ValueError):
    """The config file is unreadable or invalid; the message is one line for the user."""

    def __init__(self, message: str):
        # Keys and values quoted from a hostile file must not break the one line.
        super().__init__("".join(c if c.isprintable() else "?" for c in message)[:500])
