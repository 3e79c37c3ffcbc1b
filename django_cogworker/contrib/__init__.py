"""Optional integrations with other tools, each behind an extra (``pip install "django-cogworker[...]"``).

Nothing in the base package imports these modules: each one is used only
when a setting names it.
"""
