"""Bearer tokens: the placeholders the example manifests ship, which nothing may accept."""

from __future__ import annotations

PLACEHOLDER_PREFIX = "change-me"
"""The example Secrets in ``deploy/`` ship tokens that start with this (``change-me-webhook-token``, ...)."""


def is_placeholder(token: str) -> bool:
    """True for a token copied from the examples unchanged: anyone who read them knows it."""
    return token.strip().lower().startswith(PLACEHOLDER_PREFIX)


def placeholder_message(setting: str) -> str:
    """The one line that refuses a placeholder token set through ``setting``."""
    return (f"{setting} is the example's placeholder ({PLACEHOLDER_PREFIX}-...): replace it with a secret of your "
            "own (e.g. openssl rand -hex 32)")
