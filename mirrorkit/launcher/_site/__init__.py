"""Holds the ``sitecustomize`` that ``mirrorkit launch`` puts on workers' PYTHONPATH."""
