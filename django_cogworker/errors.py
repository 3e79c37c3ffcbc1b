"""Exceptions: one base class, configuration errors are ImproperlyConfigured."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class CogworkerError(Exception):
    """Base class of every error django-cogworker raises on purpose."""


class ConfigurationError(CogworkerError, ImproperlyConfigured):
    """The ``COGWORKER`` settings are wrong; the message names the key."""


class RedisUnavailable(CogworkerError):
    """Redis could not be reached (wraps redis-py's connection errors)."""


class EnqueueRefused(CogworkerError):
    """Redis answered but refused to store a job (out of memory, read-only, ...)."""


class UnsupportedServer(CogworkerError):
    """The Redis server lacks a command reliable fetch needs (BLMOVE, LPOS)."""


class JobNotRegistered(CogworkerError):
    """A payload names a job that no ``@job`` registered."""


class BadPayload(CogworkerError):
    """A payload that cannot be run: not JSON, not an object, or misshapen."""


class ProcessDied(CogworkerError):
    """Filed in dead for a job whose process died under it too many times."""
