"""``python -m airflow_provider_chasqui.worker --queue Q --handlers pkg.module``: same as ``chasqui worker``."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m airflow_provider_chasqui.worker"))
