#!/usr/bin/env python
"""Django's command-line utility for botmesh-admin."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
    from botmesh_admin import config

    config.load_or_exit()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
