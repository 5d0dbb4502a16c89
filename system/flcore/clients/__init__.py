"""One client per algorithm (``client<x>.py``) and their common base class ``Client`` (``clientbase.py``).

Helpers that several clients share live in ``flcore/training/``; parts of models in ``flcore/trainmodel/``.
"""
