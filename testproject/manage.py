#!/usr/bin/env python
"""Django's command-line utility for the demo and test project.

Works from any directory: ``python testproject/manage.py <command>``.
"""

import os
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROJECT_DIR.parent


def main() -> None:
    # The settings module is ``testproject.settings``: the repository root must
    # be importable, and this directory must not shadow it as a top-level path.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != PROJECT_DIR]
    sys.path.insert(0, str(REPO_ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
