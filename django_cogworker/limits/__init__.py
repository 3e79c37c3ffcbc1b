"""Limiters (SPEC section 14): never more than N at once, never faster than
R, across every worker process.

    from django_cogworker import limits

    ERP = limits.Concurrency("erp", 2)
    STRIPE = limits.Rate("stripe", 10, per=1)

    @job(limit=ERP)
    def sync(account_id): ...

    @job(limit=lambda account_id: limits.Concurrency(f"account:{account_id}", 1))
    def import_account(account_id): ...

    @job
    def charge(order_id):
        with STRIPE.acquire():
            ...

A job over its limit is neither a failure nor a retry: it waits, parked on
the limiter's waiting list until a holder releases (``Concurrency``,
``QUEUE_LIMITS``) or until the rate's window has room (``Rate``). The
state lives in Redis (``docs/redis-layout.md``); the scripts and their
callers are in :mod:`django_cogworker.limits.state`, the worker's side in
:mod:`django_cogworker.limits.admission` (a job's start) and
:mod:`django_cogworker.limits.running` (job code, wakes).
"""

from __future__ import annotations

from django_cogworker.errors import OverLimit
from django_cogworker.limits.limiter import QUEUE_PREFIX, Concurrency, Limiter, Rate, for_queue

__all__ = ["QUEUE_PREFIX", "Concurrency", "Limiter", "OverLimit", "Rate", "for_queue"]
