"""What an upload reveals: the attack of Deep Leakage from Gradients (``dlg.py``), the measures of how close
its reconstruction comes (``image_quality.py``) and the server's evaluation of a run's uploads (``leakage.py``,
``-dlg``)."""
