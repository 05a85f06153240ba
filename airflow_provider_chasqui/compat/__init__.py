"""Aliases for code written against another queue's Python package (``compat.chasquimq``)."""
